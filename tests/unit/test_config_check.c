/* test_config_check.c: what the service does with each TraceConfig field (service/
 * config_check.c). Checks that every field of every message the table walks has a decision (a
 * field added to our protos without one fails here); one refusal per class with its text (a
 * refused field, a refused value, a nested field, a field Perfetto v58.2 does not define, a
 * ProtoVM config), that a data source's per-source configs and the ignorable Android fields
 * pass (the latter with their log line); named buffers as traced resolves and refuses them;
 * the admission of a session among others (per-uid limit, session_semaphores, exclusive_prio
 * ending the sessions it outranks); write_flush_mode's flush plan, and a flush before each
 * write into the file under WRITE_FLUSH_ENABLED; output_path never overwritten; trace_uuid
 * taken from the config. Sessions run on session_fixture.h's fake link. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/base/tr_error.h"
#include "service/config_check.h"
#include "session_fixture.h"

#define SETUP TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE
#define FLUSH TRACERELAY__COMMAND__CMD_FLUSH

static const char *const kTrackEvent[][3] = {{"track_event", NULL}};
static const char *const kNames[] = {"track_event", NULL};

static int check(const Perfetto__Protos__TraceConfig *cfg, char *err, size_t len) {
  err[0] = '\0';
  return tr_config_check_fields(cfg, err, len);
}

/* ---- every field has a decision ---- */

/* Sets field f of m to a value that is not its default, in scratch (which must stay alive
 * while it is checked). */
typedef struct scratch {
  uint64_t one[1];
  double one_d[1];
  char *str[1];
  void *msg_ptr[1];
  _Alignas(16) uint8_t msg[2048];
} scratch;

static void set_field(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, scratch *sc) {
  char *at = (char *)m + f->offset;
  sc->one[0] = 1;
  sc->one_d[0] = 1.0;
  sc->str[0] = "x";
  if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const ProtobufCMessageDescriptor *d = f->descriptor;
    assert_true(d->sizeof_message <= sizeof sc->msg);
    d->message_init((ProtobufCMessage *)sc->msg);
    sc->msg_ptr[0] = sc->msg;
  }
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    *(size_t *)((char *)m + f->quantifier_offset) = 1;
    void *items = f->type == PROTOBUF_C_TYPE_MESSAGE  ? (void *)sc->msg_ptr
                  : f->type == PROTOBUF_C_TYPE_STRING ? (void *)sc->str
                  : f->type == PROTOBUF_C_TYPE_DOUBLE ? (void *)sc->one_d
                                                      : (void *)sc->one;
    *(void **)at = items;
    return;
  }
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
  else if (f->quantifier_offset)
    *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
  switch (f->type) {
  case PROTOBUF_C_TYPE_MESSAGE:
    *(void **)at = sc->msg;
    break;
  case PROTOBUF_C_TYPE_STRING:
    *(char **)at = "x";
    break;
  case PROTOBUF_C_TYPE_BYTES:
    ((ProtobufCBinaryData *)at)->data = (uint8_t *)"x";
    ((ProtobufCBinaryData *)at)->len = 1;
    break;
  case PROTOBUF_C_TYPE_DOUBLE:
    *(double *)at = 1.0;
    break;
  case PROTOBUF_C_TYPE_FLOAT:
    *(float *)at = 1.0f;
    break;
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    *(uint64_t *)at = 1;
    break;
  default:
    *(uint32_t *)at = 1;
    break;
  }
}

/* Each field of m set alone (in the config cfg that holds m): a decision for each. */
static void each_field_decided(const Perfetto__Protos__TraceConfig *cfg, ProtobufCMessage *m) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  uint8_t saved[2048];
  assert_true(d->sizeof_message <= sizeof saved);
  for (unsigned i = 0; i < d->n_fields; i++) {
    scratch sc;
    char err[256];
    memcpy(saved, m, d->sizeof_message);
    set_field(m, &d->fields[i], &sc);
    int rc = check(cfg, err, sizeof err);
    if (rc != 0 && (strstr(err, "(a bug)") || !strstr(err, d->fields[i].name)))
      fail_msg("%s.%s: %s", d->name, d->fields[i].name, err);
    memcpy(m, saved, d->sizeof_message);
  }
}

