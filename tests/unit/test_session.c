/* test_session.c: a session's fan-out of its data sources to the producers of every host
 * (service/session.c), driven through the link's callback table and a fake link
 * (session_fixture.h), without processes. Checks that every matching producer of every
 * connected host gets one setup and one start for each matching data source, in the
 * session's one buffer, and nothing else (machine_name_filter honoured); that the consumer
 * hears of each instance and of all started once the last start is answered; that a host
 * connecting after the session started, or a producer appearing later, gets the data sources
 * set up and started, and its chunks land in its own central buffer; that a deferred start
 * waits for tr_session_start; that a stop the agent never confirmed is asked again when
 * the same agent is back; and that a reply, a status or a metrics read looks at its own host's
 * instances only, across an agent's restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "service/hosts.h"
#include "service/session_priv.h"
#include "session_fixture.h"

#define SETUP TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE
#define START TRACERELAY__COMMAND__CMD_START_DATA_SOURCE
#define STOP TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE
#define ANY_HOST FX_MAX_HOSTS

static const char *const kTrackEvent[][3] = {{"track_event", NULL}};

/* The setup command of the instance that a start command starts (same instance id). */
static const struct fx_sent *setup_of(const struct fx_sent *start) {
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == SETUP && fx_sent[k].instance_id == start->instance_id)
      return &fx_sent[k];
  fail_msg("start of instance %llu without its setup", (unsigned long long)start->instance_id);
  return NULL;
}

/* Whether a setup of data source ds went to producer producer_id of host i. */
static bool set_up_on(size_t i, uint32_t producer_id, const char *ds) {
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == SETUP && fx_sent[k].host == fx_hosts[i] &&
        fx_sent[k].producer_id == producer_id && strcmp(fx_sent[k].ds_name, ds) == 0)
      return true;
  return false;
}

static void test_fan_out_to_every_host(void **state) {
  /* host-a: one producer with track_event; host-b: one with "other" only; host-c: two, one
   * with track_event, one with track_event and "other". */
  const char *const a[][3] = {{"track_event", NULL}};
  const char *const b[][3] = {{"other", NULL}};
  const char *const c[][3] = {{"track_event", NULL}, {"track_event", "other", NULL}};
  const char *const names[] = {"track_event", "other@host-c", NULL};
  struct fx_config cfg;
  struct tr_session_host_summary sum;
  tr_session *s;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, a);
  fx_make_host(1, "host-b", 1, b);
  fx_make_host(2, "host-c", 2, c);
  for (size_t i = 0; i < 3; i++)
    fx_connect(i);
  fx_config(&cfg, names);
  s = fx_enable(&cfg);

  /* track_event on a/1, c/1, c/2; "other" on c/2 only: host-b is not in its filter. */
  assert_int_equal(fx_count(ANY_HOST, SETUP), 4);
  assert_true(set_up_on(0, 1, "track_event"));
  assert_true(set_up_on(2, 1, "track_event"));
  assert_true(set_up_on(2, 2, "track_event"));
  assert_true(set_up_on(2, 2, "other"));
  assert_int_equal(fx_count(1, SETUP), 0);
  assert_int_equal(tr_session_num_instances(s), 4);
  assert_true(tr_session_has_host(s, fx_hosts[1])); /* it joined, with nothing to run */

  /* Each instance started once, in the one buffer of the session, with its own id. */
  assert_int_equal(fx_count(ANY_HOST, START), 4);
  for (size_t k = 0; k < fx_num_sent; k++) {
    if (fx_sent[k].what != START)
      continue;
    const struct fx_sent *setup = setup_of(&fx_sent[k]);
    assert_ptr_equal(setup->host, fx_sent[k].host);
    assert_int_equal(setup->producer_id, fx_sent[k].producer_id);
    assert_int_equal(setup->target_buffer, fx_sent[0].target_buffer);
    for (size_t j = 0; j < k; j++)
      assert_true(fx_sent[j].what != START || fx_sent[j].instance_id != fx_sent[k].instance_id);
  }

  /* The consumer hears of each instance, and of all started when the last start is answered. */
  assert_int_equal(fx_observed.instances_set_up, 4);
  fx_answer(0, START);
  assert_int_equal(fx_observed.instances_started, 1);
  assert_int_equal(fx_observed.all_started, 0);
  fx_answer(2, START);
  assert_int_equal(fx_observed.instances_started, 4);
  assert_int_equal(fx_observed.all_started, 1);
  tr_session_stats_host_summary(s, fx_hosts[2], &sum);
  assert_int_equal(sum.instances, 3);
  assert_int_equal(sum.instances_started, 3);
  assert_false(sum.gone);

  /* Disable: one stop per instance, and the end once all answered. */
  tr_session_disable(s);
  assert_int_equal(fx_count(ANY_HOST, STOP), 4);
  fx_answer(0, STOP);
  assert_int_equal(fx_observed.ended, 0);
  fx_answer(2, STOP);
  assert_int_equal(fx_observed.ended, 1);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STOPPED);
  fx_teardown();
}

