/* test_trace_filter.c: relay/trace/trace_filter against traced v58.2: the recorded triple
 * (trace-filter-unfiltered.pftrace, trace-filter.bytecode, and what v58.2's proto_filter made
 * of them) replayed byte for byte; bytecodes that must be refused, with traced's reasons; the
 * overlay; each string filter policy; malformed packets and the counts. */
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
#include "relay/base/varint.h"
#include "relay/trace/trace_filter.h"

struct buf {
  uint8_t *p;
  size_t n;
};

static struct buf slurp(const char *rel) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", TR_VECTORS_DIR, rel);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  struct buf b = {malloc((size_t)ftell(f) + 1), (size_t)ftell(f)};
  fseek(f, 0, SEEK_SET);
  assert_int_equal(fread(b.p, 1, b.n, f), b.n);
  fclose(f);
  return b;
}

/* Bytecode from words: their varints, then the checksum traced expects. */
static struct buf code(const uint32_t *w, size_t n) {
  struct buf b = {malloc(11 * (n + 1)), 0};
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    b.n += tr_varint_put(b.p + b.n, w[i]);
    for (int k = 0; k < 4; k++)
      h = (h ^ (uint8_t)(w[i] >> (8 * k))) * 0x100000001b3ull;
  }
  b.n += tr_varint_put(b.p + b.n, (uint32_t)h);
  return b;
}

#define W(field, op) (((uint32_t)(field) << 3) | (op))
#define CODE(...) code((const uint32_t[]){__VA_ARGS__}, sizeof((uint32_t[]){__VA_ARGS__}) / 4)

static tr_trace_filter *loaded(struct buf bc, struct buf ov) {
  tr_trace_filter *f = tr_trace_filter_new();
  assert_non_null(f);
  assert_int_equal(tr_trace_filter_load(f, bc.p, bc.n, ov.p, ov.n), 0);
  free(bc.p);
  free(ov.p);
  return f;
}

/* Filters one contiguous message; returns its output (n = SIZE_MAX on an error). */
static struct buf run(tr_trace_filter *f, const void *in, size_t n) {
  struct buf out = {malloc(n + 1), 0};
  tr_trace_filter_slice s = {in, n};
  if (tr_trace_filter_run(f, &s, 1, out.p, &out.n) != 0)
    out.n = SIZE_MAX;
  return out;
}

static void expect(tr_trace_filter *f, const char *in, size_t in_len, const char *want,
                   size_t want_len) {
  struct buf out = run(f, in, in_len);
  assert_int_equal(out.n, want_len);
  assert_memory_equal(out.p, want, want_len);
  free(out.p);
}
#define EXPECT(f, in, want) expect(f, in, sizeof in - 1, want, sizeof want - 1)

/* Next top-level Trace.packet of a trace file: payload and the width of its length varint. */
static bool next_packet(const struct buf *t, size_t *pos, const uint8_t **p, size_t *len,
                        size_t *width) {
  uint64_t tag, l;
  size_t at;
  if (*pos >= t->n)
    return false;
  assert_true(tr_varint_get(t->p, t->n, pos, &tag));
  assert_int_equal(tag, 0x0a);
  at = *pos;
  assert_true(tr_varint_get(t->p, t->n, pos, &l));
  *width = *pos - at;
  *p = t->p + *pos;
  *len = (size_t)l;
  *pos += (size_t)l;
  return true;
}

/* The recorded triple: every packet of the unfiltered trace through our filter, framed as
 * proto_filter frames them (Trace.packet's length keeps the input's varint width), gives the
 * offline-filtered file byte for byte: all 3023 packets, the last (trace_stats) too, since the
 * offline tool filters it (traced itself does not: see test_trace_filter.sh). */
