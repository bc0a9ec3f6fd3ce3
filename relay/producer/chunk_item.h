/* chunk_item.h: the relay link's item wire mapping, both ways, in one place: what the agent
 * puts in a ChunkItem for each chunk queue entry (a chunk, one 4-byte patch, a flush ack), and
 * how the service turns a received Chunk into a central-buffer write and a Patch entry's 32-bit
 * word back into the patch's four bytes. A patch travels as a little-endian uint32 (its bytes
 * in order: data[0] is the low byte). Pure: no I/O, no allocation. */
#ifndef TR_CHUNK_ITEM_H
#define TR_CHUNK_ITEM_H

#include <stdint.h>

#include "relay/producer/chunk_queue.h"
#include "relay/trace/trace_buffer.h"
#include "tracerelay/relay.pb-c.h"

/* One item and the message it points to, built in place for one encode. */
typedef struct tr_chunk_item_slot {
  Tracerelay__ChunkItem item;
  union {
    Tracerelay__Chunk chunk;
    struct {
      Tracerelay__Patch patch;
      Tracerelay__Patch__Entry entry;
      Tracerelay__Patch__Entry *entries[1];
    } p;
    Tracerelay__FlushAck ack;
  } u;
} tr_chunk_item_slot;

/* Fills s->item from e (s->item then points into s, and into e for a chunk's payload: both
 * must outlive the encode). */
void tr_chunk_item_fill(tr_chunk_item_slot *s, const tr_chunkq_entry *e);

/* The central-buffer write for a received Chunk (out->payload points into m). Values a
 * well-behaved agent never sends are mapped so the buffer refuses and counts them: a writer
 * id over 0xffff becomes 0, a packet count over 0xffff saturates, the flags keep their 6 bits. */
void tr_chunk_item_to_tbuf(const Tracerelay__Chunk *m, tr_tbuf_chunk *out);

/* A patch's four bytes as the wire's word, and back. */
uint32_t tr_chunk_item_patch_word(const uint8_t data[TR_CHUNK_PATCH_SIZE]);
void tr_chunk_item_patch_bytes(uint32_t word, uint8_t data[TR_CHUNK_PATCH_SIZE]);

#endif
