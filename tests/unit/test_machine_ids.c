/* test_machine_ids.c: two hosts whose names hash alike get ids of their own (issue 39 item 4):
 * the host table's trace names (service/machine_ids.h), on names found to collide. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/clock/clock.h"
#include "service/hosts.h"
#include "service/machine_ids.h"

/* Found by a birthday search over "host-N" / "gc-N": the same low 32 bits of FNV-1a
 * (machine_id; and so the same global clock ids too, as FNV's low bits depend on low bits
 * only), and the same global BOOTTIME clock id for machine ids that differ (in bit 31, which
 * a global id does not keep). */
#define MID_A "host-1222881"
#define MID_B "host-1414990"
#define GC_A "gc-215768"
#define GC_B "gc-1038902"

static void test_the_names_collide(void **state) {
  (void)state;
  assert_int_equal(tr_machine_id(MID_A), tr_machine_id(MID_B));
  assert_int_equal(tr_global_clock_id(GC_A, "BOOTTIME"), tr_global_clock_id(GC_B, "BOOTTIME"));
  assert_int_not_equal(tr_machine_id(GC_A), tr_machine_id(GC_B));
}

/* Every id of the host's trace name: its machine_id, then its six global clock ids. */
static void ids_of(const tr_host *h, uint32_t out[1 + TR_CLOCK_SNAPSHOT_MAX]) {
  out[0] = h->machine_id;
  for (uint32_t k = 0; k < TR_CLOCK_SNAPSHOT_MAX; k++)
    out[1 + k] = tr_global_clock_id(h->trace_name, tr_clock_name(TR_CLOCK_REALTIME + k));
}

static int cmp_u32(const void *p, const void *q) {
  uint32_t u = *(const uint32_t *)p, v = *(const uint32_t *)q;
  return u < v ? -1 : u > v;
}

static void assert_apart(const tr_host *a, const tr_host *b) {
  uint32_t x[1 + TR_CLOCK_SNAPSHOT_MAX], y[1 + TR_CLOCK_SNAPSHOT_MAX];
  ids_of(a, x);
  ids_of(b, y);
  assert_int_not_equal(x[0], y[0]);
  for (size_t i = 1; i < 1 + TR_CLOCK_SNAPSHOT_MAX; i++)
    for (size_t j = 1; j < 1 + TR_CLOCK_SNAPSHOT_MAX; j++)
      assert_int_not_equal(x[i], y[j]);
}

/* The first comes keeps its name; the second is NAME#1, its machine_id derived from that. */
static void check_pair(const char *first, const char *second) {
  tr_hosts *hs;
  tr_host *a, *b, *again;
  assert_int_equal(tr_hosts_new(NULL, NULL, &hs), 0);
  assert_int_equal(tr_hosts_get(hs, first, &a), 0);
  assert_int_equal(tr_hosts_get(hs, second, &b), 0);
  assert_string_equal(a->trace_name, first);
  assert_int_equal(a->machine_id, tr_machine_id(first));
  char want[TR_MACHINE_IDS_NAME_MAX + 1];
  snprintf(want, sizeof want, "%s#1", second);
  assert_string_equal(b->trace_name, want);
  assert_string_equal(b->name, second);
  assert_int_equal(b->machine_id, tr_machine_id(want));
  assert_apart(a, b);
  /* Stable: the host found again keeps what it was given. */
  assert_int_equal(tr_hosts_get(hs, second, &again), 0);
  assert_ptr_equal(again, b);
  assert_string_equal(again->trace_name, want);
  tr_hosts_free(hs);
}

static void test_machine_id_collision(void **state) {
  (void)state;
  check_pair(MID_A, MID_B);
  check_pair(MID_B, MID_A); /* decided by arrival */
}

static void test_global_clock_collision(void **state) {
  (void)state;
  check_pair(GC_A, GC_B);
}

/* A name whose plain ids are free keeps its name, even after others were salted; every id
 * of 20,000 hosts is unique. */
static void test_many_hosts_all_apart(void **state) {
  (void)state;
  enum { N = 20000 };
  tr_hosts *hs;
  assert_int_equal(tr_hosts_new(NULL, NULL, &hs), 0);
  tr_host *h;
  assert_int_equal(tr_hosts_get(hs, MID_A, &h), 0);
  assert_int_equal(tr_hosts_get(hs, MID_B, &h), 0);
  assert_int_equal(tr_hosts_get(hs, "web-1", &h), 0);
  assert_string_equal(h->trace_name, "web-1");
  uint32_t *mids = malloc(N * sizeof *mids), *clocks = malloc(N * 6 * sizeof *clocks);
  assert_non_null(mids);
  assert_non_null(clocks);
  size_t n = 0;
  tr_hosts_set_max_gone(hs, N); /* all kept: none of them ever connects */
  for (int i = 0; i < N - 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "n%d", i);
    assert_int_equal(tr_hosts_get(hs, name, &h), 0);
  }
  for (tr_host *x = tr_hosts_first(hs); x != NULL; x = x->next, n++) {
    uint32_t ids[1 + TR_CLOCK_SNAPSHOT_MAX];
    ids_of(x, ids);
    mids[n] = ids[0];
    memcpy(&clocks[6 * n], &ids[1], 6 * sizeof *clocks);
  }
  assert_int_equal(n, N);
  qsort(mids, N, sizeof *mids, cmp_u32);
  for (size_t i = 1; i < N; i++)
    assert_int_not_equal(mids[i - 1], mids[i]);
  qsort(clocks, 6 * N, sizeof *clocks, cmp_u32);
  for (size_t i = 1; i < 6 * N; i++)
    assert_int_not_equal(clocks[i - 1], clocks[i]);
  free(mids);
  free(clocks);
  tr_hosts_free(hs);
}

/* Released ids are free again: the next claim of the same name keeps it. */
static void test_release(void **state) {
  (void)state;
  tr_machine_ids ids = {0};
  char a[TR_MACHINE_IDS_NAME_MAX + 1], b[TR_MACHINE_IDS_NAME_MAX + 1], c[TR_MACHINE_IDS_NAME_MAX + 1];
  uint32_t ma, mb, mc;
  const char *with;
  assert_int_equal(tr_machine_ids_claim(&ids, MID_A, a, &ma, &with), 0);
  assert_null(with);
  assert_int_equal(tr_machine_ids_claim(&ids, MID_B, b, &mb, &with), 0);
  assert_ptr_equal(with, a);
  assert_string_equal(b, MID_B "#1");
  tr_machine_ids_release(&ids, a);
  assert_int_equal(tr_machine_ids_claim(&ids, MID_A, c, &mc, &with), 0);
  assert_null(with);
  assert_string_equal(c, MID_A);
  assert_int_equal(mc, ma);
  char too_long[TR_MACHINE_IDS_NAME_MAX + 5];
  memset(too_long, 'x', sizeof too_long - 1);
  too_long[sizeof too_long - 1] = 0;
  assert_int_equal(tr_machine_ids_claim(&ids, too_long, c, &mc, NULL), TR_ERR_INVAL);
  tr_machine_ids_free(&ids);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_names_collide),
      cmocka_unit_test(test_machine_id_collision),
      cmocka_unit_test(test_global_clock_collision),
      cmocka_unit_test(test_many_hosts_all_apart),
      cmocka_unit_test(test_release),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
