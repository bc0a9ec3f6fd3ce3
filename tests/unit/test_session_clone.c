/* test_session_clone.c: snapshots of a live session (service/session_clone.c) on three hosts,
 * driven through a fake link (session_fixture.h), without processes. Checks that a clone waits
 * for every host's flush and then holds every host's packets while the source goes on (its
 * own packets still there, later ones not in the clone); that transfer_on_clone moves the
 * buffers, leaving the source's empty, and clear_before_clone drops what came before the
 * clone's flush; that a source freed during the flush fails the clone cleanly; the lookup's
 * refusals (name, uid, clones skipped by name) and unique_session_name's refusal; that a clone
 * reserves its buffers in --max-buffer-memory's budget until freed and is refused past it; and
 * the CLONE_SNAPSHOT notification to the consumer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "service/session_priv.h"
#include "session_fixture.h"

#define START TRACERELAY__COMMAND__CMD_START_DATA_SOURCE
#define SETUP TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE
#define FLUSH TRACERELAY__COMMAND__CMD_FLUSH
#define NUM_HOSTS 3

static const char *const kNames[] = {"host-a", "host-b", "host-c"};
static const char *const kTrackEvent[][3] = {{"track_event", NULL}};

static struct {
  int calls;
  tr_session *clone;
  char error[320];
} cloned;

static void on_cloned(void *ud, tr_session *clone, const char *error) {
  (void)ud;
  cloned.calls++;
  cloned.clone = clone;
  snprintf(cloned.error, sizeof cloned.error, "%s", error ? error : "");
}

/* NUM_HOSTS hosts of one track_event producer each, in one started session of cfg. */
static tr_session *started(struct fx_config *cfg, bool transfer, bool clear) {
  const char *const names[] = {"track_event", NULL};
  fx_setup();
  for (size_t i = 0; i < NUM_HOSTS; i++) {
    fx_make_host(i, kNames[i], 1, kTrackEvent);
    fx_connect(i);
  }
  fx_config(cfg, names);
  cfg->buf.has_transfer_on_clone = cfg->buf.transfer_on_clone = transfer;
  cfg->buf.has_clear_before_clone = cfg->buf.clear_before_clone = clear;
  cfg->cfg.unique_session_name = "live";
  tr_session *s = fx_enable(cfg);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, START);
  memset(&cloned, 0, sizeof cloned);
  return s;
}

/* One chunk of one packet {timestamp: ts} from host i's producer into the session's buffer. */
static void put_packet(size_t i, uint32_t chunk_id, uint64_t ts) {
  uint32_t target = 0;
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == SETUP && fx_sent[k].host == fx_hosts[i])
      target = fx_sent[k].target_buffer;
  uint8_t payload[16];
  size_t n = 2;
  payload[1] = 0x40;
  n += tr_varint_put(payload + n, ts);
  payload[0] = (uint8_t)(n - 1);
  Tracerelay__Chunk ch = TRACERELAY__CHUNK__INIT;
  ch.producer_id = 1;
  ch.writer_id = 1;
  ch.chunk_id = chunk_id;
  ch.packet_count = 1;
  ch.target_buffer = target;
  ch.trusted_uid = 1000;
  ch.trusted_pid = 42;
  ch.payload.data = payload;
  ch.payload.len = n;
  tr_session_on_chunk(&fx_svc, fx_hosts[i], &ch);
}

/* Reads s's next pass: how many host packets each host gave (by machine id in the trusted
 * slice, the `machines` timeline) and whether one had timestamp ts. */
static void read_hosts(tr_session *s, size_t per_host[NUM_HOSTS], uint64_t find, bool *found) {
  tr_trace_output *o = tr_session_output(s);
  tr_output_packet p;
  memset(per_host, 0, NUM_HOSTS * sizeof *per_host);
  if (found)
    *found = false;
  assert_int_equal(tr_trace_output_begin(o), 0);
  while (tr_trace_output_next(o, &p) == 1) {
    if (!p.trusted_len)
      continue;
    uint8_t buf[64];
    assert_true(p.len + p.trusted_len <= sizeof buf);
    memcpy(buf, p.data, p.len);
    memcpy(buf + p.len, p.trusted, p.trusted_len);
    Perfetto__Protos__TracePacket *tp =
        perfetto__protos__trace_packet__unpack(NULL, p.len + p.trusted_len, buf);
    assert_non_null(tp);
    for (size_t h = 0; h < NUM_HOSTS; h++)
      per_host[h] += tp->machine_id == fx_hosts[h]->machine_id;
    if (found && tp->timestamp == find)
      *found = true;
    perfetto__protos__trace_packet__free_unpacked(tp, NULL);
  }
  tr_trace_output_reset(o);
}

