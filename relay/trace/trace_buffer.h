/* trace_buffer.h: the service's central buffer (module tr_tbuf), Perfetto's TraceBuffer
 * semantics over plain memory. The service makes one instance per (host, TraceConfig buffer),
 * so a chatty host can only overwrite its own data, and the stats below are per instance.
 *
 * Invariants (reference 4.2-4.4; the long version is at the top of trace_buffer.c):
 * - Storage is chunk-granular inside a byte ring of fixed size. RING_BUFFER overwrites the
 *   oldest chunks (counted); DISCARD stops taking chunks for good once a write would overwrite
 *   unread data (counted), as Perfetto's TraceBufferV1 does.
 * - Chunks are keyed by (producer id, writer id, chunk id). The producer id is host-qualified by
 *   the caller. A sequence is one (producer, writer); within it chunk ids wrap at 2^32.
 * - A re-commit of a stored chunk replaces it only with as many or more fragments, an as long or
 *   longer payload and a superset of flags; anything else is an ABI violation and is ignored.
 * - Packets come out whole or not at all, in chunk-id order per sequence. Any loss on a sequence
 *   is reported on the next packet emitted from it (previous_packet_dropped, a DATA_LOSS_ mask).
 * - A chunk still awaiting patches, or copied while still being written, stalls only its own
 *   sequence, until the patches or the full commit arrive or the final read.
 */
#ifndef TR_TRACE_BUFFER_H
#define TR_TRACE_BUFFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest chunk payload accepted: a chunk never exceeds a 64 KiB SMB page, and emulated
 * producers send at most 65536 bytes of header plus payload. */
#define TR_TBUF_MAX_PAYLOAD 65536u
/* Buffer sizes accepted by tr_tbuf_new (the size is rounded down to a multiple of 8). */
#define TR_TBUF_MIN_SIZE 512u
#define TR_TBUF_MAX_SIZE (1u << 30)

/* TracePacket.previous_packet_dropped bits (reference 5.2, DataLossReason). */
enum tr_tbuf_loss {
  TR_TBUF_LOSS_PRESENT = 1, /* set together with every other bit */
  TR_TBUF_LOSS_READ_GAP = 2,
  TR_TBUF_LOSS_CHUNK_CORRUPTED = 4,
  TR_TBUF_LOSS_ORPHAN_CONTINUATION = 8,
  TR_TBUF_LOSS_REASSEMBLY_GAP = 16,
  TR_TBUF_LOSS_REASSEMBLY_BROKEN_CHAIN = 32,
  TR_TBUF_LOSS_OVERWRITE = 64,
  TR_TBUF_LOSS_WRITER_ABORT = 128,
  TR_TBUF_LOSS_SMB_FULL = 256,
};

enum tr_tbuf_policy {
  TR_TBUF_RING_BUFFER = 0,
  TR_TBUF_DISCARD = 1,
};

/* Mirrors Perfetto's TraceStats.BufferStats, plus what this buffer alone can see. Byte counts
 * are payload bytes (the chunk header and our record header are not counted). */
typedef struct tr_tbuf_stats {
  uint64_t buffer_size;
  uint64_t bytes_written;      /* every stored payload, re-commits included */
  uint64_t bytes_overwritten;  /* payload of chunks overwritten before being fully read */
  uint64_t bytes_read;
  uint64_t chunks_written;     /* new chunks stored */
  uint64_t chunks_rewritten;   /* re-commits that replaced a stored chunk */
  uint64_t chunks_overwritten; /* evicted by RING_BUFFER before being fully read */
  uint64_t chunks_discarded;   /* refused: DISCARD buffer full, or larger than the buffer */
  uint64_t chunks_read;
  uint64_t write_wrap_count;
  uint64_t patches_succeeded;
  uint64_t patches_failed; /* per patch: unknown chunk, or out of the payload's bounds */
  uint64_t abi_violations;
  uint64_t trace_writer_packet_loss; /* kPacketSizeDropPacket markers */
  /* ours */
  uint64_t packets_read;             /* packets emitted */
  uint64_t invalid_packets;          /* failed tr_tbuf_validate_packet; not emitted */
  uint64_t packets_lost_in_gaps;     /* spanned a missing chunk or a broken continuation chain,
                                      * or begun in a chunk dropped unpatched, or in the part of
                                      * an incomplete chunk left out at the final read */
  uint64_t orphan_continuations;     /* leading continuation fragments skipped */
  uint64_t unpatched_chunks_dropped; /* still awaiting patches at the final read */
} tr_tbuf_stats;

