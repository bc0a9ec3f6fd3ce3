/* test_packet_rewrite.c: the global-clocks rewrite (relay/trace/packet_rewrite.h), rule by rule on
 * packets built with protobuf-c, on the SDK packets of a recorded v58.2 trace, on ftrace bundles,
 * on malformed input, and the service's cross-host ClockSnapshot. Every check compares bytes
 * where the rule promises bytes: only the fields concerned may differ. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/base/fnv1a.h"
#include "relay/trace/packet_rewrite.h"
#include "relay/base/tr_error.h"

#define MACHINE "web-3"
#define G(name) tr_global_clock_id(MACHINE, name)
#define SHARED_ID 0x80001234u

typedef Perfetto__Protos__TracePacket Packet;
typedef Perfetto__Protos__ClockSnapshot Snapshot;
typedef Perfetto__Protos__ClockSnapshot__Clock Clock;

static tr_rewrite_host host;

static int setup(void **state) {
  (void)state;
  uint32_t shared[] = {SHARED_ID};
  return tr_rewrite_host_init(&host, MACHINE, shared, 1);
}

struct buf {
  uint8_t *p;
  size_t n;
};

static struct buf pack(const Packet *p) {
  struct buf b = {malloc(perfetto__protos__trace_packet__get_packed_size(p) + 1), 0};
  b.n = perfetto__protos__trace_packet__pack(p, b.p);
  return b;
}

/* Rewrites with exactly TR_REWRITE_OUT_MAX bytes of room; anchor into `anchor`. */
static struct buf rewrite(tr_rewrite_seq *seq, struct buf in, struct buf *anchor) {
  struct buf out = {malloc(TR_REWRITE_OUT_MAX(in.n)), 0};
  static uint8_t anchor_bytes[TR_REWRITE_ANCHOR_MAX];
  size_t anchor_len = 99;
  int n = tr_rewrite_packet(&host, seq, in.p, in.n, out.p, TR_REWRITE_OUT_MAX(in.n), anchor_bytes,
                            &anchor_len);
  assert_true(n >= 0);
  out.n = (size_t)n;
  if (anchor) {
    anchor->p = anchor_bytes;
    anchor->n = anchor_len;
  } else {
    assert_int_equal(anchor_len, 0);
  }
  return out;
}

static void assert_bytes_equal(struct buf a, struct buf b) {
  assert_int_equal(a.n, b.n);
  assert_memory_equal(a.p, b.p, a.n);
}

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    p[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[n++] = (uint8_t)v;
  return n;
}

/* in + an appended timestamp_clock_id field. */
static struct buf with_clock_appended(struct buf in, uint32_t id) {
  struct buf b = {malloc(in.n + 8), in.n};
  memcpy(b.p, in.p, in.n);
  b.n += put_varint(b.p + b.n, 58u << 3);
  b.n += put_varint(b.p + b.n, id);
  return b;
}

static void test_host_init_and_ids(void **state) {
  (void)state;
  tr_rewrite_host h;
  assert_int_equal(tr_rewrite_host_init(&h, "", NULL, 0), TR_ERR_INVAL);
  char long_name[TR_REWRITE_MACHINE_MAX + 2];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  assert_int_equal(tr_rewrite_host_init(&h, long_name, NULL, 0), TR_ERR_INVAL);
  long_name[TR_REWRITE_MACHINE_MAX] = 0;
  assert_int_equal(tr_rewrite_host_init(&h, long_name, NULL, 0), 0);
  uint32_t bad[] = {127};
  assert_int_equal(tr_rewrite_host_init(&h, "x", bad, 1), TR_ERR_INVAL);
  uint32_t many[TR_REWRITE_SHARED_MAX + 1] = {0};
  assert_int_equal(tr_rewrite_host_init(&h, "x", many, TR_REWRITE_SHARED_MAX + 1),
                   TR_ERR_TOO_BIG);

  /* Named builtins hash their relay/clock/clock.h name, everything else its decimal id. */
  assert_int_equal(tr_rewrite_clock_id(&host, TR_CLOCK_BOOTTIME), G("BOOTTIME"));
  assert_int_equal(tr_rewrite_clock_id(&host, TR_CLOCK_REALTIME_COARSE), G("REALTIME_COARSE"));
  assert_int_equal(tr_rewrite_clock_id(&host, 9), G("9"));
  assert_int_equal(tr_rewrite_clock_id(&host, 0x80000abcu), G("2147486396"));
  assert_int_equal(tr_rewrite_clock_id(&host, 0), 0);
  assert_int_equal(tr_rewrite_clock_id(&host, 64), 64);
  assert_int_equal(tr_rewrite_clock_id(&host, 127), 127);
  assert_int_equal(tr_rewrite_clock_id(&host, SHARED_ID), SHARED_ID);
}