static void test_every_field_decided(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__BuiltinDataSource b =
      PERFETTO__PROTOS__TRACE_CONFIG__BUILTIN_DATA_SOURCE__INIT;
  Perfetto__Protos__TraceConfig__TriggerConfig tc =
      PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__TriggerConfig__Trigger t =
      PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER__INIT, *tp = &t;
  Perfetto__Protos__TraceConfig__IncrementalStateConfig inc =
      PERFETTO__PROTOS__TRACE_CONFIG__INCREMENTAL_STATE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__SessionSemaphore sem =
      PERFETTO__PROTOS__TRACE_CONFIG__SESSION_SEMAPHORE__INIT, *semp = &sem;
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  c.cfg.builtin_data_sources = &b;
  c.cfg.trigger_config = &tc;
  tc.n_triggers = 1;
  tc.triggers = &tp;
  c.cfg.incremental_state_config = &inc;
  c.cfg.n_session_semaphores = 1;
  c.cfg.session_semaphores = &semp;
  assert_int_equal(check(&c.cfg, err, sizeof err), 0);

  each_field_decided(&c.cfg, &c.cfg.base);
  each_field_decided(&c.cfg, &c.buf.base);
  each_field_decided(&c.cfg, &c.ds[0].base);
  each_field_decided(&c.cfg, &c.dsc[0].base);
  each_field_decided(&c.cfg, &b.base);
  each_field_decided(&c.cfg, &tc.base);
  each_field_decided(&c.cfg, &t.base);
  each_field_decided(&c.cfg, &inc.base);
  each_field_decided(&c.cfg, &sem.base);
}

/* ---- one refusal per class ---- */

static void test_refused_field(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__ProducerConfig pc =
      PERFETTO__PROTOS__TRACE_CONFIG__PRODUCER_CONFIG__INIT, *pcp = &pc;
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  pc.producer_name = "app";
  pc.has_shm_size_kb = 1;
  pc.shm_size_kb = 8192;
  c.cfg.n_producers = 1;
  c.cfg.producers = &pcp;
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "trace_config.producers is not supported by tracerelay: the agents "
                           "size each producer's shared memory from the producer's own hint, "
                           "else their --smb-kb; set those instead");

  fx_config(&c, kNames);
  c.cfg.has_prefer_suspend_clock_for_duration = 1;
  c.cfg.prefer_suspend_clock_for_duration = 1;
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "trace_config.prefer_suspend_clock_for_duration is not supported "
                              "by tracerelay: "));

  /* Set to its default, a field is not set at all. */
  c.cfg.prefer_suspend_clock_for_duration = 0;
  assert_int_equal(check(&c.cfg, err, sizeof err), 0);
}

static void test_refused_value(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__BuiltinDataSource b =
      PERFETTO__PROTOS__TRACE_CONFIG__BUILTIN_DATA_SOURCE__INIT;
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  c.cfg.has_lockdown_mode = 1;
  c.cfg.lockdown_mode = PERFETTO__PROTOS__TRACE_CONFIG__LOCKDOWN_MODE_OPERATION__LOCKDOWN_CLEAR;
  assert_int_equal(check(&c.cfg, err, sizeof err), 0); /* never on here: nothing to clear */
  c.cfg.lockdown_mode = PERFETTO__PROTOS__TRACE_CONFIG__LOCKDOWN_MODE_OPERATION__LOCKDOWN_SET;
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "trace_config.lockdown_mode is not supported by tracerelay: "
                              "tracerelay does not check producers' uids"));

  fx_config(&c, kNames);
  c.cfg.builtin_data_sources = &b;
  b.has_primary_trace_clock = 1;
  b.primary_trace_clock = PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME;
  assert_int_equal(check(&c.cfg, err, sizeof err), 0);
  b.primary_trace_clock = PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_MONOTONIC;
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "trace_config.builtin_data_sources.primary_trace_clock is not "
                           "supported by tracerelay: the cluster's one timeline is the "
                           "service's BOOTTIME, which every host's clock is synchronised to; "
                           "leave it unset or BOOTTIME");
}

