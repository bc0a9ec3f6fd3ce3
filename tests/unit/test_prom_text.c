/* test_prom_text.c: the Prometheus text exposition writer: families, samples with and without
 * the host label, label values escaped as the format requires, numbers as Prometheus reads
 * them, a buffer that grows past its first allocation, and histograms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "relay/daemon/prom_text.h"

/* Bucket edges are inclusive (le), buckets are written cumulative, +Inf holds everything. */
static void test_histogram(void **state) {
  (void)state;
  static const double le[] = {0.01, 0.1, 1};
  tr_prom_histogram h = {.le = le, .n = 3};
  tr_prom_histogram_observe(&h, 0.005);
  tr_prom_histogram_observe(&h, 0.01);
  tr_prom_histogram_observe(&h, 0.5);
  tr_prom_histogram_observe(&h, 7);
  tr_prom_text t = {0};
  tr_prom_histogram_write(&t, "tracerelay_f_seconds", "a duration", &h);
  assert_false(t.failed);
  assert_string_equal(t.buf, "# HELP tracerelay_f_seconds a duration\n"
                             "# TYPE tracerelay_f_seconds histogram\n"
                             "tracerelay_f_seconds_bucket{le=\"0.01\"} 2\n"
                             "tracerelay_f_seconds_bucket{le=\"0.1\"} 2\n"
                             "tracerelay_f_seconds_bucket{le=\"1\"} 3\n"
                             "tracerelay_f_seconds_bucket{le=\"+Inf\"} 4\n"
                             "tracerelay_f_seconds_sum 7.515\n"
                             "tracerelay_f_seconds_count 4\n");
  tr_prom_text_free(&t);
}

static void test_family_and_samples(void **state) {
  (void)state;
  tr_prom_text t = {0};
  tr_prom_family(&t, "tracerelay_x_total", "counter", "things counted");
  tr_prom_sample(&t, "tracerelay_x_total", NULL, 42);
  tr_prom_sample(&t, "tracerelay_x_total", "web-1", 1e12);
  tr_prom_sample(&t, "tracerelay_x_total", "", 0);
  tr_prom_sample(&t, "tracerelay_x_total", NULL, -7);
  tr_prom_sample(&t, "tracerelay_x_total", NULL, 1e16);
  tr_prom_family(&t, "tracerelay_y_seconds", "gauge", "a time");
  tr_prom_sample(&t, "tracerelay_y_seconds", "web-2", 2.5e-06);
  tr_prom_sample(&t, "tracerelay_y_seconds", "web-3", -0.5);
  tr_prom_sample(&t, "tracerelay_y_seconds", "web-4", NAN);
  tr_prom_sample(&t, "tracerelay_y_seconds", "web-5", INFINITY);
  assert_false(t.failed);
  assert_string_equal(t.buf, "# HELP tracerelay_x_total things counted\n"
                             "# TYPE tracerelay_x_total counter\n"
                             "tracerelay_x_total 42\n"
                             "tracerelay_x_total{host=\"web-1\"} 1000000000000\n"
                             "tracerelay_x_total{host=\"\"} 0\n"
                             "tracerelay_x_total -7\n"
                             "tracerelay_x_total 1e+16\n"
                             "# HELP tracerelay_y_seconds a time\n"
                             "# TYPE tracerelay_y_seconds gauge\n"
                             "tracerelay_y_seconds{host=\"web-2\"} 2.5e-06\n"
                             "tracerelay_y_seconds{host=\"web-3\"} -0.5\n"
                             "tracerelay_y_seconds{host=\"web-4\"} NaN\n"
                             "tracerelay_y_seconds{host=\"web-5\"} +Inf\n");
  tr_prom_text_free(&t);
}

static void test_label_escaping(void **state) {
  (void)state;
  tr_prom_text t = {0};
  tr_prom_sample(&t, "m", "a\"b\\c\nd", 1);
  assert_string_equal(t.buf, "m{host=\"a\\\"b\\\\c\\nd\"} 1\n");
  tr_prom_text_free(&t);
  /* Escapes first and last, and back to back. */
  tr_prom_sample(&t, "m", "\n\"\"x\\", 1);
  assert_string_equal(t.buf, "m{host=\"\\n\\\"\\\"x\\\\\"} 1\n");
  tr_prom_text_free(&t);
}

static void test_grows(void **state) {
  (void)state;
  tr_prom_text t = {0};
  char host[32];
  for (int i = 0; i < 2000; i++) {
    snprintf(host, sizeof host, "host-%04d", i);
    tr_prom_sample(&t, "tracerelay_host_connected", host, 1);
  }
  assert_false(t.failed);
  assert_true(t.len > 4096);
  assert_int_equal(strlen(t.buf), t.len);
  assert_non_null(strstr(t.buf, "tracerelay_host_connected{host=\"host-1999\"} 1\n"));
  tr_prom_text_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_family_and_samples),
      cmocka_unit_test(test_label_escaping),
      cmocka_unit_test(test_grows),
      cmocka_unit_test(test_histogram),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
