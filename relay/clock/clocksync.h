/* clocksync.h: the clock estimator of one remote host: from NTP-style probes on the relay link it
 * builds the mapping host BOOTTIME -> service BOOTTIME that puts the host on the trace timeline.
 *
 * Input, per probe: t1 service send, t2 agent receive, t3 agent send, t4 service receive (t1/t4
 * on the service's BOOTTIME, t2/t3 on the host's), all in ns. Add probes in the order they were
 * taken and keep one probe in flight at a time (t2 of a probe after t3 of the previous one).
 *
 * Estimate. Each probe gives a sample at host time h = (t2+t3)/2: offset
 * theta = ((t1-t2) + (t4-t3))/2 (service minus host) and rtt = (t4-t1) - (t3-t2)*(1+drift)
 * + (t3-t2)*D, at least 0 (the hold t3-t2 in service time by the current fit's drift, and what
 * its uncertainty D could hide: a hold of a second behind a saturated link's queue, on a clock
 * 200 ppm fast, would otherwise shorten the rtt by 200 us; before a fit, drift 0 and D =
 * max_drift_ppm). Probes are
 * grouped into windows of window_ns of host time and only the minimum-RTT probe of each window
 * is kept. A window's best is rejected as an outlier when its rtt exceeds 2 * (the smallest rtt
 * among the kept samples) + outlier_slack_ns, unless the last 4 windows were all rejected:
 * then the path changed, the window is kept and the fit restarts from it. A best with t3_late
 * never counts toward those 4 (a queue behind a saturated link is not a new path). Offset and drift come
 * from a weighted least-squares line over the best of the open exchange period, the last 128
 * exchange-period bests (below), then the window bests older than those (at most fit_samples),
 * all non-outliers younger than fit_span_ns, weight 1/(rtt - rtt_min + rtt_noise_ns)^2, so
 * the samples with the least queueing dominate. Drift is clamped to +-max_drift_ppm.
 *
 * Mapping M. Piecewise linear, with one knot per probe at host time t3:
 * - the knot's value heads for the estimate, but the slope of the segment from the previous knot
 *   stays within 1 + drift +- slew_max_ppm: M slews toward a new estimate, it never steps;
 * - then it is clamped into the probe's causality corridor: M(t2) >= t1 and M(t3) <= t4;
 * - then it is kept strictly increasing (slope >= 1/2); if that ever conflicts with causality
 *   (inconsistent probes only), order wins and stats.conflicts counts it.
 * Beyond the last knot M continues with slope 1 + drift; before the first, with slope 1.
 * Guarantees: M is continuous and non-decreasing (strictly increasing wherever its slope is >= 1,
 * i.e. for all but 1-ns neighbours under negative drift), so one host's events keep their order
 * on the trace timeline; M at host times up to the frontier (the last knot) never changes
 * afterwards, later probes only re-plan what lies beyond it; no probe added so far has its
 * corridor violated. All three hold for the host times covered by the retained knots (the
 * last retain_ns, and at most max_knots of them: 55 min at 20 probes a second; export
 * breakpoints before then).
 *
 * Error bound (tr_clocksync_error_bound). Each knot stores, when it is placed,
 *     bound(h) = R/2 + D * |h - hbar| + |M(h) - E(h)| + 1 ns
 * at its host time; between two knots the bound is the linear interpolation of theirs (M is
 * linear there, and so is the error against a linear truth); before the first knot and beyond
 * the frontier it is bound(h) with the current fit. The terms:
 * R/2: the fit-weighted mean of rtt/2 over the fit samples (the true offset at a sample lies
 * within +-rtt/2 of theta whatever the path asymmetry, and the line passes through the weighted
 * mean at hbar; the weights make it close to half the best RTT); D: the drift uncertainty,
 * max(3 standard errors of the fitted slope, the most the slope can be off if every sample is
 * off by its rtt/2 (sum w|x - hbar| rtt/2 / sum w (x - hbar)^2), 2*(R/2)/span of the samples),
 * or max_drift_ppm while fewer than two samples exist; hbar: the weighted mean host time of the samples; E: the current
 * estimate, so the third term is what the slew has not caught up yet; 1 ns for rounding.
 *
 * Cost: tr_clocksync_add_probe O(fit_samples + 128), tr_clocksync_map O(log max_knots), memory
 * what the last retain_ns of probes keep (rings that grow by doubling up to max_knots, history
 * and exchanges: tr_clocksync_memory_bytes). Not thread-safe: one estimator per host, one owner. */
#ifndef TR_CLOCKSYNC_H
#define TR_CLOCKSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tr_clocksync;

