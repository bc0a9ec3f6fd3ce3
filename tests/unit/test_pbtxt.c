/* test_pbtxt.c: the text-format parser and printer (relay/reading/pbtxt.h).
 *
 * The recorded CLI configs must pack to the trace_config the real `perfetto` CLI sent (minus the
 * fields it adds); every syntax form and every error path is exercised on TraceConfig and on a
 * hand-written descriptor covering the types our protos lack (float, sint64, sfixed32, required,
 * proto3, string defaults, self-nesting); printing real TracePackets round-trips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/config/trace_config.pb-c.h"
#include "perfetto/ipc/consumer_port.pb-c.h"
#include "perfetto/ipc/wire_protocol.pb-c.h"
#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/reading/pbtxt.h"
#include "relay/base/tr_error.h"

/* ---- a descriptor for the types the project's protos do not use ---- */

typedef struct all_types {
  ProtobufCMessage base;
  int32_t req;
  protobuf_c_boolean has_f;
  float f;
  protobuf_c_boolean has_s64;
  int64_t s64;
  protobuf_c_boolean has_sf32;
  int32_t sf32;
  size_t n_rf;
  float *rf;
  int32_t plain;
  char *s_def;
  struct all_types *child;
} all_types;

static char s_def_default[] = "dflt";
static const ProtobufCMessageDescriptor all_types_descriptor;

static void all_types_init(ProtobufCMessage *m) {
  memset(m, 0, sizeof(all_types));
  m->descriptor = &all_types_descriptor;
  ((all_types *)m)->s_def = s_def_default;
}

#define FIELD(name_, id_, label_, type_, q_, member_, desc_, def_)                                \
  {name_, id_, label_, type_, q_, offsetof(all_types, member_), desc_, def_, 0, 0, NULL, NULL}
static const ProtobufCFieldDescriptor all_types_fields[] = {
    FIELD("req", 1, PROTOBUF_C_LABEL_REQUIRED, PROTOBUF_C_TYPE_INT32, 0, req, NULL, NULL),
    FIELD("f", 2, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_FLOAT, offsetof(all_types, has_f), f,
          NULL, NULL),
    FIELD("s64", 3, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_SINT64,
          offsetof(all_types, has_s64), s64, NULL, NULL),
    FIELD("sf32", 4, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_SFIXED32,
          offsetof(all_types, has_sf32), sf32, NULL, NULL),
    FIELD("rf", 5, PROTOBUF_C_LABEL_REPEATED, PROTOBUF_C_TYPE_FLOAT, offsetof(all_types, n_rf), rf,
          NULL, NULL),
    FIELD("plain", 6, PROTOBUF_C_LABEL_NONE, PROTOBUF_C_TYPE_INT32, 0, plain, NULL, NULL),
    FIELD("s_def", 7, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_STRING, 0, s_def, NULL,
          s_def_default),
    FIELD("child", 8, PROTOBUF_C_LABEL_OPTIONAL, PROTOBUF_C_TYPE_MESSAGE, 0, child,
          &all_types_descriptor, NULL),
};
/* Indices of the fields in name order (memcmp order: "s64" < "s_def" < "sf32"). */
static const unsigned all_types_by_name[] = {7, 1, 5, 0, 4, 2, 6, 3};
static const ProtobufCIntRange all_types_ranges[] = {{1, 0}, {0, 8}};
static const ProtobufCMessageDescriptor all_types_descriptor = {
    PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC, "test.AllTypes", "AllTypes", "AllTypes", "test",
    sizeof(all_types), 8, all_types_fields, all_types_by_name, 1, all_types_ranges,
    all_types_init, NULL, NULL, NULL};

/* ---- helpers ---- */

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static ProtobufCMessage *parse_ok(const ProtobufCMessageDescriptor *d, const char *text) {
  ProtobufCMessage *m = NULL;
  tr_pbtxt_error err;
  int rc = tr_pbtxt_parse(d, text, strlen(text), "t", &m, &err);
  if (rc != 0)
    fail_msg("parse of <%s> failed: %s", text, err.msg);
  return m;
}

