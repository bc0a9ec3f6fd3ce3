/* timeline_check.c: tracerelay-timeline-check, the accuracy checker of the timeline tests and
 * benchmark (tests/integration/test_timeline.sh, bench/bench_timeline.sh). A TEST TOOL.
 *
 * Usage: tracerelay-timeline-check [--bound-us N] [--allow-inversions] [--check-own-bound]
 *        [--allow-lost-hosts] [--json] [--dump FILE] TRACE NAME=OFFSET_NS,DRIFT_PPM...
 *
 * Every host NAME ran its loadgen with `--fake-clock OFFSET_NS,DRIFT_PPM` while the service ran
 * on the real clocks, so a loadgen event stamped f on its host's (simulated) BOOTTIME truly
 * happened at service BOOTTIME t = fake^-1(f) (relay/clock/clock.h). The checker resolves the trace
 * with tr_inspect_trace, as trace_processor would, and for every track event of a named host
 * compares where it landed (trace time) with t. It prints, per host and overall, the count, the
 * median, p99 and max of |error| in microseconds, the signed median, and two kinds of
 * violation: an event whose |error| exceeds the bound, and an order inversion (two events of one
 * sequence whose trace times run against their host times). Events that did not resolve count
 * as violations too, and so do events that trace_processor, which converts a timestamp when it
 * reads the packet, would put elsewhere than the whole trace's clock data does (clock data
 * written after data it covers: tr_inspect_point.read_trace_ts; then what this checks is not
 * what the viewer shows); --allow-inversions still counts and prints inversions but does not fail
 * on them (trace_processor's constant offset per remote_clock_sync edge or per ClockSnapshot
 * steps back there when the host's clock runs fast, so two events closer than the step can
 * swap; see tests/integration/test_timeline.sh). Exit 0 when there is none and every named host
 * has events, 1 otherwise, 2 on bad arguments or an unreadable trace. A host without events says
 * why when its packets were skipped after a loss (previous_packet_dropped, no incremental-state
 * clear after it: trace_processor skips them too); --allow-lost-hosts accepts such a host (a
 * saturated or starved run, whose losses are counted, can lose every clear a host's loadgen got)
 * as long as some host has events. It also compares each event's |error| with the
 * clock error bound the trace itself shows for that host at that instant (the service's bound
 * track, relay/reading/trace_bounds.h) and counts the events beyond it and those before the track's
 * first sample, and reports the bound's width at the events (median, p99: what honesty costs);
 * --check-own-bound makes either a violation (the bound must be honest). --dump FILE writes one line per checked event,
 * "NAME TRUE_NS ERROR_NS" (true instant on the service's BOOTTIME, signed error), to see where
 * in time the error is. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/reading/trace_inspect.h"
#include "relay/base/tr_error.h"

#define MAX_HOSTS 64

struct host {
  const char *name;
  int64_t offset_ns;
  double drift_ppm;
  double *err; /* signed errors in ns */
  size_t n, cap;
  uint64_t unresolved, over_bound, inversions;
  uint64_t read_moved; /* events trace_processor, reading in file order, puts elsewhere */
  int64_t first_read_moved_ns; /* the first one's difference (ours minus file order) */
  const struct tr_trace_bound_track *own; /* the trace's bound track of this host, or NULL */
  bool own_looked_up; /* the tracks are complete once the resolver's first pass is over */
  uint64_t beyond_own, no_own;
  double worst_own_ratio; /* largest |error| / own bound */
  double *own_ns;         /* the own bound at each event that has one, in ns */
  size_t n_own, cap_own;
};

struct seq_last {
  uint32_t host_index, seq;
  uint64_t clock_ts;
  int64_t trace_ts;
};

struct ctx {
  struct host hosts[MAX_HOSTS];
  size_t n_hosts;
  struct tr_inspect_result *res;
  int64_t bound_ns;
  struct seq_last *seqs;
  size_t n_seqs, cap_seqs;
  int oom;
  FILE *dump;
};

