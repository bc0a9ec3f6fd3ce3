/* test_clocksync.c: the estimator against simulated hosts whose clock is known exactly.
 *
 * A host's BOOTTIME is H(t) = t + offset + drift*(t - t0) of the service's BOOTTIME t (the true
 * time). Probes cross a link with a fixed base delay, exponential jitter each way and occasional
 * huge outliers; the agent's turnaround varies. Accuracy is asserted on the error against the
 * known truth only (no wall-clock timing), together with the mapping's guarantees: causality of
 * every probe, monotonic, past values final, bounded slope, error bound, breakpoint export, and
 * the remote_clock_sync encoding read back with trace_processor's formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "relay/clock/clocksync.h"
#include "relay/base/tr_error.h"

#define SEC 1000000000LL
#define MS 1000000LL
#define US 1000LL
/* An exchange by its four times, as a pointer for tr_clocksync_add_probe. */
#define PROBE(a, b, c, d) (&(struct tr_clocksync_probe){.t1 = a, .t2 = b, .t3 = c, .t4 = d})

struct host {
  long double offset, drift, t0;
};

static int64_t host_clock(const struct host *h, long double t) {
  return (int64_t)floorl(t + h->offset + h->drift * (t - h->t0));
}

/* The service time at which the host's clock read hv: the truth the mapping should give. */
static long double truth(const struct host *h, int64_t hv) {
  return h->t0 + ((long double)hv - h->offset - h->t0) / (1.0L + h->drift);
}