/* (a) An explicit builtin or global id is rewritten in place; 0 and 64..127 are not. */
static void test_explicit_clock_id(void **state) {
  (void)state;
  Perfetto__Protos__TrackEvent te = PERFETTO__PROTOS__TRACK_EVENT__INIT;
  te.has_track_uuid = 1;
  te.track_uuid = 42;
  Packet p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.has_timestamp = 1;
  p.timestamp = 123456789;
  p.has_timestamp_clock_id = 1;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT;
  p.track_event = &te;

  const struct {
    uint32_t in, want;
  } cases[] = {{TR_CLOCK_MONOTONIC, G("MONOTONIC")}, {TR_CLOCK_BOOTTIME, G("BOOTTIME")},
               {9, G("9")},                         {64, 64},
               {100, 100},                          {0x80000abcu, G("2147486396")},
               {SHARED_ID, SHARED_ID}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    tr_rewrite_seq seq = {0};
    p.timestamp_clock_id = cases[i].in;
    struct buf in = pack(&p);
    p.timestamp_clock_id = cases[i].want;
    struct buf want = pack(&p);
    struct buf out = rewrite(&seq, in, NULL);
    assert_bytes_equal(out, want);
    free(in.p), free(want.p), free(out.p);
  }
}

/* (b) An implicit clock gets the host's BOOTTIME appended unless the sequence has a default. */
static void test_implicit_clock(void **state) {
  (void)state;
  Packet p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.has_timestamp = 1;
  p.timestamp = 1000;
  struct buf in = pack(&p);
  tr_rewrite_seq seq = {0};
  struct buf out = rewrite(&seq, in, NULL);
  struct buf want = with_clock_appended(in, G("BOOTTIME"));
  assert_bytes_equal(out, want);
  free(out.p), free(want.p);

  /* An explicit 0 means "no clock" too; last-wins makes the appended id the one read. */
  p.has_timestamp_clock_id = 1;
  p.timestamp_clock_id = 0;
  struct buf zero = pack(&p);
  out = rewrite(&seq, zero, NULL);
  want = with_clock_appended(zero, G("BOOTTIME"));
  assert_bytes_equal(out, want);
  free(out.p), free(want.p), free(zero.p);
  p.has_timestamp_clock_id = 0;

  /* No timestamp: nothing to qualify. */
  Packet bare = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  bare.has_sequence_flags = 1;
  bare.sequence_flags = 2;
  struct buf b = pack(&bare);
  out = rewrite(&seq, b, NULL);
  assert_bytes_equal(out, b);
  free(out.p), free(b.p);

  /* A default clock on the sequence (here in the same packet) covers later packets. */
  Perfetto__Protos__TracePacketDefaults d = PERFETTO__PROTOS__TRACE_PACKET_DEFAULTS__INIT;
  d.has_timestamp_clock_id = 1;
  d.timestamp_clock_id = 64;
  Packet first = p;
  first.trace_packet_defaults = &d;
  first.has_sequence_flags = 1;
  first.sequence_flags = 1;
  struct buf f = pack(&first);
  out = rewrite(&seq, f, NULL);
  assert_bytes_equal(out, f);
  assert_true(seq.default_clock);
  free(out.p), free(f.p);
  out = rewrite(&seq, in, NULL);
  assert_bytes_equal(out, in);
  free(out.p);

  /* Clearing incremental state drops the default... */
  Packet clear = p;
  clear.has_incremental_state_cleared = 1;
  clear.incremental_state_cleared = 1;
  struct buf c = pack(&clear);
  out = rewrite(&seq, c, NULL);
  want = with_clock_appended(c, G("BOOTTIME"));
  assert_bytes_equal(out, want);
  assert_false(seq.default_clock);
  free(out.p), free(want.p), free(c.p);

  /* ...and defaults without a clock do not set one. */
  Perfetto__Protos__TrackEventDefaults ted = PERFETTO__PROTOS__TRACK_EVENT_DEFAULTS__INIT;
  ted.has_track_uuid = 1;
  ted.track_uuid = 7;
  Perfetto__Protos__TracePacketDefaults no_clock = PERFETTO__PROTOS__TRACE_PACKET_DEFAULTS__INIT;
  no_clock.track_event_defaults = &ted;
  Packet nd = p;
  nd.trace_packet_defaults = &no_clock;
  struct buf ndb = pack(&nd);
  out = rewrite(&seq, ndb, NULL);
  want = with_clock_appended(ndb, G("BOOTTIME"));
  assert_bytes_equal(out, want);
  free(out.p), free(want.p), free(ndb.p), free(in.p);
}