static void test_host_joining_late(void **state) {
  /* The config names host-b, which is not connected yet when the session starts. */
  const char *const names[] = {"track_event", "other@host-b", NULL};
  const char *const b[][3] = {{"track_event", "other", NULL}};
  const char *unmatched[TR_SESSION_MAX_UNMATCHED];
  struct fx_config cfg;
  struct fx_stats st;
  tr_session *s;
  uint32_t buffer;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_make_host(1, "host-b", 1, b);
  fx_connect(0);
  fx_config(&cfg, names);
  s = fx_enable(&cfg);
  fx_answer(0, START);
  assert_int_equal(fx_observed.all_started, 1);
  assert_int_equal(tr_session_unmatched_machines(s, unmatched, TR_SESSION_MAX_UNMATCHED), 1);
  assert_string_equal(unmatched[0], "host-b");
  assert_int_equal(tr_session_unmatched_data_sources(s, unmatched, TR_SESSION_MAX_UNMATCHED), 1);
  assert_string_equal(unmatched[0], "other");
  assert_false(tr_session_has_host(s, fx_hosts[1]));
  buffer = fx_sent[0].target_buffer;

  /* host-b connects: both data sources set up and started there at once, same buffer. */
  fx_connect(1);
  assert_true(tr_session_has_host(s, fx_hosts[1]));
  assert_int_equal(fx_count(1, SETUP), 2);
  assert_int_equal(fx_count(1, START), 2);
  assert_true(set_up_on(1, 1, "track_event"));
  assert_true(set_up_on(1, 1, "other"));
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == SETUP)
      assert_int_equal(fx_sent[k].target_buffer, buffer);
  assert_int_equal(tr_session_unmatched_machines(s, unmatched, TR_SESSION_MAX_UNMATCHED), 0);
  assert_int_equal(tr_session_unmatched_data_sources(s, unmatched, TR_SESSION_MAX_UNMATCHED), 0);
  fx_answer(1, START);
  assert_int_equal(fx_observed.instances_started, 3);

  /* Its data lands in a central buffer of its own: one buffer_stats entry, host-b's. */
  fx_send_chunk(1, buffer);
  fx_stats(s, &st);
  assert_int_equal(st.stats->n_buffer_stats, 1);
  assert_int_equal(st.stats->buffer_stats[0]->chunks_written, 1);
  assert_int_equal(st.ext->n_tracerelay_hosts, 2);
  assert_string_equal(st.ext->tracerelay_hosts[1]->machine_name, "host-b");
  assert_int_equal(st.ext->tracerelay_hosts[1]->n_buffer_stats_index, 1);
  assert_int_equal(st.ext->tracerelay_hosts[0]->n_buffer_stats_index, 0);
  fx_stats_free(&st);
  fx_teardown();
}

/* Before any host has written into a buffer, the TraceStats still has one entry for it, with
 * its size and nothing written, belonging to no host: traced reports every buffer, and the
 * Perfetto UI's record page shows its "Buffer usage" as used / size over the entries (NaN %
 * with none). Once a host writes, the entry is that host's. */