static uint64_t rng_state;
static double uniform(void) { /* xorshift64*, deterministic */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static double expo(double mean) {
  return -mean * log(1.0 - uniform());
}

struct link {
  double base_ns, jitter_mean_ns, outlier_prob, turnaround_ns;
};

static struct tr_clocksync_probe probe_at(const struct host *h, const struct link *l,
                                          int64_t t1) {
  double fwd = l->base_ns + expo(l->jitter_mean_ns);
  double back = l->base_ns + expo(l->jitter_mean_ns);
  if (uniform() < l->outlier_prob)
    fwd += 5 * MS + uniform() * 45 * MS;
  if (uniform() < l->outlier_prob)
    back += 5 * MS + uniform() * 45 * MS;
  double turn = l->turnaround_ns * (0.5 + uniform());
  long double recv = (long double)t1 + fwd;
  struct tr_clocksync_probe p = {.t1 = t1};
  p.t2 = host_clock(h, recv);
  p.t3 = host_clock(h, recv + turn);
  p.t4 = (int64_t)ceill(recv + turn + back);
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

struct run_result {
  double median_us, p99_us, max_us;
  double live_median_us, live_p99_us;
  double bound_median_us;
  uint64_t bound_misses, outliers;
};

#define MAX_PROBES 4000
#define CHECKS 4000

/* The probes of the last simulate() run: their t3 are the mapping's knots. */
static struct tr_clocksync_probe probes[MAX_PROBES];
static size_t np;

/* Runs one simulated host for `seconds` with probes at 10 Hz for 10 s then 1 Hz, checking every
 * guarantee on the way. Errors are measured on host times after `warmup_s`. Returns the
 * estimator (the caller frees it). */
static struct tr_clocksync *simulate(const struct host *h, const struct link *l, int seconds,
                                     int warmup_s, struct run_result *res) {
  struct tr_clocksync *est;
  struct tr_clocksync_config cfg;
  tr_clocksync_config_default(&cfg);
  cfg.retain_ns = (int64_t)seconds * SEC + cfg.fit_span_ns; /* the whole run is checked at its end */
  assert_int_equal(tr_clocksync_init(&est, &cfg), 0);
  static int64_t check_h[CHECKS], check_s[CHECKS];
  static double live[MAX_PROBES * 4];
  size_t nchecks = 0, nlive = 0;
  np = 0;
  int64_t t = (int64_t)h->t0;
  int64_t end = t + seconds * SEC;
  int64_t warm = t + warmup_s * SEC;
  int64_t host_warm = host_clock(h, (long double)warm);
  int64_t prev_frontier = 0;

  while (t < end) {
    struct tr_clocksync_probe p = probe_at(h, l, t);
    assert_true(np < MAX_PROBES);
    probes[np++] = p;
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
    int64_t frontier = tr_clocksync_frontier(est);
    assert_int_equal(frontier, p.t3);

    /* the new segment: continuous from the old frontier, slope within drift + slew */
    if (prev_frontier) {
      int64_t s0, s1;
      assert_int_equal(tr_clocksync_map(est, prev_frontier, &s0), 0);
      assert_int_equal(tr_clocksync_map(est, frontier, &s1), 0);
      double slope = (double)(s1 - s0) / (double)(frontier - prev_frontier);
      /* causality outranks the slew bound: only a knot on a corridor edge may exceed it */
      int64_t m2;
      assert_int_equal(tr_clocksync_map(est, p.t2, &m2), 0);
      assert_true(fabs(slope - 1.0) <= (1000 + 500) * 1e-6 + 1e-9 || s1 == p.t4 || m2 - p.t1 <= 1);
    }
    /* causality of this probe, right away */
    int64_t m2, m3;
    assert_int_equal(tr_clocksync_map(est, p.t2, &m2), 0);
    assert_int_equal(tr_clocksync_map(est, p.t3, &m3), 0);
    assert_true(m2 >= p.t1);
    assert_true(m3 <= p.t4);

    /* remember a few final values to check they never change */
    if (nchecks < CHECKS) {
      int64_t hc = prev_frontier ? prev_frontier + (int64_t)(uniform() * (double)(frontier - prev_frontier)) : p.t2;
      check_h[nchecks] = hc;
      assert_int_equal(tr_clocksync_map(est, hc, &check_s[nchecks]), 0);
      nchecks++;
    }
    /* live error: events just after the frontier, mapped before the next probe */
    if (p.t1 >= warm)
      for (int k = 0; k < 4; k++) {
        int64_t hv = frontier + (int64_t)(uniform() * SEC);
        int64_t sv;
        assert_int_equal(tr_clocksync_map(est, hv, &sv), 0);
        live[nlive++] = fabs((double)((long double)sv - truth(h, hv)));
      }
    prev_frontier = frontier;
    t += (t - (int64_t)h->t0 < 10 * SEC) ? 100 * MS : SEC;
  }

  /* past values are final */
  for (size_t i = 0; i < nchecks; i++) {
    int64_t s;
    assert_int_equal(tr_clocksync_map(est, check_h[i], &s), 0);
    assert_int_equal(s, check_s[i]);
  }
  /* every probe's causality, with the final mapping */
  for (size_t i = 0; i < np; i++) {
    int64_t m2, m3;
    tr_clocksync_map(est, probes[i].t2, &m2);
    tr_clocksync_map(est, probes[i].t3, &m3);
    assert_true(m2 >= probes[i].t1);
    assert_true(m3 <= probes[i].t4);
  }
  struct tr_clocksync_stats st;
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.conflicts, 0);
  assert_int_equal(st.probes, np);

  /* accuracy, monotonicity and the error bound over the whole run after warm-up */
  int64_t first = probes[0].t2, last = tr_clocksync_frontier(est);
  static double err[CHECKS], bounds[CHECKS];
  size_t ne = 0;
  int64_t prev_s = INT64_MIN, step = (last - host_warm) / CHECKS;
  res->bound_misses = 0;
  for (int64_t hv = host_warm; hv <= last && ne < CHECKS; hv += step) {
    int64_t sv, sv1;
    assert_int_equal(tr_clocksync_map(est, hv, &sv), 0);
    assert_int_equal(tr_clocksync_map(est, hv + 2, &sv1), 0);
    assert_true(sv > prev_s);
    assert_true(sv1 > sv); /* distinct events stay distinct */
    prev_s = sv;
    double e = fabs((double)((long double)sv - truth(h, hv)));
    int64_t bound = tr_clocksync_error_bound(est, hv);
    assert_true(bound > 0);
    bounds[ne] = (double)bound;
    err[ne++] = e;
    if (e > (double)bound)
      res->bound_misses++;
  }
  qsort(err, ne, sizeof(double), cmp_double);
  qsort(bounds, ne, sizeof(double), cmp_double);
  res->bound_median_us = bounds[ne / 2] / 1000.0;
  res->outliers = st.outliers;
  qsort(live, nlive, sizeof(double), cmp_double);
  res->median_us = err[ne / 2] / 1000.0;
  res->p99_us = err[ne * 99 / 100] / 1000.0;
  res->max_us = err[ne - 1] / 1000.0;
  res->live_median_us = live[nlive / 2] / 1000.0;
  res->live_p99_us = live[nlive * 99 / 100] / 1000.0;
  (void)first;
  return est;
}

static const struct link jittery = {
    .base_ns = 30 * US, .jitter_mean_ns = 50 * US, .outlier_prob = 0.02, .turnaround_ns = 10 * US};

static void test_accuracy(void **state) {
  (void)state;
  const struct host hosts[] = {
      {.offset = 3.0L * 3600 * SEC, .drift = 200e-6L, .t0 = 36000.0L * SEC},
      {.offset = -2.0L * 3600 * SEC, .drift = -200e-6L, .t0 = 36000.0L * SEC},
      {.offset = 12345678.0L, .drift = 0.0L, .t0 = 36000.0L * SEC},
      {.offset = -7.5L * 3600 * SEC, .drift = 37.5e-6L, .t0 = 50000.0L * SEC},
  };
  for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++)
    for (uint64_t seed = 0; seed < 3; seed++) {
      rng_state = 0x9e3779b97f4a7c15ull + i * 1000 + seed * 7919;
      struct run_result r;
      tr_clocksync_free(simulate(&hosts[i], &jittery, 900, 60, &r));
      print_message("host %zu/%llu: offset %.0f s drift %+.1f ppm: error median %.2f us "
                    "p99 %.2f us max %.2f us; live median %.2f us p99 %.2f us; "
                    "bound median %.1f us, misses %llu; outlier windows %llu\n",
                    i, (unsigned long long)seed, (double)(hosts[i].offset / SEC),
                    (double)(hosts[i].drift * 1e6L), r.median_us, r.p99_us, r.max_us,
                    r.live_median_us, r.live_p99_us, r.bound_median_us,
                    (unsigned long long)r.bound_misses, (unsigned long long)r.outliers);
      assert_true(r.median_us <= 3.0);
      assert_true(r.p99_us <= 15.0);
      assert_true(r.live_p99_us <= 15.0);
      assert_int_equal(r.bound_misses, 0);

    }
}

