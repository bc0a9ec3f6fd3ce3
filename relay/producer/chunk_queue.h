/* chunk_queue.h: the agent's bounded FIFO of what leaves the producer ports for the relay
 * link: chunks (copied out of the SMB), patches and flush acks, in the order the producers
 * committed them, so a patch always follows the chunk it patches and a flush ack follows
 * every chunk committed before it.
 *
 * Guarantees:
 * - never blocks: a push that does not fit is refused at once, and the drop is counted per
 *   producer and target buffer (and in a total) so the service can put it in the trace stats
 *   of the session it was for;
 * - bounded: chunks are admitted while the queued bytes (payloads plus a fixed per-entry
 *   cost) stay within max_bytes. Patches and flush acks may also use a reserve of
 *   max_bytes / 8 above that, because losing one stalls a whole sequence or a flush, which
 *   costs more than one chunk;
 * - every queued entry gets the next sequence number (1, 2, 3... with no gaps; refused pushes
 *   take none), so the link can resend from any point after a reconnect.
 * Cost: push O(payload) for the copy plus one malloc; pop O(1); the drop path does a linear
 * search of the (producer, buffer) pairs that ever dropped (few per host). */
#ifndef TR_CHUNK_QUEUE_H
#define TR_CHUNK_QUEUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/trace/chunk.h"

typedef enum tr_chunkq_kind {
  TR_CHUNKQ_CHUNK = 1,
  TR_CHUNKQ_PATCH = 2,
  TR_CHUNKQ_FLUSH_ACK = 3,
} tr_chunkq_kind;

/* What the producer port knows about a chunk it copied out. */
typedef struct tr_chunkq_chunk {
  uint32_t producer_id;   /* agent-local */
  uint32_t target_buffer; /* the service's buffer id, from CommitData */
  tr_chunk_header header; /* as found, also for an incomplete chunk */
  bool incomplete;        /* scraped while BeingWritten or chunk_incomplete: the reader
                           * ignores the last counted fragment (reference 4.6) */
  uint32_t trusted_uid;   /* SO_PEERCRED of the producer's socket */
  int32_t trusted_pid;
} tr_chunkq_chunk;

/* One 4-byte patch. has_more: more patches for this chunk will follow (the agent sets it on
 * all but the last patch of a ChunkToPatch, and on the last one as has_more_patches says). */
typedef struct tr_chunkq_patch {
  uint32_t producer_id;
  uint32_t target_buffer;
  uint32_t chunk_id;
  uint16_t writer_id;
  uint32_t offset; /* from the payload start */
  uint8_t data[TR_CHUNK_PATCH_SIZE];
  bool has_more;
} tr_chunkq_patch;

typedef struct tr_chunkq_entry {
  struct tr_chunkq_entry *next; /* owned by the queue while queued */
  uint64_t seq;
  tr_chunkq_kind kind;
  union {
    tr_chunkq_chunk chunk; /* TR_CHUNKQ_CHUNK: payload in data[0..len) */
    tr_chunkq_patch patch; /* TR_CHUNKQ_PATCH */
    struct {
      uint32_t producer_id;
      uint64_t request_id;
    } flush_ack; /* TR_CHUNKQ_FLUSH_ACK */
  } u;
  size_t len;
  uint8_t data[];
} tr_chunkq_entry;

/* Cumulative drop counters (never reset, so resending them after a reconnect is harmless), per
 * producer and the service's buffer the dropped chunks and patches were for (a flush ack is for
 * none: buffer 0), so that each session counts only its own losses. */
typedef struct tr_chunkq_drops {
  uint32_t producer_id;
  uint32_t target_buffer;
  uint64_t chunks;
  uint64_t bytes; /* payload bytes of the dropped chunks */
  uint64_t packets; /* packets begun in them (tr_chunk_packets_begun) */
  uint64_t patches;
  uint64_t flush_acks;
  /* Losses outside the queue, which the producer port counts here so that they travel with
   * the rest (tr_chunkq_count_exit): chunks the producer still held in its shared memory when
   * its connection ended that could not be scraped (target_buffer 0 when their writer's
   * buffer was unknown), and why the agent closed that connection (an enum tr_ipc_close of
   * relay/producer/ipc_host.h; 0 when it did not: the producer left, or the agent stopped). A
   * producer id names one connection, so a reason is set at most once per entry. */
  uint64_t unscraped_chunks;
  uint8_t closed_why;
} tr_chunkq_drops;