static void test_recorded_triple(void **state) {
  (void)state;
  struct buf in = slurp("traces/trace-filter-unfiltered.pftrace");
  struct buf want = slurp("traces/trace-filter-unfiltered.offline-filtered.pftrace");
  struct buf bc = slurp("ipc/trace-filter.bytecode");
  struct buf got = {malloc(in.n), 0};
  tr_trace_filter *f = tr_trace_filter_new();
  size_t pos = 0, packets = 0, differ = 0, wpos = 0;
  const uint8_t *p;
  size_t len, width;

  assert_int_equal(tr_trace_filter_load(f, bc.p, bc.n, NULL, 0), 0);
  assert_int_equal(tr_trace_filter_set_root(f, 1), 0);
  while (next_packet(&in, &pos, &p, &len, &width)) {
    tr_trace_filter_slice s = {p, len};
    uint8_t *o = malloc(len + 1);
    size_t olen, wlen, wwidth;
    const uint8_t *wp;
    assert_int_equal(tr_trace_filter_run(f, &s, 1, o, &olen), 0);
    size_t payload = olen;
    got.p[got.n++] = 0x0a;
    for (size_t i = 0; i < width; i++) /* the input's width, as proto_filter keeps it */
      got.p[got.n++] = (uint8_t)(((olen >> (7 * i)) & 0x7f) | (i + 1 < width ? 0x80 : 0));
    memcpy(got.p + got.n, o, payload);
    got.n += payload;
    assert_true(next_packet(&want, &wpos, &wp, &wlen, &wwidth));
    if (wlen != payload || memcmp(wp, o, payload) != 0) {
      print_message("packet %zu differs (%zu bytes, want %zu)\n", packets, payload, wlen);
      differ++;
    }
    free(o);
    packets++;
  }
  assert_int_equal(packets, 3023);
  assert_int_equal(differ, 0);
  assert_int_equal(got.n, want.n);
  assert_memory_equal(got.p, want.p, want.n);

  tr_trace_filter_stats st;
  tr_trace_filter_get_stats(f, &st);
  assert_int_equal(st.input_packets, 3023);
  assert_int_equal(st.errors, 0);
  assert_true(st.output_bytes < st.input_bytes);
  tr_trace_filter_free(f);
  free(in.p);
  free(want.p);
  free(bc.p);
  free(got.p);
}

static int refused(const uint8_t *bc, size_t n, const uint8_t *ov, size_t ov_n) {
  tr_trace_filter *f = tr_trace_filter_new();
  int rc = tr_trace_filter_load(f, bc, n, ov, ov_n);
  tr_trace_filter_free(f);
  return rc;
}

static void test_invalid_bytecode(void **state) {
  (void)state;
  struct buf bc = slurp("ipc/trace-filter.bytecode");
  uint8_t *b = malloc(bc.n);
  /* the vector is valid; each damage to it is refused */
  assert_int_equal(refused(bc.p, bc.n, NULL, 0), 0);
  assert_int_equal(refused(bc.p, bc.n - 1, NULL, 0), TR_ERR_DECODE); /* truncated */
  memcpy(b, bc.p, bc.n);
  b[bc.n - 1] ^= 0x01; /* the checksum's last byte */
  assert_int_equal(refused(b, bc.n, NULL, 0), TR_ERR_DECODE);
  memcpy(b, bc.p, bc.n);
  b[0] ^= 0x08; /* a word changed: the checksum no longer matches */
  assert_int_equal(refused(b, bc.n, NULL, 0), TR_ERR_DECODE);
  assert_int_equal(refused((const uint8_t *)"\377\377\377", 3, NULL, 0), TR_ERR_DECODE);
  assert_int_equal(refused((const uint8_t *)"", 0, NULL, 0), TR_ERR_DECODE);

  struct buf c;
  c = CODE(W(1, 3), 5, 0); /* nested index 5 with one message */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);
  c = CODE(W(1, 3), 1, 0, W(2, 1), 0); /* the same, in range: accepted */
  assert_int_equal(refused(c.p, c.n, NULL, 0), 0);
  free(c.p);
  c = CODE(W(1, 1)); /* not ended by END_OF_MESSAGE */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);
  c = CODE(W(0, 1), 0); /* field 0 */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);
  c = CODE(W(1, 6), 0); /* unknown opcode */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);
  c = CODE(W(1, 3)); /* nested without its index */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);
  c = CODE(W(200, 2), 10, W(205, 1), 0); /* overlapping ranges above 127 */
  assert_int_equal(refused(c.p, c.n, NULL, 0), TR_ERR_DECODE);
  free(c.p);

  /* overlays: unsorted, a bad opcode, a message the bytecode lacks, not triples */
  struct buf base = CODE(W(1, 1), 0);
  struct buf ov = CODE(0, W(3, 4), 0, 0, W(2, 4), 0);
  assert_int_equal(refused(base.p, base.n, ov.p, ov.n), TR_ERR_DECODE);
  free(ov.p);
  ov = CODE(0, W(3, 3), 1);
  assert_int_equal(refused(base.p, base.n, ov.p, ov.n), TR_ERR_DECODE);
  free(ov.p);
  ov = CODE(1, W(3, 1), 0);
  assert_int_equal(refused(base.p, base.n, ov.p, ov.n), TR_ERR_DECODE);
  free(ov.p);
  ov = CODE(0, W(3, 1));
  assert_int_equal(refused(base.p, base.n, ov.p, ov.n), TR_ERR_DECODE);
  free(ov.p);
  free(base.p);
  free(b);
  free(bc.p);
}

