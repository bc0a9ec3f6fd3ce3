/* test_host_retire.c: the host table does not grow without end (service/hosts.c). Many distinct
 * hosts connecting and going away, as names minted by a regional allowed `eu-*` or an
 * autoscaled fleet would, leave at most the gone hosts it keeps (the longest gone retired
 * first, counted, their machine ids free again); a host a session holds is never retired while
 * it does, however long gone, and is once the session is freed; a retired host's guests go
 * with it. Driven on session_fixture.h's service state, whose sessions answer holds_host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "service/hosts.h"
#include "session_fixture.h"

#define KEPT 4

static int fake_peer;

/* A new host called eu-N connects and goes away, as its agent would. */
static tr_host *come_and_go(unsigned n) {
  char name[32];
  tr_host *h;
  snprintf(name, sizeof name, "eu-%u", n);
  assert_int_equal(tr_hosts_get(fx_host_table, name, &h), 0);
  tr_hosts_link_up(h, (tr_link_peer *)&fake_peer, tr_clock_boottime_ns(), NULL);
  tr_session_link_events.host_connected(&fx_svc, h);
  tr_hosts_link_down(h);
  tr_session_link_events.host_disconnected(&fx_svc, h, "test");
  return h;
}

static size_t gone_count(void) {
  size_t n = 0;
  for (const tr_host *h = tr_hosts_first(fx_host_table); h; h = h->next)
    n += h->link == NULL;
  return n;
}

static void test_table_stays_bounded(void **state) {
  (void)state;
  fx_setup();
  tr_hosts_set_max_gone(fx_host_table, KEPT);
  fx_make_host(0, "steady", 0, NULL);
  fx_link_up(0);
  for (unsigned n = 1; n <= 1000; n++) {
    come_and_go(n);
    assert_true(tr_hosts_count(fx_host_table) <= KEPT + 1); /* the gone ones and "steady" */
  }
  assert_int_equal(tr_hosts_count(fx_host_table), KEPT + 1);
  assert_int_equal(gone_count(), KEPT);
  assert_int_equal(tr_hosts_retired(fx_host_table), 1000 - KEPT);
  /* The longest gone went first: the last KEPT are kept, the connected one too. */
  assert_non_null(tr_hosts_find(fx_host_table, "steady"));
  assert_null(tr_hosts_find(fx_host_table, "eu-1"));
  assert_null(tr_hosts_find(fx_host_table, "eu-996"));
  assert_non_null(tr_hosts_find(fx_host_table, "eu-997"));
  assert_non_null(tr_hosts_find(fx_host_table, "eu-1000"));
  /* A retired host that comes back is a new entry, its machine id its own name's again (the
   * retired entry released it: a claim still held would make it "eu-1#2"). */
  tr_host *back = come_and_go(1);
  assert_string_equal(back->trace_name, "eu-1");
  assert_int_equal(back->stats.disconnects, 1);
  fx_teardown();
}

static void test_host_in_a_session_is_never_retired(void **state) {
  static const char *const kTrackEvent[][3] = {{"track_event", NULL}};
  const char *const names[] = {"track_event", NULL};
  struct fx_config cfg;
  (void)state;
  fx_setup();
  tr_hosts_set_max_gone(fx_host_table, KEPT);
  fx_make_host(0, "held", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, names);
  tr_session *s = fx_enable(&cfg);
  fx_disconnect(0); /* the longest gone from here on */
  /* A running session holds every host that joins it: each of these does, and stays. */
  for (unsigned n = 1; n <= 2 * KEPT; n++)
    come_and_go(n);
  assert_int_equal(tr_hosts_count(fx_host_table), 2 * KEPT + 1);
  assert_int_equal(tr_hosts_retired(fx_host_table), 0);
  /* Stopped (with "held" away, so its stop is owed), it takes no new host; the hosts it
   * holds stay while it is not freed. */
  tr_session_disable(s);
  for (unsigned n = 100; n < 300; n++)
    come_and_go(n);
  assert_ptr_equal(tr_hosts_find(fx_host_table, "held"), fx_hosts[0]);
  assert_non_null(tr_hosts_find(fx_host_table, "eu-1"));
  assert_int_equal(tr_hosts_count(fx_host_table), 2 * KEPT + 1 + 1); /* + the newest */
  assert_int_equal(tr_hosts_retired(fx_host_table), 200 - 1);
  /* Freed, the session holds its hosts no more: the longest gone go, but for "held", which
   * still owes a stop its agent never got (session_unstopped.c asks again if it is back). */
  tr_session_free(s);
  come_and_go(300);
  assert_ptr_equal(tr_hosts_find(fx_host_table, "held"), fx_hosts[0]);
  assert_null(tr_hosts_find(fx_host_table, "eu-1"));
  assert_int_equal(tr_hosts_count(fx_host_table), KEPT);
  fx_teardown();
}

static void test_guests_go_with_their_host(void **state) {
  Tracerelay__GuestMachine g = TRACERELAY__GUEST_MACHINE__INIT;
  tr_host *guest;
  bool joined;
  (void)state;
  fx_setup();
  tr_hosts_set_max_gone(fx_host_table, 1);
  fx_make_host(0, "vmhost", 0, NULL);
  fx_link_up(0);
  g.guest_id = 1;
  g.name = "vm1";
  assert_int_equal(tr_hosts_guest_join(fx_host_table, fx_hosts[0], &g, &guest, &joined), 0);
  assert_non_null(tr_hosts_find(fx_host_table, "vmhost/vm1"));
  tr_hosts_link_down(fx_hosts[0]);
  tr_hosts_guest_leave(guest);
  come_and_go(1); /* vmhost, the longest gone, makes room */
  assert_null(tr_hosts_find(fx_host_table, "vmhost"));
  assert_null(tr_hosts_find(fx_host_table, "vmhost/vm1"));
  assert_int_equal(tr_hosts_count(fx_host_table), 1);
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_stays_bounded),
      cmocka_unit_test(test_host_in_a_session_is_never_retired),
      cmocka_unit_test(test_guests_go_with_their_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