static void test_refused_nested_field(void **state) {
  struct fx_config c;
  char err[256];
  (void)state;
  fx_config(&c, (const char *const[]){"track_event", "ftrace", NULL});
  c.dsc[1].has_session_initiator = 1;
  c.dsc[1].session_initiator =
      PERFETTO__PROTOS__DATA_SOURCE_CONFIG__SESSION_INITIATOR__SESSION_INITIATOR_TRUSTED_SYSTEM;
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "trace_config.data_sources[1].config.session_initiator is not "
                           "supported by tracerelay: only the tracing service may set it; "
                           "remove it");
}

/* cfg packed, bytes appended, unpacked: a config as a newer Perfetto would send it. */
static Perfetto__Protos__TraceConfig *with_bytes(const Perfetto__Protos__TraceConfig *cfg,
                                                 const uint8_t *extra, size_t n) {
  size_t len = perfetto__protos__trace_config__get_packed_size(cfg);
  uint8_t *buf = malloc(len + n);
  assert_non_null(buf);
  perfetto__protos__trace_config__pack(cfg, buf);
  memcpy(buf + len, extra, n);
  Perfetto__Protos__TraceConfig *out = perfetto__protos__trace_config__unpack(NULL, len + n, buf);
  free(buf);
  assert_non_null(out);
  return out;
}

static void test_unknown_fields(void **state) {
  struct fx_config c;
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  /* Field 49 (varint 1): one v58.2 does not have. */
  const uint8_t top[] = {0x88, 0x03, 0x01};
  Perfetto__Protos__TraceConfig *u = with_bytes(&c.cfg, top, sizeof top);
  assert_int_equal(check(u, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "trace_config holds field 49, which Perfetto v58.2 does not define "
                           "(a newer or a retired Perfetto's): tracerelay cannot tell what it "
                           "asks for; remove it");
  perfetto__protos__trace_config__free_unpacked(u, NULL);

  /* In a buffer: buffers[1] with size_kb 64 and field 9. */
  const uint8_t buf[] = {0x0a, 0x04, 0x08, 0x40, 0x48, 0x01};
  u = with_bytes(&c.cfg, buf, sizeof buf);
  assert_int_equal(check(u, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "trace_config.buffers[1] holds field 9, "));
  perfetto__protos__trace_config__free_unpacked(u, NULL);
}

static void test_data_source_unknown_fields(void **state) {
  struct fx_config c;
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  /* data_sources { config { name: "heapprofd" <field> } } */
  const uint8_t per_source[] = {0x12, 0x10, 0x0a, 0x0e, 0x0a, 0x09, 'h', 'e', 'a', 'p',
                                'p',  'r',  'o',  'f',  'd',  0xc8, 0x06, 0x01};
  Perfetto__Protos__TraceConfig *u = with_bytes(&c.cfg, per_source, sizeof per_source);
  /* Field 105, heapprofd's config: kept for the producers. */
  assert_int_equal(u->data_sources[1]->config->base.n_unknown_fields, 1);
  assert_int_equal(check(u, err, sizeof err), 0);
  perfetto__protos__trace_config__free_unpacked(u, NULL);

  const uint8_t protovm[] = {0x12, 0x0f, 0x0a, 0x0d, 0x0a, 0x09, 'h', 'e', 'a',
                             'p',  'p',  'r',  'o',  'f',  'd',  0x62, 0x00};
  u = with_bytes(&c.cfg, protovm, sizeof protovm);
  assert_int_equal(check(u, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "trace_config.data_sources[1].config.protovm_config is not supported "
                           "by tracerelay: it runs no ProtoVM programs; remove it");
  perfetto__protos__trace_config__free_unpacked(u, NULL);
}

static void check_notify_traceur(void *ud) {
  char err[256];
  assert_int_equal(check(ud, err, sizeof err), 0);
}

static void test_ignored_field_logged(void **state) {
  struct fx_config c;
  char log[1024];
  (void)state;
  fx_config(&c, kNames);
  c.cfg.has_notify_traceur = 1;
  c.cfg.notify_traceur = 1;
  fx_capture_log(check_notify_traceur, &c.cfg, log, sizeof log);
  assert_non_null(strstr(log, "trace_config.notify_traceur ignored: read on Android only"));
  assert_null(strstr(strstr(log, "notify_traceur") + 1, "notify_traceur")); /* once */
}

/* ---- named buffers ---- */

static void two_named_buffers(struct fx_config *c, Perfetto__Protos__TraceConfig__BufferConfig *b2,
                              Perfetto__Protos__TraceConfig__BufferConfig **bufs) {
  perfetto__protos__trace_config__buffer_config__init(b2);
  b2->has_size_kb = 1;
  b2->size_kb = 256;
  b2->name = "second";
  c->buf.name = "first";
  bufs[0] = &c->buf;
  bufs[1] = b2;
  c->cfg.n_buffers = 2;
  c->cfg.buffers = bufs;
}

static void test_named_buffers_checked(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__BufferConfig b2, *bufs[2];
  char err[256];
  (void)state;
  fx_config(&c, kNames);
  two_named_buffers(&c, &b2, bufs);
  c.dsc[0].target_buffer_name = "second";
  assert_int_equal(check(&c.cfg, err, sizeof err), 0);
  assert_int_equal(tr_config_check_target_buffer(&c.cfg, &c.dsc[0]), 1);
  c.dsc[0].has_target_buffer = 1;
  c.dsc[0].target_buffer = 1; /* both, agreeing */
  assert_int_equal(check(&c.cfg, err, sizeof err), 0);

  c.buf.name = "second";
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err,
                      "Duplicate buffer name \"second\" at index 1 (first occurrence at index 0)");
  c.buf.name = "first";

  c.dsc[0].target_buffer_name = "third";
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Data source \"track_event\" specified target_buffer_name \"third\" "
                           "which does not match any buffer");

  c.dsc[0].target_buffer_name = "first";
  assert_int_equal(check(&c.cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Data source \"track_event\" specified both target_buffer=1 and "
                           "target_buffer_name=\"first\" (index 0) but they don't match");
}

static void test_named_buffer_resolved(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__BufferConfig b2, *bufs[2];
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&c, kNames);
  two_named_buffers(&c, &b2, bufs);
  c.dsc[0].target_buffer_name = "second";
  fx_enable(&c);
  assert_int_equal(fx_count(0, SETUP), 1);
  /* Buffers get global ids in order from 1: the second is 2. */
  assert_int_equal(fx_sent[0].target_buffer, 2);
  fx_teardown();
}