/* (c) TracePacketDefaults: its clock mapped, its other sub-fields kept. */
static void test_defaults(void **state) {
  (void)state;
  Perfetto__Protos__TrackEventDefaults ted = PERFETTO__PROTOS__TRACK_EVENT_DEFAULTS__INIT;
  ted.has_track_uuid = 1;
  ted.track_uuid = 2807931957846312434ull;
  Perfetto__Protos__TracePacketDefaults d = PERFETTO__PROTOS__TRACE_PACKET_DEFAULTS__INIT;
  d.track_event_defaults = &ted;
  d.has_timestamp_clock_id = 1;
  d.timestamp_clock_id = TR_CLOCK_MONOTONIC_RAW;
  Packet p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.trace_packet_defaults = &d;
  p.has_sequence_flags = 1;
  p.sequence_flags = 1;
  struct buf in = pack(&p);
  d.timestamp_clock_id = G("MONOTONIC_RAW");
  struct buf want = pack(&p);
  tr_rewrite_seq seq = {0};
  struct buf out = rewrite(&seq, in, NULL);
  assert_bytes_equal(out, want);
  assert_true(seq.default_clock);
  free(in.p), free(want.p), free(out.p);
}

/* (d) ClockSnapshot: builtin and own global ids mapped, 64..127 and shared ids kept, the other
 * Clock fields kept, primary_trace_clock removed. */
static void test_snapshot(void **state) {
  (void)state;
  Clock c[6] = {PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT,
                PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT,
                PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT,
                PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT,
                PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT,
                PERFETTO__PROTOS__CLOCK_SNAPSHOT__CLOCK__INIT};
  const uint32_t ids[6] = {TR_CLOCK_BOOTTIME, 64, TR_CLOCK_REALTIME, 9, 0x80000abcu, SHARED_ID};
  const uint32_t want_ids[6] = {G("BOOTTIME"), 64, G("REALTIME"), G("9"), G("2147486396"),
                                SHARED_ID};
  Clock *cp[6];
  for (int i = 0; i < 6; i++) {
    c[i].has_clock_id = 1;
    c[i].clock_id = ids[i];
    c[i].has_timestamp = 1;
    c[i].timestamp = 1000000u * (uint64_t)(i + 1);
    cp[i] = &c[i];
  }
  c[1].has_is_incremental = 1;
  c[1].is_incremental = 1;
  c[1].has_unit_multiplier_ns = 1;
  c[1].unit_multiplier_ns = 1000;
  Snapshot snap = PERFETTO__PROTOS__CLOCK_SNAPSHOT__INIT;
  snap.n_clocks = 6;
  snap.clocks = cp;
  snap.has_primary_trace_clock = 1;
  snap.primary_trace_clock = PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME;
  Packet p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT;
  p.clock_snapshot = &snap;
  struct buf in = pack(&p);
  for (int i = 0; i < 6; i++)
    c[i].clock_id = want_ids[i];
  snap.has_primary_trace_clock = 0;
  struct buf want = pack(&p);
  tr_rewrite_seq seq = {0};
  struct buf out = rewrite(&seq, in, NULL);
  assert_bytes_equal(out, want);
  free(in.p), free(want.p), free(out.p);
}

/* Fields the rewrite does not know, at any wire type, pass through byte for byte and in place;
 * so do odd encodings of the fields it reads but keeps (a padded 64, a padded timestamp). */
