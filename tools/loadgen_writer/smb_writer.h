/* smb_writer.h: the producer side of Perfetto's shared-memory ABI (reference section 4), written
 * independently of relay/producer/smb.h and relay/trace/chunk.h so that the loadgen checks our agent against the
 * ABI rather than against ourselves. It behaves as the Perfetto SDK's SharedMemoryArbiter and
 * TraceWriter do:
 * - pages are partitioned on first use with a CAS 0 -> layout<<28 (Div1 by default, like the SDK);
 *   a chunk is taken with a CAS Free -> BeingWritten and handed over with BeingWritten -> Complete;
 * - chunk ids count up per writer from 0; the 8-byte header holds chunk_id, writer_id and the
 *   fragment count, bumped when a fragment starts;
 * - a packet whose bytes do not fit continues in the writer's next chunk (flags 0x0800 / 0x0400);
 *   the size of a continuing fragment is a redundant 4-byte varint written before the commit; a
 *   packet that stays in one chunk gets a 1-byte size when it is shorter than 128 bytes;
 * - nested messages reserve a 4-byte size; when the chunk holding that size is committed before
 *   the message ends, the chunk is flagged "needs patching" and the size goes to the service later
 *   in CommitData.chunks_to_patch (has_more_patches while others for that chunk are pending);
 *   completed patches leave at the start of the next packet and with every commit;
 * - when no chunk is free (BUFFER_EXHAUSTED_DROP) the packet is dropped and counted; a packet
 *   already partly written gets the size 0x0FFFFFFF (kPacketSizeDropPacket) in its last fragment.
 *
 * A lg_smb is shared by every writer thread (all its state lives in the shared page words); a
 * lg_trace_writer belongs to one thread at a time (callers serialise, e.g. with a mutex).
 * Every call is O(bytes written) plus, on a chunk change, O(pages) to find a free chunk. */
#ifndef LG_SMB_WRITER_H
#define LG_SMB_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LG_SMB_PAGE_HEADER 8u
#define LG_SMB_CHUNK_HEADER 8u
#define LG_SMB_MAX_FRAGMENTS 1023u
#define LG_SMB_DROP_PACKET_SIZE 0x0FFFFFFFu
#define LG_SMB_MAX_NESTING 8
/* Patches waiting to be sent belong to the packet being written (a nested message becomes a
 * patch once, when its chunk is committed) or to the one before it (sent as the next packet
 * starts): twice the most nested messages one packet may have is plenty. */
#define LG_SMB_MAX_NESTED_PER_PACKET 16
#define LG_SMB_MAX_PENDING_PATCHES (2 * LG_SMB_MAX_NESTED_PER_PACKET)

typedef struct lg_smb {
  uint8_t *base;
  size_t size;
  size_t page_size;
  size_t num_pages;
  uint32_t layout;    /* page layout used to partition free pages: 1 Div1 ... 5 Div14 */
  unsigned next_page; /* where the next search starts (racy hint, as in the SDK) */
} lg_smb;

/* Maps the SMB fd (size from fstat). page_size must be a power-of-two multiple of 4096 up to
 * 64 KiB that divides the size; chunks_per_page one of 1, 2, 4, 7, 14. The fd is not kept. */
int lg_smb_map(lg_smb *smb, int fd, size_t page_size, unsigned chunks_per_page);
void lg_smb_unmap(lg_smb *smb);
/* A chunk's first byte (its header) and its state (0 Free ... 3 Complete) now, for observers:
 * the chunk index must be inside the page's layout (as a commit names it). */
const uint8_t *lg_smb_chunk_at(const lg_smb *smb, uint32_t page, uint32_t chunk);
unsigned lg_smb_chunk_state(const lg_smb *smb, uint32_t page, uint32_t chunk);

/* A patch: 4 bytes to write at `offset` from the payload start of chunk `chunk_id`. */
typedef struct lg_patch {
  uint32_t chunk_id;
  uint32_t offset;
  uint8_t data[4];
  bool ready; /* the nested message ended and data holds its size */
} lg_patch;

