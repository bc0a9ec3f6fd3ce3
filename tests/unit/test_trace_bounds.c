/* test_trace_bounds.c: reading the hosts' clock error bound tracks back (relay/reading/trace_bounds.h):
 * what the service writes is found under its host, look-alikes are not, and the value at a time
 * is the last sample at or before it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/reading/trace_bounds.h"
#include "relay/trace/trace_writer.h"

typedef Perfetto__Protos__TracePacket Packet;

static Packet *decode(tr_trace_writer_buf *b) {
  Packet *p = perfetto__protos__trace_packet__unpack(NULL, b->len, b->data);
  assert_non_null(p);
  tr_trace_writer_buf_free(b);
  return p;
}

/* Feeds the service's two track descriptors of host and counters at (ts, value) pairs. */
static void add_host(struct tr_trace_bounds *b, const char *host) {
  tr_trace_writer_buf ht, bt;
  assert_int_equal(tr_trace_writer_host_tracks(1, host, &ht, &bt), 0);
  Packet *p = decode(&ht);
  assert_int_equal(tr_trace_bounds_add_track(b, p->track_descriptor), 0);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  p = decode(&bt);
  assert_int_equal(tr_trace_bounds_add_track(b, p->track_descriptor), 0);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void add_sample(struct tr_trace_bounds *b, uint64_t uuid, uint64_t ts, double us) {
  tr_trace_writer_buf c;
  assert_int_equal(tr_trace_writer_counter(1, ts, uuid, us, &c), 0);
  Packet *p = decode(&c);
  assert_int_equal(tr_trace_bounds_add_event(b, p->timestamp, p->track_event), 0);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void test_samples_per_host(void **state) {
  (void)state;
  struct tr_trace_bounds b = {0};
  add_host(&b, "web-1");
  add_host(&b, "web-2");
  assert_int_equal(b.n_tracks, 2); /* the host tracks themselves are not counters */
  add_sample(&b, tr_trace_writer_bound_track_uuid("web-1"), 1000, 5.0);
  add_sample(&b, tr_trace_writer_bound_track_uuid("web-1"), 2000, 3.5);
  add_sample(&b, tr_trace_writer_bound_track_uuid("web-2"), 1500, 9.0);
  add_sample(&b, tr_trace_writer_host_track_uuid("web-1"), 1700, 99.0); /* not a bound track */
  const struct tr_trace_bound_track *w1 = tr_trace_bounds_find(&b, "web-1");
  const struct tr_trace_bound_track *w2 = tr_trace_bounds_find(&b, "web-2");
  assert_non_null(w1);
  assert_non_null(w2);
  assert_null(tr_trace_bounds_find(&b, "web-3"));
  assert_int_equal(w1->n_samples, 2);
  assert_true(w1->max_us == 5.0);
  assert_true(tr_trace_bounds_at(w1, 999) < 0); /* before the first sample */
  assert_true(tr_trace_bounds_at(w1, 1000) == 5.0);
  assert_true(tr_trace_bounds_at(w1, 1999) == 5.0);
  assert_true(tr_trace_bounds_at(w1, 2000) == 3.5);
  assert_true(tr_trace_bounds_at(w1, UINT64_MAX) == 3.5);
  assert_true(tr_trace_bounds_at(w2, 1600) == 9.0);

  /* Link marks: named instants on the host track, not on the bound track. */
  tr_trace_writer_buf m;
  assert_int_equal(tr_trace_writer_instant(1, 2500, tr_trace_writer_host_track_uuid("web-2"),
                                           "disconnected", &m),
                   0);
  Packet *p = decode(&m);
  assert_int_equal(tr_trace_bounds_add_event(&b, p->timestamp, p->track_event), 0);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  assert_int_equal(tr_trace_writer_instant(1, 2600, tr_trace_writer_bound_track_uuid("web-2"),
                                           "reconnected", &m),
                   0);
  p = decode(&m);
  assert_int_equal(tr_trace_bounds_add_event(&b, p->timestamp, p->track_event), 0);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  assert_int_equal(w2->marks_total, 1);
  assert_int_equal(w2->marks[0].ts, 2500);
  assert_string_equal(w2->marks[0].name, "disconnected");
  assert_int_equal(w1->marks_total, 0);
  tr_trace_bounds_free(&b);
}

/* A counter track named like a bound track but with another uuid (or not a counter) is not one. */
static void test_look_alikes_refused(void **state) {
  (void)state;
  struct tr_trace_bounds b = {0};
  Perfetto__Protos__TrackDescriptor td = PERFETTO__PROTOS__TRACK_DESCRIPTOR__INIT;
  Perfetto__Protos__CounterDescriptor cd = PERFETTO__PROTOS__COUNTER_DESCRIPTOR__INIT;
  td.has_uuid = 1;
  td.uuid = 42;
  td.static_or_dynamic_name_case = PERFETTO__PROTOS__TRACK_DESCRIPTOR__STATIC_OR_DYNAMIC_NAME_NAME;
  td.name = "web-1 clock error bound (us)";
  td.counter = &cd;
  assert_int_equal(tr_trace_bounds_add_track(&b, &td), 0);
  td.uuid = tr_trace_writer_bound_track_uuid("web-1");
  td.counter = NULL;
  assert_int_equal(tr_trace_bounds_add_track(&b, &td), 0);
  td.counter = &cd;
  td.name = " clock error bound (us)"; /* no host name */
  assert_int_equal(tr_trace_bounds_add_track(&b, &td), 0);
  assert_int_equal(b.n_tracks, 0);
  td.name = "web-1 clock error bound (us)";
  assert_int_equal(tr_trace_bounds_add_track(&b, &td), 0);
  assert_int_equal(tr_trace_bounds_add_track(&b, &td), 0); /* again: one track */
  assert_int_equal(b.n_tracks, 1);
  tr_trace_bounds_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_samples_per_host),
      cmocka_unit_test(test_look_alikes_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