/* ---- admission ---- */

static int enable_as(uid_t uid, Perfetto__Protos__TraceConfig *cfg, tr_session **s, char *err) {
  err[0] = '\0';
  return tr_session_enable(&fx_svc, uid, cfg, -1, &fx_observer, NULL, s, err, 256);
}

static void test_per_uid_limit(void **state) {
  struct fx_config c;
  tr_session *s;
  char err[256];
  (void)state;
  fx_setup();
  fx_config(&c, kNames);
  for (int i = 0; i < TR_SESSION_MAX_SESSIONS_PER_UID; i++)
    assert_int_equal(enable_as(1000, &c.cfg, &s, err), 0);
  assert_int_equal(enable_as(1000, &c.cfg, &s, err), TR_ERR_FULL);
  assert_string_equal(err, "Too many concurrent tracing sesions (5) for uid 1000 limit is 5");
  assert_int_equal(enable_as(1001, &c.cfg, &s, err), 0); /* another uid's own five */
  /* Root too, as in traced. */
  for (int i = 0; i < TR_SESSION_MAX_SESSIONS_PER_UID; i++)
    assert_int_equal(enable_as(0, &c.cfg, &s, err), 0);
  assert_int_equal(enable_as(0, &c.cfg, &s, err), TR_ERR_FULL);
  fx_teardown();
}

static void test_session_semaphores(void **state) {
  struct fx_config c;
  Perfetto__Protos__TraceConfig__SessionSemaphore sem =
      PERFETTO__PROTOS__TRACE_CONFIG__SESSION_SEMAPHORE__INIT, *semp = &sem;
  tr_session *a, *b, *s;
  char err[256];
  (void)state;
  fx_setup();
  fx_config(&c, kNames);
  sem.name = "gpu";
  c.cfg.n_session_semaphores = 1;
  c.cfg.session_semaphores = &semp;
  assert_int_equal(enable_as(0, &c.cfg, &a, err), 0);
  assert_int_equal(enable_as(0, &c.cfg, &s, err), TR_ERR_CONFIG);
  assert_string_equal(err,
                      "Semaphore \"gpu\" exceeds maximum allowed other session count (1 > min(0, "
                      "0))");
  tr_session_free(a);

  sem.has_max_other_session_count = 1;
  sem.max_other_session_count = 1;
  assert_int_equal(enable_as(0, &c.cfg, &a, err), 0);
  assert_int_equal(enable_as(0, &c.cfg, &b, err), 0);
  assert_int_equal(enable_as(0, &c.cfg, &s, err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "(2 > min(1, 1))"));
  /* A stopped session holds it no more. */
  tr_session_disable(b);
  assert_int_equal(tr_session_get_state(b), TR_SESSION_STOPPED);
  assert_int_equal(enable_as(0, &c.cfg, &s, err), 0);
  fx_teardown();
}

