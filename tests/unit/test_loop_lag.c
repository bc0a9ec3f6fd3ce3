/* test_loop_lag.c: relay/daemon/loop_lag.h on a real libuv loop.
 *
 * A timer callback that keeps the loop busy for 30 ms (it spins on the clock) must show up as
 * an iteration of at least 30 ms: in the maximum and in the histogram's buckets above 20 ms.
 * Only lower bounds on busy time are asserted, which a slow or busy machine cannot break (it
 * can only make iterations longer, even the waiting ones: a process kept from running outside
 * its poll is busy as far as the loop's events are concerned).
 *
 * Stalls (iterations busy for a second or more) are told apart by the CPU the loop's thread
 * used: a callback that sleeps used next to none, whatever the machine's load; one that spins
 * until its thread has used a second of CPU used at least that (the machine can only add wall
 * time, so the test asserts the CPU figure's lower bound, not the verdict). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <time.h>

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

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#define LONG_NS 1050000000ull /* just over TR_LOOP_LAG_STALL_NS */

/* In the second iteration: sleeps (blocked, off the CPU) or spins until the thread has used
 * LONG_NS of CPU. */
static void sleep_in_second_iteration(uv_idle_t *idle) {
  int *calls = idle->data;
  if (++*calls < 2)
    return;
  struct timespec ts = {.tv_sec = LONG_NS / 1000000000u, .tv_nsec = LONG_NS % 1000000000u};
  while (nanosleep(&ts, &ts) != 0) {
  }
  uv_idle_stop(idle);
}

static void burn_cpu_in_second_iteration(uv_idle_t *idle) {
  int *calls = idle->data;
  if (++*calls < 2)
    return;
  uint64_t start = thread_cpu_ns();
  while (thread_cpu_ns() - start < LONG_NS) {
  }
  uv_idle_stop(idle);
}

static struct tr_loop_lag_stalls run_one_stall(uv_idle_cb stall_cb) {
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  tr_loop_lag *lag;
  assert_int_equal(tr_loop_lag_start(&loop, &lag), 0);
  uv_idle_t stall;
  int calls = 0;
  uv_idle_init(&loop, &stall);
  stall.data = &calls;
  uv_idle_start(&stall, stall_cb);
  uv_run(&loop, UV_RUN_DEFAULT);
  struct tr_loop_lag_stalls st = tr_loop_lag_stalls(lag);
  uv_close((uv_handle_t *)&stall, NULL);
  tr_loop_lag_stop(lag);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  return st;
}

static void test_a_blocked_thread_is_a_stall_off_the_cpu(void **state) {
  (void)state;
  struct tr_loop_lag_stalls st = run_one_stall(sleep_in_second_iteration);
  assert_int_equal(st.count, 1);
  assert_true(st.last_busy_ns >= LONG_NS);
  assert_true(st.last_span_ns >= st.last_busy_ns);
  assert_true(2 * st.last_on_cpu_ns < st.last_span_ns); /* at most 100 ms before it on CPU */
}

static void test_a_long_step_is_a_stall_on_the_cpu(void **state) {
  (void)state;
  struct tr_loop_lag_stalls st = run_one_stall(burn_cpu_in_second_iteration);
  assert_int_equal(st.count, 1);
  assert_true(st.last_busy_ns >= LONG_NS);
  assert_true(st.last_on_cpu_ns >= LONG_NS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_stall_is_one_long_iteration),
      cmocka_unit_test(test_a_blocked_thread_is_a_stall_off_the_cpu),
      cmocka_unit_test(test_a_long_step_is_a_stall_on_the_cpu),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