static struct tr_session_clone_args args(void) {
  return (struct tr_session_clone_args){.consumer_uid = 0};
}

static void test_clone_every_host_at_one_flush(void **state) {
  struct fx_config cfg;
  char err[128];
  (void)state;
  tr_session *s = started(&cfg, false, false);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    put_packet(i, 0, 100 + i);
  struct tr_session_clone_args a = args();
  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  assert_int_equal(fx_count(FX_MAX_HOSTS, FLUSH), NUM_HOSTS);
  fx_answer(0, FLUSH);
  fx_answer(1, FLUSH);
  assert_int_equal(cloned.calls, 0); /* host-c has not flushed yet */
  put_packet(2, 1, 555);             /* what its flush brought */
  fx_answer(2, FLUSH);
  assert_int_equal(cloned.calls, 1);
  tr_session *c = cloned.clone;
  assert_non_null(c);
  assert_true(tr_session_read_only(c));
  assert_int_equal(tr_session_get_state(c), TR_SESSION_STOPPED);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STARTED);
  put_packet(0, 1, 777); /* after the clone: the source's alone */

  size_t n[NUM_HOSTS];
  bool found;
  read_hosts(c, n, 555, &found);
  assert_true(found);
  assert_int_equal(n[0], 1);
  assert_int_equal(n[1], 1);
  assert_int_equal(n[2], 2);
  read_hosts(c, n, 0, NULL);
  assert_int_equal(n[0] + n[1] + n[2], 0); /* read as a stopped session: emptied */
  tr_session_end(s, NULL);
  read_hosts(s, n, 777, &found); /* the source went on and still has all of its own */
  assert_true(found);
  assert_int_equal(n[0], 2);
  assert_int_equal(n[2], 2);

  struct fx_stats st;
  fx_stats(c, &st);
  assert_int_equal(st.ext->n_tracerelay_hosts, NUM_HOSTS);
  assert_int_equal(st.stats->flushes_requested, 1);
  assert_int_equal(st.stats->flushes_succeeded, 1);
  assert_int_equal(st.stats->final_flush_outcome,
                   PERFETTO__PROTOS__TRACE_STATS__FINAL_FLUSH_OUTCOME__FINAL_FLUSH_SUCCEEDED);
  assert_int_equal(st.ext->n_tracerelay_unmatched_data_sources, 0);
  fx_stats_free(&st);
  /* A clone is no source for a clone by name, nor for the unique name's check. */
  assert_ptr_equal(tr_session_named(&fx_svc, "live"), s);
  tr_session_free(c);
  fx_teardown();
}

static void test_transfer_and_clear(void **state) {
  struct fx_config cfg;
  char err[128];
  (void)state;
  tr_session *s = started(&cfg, true, true);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    put_packet(i, 0, 100 + i); /* before the clone: cleared */
  struct tr_session_clone_args a = args();
  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  put_packet(1, 1, 555); /* during its flush: kept */
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, FLUSH);
  tr_session *c = cloned.clone;
  assert_non_null(c);
  for (size_t h = 0; h < NUM_HOSTS; h++)
    assert_null(s->hosts[h].tbufs[0]); /* moved: the source's are empty */
  size_t n[NUM_HOSTS];
  bool found;
  read_hosts(c, n, 555, &found);
  assert_true(found);
  assert_int_equal(n[0] + n[1] + n[2], 1);
  put_packet(1, 2, 999); /* the source takes data again, in a new buffer */
  tr_session_end(s, NULL);
  read_hosts(s, n, 999, &found);
  assert_true(found);
  assert_int_equal(n[1], 1);
  tr_session_free(c);
  fx_teardown();
}

static void test_source_freed_during_flush(void **state) {
  struct fx_config cfg;
  char err[128];
  (void)state;
  tr_session *s = started(&cfg, false, false);
  struct tr_session_clone_args a = args();
  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  tr_session_free(s);
  assert_int_equal(cloned.calls, 1);
  assert_null(cloned.clone);
  assert_string_equal(cloned.error, "the session ended and was freed before its clone was taken");
  fx_teardown();
}

