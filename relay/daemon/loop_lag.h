/* loop_lag.h: how long a libuv loop keeps events waiting, for the daemons' /metrics.
 *
 * Each loop iteration's busy time (from one poll for events to the next, minus the time spent
 * blocked in the poll itself, as libuv's UV_METRICS_IDLE_TIME counts it) is observed into a
 * histogram: an event that arrives while the loop is busy waits at most that long, so a
 * callback that stalls the loop (a TLS handshake's public-key operations, a large scrape) shows
 * up as one long iteration. The longest iteration since the start is kept too.
 *
 * Costs a prepare callback, a clock read and an idle-time read per iteration, and no wake-ups:
 * an idle loop stays asleep. Threads: the loop's thread only. */
#ifndef TR_LOOP_LAG_H
#define TR_LOOP_LAG_H

#include <stdint.h>
#include <uv.h>

#include "relay/daemon/prom_text.h"

typedef struct tr_loop_lag tr_loop_lag;

/* Starts measuring loop (it turns on UV_METRICS_IDLE_TIME). The handle does not keep the loop
 * alive. Returns 0, TR_ERR_NOMEM or a libuv error as TR_ERR_SYS. */
int tr_loop_lag_start(uv_loop_t *loop, tr_loop_lag **out);
/* Stops and frees it once its handle closed (from the loop). NULL is ignored. */
void tr_loop_lag_stop(tr_loop_lag *lag);
/* The histogram of iteration busy times, in seconds. */
const tr_prom_histogram *tr_loop_lag_histogram(const tr_loop_lag *lag);
/* The longest iteration's busy time since the start, in nanoseconds. */
uint64_t tr_loop_lag_max_ns(const tr_loop_lag *lag);

#endif
