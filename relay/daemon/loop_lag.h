/* loop_lag.h: how long a libuv loop keeps events waiting, for the daemons' /metrics.
 *
 * Each loop iteration's busy time (from one poll for events to the next, minus the time spent
 * blocked in the poll itself, as libuv's UV_METRICS_IDLE_TIME counts it) is observed into a
 * histogram: an event that arrives while the loop is busy waits at most that long, so a
 * callback that stalls the loop (a TLS handshake's public-key operations, a large scrape) shows
 * up as one long iteration. The longest iteration since the start is kept too.
 *
 * An iteration busy for TR_LOOP_LAG_STALL_NS or more is a stall: it is logged (a warning, at
 * most one per TR_LOOP_LAG_STALL_LOG_NS, with the count of those not logged) with the CPU the
 * loop's thread used meanwhile, which tells a long step on the loop (on CPU) from a thread kept
 * off the CPU (blocked in a system call, or waiting for a CPU on a starved machine).
 *
 * Costs a prepare callback, a clock read and an idle-time read per iteration (the thread's CPU
 * clock is read at most every 100 ms), and no wake-ups: an idle loop stays asleep. Threads:
 * the loop's thread only. */
#ifndef TR_LOOP_LAG_H
#define TR_LOOP_LAG_H

#include <stdint.h>
#include <uv.h>

#include "relay/daemon/prom_text.h"

#define TR_LOOP_LAG_STALL_NS 1000000000ull      /* 1 s */
#define TR_LOOP_LAG_STALL_LOG_NS 10000000000ull /* 10 s */

typedef struct tr_loop_lag tr_loop_lag;

/* The stalls so far and the last one. */
struct tr_loop_lag_stalls {
  uint64_t count;
  uint64_t last_busy_ns;   /* the last stall's busy time */
  uint64_t last_on_cpu_ns; /* CPU the loop's thread used from shortly before it to its end */
  uint64_t last_span_ns;   /* the busy time that CPU figure covers (>= last_busy_ns, at most
                              100 ms of earlier iterations more) */
};

/* Starts measuring loop (it turns on UV_METRICS_IDLE_TIME). The handle does not keep the loop
 * alive. Returns 0, TR_ERR_NOMEM or a libuv error as TR_ERR_SYS. */
int tr_loop_lag_start(uv_loop_t *loop, tr_loop_lag **out);
/* Stops and frees it once its handle closed (from the loop). NULL is ignored. */
void tr_loop_lag_stop(tr_loop_lag *lag);
/* The histogram of iteration busy times, in seconds. */
const tr_prom_histogram *tr_loop_lag_histogram(const tr_loop_lag *lag);
/* The longest iteration's busy time since the start, in nanoseconds. */
uint64_t tr_loop_lag_max_ns(const tr_loop_lag *lag);
/* What stalled the loop (see the top). */
struct tr_loop_lag_stalls tr_loop_lag_stalls(const tr_loop_lag *lag);

#endif
