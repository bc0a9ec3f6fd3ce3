/* loop_lag.c: a loop's busy time per iteration into a histogram (see loop_lag.h).
 *
 * libuv runs prepare callbacks right before it polls for events, once per iteration. Between
 * two of them the loop ran the poll (blocked, then the I/O callbacks), check, close, timer,
 * pending and idle callbacks; uv_metrics_idle_time() says how much of that was spent blocked. */
#include "relay/daemon/loop_lag.h"

#include <stdlib.h>

#include "relay/base/tr_error.h"

/* Up to 20 ms is healthy (docs/operations.md); beyond, the buckets show how bad. */
static const double kLagBuckets[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                     0.1,    0.2,   0.5,   1,     2,    5};

struct tr_loop_lag {
  uv_prepare_t prepare;
  uint64_t last_ns;      /* uv_hrtime() at the last prepare callback; 0 before the first */
  uint64_t last_idle_ns; /* uv_metrics_idle_time() then */
  uint64_t max_ns;
  tr_prom_histogram hist;
};

static void on_prepare(uv_prepare_t *h) {
  tr_loop_lag *lag = h->data;
  uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(h->loop);
  if (lag->last_ns != 0) {
    uint64_t span = now - lag->last_ns, idled = idle - lag->last_idle_ns;
    uint64_t busy = span > idled ? span - idled : 0;
    if (busy > lag->max_ns)
      lag->max_ns = busy;
    tr_prom_histogram_observe(&lag->hist, (double)busy / 1e9);
  }
  lag->last_ns = now;
  lag->last_idle_ns = idle;
}

int tr_loop_lag_start(uv_loop_t *loop, tr_loop_lag **out) {
  tr_loop_lag *lag = calloc(1, sizeof *lag);
  if (lag == NULL)
    return TR_ERR_NOMEM;
  lag->hist.le = kLagBuckets;
  lag->hist.n = sizeof kLagBuckets / sizeof kLagBuckets[0];
  int rc = uv_loop_configure(loop, UV_METRICS_IDLE_TIME);
  if (rc == 0)
    rc = uv_prepare_init(loop, &lag->prepare);
  if (rc < 0) {
    free(lag);
    return rc; /* libuv's codes are negated errno values, as TR_ERR_SYS */
  }
  lag->prepare.data = lag;
  uv_prepare_start(&lag->prepare, on_prepare);
  uv_unref((uv_handle_t *)&lag->prepare);
  *out = lag;
  return 0;
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void tr_loop_lag_stop(tr_loop_lag *lag) {
  if (lag != NULL)
    uv_close((uv_handle_t *)&lag->prepare, on_closed);
}

const tr_prom_histogram *tr_loop_lag_histogram(const tr_loop_lag *lag) { return &lag->hist; }

uint64_t tr_loop_lag_max_ns(const tr_loop_lag *lag) { return lag->max_ns; }
