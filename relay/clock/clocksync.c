/* clocksync.c: the per-host clock estimator (window-best probes, weighted line fit) and the
 * slewed, causality-clamped piecewise-linear mapping built from it. See clocksync.h for the
 * contract, the error bound and the remote_clock_sync encoding.
 *
 * Numbers: timestamps are int64 ns below 2^62. Offsets between hosts can be months, more than a
 * double holds to the ns, so the fit works on values relative to the newest sample (base_off,
 * h_ref) and only those small residues are doubles. The mapping itself is integers: knots, and
 * 128-bit products between them, with floor division so it stays monotonic. */
#include "relay/clock/clocksync.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

#define TS_LIMIT ((int64_t)1 << 62)
#define MAX_REJECTS_IN_ROW 4
#define MAX_FIT 256 /* bounds fit_samples, so the fit's scratch lives on the stack */
/* The newest exchange-period bests the fit reads before the window bests: dense samples make
 * the drift right within seconds of a start, where 2 s windows would give only a few. */
#define EX_FIT 128
/* A round trip this far below zero cannot be: one of the four stamps is wrong (seen behind a
 * saturated link: an answer's send stamp a TCP segment late). Such a probe is refused. */
#define IMPOSSIBLE_RTT_NS 2000

struct sample { /* the best probe of one window */
  struct tr_clocksync_probe p;
  int64_t h;      /* host midpoint (t2+t3)/2 */
  int64_t theta2; /* twice the offset: (t1-t2) + (t4-t3) */
  int64_t rtt;
  bool outlier;
};

struct knot {
  int64_t h, s;
  int64_t bound; /* error bound at h, from the fit when the knot was placed */
};

struct fit { /* offset(h) = base_off + a + drift*(h - h_ref) */
  bool valid;
  bool drift_fitted; /* from >= 2 samples, else the previous drift */
  int64_t h_ref, base_off;
  double a, drift;
  double hbar;     /* weighted mean host time, relative to h_ref */
  double half_rtt; /* weighted mean rtt/2 */
  double drift_err;
  int64_t rtt_min;
};

/* A ring that grows by doubling up to max elements, oldest at start; at max, a new element
 * replaces the oldest. Memory follows what is kept, not the bound. */
struct ring {
  unsigned char *a;
  size_t size; /* of one element */
  uint32_t start, n, cap, max;
};

#define RING_FIRST_CAP 64

static void *ring_at(const struct ring *r, uint32_t i) {
  return r->a + (size_t)((r->start + i) % r->cap) * r->size;
}

static void ring_drop_oldest(struct ring *r) {
  r->start = (r->start + 1) % r->cap;
  r->n--;
}

/* The slot for a new newest element. When growing fails, the oldest makes room. */
static void *ring_push(struct ring *r) {
  if (r->n == r->cap && r->cap < r->max) {
    uint32_t cap = r->cap * 2 < r->max ? r->cap * 2 : r->max;
    unsigned char *a = malloc((size_t)cap * r->size);
    if (a) {
      for (uint32_t i = 0; i < r->n; i++)
        memcpy(a + (size_t)i * r->size, ring_at(r, i), r->size);
      free(r->a);
      r->a = a;
      r->start = 0;
      r->cap = cap;
    }
  }
  if (r->n == r->cap)
    ring_drop_oldest(r);
  return ring_at(r, r->n++);
}

static int ring_init(struct ring *r, size_t size, uint32_t max) {
  *r = (struct ring){.size = size, .max = max, .cap = max < RING_FIRST_CAP ? max : RING_FIRST_CAP};
  r->a = malloc((size_t)r->cap * size);
  return r->a ? 0 : TR_ERR_NOMEM;
}

/* Drops the samples of a ring older than cutoff (host time). */
static void drop_older(struct ring *r, int64_t cutoff) {
  while (r->n > 0 && ((const struct sample *)ring_at(r, 0))->h < cutoff)
    ring_drop_oldest(r);
}