static void test_stats_before_any_data(void **state) {
  struct fx_config cfg;
  struct fx_stats st;
  tr_session *s;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, (const char *const[]){"track_event", NULL});
  s = fx_enable(&cfg);
  fx_answer(0, START);
  fx_stats(s, &st);
  assert_int_equal(st.stats->n_buffer_stats, 1);
  assert_true(st.stats->buffer_stats[0]->has_buffer_size);
  assert_int_equal(st.stats->buffer_stats[0]->buffer_size, 1024 * 1024);
  assert_int_equal(st.stats->buffer_stats[0]->bytes_written, 0);
  assert_int_equal(st.ext->n_tracerelay_hosts, 1);
  assert_int_equal(st.ext->tracerelay_hosts[0]->n_buffer_stats_index, 0);
  fx_stats_free(&st);

  fx_send_chunk(0, fx_sent[0].target_buffer);
  fx_stats(s, &st);
  assert_int_equal(st.stats->n_buffer_stats, 1);
  assert_int_equal(st.stats->buffer_stats[0]->chunks_written, 1);
  assert_int_equal(st.ext->tracerelay_hosts[0]->n_buffer_stats_index, 1);
  fx_stats_free(&st);
  fx_teardown();
}

static void test_producer_joining_late(void **state) {
  const char *const late[3] = {"track_event", NULL};
  struct fx_config cfg;
  const char *const names[] = {"track_event", NULL};
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, names);
  fx_enable(&cfg);
  assert_int_equal(fx_count(0, START), 1);

  /* A second producer registers on host-a: it is set up and started; the first is not again. */
  fx_add_producer(0, late);
  assert_int_equal(fx_count(0, SETUP), 2);
  assert_int_equal(fx_count(0, START), 2);
  assert_true(set_up_on(0, 2, "track_event"));
  fx_teardown();
}

static void test_deferred_start(void **state) {
  struct fx_config cfg;
  const char *const names[] = {"track_event", NULL};
  tr_session *s;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_make_host(1, "host-b", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, names);
  cfg.cfg.has_deferred_start = cfg.cfg.deferred_start = 1;
  s = fx_enable(&cfg);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_CONFIGURED);
  assert_int_equal(fx_count(0, SETUP), 1);
  assert_int_equal(fx_count(ANY_HOST, START), 0);

  /* A host joining before the start is set up, not started. */
  fx_connect(1);
  assert_int_equal(fx_count(1, SETUP), 1);
  assert_int_equal(fx_count(ANY_HOST, START), 0);

  assert_int_equal(tr_session_start(s), 0);
  assert_int_equal(fx_count(0, START), 1);
  assert_int_equal(fx_count(1, START), 1);
  assert_int_equal(tr_session_start(s), TR_ERR_STATE);
  fx_teardown();
}

/* A stop the agent answers with an error (its producer did not confirm the stop within the
 * agent's timeout) is a loss event like the session's own stop timeout (issue 24 item 7: the
 * session ended without the producer's last data and every count said nothing was lost). */
static void test_unconfirmed_stop_is_counted(void **state) {
  struct fx_config cfg;
  const char *const names[] = {"track_event", NULL};
  struct fx_stats st;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 2, (const char *const[][3]){{"track_event", NULL},
                                                         {"track_event", NULL}});
  fx_connect(0);
  fx_config(&cfg, names);
  tr_session *s = fx_enable(&cfg);
  fx_answer(0, START);
  tr_session_disable(s);
  assert_int_equal(fx_count(0, STOP), 2);
  for (size_t k = 0; k < fx_num_sent; k++) {
    if (fx_sent[k].what != STOP || fx_sent[k].producer_id != 1)
      continue;
    Tracerelay__CommandReply reply = TRACERELAY__COMMAND_REPLY__INIT;
    reply.request_id = fx_sent[k].request_id;
    reply.error = "the producer did not confirm the stop within the timeout";
    fx_sent[k].answered = true;
    tr_session_link_events.command_reply(&fx_svc, fx_hosts[0], &reply);
  }
  fx_answer(0, STOP); /* producer 2 confirms */
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STOPPED);
  fx_stats(s, &st);
  assert_int_equal(st.ext->tracerelay_hosts[0]->session_stops_timed_out, 1);
  fx_stats_free(&st);
  fx_teardown();
}

