/* test_loop_lag.c: relay/daemon/loop_lag.h on a real libuv loop.
 *
 * A timer callback that keeps the loop busy for 30 ms (it spins on the clock) must show up as
 * an iteration of at least 30 ms: in the maximum and in the histogram's buckets above 20 ms.
 * Only lower bounds on busy time are asserted, which a slow or busy machine cannot break (it
 * can only make iterations longer, even the waiting ones: a process kept from running outside
 * its poll is busy as far as the loop's events are concerned). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/daemon/loop_lag.h"

#define STALL_NS 30000000ull /* 30 ms */

/* An idle callback: nothing in the first iteration (whose prepare callback marks where the
 * measured ones begin), a 30 ms stall in the second, then done. */
static void spin_in_second_iteration(uv_idle_t *idle) {
  int *calls = idle->data;
  if (++*calls < 2)
    return;
  uint64_t start = uv_hrtime();
  while (uv_hrtime() - start < STALL_NS) {
  }
  uv_idle_stop(idle);
}

/* Counts in buckets whose lower bound is at or above `above` seconds. */
static uint64_t count_above(const tr_prom_histogram *h, double above) {
  uint64_t n = 0;
  for (size_t i = 0; i <= h->n; i++)
    if (i > 0 && h->le[i - 1] >= above)
      n += h->in_bucket[i];
  return n;
}

static void test_a_stall_is_one_long_iteration(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tr_loop_lag *lag;
  assert_int_equal(tr_loop_lag_start(&loop, &lag), 0);
  uv_idle_t stall;
  int calls = 0;
  uv_idle_init(&loop, &stall);
  stall.data = &calls;
  uv_idle_start(&stall, spin_in_second_iteration);
  uv_run(&loop, UV_RUN_DEFAULT); /* the lag's handle does not keep the loop alive */
  assert_int_equal(calls, 2);

  const tr_prom_histogram *h = tr_loop_lag_histogram(lag);
  assert_true(tr_loop_lag_max_ns(lag) >= STALL_NS);
  assert_true(count_above(h, 0.02) >= 1);
  assert_true(h->sum >= STALL_NS / 1e9);

  uv_close((uv_handle_t *)&stall, NULL);
  tr_loop_lag_stop(lag);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_stall_is_one_long_iteration),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