static char ended_with[128];
static size_t ends;

static void record_end(void *ud, const char *error) {
  (void)ud;
  snprintf(ended_with, sizeof ended_with, "%s", error ? error : "");
  ends++;
}

static const tr_session_observer kRecordEnd = {NULL, NULL, record_end, NULL};

static int enable_recording_end(Perfetto__Protos__TraceConfig *cfg, tr_session **s, char *err) {
  err[0] = '\0';
  return tr_session_enable(&fx_svc, 0, cfg, -1, &kRecordEnd, NULL, s, err, 256);
}

static void test_exclusive_prio(void **state) {
  struct fx_config c;
  tr_session *plain, *five, *s, *seven;
  char err[256];
  (void)state;
  ends = 0;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&c, kNames);
  assert_int_equal(enable_recording_end(&c.cfg, &plain, err), 0);
  assert_int_equal(ends, 0);

  c.cfg.has_exclusive_prio = 1;
  c.cfg.exclusive_prio = 5;
  assert_int_equal(enable_recording_end(&c.cfg, &five, err), 0);
  assert_int_equal(tr_session_get_state(plain), TR_SESSION_STOPPED); /* aborted */
  assert_int_equal(ends, 1);
  assert_string_equal(ended_with,
                      "Aborted due to user requested higher-priority (5) exclusive session.");
  assert_int_equal(tr_session_get_state(five), TR_SESSION_STARTED);

  c.cfg.exclusive_prio = 3;
  assert_int_equal(enable_as(0, &c.cfg, &s, err), TR_ERR_CONFIG);
  assert_string_equal(err, "An exclusive session with priority 5 >= requested priority 3 is "
                           "already active.");
  c.cfg.exclusive_prio = 0;
  assert_int_equal(enable_as(0, &c.cfg, &s, err), TR_ERR_CONFIG);

  c.cfg.exclusive_prio = 7;
  assert_int_equal(enable_recording_end(&c.cfg, &seven, err), 0);
  assert_int_equal(tr_session_get_state(five), TR_SESSION_STOPPED);
  assert_int_equal(ends, 2);
  assert_non_null(strstr(ended_with, "(7)"));
  assert_int_equal(tr_session_get_state(seven), TR_SESSION_STARTED);
  fx_teardown();
}

/* ---- flushes and the file ---- */

static void plan_of(Perfetto__Protos__TraceConfig *cfg, struct tr_config_flush_plan *p) {
  tr_config_check_flush_plan(cfg, 1, p);
}

static void test_flush_plan(void **state) {
  struct fx_config c;
  struct tr_config_flush_plan p;
  (void)state;
  fx_config(&c, kNames);
  c.cfg.flush_period_ms = 300;
  plan_of(&c.cfg, &p);
  assert_true(p.period_ms == 300 && !p.on_write && !p.fflush); /* no file: flush_period_ms */

  c.cfg.write_into_file = 1; /* AUTO, 5 s writes: flushes every 5 s instead */
  plan_of(&c.cfg, &p);
  assert_true(p.period_ms == TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS && !p.on_write);
  c.cfg.file_write_period_ms = 20000; /* AUTO, longer writes: a flush before each */
  plan_of(&c.cfg, &p);
  assert_true(p.period_ms == 0 && p.on_write);

  c.cfg.file_write_period_ms = 1000;
  c.cfg.write_flush_mode = PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_ENABLED;
  plan_of(&c.cfg, &p);
  assert_true(p.period_ms == 0 && p.on_write);
  c.cfg.write_flush_mode = PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_DISABLED;
  c.cfg.fflush_post_write = PERFETTO__PROTOS__TRACE_CONFIG__FFLUSH_MODE__FFLUSH_ENABLED;
  plan_of(&c.cfg, &p);
  assert_true(p.period_ms == 300 && !p.on_write && p.fflush);
}

