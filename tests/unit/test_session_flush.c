/* test_session_flush.c: flushes of a session across hosts (service/session_flush.c), driven
 * through the link's callback table and a fake link (session_fixture.h), without processes.
 * Checks that a flush asks every producer with a started instance once (probing each live
 * host's clock first) and completes, ok, only when the last host acked; that at its timeout it
 * fails and names, in the log (eight hosts, then how many more) and in the counters (the host's flushes_missed, the session's
 * per-host count in TraceStats), exactly the hosts that did not answer; that a host whose
 * link goes down during a flush is named at once, without waiting for the timeout, and counted
 * again by each flush while it is away; that a flush with nothing to wait for completes at
 * once; that a flush's fan-out looks at each instance twice, not once per producer; that
 * an ack finds its host's entry in one step; and that the service's own part of a flush
 * leaves out the agents' stretch, up to the last ack's arrival, and is observed only for
 * flushes every producer answered. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "service/session_priv.h"
#include "session_fixture.h"

#define START TRACERELAY__COMMAND__CMD_START_DATA_SOURCE
#define FLUSH TRACERELAY__COMMAND__CMD_FLUSH
#define ANY_HOST FX_MAX_HOSTS
#define NUM_HOSTS 3

static const char *const kNames[] = {"host-a", "host-b", "host-c"};
static const char *const kTrackEvent[][3] = {{"track_event", NULL}};

static int flush_result; /* -1 until the flush callback: then its ok */

static void on_flush(void *ud, bool ok) {
  assert_ptr_equal(ud, &flush_result);
  assert_int_equal(flush_result, -1); /* once */
  flush_result = ok;
}

/* NUM_HOSTS hosts of one track_event producer each, in one started session. */
static tr_session *started_session(struct fx_config *cfg) {
  const char *const names[] = {"track_event", NULL};
  tr_session *s;
  fx_setup();
  for (size_t i = 0; i < NUM_HOSTS; i++) {
    fx_make_host(i, kNames[i], 1, kTrackEvent);
    fx_connect(i);
  }
  fx_config(cfg, names);
  s = fx_enable(cfg);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, START);
  assert_int_equal(fx_observed.all_started, 1);
  fx_probes = 0;
  flush_result = -1;
  return s;
}

/* The session's count of flushes host entry i did not answer, from its TraceStats. */
static uint64_t session_missed(tr_session *s, size_t i) {
  struct fx_stats st;
  uint64_t n;
  fx_stats(s, &st);
  assert_true(i < st.ext->n_tracerelay_hosts);
  assert_string_equal(st.ext->tracerelay_hosts[i]->machine_name, kNames[i]);
  n = st.ext->tracerelay_hosts[i]->session_flushes_missed;
  fx_stats_free(&st);
  return n;
}

static void test_flush_completes_when_every_host_acked(void **state) {
  struct fx_config cfg;
  struct tr_session_flush_counts counts;
  tr_session *s = started_session(&cfg);
  (void)state;
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, &flush_result), 0);
  assert_int_equal(fx_probes, NUM_HOSTS);
  assert_int_equal(fx_count(ANY_HOST, FLUSH), NUM_HOSTS);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    assert_int_equal(fx_count(i, FLUSH), 1);
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == FLUSH)
      assert_int_equal(fx_sent[k].num_flushed, 1); /* the producer's one instance */

  fx_answer(0, FLUSH);
  fx_answer(2, FLUSH);
  uv_run(&fx_loop, UV_RUN_NOWAIT);
  assert_int_equal(flush_result, -1); /* host-b still owes its ack */
  fx_answer(1, FLUSH);
  assert_int_equal(flush_result, 1);

  tr_session_flush_counts(s, &counts);
  assert_int_equal(counts.requested, 1);
  assert_int_equal(counts.succeeded, 1);
  assert_int_equal(counts.failed, 0);
  for (size_t i = 0; i < NUM_HOSTS; i++) {
    assert_int_equal(fx_hosts[i]->stats.flushes_missed, 0);
    assert_int_equal(session_missed(s, i), 0);
  }
  fx_teardown();
}

static void wait_for_flush(void *ud) {
  (void)ud;
  fx_run_until_set(&flush_result);
}

