/* test_hostport.c: the one parser of --service and --listen (relay/base/hostport.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "relay/base/hostport.h"
#include "relay/base/tr_error.h"

static void ok(const char *s, bool listen, const char *host, unsigned port) {
  struct tr_hostport hp;
  assert_int_equal(tr_hostport_parse(s, listen, &hp), 0);
  assert_string_equal(hp.host, host);
  assert_int_equal(hp.port, port);
}

static void bad(const char *s, bool listen) {
  struct tr_hostport hp;
  assert_int_equal(tr_hostport_parse(s, listen, &hp), TR_ERR_CONFIG);
}

static void test_forms(void **state) {
  (void)state;
  ok("relay.example:7000", false, "relay.example", 7000);
  ok("relay.example", false, "relay.example", TR_HOSTPORT_DEFAULT);
  ok("[::1]:9", false, "::1", 9);
  ok("[fe80::1]", false, "fe80::1", TR_HOSTPORT_DEFAULT);
  ok("0.0.0.0:0", true, "0.0.0.0", 0);   /* listen: any port */
  ok("::", true, "::", TR_HOSTPORT_DEFAULT); /* listen: a bare IPv6 address */
}

static void test_refused(void **state) {
  (void)state;
  bad("localhost:99999", false);
  bad("localhost:99999", true);
  bad("localhost:0", false);
  bad("localhost:", false);
  bad("localhost:+7", false);
  bad("localhost:7x", false);
  bad(":7393", false);
  bad("", true);
  bad("[::1", false);
  bad("[::1]x", false);
  bad("::1", false); /* needs brackets to be a --service */
  char longname[300];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  bad(longname, false);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_forms),
      cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
