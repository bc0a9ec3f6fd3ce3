/* test_relay_allow.c: the root's rules of which regional may relay which hosts
 * (service/relay_allow.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "service/relay_allow.h"

static void test_rules_bound_names(void **state) {
  (void)state;
  tr_relay_allow a = {0};
  const char *why = NULL;
  assert_int_equal(tr_relay_allow_add(&a, "regional-eu=eu-*,edge-[0-9]", &why), 0);
  assert_int_equal(tr_relay_allow_add(&a, "regional-us=us-web-1", &why), 0);
  assert_true(tr_relay_allow_permits(&a, "regional-eu", "eu-web-1"));
  assert_true(tr_relay_allow_permits(&a, "regional-eu", "edge-7"));
  assert_true(tr_relay_allow_permits(&a, "regional-us", "us-web-1"));
  /* another region's hosts, a prefix of a regional's name, no rule at all */
  assert_false(tr_relay_allow_permits(&a, "regional-eu", "us-web-1"));
  assert_false(tr_relay_allow_permits(&a, "regional-us", "us-web-2"));
  assert_false(tr_relay_allow_permits(&a, "regional", "eu-web-1"));
  assert_false(tr_relay_allow_permits(&a, "regional-eu2", "eu-web-1"));
  assert_false(tr_relay_allow_permits(&a, "us-web-1", "us-web-1"));
  assert_false(tr_relay_allow_permits(&a, "regional-eu", "edge-10"));
  tr_relay_allow none = {0};
  assert_false(tr_relay_allow_permits(&none, "regional-eu", "eu-web-1"));
}

static void test_bad_rules_refused(void **state) {
  (void)state;
  tr_relay_allow a = {0};
  const char *why = NULL;
  static const char *const bad[] = {"regional-eu", "=eu-*", "regional eu=eu-*", "regional-eu=",
                                    "regional-eu=eu-*,", "regional-eu=,eu-*", "r=a,,b"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    why = NULL;
    assert_int_equal(tr_relay_allow_add(&a, bad[i], &why), -1);
    assert_non_null(why);
  }
  assert_int_equal(a.n, 0);
  static char longpat[300] = "r=";
  for (int i = 2; i < 299; i++)
    longpat[i] = '*';
  assert_int_equal(tr_relay_allow_add(&a, longpat, &why), -1);
  for (int i = 0; i < TR_RELAY_ALLOW_MAX; i++)
    assert_int_equal(tr_relay_allow_add(&a, "r=x", &why), 0);
  assert_int_equal(tr_relay_allow_add(&a, "r=x", &why), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rules_bound_names),
      cmocka_unit_test(test_bad_rules_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
