/* test_trace_inspect.c: the trace reader and the resolver of `tracerelay inspect`.
 * On the three recorded v58.2 traces: packets per machine and sequence as in the vectors README
 * (section 5), every timestamp resolved, the guest's offset from remote_clock_sync by the
 * formula of reference 7.5, and each guest timestamp moved by exactly that offset. On a hand-built
 * `global-clocks` trace: a host's global BOOTTIME, an incremental clock 64 anchored to it, the
 * reset on SEQ_INCREMENTAL_STATE_CLEARED, ftrace GLOBAL clocks and compact_sched deltas land where
 * computed by hand, and unknown clocks are reported. tracerelay's per-host TraceStats extension
 * hands each host its buffers and counters, in either encoding. Malformed input is refused with
 * its offset;
 * skipped top-level fields, concatenated files and zlib/zstd compressed packets are read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "relay/clock/clock.h"
#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/reading/trace_inspect.h"
#include "relay/reading/trace_reader.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

#define GUEST 1969531059u

struct buf {
  uint8_t *data;
  size_t len;
};

static struct buf load(const char *name) {
  char path[512];
  snprintf(path, sizeof(path), "%s/traces/%s", TR_VECTORS_DIR, name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  struct buf b = {.len = (size_t)ftell(f)};
  fseek(f, 0, SEEK_SET);
  b.data = malloc(b.len);
  assert_non_null(b.data);
  assert_int_equal(fread(b.data, 1, b.len, f), b.len);
  fclose(f);
  return b;
}

static void append(struct buf *b, const void *p, size_t n) {
  b->data = realloc(b->data, b->len + n);
  assert_non_null(b->data);
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

static void append_varint(struct buf *b, uint64_t v) {
  uint8_t tmp[10];
  size_t n = 0;
  do {
    tmp[n++] = (uint8_t)(v & 0x7f) | (v > 0x7f ? 0x80 : 0);
    v >>= 7;
  } while (v);
  append(b, tmp, n);
}

static void append_packet(struct buf *b, const Perfetto__Protos__TracePacket *p) {
  size_t n = perfetto__protos__trace_packet__get_packed_size(p);
  uint8_t *tmp = malloc(n ? n : 1);
  assert_non_null(tmp);
  perfetto__protos__trace_packet__pack(p, tmp);
  append_varint(b, 0x0a);
  append_varint(b, n);
  append(b, tmp, n);
  free(tmp);
}

/* ---- recorded traces ---- */

struct seen {
  uint64_t points, unresolved;
  uint32_t guest_host;
  int64_t guest_shift; /* trace_ts - clock_ts on the guest, the same for all of its points */
  bool guest_shift_set, guest_shift_varies, host_identity_broken;
};

static void check_point(const struct tr_inspect_point *p, void *arg) {
  struct seen *s = arg;
  s->points++;
  if (p->status) {
    s->unresolved++;
    return;
  }
  /* all clocks of machine 0 are BOOTTIME-aligned in these traces: the SDK's clock 64 is
   * anchored at the BOOTTIME of its snapshot and every other timestamp is BOOTTIME */
  if (p->machine_id == 0 && p->trace_ts != (int64_t)p->clock_ts)
    s->host_identity_broken = true;
  if (p->machine_id == GUEST) {
    int64_t shift = p->trace_ts - (int64_t)p->clock_ts;
    if (s->guest_shift_set && shift != s->guest_shift)
      s->guest_shift_varies = true;
    s->guest_shift = shift;
    s->guest_shift_set = true;
  }
}

static const struct tr_inspect_host *host(const struct tr_inspect_result *r, uint32_t machine,
                                          uint32_t domain) {
  for (size_t i = 0; i < r->n_hosts; i++)
    if (r->hosts[i].machine_id == machine && r->hosts[i].domain == domain)
      return &r->hosts[i];
  fail_msg("no host %u/%u", machine, domain);
  return NULL;
}

static uint64_t seq_packets(const struct tr_inspect_host *h, uint32_t seq) {
  for (size_t i = 0; i < h->n_seqs; i++)
    if (h->seqs[i].seq_id == seq)
      return h->seqs[i].packets;
  return 0;
}