/* The link reads len, bytes, total and drops[0..num_drops) directly. */
typedef struct tr_chunkq {
  tr_chunkq_entry *head, *tail;
  size_t len;       /* entries */
  size_t bytes;     /* payloads plus per-entry cost */
  size_t max_bytes; /* bound for chunks */
  uint64_t next_seq;
  tr_chunkq_drops total;  /* producer_id and target_buffer unused */
  tr_chunkq_drops *drops; /* per producer and buffer, in order of first drop */
  size_t num_drops, cap_drops;
} tr_chunkq;

void tr_chunkq_init(tr_chunkq *q, size_t max_bytes);
/* Frees every queued entry and the drop table. */
void tr_chunkq_free(tr_chunkq *q);

/* Copies payload[0..used) into a new entry, or the whole payload if the chunk needs
 * patching (patch offsets may point past `used`). 0 on success; TR_ERR_FULL or TR_ERR_NOMEM
 * when the chunk was dropped (and counted); TR_ERR_INVAL if used > payload_len (nothing
 * counted: a caller bug). */
int tr_chunkq_push_chunk(tr_chunkq *q, const tr_chunkq_chunk *c, const uint8_t *payload,
                         size_t payload_len, size_t used);
/* 0, or TR_ERR_FULL / TR_ERR_NOMEM when dropped and counted. */
int tr_chunkq_push_patch(tr_chunkq *q, const tr_chunkq_patch *p);
int tr_chunkq_push_flush_ack(tr_chunkq *q, uint32_t producer_id, uint64_t request_id);

/* The oldest entry, still owned by the queue; NULL if empty. */
const tr_chunkq_entry *tr_chunkq_peek(const tr_chunkq *q);
/* Removes the oldest entry and hands it to the caller (free with tr_chunkq_entry_free);
 * NULL if empty. */
tr_chunkq_entry *tr_chunkq_pop(tr_chunkq *q);
void tr_chunkq_entry_free(tr_chunkq_entry *e);

/* Between two queues (the producer port's on its own thread and the link's, agent/port_handoff.h):
 * take hands every entry and drop counter of q to out, which must be uninitialised or freed
 * (out keeps q's bound; q keeps its bound and its next sequence number and is then empty, its
 * counters zero). move re-queues from's entries up to sequence number up_to_seq, oldest first,
 * into `to` (each gets to's next number; one that does not fit under to's bound is dropped and
 * counted in to's counters, as a push would be). move_drops adds from's drop counters to to's
 * and zeroes from's. */
void tr_chunkq_take(tr_chunkq *q, tr_chunkq *out);
void tr_chunkq_move(tr_chunkq *from, tr_chunkq *to, uint64_t up_to_seq);
void tr_chunkq_move_drops(tr_chunkq *from, tr_chunkq *to);

/* Counts what a producer's departure cost buffer target_buffer (the fields of
 * tr_chunkq_drops above): unscraped chunks, and closed_why if the agent closed it. Counted
 * like a drop, per (producer, buffer) and in the total; a table entry that cannot be made
 * leaves the loss in the total alone, as for a drop. */
void tr_chunkq_count_exit(tr_chunkq *q, uint32_t producer_id, uint32_t target_buffer,
                          uint64_t unscraped_chunks, uint8_t closed_why);

/* Bytes an entry with a payload of len bytes counts against the bound. */
size_t tr_chunkq_entry_cost(size_t len);
/* Drop counters of one producer, summed over its buffers (all zero, with its id, if it never
 * dropped). */
tr_chunkq_drops tr_chunkq_drops_of(const tr_chunkq *q, uint32_t producer_id);

#endif
