/* test_trace_writer.c: the service's own packets (relay/trace/trace_writer.h) decode as Perfetto
 * TracePackets with the service's trusted fields, and the record framing is `0x0A varint`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/base/fnv1a.h"
#include "relay/trace/trace_writer.h"

typedef Perfetto__Protos__TracePacket Packet;

static Packet *decode(tr_trace_writer_buf *b) {
  Packet *p = perfetto__protos__trace_packet__unpack(NULL, b->len, b->data);
  assert_non_null(p);
  tr_trace_writer_buf_free(b);
  return p;
}

static void check_service_header(const Packet *p, int32_t uid) {
  assert_true(p->has_trusted_uid);
  assert_int_equal(p->trusted_uid, uid);
  assert_true(p->has_trusted_packet_sequence_id);
  assert_int_equal(p->trusted_packet_sequence_id, 1);
}

static void test_record_header(void **state) {
  uint8_t h[TR_TRACE_WRITER_RECORD_HEADER_MAX];
  (void)state;
  assert_int_equal(tr_trace_writer_record_header(5, h), 2);
  assert_int_equal(h[0], 0x0A);
  assert_int_equal(h[1], 5);
  assert_int_equal(tr_trace_writer_record_header(300, h), 3);
  assert_int_equal(h[1], 0xAC);
  assert_int_equal(h[2], 0x02);
}

static void test_clock_snapshot(void **state) {
  struct tr_clock_snapshot snap;
  tr_trace_writer_buf b;
  (void)state;
  assert_int_equal(tr_clock_snapshot(&snap), 0);
  assert_int_equal(tr_trace_writer_clock_snapshot(1234, &snap, &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 1234);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT);
  assert_int_equal(p->clock_snapshot->n_clocks, TR_CLOCK_SNAPSHOT_MAX);
  assert_int_equal(p->clock_snapshot->clocks[0]->clock_id, TR_CLOCK_BOOTTIME);
  assert_int_equal(p->clock_snapshot->clocks[0]->timestamp, snap.clocks[0].ts_ns);
  assert_int_equal(p->clock_snapshot->primary_trace_clock,
                   PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void test_sync_marker_and_uuid(void **state) {
  tr_trace_writer_buf b;
  (void)state;
  assert_int_equal(tr_trace_writer_sync_marker(0, 77, &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 0);
  assert_int_equal(p->timestamp, 77);
  assert_int_equal(p->synchronization_marker.len, 16);
  assert_memory_equal(p->synchronization_marker.data, tr_trace_writer_sync_marker_uuid, 16);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);

  assert_int_equal(tr_trace_writer_trace_uuid(0, -5, 9, &b), 0);
  p = decode(&b);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_UUID);
  assert_int_equal(p->trace_uuid->msb, -5);
  assert_int_equal(p->trace_uuid->lsb, 9);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void test_trace_config_keeps_unknown_fields(void **state) {
  /* TraceConfig {3: duration_ms 1000, 999: varint 7 (unknown to us)} */
  const uint8_t raw[] = {0x18, 0xe8, 0x07, 0xb8, 0x3e, 0x07};
  Perfetto__Protos__TraceConfig *cfg = perfetto__protos__trace_config__unpack(NULL, sizeof raw, raw);
  tr_trace_writer_buf b;
  (void)state;
  assert_non_null(cfg);
  assert_int_equal(tr_trace_writer_trace_config(0, cfg, &b), 0);
  assert_non_null(memmem(b.data, b.len, raw + 3, 3)); /* the unknown field survived */
  Packet *p = decode(&b);
  assert_int_equal(p->trace_config->duration_ms, 1000);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  perfetto__protos__trace_config__free_unpacked(cfg, NULL);
}