struct tr_clocksync {
  struct tr_clocksync_config cfg;
  struct ring hist; /* window bests (struct sample) */
  bool window_open;
  int64_t window_start;
  struct sample window_best;
  struct ring ex; /* exchange-period bests (struct sample) */
  bool ex_open;
  int64_t ex_period_start;
  struct sample ex_best;
  struct ring knots; /* struct knot */
  struct fit fit;
  int64_t fit_after; /* the path changed here: older samples describe another path */
  uint32_t rejected_in_row;
  struct tr_clocksync_stats stats;
};

void tr_clocksync_config_default(struct tr_clocksync_config *cfg) {
  cfg->window_ns = 2000000000;
  cfg->fit_samples = 64;
  cfg->fit_span_ns = 300000000000;
  cfg->outlier_slack_ns = 200000;
  cfg->rtt_noise_ns = 2000;
  cfg->slew_max_ppm = 500;
  cfg->max_drift_ppm = 1000;
  cfg->max_knots = 65536;
  cfg->history = 4096;
  cfg->exchange_period_ns = 5000000;
  cfg->exchanges = 8192;
  cfg->retain_ns = 600000000000;
}

int tr_clocksync_init(struct tr_clocksync **out, const struct tr_clocksync_config *cfg) {
  struct tr_clocksync_config c;
  if (cfg)
    c = *cfg;
  else
    tr_clocksync_config_default(&c);
  if (c.window_ns <= 0 || c.fit_samples == 0 || c.fit_span_ns <= 0 || c.outlier_slack_ns < 0 ||
      c.fit_samples > MAX_FIT || c.rtt_noise_ns <= 0 || !(c.slew_max_ppm > 0 && c.slew_max_ppm < 1e5) ||
      !(c.max_drift_ppm > 0 && c.max_drift_ppm < 1e5) || c.max_knots < 2 || c.history == 0 ||
      c.exchange_period_ns <= 0 || c.exchanges == 0 ||
      c.retain_ns < c.fit_span_ns)
    return TR_ERR_INVAL;
  struct tr_clocksync *est = calloc(1, sizeof(*est));
  if (!est)
    goto fail;
  est->cfg = c;
  if (ring_init(&est->hist, sizeof(struct sample), c.history) != 0 ||
      ring_init(&est->knots, sizeof(struct knot), c.max_knots) != 0 ||
      ring_init(&est->ex, sizeof(struct sample), c.exchanges) != 0) {
    tr_clocksync_free(est);
    goto fail;
  }
  *out = est;
  return 0;
fail:
  return TR_ERR_NOMEM;
}

void tr_clocksync_free(struct tr_clocksync *est) {
  if (!est)
    return;
  free(est->ex.a);
  free(est->knots.a);
  free(est->hist.a);
  free(est);
}

size_t tr_clocksync_memory_bytes(const struct tr_clocksync *est) {
  return sizeof *est + (size_t)est->hist.cap * est->hist.size +
         (size_t)est->knots.cap * est->knots.size + (size_t)est->ex.cap * est->ex.size;
}

static const struct sample *hist_at(const struct tr_clocksync *est, uint32_t i) {
  return ring_at(&est->hist, i);
}

static const struct sample *ex_at(const struct tr_clocksync *est, uint32_t i) {
  return ring_at(&est->ex, i);
}

static const struct knot *knot_at(const struct tr_clocksync *est, uint32_t i) {
  return ring_at(&est->knots, i);
}

static int64_t floor_div(__int128 a, __int128 b) { /* b > 0 */
  __int128 q = a / b;
  if (a % b < 0)
    q -= 1;
  return (int64_t)q;
}

static int64_t ceil_div(__int128 a, __int128 b) { /* b > 0 */
  return -floor_div(-a, b);
}

/* ---- the estimate ---- */

/* The kept samples the fit uses, newest first: non-outliers younger than fit_span_ns before
 * `newest` and not before the last path change, at most fit_samples of them. Returns how many
 * were stored in idx. */