static Perfetto__Protos__TraceConfig *config_ok(const char *text) {
  return (Perfetto__Protos__TraceConfig *)parse_ok(&perfetto__protos__trace_config__descriptor,
                                                   text);
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
  *len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(*len + 1);
  assert_non_null(buf);
  assert_int_equal(protobuf_c_message_pack(m, buf), *len);
  return buf;
}

static char *print(const ProtobufCMessage *m) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  assert_non_null(out);
  assert_int_equal(tr_pbtxt_print(out, m), 0);
  fclose(out);
  return text;
}

/* ---- the recorded CLI configs ---- */

/* Unsets an optional scalar field, by name. */
static void clear_scalar(ProtobufCMessage *m, const char *name) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
  assert_non_null(f);
  assert_true(*(protobuf_c_boolean *)((char *)m + f->quantifier_offset));
  *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 0;
}

/* The trace_config of the EnableTracing request (the second frame) in a to-service stream,
 * without what the perfetto CLI adds on its own. */
static Perfetto__Protos__TraceConfig *recorded_config(const char *capture) {
  char path[512];
  size_t len, off = 0;
  snprintf(path, sizeof path, "%s/ipc/%s.to-service.bin", TR_VECTORS_DIR, capture);
  uint8_t *bin = read_file(path, &len);
  off += 4 + (bin[0] | bin[1] << 8 | bin[2] << 16 | (uint32_t)bin[3] << 24); /* BindService */
  uint32_t n = bin[off] | bin[off + 1] << 8 | bin[off + 2] << 16 | (uint32_t)bin[off + 3] << 24;
  Perfetto__Protos__IPCFrame *frame = perfetto__protos__ipcframe__unpack(NULL, n, bin + off + 4);
  assert_non_null(frame);
  assert_non_null(frame->msg_invoke_method);
  assert_int_equal(frame->msg_invoke_method->method_id, 1); /* EnableTracing */
  Perfetto__Protos__EnableTracingRequest *req = perfetto__protos__enable_tracing_request__unpack(
      NULL, frame->msg_invoke_method->args_proto.len, frame->msg_invoke_method->args_proto.data);
  assert_non_null(req);
  Perfetto__Protos__TraceConfig *cfg = req->trace_config;
  req->trace_config = NULL;
  perfetto__protos__enable_tracing_request__free_unpacked(req, NULL);
  perfetto__protos__ipcframe__free_unpacked(frame, NULL);
  free(bin);

  clear_scalar(&cfg->base, "enable_extra_guardrails");
  clear_scalar(&cfg->base, "trace_uuid_msb"); /* deprecated: not named in C */
  clear_scalar(&cfg->base, "trace_uuid_lsb");
  clear_scalar(&cfg->base, "statsd_logging");
  assert_non_null(cfg->statsd_metadata);
  protobuf_c_message_free_unpacked(&cfg->statsd_metadata->base, NULL);
  cfg->statsd_metadata = NULL;
  return cfg;
}

static void check_capture(const char *capture) {
  char path[512];
  size_t len, got_len, want_len;
  snprintf(path, sizeof path, "%s/ipc/%s.config.pbtxt", TR_VECTORS_DIR, capture);
  char *text = (char *)read_file(path, &len);
  ProtobufCMessage *parsed = NULL;
  tr_pbtxt_error err;
  int rc = tr_pbtxt_parse(&perfetto__protos__trace_config__descriptor, text, len, path, &parsed,
                          &err);
  if (rc != 0)
    fail_msg("%s", err.msg);
  Perfetto__Protos__TraceConfig *want = recorded_config(capture);
  uint8_t *got_bytes = pack(parsed, &got_len);
  uint8_t *want_bytes = pack(&want->base, &want_len);
  assert_int_equal(got_len, want_len);
  assert_memory_equal(got_bytes, want_bytes, got_len);
  free(got_bytes);
  free(want_bytes);
  protobuf_c_message_free_unpacked(parsed, NULL);
  protobuf_c_message_free_unpacked(&want->base, NULL);
  free(text);
}

static void test_recorded_cli_config(void **state) {
  (void)state;
  check_capture("consumer-cli");
}