/* host-a's queue_packets in the session's TraceStats. */
static uint64_t queue_dropped_packets(tr_session *s) {
  struct fx_stats st;
  fx_stats(s, &st);
  assert_int_equal(st.ext->n_tracerelay_hosts, 1);
  uint64_t n = st.ext->tracerelay_hosts[0]->agent_queue_dropped_packets;
  fx_stats_free(&st);
  return n;
}

/* Two sessions on one host: each counts the agent's drops of chunks for its own buffers only,
 * and none from before it began (issue 24 item 2: a probe session's drops on web-1 were counted
 * as lost from the recorded session, more packets than were written to it). */
static void test_losses_are_per_session(void **state) {
  const char *const both[][3] = {{"track_event", "probe", NULL}};
  const char *const traced[] = {"track_event", NULL}, *const probed[] = {"probe", NULL};
  struct fx_config cfg_a, cfg_b;
  struct tr_host_buffer_drops_rec drops[2] = {0};
  tr_host *h;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, both);
  h = fx_hosts[0];
  fx_connect(0);
  /* Dropped before the sessions began: for buffer 1 of an earlier service instance. */
  drops[0] = (struct tr_host_buffer_drops_rec){.global_id = 1, .current.queue_packets = 5};
  h->buffer_drops = drops;
  h->num_buffer_drops = 1;
  fx_config(&cfg_a, traced);
  tr_session *a = fx_enable(&cfg_a);
  uint32_t buffer_a = fx_sent[0].target_buffer;
  assert_int_equal(buffer_a, 1); /* the service's first buffer id, as before its restart */
  fx_config(&cfg_b, probed);
  tr_session *b = fx_enable(&cfg_b);
  uint32_t buffer_b = 0;
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == SETUP)
      buffer_b = fx_sent[k].target_buffer; /* the last setup is b's */
  assert_int_equal(buffer_b, 2);
  assert_int_equal(queue_dropped_packets(a), 0);

  /* The agent reports drops for b's buffer (hosts.c also sums them host-wide). */
  drops[0].current.queue_packets = 5 + 2;
  drops[1] = (struct tr_host_buffer_drops_rec){.global_id = buffer_b, .current.queue_packets = 40};
  h->num_buffer_drops = 2;
  h->stats.agent_queue_dropped_packets = 5 + 2 + 40;
  assert_int_equal(queue_dropped_packets(a), 2);
  assert_int_equal(queue_dropped_packets(b), 40);
  h->buffer_drops = NULL; /* the test's array, not hosts.c's: not for it to free */
  h->num_buffer_drops = 0;
  fx_teardown();
}

/* A host whose agent restarted during the session is listed twice in TraceStats, the retired
 * entry and its successor: each counts the SMB-full events of its own life (3, then 4), so
 * that their sum is the session's (the retired entry used to count the successor's too). */
static void test_restarted_agent_counts_smb_full_once(void **state) {
  struct fx_config cfg;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  tr_host *h = fx_hosts[0];
  fx_connect(0);
  h->stats.agent_smb_full = 2; /* before the session */
  h->stats.agent_smb_full_ns = 2000000;
  fx_config(&cfg, (const char *const[]){"track_event", NULL});
  tr_session *s = fx_enable(&cfg);
  h->stats.agent_smb_full = 2 + 3;
  h->stats.agent_smb_full_ns = 5000000;
  fx_disconnect(0);
  h->agent_instance_id++; /* the agent restarted */
  fx_connect(0);
  h->stats.agent_smb_full = 2 + 3 + 4;
  h->stats.agent_smb_full_ns = 9000000;
  struct fx_stats st;
  fx_stats(s, &st);
  assert_int_equal(st.ext->n_tracerelay_hosts, 2);
  uint64_t events = 0, ms = 0;
  for (size_t i = 0; i < 2; i++) {
    events += st.ext->tracerelay_hosts[i]->session_smb_full;
    ms += st.ext->tracerelay_hosts[i]->session_smb_full_ms;
  }
  assert_int_equal(events, 3 + 4);
  assert_int_equal(ms, 3 + 4);
  fx_stats_free(&st);
  fx_teardown();
}

/* host-a, host-b and host-c, each with one producer offering track_event. */
static void make_three_hosts(void) {
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_make_host(1, "host-b", 1, kTrackEvent);
  fx_make_host(2, "host-c", 1, kTrackEvent);
}