/* trace_processor's pure-offset reading of breakpoints: the latest at or below h, else the first. */
static int64_t tp_lookup(const struct tr_clocksync_breakpoint *bp, int n, int64_t h) {
  int lo = 0, hi = n - 1, found = 0;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (bp[mid].host_ts <= h) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return h + (bp[found].service_ts - bp[found].host_ts);
}

/* trace_processor's offset of one PING/UPDATE pair (CalculateClockOffsets, reference 7.5). */
static int64_t tp_pair_offset(const struct tr_clocksync_sync_pair *p) {
  int64_t t1c = p->ping_remote, t1h = p->ping_service;
  int64_t t2c = p->update_remote, t2h = p->update_service;
  int64_t o1 = (t1c + t2c) / 2 - t1h;
  int64_t o2 = t2c - (t1h + t2h) / 2;
  return (o1 + o2) / 2;
}

#define STEP_NS 100       /* the service's TR_TIMELINE_STEP_NS */
#define TOLERANCE_NS 2000 /* and TR_TIMELINE_TOLERANCE_NS */

/* Host h simulated `seconds` from `seed` on the jittery link, then *n breakpoints of its mapping
 * exported in STEP_NS steps over `span` of host time from 10 s after its start (*from), each
 * step back within STEP_NS (M's whole ns round within it: spaced for STEP_NS - 1). */
static struct tr_clocksync *stepped_export(const struct host *h, uint64_t seed, int seconds,
                                           int64_t span, struct tr_clocksync_breakpoint *bp,
                                           int cap, int *n, int64_t *from) {
  struct run_result r;
  rng_state = seed;
  struct tr_clocksync *est = simulate(h, &jittery, seconds, 20, &r);
  *from = host_clock(h, h->t0) + 10 * SEC;
  *n = tr_clocksync_export_steps(est, *from, *from + span, TOLERANCE_NS, STEP_NS, bp, (size_t)cap);
  assert_true(*n > 4);
  for (int i = 1; i < *n; i++)
    assert_true((bp[i - 1].service_ts - bp[i - 1].host_ts) - (bp[i].service_ts - bp[i].host_ts) <=
                STEP_NS);
  return est;
}

/* Issue 41: trace_processor's offset, constant from one breakpoint to the next, steps back at
 * each where the host's clock runs fast. The stepped export keeps every such step within
 * step_ns and the conversion within the tolerance; the writer's series
 * (tr_clocksync_steps_next) keeps it so across a mapping re-planned below what was written,
 * catching up a step at a time. Fails with tr_clocksync_export (steps up to the tolerance). */