static void test_recorded_cli_relay_config(void **state) {
  (void)state;
  check_capture("consumer-cli-relay");
}

/* ---- syntax ---- */

static void test_syntax_forms(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig *c = config_ok(
      "# a comment\n"
      "buffers { size_kb: 0x100 fill_policy: DISCARD }\n"
      "buffers: { size_kb: 010; fill_policy: 1 },\n" /* octal, enum by number */
      "buffers < name: 'b3' >\n"
      "data_sources {\n"
      "  config { name: \"track\" \"_event\" target_buffer: 2 }  # adjacent literals\n"
      "  producer_name_filter: [\"a\", 'b']\n"
      "  producer_name_filter: \"c\"\n"
      "  machine_name_filter: []\n"
      "}\n"
      "duration_ms: 1000;\n"
      "write_into_file: t\n"
      "deferred_start: False\n"
      "statsd_metadata { triggering_alert_id: -9223372036854775808 }\n"
      "max_file_size_bytes: 18446744073709551615\n"
      "bugreport_score: -0x10\n"
      "activate_triggers: [\"x\\ty\", '\\'q\\'', \"\\101\\x42\\x4\"]\n"
      "trigger_config { triggers { name: \"t\" skip_probability: 2.5e-1 } }\n"
      "trace_filter { bytecode: \"\\000\\xff\\n\" }");
  assert_int_equal(c->n_buffers, 3);
  assert_int_equal(c->buffers[0]->size_kb, 256);
  assert_int_equal(c->buffers[0]->fill_policy,
                   PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__DISCARD);
  assert_int_equal(c->buffers[1]->size_kb, 8);
  assert_int_equal(c->buffers[1]->fill_policy, 1);
  assert_string_equal(c->buffers[2]->name, "b3");
  assert_int_equal(c->n_data_sources, 1);
  assert_string_equal(c->data_sources[0]->config->name, "track_event");
  assert_int_equal(c->data_sources[0]->config->target_buffer, 2);
  assert_int_equal(c->data_sources[0]->n_producer_name_filter, 3);
  assert_string_equal(c->data_sources[0]->producer_name_filter[1], "b");
  assert_string_equal(c->data_sources[0]->producer_name_filter[2], "c");
  assert_int_equal(c->data_sources[0]->n_machine_name_filter, 0);
  assert_true(c->has_duration_ms && c->duration_ms == 1000);
  assert_true(c->has_write_into_file && c->write_into_file);
  assert_true(c->has_deferred_start && !c->deferred_start);
  assert_true(c->statsd_metadata->triggering_alert_id == INT64_MIN);
  assert_true(c->max_file_size_bytes == UINT64_MAX);
  assert_int_equal(c->bugreport_score, -16);
  assert_int_equal(c->n_activate_triggers, 3);
  assert_string_equal(c->activate_triggers[0], "x\ty");
  assert_string_equal(c->activate_triggers[1], "'q'");
  assert_string_equal(c->activate_triggers[2], "AB\x04");
  assert_true(c->trigger_config->triggers[0]->skip_probability == 0.25);
  assert_int_equal(c->trace_filter->bytecode.len, 3);
  assert_memory_equal(c->trace_filter->bytecode.data, "\0\xff\n", 3);
  protobuf_c_message_free_unpacked(&c->base, NULL);
}

static void test_empty_input_is_empty_message(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig *c = config_ok("  # nothing\n");
  assert_int_equal(c->n_buffers, 0);
  assert_false(c->has_duration_ms);
  protobuf_c_message_free_unpacked(&c->base, NULL);
}

/* Found by fuzz_pbtxt: an empty literal has no buffer at all. */
static void test_empty_literals(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig *c =
      config_ok("unique_session_name: \"\" trace_filter { bytecode: '' }");
  assert_string_equal(c->unique_session_name, "");
  assert_true(c->trace_filter->has_bytecode);
  assert_int_equal(c->trace_filter->bytecode.len, 0);
  char *text = print(&c->base);
  assert_string_equal(text, "unique_session_name: \"\"\ntrace_filter {\n  bytecode: \"\"\n}\n");
  free(text);
  protobuf_c_message_free_unpacked(&c->base, NULL);
}

