/* loop_lag.c: a loop's busy time per iteration into a histogram (see loop_lag.h).
 *
 * libuv runs prepare callbacks right before it polls for events, once per iteration. Between
 * two of them the loop ran the poll (blocked, then the I/O callbacks), check, close, timer,
 * pending and idle callbacks; uv_metrics_idle_time() says how much of that was spent blocked. */
#include "relay/daemon/loop_lag.h"

#include <stdlib.h>
#include <time.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define COMP "loop"
#define CPU_SAMPLE_NS 100000000ull /* how old the thread's CPU reading may be: 100 ms */

/* Up to 20 ms is healthy (docs/operations.md); beyond, the buckets show how bad. */
static const double kLagBuckets[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                     0.1,    0.2,   0.5,   1,     2,    5};

struct tr_loop_lag {
  uv_prepare_t prepare;
  uint64_t last_ns;      /* uv_hrtime() at the last prepare callback; 0 before the first */
  uint64_t last_idle_ns; /* uv_metrics_idle_time() then */
  uint64_t max_ns;
  tr_prom_histogram hist;
  uint64_t cpu_at_ns; /* uv_hrtime() when the thread's CPU time was last read */
  uint64_t cpu_ns;    /* the thread's CPU time then */
  uint64_t busy_since_cpu_ns; /* busy time of the iterations since then */
  uint64_t logged_at_ns, not_logged;
  struct tr_loop_lag_stalls stalls;
};

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
    return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void note_stall(tr_loop_lag *lag, uint64_t now, uint64_t busy) {
  uint64_t cpu = thread_cpu_ns();
  struct tr_loop_lag_stalls *st = &lag->stalls;
  st->count++;
  st->last_busy_ns = busy;
  st->last_on_cpu_ns = cpu > lag->cpu_ns ? cpu - lag->cpu_ns : 0;
  st->last_span_ns = lag->busy_since_cpu_ns;
  if (lag->logged_at_ns != 0 && now - lag->logged_at_ns < TR_LOOP_LAG_STALL_LOG_NS) {
    lag->not_logged++;
    return;
  }
  double on_cpu = st->last_span_ns ? (double)st->last_on_cpu_ns / (double)st->last_span_ns : 0;
  TR_WARN(COMP, "the event loop was busy %.2f s in one iteration; its thread was on a CPU for "
          "%.0f %% of that: %s (stalls since the last one logged: %llu)",
          busy / 1e9, 100 * (on_cpu > 1 ? 1 : on_cpu),
          on_cpu >= 0.5 ? "mostly a long step on the loop"
                        : "mostly off the CPU (blocked in a system call, or waiting for a CPU)",
          (unsigned long long)lag->not_logged);
  lag->logged_at_ns = now;
  lag->not_logged = 0;
}

static void on_prepare(uv_prepare_t *h) {
  tr_loop_lag *lag = h->data;
  uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(h->loop);
  if (lag->last_ns != 0) {
    uint64_t span = now - lag->last_ns, idled = idle - lag->last_idle_ns;
    uint64_t busy = span > idled ? span - idled : 0;
    if (busy > lag->max_ns)
      lag->max_ns = busy;
    tr_prom_histogram_observe(&lag->hist, (double)busy / 1e9);
    lag->busy_since_cpu_ns += busy;
    if (busy >= TR_LOOP_LAG_STALL_NS)
      note_stall(lag, now, busy);
  }
  if (now - lag->cpu_at_ns >= CPU_SAMPLE_NS) {
    lag->cpu_at_ns = now;
    lag->cpu_ns = thread_cpu_ns();
    lag->busy_since_cpu_ns = 0;
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

struct tr_loop_lag_stalls tr_loop_lag_stalls(const tr_loop_lag *lag) { return lag->stalls; }