static void test_system_info(void **state) {
  Perfetto__Protos__SystemInfo *si;
  tr_trace_writer_buf b;
  (void)state;
  assert_int_equal(tr_trace_writer_local_system_info("web-3", &si), 0);
  assert_true(si->num_cpus >= 1);
  assert_non_null(si->utsname->sysname);
  assert_int_equal(tr_trace_writer_system_info(0, si, tr_machine_id("web-3"), &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 0);
  assert_true(p->has_machine_id);
  assert_int_equal(p->machine_id, tr_machine_id("web-3"));
  assert_string_equal(p->system_info->machine_name, "web-3");
  perfetto__protos__trace_packet__free_unpacked(p, NULL);

  assert_int_equal(tr_trace_writer_system_info(0, si, 0, &b), 0); /* the service machine */
  p = decode(&b);
  assert_false(p->has_machine_id);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  perfetto__protos__system_info__free_unpacked(si, NULL);
}

static void test_service_events(void **state) {
  static const struct {
    enum tr_trace_writer_event ev;
    Perfetto__Protos__TracingServiceEvent__EventTypeCase expect;
  } cases[] = {
      {TR_TW_TRACING_STARTED, PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_TRACING_STARTED},
      {TR_TW_ALL_DATA_SOURCES_STARTED,
       PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_ALL_DATA_SOURCES_STARTED},
      {TR_TW_FLUSH_STARTED, PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_FLUSH_STARTED},
      {TR_TW_ALL_DATA_SOURCES_FLUSHED,
       PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_ALL_DATA_SOURCES_FLUSHED},
      {TR_TW_TRACING_DISABLED, PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_TRACING_DISABLED},
      {TR_TW_READ_TRACING_BUFFERS_COMPLETED,
       PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_READ_TRACING_BUFFERS_COMPLETED},
      {TR_TW_CLONE_STARTED, PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_CLONE_STARTED},
  };
  (void)state;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tr_trace_writer_buf b;
    assert_int_equal(tr_trace_writer_service_event(5, 1000 + i, cases[i].ev, &b), 0);
    Packet *p = decode(&b);
    check_service_header(p, 5);
    assert_int_equal(p->timestamp, 1000 + i);
    assert_int_equal(p->service_event->event_type_case, cases[i].expect);
    assert_true(p->service_event->tracing_started); /* the oneof's bool is true */
    perfetto__protos__trace_packet__free_unpacked(p, NULL);
  }
}

/* What a clone carries of its cloning: buffer_cloned with the buffer's index, and the
 * CLONE_SNAPSHOT trigger it was taken for, as traced writes them. */
static void test_clone_packets(void **state) {
  (void)state;
  tr_trace_writer_buf b;
  assert_int_equal(tr_trace_writer_buffer_cloned(5, 777, 3, &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 5);
  assert_int_equal(p->timestamp, 777);
  assert_int_equal(p->service_event->event_type_case,
                   PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_BUFFER_CLONED);
  assert_int_equal(p->service_event->buffer_cloned, 3);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);

  assert_int_equal(tr_trace_writer_clone_trigger(5, 888, "snap", "app", 1000, 250, &b), 0);
  p = decode(&b);
  check_service_header(p, 5);
  assert_int_equal(p->timestamp, 888);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_CLONE_SNAPSHOT_TRIGGER);
  assert_string_equal(p->clone_snapshot_trigger->trigger_name, "snap");
  assert_string_equal(p->clone_snapshot_trigger->producer_name, "app");
  assert_int_equal(p->clone_snapshot_trigger->trusted_producer_uid, 1000);
  assert_int_equal(p->clone_snapshot_trigger->stop_delay_ms, 250);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

/* The service's track and an instant on it: what the UI shows as "host web-2 disconnected". */
static void test_service_track_and_instant(void **state) {
  (void)state;
  tr_trace_writer_buf b;
  assert_int_equal(tr_trace_writer_service_track(9, &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 9);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_DESCRIPTOR);
  assert_int_equal(p->track_descriptor->uuid, TR_TRACE_WRITER_SERVICE_TRACK_UUID);
  assert_string_equal(p->track_descriptor->name, "tracerelay service");
  assert_false(p->has_timestamp);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);

  assert_int_equal(tr_trace_writer_instant(9, 123456789, TR_TRACE_WRITER_SERVICE_TRACK_UUID,
                                           "host web-2 disconnected", &b),
                   0);
  p = decode(&b);
  check_service_header(p, 9);
  assert_int_equal(p->timestamp, 123456789);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT);
  assert_int_equal(p->track_event->type, PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_INSTANT);
  assert_int_equal(p->track_event->track_uuid, TR_TRACE_WRITER_SERVICE_TRACK_UUID);
  assert_string_equal(p->track_event->name, "host web-2 disconnected");
  assert_false(p->has_sequence_flags); /* no incremental state: no interning, absolute time */
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

/* A host's track, its clock error bound counter track under it, and a sample on that: the
 * uuids differ per host and between the two tracks, the counter carries its value in us. */