static void test_unknown_fields_kept(void **state) {
  (void)state;
  static const uint8_t in[] = {
      0xa2, 0x38, 0x03, 'x', 'y', 'z',       /* 900: bytes (for_testing) */
      0x40, 0x85, 0x80, 0x00,                /* 8 timestamp = 5, padded varint */
      0xd5, 0x04, 1, 2, 3, 4,                /* 74: fixed32 */
      0xd0, 0x03, 0x06,                      /* 58 = BOOTTIME */
      0xb1, 0x7d, 1, 2, 3, 4, 5, 6, 7, 8,    /* 2006: fixed64 */
      0xd0, 0x03, 0xc0, 0x80, 0x00,          /* 58 = 64, padded: last wins */
      0xfa, 0x3f, 0x02, 0x08, 0x01,          /* 1023: a nested message */
  };
  uint8_t want[sizeof in + 4];
  size_t n = 0;
  memcpy(want, in, 16);
  n = 16;
  n += put_varint(want + n, 58u << 3);
  n += put_varint(want + n, G("BOOTTIME"));
  memcpy(want + n, in + 19, sizeof in - 19);
  n += sizeof in - 19;
  tr_rewrite_seq seq = {0};
  struct buf out = rewrite(&seq, (struct buf){(uint8_t *)in, sizeof in}, NULL);
  assert_bytes_equal(out, (struct buf){want, n});
  free(out.p);
}

/* A top-level field walk of a message, for the byte comparisons below. */
struct walked {
  uint32_t num[64];
  const uint8_t *raw[64];
  size_t raw_len[64];
  const uint8_t *data[64]; /* length-delimited payload */
  size_t len[64];
  size_t n;
};

static void walk(const uint8_t *p, size_t len, struct walked *w) {
  size_t pos = 0;
  w->n = 0;
  while (pos < len) {
    assert_true(w->n < 64);
    size_t start = pos;
    uint64_t tag = 0, v = 0;
    for (unsigned shift = 0;; shift += 7) {
      tag |= (uint64_t)(p[pos] & 0x7f) << shift;
      if (!(p[pos++] & 0x80))
        break;
    }
    w->num[w->n] = (uint32_t)(tag >> 3);
    w->data[w->n] = NULL;
    switch (tag & 7) {
    case 0:
      while (p[pos++] & 0x80)
        ;
      break;
    case 1: pos += 8; break;
    case 5: pos += 4; break;
    case 2:
      for (unsigned shift = 0;; shift += 7) {
        v |= (uint64_t)(p[pos] & 0x7f) << shift;
        if (!(p[pos++] & 0x80))
          break;
      }
      w->data[w->n] = p + pos;
      w->len[w->n] = (size_t)v;
      pos += (size_t)v;
      break;
    default: fail();
    }
    w->raw[w->n] = p + start;
    w->raw_len[w->n] = pos - start;
    w->n++;
  }
  assert_int_equal(pos, len);
}

/* Same fields in the same order, byte-identical except fields `a` and `b`. */
static void assert_same_except(struct buf x, struct buf y, uint32_t a, uint32_t b) {
  struct walked wx, wy;
  walk(x.p, x.n, &wx);
  walk(y.p, y.n, &wy);
  assert_int_equal(wx.n, wy.n);
  for (size_t i = 0; i < wx.n; i++) {
    assert_int_equal(wx.num[i], wy.num[i]);
    if (wx.num[i] == a || wx.num[i] == b)
      continue;
    assert_int_equal(wx.raw_len[i], wy.raw_len[i]);
    assert_memory_equal(wx.raw[i], wy.raw[i], wx.raw_len[i]);
  }
}

/* A snapshot field's Clocks differ from the original's only in their clock_id. */
static void assert_snapshot_kept(struct buf in, struct buf out) {
  struct walked wi, wo, si, so;
  walk(in.p, in.n, &wi);
  walk(out.p, out.n, &wo);
  for (size_t i = 0; i < wi.n; i++) {
    if (wi.num[i] != 6)
      continue;
    walk(wi.data[i], wi.len[i], &si);
    walk(wo.data[i], wo.len[i], &so);
    assert_int_equal(si.n, so.n);
    for (size_t k = 0; k < si.n; k++) {
      assert_int_equal(si.num[k], 1);
      assert_same_except((struct buf){(uint8_t *)si.data[k], si.len[k]},
                         (struct buf){(uint8_t *)so.data[k], so.len[k]}, 1, 1);
    }
  }
}

static uint32_t want_id(uint32_t id) {
  char decimal[12];
  if (id == 0 || id >= 64)
    return id;
  snprintf(decimal, sizeof decimal, "%u", id);
  return G(tr_clock_name(id) ? tr_clock_name(id) : decimal);
}