struct tr_clocksync_config {
  int64_t window_ns;        /* best-of window on host time (default 2 s) */
  uint32_t fit_samples;     /* kept samples in the fit, at most 256 (default 64) */
  int64_t fit_span_ns;      /* oldest sample age in the fit (default 300 s) */
  int64_t outlier_slack_ns; /* see outliers above (default 200 us) */
  int64_t rtt_noise_ns;     /* weight floor (default 2 us) */
  double slew_max_ppm;      /* slew rate bound on top of the drift (default 500 ppm) */
  double max_drift_ppm;     /* drift clamp (default 1000 ppm) */
  uint32_t max_knots;       /* mapping knots kept, one per probe (default 65536) */
  uint32_t history;         /* window bests kept for the fit (default 4096) */
  int64_t exchange_period_ns; /* best-of period of the exchange ring (default 5 ms) */
  uint32_t exchanges;       /* exchange-period bests kept (default 8192) */
  /* Knots, window and exchange bests older than this (host time, before the newest) are
   * dropped, at least fit_span_ns (default 10 min): the service's sessions journal their clock
   * packets every second, so memory follows the probe rate, not the uptime. */
  int64_t retain_ns;
};

struct tr_clocksync_probe {
  int64_t t1, t2, t3, t4;
  /* t3 may be early by a queue the answer waited in after it (its kernel send stamp did not
   * come in time): still a valid exchange, whose round trip includes the wait, but no evidence
   * that the path changed (see the path-change rule above). */
  bool t3_late;
};

/* Tiers (docs/timeline.md, Tiers): an exchange a regional measured with one of its hosts (t1,
 * t4 on the regional's clock), made one against this service's clock through via, this
 * service's estimate of the regional: t1 becomes M(t1) - bound(t1) and t4 M(t4) + bound(t4),
 * t2, t3 and t3_late stay. Where via's bound is honest the result is a valid exchange (the
 * host received after t1 and answered before t4 on our clock), whose round trip holds both
 * hops' uncertainty: its error bound is the sum of the two. TR_ERR_STATE while via has no
 * probe yet. */
int tr_clocksync_relay_exchange(const struct tr_clocksync *via, const struct tr_clocksync_probe *in,
                                struct tr_clocksync_probe *out);

/* One point of the mapping for writers: host BOOTTIME -> service BOOTTIME. */
struct tr_clocksync_breakpoint {
  int64_t host_ts, service_ts;
};

/* A remote_clock_sync PING/UPDATE pair: BOOTTIME values of the remote host (client_clocks in
 * RemoteClockSync.SyncedClocks) and of the service (host_clocks). */
struct tr_clocksync_sync_pair {
  int64_t ping_remote, ping_service, update_remote, update_service;
};

struct tr_clocksync_stats {
  uint64_t probes;    /* accepted by tr_clocksync_add_probe */
  uint64_t windows;   /* closed windows */
  uint64_t outliers;  /* window bests rejected */
  uint64_t conflicts; /* knots where order had to win over causality (should stay 0) */
  uint64_t impossible; /* probes refused: their round trip came out below zero */
  uint64_t late;       /* accepted probes with t3_late */
};

void tr_clocksync_config_default(struct tr_clocksync_config *cfg);
/* cfg NULL: defaults. TR_ERR_INVAL for a count or span out of range, TR_ERR_NOMEM. */
int tr_clocksync_init(struct tr_clocksync **out, const struct tr_clocksync_config *cfg);
void tr_clocksync_free(struct tr_clocksync *est);
/* Bytes the estimator holds now (its struct and its rings' arrays). */
size_t tr_clocksync_memory_bytes(const struct tr_clocksync *est);

/* TR_ERR_INVAL for t4 < t1, t3 < t2, values outside [0, 2^62), a round trip (above) more than
 * 2 us below zero (a wrong stamp: stats.impossible), or t3 not after the previous
 * probe's t3; the estimator is unchanged then. */
int tr_clocksync_add_probe(struct tr_clocksync *est, const struct tr_clocksync_probe *p);

/* M(host_ts). TR_ERR_STATE before the first probe. */
int tr_clocksync_map(const struct tr_clocksync *est, int64_t host_ts, int64_t *service_ts);
/* The error bound at host_ts in ns, as defined above; TR_ERR_STATE before the first probe. */
int64_t tr_clocksync_error_bound(const struct tr_clocksync *est, int64_t host_ts);
/* The largest error bound stored at a knot strictly between host times from and to, or -1 if
 * there is none: the bound is linear between knots, so over [from, to] it is the larger of
 * this and the bounds at both ends. O(log knots + knots in the range). */
int64_t tr_clocksync_knot_bound_max(const struct tr_clocksync *est, int64_t from, int64_t to);
/* Host time between the two knots around host_ts (the first two before them, the last two past
 * the frontier): the probes' spacing there. 0 with fewer than two knots. O(log knots). */
int64_t tr_clocksync_knot_gap(const struct tr_clocksync *est, int64_t host_ts);
/* Host time of the last knot: M up to here is final. TR_ERR_STATE before the first probe. */
int64_t tr_clocksync_frontier(const struct tr_clocksync *est);

/* For status displays: the current estimate at the newest sample (service minus host), its
 * drift, and the smallest rtt among the fit samples. 0 before the first probe. */