static void test_export_steps_back_bounded(void **state) {
  (void)state;
  const struct host h = {.offset = 2.0L * 3600 * SEC, .drift = 200e-6L, .t0 = 36000.0L * SEC};
  static struct tr_clocksync_breakpoint bp[200000], pt;
  const int64_t step = STEP_NS, tol = TOLERANCE_NS;
  int64_t from, to, m;
  int n;
  struct tr_clocksync *est = stepped_export(&h, 7, 60, 5 * SEC, bp, 200000, &n, &from);
  to = from + 5 * SEC;
  print_message("200 ppm fast, %lld ns steps: %d breakpoints for 5 s\n", (long long)step, n);
  /* The writer's series from a last point 7.5 us above M: every step back within step_ns,
   * both clocks rising by 3 ns at least, on M again after about 75 points. */
  struct tr_clocksync_steps st = {.step_ns = step, .any = true};
  st.last.host_ts = from - 1000;
  assert_int_equal(tr_clocksync_map(est, st.last.host_ts, &st.last.service_ts), 0);
  st.last.service_ts += 7500;
  struct tr_clocksync_breakpoint prev = st.last;
  size_t written = 0;
  for (int i = 0; i < n; i++)
    while (tr_clocksync_steps_next(&st, est, &bp[i], -1, &pt) > 0) {
      int64_t back = (prev.service_ts - prev.host_ts) - (pt.service_ts - pt.host_ts);
      assert_true(back <= step);
      assert_true(pt.host_ts - prev.host_ts >= 3 && pt.service_ts - prev.service_ts >= 3);
      assert_true(pt.host_ts <= bp[i].host_ts);
      prev = pt;
      written++;
    }
  assert_int_equal(tr_clocksync_map(est, prev.host_ts, &m), 0);
  assert_int_equal(prev.service_ts, m); /* caught up */
  assert_true(st.above >= 70 && st.above <= 80);
  assert_true(written <= (size_t)n + st.above);
  /* No point at or below the floor. */
  struct tr_clocksync_steps fresh = {.step_ns = step};
  assert_int_equal(tr_clocksync_steps_next(&fresh, est, &bp[0], bp[0].host_ts, &pt), 0);
  assert_int_equal(tr_clocksync_steps_next(&fresh, est, &bp[1], bp[0].host_ts, &pt), 1);
  assert_int_equal(tr_clocksync_export_steps(est, from, to, tol, tol + 1, bp, 10), TR_ERR_INVAL);
  assert_int_equal(tr_clocksync_export_steps(est, from, to, tol, 0, bp, 10), TR_ERR_INVAL);
  tr_clocksync_free(est);
}

/* A breakpoint more than a step below the last point, M falling to it gradually (a pass's
 * floor or a rounding left the points between out; the host drifts about 1 ppm, so M's points
 * are 75 ms apart): the series takes M's own points, a step apart, not one every 4 steps of
 * host time along M (the old catch-up wrote one per 400 ns there: 213,595 points for a 0.8 ppm
 * host in a 12 s global-clocks trace). */
static void test_steps_skip_gradual_fall(void **state) {
  (void)state;
  const struct host h = {.offset = 1.0L * 3600 * SEC, .drift = 1e-6L, .t0 = 36000.0L * SEC};
  static struct tr_clocksync_breakpoint bp[4096], pt;
  const int64_t step = STEP_NS;
  int64_t from, m;
  int n;
  struct tr_clocksync *est = stepped_export(&h, 11, 30, 2 * SEC, bp, 4096, &n, &from);
  struct tr_clocksync_steps st = {.step_ns = step};
  struct tr_clocksync_breakpoint prev;
  assert_int_equal(tr_clocksync_steps_next(&st, est, &bp[0], -1, &prev), 1);
  /* bp[1] and bp[2] left out: bp[3] lies about two steps below bp[0] */
  assert_true((bp[0].service_ts - bp[0].host_ts) - (bp[3].service_ts - bp[3].host_ts) > step);
  size_t written = 0;
  for (int i = 3; i < n; i++)
    while (tr_clocksync_steps_next(&st, est, &bp[i], -1, &pt) > 0) {
      int64_t back = (prev.service_ts - prev.host_ts) - (pt.service_ts - pt.host_ts);
      assert_true(back <= step);
      assert_int_equal(tr_clocksync_map(est, pt.host_ts, &m), 0);
      assert_int_equal(pt.service_ts, m); /* M's own points: nothing to catch up */
      prev = pt;
      written++;
    }
  assert_int_equal(st.above, 0);
  print_message("1 ppm, bp[1], bp[2] left out: %zu points for %d breakpoints\n", written, n - 3);
  assert_true(written <= (size_t)n);
  tr_clocksync_free(est);
}