static void test_sdk_track_event(void **state) {
  (void)state;
  struct buf b = load("sdk-track-event.pftrace");
  struct tr_inspect_result r;
  struct seen s = {0};
  assert_int_equal(tr_inspect_trace(b.data, b.len, check_point, &s, &r), 0);
  assert_int_equal(r.packets, 1028);
  assert_int_equal(r.n_hosts, 1);
  assert_int_equal(r.trace_clock, TR_CLOCK_BOOTTIME);
  assert_int_equal(r.clock_snapshots, 5);
  assert_int_equal(r.snapshots_rejected, 0);
  const struct tr_inspect_host *h = host(&r, 0, 0);
  assert_int_equal(h->packets, 1028);
  assert_int_equal(h->n_seqs, 2);
  assert_int_equal(seq_packets(h, 1), 14);
  assert_int_equal(seq_packets(h, 2), 1014);
  assert_int_equal(h->unresolved, 0);
  assert_int_equal(s.unresolved, 0);
  assert_int_equal(s.points, h->timestamps);
  assert_false(s.host_identity_broken);
  assert_string_equal(h->name, "Linux 6.18.44-fc-v595 x86_64");
  assert_int_equal(h->losses.trace_stats_packets, 1);
  assert_int_equal(h->losses.previous_packet_dropped, 0); /* only the first packet is flagged */
  /* first SDK event: delta 0 on clock 64, whose base is the snapshot's BOOTTIME */
  assert_int_equal(h->first_ts, 2585746740006); /* the service's tracing_started */
  tr_inspect_result_free(&r);
  free(b.data);
}

/* Reference 7.5 on the BOOTTIME readings of the trace's remote_clock_sync packet. */
static int64_t guest_offset_by_hand(const struct buf *b) {
  struct tr_trace_reader rd;
  struct tr_trace_record rec;
  tr_trace_reader_init(&rd, b->data, b->len);
  int64_t offset = 0;
  bool found = false;
  while (tr_trace_reader_next(&rd, &rec) > 0) {
    const Perfetto__Protos__RemoteClockSync *rcs = rec.packet->remote_clock_sync;
    if (rec.packet->data_case != PERFETTO__PROTOS__TRACE_PACKET__DATA_REMOTE_CLOCK_SYNC)
      continue;
    assert_int_equal(rcs->n_synced_clocks, 2);
    int64_t t[2][2]; /* [exchange][client, host] */
    for (int i = 0; i < 2; i++)
      for (int side = 0; side < 2; side++) {
        const Perfetto__Protos__ClockSnapshot *cs =
            side ? rcs->synced_clocks[i]->host_clocks : rcs->synced_clocks[i]->client_clocks;
        assert_int_equal(cs->clocks[0]->clock_id, TR_CLOCK_BOOTTIME);
        t[i][side] = (int64_t)cs->clocks[0]->timestamp;
      }
    int64_t o1 = (t[0][0] + t[1][0]) / 2 - t[0][1];
    int64_t o2 = t[1][0] - (t[0][1] + t[1][1]) / 2;
    offset = (o1 + o2) / 2;
    found = true;
  }
  tr_trace_reader_free(&rd);
  assert_true(found);
  return offset;
}

static void check_relay_trace(const char *file, uint64_t packets, uint64_t host_packets,
                              uint32_t guest_seq, uint64_t guest_seq_packets) {
  struct buf b = load(file);
  struct tr_inspect_result r;
  struct seen s = {0};
  assert_int_equal(tr_inspect_trace(b.data, b.len, check_point, &s, &r), 0);
  assert_int_equal(r.packets, packets);
  assert_int_equal(r.n_hosts, 2);
  assert_int_equal(r.remote_clock_syncs, 1);
  const struct tr_inspect_host *h = host(&r, 0, 0), *g = host(&r, GUEST, 0);
  assert_int_equal(h->packets, host_packets);
  assert_int_equal(seq_packets(h, 1), 15);
  assert_int_equal(g->packets, packets - host_packets);
  assert_int_equal(g->n_seqs, 3);
  assert_int_equal(seq_packets(g, 0), 1); /* remote_clock_sync: no sequence id */
  assert_int_equal(seq_packets(g, 1), 1); /* the guest's system_info */
  assert_int_equal(seq_packets(g, guest_seq), guest_seq_packets);
  assert_int_equal(s.unresolved, 0);
  assert_int_equal(h->unresolved + g->unresolved, 0);
  assert_false(s.host_identity_broken);

  int64_t offset = guest_offset_by_hand(&b);
  assert_true(g->has_sync_offset);
  assert_int_equal(g->sync_offset_ns, offset);
  /* one cross-machine edge: every guest timestamp moves by minus the offset */
  assert_true(s.guest_shift_set);
  assert_false(s.guest_shift_varies);
  assert_int_equal(s.guest_shift, -offset);
  assert_true(g->has_mapping);
  assert_int_equal(g->offset_ns, -offset);
  assert_true(g->drift_ppm == 0.0);
  assert_true(g->sync_round_trip_ns > 0 && g->sync_round_trip_ns < 2000000);
  assert_true(g->has_range && g->first_ts <= g->last_ts);
  tr_inspect_result_free(&r);
  free(b.data);
}