/* The instance id of the last command of kind `what` to host i (0 if none). */
static uint64_t last_instance(size_t i, Tracerelay__Command__CmdCase what) {
  uint64_t id = 0;
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == what && fx_sent[k].host == fx_hosts[i])
      id = fx_sent[k].instance_id;
  return id;
}

/* Issue 24: a stop the agent never got (its link was down as the session stopped, or dropped
 * before the answer) left the producer writing for a session that no longer existed, until the
 * service restarted. host-a's link drops after its stop went out, host-b's is down when the
 * session stops, host-c's agent restarts while away: once the stop timeout ended the session,
 * host-a and host-b are asked again when they are back (once), host-c is not. */
static void test_unconfirmed_stop_asked_again(void **state) {
  const char *const names[] = {"track_event", NULL};
  struct fx_config cfg;
  (void)state;
  fx_setup();
  make_three_hosts();
  for (size_t i = 0; i < 3; i++)
    fx_connect(i);
  fx_config(&cfg, names);
  cfg.cfg.has_data_source_stop_timeout_ms = 1;
  cfg.cfg.data_source_stop_timeout_ms = 20;
  tr_session *s = fx_enable(&cfg);
  for (size_t i = 0; i < 3; i++)
    fx_answer(i, START);
  uint64_t on_a = last_instance(0, START), on_b = last_instance(1, START);

  fx_disconnect(1);
  fx_disconnect(2);
  tr_session_disable(s);
  assert_int_equal(fx_count(0, STOP), 1);
  assert_int_equal(fx_count(1, STOP) + fx_count(2, STOP), 0); /* their links are down */
  fx_disconnect(0); /* before host-a answered */
  while (!fx_observed.ended)
    uv_run(&fx_loop, UV_RUN_ONCE); /* the 20 ms stop timeout */
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STOPPED);

  fx_connect(0);
  assert_int_equal(fx_count(0, STOP), 2);
  assert_int_equal(last_instance(0, STOP), on_a);
  fx_connect(1);
  assert_int_equal(fx_count(1, STOP), 1);
  assert_int_equal(last_instance(1, STOP), on_b);
  fx_hosts[2]->agent_instance_id++; /* host-c's agent restarted: its instance is gone */
  fx_connect(2);
  assert_int_equal(fx_count(2, STOP), 0);
  fx_disconnect(0);
  fx_connect(0); /* asked once */
  assert_int_equal(fx_count(0, STOP), 2);
  fx_teardown();
}

/* Issue 27 item 7: the sessions kept a host list of their own, filled by the host_connected
 * call, which left a host it failed to record (out of memory) out of every later session, the
 * status and the metrics for good. They now walk the service's one host table: a new session
 * reaches every host whose link is up there, told or not (host-b), and no other (host-c). */
static void test_new_session_reaches_every_host_of_the_table(void **state) {
  const char *const names[] = {"track_event", NULL};
  struct fx_config cfg;
  (void)state;
  fx_setup();
  make_three_hosts();
  fx_connect(0);
  fx_link_up(1);
  fx_config(&cfg, names);
  tr_session *s = fx_enable(&cfg);
  assert_int_equal(fx_count(0, SETUP), 1);
  assert_int_equal(fx_count(1, SETUP), 1);
  assert_int_equal(fx_count(2, SETUP), 0);
  assert_int_equal(tr_hosts_count(fx_host_table), 3);
  tr_session_free(s);
  fx_teardown();
}


/* Issue 25 item 4: a session of 10,000 hosts walked every instance of every host for each of
 * its 20,000 setup and start replies (and for each host's status and metrics). Four hosts of
 * three producers with two data sources each (6 instances a host): a reply looks at its own
 * host's instances only; all started comes with the last start; after host-a's agent restarts,
 * its summary and losses cover both its entries, and the session ends with the last stop. */