static void test_lookup_and_unique_name(void **state) {
  struct fx_config cfg, again;
  char err[160];
  tr_session *dup = (tr_session *)&err; /* must be reset to NULL by the refusal */
  (void)state;
  tr_session *s = started(&cfg, false, false);
  assert_ptr_equal(tr_session_clone_source(&fx_svc, false, 0, "live", 0, err, sizeof err), s);
  assert_ptr_equal(
      tr_session_clone_source(&fx_svc, true, tr_session_id(s), NULL, 0, err, sizeof err), s);
  assert_null(tr_session_clone_source(&fx_svc, false, 0, "other", 0, err, sizeof err));
  assert_string_equal(err, "Tracing session not found");
  assert_null(tr_session_clone_source(&fx_svc, false, 0, "live", 4242, err, sizeof err));
  assert_string_equal(err, "Not allowed to clone a session from another UID");
  assert_null(tr_session_clone_source(&fx_svc, true, UINT64_MAX, NULL, 0, err, sizeof err));

  const char *const names[] = {"track_event", NULL};
  fx_config(&again, names);
  again.cfg.unique_session_name = "live";
  assert_int_equal(tr_session_enable(&fx_svc, 0, &again.cfg, -1, &fx_observer, NULL, &dup, err,
                                     sizeof err),
                   TR_ERR_CONFIG);
  assert_null(dup);
  assert_string_equal(err, "A trace with this unique session name (live) already exists");
  fx_teardown();
}

/* A clone reserves the buffers it copies in the service's budget until it is freed; one that
 * would pass the budget is refused, saying so. */
static void test_clone_within_the_budget(void **state) {
  struct fx_config cfg;
  char err[128];
  (void)state;
  tr_session *s = started(&cfg, false, false); /* one 1 MiB buffer on each of 3 hosts */
  for (size_t i = 0; i < NUM_HOSTS; i++)
    put_packet(i, 0, 100 + i);
  assert_int_equal(fx_svc.buffer_memory_reserved, 3u << 20);
  tr_session_service_set_max_buffer_memory(&fx_svc, 7u << 20);
  struct tr_session_clone_args a = args();
  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, FLUSH);
  tr_session *first = cloned.clone;
  assert_non_null(first);
  assert_int_equal(fx_svc.buffer_memory_reserved, 6u << 20);

  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, FLUSH);
  assert_null(cloned.clone);
  assert_string_equal(cloned.error,
                      "the clone's copy of the session's central buffers (3 MiB) with the 6 MiB "
                      "the sessions and clones reserve would pass --max-buffer-memory 7 MiB: "
                      "free a session or a clone, or raise --max-buffer-memory");
  assert_int_equal(fx_svc.buffer_memory_reserved, 6u << 20);

  tr_session_free(first); /* gives its 3 MiB back: a clone fits again */
  assert_int_equal(fx_svc.buffer_memory_reserved, 3u << 20);
  assert_int_equal(tr_session_clone_start(s, &a, on_cloned, NULL, err, sizeof err), 0);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, FLUSH);
  assert_non_null(cloned.clone);
  tr_session_free(cloned.clone);
  assert_int_equal(fx_svc.buffer_memory_reserved, 3u << 20);
  fx_teardown();
}

static void test_clone_trigger_hit(void **state) {
  struct fx_config cfg;
  (void)state;
  tr_session *s = started(&cfg, false, false);
  struct tr_session_clone_trigger t = {.trigger_name = "snap", .producer_name = "app",
                                       .producer_uid = 1000, .boot_time_ns = 5, .delay_ms = 10};
  tr_session_clone_trigger_hit(s, &t);
  assert_int_equal(fx_observed.clone_triggers, 1);
  assert_int_equal(fx_observed.clone_trigger_session, tr_session_id(s));
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_clone_every_host_at_one_flush),
      cmocka_unit_test(test_transfer_and_clear),
      cmocka_unit_test(test_source_freed_during_flush),
      cmocka_unit_test(test_lookup_and_unique_name),
      cmocka_unit_test(test_clone_within_the_budget),
      cmocka_unit_test(test_clone_trigger_hit),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