static void test_export_reproduces_mapping(void **state) {
  (void)state;
  const struct host h = {.offset = 3.0L * 3600 * SEC, .drift = -200e-6L, .t0 = 36000.0L * SEC};
  rng_state = 42;
  struct run_result r;
  struct tr_clocksync *est = simulate(&h, &jittery, 120, 20, &r);
  static struct tr_clocksync_breakpoint bp[200000];
  int64_t from = host_clock(&h, h.t0) - SEC, to = tr_clocksync_frontier(est) + 2 * SEC;
  const int64_t tolerances[] = {200, 1000, 20000};
  for (size_t t = 0; t < 3; t++) {
    int n = tr_clocksync_export(est, from, to, tolerances[t], bp, 200000);
    assert_true(n > 0);
    print_message("tolerance %lld ns: %d breakpoints for %.1f s\n", (long long)tolerances[t], n,
                  (double)(to - from) / SEC);
    assert_int_equal(bp[0].host_ts, from);
    for (int i = 0; i < n; i++) {
      int64_t m;
      assert_int_equal(tr_clocksync_map(est, bp[i].host_ts, &m), 0);
      assert_int_equal(bp[i].service_ts, m); /* on the mapping */
      if (i) {
        assert_true(bp[i].host_ts > bp[i - 1].host_ts);
        assert_true(bp[i].service_ts > bp[i - 1].service_ts);
      }
    }
    /* TP's staircase stays within the tolerance everywhere, knots included */
    for (int k = 0; k < 20000; k++) {
      int64_t hv = from + (int64_t)(uniform() * (double)(to - from));
      if (k < 2000) /* and right around knots, where segments change */
        hv = probes[(size_t)(uniform() * (double)np)].t3 + (int64_t)(uniform() * 7) - 3;
      int64_t m;
      assert_int_equal(tr_clocksync_map(est, hv, &m), 0);
      int64_t d = tp_lookup(bp, n, hv) - m;
      assert_true(d <= tolerances[t] + 2 && d >= -(tolerances[t] + 2));
    }
    /* every breakpoint as a remote_clock_sync pair: TP reads back exactly its offset, and the
     * values only increase on both clocks across consecutive packets */
    for (int i = 0; i < n; i++) {
      struct tr_clocksync_sync_pair pair, prev;
      tr_clocksync_pair_from_breakpoint(&bp[i], &pair);
      assert_int_equal(tp_pair_offset(&pair), bp[i].host_ts - bp[i].service_ts);
      assert_true(pair.ping_remote < pair.update_remote);
      assert_true(pair.ping_service < pair.update_service);
      if (i) {
        tr_clocksync_pair_from_breakpoint(&bp[i - 1], &prev);
        assert_true(pair.ping_remote > prev.update_remote);
        assert_true(pair.ping_service > prev.update_service);
      }
    }
  }
  assert_int_equal(tr_clocksync_export(est, from, to, 1000, bp, 3), TR_ERR_FULL);
  assert_int_equal(tr_clocksync_export(est, to, from, 1000, bp, 10), TR_ERR_INVAL);
  assert_int_equal(tr_clocksync_export(est, from, to, 0, bp, 10), TR_ERR_INVAL);
  tr_clocksync_free(est);
}

static int64_t frontier_value(const struct tr_clocksync *est) {
  int64_t s;
  assert_int_equal(tr_clocksync_map(est, tr_clocksync_frontier(est), &s), 0);
  return s;
}

/* Probes every second through a link without jitter. */
static void feed(struct tr_clocksync *est, const struct host *h, const struct link *l,
                 int64_t *t, int count) {
  for (int i = 0; i < count; i++, *t += SEC) {
    struct tr_clocksync_probe p = probe_at(h, l, *t);
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
  }
}

/* A day of probes once a second: memory follows the last retain_ns (10 min), not the uptime
 * (the rings used to be allocated for 18 h of knots, 2.3 MiB per host), and over those 10
 * minutes the mapping is the one an estimator keeping everything has. */
