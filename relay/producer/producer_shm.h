/* producer_shm.h: one producer's shared memory as the agent sees it, and the path by which its
 * chunks leave it: CommitData moves, patches and flush acks (reference 4.4, 4.7) and scraping
 * (4.6), all into the agent's chunk queue (chunk_queue.h).
 *
 * This is the producer port's security boundary, kept free of sockets and event loops so that
 * it can be fuzzed and benchmarked alone. A producer is untrusted, so:
 * - every page, chunk index, writer id, target buffer, size and patch is checked before use;
 *   an entry that fails is refused whole and counted as an ABI violation of this producer;
 * - a chunk is taken Complete -> BeingRead, copied into private memory, and freed at once
 *   (smb.h), so nothing the network does can stall the producer; its header is decoded once,
 *   from the private copy;
 * - a producer can only move chunks into, and patch chunks of, the target buffers it was given
 *   (tr_producer_shm_add_buffer), and a registered writer only into its own buffer; every
 *   queued entry carries this producer's id, so it can never touch another producer's chunks;
 * - a full queue drops and counts (the queue does); nothing here blocks.
 * Cost: per moved chunk one copy out of the SMB, one fragment walk (to trim the stale tail) and
 * one copy into the queue; O(log writers) per chunk for the writer lookup, O(buffers) for the
 * buffer check (a producer has a handful). */
#ifndef TR_PRODUCER_SHM_H
#define TR_PRODUCER_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "relay/producer/chunk_queue.h"
#include "relay/producer/smb.h"

#define TR_PRODUCER_MAX_PATCHES 1024u      /* per ChunkToPatch entry */
#define TR_PRODUCER_MAX_EMULATED_CHUNK 65536u /* ChunksToMove.data, header included */

typedef struct tr_producer_stats {
  uint64_t chunks_moved;   /* chunks queued by commits (scraped ones are counted apart) */
  uint64_t bytes_moved;    /* payload bytes queued, scraped chunks included */
  uint64_t patches;        /* patches queued */
  uint64_t flush_acks;
  uint64_t scraped_chunks; /* chunks queued by scraping */
  uint64_t abi_violations; /* refused entries and calls, malformed chunks */
  uint64_t smb_full;       /* commits that found the SMB without a free chunk: the producer
                            * may have dropped (or stalled) since the commit before */
  uint64_t smb_full_ns;    /* for those commits, the time since the commit before (or since
                            * the SMB was set up): an upper bound of how long it was full */
  uint64_t chunks_dropped; /* filled in by the port from the queue's drop counters */
  uint64_t exit_unscraped_chunks; /* used chunks left at its departure that could not be
                                   * scraped (tr_producer_shm_scrape_exit) */
} tr_producer_stats;

typedef struct tr_producer_writer {
  uint16_t id;
  uint32_t target_buffer;
} tr_producer_writer;

/* Fields are read by the port; change them only through the functions below. */
typedef struct tr_producer_shm {
  uint32_t producer_id;
  uint32_t uid; /* SO_PEERCRED of the connection */
  int32_t pid;
  tr_smb smb;
  bool has_smb;
  bool scraping;     /* the producer asked SMB_SCRAPING_ENABLED */
  uint8_t *scratch;  /* one chunk copied out of the SMB, page_size bytes */
  uint32_t *buffers; /* target buffers given to this producer, unsorted, no duplicates */
  size_t num_buffers, cap_buffers;
  tr_producer_writer *writers; /* registered writers, sorted by id */
  size_t num_writers, cap_writers;
  tr_producer_stats stats;
  uint64_t last_commit_ns; /* CLOCK_MONOTONIC of the last commit, or of the SMB's set-up */
} tr_producer_shm;

/* What one CommitData did. */
typedef struct tr_producer_commit_result {
  unsigned violations;         /* entries refused */
  const char *first_violation; /* static text naming the first refusal, NULL if none */
  size_t queued;               /* entries the queue took (chunks, patches, flush ack) */
  bool flush_ack;              /* the request carried flush_request_id */
  uint64_t flush_request_id;
} tr_producer_commit_result;

void tr_producer_shm_init(tr_producer_shm *s, uint32_t producer_id, uint32_t uid, int32_t pid);
/* Closes the SMB (if any) and frees everything. */
void tr_producer_shm_free(tr_producer_shm *s);
/* Takes ownership of an open SMB (tr_smb_create / tr_smb_adopt / tr_smb_init_view). On
 * failure (TR_ERR_STATE: already has one, TR_ERR_NOMEM) the caller keeps it. */
int tr_producer_shm_set_smb(tr_producer_shm *s, tr_smb *smb);
/* Lets the producer write into `buffer` (a global buffer id). 0 or TR_ERR_NOMEM. */
int tr_producer_shm_add_buffer(tr_producer_shm *s, uint32_t buffer);
bool tr_producer_shm_has_buffer(const tr_producer_shm *s, uint32_t buffer);
/* RegisterTraceWriter: binds a writer to a buffer (a second call rebinds it). TR_ERR_PROTO
 * for a writer id outside 1..32767, TR_ERR_NOMEM. */
int tr_producer_shm_register_writer(tr_producer_shm *s, uint32_t writer_id, uint32_t buffer);
/* UnregisterTraceWriter. TR_ERR_NOT_FOUND if it was not registered. */
int tr_producer_shm_unregister_writer(tr_producer_shm *s, uint32_t writer_id);

/* Applies one CommitDataRequest in the order the reference fixes: moves, then patches, then
 * the flush ack. Refused entries are skipped (the rest still applies), counted in
 * stats.abi_violations and described in *res. Always returns 0: the result says what
 * happened; drops of a full queue are counted by the queue. */
int tr_producer_shm_commit(tr_producer_shm *s, tr_chunkq *q,
                           const Perfetto__Protos__CommitDataRequest *req,
                           tr_producer_commit_result *res);

/* Scraping (reference 4.6): copies every BeingWritten or Complete chunk of a registered writer
 * whose buffer this producer was given into the queue, leaving the SMB alone. A BeingWritten
 * chunk goes only if it has at least 2 fragments, with `incomplete` set and its header as
 * found: the reader ignores its last fragment (trace_buffer.h). Does nothing unless the
 * producer asked for scraping and has an SMB. Returns the number of chunks queued.
 * O(pages + chunks). */
size_t tr_producer_shm_scrape(tr_producer_shm *s, tr_chunkq *q);

/* The producer's departure (its connection ended: it exited, crashed, or the agent closed it),
 * as traced scrapes on disconnect: its last chunks, committed or being written, go into the
 * queue by the rules of tr_producer_shm_scrape, for the buffers[0..num_buffers) of the sessions
 * it is in only. A used chunk (one fragment begun at least) that cannot go is counted, in q
 * (tr_chunkq_count_exit) and stats.exit_unscraped_chunks: a chunk being written with fewer than
 * 2 fragments (its one packet is unfinished), every chunk of a producer that did not ask for
 * scraping, and, under buffer 0, a chunk of an unknown writer (its buffer unknown). Chunks of
 * other buffers are no session's of this producer and are left alone. Returns the number of
 * chunks queued. O(pages + chunks + chunks x num_buffers). */
size_t tr_producer_shm_scrape_exit(tr_producer_shm *s, tr_chunkq *q, const uint32_t *buffers,
                                   size_t num_buffers);

#endif