/* The real instant t with fake(t) <= f < fake(t + 1). */
static int invert(const struct host *h, uint64_t f, int64_t *t) {
  long double guess = ((long double)f - h->offset_ns) / (1.0L + h->drift_ppm * 1e-6L);
  int64_t lo = (int64_t)guess - 4;
  uint64_t v;
  if (lo < 0)
    lo = 0;
  for (int64_t c = lo + 8; c >= lo; c--)
    if (tr_clock_fake_apply(h->offset_ns, h->drift_ppm, (uint64_t)c, &v) == 0 && v <= f) {
      *t = c;
      return 0;
    }
  return TR_ERR_INVAL;
}

static struct host *host_of(struct ctx *c, const struct tr_inspect_point *p) {
  if (p->host >= c->res->n_hosts)
    return NULL;
  const char *name = c->res->hosts[p->host].name;
  for (size_t i = 0; i < c->n_hosts; i++)
    if (strcmp(c->hosts[i].name, name) == 0)
      return &c->hosts[i];
  return NULL;
}

static struct seq_last *seq_of(struct ctx *c, uint32_t host, uint32_t seq) {
  for (size_t i = 0; i < c->n_seqs; i++)
    if (c->seqs[i].host_index == host && c->seqs[i].seq == seq)
      return &c->seqs[i];
  if (c->n_seqs == c->cap_seqs) {
    size_t n = c->cap_seqs ? 2 * c->cap_seqs : 64;
    struct seq_last *g = realloc(c->seqs, n * sizeof *g);
    if (!g)
      return NULL;
    c->seqs = g;
    c->cap_seqs = n;
  }
  c->seqs[c->n_seqs] = (struct seq_last){host, seq, 0, INT64_MIN};
  return &c->seqs[c->n_seqs++];
}

/* Appends v to *a (n used, cap allocated); false when out of memory. */
static bool push_value(double **a, size_t *n, size_t *cap, double v) {
  if (*n == *cap) {
    size_t grown = *cap ? 2 * *cap : 4096;
    double *g = realloc(*a, grown * sizeof *g);
    if (!g)
      return false;
    *a = g;
    *cap = grown;
  }
  (*a)[(*n)++] = v;
  return true;
}

static void check_own_bound(struct ctx *c, struct host *h, int64_t trace_ts, double err_ns) {
  if (!h->own_looked_up) {
    h->own = tr_trace_bounds_find(&c->res->bounds, h->name);
    h->own_looked_up = true;
  }
  double us = h->own && trace_ts >= 0 ? tr_trace_bounds_at(h->own, (uint64_t)trace_ts) : -1;
  if (us < 0) {
    h->no_own++;
    return;
  }
  if (!push_value(&h->own_ns, &h->n_own, &h->cap_own, us * 1e3))
    c->oom = 1;
  if (fabs(err_ns) > us * 1e3)
    h->beyond_own++;
  if (us > 0 && fabs(err_ns) / (us * 1e3) > h->worst_own_ratio)
    h->worst_own_ratio = fabs(err_ns) / (us * 1e3);
}