/* One CommitData request of one writer: at most one chunk to move, then the ready patches in
 * chunk order. last_has_more: more patches for the last patched chunk are still to come. */
typedef struct lg_commit {
  bool has_move;
  uint32_t page;
  uint32_t chunk;
  uint32_t target_buffer;
  uint16_t writer_id;
  const lg_patch *patches;
  size_t num_patches;
  bool last_has_more;
} lg_commit;

/* Sends a commit (the session's CommitData). Returns 0 or a negative TR_ERR_* code. */
typedef int (*lg_commit_fn)(void *ctx, const lg_commit *commit);

typedef struct lg_writer_counters {
  uint64_t packets_written; /* finished packets that reached the SMB */
  uint64_t packets_dropped; /* packets lost because the SMB was full */
  uint64_t bytes_written;   /* payload bytes of the written packets */
  uint64_t chunks_committed;
  uint64_t patches_sent;
} lg_writer_counters;

typedef struct lg_trace_writer {
  lg_smb *smb;
  uint16_t writer_id;
  uint32_t target_buffer;
  lg_commit_fn commit;
  void *commit_ctx;
  int error; /* first error (commit callback, ABI, misuse); the writer stops committing */

  /* Current chunk (chunk == NULL: none). */
  uint8_t *chunk;
  uint8_t *wptr;
  uint8_t *end;
  uint32_t page;
  uint32_t chunk_index;
  uint32_t chunk_id;
  uint32_t next_chunk_id;
  uint16_t count;
  uint8_t flags;

  /* Current packet. */
  bool in_packet;
  bool dropping;       /* no chunk: the rest of this packet is discarded */
  bool loss_pending;   /* a packet was dropped since the last written one */
  bool single_chunk;   /* every byte so far is in the current chunk's first fragment */
  uint8_t *frag_size;  /* the current fragment's 4 reserved size bytes */
  uint8_t *frag_start;
  uint64_t packet_bytes;

  struct {
    uint8_t *size_field; /* NULL once the size became a patch */
    int patch;           /* index in patches[] when size_field is NULL */
    uint64_t start;      /* packet_bytes when the message's payload started */
  } nest[LG_SMB_MAX_NESTING];
  int depth;

  lg_patch patches[LG_SMB_MAX_PENDING_PATCHES];
  size_t num_patches;

  lg_writer_counters counters;
} lg_trace_writer;

void lg_tw_init(lg_trace_writer *tw, lg_smb *smb, uint16_t writer_id, uint32_t target_buffer,
                lg_commit_fn commit, void *commit_ctx);

/* Starts a packet. Returns 1 if a packet was dropped since the last written one (the caller
 * marks the loss in this packet, as the SDK does), 0 otherwise, or TR_ERR_FULL when the SMB
 * has no free chunk: the packet is then dropped, and the appends and lg_tw_end_packet that
 * follow only count it. */
int lg_tw_begin_packet(lg_trace_writer *tw);
void lg_tw_append(lg_trace_writer *tw, const void *data, size_t len);
/* Opens a length-delimited field (tag + 4-byte redundant size); close with lg_tw_end_nested.
 * Callers keep to LG_SMB_MAX_NESTING open at once and LG_SMB_MAX_NESTED_PER_PACKET per packet
 * (more patches than that set error TR_ERR_INVAL). */
void lg_tw_begin_nested(lg_trace_writer *tw, uint32_t field);
void lg_tw_end_nested(lg_trace_writer *tw);
/* Bytes of the current packet so far (for padding to a size). */
uint64_t lg_tw_packet_bytes(const lg_trace_writer *tw);
/* Finishes the packet. Returns 0 if it was written, TR_ERR_FULL if it was dropped, or the
 * commit callback's error. */
int lg_tw_end_packet(lg_trace_writer *tw);
/* Commits the chunk being written (between packets) and sends the ready patches, as the SDK's
 * TraceWriter::Flush does. Returns 0 or the commit callback's error. */
int lg_tw_flush(lg_trace_writer *tw);

#endif