static uint32_t fit_set(const struct tr_clocksync *est, int64_t newest, uint32_t *idx) {
  uint32_t n = 0;
  for (uint32_t i = est->hist.n; i-- > 0 && n < est->cfg.fit_samples;) {
    const struct sample *s = hist_at(est, i);
    if (newest - s->h > est->cfg.fit_span_ns || s->h < est->fit_after)
      break;
    if (!s->outlier)
      idx[n++] = i;
  }
  return n;
}

static int64_t set_rtt_min(const struct tr_clocksync *est, const uint32_t *idx, uint32_t n) {
  int64_t m = INT64_MAX;
  for (uint32_t i = 0; i < n; i++)
    if (hist_at(est, idx[i])->rtt < m)
      m = hist_at(est, idx[i])->rtt;
  return m;
}

static bool plausible(const struct tr_clocksync *est, const struct sample *s, int64_t rtt_floor) {
  return rtt_floor == INT64_MAX || s->rtt <= 2 * rtt_floor + est->cfg.outlier_slack_ns;
}

/* Weighted least squares of offset against host time, from `newest` back, over `extra` (the
 * open exchange period's best, when plausible), the last EX_FIT closed exchange-period bests
 * (non-outliers, within the fit span, after the last path change and not before the oldest
 * window best of a full fit set), then the fit set's window bests older than those. Keeps the previous drift when the samples cannot give one. */
static void refit(struct tr_clocksync *est, int64_t newest, const struct sample *extra) {
  const struct sample *set[1 + EX_FIT + MAX_FIT];
  uint32_t m = 0;
  if (extra)
    set[m++] = extra;
  uint32_t idx[MAX_FIT];
  uint32_t n = est->hist.n ? fit_set(est, newest, idx) : 0;
  /* No further back than the window bests reach once fit_samples of them are in use. */
  int64_t h_old = n == est->cfg.fit_samples ? hist_at(est, idx[n - 1])->h : INT64_MIN;
  int64_t h_cut = INT64_MAX;
  for (uint32_t i = est->ex.n, k = 0; i-- > 0 && k < EX_FIT; k++) {
    const struct sample *s = ex_at(est, i);
    if (newest - s->h > est->cfg.fit_span_ns || s->h < est->fit_after || s->h < h_old)
      break;
    h_cut = s->h;
    if (!s->outlier)
      set[m++] = s;
  }
  for (uint32_t i = 0; i < n; i++)
    if (hist_at(est, idx[i])->h < h_cut)
      set[m++] = hist_at(est, idx[i]);
  if (m == 0)
    return;

  struct fit f = {.valid = true, .h_ref = set[0]->h, .base_off = set[0]->theta2 / 2};
  f.rtt_min = INT64_MAX;
  for (uint32_t i = 0; i < m; i++)
    if (set[i]->rtt < f.rtt_min)
      f.rtt_min = set[i]->rtt;
  double w_sum = 0, w2_sum = 0, x_sum = 0, y_sum = 0, r_sum = 0, x_min = 0, x_max = 0;
  double w[1 + EX_FIT + MAX_FIT], x[1 + EX_FIT + MAX_FIT], y[1 + EX_FIT + MAX_FIT];
  for (uint32_t i = 0; i < m; i++) {
    double d = (double)(set[i]->rtt - f.rtt_min + est->cfg.rtt_noise_ns);
    w[i] = 1.0 / (d * d);
    x[i] = (double)(set[i]->h - f.h_ref);
    y[i] = (double)(set[i]->theta2 - 2 * f.base_off) / 2.0;
    w_sum += w[i];
    w2_sum += w[i] * w[i];
    x_sum += w[i] * x[i];
    y_sum += w[i] * y[i];
    r_sum += w[i] * (double)set[i]->rtt;
    x_min = fmin(x_min, x[i]);
    x_max = fmax(x_max, x[i]);
  }
  double xbar = x_sum / w_sum, ybar = y_sum / w_sum;
  double sxx = 0, sxy = 0;
  for (uint32_t i = 0; i < m; i++) {
    sxx += w[i] * (x[i] - xbar) * (x[i] - xbar);
    sxy += w[i] * (x[i] - xbar) * (y[i] - ybar);
  }
  sxx /= w_sum;
  sxy /= w_sum;
  double max_drift = est->cfg.max_drift_ppm * 1e-6;
  double span = x_max - x_min;
  f.half_rtt = r_sum / w_sum / 2.0;
  f.hbar = xbar;
  if (m >= 2 && span > 0 && sxx > 0) {
    f.drift = fmax(-max_drift, fmin(max_drift, sxy / sxx));
    f.drift_fitted = true;
  } else {
    f.drift = est->fit.valid ? est->fit.drift : 0.0;
  }
  f.a = ybar - f.drift * xbar;
  if (f.drift_fitted) {
    double res = 0;
    for (uint32_t i = 0; i < m; i++) {
      double r = y[i] - f.a - f.drift * x[i];
      res += w[i] * r * r;
    }
    double n_eff = w_sum * w_sum / w2_sum;
    double se = sqrt(res / w_sum / (sxx * fmax(n_eff - 2.0, 1.0)));
    /* The most the slope can be off if every sample is off by up to its rtt/2 (what an
     * exchange guarantees whatever the path's asymmetry): sum w |x - xbar| rtt/2 / sxx. Noise
     * alone (3 standard errors) can say less when the errors are systematic, as behind a
     * saturated link, where a bound that rests on it was exceeded by up to 10%. */
    double worst = 0;
    for (uint32_t i = 0; i < m; i++)
      worst += w[i] * fabs(x[i] - xbar) * (double)set[i]->rtt / 2.0;
    worst = worst / w_sum / sxx;
    f.drift_err = fmax(fmax(3.0 * se, worst), 2.0 * f.half_rtt / span);
  } else {
    f.drift_err = max_drift;
  }
  est->fit = f;
}

