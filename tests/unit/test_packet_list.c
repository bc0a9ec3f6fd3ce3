/* test_packet_list.c: the service's packet lists (service/packet_list.h): pushes keep their
 * order, and thinning halves the older half but never drops a pinned packet (the clock anchor
 * the `machines` encoding needs before a host's data). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "service/packet_list.h"

/* A one-byte packet holding v. */
static tr_trace_writer_buf packet(uint8_t v) {
  tr_trace_writer_buf b = {.data = malloc(1), .len = 1};
  assert_non_null(b.data);
  b.data[0] = v;
  return b;
}

static void test_thin_keeps_pinned(void **state) {
  (void)state;
  tr_packet_list l = {0};
  assert_int_equal(tr_packet_list_reserve(&l, 3), 0);
  for (uint8_t v = 0; v < 3; v++)
    tr_packet_list_push(&l, packet(v));
  assert_int_equal(tr_packet_list_reserve(&l, 9), 0); /* grows past its first room */
  tr_packet_list_push_pinned(&l, packet(3));
  for (uint8_t v = 4; v < 12; v++)
    tr_packet_list_push(&l, packet(v));
  /* Older half 0..5: 1 and 5 go, 3 is pinned; the newer half stays whole. */
  tr_packet_list_thin(&l);
  const uint8_t want[] = {0, 2, 3, 4, 6, 7, 8, 9, 10, 11};
  assert_int_equal(l.n, sizeof want);
  for (size_t i = 0; i < l.n; i++)
    assert_int_equal(l.items[i].data[0], want[i]);
  assert_true(l.pinned[2]); /* the pin moved with its packet */
  /* Thinning again still keeps it. */
  tr_packet_list_thin(&l);
  int found = 0;
  for (size_t i = 0; i < l.n; i++)
    found += l.items[i].data[0] == 3;
  assert_int_equal(found, 1);
  tr_packet_list_free(&l);
  assert_int_equal(l.n, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_thin_keeps_pinned),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
