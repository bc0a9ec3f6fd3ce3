/* test_flow_order.c: the flow table behind `inspect --check-order` (relay/reading/flow_order.h): which
 * flows cross hosts, with which ends, whatever order the ends come in; growth keeps them all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "relay/reading/flow_order.h"

struct seen {
  size_t n;
  struct tr_flow_pair last;
  int64_t sum_gap;
};

static void on_pair(const struct tr_flow_pair *p, void *arg) {
  struct seen *s = arg;
  s->n++;
  s->last = *p;
  s->sum_gap += p->arrive_ts - p->depart_ts;
}

static void test_crossing_pairs(void **state) {
  (void)state;
  struct tr_flow_order *f;
  assert_int_equal(tr_flow_order_new(&f), 0);
  assert_int_equal(tr_flow_order_add(f, 7, true, 2, 90), 0); /* arrival read first */
  assert_int_equal(tr_flow_order_add(f, 7, false, 1, 100), 0);
  assert_int_equal(tr_flow_order_add(f, 8, false, 1, 10), 0); /* same host: not crossing */
  assert_int_equal(tr_flow_order_add(f, 8, true, 1, 20), 0);
  assert_int_equal(tr_flow_order_add(f, 9, false, 3, 5), 0); /* no arrival */
  assert_int_equal(tr_flow_order_add(f, 0, false, 3, 5), 0); /* id 0: ignored */
  assert_int_equal(tr_flow_order_add(f, 7, false, 3, 1), 0); /* a second departure: extra */
  struct seen s = {0};
  tr_flow_order_cross_host(f, on_pair, &s);
  assert_int_equal(s.n, 1);
  assert_int_equal(s.last.id, 7);
  assert_int_equal(s.last.from_host, 1);
  assert_int_equal(s.last.to_host, 2);
  assert_int_equal(s.last.depart_ts, 100);
  assert_int_equal(s.last.arrive_ts, 90); /* arrives before it departs: the caller reports it */
  assert_int_equal(tr_flow_order_extra(f), 1);
  tr_flow_order_free(f);
}

static void test_many_flows(void **state) {
  (void)state;
  struct tr_flow_order *f;
  assert_int_equal(tr_flow_order_new(&f), 0);
  for (uint64_t id = 1; id <= 100000; id++) {
    assert_int_equal(tr_flow_order_add(f, id * 0x10001, false, 0, (int64_t)id), 0);
    assert_int_equal(tr_flow_order_add(f, id * 0x10001, true, 1, (int64_t)id + 5), 0);
  }
  struct seen s = {0};
  tr_flow_order_cross_host(f, on_pair, &s);
  assert_int_equal(s.n, 100000);
  assert_int_equal(s.sum_gap, 500000);
  assert_int_equal(tr_flow_order_extra(f), 0);
  tr_flow_order_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crossing_pairs),
      cmocka_unit_test(test_many_flows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
