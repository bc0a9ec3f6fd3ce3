/* test_session_triggers.c: trigger_config across hosts (service/session_triggers.c), on the
 * fake link of session_fixture.h: traced's config checks with its words; a STOP_TRACING
 * trigger from one host flushes and stops every host's instances after stop_delay_ms, the
 * trace withheld until then and carrying a `trigger` packet that names the host; triggers that
 * producer_name_regex, skip_probability or max_per_24_h keep out change nothing; a
 * START_TRACING session waits, starts on every host when triggered, and ends empty at
 * trigger_timeout_ms without a trigger; a CLONE_SNAPSHOT trigger tells the consumer and the
 * session goes on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/base/tr_error.h"
#include "service/session_priv.h"
#include "session_fixture.h"

#define START TRACERELAY__COMMAND__CMD_START_DATA_SOURCE
#define STOP TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE
#define FLUSH TRACERELAY__COMMAND__CMD_FLUSH
#define ANY_HOST FX_MAX_HOSTS

typedef Perfetto__Protos__TraceConfig__TriggerConfig trigger_config;
typedef Perfetto__Protos__TraceConfig__TriggerConfig__Trigger trigger_rule;

static const char *const kTrackEvent[][3] = {{"track_event", NULL}};

/* A config of fx_config's with one trigger rule named `name`. */
struct trig_config {
  struct fx_config fx;
  trigger_config tc;
  trigger_rule rule, *rules[2];
};

static void trig_config(struct trig_config *c, int mode, const char *name, uint32_t delay_ms) {
  const char *const names[] = {"track_event", NULL};
  fx_config(&c->fx, names);
  perfetto__protos__trace_config__trigger_config__init(&c->tc);
  perfetto__protos__trace_config__trigger_config__trigger__init(&c->rule);
  c->rule.name = (char *)name;
  c->rule.has_stop_delay_ms = 1;
  c->rule.stop_delay_ms = delay_ms;
  c->rules[0] = &c->rule;
  c->tc.has_trigger_mode = c->tc.has_trigger_timeout_ms = 1;
  c->tc.trigger_mode = mode;
  c->tc.trigger_timeout_ms = 60000;
  c->tc.n_triggers = 1;
  c->tc.triggers = c->rules;
  c->fx.cfg.trigger_config = &c->tc;
}

static void raise_on(size_t host, const char *name, const char *producer) {
  Tracerelay__Trigger t = TRACERELAY__TRIGGER__INIT;
  t.name = (char *)name;
  t.producer_name = (char *)producer;
  t.has_producer_uid = 1;
  t.producer_uid = 1000;
  tr_session_link_events.trigger(&fx_svc, fx_hosts[host], &t);
}

/* Packets a read pass yields now, and the `trigger` packets among them (their producer names
 * into producers, separated by spaces). */
static size_t read_pass(tr_session *s, char *producers, size_t cap) {
  tr_trace_output *o = tr_session_output(s);
  tr_output_packet p;
  size_t n = 0;
  producers[0] = '\0';
  assert_int_equal(tr_trace_output_begin(o), 0);
  while (tr_trace_output_next(o, &p) > 0) {
    Perfetto__Protos__TracePacket *tp = perfetto__protos__trace_packet__unpack(NULL, p.len, p.data);
    assert_non_null(tp);
    if (tp->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRIGGER) {
      size_t used = strlen(producers);
      snprintf(producers + used, cap - used, "%s%s:%s", used ? " " : "", tp->trigger->trigger_name,
               tp->trigger->producer_name);
    }
    perfetto__protos__trace_packet__free_unpacked(tp, NULL);
    n++;
  }
  return n;
}