/* The SDK packets of a recorded v58.2 trace (sequences >= 2; 1 is the service's), rewritten
 * for "web-3": each one's builtin ids replaced, its clock 64 untouched, every other byte kept. */
static void test_sdk_trace(void **state) {
  (void)state;
  FILE *f = fopen(TR_VECTORS_DIR "/traces/sdk-track-event.pftrace", "rb");
  assert_non_null(f);
  static uint8_t trace[1 << 16];
  size_t size = fread(trace, 1, sizeof trace, f);
  fclose(f);
  assert_true(size > 0 && size < sizeof trace);

  struct walked records;
  tr_rewrite_seq seqs[16] = {{0}};
  size_t producer_packets = 0, snapshots = 0, defaults = 0, boottime_rewritten = 0;
  size_t explicit_builtin = 0;
  size_t pos = 0;
  while (pos < size) {
    /* The trace is records of `0x0A varint(len) packet`: walk a window of them at a time. */
    size_t start = pos;
    for (int i = 0; i < 32 && pos < size; i++) {
      assert_int_equal(trace[pos], 0x0a);
      pos++;
      uint64_t n = 0;
      for (unsigned shift = 0;; shift += 7) {
        n |= (uint64_t)(trace[pos] & 0x7f) << shift;
        if (!(trace[pos++] & 0x80))
          break;
      }
      pos += (size_t)n;
    }
    walk(trace + start, pos - start, &records);
    for (size_t r = 0; r < records.n; r++) {
      struct buf in = {(uint8_t *)records.data[r], records.len[r]};
      Packet *orig = perfetto__protos__trace_packet__unpack(NULL, in.n, in.p);
      assert_non_null(orig);
      uint32_t seq_id = orig->trusted_packet_sequence_id;
      if (seq_id < 2) {
        perfetto__protos__trace_packet__free_unpacked(orig, NULL);
        continue;
      }
      assert_true(seq_id < 16);
      producer_packets++;
      struct buf out = rewrite(&seqs[seq_id], in, NULL);
      Packet *got = perfetto__protos__trace_packet__unpack(NULL, out.n, out.p);
      assert_non_null(got);

      /* Every SDK sequence sets default clock 64 first: nothing is appended, and only a
       * snapshot (6) or an explicit builtin clock (58) may change. */
      uint32_t changed[2] = {0, 0};
      if (orig->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT) {
        snapshots++;
        changed[0] = 6;
        Snapshot *a = orig->clock_snapshot, *b = got->clock_snapshot;
        assert_int_equal(a->n_clocks, b->n_clocks);
        assert_false(b->has_primary_trace_clock);
        for (size_t i = 0; i < a->n_clocks; i++) {
          assert_int_equal(b->clocks[i]->clock_id, want_id(a->clocks[i]->clock_id));
          boottime_rewritten += a->clocks[i]->clock_id == TR_CLOCK_BOOTTIME;
          assert_true(b->clocks[i]->clock_id >= 64);
          assert_int_equal(b->clocks[i]->timestamp, a->clocks[i]->timestamp);
          assert_int_equal(b->clocks[i]->is_incremental, a->clocks[i]->is_incremental);
          assert_int_equal(b->clocks[i]->unit_multiplier_ns, a->clocks[i]->unit_multiplier_ns);
        }
        assert_snapshot_kept(in, out);
      }
      if (orig->trace_packet_defaults) {
        defaults++;
        assert_int_equal(got->trace_packet_defaults->timestamp_clock_id,
                         orig->trace_packet_defaults->timestamp_clock_id);
        assert_int_equal(orig->trace_packet_defaults->timestamp_clock_id, 64);
      }
      if (orig->has_timestamp_clock_id) {
        assert_int_equal(got->timestamp_clock_id, want_id(orig->timestamp_clock_id));
        explicit_builtin += orig->timestamp_clock_id < 64;
        changed[1] = 58;
      }
      assert_same_except(in, out, changed[0], changed[1]);
      perfetto__protos__trace_packet__free_unpacked(orig, NULL);
      perfetto__protos__trace_packet__free_unpacked(got, NULL);
      free(out.p);
    }
  }
  assert_true(producer_packets > 100);
  assert_true(snapshots >= 1);
  assert_int_equal(boottime_rewritten, snapshots);
  assert_true(defaults >= 1);
  print_message("SDK trace: %zu producer packets, %zu snapshots, %zu explicit builtin clocks\n",
                producer_packets, snapshots, explicit_builtin);
}