static void test_memory_follows_retention(void **state) {
  (void)state;
  const struct host h = {.offset = 42.0L * SEC, .drift = 20e-6L, .t0 = 1000.0L * SEC};
  static const struct link quiet = {.base_ns = 30 * US, .turnaround_ns = 10 * US};
  struct tr_clocksync *est, *all;
  struct tr_clocksync_config cfg;
  tr_clocksync_config_default(&cfg);
  assert_int_equal(tr_clocksync_init(&est, NULL), 0);
  cfg.retain_ns = 30 * 3600 * SEC;
  cfg.max_knots = cfg.history = cfg.exchanges = 1u << 17;
  assert_int_equal(tr_clocksync_init(&all, &cfg), 0);
  size_t at_start = tr_clocksync_memory_bytes(est);
  int64_t t = (int64_t)h.t0;
  rng_state = 12345;
  for (int i = 0; i < 24 * 3600; i++, t += SEC) {
    struct tr_clocksync_probe p = probe_at(&h, &quiet, t);
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
    assert_int_equal(tr_clocksync_add_probe(all, &p), 0);
  }
  size_t kept = tr_clocksync_memory_bytes(est), everything = tr_clocksync_memory_bytes(all);
  print_message("estimator memory: %zu bytes at start, %zu after a day (%zu keeping it all)\n",
                at_start, kept, everything);
  assert_true(kept < 200 * 1024);
  assert_true(everything > 10 * kept);
  int64_t frontier = tr_clocksync_frontier(est);
  assert_int_equal(frontier, tr_clocksync_frontier(all));
  for (int64_t hv = frontier - 590 * SEC; hv <= frontier + SEC; hv += 7 * SEC + 12345) {
    int64_t a, b;
    assert_int_equal(tr_clocksync_map(est, hv, &a), 0);
    assert_int_equal(tr_clocksync_map(all, hv, &b), 0);
    assert_int_equal(a, b);
    assert_int_equal(tr_clocksync_error_bound(est, hv), tr_clocksync_error_bound(all, hv));
  }
  tr_clocksync_free(est);
  tr_clocksync_free(all);
}

static void test_outliers_and_path_change(void **state) {
  (void)state;
  const struct host h = {.offset = 1.0L * SEC, .drift = 50e-6L, .t0 = 1000.0L * SEC};
  struct link clean = {.base_ns = 40 * US, .turnaround_ns = 10 * US};
  struct tr_clocksync *est;
  assert_int_equal(tr_clocksync_init(&est, NULL), 0);
  rng_state = 3;
  int64_t t = (int64_t)h.t0;
  feed(est, &h, &clean, &t, 30);
  struct tr_clocksync_stats st;
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.outliers, 0);
  assert_true(fabs(tr_clocksync_drift_ppm(est) + 50.0 / (1 + 50e-6)) < 0.01);
  assert_true(fabsl((long double)frontier_value(est) - truth(&h, tr_clocksync_frontier(est))) < 50);

  /* one window of probes 20 ms slower (the third one opens the next window): rejected, the
   * estimate does not move */
  struct link late = clean;
  late.base_ns = 10 * MS;
  feed(est, &h, &late, &t, 3);
  feed(est, &h, &clean, &t, 2);
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.outliers, 1);
  assert_true(fabsl((long double)frontier_value(est) - truth(&h, tr_clocksync_frontier(est))) < 50);

  /* the path gets 2 ms longer for good: after 4 rejected windows the new baseline is taken */
  struct link longer = clean;
  longer.base_ns = 2 * MS;
  feed(est, &h, &longer, &t, 20);
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.outliers, 1 + 4);
  assert_true(tr_clocksync_rtt_ns(est) >= 4 * MS);
  feed(est, &h, &longer, &t, 20);
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.outliers, 1 + 4);
  assert_int_equal(st.conflicts, 0);
  tr_clocksync_free(est);
}

/* Answers whose send stamp did not come (t3_late) waited 300 ms in a saturated link's queue
 * after their t3: however many windows of them come, they are outliers, never a new path, and
 * the estimate stays on the clean probes (without the flag, 4 such windows restart the fit). */
static void test_late_probes_are_not_a_new_path(void **state) {
  (void)state;
  const struct host h = {.offset = -3.0L * SEC, .drift = -80e-6L, .t0 = 500.0L * SEC};
  struct link clean = {.base_ns = 40 * US, .turnaround_ns = 10 * US};
  struct tr_clocksync *est;
  assert_int_equal(tr_clocksync_init(&est, NULL), 0);
  rng_state = 11;
  int64_t t = (int64_t)h.t0;
  feed(est, &h, &clean, &t, 30);
  int64_t rtt = tr_clocksync_rtt_ns(est);
  struct tr_clocksync_stats st;
  tr_clocksync_get_stats(est, &st);
  uint64_t windows = st.windows;
  for (int i = 0; i < 20; i++, t += SEC) {
    struct tr_clocksync_probe p = probe_at(&h, &clean, t);
    p.t4 += 300 * MS;
    p.t3_late = true;
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
  }
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.late, 20);
  assert_true(st.windows - windows >= 6);
  assert_true(st.outliers >= st.windows - windows - 1); /* all but one that began clean */
  assert_int_equal(tr_clocksync_rtt_ns(est), rtt);
  feed(est, &h, &clean, &t, 4);
  assert_true(fabsl((long double)frontier_value(est) - truth(&h, tr_clocksync_frontier(est))) < 50);
  tr_clocksync_free(est);
}

