/* link_stats.h: the agent's losses as one AgentStats message (docs/relay-protocol.md, Loss
 * statistics): per producer, the chunks, bytes and packets the chunk queue and the spill queue
 * dropped, and what the producer port found (ABI violations, SMB-full findings, chunks left
 * unscraped at its departure, why the agent closed it); the same drops, unscraped chunks and
 * closes per target buffer (so each session counts its own); plus the spill queue's totals.
 *
 * A report is built from the queues as they are now and the producer counts last set, and sent
 * only when it differs from the last one sent, or when forced (after each Welcome): every
 * counter is monotonic over the agent instance, so a repeated report is harmless.
 * Cost: O((producers + buffers)^2) per report (the agent reports at most once a second). No
 * sockets here: the caller's callback sends. */
#ifndef TR_LINK_STATS_H
#define TR_LINK_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/producer/chunk_queue.h"
#include "relay/link/relay_session.h"
#include "tracerelay/relay.pb-c.h"

/* A producer's ABI violations and SMB-full findings so far (monotonic). */
struct tr_link_producer_counts {
  uint64_t abi_violations;
  uint64_t smb_full;    /* commits that found its SMB full */
  uint64_t smb_full_ns; /* how long it was full, at most (tr_producer_stats.smb_full_ns) */
};

struct tr_link_stats_producer {
  uint32_t producer_id;
  struct tr_link_producer_counts c;
};

/* Zero-initialised is empty. Fields are link_stats.c's. */
typedef struct tr_link_stats {
  struct tr_link_stats_producer *producers; /* those with a count, departed ones included */
  size_t n_producers;
  uint8_t *last; /* the last report sent, serialised */
  size_t last_len;
} tr_link_stats;

/* Sets a producer's counts (a producer with none is not added). 0 or TR_ERR_NOMEM. */
int tr_link_stats_set_producer(tr_link_stats *s, uint32_t producer_id,
                               const struct tr_link_producer_counts *c);
/* Builds the report from q, a and the producer counts; unless it equals the last one sent
 * (and not force), calls send with it as a RelayFrame, and remembers it if send returned 0. */
void tr_link_stats_report(tr_link_stats *s, const tr_chunkq *q, const tr_relay_agent *a,
                          bool force, int (*send)(void *data, Tracerelay__RelayFrame *f),
                          void *data);
/* The producer counts summed over every producer. */
struct tr_link_producer_counts tr_link_stats_sum(const tr_link_stats *s);
void tr_link_stats_free(tr_link_stats *s);

#endif