static Packet bundle_packet(Perfetto__Protos__FtraceEventBundle *b) {
  Packet p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_FTRACE_EVENTS;
  p.ftrace_events = b;
  return p;
}

static void assert_anchor(struct buf anchor, uint32_t clock, uint64_t ts64, uint64_t ts) {
  Packet *a = perfetto__protos__trace_packet__unpack(NULL, anchor.n, anchor.p);
  assert_non_null(a);
  assert_int_equal(a->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT);
  Snapshot *s = a->clock_snapshot;
  assert_int_equal(s->n_clocks, 2);
  assert_false(s->has_primary_trace_clock);
  assert_int_equal(s->clocks[0]->clock_id, 64);
  assert_int_equal(s->clocks[0]->timestamp, ts64);
  assert_false(s->clocks[0]->is_incremental);
  assert_int_equal(s->clocks[1]->clock_id, clock);
  assert_int_equal(s->clocks[1]->timestamp, ts);
  assert_false(a->has_timestamp || a->has_timestamp_clock_id);
  perfetto__protos__trace_packet__free_unpacked(a, NULL);
}

/* The bundle's fields other than 5, 6, 7 keep their bytes; returns the rewritten bundle. */
static Perfetto__Protos__FtraceEventBundle *assert_bundle_kept(struct buf in, struct buf out) {
  struct walked wi, wo;
  walk(in.p, in.n, &wi);
  walk(out.p, out.n, &wo);
  assert_int_equal(wi.n, 1);
  assert_int_equal(wo.n, 1);
  struct walked bi, bo;
  walk(wi.data[0], wi.len[0], &bi);
  walk(wo.data[0], wo.len[0], &bo);
  size_t j = 0;
  for (size_t i = 0; i < bi.n; i++) {
    if (bi.num[i] >= 5 && bi.num[i] <= 7)
      continue;
    while (j < bo.n && bo.num[j] >= 5 && bo.num[j] <= 7)
      j++;
    assert_true(j < bo.n);
    assert_int_equal(bi.raw_len[i], bo.raw_len[j]);
    assert_memory_equal(bi.raw[i], bo.raw[j], bi.raw_len[i]);
    j++;
  }
  Packet *p = perfetto__protos__trace_packet__unpack(NULL, out.n, out.p);
  assert_non_null(p);
  Perfetto__Protos__FtraceEventBundle *b = p->ftrace_events;
  p->ftrace_events = NULL;
  p->data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA__NOT_SET;
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
  return b;
}