static void test_traced_relay_2machines(void **state) {
  (void)state;
  check_relay_trace("traced-relay-2machines.pftrace", 1645, 1029, 3, 614);
}

static void test_relay_emulated(void **state) {
  (void)state;
  check_relay_trace("relay-emulated.pftrace", 6031, 15, 2, 6014);
}

/* ---- a hand-built global-clocks trace ---- */

#define SVC_SEQ 1
#define SDK_SEQ 7
#define FTRACE_SEQ 9

static Perfetto__Protos__ClockSnapshot__Clock *clk(uint32_t id, uint64_t ts, bool incremental) {
  Perfetto__Protos__ClockSnapshot__Clock *c = malloc(sizeof(*c));
  perfetto__protos__clock_snapshot__clock__init(c);
  c->has_clock_id = c->has_timestamp = true;
  c->clock_id = id;
  c->timestamp = ts;
  c->has_is_incremental = c->is_incremental = incremental;
  return c;
}

/* A packet on seq with a ClockSnapshot of two clocks (primary BOOTTIME when primary). */
static void add_snapshot(struct buf *b, uint32_t seq, Perfetto__Protos__ClockSnapshot__Clock *c0,
                         Perfetto__Protos__ClockSnapshot__Clock *c1, bool primary,
                         uint32_t flags, int64_t default_clock) {
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  Perfetto__Protos__ClockSnapshot cs = PERFETTO__PROTOS__CLOCK_SNAPSHOT__INIT;
  Perfetto__Protos__TracePacketDefaults d = PERFETTO__PROTOS__TRACE_PACKET_DEFAULTS__INIT;
  Perfetto__Protos__ClockSnapshot__Clock *clocks[2] = {c0, c1};
  cs.n_clocks = 2;
  cs.clocks = clocks;
  cs.has_primary_trace_clock = primary;
  cs.primary_trace_clock = PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT;
  p.clock_snapshot = &cs;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = seq;
  p.has_sequence_flags = flags != 0;
  p.sequence_flags = flags;
  if (default_clock >= 0) {
    d.has_timestamp_clock_id = true;
    d.timestamp_clock_id = (uint32_t)default_clock;
    p.trace_packet_defaults = &d;
  }
  append_packet(b, &p);
  free(c0);
  free(c1);
}

/* A plain packet with a timestamp; clock -1 leaves timestamp_clock_id out. */
static void add_event(struct buf *b, uint32_t seq, int64_t clock, uint64_t ts, uint32_t flags) {
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.has_timestamp = true;
  p.timestamp = ts;
  p.has_timestamp_clock_id = clock >= 0;
  p.timestamp_clock_id = (uint32_t)clock;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = seq;
  p.has_sequence_flags = flags != 0;
  p.sequence_flags = flags;
  append_packet(b, &p);
}

static void add_name(struct buf *b, const char *machine_name) {
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  Perfetto__Protos__SystemInfo si = PERFETTO__PROTOS__SYSTEM_INFO__INIT;
  si.machine_name = (char *)machine_name;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_SYSTEM_INFO;
  p.system_info = &si;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = SVC_SEQ;
  append_packet(b, &p);
}

/* GLOBAL-clock ftrace: ftrace 900 is BOOTTIME 1000100; one event at 950 and compact_sched
 * switches 900, +10, +10. */
