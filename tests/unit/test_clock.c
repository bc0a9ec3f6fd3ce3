/* test_clock.c: builtin clock reads, the traced-order snapshot, clock names, and the simulated
 * clock: linear (a*t + b), monotonic, and its --fake-clock parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"

static int teardown(void **state) {
  (void)state;
  tr_clock_clear_fake();
  return 0;
}

static void test_read_and_snapshot(void **state) {
  (void)state;
  uint64_t a, b;
  assert_int_equal(tr_clock_read(TR_CLOCK_BOOTTIME, &a), 0);
  assert_int_equal(tr_clock_read(TR_CLOCK_BOOTTIME, &b), 0);
  assert_true(b >= a);
  assert_int_equal(tr_clock_read(0, &a), TR_ERR_INVAL);
  assert_int_equal(tr_clock_read(7, &a), TR_ERR_INVAL);
  assert_int_equal(tr_clock_read(9, &a), TR_ERR_INVAL); /* TSC: not read by us */

  struct tr_clock_snapshot snap;
  assert_int_equal(tr_clock_snapshot(&snap), 0);
  assert_int_equal(snap.n, 6);
  const uint32_t order[] = {6, 2, 4, 1, 3, 5}; /* traced's, as in the recorded vectors */
  for (int i = 0; i < 6; i++)
    assert_int_equal(snap.clocks[i].clock_id, order[i]);
  assert_true(snap.clocks[0].ts_ns >= b); /* BOOTTIME read first, after the reads above */
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(tr_clock_name(TR_CLOCK_BOOTTIME), "BOOTTIME");
  assert_string_equal(tr_clock_name(1), "REALTIME");
  assert_string_equal(tr_clock_name(2), "REALTIME_COARSE");
  assert_string_equal(tr_clock_name(3), "MONOTONIC");
  assert_string_equal(tr_clock_name(4), "MONOTONIC_COARSE");
  assert_string_equal(tr_clock_name(5), "MONOTONIC_RAW");
  assert_null(tr_clock_name(0));
  assert_null(tr_clock_name(64));
}

static void test_fake_apply_is_linear(void **state) {
  (void)state;
  uint64_t out;
  /* a = 1 + 200e-6: 10 s real become 10.002 s, plus the offset. */
  assert_int_equal(tr_clock_fake_apply(3600000000000, 200.0, 10000000000u, &out), 0);
  assert_int_equal(out, 3600000000000 + 10002000000u);
  /* negative drift floors: -1 ppm of 1 ns is -1e-6 ns -> -1. */
  assert_int_equal(tr_clock_fake_apply(0, -1.0, 1, &out), 0);
  assert_int_equal(out, 0);
  assert_int_equal(tr_clock_fake_apply(0, -150.5, 1000000000000u, &out), 0);
  assert_int_equal(out, 1000000000000u - 150500000u);
  /* fractional ppm is kept to 1e-12: 1e-6 ppm of 1e15 ns is 1000 ns */
  assert_int_equal(tr_clock_fake_apply(0, 0.000001, 1000000000000000u, &out), 0);
  assert_int_equal(out, 1000000000001000u);
  /* errors: a negative result, a drift out of range */
  assert_int_equal(tr_clock_fake_apply(-10, 0.0, 5, &out), TR_ERR_INVAL);
  assert_int_equal(tr_clock_fake_apply(0, 1e6, 5, &out), TR_ERR_INVAL);

  /* linear: equal real steps give equal fake steps (to the floor's 1 ns). */
  uint64_t prev = 0, step0 = 0;
  for (uint64_t t = 5000000000u; t < 5000000000u + 10 * 1000000000u; t += 1000000000u) {
    assert_int_equal(tr_clock_fake_apply(7, -199.9, t, &out), 0);
    if (prev && step0)
      assert_true(out - prev >= step0 - 1 && out - prev <= step0 + 1);
    else if (prev)
      step0 = out - prev;
    prev = out;
  }
  assert_int_equal(step0, 1000000000u - 199900u);
}