/* One chunk as committed: the decoded 8-byte header plus the payload after it. */
typedef struct tr_tbuf_chunk {
  uint32_t producer_id; /* host-qualified by the caller */
  uint16_t writer_id;   /* 1..32767 */
  uint32_t chunk_id;
  uint16_t fragments;   /* the header's count, 0..1023 */
  uint8_t flags;        /* TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_LAST_CONTINUES | TR_CHUNK_NEEDS_PATCHING */
  /* Copied while still being written (scraped, or ChunksToMove.chunk_incomplete). Pass the
   * header as found: the buffer itself ignores the last counted fragment and clears
   * LAST_CONTINUES and NEEDS_PATCHING (reference 4.6), and the sequence waits for the full
   * commit once the rest is read. */
  bool incomplete;
  int32_t uid; /* trusted, from SO_PEERCRED at write time */
  int32_t pid; /* trusted; <= 0 when unknown */
  const uint8_t *payload;
  size_t payload_len; /* <= TR_TBUF_MAX_PAYLOAD */
} tr_tbuf_chunk;

/* One patch: 4 bytes at `offset` from the start of the chunk payload. */
typedef struct tr_tbuf_patch {
  uint32_t offset;
  uint8_t data[4];
} tr_tbuf_patch;

/* One packet read out. `data` stays valid until the next call on this buffer. */
typedef struct tr_tbuf_packet {
  const uint8_t *data;
  size_t len;
  uint32_t producer_id;
  uint16_t writer_id;
  int32_t uid; /* as stored with the chunk the packet starts in */
  int32_t pid;
  uint32_t previous_packet_dropped; /* tr_tbuf_loss mask, 0 when nothing was lost */
} tr_tbuf_packet;

typedef struct tr_tbuf tr_tbuf;

/* A buffer of `size` bytes (TR_TBUF_MIN_SIZE..TR_TBUF_MAX_SIZE). TR_ERR_INVAL, TR_ERR_NOMEM. */
int tr_tbuf_new(size_t size, enum tr_tbuf_policy policy, tr_tbuf **out);
void tr_tbuf_free(tr_tbuf *b);

/* Stores (or re-commits) one chunk. O(log n) for the sequence's chunks plus O(log s) for the
 * sequences, amortised O(1) to index a chunk committed in order, O(n) for an out-of-order one.
 * Returns 0, or (all counted in the stats): TR_ERR_PROTO (ABI violation: bad writer id or
 * count, re-commit that is not a superset, chunk id more than 2^31 away from the sequence's
 * stored chunks, re-commit of the chunk just read), TR_ERR_TOO_BIG (payload over
 * TR_TBUF_MAX_PAYLOAD or larger than the buffer), TR_ERR_FULL (DISCARD buffer full),
 * TR_ERR_NOMEM (index allocation failed; the chunk is not stored). */
int tr_tbuf_write_chunk(tr_tbuf *b, const tr_tbuf_chunk *c);

/* Applies patches to a stored chunk; `has_more` false clears its needs-patching flag unless a
 * patch failed (then the chunk stays stalled and the final read drops it, as in Perfetto).
 * Returns 0, TR_ERR_NOT_FOUND (no such chunk: every patch counts as failed) or TR_ERR_PROTO
 * (some patch out of bounds). */
int tr_tbuf_patch_chunk(tr_tbuf *b, uint32_t producer_id, uint16_t writer_id, uint32_t chunk_id,
                        const tr_tbuf_patch *patches, size_t n, bool has_more);

/* Reads the next packet: 1 and *out filled, 0 when this read pass is over (call again for a
 * new pass once more data arrived), TR_ERR_NOMEM. Chunks fully read are freed.
 * Order: sequences are visited in the ring order of their oldest stored chunk (oldest first);
 * each is drained as far as it goes (until empty or stalled) before the next one. A write or a
 * patch ends the current pass. With `final` (session end) nothing stalls: unpatched chunks are
 * dropped, chunks still incomplete are taken as they are, and a packet whose next chunk never
 * came is dropped, so after a final pass the buffer is empty. Packets that fail
 * tr_tbuf_validate_packet are counted in invalid_packets and skipped.
 * Cost: O(1) amortised per fragment plus the copy of packets spanning chunks; each pass also
 * walks the ring's record headers once (O(records)). */
int tr_tbuf_read_packet(tr_tbuf *b, bool final, tr_tbuf_packet *out);

/* A copy of src to read on its own (a session's clone): the same chunks, sequences (with how
 * far each was read and its pending loss bits) and stats, so it yields exactly the packets src
 * would yield from now on; neither sees what is written to or read from the other afterwards.
 * A read pass under way in src is not carried over (the copy begins its own). O(size + chunks
 * indexed). 0 or TR_ERR_NOMEM (*out NULL). */
int tr_tbuf_clone(const tr_tbuf *src, tr_tbuf **out);

void tr_tbuf_get_stats(const tr_tbuf *b, tr_tbuf_stats *out);

#endif