static void test_replies_look_at_their_own_hosts_instances(void **state) {
  const char *const two[][3] = {{"track_event", "other", NULL},
                                {"track_event", "other", NULL},
                                {"track_event", "other", NULL}};
  const char *const names[] = {"track_event", "other", NULL};
  const char *const hosts[] = {"host-a", "host-b", "host-c", "host-d"};
  enum { PER_HOST = 6 };
  struct fx_config cfg;
  struct tr_session_host_summary sum;
  (void)state;
  fx_setup();
  for (size_t i = 0; i < 4; i++) {
    fx_make_host(i, hosts[i], 3, two);
    fx_connect(i);
  }
  fx_config(&cfg, names);
  tr_session *s = fx_enable(&cfg);
  assert_int_equal(fx_count(ANY_HOST, START), 4 * PER_HOST);
  uint64_t examined = s->instances_examined;
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(fx_observed.all_started, 0);
    fx_answer(i, SETUP);
    fx_answer(i, START);
  }
  assert_int_equal(fx_observed.instances_started, 4 * PER_HOST);
  assert_int_equal(fx_observed.all_started, 1);
  /* 48 replies, each at most its host's 6 instances (a walk over all: 24 each). */
  assert_true(s->instances_examined - examined <= 2 * 4 * PER_HOST * PER_HOST);

  fx_disconnect(0);
  fx_hosts[0]->agent_instance_id++; /* host-a's agent restarted: a second entry */
  fx_connect(0);
  fx_answer(0, START);
  tr_session_stats_host_summary(s, fx_hosts[0], &sum);
  assert_int_equal(sum.instances, 2 * PER_HOST);
  assert_int_equal(sum.instances_started, PER_HOST);
  assert_false(sum.gone);
  tr_session_stats_host_summary(s, fx_hosts[1], &sum);
  assert_int_equal(sum.instances, PER_HOST);
  assert_int_equal(sum.instances_started, PER_HOST);
  struct tr_host_buffer_losses losses = {0};
  tr_session_stats_add_host_losses(s, fx_hosts[0], &losses);
  assert_int_equal(losses.chunks_discarded + losses.chunks_overwritten, 0);

  tr_session_disable(s);
  assert_int_equal(fx_count(ANY_HOST, STOP), 4 * PER_HOST); /* not the retired entry's */
  for (size_t i = 0; i < 4; i++) {
    assert_int_equal(fx_observed.ended, 0);
    fx_answer(i, STOP);
  }
  assert_int_equal(fx_observed.ended, 1);
  tr_session_free(s);
  fx_teardown();
}

/* The host table's name index: 1,000 hosts (its buckets doubled four times on the way) are
 * each found by name, as the same entry, in the order they were made; a name never seen is
 * not found. */
static void test_host_table_finds_every_name(void **state) {
  enum { N = 1000 };
  static tr_host *made[N];
  char name[32];
  (void)state;
  fx_setup();
  for (size_t i = 0; i < N; i++) {
    snprintf(name, sizeof name, "fleet-%04zu", i);
    assert_int_equal(tr_hosts_get(fx_host_table, name, &made[i]), 0);
    assert_int_equal(tr_hosts_ordinal(made[i]), i);
  }
  for (size_t i = 0; i < N; i++) {
    tr_host *again;
    snprintf(name, sizeof name, "fleet-%04zu", i);
    assert_ptr_equal(tr_hosts_find(fx_host_table, name), made[i]);
    assert_int_equal(tr_hosts_get(fx_host_table, name, &again), 0); /* no second entry */
    assert_ptr_equal(again, made[i]);
  }
  assert_null(tr_hosts_find(fx_host_table, "fleet-1000"));
  assert_int_equal(tr_hosts_count(fx_host_table), N);
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fan_out_to_every_host),
      cmocka_unit_test(test_host_joining_late),
      cmocka_unit_test(test_stats_before_any_data),
      cmocka_unit_test(test_producer_joining_late),
      cmocka_unit_test(test_deferred_start),
      cmocka_unit_test(test_losses_are_per_session),
      cmocka_unit_test(test_restarted_agent_counts_smb_full_once),
      cmocka_unit_test(test_unconfirmed_stop_is_counted),
      cmocka_unit_test(test_unconfirmed_stop_asked_again),
      cmocka_unit_test(test_new_session_reaches_every_host_of_the_table),
      cmocka_unit_test(test_replies_look_at_their_own_hosts_instances),
      cmocka_unit_test(test_host_table_finds_every_name),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