/* From a TraceConfig.trace_filter, with traced's reasons. */
static void test_config_errors(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig__TraceFilter tf = PERFETTO__PROTOS__TRACE_CONFIG__TRACE_FILTER__INIT;
  tr_trace_filter *f = NULL;
  char err[256] = "";
  struct buf bc = slurp("ipc/trace-filter.bytecode");

  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Trace filter bytecode invalid");
  tf.has_bytecode_v2 = 1;
  tf.bytecode_v2 = (ProtobufCBinaryData){3, (uint8_t *)"\377\377\377"};
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Trace filter bytecode invalid");
  tf.bytecode_v2 = (ProtobufCBinaryData){bc.n, bc.p};
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), 0);
  tr_trace_filter_free(f);
  /* v1 is read when v2 is empty */
  tf.has_bytecode_v2 = 0;
  tf.has_bytecode = 1;
  tf.bytecode = (ProtobufCBinaryData){bc.n, bc.p};
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), 0);
  tr_trace_filter_free(f);

  struct buf noroot = CODE(W(2, 1), 0); /* Trace.packet not a message */
  tf.bytecode = (ProtobufCBinaryData){noroot.n, noroot.p};
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Failed to set filter root.");
  free(noroot.p);
  tf.bytecode = (ProtobufCBinaryData){bc.n, bc.p};

  Perfetto__Protos__TraceConfig__TraceFilter__StringFilterRule rule =
      PERFETTO__PROTOS__TRACE_CONFIG__TRACE_FILTER__STRING_FILTER_RULE__INIT;
  Perfetto__Protos__TraceConfig__TraceFilter__StringFilterRule *rules[] = {&rule};
  Perfetto__Protos__TraceConfig__TraceFilter__StringFilterChain chain =
      PERFETTO__PROTOS__TRACE_CONFIG__TRACE_FILTER__STRING_FILTER_CHAIN__INIT;
  chain.n_rules = 1;
  chain.rules = rules;
  tf.string_filter_chain = &chain;
  rule.regex_pattern = "x";
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Trace filter has invalid string filtering rules"); /* SFP_UNSPECIFIED */
  rule.has_policy = 1;
  rule.policy = PERFETTO__PROTOS__TRACE_CONFIG__TRACE_FILTER__STRING_FILTER_POLICY__SFP_MATCH_BREAK;
  int32_t types[] = {128};
  rule.semantic_type = types;
  rule.n_semantic_type = 1;
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_string_equal(err, "Trace filter has invalid semantic types in string filtering rules");
  rule.n_semantic_type = 0;
  rule.regex_pattern = "a(b";
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "Trace filter has invalid string filtering rules: regex_pattern"));
  rule.regex_pattern = "\\d+";
  assert_int_equal(tr_trace_filter_from_config(&tf, &f, err, sizeof err), 0);
  tr_trace_filter_free(f);
  free(bc.p);
}

/* Root message 0: 1 simple, 2 nested (message 1), 3 string filtered, 4 string, 5 fixed32
 * simple. Message 1: 1 simple, 2 filtered string of semantic type 7. */
static tr_trace_filter *sample(void) {
  return loaded(CODE(W(1, 1), W(2, 3), 1, W(3, 4), W(4, 1), W(5, 1), 0, W(1, 1), W(2, 5), 7, 0),
                (struct buf){NULL, 0});
}