static void add_ftrace(struct buf *b) {
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  Perfetto__Protos__FtraceEventBundle fb = PERFETTO__PROTOS__FTRACE_EVENT_BUNDLE__INIT;
  Perfetto__Protos__FtraceEventBundle__CompactSched cs =
      PERFETTO__PROTOS__FTRACE_EVENT_BUNDLE__COMPACT_SCHED__INIT;
  Perfetto__Protos__FtraceEvent ev = PERFETTO__PROTOS__FTRACE_EVENT__INIT, *evs[1] = {&ev};
  uint64_t sw[3] = {900, 10, 10};
  ev.has_timestamp = true;
  ev.timestamp = 950;
  fb.n_event = 1;
  fb.event = evs;
  cs.n_switch_timestamp = 3;
  cs.switch_timestamp = sw;
  fb.compact_sched = &cs;
  fb.has_ftrace_clock = fb.has_ftrace_timestamp = fb.has_boot_timestamp = true;
  fb.ftrace_clock = PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL;
  fb.ftrace_timestamp = 900;
  fb.boot_timestamp = 1000100;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_FTRACE_EVENTS;
  p.ftrace_events = &fb;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = FTRACE_SEQ;
  append_packet(b, &p);
}

struct expect {
  int64_t trace_ts[32];
  int status[32];
  uint64_t offset[32];
  size_t n;
};

static void record_point(const struct tr_inspect_point *p, void *arg) {
  struct expect *e = arg;
  assert_true(e->n < 32);
  e->trace_ts[e->n] = p->status ? -1 : p->trace_ts;
  e->status[e->n] = p->status;
  e->offset[e->n] = p->offset;
  e->n++;
}

static void test_global_clocks(void **state) {
  (void)state;
  const uint32_t ga = tr_global_clock_id("hostA", "BOOTTIME");
  const uint32_t ga_mono = tr_global_clock_id("hostA", "MONOTONIC");
  struct buf b = {0};
  /* the service: trace clock BOOTTIME; host A's BOOTTIME is 4 s ahead, then drifts 10 ns */
  add_snapshot(&b, SVC_SEQ, clk(TR_CLOCK_BOOTTIME, 1000000, false), clk(ga, 5000000, false),
               true, 0, -1);
  add_name(&b, "hostA");
  /* host A's SDK sequence: clock 64 incremental, anchored on A's global BOOTTIME */
  add_snapshot(&b, SDK_SEQ, clk(ga, 5000100, false), clk(64, 5000100, true), false, 1, 64);
  add_event(&b, SDK_SEQ, -1, 50, 2);  /* 5000150 on A: 1000150 */
  add_event(&b, SDK_SEQ, -1, 25, 2);  /* 5000175: 1000175 */
  add_snapshot(&b, SVC_SEQ, clk(TR_CLOCK_BOOTTIME, 2000000, false), clk(ga, 6000010, false),
               true, 0, -1);
  add_event(&b, SDK_SEQ, ga, 6000500, 2); /* second service row: 2000490 */
  add_event(&b, SDK_SEQ, -1, 5, 2);       /* back on 64: 5000180 -> first row: 1000180 */
  /* host A's own snapshot links its MONOTONIC (global) to its BOOTTIME */
  add_snapshot(&b, 11, clk(ga, 5500000, false), clk(ga_mono, 400000, false), false, 0, -1);
  add_event(&b, 11, ga_mono, 400100, 0); /* A BOOTTIME 5500100: 1500100 */
  add_event(&b, SDK_SEQ, 64, 10, 1); /* cleared, no snapshot since: no base */
  add_event(&b, SDK_SEQ, 0x80001234, 1, 0); /* a global clock nobody links */
  add_snapshot(&b, SDK_SEQ, clk(ga, 6000100, false), clk(64, 6000100, true), false, 1, 64);
  add_event(&b, SDK_SEQ, -1, 7, 2); /* 6000107: 2000097 */
  add_ftrace(&b);
  add_event(&b, SVC_SEQ, -1, 1234567, 0); /* the service's BOOTTIME is the trace clock */

  struct tr_inspect_result r;
  struct expect e = {0};
  assert_int_equal(tr_inspect_trace(b.data, b.len, record_point, &e, &r), 0);
  const int64_t want[] = {
      /* snapshot packets carry no timestamp */
      1000150, 1000175, 2000490, 1000180, 1500100, -1, -1, 2000097,
      1000150, 1000100, 1000110, 1000120, /* ftrace event, then compact_sched switches */
      1234567,
  };
  assert_int_equal(e.n, sizeof(want) / sizeof(want[0]));
  for (size_t i = 0; i < e.n; i++)
    assert_int_equal(e.trace_ts[i], want[i]);
  assert_int_equal(e.status[5], TR_ERR_STATE);
  assert_int_equal(e.status[6], TR_ERR_NOT_FOUND);

  /* hosts: the service (machine 0, no domain) and host A, named through its global ids */
  assert_int_equal(r.n_hosts, 2);
  const struct tr_inspect_host *svc = host(&r, 0, 0), *a = host(&r, 0, ga);
  assert_string_equal(a->name, "hostA");
  assert_int_equal(a->n_seqs, 2); /* SDK_SEQ and 11 */
  assert_int_equal(a->unresolved, 2);
  assert_int_equal(a->n_unresolved_offsets, 2);
  assert_int_equal(a->unresolved_offsets[0], e.offset[5]);
  assert_int_equal(a->unresolved_offsets[1], e.offset[6]);
  assert_int_equal(svc->unresolved, 0);
  assert_int_equal(seq_packets(svc, SVC_SEQ), 4);
  assert_int_equal(seq_packets(svc, FTRACE_SEQ), 1);
  assert_int_equal(svc->ftrace_events, 4);
  /* A's BOOTTIME readings 5000000..6000100 map to 1000000..2000090 */
  assert_true(a->has_mapping);
  assert_int_equal(a->offset_ns, 1000000 - 5000000);
  assert_int_equal(a->mapping_span_ns, 1000100);
  assert_true(a->drift_ppm < -9.0 && a->drift_ppm > -11.0); /* -10 ns over ~1 ms */
  tr_inspect_result_free(&r);
  free(b.data);
}

