/* flow_order.h: the causality check of `tracerelay inspect --check-order`. Flows (TrackEvent
 * flow_ids on the event that starts one, terminating_flow_ids on the one that ends it) link an
 * event on one host to an event on another; an arrival placed before its departure on the
 * merged timeline is a causality violation: the hosts' clock mappings are off by more than the
 * gap. Feed every flow end with its host and trace time; then walk the flows that cross hosts.
 * Per id the first departure and the first arrival count (a flow id reused later, or steps of a
 * chained flow, are counted as extra and otherwise left alone).
 * Cost: O(1) expected per end (open addressing, at most half full), 32 bytes per flow id. */
#ifndef TR_FLOW_ORDER_H
#define TR_FLOW_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tr_flow_order;

struct tr_flow_pair {
  uint64_t id;
  uint32_t from_host, to_host; /* caller's host numbers */
  int64_t depart_ts, arrive_ts; /* trace time */
};

int tr_flow_order_new(struct tr_flow_order **out);
void tr_flow_order_free(struct tr_flow_order *f);
/* One end of flow id (0 is ignored, as Perfetto does) on host at trace time ts. 0 or
 * TR_ERR_NOMEM. */
int tr_flow_order_add(struct tr_flow_order *f, uint64_t id, bool arrival, uint32_t host, int64_t ts);
/* Calls fn for every flow with both ends on different hosts, in no set order. */
void tr_flow_order_cross_host(const struct tr_flow_order *f,
                              void (*fn)(const struct tr_flow_pair *p, void *arg), void *arg);
/* Ends beyond the first departure / arrival of their id. */
uint64_t tr_flow_order_extra(const struct tr_flow_order *f);

#endif
