/* batch_builder.h: turns the chunk queue's entries into encoded ChunkBatch frames on a worker
 * thread, so that zstd and protobuf packing never hold up the agent's loop: the loop only pops
 * queue entries (pointer moves), and goes back to reading CommitData and freeing shared memory
 * while the batch is packed and compressed.
 *
 * One batch is built at a time, so batches come back in the order their entries were queued and
 * the codec is never used by two threads. The loop's thread calls every function here; the
 * worker touches only the job (its entries, which have left the queue, and the codec).
 * Cost: one uv_queue_work per batch (up to limit bytes of entries). */
#ifndef TR_BATCH_BUILDER_H
#define TR_BATCH_BUILDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "relay/producer/chunk_queue.h"
#include "relay/link/relay_frame.h"

/* A built batch, handed to on_built on the loop's thread. On success (rc == 0) the callee owns
 * frame and tally. On failure the entries are lost; entries and bytes say how many. */
struct tr_built_batch {
  int rc;
  uint64_t seq;       /* the batch seq it was encoded with */
  uint64_t last_qseq; /* the chunk queue seq of its last entry */
  size_t entries, bytes;
  uint8_t *frame;
  size_t len;
  tr_relay_tally *tally;
  size_t n_tally;
};

typedef struct tr_batch_builder tr_batch_builder;

/* 0 or a TR_ERR_*; the builder reads queue, which must outlive it. */
int tr_batch_builder_new(uv_loop_t *loop, tr_chunkq *queue,
                         void (*on_built)(void *data, struct tr_built_batch *b), void *data,
                         tr_batch_builder **out);
/* Starts a batch of up to limit bytes of entries (at least one), encoded with seq and, if
 * compress, zstd. false when one is being built already or the queue is empty. */
bool tr_batch_builder_start(tr_batch_builder *b, uint64_t seq, bool compress, size_t limit);
bool tr_batch_builder_busy(const tr_batch_builder *b);
/* Only while not busy. */
void tr_batch_builder_free(tr_batch_builder *b);

#endif