/* ---- tracerelay's per-host stats ---- */

static void pack_into(struct buf *b, const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *tmp = malloc(n ? n : 1);
  assert_non_null(tmp);
  protobuf_c_message_pack(m, tmp);
  append(b, tmp, n);
  free(tmp);
}

/* A TraceStats on the service's sequence: buffer i overwrote 10^i chunks; the extension gives
 * buffer 1 to guestA (machine_id), 2 to hostB (global-clocks) and nothing to ghost. Each
 * host's link lost 5 + i + later chunks; with restarted, hostB is listed a second time (its
 * agent restarted: the retired entry, with the same host counters and its own session ones). */
static void add_host_stats(struct buf *b, uint64_t later, bool restarted) {
  Perfetto__Protos__TraceStats ts = PERFETTO__PROTOS__TRACE_STATS__INIT;
  Perfetto__Protos__TraceStats__BufferStats bs[3], *bsp[3];
  for (int i = 0; i < 3; i++) {
    perfetto__protos__trace_stats__buffer_stats__init(&bs[i]);
    bs[i].has_chunks_overwritten = true;
    bs[i].chunks_overwritten = i == 0 ? 1 : i == 1 ? 10 : 100;
    bsp[i] = &bs[i];
  }
  ts.n_buffer_stats = 3;
  ts.buffer_stats = bsp;
  Tracerelay__HostStats hs[4], *hsp[4];
  const char *names[4] = {"guestA", "hostB", "ghost", "hostB"};
  uint32_t index[4] = {1, 2, 0, 0};
  int n_hosts = restarted ? 4 : 3;
  for (int i = 0; i < n_hosts; i++) {
    tracerelay__host_stats__init(&hs[i]);
    hs[i].machine_name = (char *)names[i];
    hs[i].has_machine_id = true;
    hs[i].machine_id = tr_machine_id(names[i]);
    hs[i].has_connected = true;
    hs[i].connected = i != 2;
    hs[i].n_buffer_stats_index = i < 2;
    hs[i].buffer_stats_index = &index[i];
    hs[i].has_link_lost_chunks = true;
    hs[i].link_lost_chunks = 5 + (uint64_t)(i == 3 ? 1 : i) + later;
    hs[i].has_session_disconnects = true;
    hs[i].session_disconnects = (uint64_t)i;
    hsp[i] = &hs[i];
  }
  Tracerelay__TraceStatsExtension x = TRACERELAY__TRACE_STATS_EXTENSION__INIT;
  x.n_tracerelay_hosts = (size_t)n_hosts;
  x.tracerelay_hosts = hsp;
  struct buf stats = {0}, pkt = {0};
  pack_into(&stats, &ts.base);
  pack_into(&stats, &x.base); /* appended: field 1000 is unknown to TraceStats */
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = SVC_SEQ;
  pack_into(&pkt, &p.base);
  append_varint(&pkt, 35 << 3 | 2);
  append_varint(&pkt, stats.len);
  append(&pkt, stats.data, stats.len);
  append_varint(b, 0x0a);
  append_varint(b, pkt.len);
  append(b, pkt.data, pkt.len);
  free(stats.data);
  free(pkt.data);
}

