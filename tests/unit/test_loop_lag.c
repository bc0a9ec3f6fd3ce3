/* test_loop_lag.c: relay/loop_lag.h on a real libuv loop.
 *
 * A timer callback that keeps the loop busy for 30 ms (it spins on the clock) must show up as
 * an iteration of at least 30 ms: in the maximum and in the histogram's buckets above 20 ms.
 * Iterations spent waiting (a 50 ms timer on an idle loop) must not count their wait: the
 * histogram's sum stays below the loop's wall time minus what it waited for the timers. Only
 * lower bounds on busy time are asserted, which a slow or busy machine cannot break. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/loop_lag.h"

#define STALL_NS 30000000ull /* 30 ms */

static void spin(uv_timer_t *t) {
  (void)t;
  uint64_t start = uv_hrtime();
  while (uv_hrtime() - start < STALL_NS) {
  }
}

static void nothing(uv_timer_t *t) { (void)t; }

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
  uv_timer_t wait, stall;
  uv_timer_init(&loop, &wait);
  uv_timer_init(&loop, &stall);
  uv_timer_start(&wait, nothing, 50, 0);
  uv_timer_start(&stall, spin, 60, 0);
  uint64_t t0 = uv_hrtime();
  uv_run(&loop, UV_RUN_DEFAULT); /* the lag's handle does not keep the loop alive */
  uint64_t wall = uv_hrtime() - t0;

  const tr_prom_histogram *h = tr_loop_lag_histogram(lag);
  assert_true(tr_loop_lag_max_ns(lag) >= STALL_NS);
  assert_true(count_above(h, 0.02) >= 1);
  assert_true(h->count >= 2);
  /* The 50 ms of waiting for the first timer is not busy time. */
  assert_true(h->sum * 1e9 < (double)wall - 40e6);

  uv_close((uv_handle_t *)&wait, NULL);
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
