/* check_order.h: `tracerelay inspect --check-order`: flows that cross hosts, and any whose
 * arrival the merged timeline puts before its departure (relay/reading/flow_order.h), measured against
 * the two hosts' clock error bounds as the trace shows them (relay/reading/trace_bounds.h). */
#ifndef TRACERELAY_CHECK_ORDER_H
#define TRACERELAY_CHECK_ORDER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "relay/reading/trace_inspect.h"

struct order_check;

struct order_check *order_check_new(void);
void order_check_free(struct order_check *c);
/* Every resolved point of the trace (a tr_inspect_cb body). */
void order_check_point(struct order_check *c, const struct tr_inspect_point *p);
/* Prints the result (text, or a JSON object value when json) to out; returns the number of
 * flows whose arrival precedes their departure by more than the two hosts' bounds (or where a
 * bound is unknown): a clock is then certainly wrong; within the bounds the order was never
 * certain, and such flows are only listed. TR_ERR_NOMEM if a point could not be kept. */
int order_check_report(const struct order_check *c, const struct tr_inspect_result *r, bool json,
                       FILE *out);

#endif