static void test_walk(void **state) {
  (void)state;
  tr_trace_filter *f = sample();
  /* kept fields copied, a dropped varint (6), dropped bytes (7), fixed64 dropped (8) */
  EXPECT(f, "\x08\x05\x30\x01\x3a\x02hi\x41\1\2\3\4\5\6\7\x08\x2d\1\2\3\4",
         "\x08\x05\x2d\1\2\3\4");
  /* a redundant varint and tag are re-encoded minimally */
  EXPECT(f, "\x88\x00\x85\x80\x00", "\x08\x05");
  /* a nested message that shrinks keeps its length varint's width */
  char in[140] = "\x12\x85\x01\x08\x01\x1a";
  in[6] = (char)0x80;
  in[7] = 0x01;
  memset(in + 8, 'x', 128); /* field 3 of message 1 (not allowed): 128 bytes dropped */
  expect(f, in, 3 + 133, "\x12\x82\x00\x08\x01", 5);
  /* an empty nested message is kept as an empty field */
  EXPECT(f, "\x12\x00", "\x12\x00");
  /* field number 0 is not a field: its tag and length are read and dropped, and what would
   * be its payload is read as fields */
  EXPECT(f, "\x02\x02\x08\x07", "\x08\x07");
  tr_trace_filter_free(f);
}

static void test_malformed(void **state) {
  (void)state;
  tr_trace_filter *f = sample();
  struct buf o;
  const char *bad[] = {
      "\x0b",                 /* wire type 3 */
      "\x08",                 /* ends inside a field */
      "\x22\x05" "ab",           /* longer than the message */
      "\x12\x02\x08",         /* a nested message ending inside its field... */
      "\x12\x01\x08\x01",     /* ...or a field running past it */
      "\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", /* an 11-byte varint */
  };
  size_t lens[] = {1, 1, 4, 3, 4, 12};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    o = run(f, bad[i], lens[i]);
    assert_int_equal(o.n, SIZE_MAX);
    free(o.p);
  }
  o = run(f, "", 0); /* an empty message: an error for traced too */
  assert_int_equal(o.n, SIZE_MAX);
  free(o.p);
  tr_trace_filter_stats st;
  tr_trace_filter_get_stats(f, &st);
  assert_int_equal(st.errors, 7);
  assert_int_equal(st.input_packets, 7);
  assert_int_equal(st.output_bytes, 0);
  /* slices are one message: a field split across them reads as one */
  tr_trace_filter_slice s[] = {{(const uint8_t *)"\x08", 1}, {(const uint8_t *)"\x05\x28", 2},
                               {(const uint8_t *)"\x09", 1}};
  uint8_t out[8];
  size_t n;
  assert_int_equal(tr_trace_filter_run(f, s, 3, out, &n), 0);
  assert_int_equal(n, 4); /* field 5 is fixed32 simple, but here a varint: kept as a varint */
  assert_memory_equal(out, "\x08\x05\x28\x09", 4);
  tr_trace_filter_free(f);
}

static void add_rule(tr_trace_filter *f, int policy, const char *re, const char *prefix,
                     const char *name) {
  char err[256];
  tr_trace_filter_rule r = {.policy = policy, .regex = re, .atrace_prefix = prefix, .name = name};
  assert_int_equal(tr_trace_filter_add_rule(f, &r, err, sizeof err), 0);
}

static void check_string(tr_trace_filter *f, const char *in, const char *want, bool changed) {
  char s[256];
  snprintf(s, sizeof s, "%s", in);
  assert_int_equal(tr_trace_filter_string(f, s, strlen(s), 0), changed);
  assert_string_equal(s, want);
}

