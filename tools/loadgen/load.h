/* load.h: the loadgen's writer threads. Each owns one trace writer (writer id 1..N) and one
 * sequence of packets (packet.h), and writes events at a fixed rate until its quota or duration
 * is reached or it is stopped; when it ends it closes an open slice and commits its chunk, as an
 * SDK TraceWriter does when it is destroyed, unless told to hang (cfg.hang): then, at its
 * quota, it begins one more packet and stops inside it, its chunk still being written.
 *
 * The IPC thread reaches into a writer only between two packets, under the writer's lock: to
 * commit its chunk on a flush (lg_load_flush) and to reset its incremental state. */
#ifndef LG_LOAD_H
#define LG_LOAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "tools/loadgen/flows.h"
#include "tools/loadgen_writer/packet.h"
#include "tools/loadgen_writer/smb_writer.h"

typedef struct lg_load_config {
  unsigned writers;
  double rate;          /* events per second per writer, 0 = unpaced */
  uint32_t packet_size;
  double duration_s;    /* 0 = no limit */
  uint64_t packets;     /* events per writer, 0 = no limit */
  lg_flows *flows;      /* cross-host flows on writer 1's slices, or NULL */
  bool hang;            /* at the quota, leave a packet begun and unfinished (--hang-after) */
} lg_load_config;

typedef struct lg_load lg_load;

typedef struct lg_writer {
  lg_load *load;
  pthread_t thread;
  pthread_mutex_t lock; /* guards tw and seq */
  lg_trace_writer tw;
  lg_sequence seq;
  int error; /* first error other than a drop */
  bool hung; /* cfg.hang: it stopped in the middle of a packet, for good */
} lg_writer;

struct lg_load {
  lg_load_config cfg;
  lg_writer *writers;
  unsigned started;    /* threads created */
  pthread_mutex_t stop_lock;
  pthread_cond_t stop_cond;
  bool stop;
};

/* Starts cfg->writers threads writing into smb for target_buffer; commits go to commit(ctx). */
int lg_load_start(lg_load *load, const lg_load_config *cfg, lg_smb *smb, uint32_t target_buffer,
                  lg_commit_fn commit, void *ctx);
/* cfg.hang: whether every writer has stopped mid-packet (under their locks). */
bool lg_load_all_hung(lg_load *load);
/* Commits every writer's current chunk (between packets). First error, or 0. */
int lg_load_flush(lg_load *load);
void lg_load_clear_incremental_state(lg_load *load);
/* Stops and joins every writer (each commits its last chunk first). First writer error, or 0.
 * The counters stay readable until lg_load_free. */
int lg_load_stop(lg_load *load);
void lg_load_free(lg_load *load);

#endif