static void test_host_stats(void **state) {
  (void)state;
  const uint32_t gb = tr_global_clock_id("hostB", "BOOTTIME");
  const uint32_t guest = tr_machine_id("guestA"), ghost = tr_machine_id("ghost");
  struct buf b = {0};
  add_snapshot(&b, SVC_SEQ, clk(TR_CLOCK_BOOTTIME, 1000, false), clk(gb, 9000, false), true, 0,
               -1);
  add_snapshot(&b, SDK_SEQ, clk(gb, 9100, false), clk(64, 9100, true), false, 1, 64);
  add_event(&b, SDK_SEQ, -1, 1, 2);
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.has_machine_id = true;
  p.machine_id = guest;
  p.has_trusted_packet_sequence_id = true;
  p.trusted_packet_sequence_id = 3;
  append_packet(&b, &p);
  add_host_stats(&b, 0, false);

  struct tr_inspect_result r;
  assert_int_equal(tr_inspect_trace(b.data, b.len, NULL, NULL, &r), 0);
  assert_int_equal(r.n_hosts, 4);
  const struct tr_inspect_host *svc = host(&r, 0, 0), *hb = host(&r, 0, gb),
                               *ga = host(&r, guest, 0), *gh = host(&r, ghost, 0);
  assert_int_equal(svc->losses.trace_stats_packets, 1);
  assert_int_equal(svc->losses.chunks_overwritten, 1); /* the entry no host claimed */
  assert_false(svc->losses.has_host_stats);
  assert_int_equal(ga->losses.chunks_overwritten, 10);
  assert_true(ga->losses.has_host_stats && ga->losses.connected);
  assert_int_equal(ga->losses.link_lost_chunks, 5);
  assert_string_equal(ga->name, "guestA");
  assert_int_equal(ga->packets, 1);
  assert_int_equal(hb->losses.chunks_overwritten, 100);
  assert_int_equal(hb->losses.link_lost_chunks, 6);
  assert_string_equal(hb->name, "hostB");
  assert_int_equal(hb->packets, 2);
  assert_int_equal(gh->packets, 0); /* known only from the stats */
  assert_string_equal(gh->name, "ghost");
  assert_false(gh->losses.connected);
  assert_int_equal(gh->losses.session_disconnects, 2);
  assert_int_equal(gh->losses.chunks_overwritten, 0);
  tr_inspect_result_free(&r);
  free(b.data);
}

/* Every read pass ends with a TraceStats of the counters so far: only the last counts. A
 * host listed twice in it (its agent restarted) has its host counters once, its session
 * counters (disconnects 1 and 3) from both entries. */
static void test_host_stats_last_pass(void **state) {
  (void)state;
  struct buf b = {0};
  add_snapshot(&b, SVC_SEQ, clk(TR_CLOCK_BOOTTIME, 1000, false), clk(64, 9000, false), true, 0,
               -1);
  add_host_stats(&b, 0, false);
  add_host_stats(&b, 10, true);
  struct tr_inspect_result r;
  assert_int_equal(tr_inspect_trace(b.data, b.len, NULL, NULL, &r), 0);
  const struct tr_inspect_host *svc = host(&r, 0, 0),
                               *ga = host(&r, tr_machine_id("guestA"), 0),
                               *hb = host(&r, tr_machine_id("hostB"), 0);
  assert_int_equal(svc->losses.trace_stats_packets, 2);
  assert_int_equal(svc->losses.chunks_overwritten, 1); /* not 2: the last pass's */
  assert_int_equal(ga->losses.link_lost_chunks, 15);
  assert_int_equal(ga->losses.chunks_overwritten, 10);
  assert_int_equal(hb->losses.link_lost_chunks, 16); /* once, not 32 */
  assert_int_equal(hb->losses.session_disconnects, 1 + 3);
  assert_true(hb->losses.connected);
  tr_inspect_result_free(&r);
  free(b.data);
}

/* ---- the reader on malformed and unusual input ---- */