static void test_other_types(void **state) {
  (void)state;
  all_types *m = (all_types *)parse_ok(
      &all_types_descriptor,
      "req: -2147483648 f: 1.5f s64: -9223372036854775808 sf32: -0x80000000 "
      "rf: [inf, -Infinity, nan, 1e3, .5, 2] plain: 7 child { req: 1 child { req: 2 } }");
  assert_int_equal(m->req, INT32_MIN);
  assert_true(m->has_f && m->f == 1.5f);
  assert_true(m->s64 == INT64_MIN);
  assert_int_equal(m->sf32, INT32_MIN);
  assert_int_equal(m->n_rf, 6);
  assert_true(isinf(m->rf[0]) && m->rf[0] > 0);
  assert_true(isinf(m->rf[1]) && m->rf[1] < 0);
  assert_true(isnan(m->rf[2]));
  assert_true(m->rf[3] == 1000.0f && m->rf[4] == 0.5f && m->rf[5] == 2.0f);
  assert_int_equal(m->plain, 7);
  assert_string_equal(m->s_def, "dflt"); /* untouched default, not freed */
  assert_int_equal(m->child->child->req, 2);
  protobuf_c_message_free_unpacked(&m->base, NULL);

  m = (all_types *)parse_ok(&all_types_descriptor, "req: 1 s_def: 'set'");
  assert_string_equal(m->s_def, "set");
  protobuf_c_message_free_unpacked(&m->base, NULL);
}

/* ---- errors ---- */

struct error_case {
  const char *text;
  unsigned line, column;
  const char *what; /* the message after "t:L:C: " */
};