/* (e) ftrace: bundles read as the sequence's clock 64, anchored to the host's clock. */
static void test_ftrace(void **state) {
  (void)state;
  Perfetto__Protos__FtraceEvent ev[2] = {PERFETTO__PROTOS__FTRACE_EVENT__INIT,
                                         PERFETTO__PROTOS__FTRACE_EVENT__INIT};
  Perfetto__Protos__FtraceEvent *evp[2] = {&ev[0], &ev[1]};
  for (int i = 0; i < 2; i++) {
    ev[i].has_timestamp = 1;
    ev[i].timestamp = 5000000000ull + (uint64_t)i;
    ev[i].has_pid = 1;
    ev[i].pid = 100 + (uint32_t)i;
  }
  Perfetto__Protos__FtraceEventBundle b = PERFETTO__PROTOS__FTRACE_EVENT_BUNDLE__INIT;
  b.has_cpu = 1;
  b.cpu = 1;
  b.n_event = 2;
  b.event = evp;
  b.has_previous_bundle_end_timestamp = 1;
  b.previous_bundle_end_timestamp = 4999999999ull;
  Packet p = bundle_packet(&b);

  /* BOOTTIME (no ftrace_clock): GLOBAL, one identity anchor per sequence. */
  tr_rewrite_seq seq = {0};
  struct buf in = pack(&p), anchor;
  struct buf out = rewrite(&seq, in, &anchor);
  assert_anchor(anchor, G("BOOTTIME"), 0, 0);
  Perfetto__Protos__FtraceEventBundle *got = assert_bundle_kept(in, out);
  assert_true(got->has_ftrace_clock);
  assert_int_equal(got->ftrace_clock, PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL);
  assert_false(got->has_ftrace_timestamp || got->has_boot_timestamp);
  assert_int_equal(got->n_event, 2);
  assert_int_equal(got->event[1]->timestamp, 5000000001ull);
  perfetto__protos__ftrace_event_bundle__free_unpacked(got, NULL);
  free(out.p);
  out = rewrite(&seq, in, &anchor);
  assert_int_equal(anchor.n, 0);
  free(out.p), free(in.p);

  /* MONO_RAW: the same, anchored to the host's MONOTONIC_RAW. */
  seq = (tr_rewrite_seq){0};
  b.has_ftrace_clock = 1;
  b.ftrace_clock = PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_MONO_RAW;
  in = pack(&p);
  out = rewrite(&seq, in, &anchor);
  assert_anchor(anchor, G("MONOTONIC_RAW"), 0, 0);
  got = assert_bundle_kept(in, out);
  assert_int_equal(got->ftrace_clock, PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL);
  perfetto__protos__ftrace_event_bundle__free_unpacked(got, NULL);
  free(out.p), free(in.p);

  /* GLOBAL with its pair: the pair moves into an anchor to the host's BOOTTIME, written again
   * only when it changes. */
  seq = (tr_rewrite_seq){0};
  b.ftrace_clock = PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_LOCAL;
  b.has_ftrace_timestamp = b.has_boot_timestamp = 1;
  b.ftrace_timestamp = 700;
  b.boot_timestamp = 5000000700;
  in = pack(&p);
  out = rewrite(&seq, in, &anchor);
  assert_anchor(anchor, G("BOOTTIME"), 700, 5000000700);
  got = assert_bundle_kept(in, out);
  assert_int_equal(got->ftrace_clock, PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_LOCAL);
  assert_false(got->has_ftrace_timestamp || got->has_boot_timestamp);
  perfetto__protos__ftrace_event_bundle__free_unpacked(got, NULL);
  free(out.p);
  out = rewrite(&seq, in, &anchor);
  assert_int_equal(anchor.n, 0);
  free(out.p), free(in.p);
  b.ftrace_timestamp = 900;
  in = pack(&p);
  out = rewrite(&seq, in, &anchor);
  assert_anchor(anchor, G("BOOTTIME"), 900, 5000000700);
  free(out.p), free(in.p);

  /* GLOBAL without a pair, and an unknown clock: unchanged. */
  b.ftrace_clock = PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL;
  b.has_ftrace_timestamp = 0;
  in = pack(&p);
  out = rewrite(&seq, in, NULL);
  assert_bytes_equal(out, in);
  free(out.p), free(in.p);
  b.ftrace_clock = PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_UNKNOWN;
  in = pack(&p);
  out = rewrite(&seq, in, NULL);
  assert_bytes_equal(out, in);
  free(out.p), free(in.p);
}

static void expect_error(const uint8_t *p, size_t len, int want) {
  tr_rewrite_seq seq = {true, true, 5, 6}, before = seq;
  uint8_t out[256], anchor[TR_REWRITE_ANCHOR_MAX];
  size_t anchor_len = 99;
  assert_int_equal(tr_rewrite_packet(&host, &seq, p, len, out, sizeof out, anchor, &anchor_len),
                   want);
  assert_memory_equal(&seq, &before, sizeof seq);
  assert_int_equal(anchor_len, 0);
}