static void test_flush_timeout_names_silent_hosts(void **state) {
  struct fx_config cfg;
  struct tr_session_flush_counts counts;
  char log[4096];
  tr_session *s = started_session(&cfg);
  (void)state;
  assert_int_equal(tr_session_flush(s, 20, 0, on_flush, &flush_result), 0);
  fx_answer(0, FLUSH); /* host-b and host-c stay silent */
  assert_int_equal(flush_result, -1);
  fx_capture_log(wait_for_flush, NULL, log, sizeof log);
  assert_int_equal(flush_result, 0);

  assert_null(strstr(log, "host host-a did not answer"));
  assert_non_null(strstr(log, "host host-b did not answer within the timeout"));
  assert_non_null(strstr(log, "host host-c did not answer within the timeout"));
  assert_int_equal(fx_hosts[0]->stats.flushes_missed, 0);
  assert_int_equal(fx_hosts[1]->stats.flushes_missed, 1);
  assert_int_equal(fx_hosts[2]->stats.flushes_missed, 1);
  assert_int_equal(session_missed(s, 0), 0);
  assert_int_equal(session_missed(s, 1), 1);
  assert_int_equal(session_missed(s, 2), 1);
  tr_session_flush_counts(s, &counts);
  assert_int_equal(counts.failed, 1);
  assert_int_equal(counts.succeeded, 0);

  /* A late ack changes nothing. */
  fx_answer(1, FLUSH);
  tr_session_flush_counts(s, &counts);
  assert_int_equal(counts.failed, 1);
  assert_int_equal(counts.succeeded, 0);
  fx_teardown();
}

static void disconnect_host_b(void *ud) {
  (void)ud;
  fx_disconnect(1);
}

static void test_host_lost_during_flush_is_named_at_once(void **state) {
  struct fx_config cfg;
  char log[4096];
  tr_session *s = started_session(&cfg);
  (void)state;
  assert_int_equal(tr_session_flush(s, 60000, 0, on_flush, &flush_result), 0);
  fx_answer(0, FLUSH);
  fx_answer(2, FLUSH);
  assert_int_equal(flush_result, -1);
  /* Its link goes down: the flush fails now, not in a minute. */
  fx_capture_log(disconnect_host_b, NULL, log, sizeof log);
  assert_int_equal(flush_result, 0);
  assert_non_null(strstr(log, "host host-b did not answer (disconnected)"));
  assert_int_equal(fx_hosts[1]->stats.flushes_missed, 1);
  assert_int_equal(session_missed(s, 1), 1);

  /* While it is away, each flush counts it at once, asks only the others and waits for them. */
  flush_result = -1;
  fx_probes = 0;
  assert_int_equal(tr_session_flush(s, 60000, 0, on_flush, &flush_result), 0);
  assert_int_equal(fx_probes, 2); /* the live hosts' clocks */
  assert_int_equal(fx_count(1, FLUSH), 1); /* the first flush's only */
  assert_int_equal(fx_hosts[1]->stats.flushes_missed, 2);
  fx_answer(0, FLUSH);
  assert_int_equal(flush_result, -1);
  fx_answer(2, FLUSH);
  assert_int_equal(flush_result, 0);
  fx_teardown();
}

static void test_flush_with_nothing_to_wait_for(void **state) {
  struct fx_config cfg;
  const char *const names[] = {"track_event", NULL};
  tr_session *s;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, names);
  s = fx_enable(&cfg); /* its start is never answered: no instance is started */
  flush_result = -1;
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, &flush_result), 0);
  assert_int_equal(flush_result, 1);
  assert_int_equal(fx_count(0, FLUSH), 0);
  fx_teardown();
}

/* NUM_HOSTS hosts of two producers each offering two data sources, all four instances of
 * each host started. */
static tr_session *two_producer_session(struct fx_config *cfg) {
  const char *const names[] = {"track_event", "linux.ftrace", NULL};
  static const char *const both[][3] = {{"track_event", "linux.ftrace", NULL},
                                        {"track_event", "linux.ftrace", NULL}};
  tr_session *s;
  fx_setup();
  for (size_t i = 0; i < NUM_HOSTS; i++) {
    fx_make_host(i, kNames[i], 2, both);
    fx_connect(i);
  }
  fx_config(cfg, names);
  s = fx_enable(cfg);
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, START);
  assert_int_equal(fx_observed.all_started, 1);
  flush_result = -1;
  return s;
}

/* Issue 25 item 1: one command per producer naming its instances, found in two passes over the
 * instances (before, a pass over all of them per producer: O(hosts x instances) a flush, a
 * million steps at 1,000 hosts). */
static void test_flush_fans_out_in_two_passes(void **state) {
  struct fx_config cfg;
  tr_session *s = two_producer_session(&cfg);
  (void)state;
  size_t instances = NUM_HOSTS * 2 * 2;
  uint64_t examined = tr_session_flush_examined(s);
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, &flush_result), 0);
  assert_int_equal(tr_session_flush_examined(s) - examined, 2 * instances);
  assert_int_equal(fx_count(ANY_HOST, FLUSH), NUM_HOSTS * 2);
  for (size_t k = 0; k < fx_num_sent; k++)
    if (fx_sent[k].what == FLUSH)
      assert_int_equal(fx_sent[k].num_flushed, 2); /* the producer's two instances */
  for (size_t i = 0; i < NUM_HOSTS; i++) {
    assert_int_equal(fx_count(i, FLUSH), 2);
    assert_int_equal(flush_result, -1);
    fx_answer(i, FLUSH);
  }
  assert_int_equal(flush_result, 1);
  fx_teardown();
}

/* Issue 25 item 1: an ack (as a chunk) finds its host's session entry in one step, whatever
 * the number of hosts (before, a walk over the entries from the newest: the first host's
 * acks cost one step per host). */