static int read_all(const struct buf *b, uint64_t *packets, struct tr_trace_reader_error *err) {
  struct tr_trace_reader r;
  struct tr_trace_record rec;
  tr_trace_reader_init(&r, b->data, b->len);
  int rc;
  while ((rc = tr_trace_reader_next(&r, &rec)) > 0)
    ;
  *packets = r.records;
  *err = r.error;
  assert_int_equal(tr_trace_reader_next(&r, &rec), rc); /* errors stick */
  tr_trace_reader_free(&r);
  return rc;
}

static void test_malformed(void **state) {
  (void)state;
  struct buf sdk = load("sdk-track-event.pftrace");
  uint64_t n;
  struct tr_trace_reader_error err;

  /* truncated: the last record loses its final byte */
  struct buf cut = {sdk.data, sdk.len - 1};
  assert_int_equal(read_all(&cut, &n, &err), TR_ERR_DECODE);
  assert_int_equal(n, 1027);
  assert_true(err.offset > 0 && err.offset < sdk.len - 1);
  assert_int_equal(err.inner, -1);
  uint64_t last_record = err.offset;

  /* the offset is the record's: a bad byte in front of it keeps the same offset */
  struct buf huge = {0};
  append(&huge, sdk.data, last_record);
  const uint8_t big[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f};
  append(&huge, big, sizeof(big));
  assert_int_equal(read_all(&huge, &n, &err), TR_ERR_TOO_BIG);
  assert_int_equal(err.offset, last_record);
  assert_int_equal(n, 1027);

  const struct {
    uint8_t bytes[8];
    size_t len;
    int rc;
  } cases[] = {
      {{0x0b, 0x00}, 2, TR_ERR_DECODE},             /* field 1, start group */
      {{0x0e, 0x00}, 2, TR_ERR_DECODE},             /* field 1, wire type 6 */
      {{0x13, 0x00}, 2, TR_ERR_DECODE},             /* field 2, start group */
      {{0x08, 0x01}, 2, TR_ERR_DECODE},             /* field 1 as a varint */
      {{0x02, 0x00}, 2, TR_ERR_DECODE},             /* field number 0 */
      {{0x0a, 0x05, 0x01}, 3, TR_ERR_DECODE},       /* length past the end */
      {{0x0a, 0x80}, 2, TR_ERR_DECODE},             /* truncated length */
      {{0x11, 0x01, 0x02}, 3, TR_ERR_DECODE},       /* fixed64 cut short */
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct buf bad = {0};
    append(&bad, sdk.data, last_record);
    append(&bad, cases[i].bytes, cases[i].len);
    assert_int_equal(read_all(&bad, &n, &err), cases[i].rc);
    assert_int_equal(err.offset, last_record);
    assert_non_null(err.what);
    free(bad.data);
  }

  /* A well-framed record whose packet does not decode is skipped and counted, as
   * trace_processor skips it, so one producer's malformed packet cannot hide the trace. */
  {
    struct buf bad = {0};
    append(&bad, sdk.data, sdk.len);
    append(&bad, (const uint8_t[]){0x0a, 0x02, 0xff, 0xff}, 4);
    append(&bad, sdk.data, sdk.len);
    struct tr_trace_reader r;
    struct tr_trace_record rec;
    tr_trace_reader_init(&r, bad.data, bad.len);
    int rc;
    while ((rc = tr_trace_reader_next(&r, &rec)) > 0)
      ;
    assert_int_equal(rc, 0);
    assert_int_equal(r.records, 2 * 1028);
    assert_int_equal(r.undecodable_packets, 1);
    assert_int_equal(r.first_undecodable_offset, sdk.len);
    tr_trace_reader_free(&r);
    free(bad.data);
  }

  /* inspect reports the same */
  struct tr_inspect_result r;
  assert_int_equal(tr_inspect_trace(huge.data, huge.len, NULL, NULL, &r), TR_ERR_TOO_BIG);
  assert_int_equal(r.error.offset, last_record);
  tr_inspect_result_free(&r);
  free(huge.data);
  free(sdk.data);
}