/* The estimated offset at h, as an integer base plus a small double residue. */
static double est_residue(const struct fit *f, int64_t h) {
  return f->a + f->drift * (double)(h - f->h_ref);
}

static int64_t est_service(const struct fit *f, int64_t h) {
  return h + f->base_off + llround(est_residue(f, h));
}

static void close_window(struct tr_clocksync *est) {
  struct sample s = est->window_best;
  uint32_t idx[MAX_FIT];
  uint32_t n = fit_set(est, s.h, idx);
  int64_t floor = set_rtt_min(est, idx, n);
  bool ok = plausible(est, &s, floor);
  if (!ok && (est->rejected_in_row < MAX_REJECTS_IN_ROW || s.p.t3_late)) {
    s.outlier = true;
    if (!s.p.t3_late)
      est->rejected_in_row++;
    est->stats.outliers++;
  } else {
    if (!ok) /* a new path: its samples would all be rejected against the old floor */
      est->fit_after = s.h;
    est->rejected_in_row = 0;
  }
  drop_older(&est->hist, s.h - est->cfg.retain_ns);
  *(struct sample *)ring_push(&est->hist) = s;
  est->stats.windows++;
  est->window_open = false;
}

/* Keeps the best of the exchange period that ends, flagged as an outlier against the fit's
 * smallest rtt as a window best would be (without the path-change rule: that is the fit's). */
static void close_exchange(struct tr_clocksync *est) {
  struct sample s = est->ex_best;
  int64_t floor = est->fit.valid ? est->fit.rtt_min : INT64_MAX;
  s.outlier = !plausible(est, &s, floor);
  drop_older(&est->ex, s.h - est->cfg.retain_ns);
  *(struct sample *)ring_push(&est->ex) = s;
  est->ex_open = false;
}

/* ---- the mapping ---- */