static void test_acks_find_their_host_in_one_step(void **state) {
  struct fx_config cfg;
  tr_session *s = two_producer_session(&cfg);
  (void)state;
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, &flush_result), 0);
  uint64_t examined = s->host_entries_examined;
  for (size_t i = 0; i < NUM_HOSTS; i++)
    fx_answer(i, FLUSH); /* two acks each */
  assert_int_equal(flush_result, 1);
  assert_int_equal(s->host_entries_examined - examined, NUM_HOSTS * 2);
  fx_teardown();
}

/* A fleet of silent hosts is named up to 8 hosts a flush, then counted in one line (at 10,000
 * hosts each timed-out flush wrote 10,000 lines); every one of them is counted as missing it. */
static void test_flush_timeout_names_eight_then_counts(void **state) {
  const char *const names[] = {"track_event", NULL};
  char host_names[FX_MAX_HOSTS][16], log[8192];
  struct fx_config cfg;
  (void)state;
  fx_setup();
  for (size_t i = 0; i < FX_MAX_HOSTS; i++) {
    snprintf(host_names[i], sizeof host_names[i], "host-%02zu", i);
    fx_make_host(i, host_names[i], 1, kTrackEvent);
    fx_connect(i);
  }
  fx_config(&cfg, names);
  tr_session *s = fx_enable(&cfg);
  for (size_t i = 0; i < FX_MAX_HOSTS; i++)
    fx_answer(i, START);
  flush_result = -1;
  assert_int_equal(tr_session_flush(s, 20, 0, on_flush, &flush_result), 0);
  fx_answer(0, FLUSH); /* the other 11 stay silent */
  fx_capture_log(wait_for_flush, NULL, log, sizeof log);
  assert_int_equal(flush_result, 0);
  size_t named = 0;
  for (const char *p = log; (p = strstr(p, "did not answer within the timeout\"")); p++)
    named++;
  assert_int_equal(named, 8);
  assert_non_null(strstr(log, "flush 1: 3 more hosts did not answer within the timeout (11 in all"));
  for (size_t i = 0; i < FX_MAX_HOSTS; i++)
    assert_int_equal(fx_hosts[i]->stats.flushes_missed, i == 0 ? 0 : 1);
  fx_teardown();
}

static void test_service_part_of_a_flush(void **state) {
  (void)state;
  const uint64_t ms = 1000000;
  /* Fan-out done 2 ms in, last ack in 90 ms after that, done 100 ms in: 10 ms the service's. */
  assert_int_equal(tr_session_flush_service_part_ns(100 * ms, 1000 * ms, 1090 * ms), 10 * ms);
  /* Every ack in before the fan-out ended, or none known: all of it the service's. */
  assert_int_equal(tr_session_flush_service_part_ns(100 * ms, 1000 * ms, 999 * ms), 100 * ms);
  assert_int_equal(tr_session_flush_service_part_ns(100 * ms, 1000 * ms, 0), 100 * ms);
  /* Clocks that disagree by more than the flush took never make it negative. */
  assert_int_equal(tr_session_flush_service_part_ns(100 * ms, 1000 * ms, 1200 * ms), 0);

  struct fx_config cfg;
  tr_session *s = started_session(&cfg);
  const tr_prom_histogram *total = &fx_svc.flush_durations, *part = &fx_svc.flush_service_parts;
  /* The last ack arrives after the flush is seen done (as if a slow agent answered): none of
   * it is the service's. */
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, &flush_result), 0);
  fx_answer(0, FLUSH);
  fx_answer(1, FLUSH);
  fx_ack_arrived_ns = (int64_t)tr_clock_boottime_ns() + 3600 * (int64_t)1000000000;
  fx_answer(2, FLUSH);
  assert_int_equal(flush_result, 1);
  assert_int_equal(total->count, 1);
  assert_int_equal(part->count, 1);
  assert_true(part->sum == 0.0);
  /* A flush that timed out is not a round trip: its duration is observed, no part of it. */
  flush_result = -1;
  assert_int_equal(tr_session_flush(s, 20, 0, on_flush, &flush_result), 0);
  fx_answer(0, FLUSH);
  fx_run_until_set(&flush_result);
  assert_int_equal(flush_result, 0);
  assert_int_equal(total->count, 2);
  assert_int_equal(part->count, 1);
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_flush_completes_when_every_host_acked),
      cmocka_unit_test(test_flush_timeout_names_silent_hosts),
      cmocka_unit_test(test_flush_timeout_names_eight_then_counts),
      cmocka_unit_test(test_host_lost_during_flush_is_named_at_once),
      cmocka_unit_test(test_flush_with_nothing_to_wait_for),
      cmocka_unit_test(test_flush_fans_out_in_two_passes),
      cmocka_unit_test(test_acks_find_their_host_in_one_step),
      cmocka_unit_test(test_service_part_of_a_flush),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