static void test_string_policies(void **state) {
  (void)state;
  tr_trace_filter *f = tr_trace_filter_new();
  check_string(f, "no rules", "no rules", false);
  add_rule(f, TR_SFP_MATCH_BREAK, "keep (me)", NULL, NULL);
  add_rule(f, TR_SFP_MATCH_REDACT_GROUPS, "user=(\\w+) id=(\\d+)", NULL, NULL);
  add_rule(f, TR_SFP_ATRACE_MATCH_BREAK, "B\\|[0-9]+\\|sys: (.*)", "sys", NULL);
  add_rule(f, TR_SFP_ATRACE_MATCH_REDACT_GROUPS, "B\\|[0-9]+\\|(.*): (.*)", "", NULL);
  check_string(f, "keep me", "keep me", false);               /* break: untouched */
  check_string(f, "user=alexandrinaXY id=12", "user=P60REDACTED-- id=P6", true);
  check_string(f, "user=alexandra id=12", "user=P60REDACT id=P6", true); /* cut short */
  check_string(f, "xuser=al id=1", "xuser=al id=1", false);  /* not a whole match */
  check_string(f, "B|12|sys: secret", "B|12|sys: secret", false); /* atrace break */
  check_string(f, "B|12|app: secret", "B|12|P60: P60RED", true);
  check_string(f, "E|12|app: secret", "E|12|app: secret", false); /* 'E' is never atrace */
  tr_trace_filter_free(f);

  f = tr_trace_filter_new();
  add_rule(f, TR_SFP_ATRACE_REPEATED_SEARCH_REDACT_GROUPS, "k=([a-z]+)", "ev", NULL);
  check_string(f, "B|1|ev k=abc k=de z", "B|1|ev k=P60 k=P6 z", true);
  check_string(f, "B|1|other k=abc", "B|1|other k=abc", false); /* prefix differs */
  check_string(f, "C|1|ev none", "C|1|ev none", false);
  tr_trace_filter_free(f);

  /* a named rule replaces the one of that name, in place */
  f = tr_trace_filter_new();
  add_rule(f, TR_SFP_MATCH_REDACT_GROUPS, "(a+)", NULL, "r");
  add_rule(f, TR_SFP_MATCH_BREAK, "a+", NULL, "r");
  check_string(f, "aaa", "aaa", false);
  tr_trace_filter_free(f);
}

/* Semantic types: a rule applies to the types it lists (none: unspecified only); a typed
 * string field passes its type from the bytecode. */
static void test_semantic_types(void **state) {
  (void)state;
  tr_trace_filter *f = sample();
  char err[256];
  int32_t seven[] = {7};
  tr_trace_filter_rule untyped = {.policy = TR_SFP_MATCH_REDACT_GROUPS, .regex = "(.*)"};
  tr_trace_filter_rule typed = {.policy = TR_SFP_MATCH_REDACT_GROUPS, .regex = "x(.*)",
                                .semantic_types = seven, .n_semantic_types = 1};
  assert_int_equal(tr_trace_filter_add_rule(f, &typed, err, sizeof err), 0);
  /* field 3 (untyped filter string) is left alone by the type-7 rule */
  EXPECT(f, "\x1a\x03xyz", "\x1a\x03xyz");
  /* field 2.2 is type 7: redacted */
  EXPECT(f, "\x12\x05\x12\x03xyz", "\x12\x05\x12\x03xP6");
  assert_int_equal(tr_trace_filter_add_rule(f, &untyped, err, sizeof err), 0);
  EXPECT(f, "\x1a\x03xyz", "\x1a\x03P60");
  /* field 4, a plain string, is never filtered */
  EXPECT(f, "\x22\x03xyz", "\x22\x03xyz");
  tr_trace_filter_free(f);
}

/* The v54 overlay: upgrades a field (4: simple -> filter string), adds one (6) before a field
 * and one (9) at the message's end; a field 200 goes into the ranges. */
static void test_overlay(void **state) {
  (void)state;
  tr_trace_filter *f = loaded(CODE(W(4, 1), W(7, 1), 0),
                              CODE(0, W(4, 4), 0, 0, W(6, 1), 0, 0, W(9, 1), 0, 0, W(200, 1), 0));
  char err[256];
  tr_trace_filter_rule r = {.policy = TR_SFP_MATCH_REDACT_GROUPS, .regex = "(.*)"};
  assert_int_equal(tr_trace_filter_add_rule(f, &r, err, sizeof err), 0);
  EXPECT(f, "\x22\x02" "ab\x30\x01\x38\x02\x48\x03\xc0\x0c\x04\x50\x05",
         "\x22\x02P6\x30\x01\x38\x02\x48\x03\xc0\x0c\x04");
  tr_trace_filter_free(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recorded_triple), cmocka_unit_test(test_invalid_bytecode),
      cmocka_unit_test(test_config_errors),   cmocka_unit_test(test_walk),
      cmocka_unit_test(test_malformed),       cmocka_unit_test(test_string_policies),
      cmocka_unit_test(test_semantic_types),  cmocka_unit_test(test_overlay),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