static void test_malformed(void **state) {
  (void)state;
  static const uint8_t truncated_varint[] = {0x40, 0x80};
  static const uint8_t past_end[] = {0x92, 0x07, 0x05, 1, 2};
  static const uint8_t field_zero[] = {0x00, 0x01};
  static const uint8_t group[] = {0x43};
  static const uint8_t clock_id_as_bytes[] = {0xd2, 0x03, 0x01, 0x06};
  static const uint8_t timestamp_fixed64[] = {0x41, 1, 2, 3, 4, 5, 6, 7, 8};
  static const uint8_t bad_defaults[] = {0xda, 0x03, 0x02, 0xd0, 0x83};       /* 59 {58: cut} */
  static const uint8_t bad_clock[] = {0x32, 0x04, 0x0a, 0x02, 0x0a, 0x05};    /* 6 {1 {1: bytes}} */
  static const uint8_t bad_bundle[] = {0x0a, 0x03, 0x2a, 0x01, 0x02};         /* 1 {5: bytes} */
  static const uint8_t snapshot_clocks_varint[] = {0x32, 0x02, 0x08, 0x06};   /* 6 {1: varint} */
  static const uint8_t ftrace_after_valid[] = {0x40, 0x05, 0x0a, 0x01, 0x38}; /* 1 {7: cut} */
  expect_error(truncated_varint, sizeof truncated_varint, TR_ERR_DECODE);
  expect_error(past_end, sizeof past_end, TR_ERR_DECODE);
  expect_error(field_zero, sizeof field_zero, TR_ERR_DECODE);
  expect_error(group, sizeof group, TR_ERR_DECODE);
  expect_error(clock_id_as_bytes, sizeof clock_id_as_bytes, TR_ERR_DECODE);
  expect_error(timestamp_fixed64, sizeof timestamp_fixed64, TR_ERR_DECODE);
  expect_error(bad_defaults, sizeof bad_defaults, TR_ERR_DECODE);
  expect_error(bad_clock, sizeof bad_clock, TR_ERR_DECODE);
  expect_error(bad_bundle, sizeof bad_bundle, TR_ERR_DECODE);
  expect_error(snapshot_clocks_varint, sizeof snapshot_clocks_varint, TR_ERR_DECODE);
  expect_error(ftrace_after_valid, sizeof ftrace_after_valid, TR_ERR_DECODE);

  /* Too little room, or an oversized packet. */
  static const uint8_t ok[] = {0x40, 0x05}; /* timestamp 5: grows by 7 bytes */
  tr_rewrite_seq seq = {0};
  uint8_t out[8], anchor[TR_REWRITE_ANCHOR_MAX];
  size_t anchor_len;
  assert_int_equal(tr_rewrite_packet(&host, &seq, ok, sizeof ok, out, sizeof out, anchor,
                                     &anchor_len),
                   TR_ERR_TOO_BIG);
  assert_int_equal(tr_rewrite_packet(&host, &seq, ok, TR_REWRITE_PACKET_MAX + 1u, out,
                                     sizeof out, anchor, &anchor_len),
                   TR_ERR_TOO_BIG);
  /* An empty packet is valid and stays empty. */
  assert_int_equal(tr_rewrite_packet(&host, &seq, ok, 0, out, sizeof out, anchor, &anchor_len),
                   0);
}

static void test_cross_host_snapshot(void **state) {
  (void)state;
  uint8_t out[TR_REWRITE_SNAPSHOT_MAX];
  int n = tr_rewrite_cross_host_snapshot(&host, INT64_MAX, INT64_MAX - 1, out, sizeof out);
  assert_true(n > 0);
  n = tr_rewrite_cross_host_snapshot(&host, 4000000123, 123, out, sizeof out);
  assert_true(n > 0);
  Packet *p = perfetto__protos__trace_packet__unpack(NULL, (size_t)n, out);
  assert_non_null(p);
  assert_true(p->has_trusted_packet_sequence_id);
  assert_int_equal(p->trusted_packet_sequence_id, 1);
  assert_false(p->has_timestamp_clock_id || p->has_machine_id);
  Snapshot *s = p->clock_snapshot;
  assert_non_null(s);
  assert_true(s->has_primary_trace_clock);
  assert_int_equal(s->primary_trace_clock, TR_CLOCK_BOOTTIME);
  assert_int_equal(s->n_clocks, 2);
  assert_int_equal(s->clocks[0]->clock_id, TR_CLOCK_BOOTTIME);
  assert_int_equal(s->clocks[0]->timestamp, 4000000123u);
  assert_int_equal(s->clocks[1]->clock_id, G("BOOTTIME"));
  assert_int_equal(s->clocks[1]->timestamp, 123);
  perfetto__protos__trace_packet__free_unpacked(p, NULL);

  assert_int_equal(tr_rewrite_cross_host_snapshot(&host, -1, 0, out, sizeof out), TR_ERR_INVAL);
  assert_int_equal(tr_rewrite_cross_host_snapshot(&host, 0, -1, out, sizeof out), TR_ERR_INVAL);
  assert_int_equal(tr_rewrite_cross_host_snapshot(&host, 1, 1, out, 10), TR_ERR_TOO_BIG);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_host_init_and_ids),
      cmocka_unit_test(test_explicit_clock_id),
      cmocka_unit_test(test_implicit_clock),
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_snapshot),
      cmocka_unit_test(test_unknown_fields_kept),
      cmocka_unit_test(test_sdk_trace),
      cmocka_unit_test(test_ftrace),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_cross_host_snapshot),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
