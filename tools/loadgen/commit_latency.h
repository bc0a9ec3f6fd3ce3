/* commit_latency.h: how long a committed chunk stays in the shared memory before the service
 * (traced, or tracerelay's agent) frees it: the loadgen's --commit-latency. A sampler thread
 * takes one committed chunk at a time, at most one a millisecond, notes when the writer handed
 * it over (the commit queued for the IPC thread, as the SDK's arbiter queues it) and polls the
 * chunk until the service freed it: its state is Free, or its header changed (freed and taken
 * again between two polls). The figure includes the IPC thread's wake-up and the CommitData's
 * trip through the socket, as for an SDK app. Polls are ~20 us apart: shorter latencies read
 * as one poll interval. Each sample is also split where the app's IPC thread took the commit
 * to send it: "to send" is the app's own wake-up (the same whichever service it talks to),
 * "after send" is the CommitData's serialization, its trip through the socket and the
 * service's wake-up and free. */
#ifndef LG_COMMIT_LATENCY_H
#define LG_COMMIT_LATENCY_H

#include <stdint.h>
#include <stdio.h>

#include "tools/loadgen_writer/smb_writer.h"

typedef struct lg_latency lg_latency;

struct lg_latency_result {
  uint64_t samples;
  uint64_t unfinished; /* chunks still not freed when sampling stopped (or after 10 s) */
  double p50_us, p99_us, max_us;
  double to_send_p50_us, to_send_p99_us;       /* commit -> taken by the IPC thread */
  double after_send_p50_us, after_send_p99_us; /* taken by the IPC thread -> freed */
};

/* Starts the sampler thread on smb. 0 or a TR_ERR_* code. */
int lg_latency_start(lg_latency **out, const lg_smb *smb);
/* A writer committed (page, chunk): taken as the next sample if the sampler is idle and due.
 * Any thread; cheap when not taken. */
void lg_latency_offer(lg_latency *l, uint32_t page, uint32_t chunk);
/* The IPC thread took every commit offered so far, to send it now: the sample pending, if it
 * has no send time yet, gets this one. Called under the same lock as lg_latency_offer, so a
 * commit is offered before or after the take, never during it. */
void lg_latency_taken(lg_latency *l);
/* Stops the thread, fills *r and frees l. */
void lg_latency_stop(lg_latency *l, struct lg_latency_result *r);
/* "\"commit_to_free_us\":{...}" for the stats JSON. */
void lg_latency_write_json(const struct lg_latency_result *r, FILE *f);

#endif