/* Index of the last knot at or below h, or -1 if h is before the first. O(log knots). */
static int64_t knot_find(const struct tr_clocksync *est, int64_t h) {
  int64_t lo = 0, hi = (int64_t)est->knots.n - 1, found = -1;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (knot_at(est, (uint32_t)mid)->h <= h) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

static int64_t map_at(const struct tr_clocksync *est, int64_t h) {
  int64_t i = knot_find(est, h);
  if (i < 0) {
    const struct knot *k0 = knot_at(est, 0);
    return k0->s - (k0->h - h);
  }
  const struct knot *k = knot_at(est, (uint32_t)i);
  int64_t d = h - k->h;
  if (i == (int64_t)est->knots.n - 1)
    return k->s + d + (int64_t)floor((double)d * est->fit.drift);
  const struct knot *n = knot_at(est, (uint32_t)i + 1);
  return k->s + floor_div((__int128)d * (n->s - k->s), n->h - k->h);
}

/* bound(h) of clocksync.h with the current fit, for a mapped value s = M(h). */
static int64_t fit_bound(const struct fit *f, int64_t h, int64_t s) {
  double lag = (double)(s - h - f->base_off) - est_residue(f, h);
  double from_hbar = fabs((double)(h - f->h_ref) - f->hbar);
  double bound = ceil(f->half_rtt + f->drift_err * from_hbar + fabs(lag)) + 1;
  /* Far from the samples (a host time an agent made up) the bound can pass what an int64
   * holds: it saturates, never wraps negative (fuzz_clock_frames found the overflow). */
  return bound < 0x1p62 ? (int64_t)bound : INT64_C(1) << 62;
}

static void push_knot(struct tr_clocksync *est, int64_t h, int64_t s) {
  /* The oldest knot stays until a newer one is past the horizon too: M keeps its shape there. */
  while (est->knots.n > 1 && knot_at(est, 1)->h < h - est->cfg.retain_ns)
    ring_drop_oldest(&est->knots);
  *(struct knot *)ring_push(&est->knots) = (struct knot){h, s, fit_bound(&est->fit, h, s)};
}

/* The knot of probe p at t3: toward the estimate within the slew bound, then into the causality
 * corridor, then strictly after the previous knot. */
static void place_knot(struct tr_clocksync *est, const struct tr_clocksync_probe *p) {
  int64_t target = est_service(&est->fit, p->t3);
  if (est->knots.n == 0) { /* before the first knot M has slope 1 */
    int64_t lower = p->t1 + (p->t3 - p->t2);
    int64_t s = target < lower ? lower : target;
    push_knot(est, p->t3, s > p->t4 ? p->t4 : s);
    return;
  }
  const struct knot prev = *knot_at(est, est->knots.n - 1);
  int64_t span = p->t3 - prev.h;
  double slew = est->cfg.slew_max_ppm * 1e-6;
  int64_t slew_lo = prev.s + span + (int64_t)floor((double)span * (est->fit.drift - slew));
  int64_t slew_hi = prev.s + span + (int64_t)ceil((double)span * (est->fit.drift + slew));
  int64_t s = target < slew_lo ? slew_lo : target > slew_hi ? slew_hi : target;

  /* M(t2) on the chord prev -> (t3, s) must reach t1. */
  int64_t lower = INT64_MIN;
  if (p->t2 > prev.h && p->t1 > prev.s)
    lower = prev.s + ceil_div((__int128)(p->t1 - prev.s) * span, p->t2 - prev.h);
  if (s < lower)
    s = lower;
  if (s > p->t4)
    s = p->t4;
  int64_t mono = prev.s + (span + 1) / 2;
  if (s < mono)
    s = mono;
  bool early_ok = p->t2 > prev.h || map_at(est, p->t2) >= p->t1;
  if (s < lower || s > p->t4 || !early_ok)
    est->stats.conflicts++;
  push_knot(est, p->t3, s);
}

/* The round trip of a probe whose answer left `hold` ns of host time after the probe came in:
 * the hold converted to service time with the fitted drift, plus what the drift's uncertainty
 * could hide in it (max_drift_ppm before a fit). On an idle link the hold is microseconds and
 * this is the plain NTP difference; behind a saturated link's queue it is up to seconds, and a
 * host clock 200 ppm fast would otherwise make a 1 s hold look 200 us longer than it was and the
 * round trip negative. Never below 0. */
static int64_t rtt_of(const struct tr_clocksync *est, int64_t service_span, int64_t hold) {
  double drift = est->fit.valid ? est->fit.drift : 0.0;
  double drift_err = est->fit.valid ? est->fit.drift_err : est->cfg.max_drift_ppm * 1e-6;
  double rtt = (double)service_span - (double)hold * (1.0 + drift) + (double)hold * drift_err;
  if (rtt < -(double)IMPOSSIBLE_RTT_NS)
    return -1;
  return rtt > 0 ? (int64_t)ceil(rtt) : 0;
}

int tr_clocksync_add_probe(struct tr_clocksync *est, const struct tr_clocksync_probe *p) {
  int64_t t1 = p->t1, t2 = p->t2, t3 = p->t3, t4 = p->t4;
  if (t1 < 0 || t2 < 0 || t3 < 0 || t4 < 0 || t1 >= TS_LIMIT || t2 >= TS_LIMIT ||
      t3 >= TS_LIMIT || t4 >= TS_LIMIT || t4 < t1 || t3 < t2)
    return TR_ERR_INVAL;
  if (est->knots.n > 0 && t3 <= knot_at(est, est->knots.n - 1)->h)
    return TR_ERR_INVAL;
  struct sample s = {.p = *p, .h = t2 + (t3 - t2) / 2};
  s.theta2 = (t1 - t2) + (t4 - t3);
  s.rtt = rtt_of(est, t4 - t1, t3 - t2);
  if (s.rtt < 0) {
    est->stats.impossible++;
    return TR_ERR_INVAL;
  }

  if (est->window_open && s.h - est->window_start >= est->cfg.window_ns)
    close_window(est);
  if (!est->window_open) {
    est->window_open = true;
    est->window_start = s.h;
    est->window_best = s;
  } else if (s.rtt < est->window_best.rtt) {
    est->window_best = s;
  }
  est->stats.probes++;
  est->stats.late += p->t3_late;

  if (est->ex_open && s.h - est->ex_period_start >= est->cfg.exchange_period_ns)
    close_exchange(est);
  if (!est->ex_open) {
    est->ex_open = true;
    est->ex_period_start = s.h;
    est->ex_best = s;
  } else if (s.rtt < est->ex_best.rtt) {
    est->ex_best = s;
  }

  uint32_t idx[MAX_FIT];
  uint32_t n = est->hist.n ? fit_set(est, est->ex_best.h, idx) : 0;
  bool use_open = n == 0 || plausible(est, &est->ex_best, set_rtt_min(est, idx, n));
  refit(est, est->ex_best.h, use_open ? &est->ex_best : NULL);
  place_knot(est, &s.p);
  return 0;
}

int tr_clocksync_map(const struct tr_clocksync *est, int64_t host_ts, int64_t *service_ts) {
  if (est->knots.n == 0)
    return TR_ERR_STATE;
  *service_ts = map_at(est, host_ts);
  return 0;
}

int64_t tr_clocksync_error_bound(const struct tr_clocksync *est, int64_t host_ts) {
  if (est->knots.n == 0)
    return TR_ERR_STATE;
  int64_t i = knot_find(est, host_ts);
  if (i < 0 || i == (int64_t)est->knots.n - 1)
    return fit_bound(&est->fit, host_ts, map_at(est, host_ts));
  /* Between knots M is linear and so is a linear truth: the error is linear too, and bounded
   * by the interpolation of the bounds at both ends. */
  const struct knot *k = knot_at(est, (uint32_t)i), *n = knot_at(est, (uint32_t)i + 1);
  return k->bound + ceil_div((__int128)(n->bound - k->bound) * (host_ts - k->h), n->h - k->h);
}

int64_t tr_clocksync_knot_bound_max(const struct tr_clocksync *est, int64_t from, int64_t to) {
  int64_t worst = -1;
  for (uint32_t k = (uint32_t)(knot_find(est, from) + 1); k < est->knots.n; k++) {
    const struct knot *kn = knot_at(est, k);
    if (kn->h >= to)
      break;
    if (kn->h > from && kn->bound > worst)
      worst = kn->bound;
  }
  return worst;
}

int64_t tr_clocksync_frontier(const struct tr_clocksync *est) {
  if (est->knots.n == 0)
    return TR_ERR_STATE;
  return knot_at(est, est->knots.n - 1)->h;
}

int64_t tr_clocksync_offset_ns(const struct tr_clocksync *est) {
  return est->fit.valid ? est->fit.base_off + llround(est->fit.a) : 0;
}

double tr_clocksync_drift_ppm(const struct tr_clocksync *est) {
  return est->fit.valid ? est->fit.drift * 1e6 : 0.0;
}

int64_t tr_clocksync_rtt_ns(const struct tr_clocksync *est) {
  return est->fit.valid ? est->fit.rtt_min : 0;
}

void tr_clocksync_get_stats(const struct tr_clocksync *est, struct tr_clocksync_stats *out) {
  *out = est->stats;
}

/* ---- export ---- */

/* Slope of M minus 1 on the segment that starts at knot i (-1: before the first knot). */
static double segment_drift(const struct tr_clocksync *est, int64_t i) {
  if (i < 0)
    return 0.0;
  if (i == (int64_t)est->knots.n - 1)
    return est->fit.drift;
  const struct knot *k = knot_at(est, (uint32_t)i), *n = knot_at(est, (uint32_t)i + 1);
  return (double)((n->s - k->s) - (n->h - k->h)) / (double)(n->h - k->h);
}

int tr_clocksync_export(const struct tr_clocksync *est, int64_t host_from, int64_t host_to,
                        int64_t tolerance_ns, struct tr_clocksync_breakpoint *out, size_t cap) {
  return tr_clocksync_export_steps(est, host_from, host_to, tolerance_ns, tolerance_ns, out, cap);
}

int tr_clocksync_export_steps(const struct tr_clocksync *est, int64_t host_from,
                              int64_t host_to, int64_t tolerance_ns, int64_t step_ns,
                              struct tr_clocksync_breakpoint *out, size_t cap) {
  if (est->knots.n == 0)
    return TR_ERR_STATE;
  if (host_from < 0 || host_to >= TS_LIMIT || host_to < host_from || tolerance_ns < 1 ||
      step_ns < 1 || step_ns > tolerance_ns)
    return TR_ERR_INVAL;
  size_t n = 0;
  int64_t h = host_from;
  while (h <= host_to) {
    int64_t i = knot_find(est, h);
    int64_t seg_end = i + 1 < (int64_t)est->knots.n ? knot_at(est, (uint32_t)(i + 1))->h : INT64_MAX;
    /* A slope below 1 makes trace_processor's offset step back at the next breakpoint; M's
     * values are whole ns, so two of them L apart differ by less than slope x L + 1: spaced
     * for step_ns - 1, the step back stays within step_ns (tr_clocksync_steps_next takes a
     * larger one for a re-plan and bisects to it). */
    double slope_off = segment_drift(est, i), drift = fabs(slope_off);
    double limit = (double)(slope_off < 0 ? step_ns - 1 : tolerance_ns);
    int64_t step = host_to - h + 1;
    if (drift * (double)step > limit)
      step = (int64_t)fmax(1.0, floor(limit / drift));
    int64_t next = seg_end - h < step ? seg_end : h + step;
    int64_t s = map_at(est, h);
    if (n == 0 || s > out[n - 1].service_ts) {
      if (n == cap)
        return TR_ERR_FULL;
      out[n++] = (struct tr_clocksync_breakpoint){h, s};
    }
    h = next;
  }
  return (int)n;
}

/* ---- remote_clock_sync ---- */

void tr_clocksync_pair_from_breakpoint(const struct tr_clocksync_breakpoint *bp,
                                       struct tr_clocksync_sync_pair *out) {
  *out = (struct tr_clocksync_sync_pair){.ping_remote = bp->host_ts - 3,
                                         .ping_service = bp->service_ts - 2,
                                         .update_remote = bp->host_ts - 1,
                                         .update_service = bp->service_ts};
}

/* Catch-up points come every CATCH_UP_SPACING x step_ns of host time, each step_ns below the
 * last: over any stretch of host time L the offset falls by at most step_ns x (L / that + 1),
 * so two events more than 4/3 step_ns apart keep their order, and a deficit D is made up within
 * D / step_ns points. */
#define CATCH_UP_SPACING 4

/* The last host time in [lo, hi) where M's offset is still at least `least`, given that it is
 * at lo and is not at hi: M's own point there (its offset need not be monotonic, but the ends
 * bracket a crossing). */
static int64_t last_at_least(const struct tr_clocksync *est, int64_t lo, int64_t hi,
                             int64_t least) {
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (map_at(est, mid) - mid >= least)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

int tr_clocksync_steps_next(struct tr_clocksync_steps *st, const struct tr_clocksync *est,
                            const struct tr_clocksync_breakpoint *bp, int64_t floor,
                            struct tr_clocksync_breakpoint *out) {
  int64_t step = st->step_ns > 0 ? st->step_ns : 1;
  if (est->knots.n == 0 || bp->host_ts <= floor || (st->any && bp->host_ts <= st->last.host_ts))
    return 0;
  struct tr_clocksync_breakpoint pt = *bp;
  if (st->any) {
    int64_t from = st->last.service_ts - st->last.host_ts, least = from - step;
    if (bp->service_ts - bp->host_ts < least) { /* more than a step below the last point */
      int64_t h = st->last.host_ts + CATCH_UP_SPACING * step, m;
      h = h > floor ? h : floor + 1;
      if (h >= bp->host_ts) {
        pt = (struct tr_clocksync_breakpoint){bp->host_ts, bp->host_ts + least};
      } else if ((m = map_at(est, h)) - h < least) {
        pt = (struct tr_clocksync_breakpoint){h, h + least}; /* M lies further below: catch up */
      } else {
        /* M is within a step here and falls to bp further on (bp left a point out: a pass's
         * floor, a rounding, a re-plan): M's own point where it is last within the step.
         * Walking M every CATCH_UP_SPACING steps instead wrote 2,500 points a second for a
         * host drifting 1 ppm. */
        h = last_at_least(est, h, bp->host_ts, least);
        pt = (struct tr_clocksync_breakpoint){h, map_at(est, h)};
      }
      if (pt.service_ts > map_at(est, pt.host_ts))
        st->above++;
    }
    /* 3 ns apart on both clocks: a remote_clock_sync pair (tr_clocksync_pair_from_breakpoint)
     * must come strictly after the previous one. */
    if (pt.host_ts - st->last.host_ts < 3 || pt.service_ts - st->last.service_ts < 3)
      return 0; /* only bp itself can be that close (catch-up points are 3 x step apart) */
  }
  st->any = true;
  st->last = pt;
  *out = pt;
  return 1;
}

int tr_clocksync_relay_exchange(const struct tr_clocksync *via, const struct tr_clocksync_probe *in,
                                struct tr_clocksync_probe *out) {
  int64_t s1, s4;
  if (tr_clocksync_map(via, in->t1, &s1) < 0 || tr_clocksync_map(via, in->t4, &s4) < 0)
    return TR_ERR_STATE;
  int64_t b1 = tr_clocksync_error_bound(via, in->t1), b4 = tr_clocksync_error_bound(via, in->t4);
  if (b1 < 0 || b4 < 0)
    return TR_ERR_STATE;
  *out = *in;
  out->t1 = s1 - b1;
  out->t4 = s4 + b4;
  return 0;
}

int64_t tr_clocksync_knot_gap(const struct tr_clocksync *est, int64_t host_ts) {
  if (est->knots.n < 2)
    return 0;
  int64_t i = knot_find(est, host_ts);
  if (i < 0)
    i = 0;
  if (i > (int64_t)est->knots.n - 2)
    i = (int64_t)est->knots.n - 2;
  return knot_at(est, (uint32_t)i + 1)->h - knot_at(est, (uint32_t)i)->h;
}
