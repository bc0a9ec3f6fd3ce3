/* test_host_progress.c: the per-host progress text of `tracerelay record` from GetTraceStats
 * replies built as the service builds them (TraceStats bytes followed by our extension, field
 * 1000), from Perfetto's traced (no extension), and from hostile replies; a host with two entries
 * (its agent restarted) counts once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "tools/tracerelay/host_progress.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

typedef Perfetto__Protos__TraceStats__BufferStats BufferStats;

/* GetTraceStatsResponse{1: TraceStats ++ ext}, as service/consumer_port.c writes it. */
static uint8_t *reply(const Perfetto__Protos__TraceStats *st,
                      const Tracerelay__TraceStatsExtension *x, size_t *len) {
  size_t n = perfetto__protos__trace_stats__get_packed_size(st) +
             (x ? tracerelay__trace_stats_extension__get_packed_size(x) : 0);
  uint8_t *buf = malloc(n + 16);
  size_t used = 0;
  buf[used++] = 0x0A;
  for (size_t v = n; ; v >>= 7) {
    buf[used++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    if (v < 0x80)
      break;
  }
  used += perfetto__protos__trace_stats__pack(st, buf + used);
  if (x)
    used += tracerelay__trace_stats_extension__pack(x, buf + used);
  *len = used;
  return buf;
}

static void buffer(BufferStats *b, uint64_t bytes, uint64_t discarded) {
  perfetto__protos__trace_stats__buffer_stats__init(b);
  b->has_bytes_written = b->has_chunks_discarded = 1;
  b->bytes_written = bytes;
  b->chunks_discarded = discarded;
}

static void test_hosts_from_the_extension(void **state) {
  (void)state;
  /* Two TraceConfig buffers; web-1 wrote into both, web-2 into the first only. */
  BufferStats b[3];
  buffer(&b[0], 3u << 20, 0);   /* buffer 0, web-1 */
  buffer(&b[1], 1u << 20, 4);   /* buffer 0, web-2 */
  buffer(&b[2], 512u << 10, 0); /* buffer 1, web-1 */
  BufferStats *bp[] = {&b[0], &b[1], &b[2]};
  Perfetto__Protos__TraceStats st = PERFETTO__PROTOS__TRACE_STATS__INIT;
  st.n_buffer_stats = 3;
  st.buffer_stats = bp;

  Tracerelay__HostStats h[2];
  uint32_t idx1[] = {0, 2}, buf1[] = {0, 1}, idx2[] = {1}, buf2[] = {0};
  for (int i = 0; i < 2; i++)
    tracerelay__host_stats__init(&h[i]);
  h[0].machine_name = "web-1";
  h[0].n_buffer_stats_index = h[0].n_buffer_index = 2;
  h[0].buffer_stats_index = idx1;
  h[0].buffer_index = buf1;
  h[0].has_connected = h[0].connected = 1;
  h[0].has_session_smb_full = 1;
  h[0].session_smb_full = 3; /* loss events, apart from the chunks lost */
  h[0].has_session_smb_full_ms = 1;
  h[0].session_smb_full_ms = 12;
  h[1].machine_name = "web-2";
  h[1].n_buffer_stats_index = h[1].n_buffer_index = 1;
  h[1].buffer_stats_index = idx2;
  h[1].buffer_index = buf2;
  h[1].has_connected = 1;
  h[1].connected = 0;
  h[1].has_agent_queue_dropped_chunks = 1;
  h[1].agent_queue_dropped_chunks = 6;
  h[1].has_session_agent_exits_unclean = 1;
  h[1].session_agent_exits_unclean = 1; /* a loss of unknown size, named, not added */
  h[0].has_session_stops_timed_out = 1;
  h[0].session_stops_timed_out = 2; /* likewise */
  Tracerelay__HostStats *hp[] = {&h[0], &h[1]};
  Tracerelay__TraceStatsExtension x = TRACERELAY__TRACE_STATS_EXTENSION__INIT;
  x.n_tracerelay_hosts = 2;
  x.tracerelay_hosts = hp;

  size_t len;
  uint8_t *r = reply(&st, &x, &len);
  char out[256];
  struct host_progress_sum sum = {0};
  assert_int_equal(host_progress_format(r, len, out, sizeof out, &sum), 0);
  assert_int_equal(sum.bytes, (4u << 20) + (512u << 10));
  assert_int_equal(sum.hosts, 2);
  assert_int_equal(sum.lost_chunks, 10);
  assert_int_equal(sum.smb_full, 3);
  assert_int_equal(sum.smb_full_ms, 12);
  assert_string_equal(out, "web-1 3.5 MB (SMB full 3 times, <= 12 ms) (stop timed out: 2)  "
                           "web-2 1.0 MB (10 chunks lost) "
                           "(agent killed: 1) (down)");
  assert_string_equal(sum.agent_crashed, "web-2 (1)");
  assert_string_equal(sum.stop_timed_out, "web-1 (2)");
  assert_string_equal(sum.not_started, "");
  assert_string_equal(sum.down, "web-2");

  /* Cut short: whatever fits, still a string. */
  char small[8];
  assert_int_equal(host_progress_format(r, len, small, sizeof small, &sum), 0);
  assert_int_equal(strlen(small), sizeof small - 1);
  free(r);

  /* An index past buffer_stats and a name that is not a machine name: ignored, not trusted. */
  idx2[0] = 7;
  h[1].machine_name = "\x1b[2Jevil";
  r = reply(&st, &x, &len);
  assert_int_equal(host_progress_format(r, len, out, sizeof out, &sum), 0);
  assert_string_equal(out, "web-1 3.5 MB (SMB full 3 times, <= 12 ms) (stop timed out: 2)  "
                           "? 0.0 MB (6 chunks lost) "
                           "(agent killed: 1) (down)");
  assert_string_equal(sum.agent_crashed, "? (1)");
  free(r);
}

/* A host whose agent restarted during the session (a regional's own agent restarts with it) has
 * two entries, the retired one (down) and the new one: one machine, not two, up, and its
 * host-wide losses (5 chunks the agent dropped, in both entries) counted once. */
static void test_a_restarted_agent_is_one_host(void **state) {
  (void)state;
  Perfetto__Protos__TraceStats st = PERFETTO__PROTOS__TRACE_STATS__INIT;
  Tracerelay__HostStats h[4];
  const char *names[] = {"web-1", "regional-1", "web-2", "regional-1"};
  Tracerelay__HostStats *hp[4];
  for (int i = 0; i < 4; i++) {
    tracerelay__host_stats__init(&h[i]);
    h[i].machine_name = (char *)names[i];
    h[i].has_connected = 1;
    h[i].connected = i != 1; /* the retired entry */
    hp[i] = &h[i];
  }
  h[1].has_agent_queue_dropped_chunks = h[3].has_agent_queue_dropped_chunks = 1;
  h[1].agent_queue_dropped_chunks = h[3].agent_queue_dropped_chunks = 5;
  Tracerelay__TraceStatsExtension x = TRACERELAY__TRACE_STATS_EXTENSION__INIT;
  x.n_tracerelay_hosts = 4;
  x.tracerelay_hosts = hp;
  size_t len;
  uint8_t *r = reply(&st, &x, &len);
  char out[256];
  struct host_progress_sum sum = {0};
  assert_int_equal(host_progress_format(r, len, out, sizeof out, &sum), 0);
  assert_int_equal(sum.hosts, 3);
  assert_int_equal(sum.lost_chunks, 5);
  assert_string_equal(sum.down, "");
  assert_null(strstr(out, "(down)"));
  free(r);
}

static void test_traced_has_no_hosts(void **state) {
  (void)state;
  BufferStats b;
  buffer(&b, 2u << 20, 0);
  BufferStats *bp[] = {&b};
  Perfetto__Protos__TraceStats st = PERFETTO__PROTOS__TRACE_STATS__INIT;
  st.n_buffer_stats = 1;
  st.buffer_stats = bp;
  size_t len;
  uint8_t *r = reply(&st, NULL, &len);
  char out[64] = "stale";
  struct host_progress_sum sum = {0};
  assert_int_equal(host_progress_format(r, len, out, sizeof out, &sum), 0);
  assert_int_equal(sum.bytes, 2u << 20);
  assert_int_equal(sum.hosts, 0);
  assert_string_equal(out, "");
  free(r);
}

static void test_garbage_is_refused(void **state) {
  (void)state;
  static const uint8_t junk[] = {0x0A, 0x05, 0xff, 0xff};
  char out[64] = "kept";
  struct host_progress_sum sum = {.bytes = 99};
  assert_int_equal(host_progress_format(junk, sizeof junk, out, sizeof out, &sum), -1);
  assert_string_equal(out, "kept");
  assert_int_equal(sum.bytes, 99);
  assert_int_equal(host_progress_format(NULL, 0, out, sizeof out, &sum), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hosts_from_the_extension),
      cmocka_unit_test(test_a_restarted_agent_is_one_host),
      cmocka_unit_test(test_traced_has_no_hosts),
      cmocka_unit_test(test_garbage_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