static void run_until_state(tr_session *s, enum tr_session_state want) {
  for (int i = 0; i < 1000 && tr_session_get_state(s) != want; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_equal(tr_session_get_state(s), want);
}

static void expect_refused(struct trig_config *c, const char *text) {
  char err[512] = "";
  assert_int_equal(tr_session_validate_config(&c->fx.cfg, err, sizeof err), TR_ERR_CONFIG);
  if (!strstr(err, text))
    fail_msg("refused with \"%s\", not \"%s\"", err, text);
}

static void test_traced_config_checks(void **state) {
  struct trig_config c;
  (void)state;
  trig_config(&c, 2, "a", 0);
  c.tc.trigger_timeout_ms = 0;
  expect_refused(&c, "Traces with START_TRACING triggers must provide a positive "
                     "trigger_timeout_ms < 7 days (received 0ms)");
  trig_config(&c, 2, "a", 0);
  c.fx.cfg.has_duration_ms = 1;
  c.fx.cfg.duration_ms = 1000;
  expect_refused(&c, "duration_ms was set, this must not be set for traces with triggers.");
  trig_config(&c, 2, "a", 0);
  c.rules[1] = &c.rule;
  c.tc.n_triggers = 2;
  expect_refused(&c, "Duplicate trigger name: a");
  trig_config(&c, 2, "a", 0);
  c.fx.cfg.has_write_into_file = c.fx.cfg.write_into_file = 1;
  expect_refused(&c, "Specifying trigger mode STOP_TRACING/CLONE_SNAPSHOT and write_into_file "
                     "together is unsupported");
  trig_config(&c, 7, "a", 0);
  expect_refused(&c, "The trace config specified an invalid trigger_mode");
  trig_config(&c, 1, "a", 0);
  c.tc.has_use_clone_snapshot_if_available = c.tc.use_clone_snapshot_if_available = 1;
  expect_refused(&c, "trigger_mode must be STOP_TRACING when use_clone_snapshot_if_available=true");
  trig_config(&c, 0, "a", 0);
  expect_refused(&c, "trigger_config has triggers but no trigger_mode");
  trig_config(&c, 2, "a", 0);
  c.rule.producer_name_regex = "app(";
  expect_refused(&c, "producer_name_regex \"app(\" is not a valid POSIX extended regex");
}

static void test_stop_trigger_from_one_host_stops_every_host(void **state) {
  struct trig_config c;
  char triggers[256];
  (void)state;
  fx_setup();
  for (size_t i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "host-%zu", i);
    fx_make_host(i, name, 1, kTrackEvent);
    fx_connect(i);
  }
  trig_config(&c, 2, "boom", 0);
  tr_session *s = fx_enable(&c.fx);
  for (size_t i = 0; i < 3; i++) {
    fx_answer(i, TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE);
    fx_answer(i, START);
  }
  /* Before the trigger the trace is withheld: not even the service's packets. */
  assert_int_equal(read_pass(s, triggers, sizeof triggers), 0);

  raise_on(2, "other", "app");
  assert_int_equal(read_pass(s, triggers, sizeof triggers), 0);
  raise_on(2, "boom", "app");
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STARTED);
  assert_true(read_pass(s, triggers, sizeof triggers) > 0);
  assert_string_equal(triggers, "boom:host-2/app");
  /* After stop_delay_ms (0), one flush of every host, then the stop. */
  for (int i = 0; i < 1000 && fx_count(ANY_HOST, FLUSH) < 3; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(fx_count(i, FLUSH), 1);
  raise_on(1, "boom", "app"); /* recorded, changes nothing */
  for (size_t i = 0; i < 3; i++)
    fx_answer(i, FLUSH);
  run_until_state(s, TR_SESSION_STOPPING);
  for (size_t i = 0; i < 3; i++)
    assert_int_equal(fx_count(i, STOP), 1);
  assert_int_equal(fx_count(ANY_HOST, FLUSH), 3);
  read_pass(s, triggers, sizeof triggers);
  assert_string_equal(triggers, "boom:host-1/app");
  fx_teardown();
}