static void test_host_tracks_and_counter(void **state) {
  (void)state;
  tr_trace_writer_buf host, bound;
  assert_int_equal(tr_trace_writer_host_tracks(9, "web-1", &host, &bound), 0);
  Packet *p = decode(&host);
  check_service_header(p, 9);
  assert_int_equal(p->track_descriptor->uuid, tr_trace_writer_host_track_uuid("web-1"));
  assert_false(p->track_descriptor->has_parent_uuid);
  assert_null(p->track_descriptor->counter);
  assert_string_equal(p->track_descriptor->name, "host web-1");
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  p = decode(&bound);
  assert_int_equal(p->track_descriptor->uuid, tr_trace_writer_bound_track_uuid("web-1"));
  assert_int_equal(p->track_descriptor->parent_uuid, tr_trace_writer_host_track_uuid("web-1"));
  assert_non_null(p->track_descriptor->counter);
  assert_string_equal(p->track_descriptor->counter->unit_name, "us");
  assert_string_equal(p->track_descriptor->name, "web-1 clock error bound (us)");
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  assert_true(tr_trace_writer_host_track_uuid("web-1") != tr_trace_writer_host_track_uuid("web-2"));
  assert_true(tr_trace_writer_bound_track_uuid("web-1") !=
              tr_trace_writer_host_track_uuid("web-1"));

  assert_int_equal(
      tr_trace_writer_counter(9, 5000, tr_trace_writer_bound_track_uuid("web-1"), 2.5, &host), 0);
  p = decode(&host);
  check_service_header(p, 9);
  assert_int_equal(p->timestamp, 5000);
  assert_int_equal(p->track_event->type, PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_COUNTER);
  assert_int_equal(p->track_event->track_uuid, tr_trace_writer_bound_track_uuid("web-1"));
  assert_int_equal(p->track_event->counter_value_field_case,
                   PERFETTO__PROTOS__TRACK_EVENT__COUNTER_VALUE_FIELD_DOUBLE_COUNTER_VALUE);
  assert_true(p->track_event->double_counter_value == 2.5);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

/* The `machines` clock anchor: a timestamp of the host's machine and nothing else, on the
 * service's sequence (trace_processor converts it before any ClockSnapshot of the machine). */
static void test_clock_anchor(void **state) {
  (void)state;
  tr_trace_writer_buf b;
  assert_int_equal(tr_trace_writer_clock_anchor(9, 0x95bfa8f, 7200123456789ull, &b), 0);
  Packet *p = decode(&b);
  check_service_header(p, 9);
  assert_true(p->has_timestamp);
  assert_int_equal(p->timestamp, 7200123456789ull);
  assert_true(p->has_machine_id);
  assert_int_equal(p->machine_id, 0x95bfa8f);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA__NOT_SET);
  assert_false(p->has_timestamp_clock_id); /* the machine's BOOTTIME, as its data */
  assert_null(p->trace_packet_defaults);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void test_trace_stats_with_extension(void **state) {
  Perfetto__Protos__TraceStats st = PERFETTO__PROTOS__TRACE_STATS__INIT;
  /* field 1000 (LEN) holding {1: "h"}: our extension, appended inside TraceStats */
  const uint8_t ext[] = {0xc2, 0x3e, 0x03, 0x0a, 0x01, 'h'};
  tr_trace_writer_buf b;
  (void)state;
  st.has_invalid_packets = 1;
  st.invalid_packets = 3;
  assert_int_equal(tr_trace_writer_trace_stats(0, 42, &st, ext, sizeof ext, &b), 0);
  assert_non_null(memmem(b.data, b.len, ext, sizeof ext));
  Packet *p = decode(&b);
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_STATS);
  assert_int_equal(p->trace_stats->invalid_packets, 3);
  assert_int_equal(p->timestamp, 42);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

static void test_remote_clock_sync(void **state) {
  struct tr_clocksync_sync_pair pair = {100, 5000, 200, 5100};
  tr_trace_writer_buf b;
  (void)state;
  assert_int_equal(tr_trace_writer_remote_clock_sync(0, 77, &pair, &b), 0);
  Packet *p = decode(&b);
  assert_int_equal(p->machine_id, 77);
  assert_false(p->has_trusted_packet_sequence_id); /* as traced writes it */
  assert_int_equal(p->remote_clock_sync->n_synced_clocks, 2);
  assert_int_equal(p->remote_clock_sync->synced_clocks[0]->client_clocks->clocks[0]->timestamp,
                   100);
  assert_int_equal(p->remote_clock_sync->synced_clocks[0]->host_clocks->clocks[0]->timestamp,
                   5000);
  assert_int_equal(p->remote_clock_sync->synced_clocks[1]->client_clocks->clocks[0]->clock_id,
                   TR_CLOCK_BOOTTIME);
  assert_int_equal(p->remote_clock_sync->synced_clocks[1]->host_clocks->clocks[0]->timestamp,
                   5100);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_record_header),
      cmocka_unit_test(test_clock_snapshot),
      cmocka_unit_test(test_sync_marker_and_uuid),
      cmocka_unit_test(test_trace_config_keeps_unknown_fields),
      cmocka_unit_test(test_system_info),
      cmocka_unit_test(test_service_events),
      cmocka_unit_test(test_clone_packets),
      cmocka_unit_test(test_service_track_and_instant),
      cmocka_unit_test(test_host_tracks_and_counter),
      cmocka_unit_test(test_clock_anchor),
      cmocka_unit_test(test_trace_stats_with_extension),
      cmocka_unit_test(test_remote_clock_sync),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