static off_t file_size(const char *path) {
  struct stat st;
  assert_int_equal(stat(path, &st), 0);
  return st.st_size;
}

/* WRITE_FLUSH_ENABLED: no write into the file until the flush before it is answered. */
static void test_flush_before_write(void **state) {
  struct fx_config c;
  char path[] = "/tmp/tr_config_check_XXXXXX", err[256];
  tr_session *s;
  (void)state;
  fx_setup();
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&c, kNames);
  c.cfg.has_write_into_file = c.cfg.has_file_write_period_ms = c.cfg.has_write_flush_mode = 1;
  c.cfg.write_into_file = 1;
  c.cfg.file_write_period_ms = 100;
  c.cfg.write_flush_mode = PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_ENABLED;
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(tr_session_enable(&fx_svc, 0, &c.cfg, fd, &fx_observer, NULL, &s, err,
                                     sizeof err),
                   0);
  fx_answer(0, SETUP);
  fx_answer(0, TRACERELAY__COMMAND__CMD_START_DATA_SOURCE); /* a started instance to flush */
  for (int i = 0; i < 100000 && fx_count(0, FLUSH) == 0; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_equal(fx_count(0, FLUSH), 1);
  assert_int_equal(file_size(path), 0);
  fx_answer(0, FLUSH);
  for (int i = 0; i < 100000 && file_size(path) == 0; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_true(file_size(path) > 0);
  fx_teardown();
  unlink(path);
}

static void test_output_path_not_overwritten(void **state) {
  struct fx_config c;
  char path[] = "/tmp/tr_config_check_XXXXXX", err[256];
  tr_session *s = NULL;
  (void)state;
  fx_setup();
  fx_config(&c, kNames);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  c.cfg.has_write_into_file = 1;
  c.cfg.write_into_file = 1;
  c.cfg.output_path = path;
  assert_int_equal(tr_session_enable(&fx_svc, 0, &c.cfg, -1, &fx_observer, NULL, &s, err,
                                     sizeof err),
                   TR_ERR_SYS(EEXIST));
  assert_non_null(strstr(err, "it is never overwritten"));
  unlink(path);
  fx_teardown();
}

static void test_trace_uuid_from_config(void **state) {
  struct fx_config c;
  tr_session *s;
  tr_output_packet pkt;
  bool found = false;
  (void)state;
  fx_setup();
  fx_config(&c, kNames);
  c.cfg.has_trace_uuid_msb = c.cfg.has_trace_uuid_lsb = 1;
  c.cfg.trace_uuid_msb = 0x1234;
  c.cfg.trace_uuid_lsb = -5;
  s = fx_enable(&c);
  tr_trace_output *o = tr_session_output(s);
  assert_int_equal(tr_trace_output_begin(o), 0);
  while (!found && tr_trace_output_next(o, &pkt) == 1) {
    Perfetto__Protos__TracePacket *p = perfetto__protos__trace_packet__unpack(NULL, pkt.len,
                                                                             pkt.data);
    assert_non_null(p);
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_UUID) {
      assert_int_equal(p->trace_uuid->msb, 0x1234);
      assert_int_equal(p->trace_uuid->lsb, -5);
      found = true;
    }
    perfetto__protos__trace_packet__free_unpacked(p, NULL);
  }
  tr_trace_output_reset(o);
  assert_true(found);
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_field_decided),
      cmocka_unit_test(test_refused_field),
      cmocka_unit_test(test_refused_value),
      cmocka_unit_test(test_refused_nested_field),
      cmocka_unit_test(test_unknown_fields),
      cmocka_unit_test(test_data_source_unknown_fields),
      cmocka_unit_test(test_ignored_field_logged),
      cmocka_unit_test(test_named_buffers_checked),
      cmocka_unit_test(test_named_buffer_resolved),
      cmocka_unit_test(test_per_uid_limit),
      cmocka_unit_test(test_session_semaphores),
      cmocka_unit_test(test_exclusive_prio),
      cmocka_unit_test(test_flush_plan),
      cmocka_unit_test(test_flush_before_write),
      cmocka_unit_test(test_output_path_not_overwritten),
      cmocka_unit_test(test_trace_uuid_from_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