static void test_fake_monotonic(void **state) {
  (void)state;
  /* 1-ns steps around a large t, both drift signs: never backwards. */
  const double drifts[] = {-200.0, -0.3, 0.0, 0.7, 200.0, -99999.0};
  for (size_t d = 0; d < sizeof(drifts) / sizeof(drifts[0]); d++) {
    uint64_t prev = 0;
    for (uint64_t t = 123456789012345u; t < 123456789012345u + 20000; t++) {
      uint64_t out;
      assert_int_equal(tr_clock_fake_apply(1000, drifts[d], t, &out), 0);
      assert_true(out >= prev);
      if (drifts[d] >= 0 && prev)
        assert_true(out > prev);
      prev = out;
    }
  }
}

static void test_fake_reads(void **state) {
  (void)state;
  uint64_t real0, real1, fake;
  assert_int_equal(tr_clock_set_fake(7200000000000, -200.0), 0);
  tr_clock_clear_fake();
  assert_int_equal(tr_clock_read(TR_CLOCK_MONOTONIC_RAW, &real0), 0);
  assert_int_equal(tr_clock_set_fake(7200000000000, -200.0), 0);
  assert_int_equal(tr_clock_read(TR_CLOCK_MONOTONIC_RAW, &fake), 0);
  tr_clock_clear_fake();
  assert_int_equal(tr_clock_read(TR_CLOCK_MONOTONIC_RAW, &real1), 0);
  /* fake(real0) <= fake <= fake(real1): the read is the transform of a reading in between. */
  uint64_t lo, hi;
  assert_int_equal(tr_clock_fake_apply(7200000000000, -200.0, real0, &lo), 0);
  assert_int_equal(tr_clock_fake_apply(7200000000000, -200.0, real1, &hi), 0);
  assert_true(lo <= fake && fake <= hi);

  /* every clock of a snapshot is simulated, and stays monotonic */
  assert_int_equal(tr_clock_set_fake(3600000000000, 150.0), 0);
  struct tr_clock_snapshot a, b;
  assert_int_equal(tr_clock_snapshot(&a), 0);
  assert_int_equal(tr_clock_snapshot(&b), 0);
  for (int i = 0; i < 6; i++) {
    assert_true(a.clocks[i].ts_ns > 3600000000000u);
    if (a.clocks[i].clock_id != TR_CLOCK_REALTIME && a.clocks[i].clock_id != TR_CLOCK_REALTIME_COARSE)
      assert_true(b.clocks[i].ts_ns >= a.clocks[i].ts_ns);
  }
  assert_int_equal(tr_clock_set_fake(0, 1e9), TR_ERR_INVAL);
}

static void test_parse(void **state) {
  (void)state;
  int64_t off;
  double ppm;
  assert_int_equal(tr_clock_parse_fake("3600000000000,-150.5", &off, &ppm), 0);
  assert_int_equal(off, 3600000000000);
  assert_true(ppm == -150.5);
  assert_int_equal(tr_clock_parse_fake("-5,200", &off, &ppm), 0);
  assert_int_equal(off, -5);
  assert_true(ppm == 200.0);
  assert_int_equal(tr_clock_parse_fake("0,.5", &off, &ppm), 0);
  assert_true(ppm == 0.5);

  const char *bad[] = {
      "", ",", "5", "5,", ",5", "abc,1", "5,abc", "5,1x", "5 ,1", " 5,1", "5, 1", "5,1,2",
      "1.5,2", "5,inf", "5,nan", "5,0x10", "5,200000", "99999999999999999999,1", "5;1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    off = 42;
    ppm = 4.2;
    assert_int_equal(tr_clock_parse_fake(bad[i], &off, &ppm), TR_ERR_CONFIG);
    assert_int_equal(off, 42); /* nothing written on error */
  }
  assert_int_equal(tr_clock_parse_fake(NULL, &off, &ppm), TR_ERR_CONFIG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_read_and_snapshot, teardown),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_fake_apply_is_linear),
      cmocka_unit_test(test_fake_monotonic),
      cmocka_unit_test_teardown(test_fake_reads, teardown),
      cmocka_unit_test(test_parse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