/* Tiers: a regional R measures host H, the service measures R. Each of H's exchanges with R,
 * made one with the service through the service's estimate of R, must still bracket the truth
 * (H received after t1 and answered before t4, on the service's clock), also when R's last probe
 * is up to two seconds old; and the estimate it gives of H is within the two hops' bounds. */
static void test_relayed_exchange_is_valid(void **state) {
  (void)state;
  const struct host r = {.offset = 3600.0L * SEC, .drift = 50e-6L, .t0 = 100.0L * SEC};
  const struct host h = {.offset = -20.0L * SEC, .drift = -150e-6L, .t0 = 100.0L * SEC};
  struct link lan = {.base_ns = 30 * US, .jitter_mean_ns = 5 * US, .turnaround_ns = 10 * US};
  struct tr_clocksync *via, *host_est;
  assert_int_equal(tr_clocksync_init(&via, NULL), 0);
  assert_int_equal(tr_clocksync_init(&host_est, NULL), 0);
  rng_state = 5;
  int64_t t = (int64_t)r.t0;
  feed(via, &r, &lan, &t, 20);
  int checked = 0;
  for (int i = 0; i < 400; i++) {
    int64_t send = t + (i % 40 + 1) * 25 * MS; /* 1 to 2 s past R's last probe */
    double fwd = lan.base_ns + expo(lan.jitter_mean_ns), back = lan.base_ns + expo(lan.jitter_mean_ns);
    long double recv = (long double)send + fwd, answer = recv + lan.turnaround_ns;
    struct tr_clocksync_probe in = {.t1 = host_clock(&r, (long double)send),
                                    .t2 = host_clock(&h, recv), .t3 = host_clock(&h, answer),
                                    .t4 = host_clock(&r, answer + back) + 1};
    struct tr_clocksync_probe out;
    assert_int_equal(tr_clocksync_relay_exchange(via, &in, &out), 0);
    assert_true((long double)out.t1 <= recv);
    assert_true((long double)out.t4 >= answer);
    /* The widening itself: t1' and t4' bound the instants the regional read t1 and t4 at (the
     * regional's mapping alone is off either way, by up to its bound). */
    assert_true((long double)out.t1 <= truth(&r, in.t1) + 1);
    assert_true((long double)out.t4 >= truth(&r, in.t4) - 1);
    assert_int_equal(out.t2, in.t2);
    assert_int_equal(out.t3, in.t3);
    assert_int_equal(tr_clocksync_add_probe(host_est, &out), 0);
    if (i % 40 == 39) /* R is probed again now and then */
      feed(via, &r, &lan, &t, 1);
    int64_t m;
    assert_int_equal(tr_clocksync_map(host_est, in.t2, &m), 0);
    int64_t bound = tr_clocksync_error_bound(host_est, in.t2);
    assert_true(fabsl((long double)m - truth(&h, in.t2)) <= (long double)bound + 1);
    checked++;
  }
  assert_int_equal(checked, 400);
  struct tr_clocksync_probe none;
  struct tr_clocksync *empty;
  assert_int_equal(tr_clocksync_init(&empty, NULL), 0);
  assert_int_equal(tr_clocksync_relay_exchange(empty, PROBE(1, 2, 3, 4), &none), TR_ERR_STATE);
  tr_clocksync_free(empty);
  tr_clocksync_free(via);
  tr_clocksync_free(host_est);
}

