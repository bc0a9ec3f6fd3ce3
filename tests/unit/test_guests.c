/* test_guests.c: the guest machine table (relay/producer/guests.h): one guest per key however
 * many connections, names reduced to the machine-name alphabet and made unique, the bound, a
 * guest gone with its last connection, and SyncClock pairs made into exchanges only when an
 * UPDATE follows a PING, with checked clocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "relay/base/tr_error.h"
#include "relay/producer/guests.h"

static void test_identity_and_names(void **state) {
  (void)state;
  tr_guests gs;
  tr_guests_init(&gs);
  uint32_t a, b, c, d;
  bool created;
  assert_int_equal(tr_guests_attach(&gs, "boot|guest1", "guest1", &a, &created), 0);
  assert_true(created);
  assert_int_equal(tr_guests_attach(&gs, "boot|guest1", "guest1", &b, &created), 0);
  assert_false(created);
  assert_int_equal(a, b);
  /* Another key claiming the same name is another guest, with a name of its own. */
  assert_int_equal(tr_guests_attach(&gs, "other|guest1", "guest1", &c, &created), 0);
  assert_int_not_equal(a, c);
  assert_string_equal(tr_guests_find(&gs, c)->name, "guest1-2");
  /* Bytes outside the alphabet become '_'; no claim names it from its key. */
  assert_int_equal(tr_guests_attach(&gs, "k3", "a/b c\n", &d, &created), 0);
  assert_string_equal(tr_guests_find(&gs, d)->name, "a_b_c_");
  assert_int_equal(tr_guests_attach(&gs, "4cd3b2c5-35b0", NULL, &d, &created), 0);
  assert_string_equal(tr_guests_find(&gs, d)->name, "guest-4cd3b2c5");
  assert_int_equal(tr_guests_attach(&gs, "", "x", &d, &created), TR_ERR_INVAL);
  /* Gone with its last connection only; ids are never reused. */
  assert_false(tr_guests_detach(&gs, a));
  assert_true(tr_guests_detach(&gs, a));
  assert_null(tr_guests_find(&gs, a));
  assert_int_equal(tr_guests_attach(&gs, "boot|guest1", "guest1", &b, &created), 0);
  assert_true(created);
  assert_int_not_equal(a, b);
  tr_guests_free(&gs);
}

static void test_bound(void **state) {
  (void)state;
  tr_guests gs;
  tr_guests_init(&gs);
  char key[16];
  uint32_t id;
  bool created;
  for (int i = 0; i < TR_GUESTS_MAX; i++) {
    snprintf(key, sizeof key, "k%d", i);
    assert_int_equal(tr_guests_attach(&gs, key, "same", &id, &created), 0);
  }
  assert_int_equal(tr_guests_attach(&gs, "one-more", "same", &id, &created), TR_ERR_FULL);
  uint8_t big[TR_GUEST_SYSINFO_MAX + 1] = {0};
  assert_int_equal(tr_guests_set_system_info(&gs, id, big, sizeof big), TR_ERR_TOO_BIG);
  assert_int_equal(tr_guests_set_system_info(&gs, id, big, 16), 0);
  assert_int_equal(tr_guests_find(&gs, id)->system_info_len, 16);
  tr_guests_free(&gs);
}

static void test_sync_clock(void **state) {
  (void)state;
  tr_guests gs;
  tr_guests_init(&gs);
  uint32_t id;
  bool created;
  assert_int_equal(tr_guests_attach(&gs, "k", "g", &id, &created), 0);
  struct tr_guest_clock ping[2] = {{6, 1000}, {1, 5}}, update[2] = {{6, 1500}, {1, 9}};
  struct tr_guest_exchange x;
  /* An UPDATE with no PING before it makes nothing. */
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_UPDATE, update, 2, 700, &x), 0);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_PING, ping, 2, 600, &x), 0);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_UPDATE, update, 2, 900, &x), 1);
  assert_int_equal(x.t1, 600);
  assert_int_equal(x.t2, 1500);
  assert_int_equal(x.t3, 1500);
  assert_int_equal(x.t4, 900);
  assert_int_equal(x.num_clocks, 2);
  /* Used once. */
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_UPDATE, update, 2, 950, &x), 0);
  /* No BOOTTIME, a repeated clock, a time out of range: refused, and the pair broken. */
  struct tr_guest_clock no_boot[1] = {{1, 5}}, twice[2] = {{6, 1}, {6, 2}},
                        huge[1] = {{6, 1ull << 62}};
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_PING, ping, 2, 1000, &x), 0);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_UPDATE, no_boot, 1, 1100, &x),
                   TR_ERR_INVAL);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_UPDATE, update, 2, 1200, &x), 0);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_PING, twice, 2, 1300, &x), TR_ERR_INVAL);
  assert_int_equal(tr_guests_sync_clock(&gs, id, TR_GUEST_PING, huge, 1, 1300, &x), TR_ERR_INVAL);
  assert_int_equal(tr_guests_sync_clock(&gs, 999, TR_GUEST_PING, ping, 2, 1300, &x),
                   TR_ERR_NOT_FOUND);
  tr_guests_free(&gs);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_identity_and_names),
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_sync_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