int64_t tr_clocksync_offset_ns(const struct tr_clocksync *est);
double tr_clocksync_drift_ppm(const struct tr_clocksync *est);
int64_t tr_clocksync_rtt_ns(const struct tr_clocksync *est);
void tr_clocksync_get_stats(const struct tr_clocksync *est, struct tr_clocksync_stats *out);

/* The mapping over host times [host_from, host_to] as breakpoints for trace_processor, which
 * converts a value by the pure offset of the latest breakpoint at or below it (the first if
 * none). Breakpoints lie on M (service_ts = M(host_ts)): one at host_from, one at every knot
 * inside the range, and more within a segment of slope k every tolerance_ns/|k-1| of host time,
 * so for every h in [host_from, host_to]
 *     |h + (service_ts - host_ts of the breakpoint used) - M(h)| <= tolerance_ns + 2
 * (2 ns: integer rounding of M, and the left-out breakpoints below).
 * host_ts and service_ts strictly increase along the list (a breakpoint that would not, in a
 * 1-2 ns piece before a knot, is left out). Write one ClockSnapshot (or one
 * remote_clock_sync, see tr_clocksync_pair_from_breakpoint) per breakpoint. Returns the count
 * written, TR_ERR_FULL if cap is too small (export a shorter range), TR_ERR_INVAL for an empty
 * range, one outside [0, 2^62) or tolerance < 1, TR_ERR_STATE before the first probe.
 * Cost O(count * log knots). */
int tr_clocksync_export(const struct tr_clocksync *est, int64_t host_from, int64_t host_to,
                        int64_t tolerance_ns, struct tr_clocksync_breakpoint *out, size_t cap);

/* tr_clocksync_export, but with breakpoints every step_ns / |k - 1| of host time within a
 * segment of slope k < 1 (tolerance_ns / |k - 1| where k > 1): trace_processor's offset, which is
 * constant from one breakpoint to the next, then steps back by at most step_ns (plus 1 ns of
 * rounding) at each, where M runs slower than the host's clock (a host clock running fast), and
 * two events of one sequence further apart than that cannot swap; a forward step opens a gap
 * between events, it cannot swap them, so it only needs the tolerance. TR_ERR_INVAL also for
 * step_ns outside [1, tolerance_ns]. */
int tr_clocksync_export_steps(const struct tr_clocksync *est, int64_t host_from,
                              int64_t host_to, int64_t tolerance_ns, int64_t step_ns,
                              struct tr_clocksync_breakpoint *out, size_t cap);

/* A writer's series of breakpoints with no backward offset step larger than step_ns between
 * two consecutive ones: tr_clocksync_export_steps's points keep to it while M is followed, but
 * the plan past the frontier is re-planned by later probes, and a range whose breakpoints come
 * from a re-planned M can start microseconds below the last breakpoint written (an earlier
 * plan), as can M's point after a stretch where the writer could not write any. Zero it, set
 * step_ns, and pass every breakpoint of the mapping in order through tr_clocksync_steps_next. */
struct tr_clocksync_steps {
  int64_t step_ns;
  bool any;                             /* last is set */
  struct tr_clocksync_breakpoint last;  /* the last point written */
  uint64_t above;                       /* points written above M, catching up with it */
};
/* The next point to write on the way to bp (a point of M after the last one given): 1 and *out
 * set, then call again with the same bp; 0 when bp is done. bp itself when its offset lies at
 * most step_ns below the last point's; else, while M lies further below, a catch-up point every
 * 4 x step_ns of host time, step_ns below the last, and where M is within a step of the last
 * point, M's own point where it is last so (found by bisection), up to bp. No point at or
 * below host time floor, nor at or below the last one, nor closer than 3 ns to it on either
 * clock (those bps are left out: trace_processor needs both clocks to increase). */
int tr_clocksync_steps_next(struct tr_clocksync_steps *st, const struct tr_clocksync *est,
                            const struct tr_clocksync_breakpoint *bp, int64_t floor,
                            struct tr_clocksync_breakpoint *out);

/* A breakpoint (h, s) as a remote_clock_sync PING/UPDATE pair for the `machines` encoding:
 *     PING {remote h-3, service s-2}, UPDATE {remote h-1, service s}
 * trace_processor takes a pair as client PING (t1c), host (t1h), client UPDATE (t2c), host
 * (t2h) and averages o1 = (t1c+t2c)/2 - t1h and o2 = t2c - (t1h+t2h)/2 (client minus host):
 * here o1 = (2h-4)/2 - (s-2) and o2 = (h-1) - (2s-2)/2, both exactly h - s, and it makes one
 * edge per packet at service s <-> remote h. Write ONE pair per packet: TP averages the pairs
 * of a packet into one edge, and pairs an UPDATE with the next PING when they are < 30 s apart.
 * For breakpoints at least 3 ns apart on both clocks (tr_clocksync_steps_next's are) the
 * values written only increase on both clocks, as TP needs: a remote clock going backwards
 * would become target-only, the trace clock going backwards is rejected. */
void tr_clocksync_pair_from_breakpoint(const struct tr_clocksync_breakpoint *bp,
                                       struct tr_clocksync_sync_pair *out);

#endif