static void test_slews_never_steps(void **state) {
  (void)state;
  /* The path becomes asymmetric (+300 us one way): the estimate moves by 150 us, while the truth
   * does not. The mapping must get there by slewing, at most slew_max_ppm beyond the drift. */
  const struct host h = {.offset = 5.0L * SEC, .drift = 0, .t0 = 1000.0L * SEC};
  struct link sym = {.base_ns = 200 * US, .turnaround_ns = 10 * US};
  struct tr_clocksync_config cfg;
  tr_clocksync_config_default(&cfg);
  cfg.fit_samples = 4;
  struct tr_clocksync *est;
  assert_int_equal(tr_clocksync_init(&est, &cfg), 0);
  rng_state = 5;
  int64_t t = (int64_t)h.t0;
  feed(est, &h, &sym, &t, 20);
  int64_t off0 = tr_clocksync_offset_ns(est);
  int64_t f0 = tr_clocksync_frontier(est), s0;
  tr_clocksync_map(est, f0, &s0);
  double max_slope = 0;
  for (int i = 0; i < 200; i++) {
    struct tr_clocksync_probe p = probe_at(&h, &sym, t);
    p.t4 += 300 * US; /* the return leg is 300 us slower */
    t += SEC / 10;
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
    int64_t f1 = tr_clocksync_frontier(est), s1;
    tr_clocksync_map(est, f1, &s1);
    double slope = (double)(s1 - s0) / (double)(f1 - f0);
    /* the slew bound is relative to the drift of the moment */
    assert_true(fabs(slope - 1 - tr_clocksync_drift_ppm(est) * 1e-6) <= 500e-6 + 1e-8);
    if (fabs(slope - 1) > max_slope)
      max_slope = fabs(slope - 1);
    f0 = f1;
    s0 = s1;
  }
  int64_t moved = tr_clocksync_offset_ns(est) - off0;
  assert_true(moved > 140 * US && moved < 160 * US);
  assert_true(max_slope >= 400e-6); /* it did slew, at the bound, and never stepped */
  int64_t s;
  tr_clocksync_map(est, f0, &s);
  assert_true(llabs(s - f0 - tr_clocksync_offset_ns(est)) < 2 * US); /* and caught up */
  tr_clocksync_free(est);
}

static void test_invalid_input(void **state) {
  (void)state;
  struct tr_clocksync *est;
  struct tr_clocksync_config cfg;
  tr_clocksync_config_default(&cfg);
  cfg.fit_samples = 0;
  assert_int_equal(tr_clocksync_init(&est, &cfg), TR_ERR_INVAL);
  cfg.fit_samples = 1000;
  assert_int_equal(tr_clocksync_init(&est, &cfg), TR_ERR_INVAL);
  tr_clocksync_config_default(&cfg);
  cfg.slew_max_ppm = 0;
  assert_int_equal(tr_clocksync_init(&est, &cfg), TR_ERR_INVAL);

  assert_int_equal(tr_clocksync_init(&est, NULL), 0);
  int64_t v;
  assert_int_equal(tr_clocksync_map(est, 5, &v), TR_ERR_STATE);
  assert_int_equal(tr_clocksync_error_bound(est, 5), TR_ERR_STATE);
  assert_int_equal(tr_clocksync_frontier(est), TR_ERR_STATE);
  assert_int_equal(tr_clocksync_offset_ns(est), 0);
  struct tr_clocksync_breakpoint bp[4];
  assert_int_equal(tr_clocksync_export(est, 0, 10, 10, bp, 4), TR_ERR_STATE);
  assert_int_equal(tr_clocksync_add_probe(est, PROBE(100, 50, 40, 200)), TR_ERR_INVAL); /* t3 < t2 */
  assert_int_equal(tr_clocksync_add_probe(est, PROBE(100, 50, 60, 90)), TR_ERR_INVAL);  /* t4 < t1 */
  assert_int_equal(tr_clocksync_add_probe(est, PROBE(-1, 50, 60, 90)), TR_ERR_INVAL);
  assert_int_equal(tr_clocksync_add_probe(est, PROBE(1, 50, 60, INT64_MAX)), TR_ERR_INVAL);
  assert_int_equal(tr_clocksync_map(est, 5, &v), TR_ERR_STATE); /* nothing was taken */

  assert_int_equal(tr_clocksync_add_probe(est, PROBE(1000, 5000, 5010, 1100)), 0);
  assert_int_equal(tr_clocksync_map(est, 5010, &v), 0);
  assert_true(v <= 1100 && v >= 1000 + 10);
  assert_int_equal(tr_clocksync_add_probe(est, PROBE(2000, 5005, 5010, 2100)), TR_ERR_INVAL); /* not after */
  struct tr_clocksync_stats st;
  tr_clocksync_get_stats(est, &st);
  assert_int_equal(st.probes, 1);
  tr_clocksync_free(est);
  tr_clocksync_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accuracy),
      cmocka_unit_test(test_export_reproduces_mapping),
      cmocka_unit_test(test_memory_follows_retention),
      cmocka_unit_test(test_outliers_and_path_change),
      cmocka_unit_test(test_late_probes_are_not_a_new_path),
      cmocka_unit_test(test_relayed_exchange_is_valid),
      cmocka_unit_test(test_slews_never_steps),
      cmocka_unit_test(test_invalid_input),
      cmocka_unit_test(test_export_steps_back_bounded),
      cmocka_unit_test(test_steps_skip_gradual_fall),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
