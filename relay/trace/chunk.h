/* chunk.h: one SMB chunk as the Perfetto shared-memory ABI lays it out (reference 4.2, 4.3):
 * an 8-byte header, then a payload of fragments `[size varint][size bytes]...`.
 *
 * Everything here works on a private copy of the chunk (smb.h copies chunks out of shared
 * memory before anyone parses them), so a value is never re-read after it was checked.
 * Guarantees: no read outside [payload, payload + len); nothing after the last counted
 * fragment is ever read (that tail holds stale bytes from earlier use of the page).
 * Cost per chunk: O(fragments), at most 1023 varint reads; no allocation. */
#ifndef TR_CHUNK_H
#define TR_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR_CHUNK_HEADER_SIZE 8u
#define TR_CHUNK_MAX_FRAGMENTS 1023u        /* 10-bit count */
#define TR_CHUNK_MAX_WRITER_ID 32767u
#define TR_CHUNK_DROP_PACKET_SIZE 0x0FFFFFFFu /* kPacketSizeDropPacket */
#define TR_CHUNK_MAX_VARINT 4u                /* fragment sizes use at most 4 varint bytes */
#define TR_CHUNK_PATCH_SIZE 4u

/* The 6-bit flags value (bits 10-15 of the packets word, shifted down). */
#define TR_CHUNK_FIRST_CONTINUES 0x01u  /* first fragment continues chunk_id - 1 */
#define TR_CHUNK_LAST_CONTINUES 0x02u   /* last fragment continues in chunk_id + 1 */
#define TR_CHUNK_NEEDS_PATCHING 0x04u   /* sizes will be patched after commit */

typedef struct tr_chunk_header {
  uint32_t chunk_id;
  uint16_t writer_id;
  uint16_t count; /* fragments, 0..1023 */
  uint8_t flags;  /* TR_CHUNK_* above; the top 3 bits of the 6 are kept as sent */
} tr_chunk_header;

/* Packets that begin in a chunk of `count` fragments and `flags` (its payload[0..len)): the
 * packets lost with it when it is lost. Not counted: a leading continuation (a packet begun
 * earlier that runs into a lost chunk is seen, and counted, by whoever holds its head:
 * tr_tbuf_stats.packets_lost_in_gaps), an empty fragment (an empty packet, which no reader
 * emits) and the writer's drop marker (a packet the writer abandoned and counted itself).
 * An incomplete chunk counts only what a reader takes from it (its last counted fragment may
 * be unfinished, reference 4.6). The last size of a chunk still to be patched is not final:
 * that fragment continues in the next chunk, so it begins a packet. O(count). */
uint32_t tr_chunk_packets_begun(const uint8_t *payload, size_t len, uint16_t count,
                                uint8_t flags, bool incomplete);

/* Decodes the 8-byte header at `chunk` (len must be >= 8). TR_ERR_PROTO for writer_id 0 or
 * > 32767 (the header is still filled in), TR_ERR_INVAL if len < 8. */
int tr_chunk_header_decode(const uint8_t *chunk, size_t len, tr_chunk_header *out);
/* Writes the 8-byte header (the producer's side; tests and tools build chunks with it). */
void tr_chunk_header_encode(const tr_chunk_header *h, uint8_t out[TR_CHUNK_HEADER_SIZE]);

/* One fragment. An empty fragment that continues nothing is an empty packet: skip it. */
typedef struct tr_chunk_fragment {
  const uint8_t *data; /* points into the payload given to tr_chunk_iter_init */
  size_t len;
  bool continues_from_prev; /* first fragment of a chunk flagged FIRST_CONTINUES */
  bool continues_in_next;   /* last counted fragment of a chunk flagged LAST_CONTINUES */
} tr_chunk_fragment;

typedef struct tr_chunk_iter {
  const uint8_t *payload;
  size_t len;
  size_t off;     /* end of the last fragment returned: the used size so far */
  uint16_t count; /* fragments the header announces */
  uint16_t index; /* fragments returned so far */
  uint8_t flags;
  uint16_t redundant_varints; /* sizes written longer than needed (padded, to be back-filled) */
  bool packet_dropped;        /* the last fragment was the writer's drop marker */
  bool abi_violation;         /* a size ran past the payload: the rest was discarded */
} tr_chunk_iter;

void tr_chunk_iter_init(tr_chunk_iter *it, const uint8_t *payload, size_t len, uint16_t count,
                        uint8_t flags);
/* 1 and *out filled: a fragment; 0: no more fragments (check it->packet_dropped);
 * TR_ERR_PROTO: ABI violation (size varint over 4 bytes or past the end, or a fragment past
 * the end); the iterator stays at its last good fragment and keeps returning the error. */
int tr_chunk_iter_next(tr_chunk_iter *it, tr_chunk_fragment *out);

/* What a whole pass over a chunk's fragments found. */
typedef struct tr_chunk_info {
  uint16_t fragments; /* fragments that parsed, drop marker excluded */
  uint16_t redundant_varints;
  size_t used;        /* end of the last counted fragment (or drop marker); bytes after are stale */
  bool packet_dropped;
  bool abi_violation;
} tr_chunk_info;

/* Walks all `count` fragments. 0, or TR_ERR_PROTO on an ABI violation (*out then describes
 * the good prefix, which a reader may still use). For a chunk flagged NEEDS_PATCHING the
 * last size is not final yet: keep the whole payload, not just `used`. */
int tr_chunk_parse(const uint8_t *payload, size_t len, uint16_t count, tr_chunk_info *out);

/* The scraping rule for a chunk still BeingWritten (reference 4.6): its last counted
 * fragment may be unfinished. Returns 1 and rewrites *h (count - 1, LAST_CONTINUES and
 * NEEDS_PATCHING cleared) when the chunk is worth taking (count >= 2), 0 when it is not. */
int tr_chunk_scrape_rule(tr_chunk_header *h);

/* Applies one 4-byte patch at `offset` from the payload start. TR_ERR_PROTO unless
 * data_len == 4 and offset + 4 <= payload_len (payload_len = the chunk's whole payload). */
int tr_chunk_apply_patch(uint8_t *payload, size_t payload_len, uint32_t offset,
                         const uint8_t *data, size_t data_len);

#endif