static void on_point(const struct tr_inspect_point *p, void *arg) {
  struct ctx *c = arg;
  struct host *h;
  struct seq_last *s;
  int64_t truth;
  if (p->source != TR_INSPECT_PACKET ||
      p->packet->data_case != PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT || !(h = host_of(c, p)))
    return;
  if (p->status != 0 || invert(h, p->clock_ts, &truth) < 0) {
    h->unresolved++;
    return;
  }
  double e = (double)(p->trace_ts - truth);
  if (p->read_trace_ts != p->trace_ts && !h->read_moved++)
    h->first_read_moved_ns = p->trace_ts - p->read_trace_ts;
  if (c->dump)
    fprintf(c->dump, "%s %lld %lld\n", h->name, (long long)truth, (long long)(p->trace_ts - truth));
  if (fabs(e) > (double)c->bound_ns)
    h->over_bound++;
  check_own_bound(c, h, p->trace_ts, e);
  if (!(s = seq_of(c, p->host, p->seq_id))) {
    c->oom = 1;
    return;
  }
  if (s->trace_ts != INT64_MIN && p->clock_ts >= s->clock_ts && p->trace_ts < s->trace_ts)
    h->inversions++;
  s->clock_ts = p->clock_ts;
  s->trace_ts = p->trace_ts;
  if (!push_value(&h->err, &h->n, &h->cap, e))
    c->oom = 1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

struct summary {
  size_t n;
  double median_us, p99_us, max_us, signed_median_us;
};

static void summarize(const double *err, size_t n, struct summary *out) {
  double *a = malloc((n ? n : 1) * sizeof *a), *b = malloc((n ? n : 1) * sizeof *b);
  *out = (struct summary){.n = n};
  if (!a || !b || n == 0)
    goto done;
  for (size_t i = 0; i < n; i++) {
    a[i] = fabs(err[i]);
    b[i] = err[i];
  }
  qsort(a, n, sizeof *a, cmp_double);
  qsort(b, n, sizeof *b, cmp_double);
  out->median_us = a[n / 2] / 1e3;
  out->p99_us = a[(size_t)((double)(n - 1) * 0.99)] / 1e3;
  out->max_us = a[n - 1] / 1e3;
  out->signed_median_us = b[n / 2] / 1e3;
done:
  free(a);
  free(b);
}

/* Packets of host h that the resolver skipped after a loss, as trace_processor does. */
static uint64_t skipped_after_loss(const struct ctx *c, const struct host *h) {
  uint64_t n = 0;
  for (size_t i = 0; i < c->res->n_hosts; i++)
    if (strcmp(c->res->hosts[i].name, h->name) == 0)
      n += c->res->hosts[i].skipped_after_loss;
  return n;
}

static size_t hosts_with_events(const struct ctx *c) {
  size_t n = 0;
  for (size_t i = 0; i < c->n_hosts; i++)
    n += c->hosts[i].n > 0;
  return n;
}

static void usage(void) {
  fputs("Usage: tracerelay-timeline-check [--bound-us N] [--allow-inversions] "
        "[--check-own-bound] [--allow-lost-hosts] [--json] [--dump FILE] TRACE\n"
        "       NAME=OFFSET_NS,DRIFT_PPM...\n"
        "Test tool: checks that every loadgen event of each named host (run with\n"
        "--fake-clock OFFSET_NS,DRIFT_PPM) lands within N us (default 100) of its true instant\n"
        "on the trace clock, and that no sequence's events change order. With\n"
        "--check-own-bound, also that each event's error is within the clock error bound the\n"
        "trace shows for its host at that instant. With --allow-lost-hosts, a host whose\n"
        "events were all skipped after a loss (as trace_processor skips them) is said, not\n"
        "failed, while another host has events.\n",
        stderr);
}

int main(int argc, char **argv) {
  struct ctx c = {.bound_ns = 100000};
  struct tr_inspect_result res = {0};
  const char *path = NULL;
  bool json = false, allow_inversions = false, check_own = false, allow_lost_hosts = false;
  int i, rc, status = 0;
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--version") == 0) {
      printf("tracerelay-timeline-check %s\n", TR_VERSION);
      return 0;
    }
    if (strcmp(argv[i], "--bound-us") == 0 && i + 1 < argc) {
      char *end;
      double v = strtod(argv[++i], &end);
      if (*end || v <= 0) {
        usage();
        return 2;
      }
      c.bound_ns = (int64_t)(v * 1e3);
    } else if (strcmp(argv[i], "--allow-inversions") == 0) {
      allow_inversions = true;
    } else if (strcmp(argv[i], "--check-own-bound") == 0) {
      check_own = true;
    } else if (strcmp(argv[i], "--allow-lost-hosts") == 0) {
      allow_lost_hosts = true;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
      if (!(c.dump = fopen(argv[++i], "w"))) {
        fprintf(stderr, "tracerelay-timeline-check: %s: %s\n", argv[i], strerror(errno));
        return 2;
      }
    } else if (!path) {
      path = argv[i];
    } else {
      char *eq = strchr(argv[i], '=');
      if (!eq || c.n_hosts == MAX_HOSTS) {
        usage();
        return 2;
      }
      *eq = '\0';
      struct host *h = &c.hosts[c.n_hosts++];
      h->name = argv[i];
      if (tr_clock_parse_fake(eq + 1, &h->offset_ns, &h->drift_ppm) < 0) {
        usage();
        return 2;
      }
    }
  }
  if (!path || c.n_hosts == 0) {
    usage();
    return 2;
  }
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "tracerelay-timeline-check: %s: %s\n", path, strerror(errno));
    return 2;
  }
  size_t cap = 1 << 20, len = 0;
  uint8_t *data = malloc(cap);
  size_t got;
  while (data && (got = fread(data + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      uint8_t *g = realloc(data, cap *= 2);
      if (!g) {
        free(data);
        data = NULL;
      }
      data = g;
    }
  }
  fclose(f);
  if (!data) {
    fprintf(stderr, "tracerelay-timeline-check: out of memory\n");
    return 2;
  }
  c.res = &res;
  rc = tr_inspect_trace(data, len, on_point, &c, &res);
  if (rc < 0 || c.oom) {
    fprintf(stderr, "tracerelay-timeline-check: %s: %s\n", path,
            c.oom ? "out of memory" : tr_strerror(rc));
    return 2;
  }
  size_t total = 0, total_own = 0;
  for (size_t h = 0; h < c.n_hosts; h++) {
    total += c.hosts[h].n;
    total_own += c.hosts[h].n_own;
  }
  double *all = calloc(total ? total : 1, sizeof *all);
  double *all_own = calloc(total_own ? total_own : 1, sizeof *all_own);
  if (!all || !all_own) {
    fprintf(stderr, "tracerelay-timeline-check: out of memory\n");
    return 2;
  }
  size_t k = 0, k_own = 0;
  uint64_t unresolved = 0, over = 0, inv = 0, beyond_own = 0, beyond_own_all = 0, moved = 0;
  if (json)
    printf("{\"bound_us\": %.3f, \"hosts\": {", (double)c.bound_ns / 1e3);
  for (size_t h = 0; h < c.n_hosts; h++) {
    struct host *x = &c.hosts[h];
    struct summary s, w;
    summarize(x->err, x->n, &s);
    summarize(x->own_ns, x->n_own, &w);
    if (x->n) /* x->err is NULL without events: no memcpy from it */
      memcpy(all + k, x->err, x->n * sizeof *all);
    k += x->n;
    if (x->n_own)
      memcpy(all_own + k_own, x->own_ns, x->n_own * sizeof *all_own);
    k_own += x->n_own;
    unresolved += x->unresolved;
    over += x->over_bound;
    inv += x->inversions;
    moved += x->read_moved;
    beyond_own_all += x->beyond_own;
    if (check_own)
      beyond_own += x->beyond_own + x->no_own;
    uint64_t skipped = skipped_after_loss(&c, x);
    bool lost_allowed = allow_lost_hosts && skipped && hosts_with_events(&c);
    if (x->n == 0 && !lost_allowed)
      status = 1;
    if (json)
      printf("%s\"%s\": {\"events\": %zu, \"median_us\": %.3f, \"p99_us\": %.3f, \"max_us\": "
             "%.3f, \"signed_median_us\": %.3f, \"over_bound\": %llu, \"inversions\": %llu, "
             "\"unresolved\": %llu, \"elsewhere_in_file_order\": %llu, "
             "\"own_bound_max_us\": %.3f, \"own_bound_median_us\": %.3f, "
             "\"own_bound_p99_us\": %.3f, \"beyond_own_bound\": %llu, "
             "\"before_own_bound\": %llu, \"worst_error_to_own_bound\": %.3f, "
             "\"skipped_after_loss\": %llu}",
             h ? ", " : "", x->name, s.n, s.median_us, s.p99_us, s.max_us, s.signed_median_us,
             (unsigned long long)x->over_bound, (unsigned long long)x->inversions,
             (unsigned long long)x->unresolved, (unsigned long long)x->read_moved,
             x->own ? x->own->max_us : -1.0, w.median_us,
             w.p99_us, (unsigned long long)x->beyond_own, (unsigned long long)x->no_own,
             x->worst_own_ratio, (unsigned long long)skipped);
    else
      printf("%-12s events %8zu  |error| median %8.3f us  p99 %8.3f us  max %8.3f us  "
             "(signed median %+.3f us)  over bound %llu  order inversions %llu  unresolved %llu  "
             "elsewhere in file order %llu (first by %lld ns)\n"
             "%-12s own bound: median %.3f us, p99 %.3f us, max %.3f us, events beyond it %llu, "
             "before its first sample %llu, worst |error|/bound %.3f\n",
             x->name, s.n, s.median_us, s.p99_us, s.max_us, s.signed_median_us,
             (unsigned long long)x->over_bound, (unsigned long long)x->inversions,
             (unsigned long long)x->unresolved, (unsigned long long)x->read_moved,
             (long long)x->first_read_moved_ns, x->name, w.median_us, w.p99_us,
             x->own ? x->own->max_us : -1.0, (unsigned long long)x->beyond_own,
             (unsigned long long)x->no_own, x->worst_own_ratio);
    if (!json && x->n == 0)
      printf("%-12s no event to check: %s%s\n", x->name,
             skipped ? "its packets in the trace follow a loss with no incremental-state clear "
                       "after it (skipped, as trace_processor skips them)"
                     : "none of its track events is in the trace",
             lost_allowed ? "; allowed (--allow-lost-hosts)" : "");
  }
  struct summary s, w;
  summarize(all, k, &s);
  summarize(all_own, k_own, &w); /* the bound's width at the events: the price of honesty */
  if (unresolved || over || beyond_own || moved || (inv && !allow_inversions))
    status = 1;
  if (json)
    printf("}, \"all\": {\"events\": %zu, \"median_us\": %.3f, \"p99_us\": %.3f, \"max_us\": %.3f, "
           "\"own_bound_median_us\": %.3f, \"own_bound_p99_us\": %.3f, \"beyond_own_bound\": %llu, "
           "\"unresolved\": %llu, \"elsewhere_in_file_order\": %llu, \"violations\": %llu}, "
           "\"ok\": %s}\n",
           s.n, s.median_us, s.p99_us, s.max_us, w.median_us, w.p99_us,
           (unsigned long long)beyond_own_all, (unsigned long long)unresolved,
           (unsigned long long)moved,
           (unsigned long long)(unresolved + over + inv + beyond_own + moved),
           status == 0 ? "true" : "false");
  else
    printf("%-12s events %8zu  |error| median %8.3f us  p99 %8.3f us  max %8.3f us  bound %.1f "
           "us  own bound median %.3f us, p99 %.3f us  violations %llu: %s\n",
           "all", s.n, s.median_us, s.p99_us, s.max_us, (double)c.bound_ns / 1e3, w.median_us,
           w.p99_us, (unsigned long long)(unresolved + over + inv + beyond_own + moved),
           status == 0 ? "OK" : "FAIL");
  free(all);
  free(all_own);
  for (size_t h = 0; h < c.n_hosts; h++) {
    free(c.hosts[h].err);
    free(c.hosts[h].own_ns);
  }
  free(c.seqs);
  if (c.dump)
    fclose(c.dump);
  tr_inspect_result_free(&res);
  free(data);
  return status;
}