static void test_rules_that_keep_a_trigger_out(void **state) {
  struct trig_config c, d;
  char triggers[256];
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  trig_config(&c, 2, "boom", 60000);
  c.rule.producer_name_regex = "app-[0-9]+";
  tr_session *s = fx_enable(&c.fx);
  raise_on(0, "boom", "app-x"); /* a full match is needed */
  raise_on(0, "boom", "my-app-1");
  assert_int_equal(read_pass(s, triggers, sizeof triggers), 0);
  raise_on(0, "boom", "app-12");
  read_pass(s, triggers, sizeof triggers);
  assert_string_equal(triggers, "boom:host-a/app-12");
  assert_true(tr_session_triggers_stop_pending(s));

  /* A certain skip, then max_per_24_h: "boom" matched once in the last day (above). */
  trig_config(&d, 2, "boom", 60000);
  d.rule.has_skip_probability = 1;
  d.rule.skip_probability = 1.0;
  tr_session *t = fx_enable(&d.fx);
  raise_on(0, "boom", "app");
  assert_int_equal(read_pass(t, triggers, sizeof triggers), 0);
  d.rule.skip_probability = 0;
  d.rule.has_max_per_24_h = 1;
  d.rule.max_per_24_h = 1;
  tr_session_free(t);
  t = fx_enable(&d.fx);
  raise_on(0, "boom", "app");
  assert_int_equal(read_pass(t, triggers, sizeof triggers), 0);
  d.rule.max_per_24_h = 2;
  tr_session_free(t);
  t = fx_enable(&d.fx);
  raise_on(0, "boom", "app");
  read_pass(t, triggers, sizeof triggers);
  assert_string_equal(triggers, "boom:host-a/app");
  fx_teardown();
}

static void test_start_trigger(void **state) {
  struct trig_config c;
  char triggers[256];
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_make_host(1, "host-b", 1, kTrackEvent);
  fx_connect(0);
  fx_connect(1);
  trig_config(&c, 1, "go", 60000);
  tr_session *s = fx_enable(&c.fx);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_CONFIGURED);
  assert_int_equal(fx_count(ANY_HOST, START), 0);
  raise_on(1, "go", "starter");
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STARTED);
  assert_int_equal(fx_count(0, START), 1);
  assert_int_equal(fx_count(1, START), 1);
  assert_int_equal(tr_session_config(s)->duration_ms, 60000); /* stop_delay_ms from now */
  read_pass(s, triggers, sizeof triggers);
  assert_string_equal(triggers, "go:host-b/starter");
  raise_on(0, "go", "starter"); /* started already: recorded only */
  assert_int_equal(fx_count(ANY_HOST, START), 2);

  /* No trigger within trigger_timeout_ms: it ends, empty. */
  trig_config(&c, 1, "go", 0);
  c.tc.trigger_timeout_ms = 1;
  tr_session *t = fx_enable(&c.fx);
  run_until_state(t, TR_SESSION_STOPPING);
  fx_answer(0, STOP);
  fx_answer(1, STOP);
  run_until_state(t, TR_SESSION_STOPPED);
  assert_int_equal(read_pass(t, triggers, sizeof triggers), 0);
  assert_int_equal(fx_count(ANY_HOST, START), 2);
  fx_teardown();
}

/* CLONE_SNAPSHOT: each match tells the consumer after its delay, the session goes on, and its
 * own trace stays withheld (read through clones). */
static void test_clone_trigger(void **state) {
  struct trig_config c;
  char triggers[256];
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  trig_config(&c, 4, "snap", 0);
  tr_session *s = fx_enable(&c.fx);
  raise_on(0, "snap", "app");
  for (int i = 0; i < 1000 && fx_observed.clone_triggers < 1; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_equal(fx_observed.clone_triggers, 1);
  assert_int_equal(fx_observed.clone_trigger_session, tr_session_id(s));
  raise_on(0, "snap", "app");
  for (int i = 0; i < 1000 && fx_observed.clone_triggers < 2; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_equal(fx_observed.clone_triggers, 2);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STARTED);
  assert_int_equal(read_pass(s, triggers, sizeof triggers), 0);

  /* use_clone_snapshot_if_available makes a STOP_TRACING session's triggers clone it. */
  trig_config(&c, 2, "snap2", 0);
  c.tc.has_use_clone_snapshot_if_available = c.tc.use_clone_snapshot_if_available = 1;
  tr_session *t = fx_enable(&c.fx);
  raise_on(0, "snap2", "app");
  for (int i = 0; i < 1000 && fx_observed.clone_triggers < 3; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_equal(fx_observed.clone_trigger_session, tr_session_id(t));
  assert_int_equal(tr_session_get_state(t), TR_SESSION_STARTED);
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_traced_config_checks),
      cmocka_unit_test(test_stop_trigger_from_one_host_stops_every_host),
      cmocka_unit_test(test_rules_that_keep_a_trigger_out),
      cmocka_unit_test(test_start_trigger),
      cmocka_unit_test(test_clone_trigger),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