static const struct error_case config_errors[] = {
    {"\n\n    bufers {}", 3, 5, "unknown field 'bufers' in perfetto.protos.TraceConfig"},
    {"buffers { size_kb: 1 sise_kb: 2 }", 1, 22,
     "unknown field 'sise_kb' in perfetto.protos.TraceConfig.BufferConfig"},
    {"duration_ms 5", 1, 13, "expected ':' after field 'duration_ms'"},
    {"duration_ms: -5", 1, 14, "negative value '-5' for unsigned field 'duration_ms'"},
    {"duration_ms: 4294967296", 1, 14,
     "value '4294967296' out of range for uint32 field 'duration_ms'"},
    {"statsd_metadata { triggering_alert_id: 9223372036854775808 }", 1, 40,
     "value '9223372036854775808' out of range for int64 field 'triggering_alert_id'"},
    {"max_file_size_bytes: 18446744073709551616", 1, 22,
     "invalid uint64 value '18446744073709551616' for field 'max_file_size_bytes'"},
    {"duration_ms: 12abc", 1, 14, "invalid uint32 value '12abc' for field 'duration_ms'"},
    {"duration_ms: 09", 1, 14, "invalid uint32 value '09' for field 'duration_ms'"},
    {"duration_ms: 0x", 1, 14, "invalid uint32 value '0x' for field 'duration_ms'"},
    {"duration_ms: 1 duration_ms: 2", 1, 16,
     "field 'duration_ms' given twice in perfetto.protos.TraceConfig (it is not repeated)"},
    {"buffers { fill_policy: RINGBUFFER }", 1, 24,
     "unknown value 'RINGBUFFER' for enum field 'fill_policy' "
     "(perfetto.protos.TraceConfig.BufferConfig.FillPolicy)"},
    {"buffers { fill_policy: 2147483648 }", 1, 24,
     "value '2147483648' out of range for enum field 'fill_policy'"},
    {"write_into_file: yes", 1, 18, "invalid bool value 'yes' for field 'write_into_file'"},
    {"trigger_config { triggers { skip_probability: 1.5.5 } }", 1, 47,
     "invalid double value '1.5.5' for field 'skip_probability'"},
    {"trigger_config { triggers { skip_probability: abc } }", 1, 47,
     "invalid double value 'abc' for field 'skip_probability'"},
    {"unique_session_name: \"abc", 1, 26, "unterminated string in field 'unique_session_name'"},
    {"unique_session_name: \"ab\nc\"", 1, 25,
     "unterminated string in field 'unique_session_name'"},
    {"unique_session_name: \"a\\qb\"", 1, 25, "unknown escape '\\q'"},
    {"unique_session_name: \"a\\", 1, 25, "unterminated string"},
    {"unique_session_name: \"a\\0b\"", 1, 22,
     "string field 'unique_session_name' cannot hold a NUL byte (use bytes)"},
    {"unique_session_name: \"\\400\"", 1, 27, "octal escape over \\377"},
    {"unique_session_name: \"\\xZ\"", 1, 25, "\\x needs hex digits"},
    {"unique_session_name: 5", 1, 22,
     "expected a quoted string for field 'unique_session_name'"},
    {"buffers { size_kb: 1", 1, 21, "missing '}' to close perfetto.protos.TraceConfig.BufferConfig"},
    {"buffers < size_kb: 1 }", 1, 22,
     "expected a field name of perfetto.protos.TraceConfig.BufferConfig, got '}'"},
    {"}", 1, 1, "expected a field name of perfetto.protos.TraceConfig, got '}'"},
    {"buffers: 5", 1, 10,
     "expected '{' to open message field 'buffers' (perfetto.protos.TraceConfig.BufferConfig)"},
    {"[foo.bar] {}", 1, 1,
     "extensions and Any ('[...]') are not supported in perfetto.protos.TraceConfig"},
    {"activate_triggers: [\"a\"; \"b\"]", 1, 24,
     "expected ',' or ']' in the list for field 'activate_triggers'"},
    {"activate_triggers: [\"a\",]", 1, 25,
     "expected a quoted string for field 'activate_triggers'"},
    {"duration_ms:", 1, 13, "expected a value, got end of input"},
    {"duration_ms: {", 1, 14, "expected a value, got '{'"},
    {"duration_ms: -", 1, 15, "expected a value, got end of input"},
    {"trace_filter { bytecode: 'a' bytecode: 'b' }", 1, 30,
     "field 'bytecode' given twice in perfetto.protos.TraceConfig.TraceFilter "
     "(it is not repeated)"},
    {"duration_ms: 1111111111111111111111111111111111111111111111111111111111111111111", 1, 14,
     "value is too long"},
};

static void check_error(const ProtobufCMessageDescriptor *d, const struct error_case *e) {
  ProtobufCMessage *m = (ProtobufCMessage *)1;
  tr_pbtxt_error err;
  char want[400];
  int rc = tr_pbtxt_parse(d, e->text, strlen(e->text), "t", &m, &err);
  if (rc != TR_ERR_DECODE)
    fail_msg("<%s>: rc %d, want a decode error", e->text, rc);
  assert_null(m);
  snprintf(want, sizeof want, "t:%u:%u: %s", e->line, e->column, e->what);
  if (strcmp(err.msg, want) != 0)
    fail_msg("<%s>:\n got  %s\n want %s", e->text, err.msg, want);
  assert_int_equal(err.line, e->line);
  assert_int_equal(err.column, e->column);
}

static void test_config_errors(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof config_errors / sizeof config_errors[0]; i++)
    check_error(&perfetto__protos__trace_config__descriptor, &config_errors[i]);
}

