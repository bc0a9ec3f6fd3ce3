/* check_order.c: the causality check of `tracerelay inspect` (see check_order.h). */
#include "tools/tracerelay/check_order.h"

#include <inttypes.h>
#include <stdlib.h>

#include "relay/reading/flow_order.h"
#include "relay/base/tr_error.h"

#define SHOWN_MAX 20 /* violations listed one by one */

struct order_check {
  struct tr_flow_order *flows;
  bool failed; /* out of memory while collecting */
};

struct order_check *order_check_new(void) {
  struct order_check *c = calloc(1, sizeof *c);
  if (c && tr_flow_order_new(&c->flows) != 0) {
    free(c);
    return NULL;
  }
  return c;
}

void order_check_free(struct order_check *c) {
  if (c == NULL)
    return;
  tr_flow_order_free(c->flows);
  free(c);
}

static void add_ids(struct order_check *c, const uint64_t *ids, size_t n, bool arrival,
                    const struct tr_inspect_point *p) {
  for (size_t i = 0; i < n; i++)
    if (tr_flow_order_add(c->flows, ids[i], arrival, p->host, p->trace_ts) != 0)
      c->failed = true;
}

void order_check_point(struct order_check *c, const struct tr_inspect_point *p) {
  const Perfetto__Protos__TrackEvent *te = p->packet->track_event;
  if (p->source != TR_INSPECT_PACKET || p->status != 0 ||
      p->packet->data_case != PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT)
    return;
  add_ids(c, te->flow_ids, te->n_flow_ids, false, p);
  add_ids(c, te->flow_ids_old, te->n_flow_ids_old, false, p);
  add_ids(c, te->terminating_flow_ids, te->n_terminating_flow_ids, true, p);
  add_ids(c, te->terminating_flow_ids_old, te->n_terminating_flow_ids_old, true, p);
}

struct walk {
  const struct tr_inspect_result *r;
  bool json;
  FILE *out;
  uint64_t crossing, backwards, beyond_bounds, no_bounds;
  int64_t worst_ns;
};

static const char *host_name(const struct tr_inspect_result *r, uint32_t host) {
  return host < r->n_hosts && r->hosts[host].name[0] ? r->hosts[host].name : "unnamed";
}

/* The host's bound at ts in ns (the service's own machine: 0), or -1 unknown. */
static double bound_ns(const struct tr_inspect_result *r, uint32_t host, int64_t ts) {
  if (host < r->n_hosts && r->hosts[host].machine_id == 0 && r->hosts[host].domain == 0)
    return 0;
  const struct tr_trace_bound_track *t =
      host < r->n_hosts ? tr_trace_bounds_find(&r->bounds, r->hosts[host].name) : NULL;
  double us = t && ts >= 0 ? tr_trace_bounds_at(t, (uint64_t)ts) : -1;
  return us < 0 ? -1 : us * 1e3;
}

static void on_pair(const struct tr_flow_pair *p, void *arg) {
  struct walk *w = arg;
  w->crossing++;
  if (p->arrive_ts >= p->depart_ts)
    return;
  int64_t back = p->depart_ts - p->arrive_ts;
  double ba = bound_ns(w->r, p->from_host, p->depart_ts);
  double bb = bound_ns(w->r, p->to_host, p->arrive_ts);
  bool known = ba >= 0 && bb >= 0;
  w->backwards++;
  w->worst_ns = back > w->worst_ns ? back : w->worst_ns;
  if (!known)
    w->no_bounds++;
  else if ((double)back > ba + bb)
    w->beyond_bounds++;
  if (w->json || w->backwards > SHOWN_MAX)
    return;
  fprintf(w->out, "  flow %#" PRIx64 ": %s -> %s arrives %.3f us before it departs", p->id,
          host_name(w->r, p->from_host), host_name(w->r, p->to_host), (double)back / 1e3);
  if (known)
    fprintf(w->out, " (bounds %.3f + %.3f us: %s)\n", ba / 1e3, bb / 1e3,
            (double)back > ba + bb ? "BEYOND them, the clocks are off" : "within them");
  else
    fprintf(w->out, " (a host's bound is unknown there)\n");
}

int order_check_report(const struct order_check *c, const struct tr_inspect_result *r, bool json,
                       FILE *out) {
  struct walk w = {.r = r, .json = json, .out = out};
  if (c->failed)
    return TR_ERR_NOMEM;
  if (!json)
    fprintf(out, "\nflow order (flows whose two ends are on different hosts):\n");
  tr_flow_order_cross_host(c->flows, on_pair, &w);
  if (json)
    fprintf(out,
            "{\"crossing_flows\":%" PRIu64 ",\"arrival_before_departure\":%" PRIu64
            ",\"beyond_bounds\":%" PRIu64 ",\"bounds_unknown\":%" PRIu64
            ",\"worst_ns\":%" PRId64 ",\"extra_flow_ends\":%" PRIu64 "}",
            w.crossing, w.backwards, w.beyond_bounds, w.no_bounds, w.worst_ns,
            tr_flow_order_extra(c->flows));
  else
    fprintf(out,
            "  %" PRIu64 " crossing flows, %" PRIu64 " arrive before they depart (%" PRIu64
            " beyond the two hosts' clock error bounds, %" PRIu64 " where a bound is unknown)"
            "%s\n",
            w.crossing, w.backwards, w.beyond_bounds, w.no_bounds,
            w.backwards > SHOWN_MAX ? "; the first ones are listed above" : "");
  uint64_t definite = w.beyond_bounds + w.no_bounds;
  return definite > (uint64_t)INT32_MAX ? INT32_MAX : (int)definite;
}