static void test_skipped_and_concatenated(void **state) {
  (void)state;
  struct buf sdk = load("sdk-track-event.pftrace");
  struct buf b = {0};
  /* other top-level fields of each wire type, then two files back to back */
  const uint8_t junk[] = {0x10, 0x96, 0x01,                               /* 2: varint */
                          0x19, 1, 2, 3, 4, 5, 6, 7, 8,                   /* 3: fixed64 */
                          0x22, 0x02, 0xaa, 0xbb,                         /* 4: bytes */
                          0x2d, 1, 2, 3, 4};                              /* 5: fixed32 */
  append(&b, junk, sizeof(junk));
  append(&b, sdk.data, sdk.len);
  append(&b, sdk.data, sdk.len);
  uint64_t n;
  struct tr_trace_reader_error err;
  assert_int_equal(read_all(&b, &n, &err), 0);
  assert_int_equal(n, 2056);
  struct tr_inspect_result r;
  assert_int_equal(tr_inspect_trace(b.data, b.len, NULL, NULL, &r), 0);
  assert_int_equal(r.packets, 2056);
  assert_int_equal(r.hosts[0].unresolved, 0);
  tr_inspect_result_free(&r);
  free(b.data);
  free(sdk.data);
}

/* The trace wrapped in one compressed packet of the given kind, after one plain packet. */
static struct buf wrap(const struct buf *trace, bool zstd, bool corrupt) {
  size_t cap = zstd ? ZSTD_compressBound(trace->len) : compressBound(trace->len);
  uint8_t *z = malloc(cap);
  assert_non_null(z);
  size_t zlen = cap;
  if (zstd) {
    zlen = ZSTD_compress(z, cap, trace->data, trace->len, 3);
    assert_false(ZSTD_isError(zlen));
  } else {
    uLongf l = cap;
    assert_int_equal(compress2(z, &l, trace->data, trace->len, 6), Z_OK);
    zlen = l;
  }
  if (corrupt)
    zlen /= 2;
  struct buf b = {0};
  add_event(&b, 1, -1, 5, 0);
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  p.data_case = zstd ? PERFETTO__PROTOS__TRACE_PACKET__DATA_ZSTD_COMPRESSED_PACKETS
                     : PERFETTO__PROTOS__TRACE_PACKET__DATA_COMPRESSED_PACKETS;
  ProtobufCBinaryData *d = zstd ? &p.zstd_compressed_packets : &p.compressed_packets;
  d->data = z;
  d->len = zlen;
  append_packet(&b, &p);
  free(z);
  return b;
}

static void test_compressed(void **state) {
  (void)state;
  struct buf trace = load("traced-relay-2machines.pftrace");
  for (int zstd = 0; zstd < 2; zstd++) {
    struct buf b = wrap(&trace, zstd, false);
    struct tr_inspect_result r;
    assert_int_equal(tr_inspect_trace(b.data, b.len, NULL, NULL, &r), 0);
    assert_int_equal(r.packets, 1646);
    assert_int_equal(zstd ? r.zstd_packets : r.zlib_packets, 1);
    assert_int_equal(host(&r, GUEST, 0)->packets, 616);
    assert_int_equal(host(&r, GUEST, 0)->unresolved, 0);
    tr_inspect_result_free(&r);
    free(b.data);

    /* cut short: refused at the compressed packet's offset, after the plain packet */
    b = wrap(&trace, zstd, true);
    uint64_t n;
    struct tr_trace_reader_error err;
    assert_int_equal(read_all(&b, &n, &err), TR_ERR_DECODE);
    assert_int_equal(n, 1);
    assert_true(err.offset > 0);
    free(b.data);
  }
  /* a bad record inside: the offset of the compressed packet and the one inside it */
  struct buf bad = {0};
  append(&bad, trace.data, 100);
  const uint8_t tail[] = {0x0b};
  append(&bad, tail, 1);
  struct buf b = wrap(&bad, true, false);
  uint64_t n;
  struct tr_trace_reader_error err;
  assert_int_equal(read_all(&b, &n, &err), TR_ERR_DECODE);
  assert_true(err.offset > 0);
  assert_true(err.inner >= 0 && err.inner <= 100);
  free(b.data);
  free(bad.data);
  free(trace.data);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sdk_track_event),
      cmocka_unit_test(test_traced_relay_2machines),
      cmocka_unit_test(test_relay_emulated),
      cmocka_unit_test(test_global_clocks),
      cmocka_unit_test(test_host_stats),
      cmocka_unit_test(test_host_stats_last_pass),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_skipped_and_concatenated),
      cmocka_unit_test(test_compressed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