static void test_type_errors(void **state) {
  (void)state;
  static const struct error_case cases[] = {
      {"f: 1.0", 1, 7, "missing required field 'req' in test.AllTypes"},
      {"req: 1 child { }", 1, 17, "missing required field 'req' in test.AllTypes"},
      {"req: 2147483648", 1, 6, "value '2147483648' out of range for int32 field 'req'"},
      {"req: -2147483649", 1, 6, "value '-2147483649' out of range for int32 field 'req'"},
      {"req: 1 s64: -9223372036854775809", 1, 13,
       "value '-9223372036854775809' out of range for sint64 field 's64'"},
      {"req: 1 sf32: 0x80000000", 1, 14,
       "value '0x80000000' out of range for sfixed32 field 'sf32'"},
      {"req: 1 f: 1e", 1, 11, "invalid float value '1e' for field 'f'"},
      {"req: 1 f: -", 1, 12, "expected a value, got end of input"},
      {"req: 1 plain: 1 plain: 2", 1, 17,
       "field 'plain' given twice in test.AllTypes (it is not repeated)"},
      {"req: 1 child { req: 1 child { req: 1 } child {} }", 1, 40,
       "field 'child' given twice in test.AllTypes (it is not repeated)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_error(&all_types_descriptor, &cases[i]);
}

static void test_oneof_conflict(void **state) {
  (void)state;
  static const struct error_case c = {
      "trace_config { duration_ms: 1 } synchronization_marker: 'x'", 1, 33,
      "field 'synchronization_marker' conflicts with 'trace_config' (same oneof) in "
      "perfetto.protos.TracePacket"};
  check_error(&perfetto__protos__trace_packet__descriptor, &c);
  Perfetto__Protos__TracePacket *p = (Perfetto__Protos__TracePacket *)parse_ok(
      &perfetto__protos__trace_packet__descriptor, "synchronization_marker: '\\x01'");
  assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_SYNCHRONIZATION_MARKER);
  assert_int_equal(p->synchronization_marker.len, 1);
  protobuf_c_message_free_unpacked(&p->base, NULL);
}

static void test_depth_and_size_caps(void **state) {
  (void)state;
  char text[2048] = "";
  ProtobufCMessage *m;
  tr_pbtxt_error err;
  for (int i = 0; i < TR_PBTXT_MAX_DEPTH; i++)
    strcat(text, "req: 1 child {");
  strcat(text, "req: 1");
  for (int i = 0; i < TR_PBTXT_MAX_DEPTH; i++)
    strcat(text, "}");
  m = parse_ok(&all_types_descriptor, text); /* exactly at the cap */
  protobuf_c_message_free_unpacked(m, NULL);

  text[0] = '\0';
  for (int i = 0; i <= TR_PBTXT_MAX_DEPTH; i++)
    strcat(text, "req: 1 child {");
  assert_int_equal(tr_pbtxt_parse(&all_types_descriptor, text, strlen(text), "t", &m, &err),
                   TR_ERR_TOO_BIG);
  assert_null(m);
  assert_non_null(strstr(err.msg, "messages nested deeper than 32 at field 'child'"));

  char *big = calloc(TR_PBTXT_MAX_INPUT + 1, 1);
  assert_non_null(big);
  memset(big, ' ', TR_PBTXT_MAX_INPUT + 1);
  assert_int_equal(tr_pbtxt_parse(&all_types_descriptor, big, TR_PBTXT_MAX_INPUT + 1, NULL, &m,
                                  &err),
                   TR_ERR_TOO_BIG);
  assert_string_equal(err.msg, "<input>:1:1: input is 1048577 bytes, over the 1048576-byte limit");
  free(big);
}

static void test_null_error_is_allowed(void **state) {
  (void)state;
  ProtobufCMessage *m;
  assert_int_equal(tr_pbtxt_parse(&perfetto__protos__trace_config__descriptor, "x", 1, NULL, &m,
                                  NULL),
                   TR_ERR_DECODE);
  assert_null(m);
}

/* ---- printer ---- */

static void test_print_config(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig *c =
      config_ok("buffers { size_kb: 4096 fill_policy: DISCARD } data_sources { config { name: "
                "\"track_event\" } machine_name_filter: [\"a\", \"b\"] } duration_ms: 1000 "
                "unique_session_name: \"q\\\"\\\\\\001\" trace_filter { bytecode: \"\\377\" }");
  char *text = print(&c->base);
  assert_string_equal(text, "buffers {\n"
                            "  size_kb: 4096\n"
                            "  fill_policy: DISCARD\n"
                            "}\n"
                            "data_sources {\n"
                            "  config {\n"
                            "    name: \"track_event\"\n"
                            "  }\n"
                            "  machine_name_filter: \"a\"\n"
                            "  machine_name_filter: \"b\"\n"
                            "}\n"
                            "duration_ms: 1000\n"
                            "unique_session_name: \"q\\\"\\\\\\001\"\n"
                            "trace_filter {\n"
                            "  bytecode: \"\\377\"\n"
                            "}\n");
  free(text);
  protobuf_c_message_free_unpacked(&c->base, NULL);
}

static void test_print_other_types_round_trip(void **state) {
  (void)state;
  all_types *m = (all_types *)parse_ok(
      &all_types_descriptor, "req: -5 f: 0.1 s64: -3 sf32: 7 rf: [-inf, nan, 3.40282347e38] "
                             "plain: 9 child { req: 1 }");
  char *text = print(&m->base);
  assert_string_equal(text, "req: -5\nf: 0.100000001\ns64: -3\nsf32: 7\nrf: -inf\nrf: nan\n"
                            "rf: 3.40282347e+38\nplain: 9\nchild {\n  req: 1\n}\n");
  all_types *again = (all_types *)parse_ok(&all_types_descriptor, text);
  assert_true(again->f == m->f && again->rf[2] == m->rf[2] && isnan(again->rf[1]));
  free(text);
  protobuf_c_message_free_unpacked(&again->base, NULL);
  protobuf_c_message_free_unpacked(&m->base, NULL);
}

/* Removes `# ...` comment lines, which is all the printer adds that the parser drops. */
static void strip_comments(char *text) {
  char *out = text;
  for (char *line = text; *line;) {
    char *end = strchr(line, '\n');
    size_t n = end ? (size_t)(end - line) + 1 : strlen(line);
    const char *s = line + strspn(line, " ");
    if (*s != '#') {
      memmove(out, line, n);
      out += n;
    }
    line += n;
  }
  *out = '\0';
}

static uint64_t read_varint(const uint8_t *buf, size_t len, size_t *off) {
  uint64_t v = 0;
  for (int shift = 0; *off < len && shift < 64; shift += 7) {
    uint8_t b = buf[(*off)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return v;
  }
  fail_msg("bad varint at %zu", *off);
  return 0;
}

/* Every packet of real traces: print, parse back, print again: the same text, comments aside. */
static void test_print_trace_packets_round_trip(void **state) {
  (void)state;
  static const char *const traces[] = {"sdk-track-event", "traced-relay-2machines"};
  for (size_t t = 0; t < 2; t++) {
    char path[512];
    size_t len, off = 0, packets = 0;
    snprintf(path, sizeof path, "%s/traces/%s.pftrace", TR_VECTORS_DIR, traces[t]);
    uint8_t *trace = read_file(path, &len);
    while (off < len) {
      assert_int_equal(trace[off++], 0x0a);
      uint64_t n = read_varint(trace, len, &off);
      assert_true(n <= len - off);
      ProtobufCMessage *pkt = protobuf_c_message_unpack(&perfetto__protos__trace_packet__descriptor,
                                                        NULL, n, trace + off);
      assert_non_null(pkt);
      char *text = print(pkt);
      strip_comments(text);
      ProtobufCMessage *again = parse_ok(&perfetto__protos__trace_packet__descriptor, text);
      char *text2 = print(again);
      assert_string_equal(text, text2);
      free(text);
      free(text2);
      protobuf_c_message_free_unpacked(again, NULL);
      protobuf_c_message_free_unpacked(pkt, NULL);
      off += n;
      packets++;
    }
    assert_true(packets > 10);
    free(trace);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recorded_cli_config),
      cmocka_unit_test(test_recorded_cli_relay_config),
      cmocka_unit_test(test_syntax_forms),
      cmocka_unit_test(test_empty_input_is_empty_message),
      cmocka_unit_test(test_empty_literals),
      cmocka_unit_test(test_other_types),
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_type_errors),
      cmocka_unit_test(test_oneof_conflict),
      cmocka_unit_test(test_depth_and_size_caps),
      cmocka_unit_test(test_null_error_is_allowed),
      cmocka_unit_test(test_print_config),
      cmocka_unit_test(test_print_other_types_round_trip),
      cmocka_unit_test(test_print_trace_packets_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
