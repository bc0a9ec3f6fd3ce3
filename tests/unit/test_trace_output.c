/* test_trace_output.c: a session's read side (service/trace_output.h) driven by fake inputs,
 * without processes or a network: host entries with central buffers filled by hand, a fake
 * TraceStats. Checks the order of a pass (head, then buffer-major and host-major host data,
 * then the read-complete event and TraceStats), that a `machines` host without a clock anchor
 * waits for one in a non-final pass and gets the session's start in the final one, that
 * the clock journal's thinning keeps it bounded and keeps the anchor and the bound samples, that in
 * `global-clocks` a host's clock error bound track covers the mapping as far as it was
 * exported, past the estimator's frontier, and still covers what was exported after a probe
 * re-planned it, and that in `machines` no edge is written below data a pass already wrote.
 * A write_into_file pass (service/trace_file.h) is written a step per loop iteration, holds
 * every packet once, in the pass's order, leaves the loop running while the file takes
 * nothing (a pipe nobody reads), and stops at max_file_size_bytes; with the config's
 * compression (deflate, zstd) it holds the same packets inside one compressed packet. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/clock/clocksync.h"
#include "relay/trace/trace_writer.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "service/trace_file.h"
#include "service/trace_output.h"

#define NUM_BUFFERS 2
#define STATS_MARK 0x77 /* the fake TraceStats packet's one byte */

/* One fake session: its config, host entries and central buffers, and what the read side
 * asked of it. */
struct fixture {
  uv_loop_t loop;
  Perfetto__Protos__TraceConfig cfg;
  Perfetto__Protos__TraceConfig__BufferConfig buf_cfg[NUM_BUFFERS];
  Perfetto__Protos__TraceConfig__BufferConfig *buf_ptrs[NUM_BUFFERS];
  Perfetto__Protos__SystemInfo *system_info;
  tr_host hosts[2];
  tr_tbuf *tbufs[2][NUM_BUFFERS];
  tr_trace_output *out;
  int stats_calls;
};

/* One packet of a pass: its first bytes (trusted slice included) and lengths. */
struct got {
  uint8_t data[64];
  size_t len;
  size_t trusted_len;
};

static int fake_stats(void *ud, uint64_t ts, tr_trace_writer_buf *out) {
  struct fixture *f = ud;
  (void)ts;
  f->stats_calls++;
  out->data = malloc(1);
  if (!out->data)
    return TR_ERR_NOMEM;
  out->data[0] = STATS_MARK;
  out->len = 1;
  return 0;
}

static void fake_file_full(void *ud) {
  (void)ud;
  fail_msg("the session's output writes no file in these tests");
}

static void fake_file_done(void *ud) {
  (void)ud;
  fail_msg("the session's output writes no file in these tests");
}

static void setup(struct fixture *f, enum tr_timeline timeline) {
  memset(f, 0, sizeof *f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  perfetto__protos__trace_config__init(&f->cfg);
  for (size_t b = 0; b < NUM_BUFFERS; b++) {
    perfetto__protos__trace_config__buffer_config__init(&f->buf_cfg[b]);
    f->buf_ptrs[b] = &f->buf_cfg[b];
  }
  f->cfg.n_buffers = NUM_BUFFERS;
  f->cfg.buffers = f->buf_ptrs;
  assert_int_equal(tr_trace_writer_local_system_info(NULL, &f->system_info), 0);
  tr_trace_output_params p = {.loop = &f->loop,
                              .session_id = 1,
                              .uid = 0,
                              .timeline = timeline,
                              .system_info = f->system_info,
                              .cfg = &f->cfg,
                              .trace_stats = fake_stats,
                              .on_file_full = fake_file_full,
                              .on_file_done = fake_file_done,
                              .ud = f};
  char err[128];
  assert_int_equal(tr_trace_output_new(&p, -1, &f->out, err, sizeof err), 0);
  for (size_t h = 0; h < 2; h++) {
    snprintf(f->hosts[h].name, sizeof f->hosts[h].name, "host-%zu", h);
    snprintf(f->hosts[h].trace_name, sizeof f->hosts[h].trace_name, "host-%zu", h);
    f->hosts[h].machine_id = 100 + (uint32_t)h;
    for (size_t b = 0; b < NUM_BUFFERS; b++)
      assert_int_equal(tr_tbuf_new(64 * 1024, TR_TBUF_RING_BUFFER, &f->tbufs[h][b]), 0);
    assert_int_equal(tr_trace_output_add_host(f->out, &f->hosts[h], f->tbufs[h]), 0);
  }
}

static void teardown(struct fixture *f) {
  tr_trace_output_free(f->out);
  assert_int_equal(uv_run(&f->loop, UV_RUN_DEFAULT), 0); /* its timers close */
  assert_int_equal(uv_loop_close(&f->loop), 0);
  for (size_t h = 0; h < 2; h++) {
    for (size_t b = 0; b < NUM_BUFFERS; b++)
      tr_tbuf_free(f->tbufs[h][b]);
    tr_clocksync_free(f->hosts[h].clock);
  }
  perfetto__protos__system_info__free_unpacked(f->system_info, NULL);
}

/* One complete chunk holding one packet: timestamp = marker (field 8). */
static void put_packet(tr_tbuf *b, uint32_t chunk_id, uint8_t marker) {
  const uint8_t payload[] = {2, 0x40, marker}; /* one fragment of 2 bytes */
  tr_tbuf_chunk c = {.producer_id = 1,
                     .writer_id = 1,
                     .chunk_id = chunk_id,
                     .fragments = 1,
                     .uid = 1000,
                     .pid = 42,
                     .payload = payload,
                     .payload_len = sizeof payload};
  assert_int_equal(tr_tbuf_write_chunk(b, &c), 0);
}

/* Reads one pass into got (at most cap packets); returns how many. */
static size_t read_pass(struct fixture *f, struct got *got, size_t cap) {
  tr_output_packet p;
  size_t n = 0;
  int rc;
  assert_int_equal(tr_trace_output_begin(f->out), 0);
  while ((rc = tr_trace_output_next(f->out, &p)) == 1) {
    size_t head = p.len < sizeof got[n].data ? p.len : sizeof got[n].data;
    size_t tail = p.trusted_len < sizeof got[n].data - head ? p.trusted_len
                                                            : sizeof got[n].data - head;
    assert_true(n < cap);
    memset(got[n].data, 0, sizeof got[n].data);
    memcpy(got[n].data, p.data, head);
    memcpy(got[n].data + head, p.trusted, tail);
    got[n].len = p.len;
    got[n].trusted_len = p.trusted_len;
    n++;
  }
  assert_int_equal(rc, 0);
  tr_trace_output_reset(f->out);
  return n;
}

static bool is_host_packet(const struct got *g) {
  return g->trusted_len > 0;
}

/* The marker of a host packet written by put_packet. */
static uint8_t marker_of(const struct got *g) {
  assert_true(g->len >= 2 && g->data[0] == 0x40);
  return g->data[1];
}

static void test_pass_order(void **state) {
  static struct got got[64];
  struct fixture f;
  size_t n, first_host = 0, last_host = 0, host_packets = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  /* Written out of order on purpose: the pass is buffer-major, then host by entry. */
  put_packet(f.tbufs[1][0], 1, 2);
  put_packet(f.tbufs[0][1], 1, 3);
  put_packet(f.tbufs[0][0], 1, 1);
  tr_trace_output_add_event(f.out, TR_TW_TRACING_STARTED);
  tr_trace_output_add_host_mark(f.out, &f.hosts[1], TR_MARK_DISCONNECTED);

  n = read_pass(&f, got, 64);
  for (size_t i = 0; i < n; i++) {
    if (!is_host_packet(&got[i]))
      continue;
    if (host_packets++ == 0)
      first_host = i;
    last_host = i;
    assert_int_equal(marker_of(&got[i]), host_packets); /* 1, 2, 3 */
  }
  assert_int_equal(host_packets, 3);
  assert_int_equal(last_host - first_host, 2); /* nothing between them */
  /* Head: clock snapshots, sync marker, config, uuid, SystemInfo, the event, the host mark
   * (service track, instant, host tracks, instant: 5), the anchors of both hosts. */
  assert_true(first_host >= 12);
  /* Tail: the read-complete event, then TraceStats last. */
  assert_int_equal(n, last_host + 3);
  assert_false(is_host_packet(&got[n - 2]));
  assert_int_equal(got[n - 1].len, 1);
  assert_int_equal(got[n - 1].data[0], STATS_MARK);
  assert_int_equal(f.stats_calls, 1);

  /* The next pass: no head again, no data left, the same tail. */
  n = read_pass(&f, got, 64);
  assert_int_equal(n, 2);
  assert_int_equal(got[1].data[0], STATS_MARK);
  assert_int_equal(f.stats_calls, 2);
  teardown(&f);
}

static void test_unanchored_host_waits(void **state) {
  static struct got got[64];
  struct tr_clocksync_config cc;
  struct fixture f;
  size_t n, markers = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  /* host-0 has an estimator that never had a probe: no exchange to anchor it yet. host-1 has
   * none at all: it is anchored at the session's start at once. */
  tr_clocksync_config_default(&cc);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, &cc), 0);
  put_packet(f.tbufs[0][0], 1, 1);
  put_packet(f.tbufs[1][0], 1, 2);

  n = read_pass(&f, got, 64);
  for (size_t i = 0; i < n; i++)
    if (is_host_packet(&got[i]))
      assert_int_equal(marker_of(&got[i]), 2);
  assert_false(tr_trace_output_host_anchored(f.out, 0));
  assert_true(tr_trace_output_host_anchored(f.out, 1));

  /* Stopped: the final pass anchors host-0 at the session's start and writes its data. */
  tr_trace_output_stop(f.out);
  n = read_pass(&f, got, 64);
  for (size_t i = 0; i < n; i++)
    if (is_host_packet(&got[i]))
      assert_int_equal(marker_of(&got[i]), ++markers);
  assert_int_equal(markers, 1);
  assert_true(tr_trace_output_host_anchored(f.out, 0));
  teardown(&f);
}

static void test_global_clocks_always_anchored(void **state) {
  struct fixture f;
  (void)state;
  setup(&f, TR_TIMELINE_GLOBAL_CLOCKS);
  assert_true(tr_trace_output_host_anchored(f.out, 0));
  assert_true(tr_trace_output_host_anchored(f.out, 1));
  teardown(&f);
}

/* The trace time of the newest sample on host's clock error bound track among got, or 0. */
static uint64_t newest_bound_sample(const struct got *got, size_t n, const char *host) {
  uint64_t uuid = tr_trace_writer_bound_track_uuid(host), newest = 0;
  for (size_t i = 0; i < n; i++) {
    if (is_host_packet(&got[i]) || got[i].len > sizeof got[i].data)
      continue;
    Perfetto__Protos__TracePacket *p =
        perfetto__protos__trace_packet__unpack(NULL, got[i].len, got[i].data);
    if (!p)
      continue;
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT &&
        p->track_event->track_uuid == uuid && p->timestamp > newest)
      newest = p->timestamp;
    perfetto__protos__trace_packet__free_unpacked(p, NULL);
  }
  return newest;
}

/* global-clocks converts by the breakpoints exported in each pass, which run to a little past
 * the host's present: past the estimator's frontier they are its plan, which later probes
 * re-plan. The bound track must describe that plan, so in the same pass it reaches as far
 * (it used to stop at the frontier and be written later, from the re-planned mapping). */
#define HOST_AHEAD_NS 1000000000LL /* the hosts' clock in the probe tests: the service's + 1 s */

/* Probes of est every 50 ms of service time from `from` while before `to`, legs of 20-40 us, on
 * a host clock HOST_AHEAD_NS ahead; returns the last one's t3. */
static int64_t add_probes(struct tr_clocksync *est, int64_t from, int64_t to) {
  int64_t last_t3 = 0;
  for (unsigned i = 0; from < to; i++, from += 50000000) {
    int64_t out = 20000 + (i * 7919) % 20000, back = 20000 + (i * 104729) % 20000;
    struct tr_clocksync_probe p = {.t1 = from, .t2 = from + out + HOST_AHEAD_NS};
    p.t3 = p.t2 + 10000;
    p.t4 = p.t3 - HOST_AHEAD_NS + back;
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
    last_t3 = p.t3;
  }
  return last_t3;
}

static void test_global_clocks_bound_follows_export(void **state) {
  static struct got got[256];
  struct fixture f;
  uint64_t now = 0;
  (void)state;
  setup(&f, TR_TIMELINE_GLOBAL_CLOCKS);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  /* probes up to 3 s ago */
  int64_t last_t3 = add_probes(f.hosts[0].clock, (int64_t)now - 12000000000LL,
                               (int64_t)now - 3000000000LL);
  int64_t frontier_service;
  assert_int_equal(tr_clocksync_map(f.hosts[0].clock, last_t3, &frontier_service), 0);
  put_packet(f.tbufs[0][0], 1, 1);
  size_t n = read_pass(&f, got, 256);
  assert_true(newest_bound_sample(got, n, "host-0") > (uint64_t)frontier_service + 2000000000ULL);
  teardown(&f);
}

/* Reads one pass, handing each packet that decodes to fn. */
static void read_pass_decoded(struct fixture *f,
                              void (*fn)(const Perfetto__Protos__TracePacket *p, void *arg),
                              void *arg) {
  tr_output_packet o;
  int rc;
  assert_int_equal(tr_trace_output_begin(f->out), 0);
  while ((rc = tr_trace_output_next(f->out, &o)) == 1) {
    Perfetto__Protos__TracePacket *p = perfetto__protos__trace_packet__unpack(NULL, o.len, o.data);
    if (p)
      fn(p, arg);
    perfetto__protos__trace_packet__free_unpacked(p, NULL);
  }
  assert_int_equal(rc, 0);
  tr_trace_output_reset(f->out);
}

struct edges {
  uint32_t machine_id;
  size_t n;
  int64_t ping[1024]; /* the host's PING readings (BOOTTIME) */
};

static void note_edge(const Perfetto__Protos__TracePacket *p, void *arg) {
  struct edges *e = arg;
  if (p->data_case != PERFETTO__PROTOS__TRACE_PACKET__DATA_REMOTE_CLOCK_SYNC ||
      p->machine_id != e->machine_id)
    return;
  assert_true(e->n < sizeof e->ping / sizeof e->ping[0]);
  e->ping[e->n++] = (int64_t)p->remote_clock_sync->synced_clocks[0]->client_clocks->clocks[0]->timestamp;
}

/* The remote_clock_sync packets of host-0 (machine 100) in one pass. */
static size_t pass_edges(struct fixture *f, struct edges *e) {
  *e = (struct edges){.machine_id = 100};
  read_pass_decoded(f, note_edge, e);
  return e->n;
}

/* machines: trace_processor converts a host's data by the remote_clock_sync edges it has read
 * before it. An exchange of a probe in flight while a pass wrote the host's data has its
 * midpoint before some of that data: written as an edge by the next pass, it would have our
 * resolver (all edges) put that data elsewhere than trace_processor does (issue 24: 505 events
 * 777 ns apart in a write_into_file trace). So no later pass writes an edge there. */
static void test_machines_no_edge_below_data_read(void **state) {
  static struct edges e;
  struct fixture f;
  uint64_t now = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &now); /* about the session's start */
  assert_int_equal(tr_clock_set_fake(10000000000LL, 0), 0); /* and now 10 s into it */
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  add_probes(f.hosts[0].clock, (int64_t)now - 10000000000LL, (int64_t)now - 1000000000LL);
  put_packet(f.tbufs[0][0], 1, 1);
  uint64_t read_at = 0; /* the data was there by then, so stamped before */
  tr_clock_read(TR_CLOCK_BOOTTIME, &read_at);
  assert_true(pass_edges(&f, &e) > 0); /* and the anchor: the data went out */
  assert_true(tr_trace_output_host_anchored(f.out, 0));
  /* The probes answered since: those sent before the pass, and three after it. */
  add_probes(f.hosts[0].clock, (int64_t)now - 950000000LL, (int64_t)read_at + 150000000LL);
  put_packet(f.tbufs[0][0], 2, 2);
  size_t n = pass_edges(&f, &e);
  assert_true(n > 0);
  for (size_t i = 0; i < n; i++)
    assert_true(e.ping[i] > (int64_t)read_at + HOST_AHEAD_NS);
  tr_clock_clear_fake();
  teardown(&f);
}

/* machines: behind a saturated link the frontier lags the present by seconds, and the floor
 * keeps exchanges that complete later below data already written from becoming edges: the
 * next pass gives that data's successors the mapping at the last pass's horizon, instead of
 * leaving them to an edge seconds old (drift x its age off, 400 us at 200 ppm and 2 s). */
static void test_machines_edge_past_stalled_frontier(void **state) {
  static struct edges e;
  struct fixture f;
  uint64_t now = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  assert_int_equal(tr_clock_set_fake(10000000000LL, 0), 0); /* 10 s into the session */
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  add_probes(f.hosts[0].clock, (int64_t)now - 10000000000LL, (int64_t)now - 2000000000LL);
  put_packet(f.tbufs[0][0], 1, 1);
  uint64_t read_at = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &read_at);
  assert_true(pass_edges(&f, &e) > 0);
  int64_t last_edge = e.ping[e.n - 1];
  assert_true(last_edge < (int64_t)read_at + HOST_AHEAD_NS - 1000000000LL); /* 2 s behind */
  assert_int_equal(tr_clock_set_fake(10500000000LL, 0), 0); /* the next pass, no probe since */
  put_packet(f.tbufs[0][0], 2, 2);
  assert_int_equal(pass_edges(&f, &e), 1);
  assert_true(e.ping[0] > (int64_t)read_at + HOST_AHEAD_NS); /* above the first pass's data */
  tr_clock_clear_fake();
  teardown(&f);
}

/* machines: a host none of whose probes came back during the session (a starved host behind a
 * saturated link) still gets an edge in the final pass, its mapping at the session's start:
 * without one its data did not resolve (issue 24: 33,550 unresolved packets of one host). */
static void test_machines_edge_without_exchanges(void **state) {
  static struct edges e;
  struct fixture f;
  uint64_t now = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  add_probes(f.hosts[0].clock, (int64_t)now - 10000000000LL, (int64_t)now - 1000000000LL);
  put_packet(f.tbufs[0][0], 1, 1);
  assert_int_equal(pass_edges(&f, &e), 0); /* nothing since the session's start */
  assert_false(tr_trace_output_host_anchored(f.out, 0));
  tr_trace_output_stop(f.out);
  assert_int_equal(pass_edges(&f, &e), 1);
  assert_true(tr_trace_output_host_anchored(f.out, 0));
  teardown(&f);
}

#define CLOCK_OUT_MAX 65536
struct clock_out { /* host-0's cross-host snapshots and bound samples so far */
  uint64_t bound_uuid;
  size_t n_bp, n_bound;
  int64_t bp_host[CLOCK_OUT_MAX], bp_service[CLOCK_OUT_MAX];
  int64_t bound_ts[CLOCK_OUT_MAX];
  double bound_us[CLOCK_OUT_MAX];
};

static void note_clock_out(const Perfetto__Protos__TracePacket *p, void *arg) {
  struct clock_out *c = arg;
  if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT &&
      p->clock_snapshot->n_clocks == 2 && p->clock_snapshot->has_primary_trace_clock &&
      c->n_bp < CLOCK_OUT_MAX) {
    c->bp_service[c->n_bp] = (int64_t)p->clock_snapshot->clocks[0]->timestamp;
    c->bp_host[c->n_bp++] = (int64_t)p->clock_snapshot->clocks[1]->timestamp;
  } else if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT &&
             p->track_event->track_uuid == c->bound_uuid && c->n_bound < CLOCK_OUT_MAX) {
    c->bound_ts[c->n_bound] = (int64_t)p->timestamp;
    c->bound_us[c->n_bound++] = p->track_event->double_counter_value;
  }
}

/* The bound shown at trace time ts: the latest sample at or below it. */
static double bound_at(const struct clock_out *c, int64_t ts) {
  double v = -1;
  int64_t best = INT64_MIN;
  for (size_t i = 0; i < c->n_bound; i++)
    if (c->bound_ts[i] <= ts && c->bound_ts[i] >= best) {
      best = c->bound_ts[i];
      v = c->bound_us[i];
    }
  return v;
}

/* global-clocks: a probe that moves the mapping down past the frontier re-plans what the last
 * pass exported. Here the first probes are slow (legs of 1 ms + `bias`) and their asymmetry
 * drifts from -bias to +bias (valid exchanges all), so the drift is overestimated and the plan
 * runs ahead of the truth; a fast probe then pulls the mapping down. Checked: every host time
 * from the last breakpoint of the first pass to the first one of the next is within the bound
 * the track shows where trace_processor puts it (by that breakpoint). With `held`, a pass 1 ms
 * after the probe finds the mapping below the last breakpoint and leaves the next ones out
 * (each series must stay monotonic; on a slow machine some may come in) before one 200 ms
 * later goes on. */
static void check_replanned_export(int64_t bias, bool held) {
  static struct clock_out c;
  struct fixture f;
  uint64_t now = 0;
  setup(&f, TR_TIMELINE_GLOBAL_CLOCKS);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  assert_int_equal(tr_clock_set_fake(10000000000LL, 0), 0); /* 10 s into the session */
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  int64_t first = (int64_t)now - 10000000000LL, last = (int64_t)now - 3000000000LL;
  for (int64_t t = first; t < last; t += 100000000) {
    int64_t a = -bias + 2 * bias * (t - first) / (last - first);
    struct tr_clocksync_probe p = {.t1 = t, .t2 = t + 1000000 + bias - a + HOST_AHEAD_NS};
    p.t3 = p.t2 + 10000;
    p.t4 = p.t3 - HOST_AHEAD_NS + 1000000 + bias + a;
    assert_int_equal(tr_clocksync_add_probe(f.hosts[0].clock, &p), 0);
  }
  c = (struct clock_out){.bound_uuid = tr_trace_writer_bound_track_uuid("host-0")};
  read_pass_decoded(&f, note_clock_out, &c);
  assert_true(c.n_bp > 0);
  int64_t h0 = c.bp_host[c.n_bp - 1], s0 = c.bp_service[c.n_bp - 1];
  size_t first_new = c.n_bp;
  struct tr_clocksync_probe p = {.t1 = (int64_t)now - 500000000LL};
  p.t2 = p.t1 + 20000 + HOST_AHEAD_NS;
  p.t3 = p.t2 + 10000;
  p.t4 = p.t3 - HOST_AHEAD_NS + 20000;
  assert_int_equal(tr_clocksync_add_probe(f.hosts[0].clock, &p), 0);
  if (held) {
    assert_int_equal(tr_clock_set_fake(10001000000LL, 0), 0);
    read_pass_decoded(&f, note_clock_out, &c);
  }
  assert_int_equal(tr_clock_set_fake(10200000000LL, 0), 0);
  read_pass_decoded(&f, note_clock_out, &c);
  assert_true(c.n_bp > first_new && c.n_bp < CLOCK_OUT_MAX && c.n_bound < CLOCK_OUT_MAX);
  int64_t h1 = c.bp_host[first_new];
  assert_true(s0 + (h1 - h0) - (h1 - HOST_AHEAD_NS) > bias); /* the plan's error */
  for (int64_t h = h0 + 1; h < h1; h += (h1 - h0) / 64 + 1) {
    int64_t shown = s0 + (h - h0), truth = h - HOST_AHEAD_NS;
    assert_true(bound_at(&c, shown) * 1000.0 >= (double)llabs(shown - truth));
  }
  tr_clock_clear_fake();
  teardown(&f);
}

/* The final pass's data can reach past the clocks its head wrote (data that arrived while the
 * pass was read: a reconnecting agent's backlog), converted by the last edge or breakpoint;
 * the bound track must bound it too (issue 24: 3,589 events of a starved host up to 2.1 ms off,
 * 24 s past the track's last sample, in an ASan run). */
static void check_final_reach(enum tr_timeline timeline) {
  static struct clock_out c;
  tr_output_packet o;
  struct fixture f;
  uint64_t now = 0, late = 0;
  int rc;
  setup(&f, timeline);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  assert_int_equal(tr_clock_set_fake(10000000000LL, 0), 0); /* 10 s into the session */
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  add_probes(f.hosts[0].clock, (int64_t)now - 10000000000LL, (int64_t)now - 1000000000LL);
  put_packet(f.tbufs[0][0], 1, 1);
  tr_trace_output_stop(f.out);
  c = (struct clock_out){.bound_uuid = tr_trace_writer_bound_track_uuid("host-0")};
  assert_int_equal(tr_trace_output_begin(f.out), 0); /* the head: clocks up to now */
  assert_int_equal(tr_clock_set_fake(15000000000LL, 0), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &late);
  put_packet(f.tbufs[0][0], 2, 2); /* arrives while the pass is read, 5 s later */
  while ((rc = tr_trace_output_next(f.out, &o)) == 1) {
    Perfetto__Protos__TracePacket *p = perfetto__protos__trace_packet__unpack(NULL, o.len, o.data);
    if (p)
      note_clock_out(p, &c);
    perfetto__protos__trace_packet__free_unpacked(p, NULL);
  }
  assert_int_equal(rc, 0);
  tr_trace_output_reset(f.out);
  assert_true(c.n_bound > 0);
  /* The sample in force at the late data (the track's values are rounded up onto a grid of
   * 1/64-1/32 of the bound: a sample comes when the bound leaves the last one's cell) bounds
   * the estimator there. */
  int64_t late_bound = tr_clocksync_error_bound(f.hosts[0].clock, (int64_t)late + HOST_AHEAD_NS);
  assert_true(late_bound > 0);
  assert_true(bound_at(&c, (int64_t)late) * 1000.0 >= (double)late_bound);
  tr_clock_clear_fake();
  teardown(&f);
}

static void test_machines_bound_reaches_final_data(void **state) {
  (void)state;
  check_final_reach(TR_TIMELINE_MACHINES);
}

static void test_global_clocks_bound_reaches_final_data(void **state) {
  (void)state;
  check_final_reach(TR_TIMELINE_GLOBAL_CLOCKS);
}

static void test_global_clocks_bound_covers_replanned_export(void **state) {
  (void)state;
  check_replanned_export(900000, false);
}

static void test_global_clocks_bound_covers_held_breakpoints(void **state) {
  (void)state;
  check_replanned_export(2000000, true);
}

/* Makes host h report TR_HOST_CLOCK_SNAPSHOTS new (identical) clock snapshots. */
static void add_host_snapshots(tr_host *h) {
  uint64_t now = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  for (int i = 0; i < TR_HOST_CLOCK_SNAPSHOTS; i++) {
    struct tr_host_clock_snapshot *e =
        &h->clock_snapshots[h->clock_snapshots_taken++ % TR_HOST_CLOCK_SNAPSHOTS];
    e->snap.n = 1;
    e->snap.clocks[0] = (struct tr_clock_reading){TR_CLOCK_BOOTTIME, 12345};
    e->received_ns = (int64_t)now;
  }
}

static bool same(const struct got *a, const struct got *b) {
  return a->len == b->len && a->trusted_len == b->trusted_len &&
         memcmp(a->data, b->data, sizeof a->data) == 0;
}

static void test_journal_thinning_keeps_anchor(void **state) {
  /* One host's snapshots past the journal's bound: thinned once, the anchor kept. */
  const size_t runs = TR_CLOCK_JOURNAL_PER_HOST * 2 / TR_HOST_CLOCK_SNAPSHOTS + 2;
  const size_t cap = TR_CLOCK_JOURNAL_PER_HOST * 2 + 256;
  struct got *got = calloc(cap, sizeof *got);
  struct fixture f;
  size_t n, snapshots = 0, other = 0, first_snapshot = 0;
  (void)state;
  assert_non_null(got);
  setup(&f, TR_TIMELINE_MACHINES);
  for (size_t r = 0; r < runs; r++) {
    add_host_snapshots(&f.hosts[0]);
    assert_int_equal(tr_trace_output_journal_clocks(f.out), 0);
  }
  n = read_pass(&f, got, cap);
  /* The host snapshots are all alike; find them by the first one, after the anchors. */
  for (size_t i = 0; i + 1 < n && !first_snapshot; i++)
    if (same(&got[i], &got[i + 1]))
      first_snapshot = i;
  assert_true(first_snapshot > 0);
  for (size_t i = first_snapshot; i < n; i++) {
    if (same(&got[i], &got[first_snapshot]))
      snapshots++;
    else
      other++;
  }
  /* Written: runs x 64 snapshots; bounded at TR_CLOCK_JOURNAL_PER_HOST per host (2 here). */
  assert_true(snapshots < runs * TR_HOST_CLOCK_SNAPSHOTS);
  assert_true(snapshots <= TR_CLOCK_JOURNAL_PER_HOST * 2);
  assert_true(snapshots > TR_CLOCK_JOURNAL_PER_HOST);
  assert_int_equal(other, 2); /* the tail: read-complete event, TraceStats */
  /* Both anchors are pinned: still there, just before the snapshots. */
  assert_true(tr_trace_output_host_anchored(f.out, 0));
  assert_true(tr_trace_output_host_anchored(f.out, 1));
  teardown(&f);
  free(got);
}

/* global-clocks, 10 s into a session whose host-0 was probed until 3 s ago: the clock journal
 * once, then (thin) host-1's snapshots past its bound, so its older half is thinned; returns
 * how many of host-0's bound samples up to the first journal's time the next pass holds. */
static size_t bound_samples_journaled(bool thin) {
  static struct clock_out c;
  struct fixture f;
  uint64_t now = 0, journaled = 0;
  size_t n = 0;
  setup(&f, TR_TIMELINE_GLOBAL_CLOCKS);
  assert_int_equal(tr_clocksync_init(&f.hosts[0].clock, NULL), 0);
  assert_int_equal(tr_clock_set_fake(10000000000LL, 0), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  add_probes(f.hosts[0].clock, (int64_t)now - 12000000000LL, (int64_t)now - 3000000000LL);
  assert_int_equal(tr_trace_output_journal_clocks(f.out), 0);
  tr_clock_read(TR_CLOCK_BOOTTIME, &journaled);
  for (size_t r = 0; thin && r < TR_CLOCK_JOURNAL_PER_HOST * 2 / TR_HOST_CLOCK_SNAPSHOTS + 2; r++) {
    add_host_snapshots(&f.hosts[1]);
    assert_int_equal(tr_trace_output_journal_clocks(f.out), 0);
  }
  c = (struct clock_out){.bound_uuid = tr_trace_writer_bound_track_uuid("host-0")};
  read_pass_decoded(&f, note_clock_out, &c);
  for (size_t i = 0; i < c.n_bound; i++)
    n += c.bound_ts[i] <= (int64_t)journaled;
  tr_clock_clear_fake();
  teardown(&f);
  return n;
}

/* A bound track's sample is written only where the bound changes: the journal's thinning must
 * keep them all (it dropped every other one of its older half, and with the first one a host's
 * first events had no bound: 6,644 events of a 12 s global-clocks run under load). */
static void test_journal_thinning_keeps_bound_samples(void **state) {
  (void)state;
  size_t whole = bound_samples_journaled(false), thinned = bound_samples_journaled(true);
  print_message("bound samples journaled: %zu, after thinning %zu\n", whole, thinned);
  assert_true(whole >= 8);
  assert_true(thinned + 1 >= whole); /* a sample may fall either side of the time read */
}

/* One pass into a file, and what the loop did meanwhile. */
struct file_run {
  int done_rc;
  bool done;
  unsigned iterations; /* loop iterations while the pass ran */
  unsigned ticks;      /* 1 ms timer ticks while the pass ran */
  int drain_fd;        /* pipe: read once ticks reached drain_after */
  unsigned drain_after;
  uint8_t *drained;
  size_t drained_len;
  uv_check_t check; /* counts iterations */
  uv_timer_t timer; /* ticks */
};

static void on_file_pass_done(void *ud, int rc) {
  struct file_run *r = ud;
  r->done = true;
  r->done_rc = rc;
}

static void count_iteration(uv_check_t *c) {
  struct file_run *r = c->data;
  r->iterations += !r->done;
}

static void drain_pipe(struct file_run *r) {
  static uint8_t bytes[1 << 16];
  ssize_t n;
  while ((n = read(r->drain_fd, bytes, sizeof bytes)) > 0) {
    r->drained = realloc(r->drained, r->drained_len + (size_t)n);
    assert_non_null(r->drained);
    memcpy(r->drained + r->drained_len, bytes, (size_t)n);
    r->drained_len += (size_t)n;
  }
}

static void tick(uv_timer_t *t) {
  struct file_run *r = t->data;
  r->ticks += !r->done;
  if (r->drain_fd >= 0 && r->ticks >= r->drain_after)
    drain_pipe(r);
}

static int source_begin(void *ud) { return tr_trace_output_begin(ud); }
static int source_next(void *ud, tr_output_packet *out) { return tr_trace_output_next(ud, out); }
static void source_reset(void *ud) { tr_trace_output_reset(ud); }

/* Runs a pass of f.out into file with budget until its done callback. */
static void run_file_pass(struct fixture *f, tr_trace_file *file, size_t budget,
                          struct file_run *r) {
  uv_check_init(&f->loop, &r->check);
  r->check.data = r;
  uv_check_start(&r->check, count_iteration);
  uv_timer_init(&f->loop, &r->timer);
  r->timer.data = r;
  uv_timer_start(&r->timer, tick, 1, 1);
  tr_trace_file_source src = {source_begin, source_next, source_reset, f->out};
  assert_int_equal(tr_trace_file_pass(file, &src, budget, on_file_pass_done, r), 0);
  assert_false(r->done); /* never from the call itself */
  while (!r->done)
    uv_run(&f->loop, UV_RUN_ONCE);
  uv_close((uv_handle_t *)&r->check, NULL);
  uv_close((uv_handle_t *)&r->timer, NULL);
}

/* The host packets' markers in a trace file's bytes, in order; returns how many, and in
 * *last the first byte of the last record. */
static size_t record_markers(const uint8_t *bytes, size_t len, uint8_t *markers, size_t cap,
                             uint8_t *last) {
  size_t n = 0, at = 0;
  while (at < len) {
    uint64_t rec = 0;
    unsigned shift = 0;
    assert_int_equal(bytes[at++], 0x0A); /* TracePacket, field 1 */
    do
      rec |= (uint64_t)(bytes[at] & 0x7f) << shift, shift += 7;
    while (bytes[at++] & 0x80);
    assert_true(at + rec <= len);
    if (rec >= 2 && bytes[at] == 0x40) {
      assert_true(n < cap);
      markers[n++] = bytes[at + 1];
    }
    *last = bytes[at];
    at += rec;
  }
  return n;
}

static size_t file_markers(FILE *file, uint8_t *markers, size_t cap, uint8_t *last) {
  static uint8_t bytes[1 << 20];
  rewind(file);
  size_t len = fread(bytes, 1, sizeof bytes, file);
  return record_markers(bytes, len, markers, cap, last);
}

static tr_trace_file *open_file_cfg(struct fixture *f, Perfetto__Protos__TraceConfig cfg, int fd,
                                    uint64_t max_bytes) {
  tr_trace_file *file;
  char err[128];
  cfg.write_into_file = 1;
  cfg.max_file_size_bytes = max_bytes;
  assert_int_equal(tr_trace_file_open(&f->loop, &cfg, 1, fd, &file, err, sizeof err), 0);
  assert_non_null(file);
  return file;
}

static tr_trace_file *open_file(struct fixture *f, int fd, uint64_t max_bytes) {
  return open_file_cfg(f, f->cfg, fd, max_bytes);
}

/* Puts n packets of 300 bytes with markers 1..n (timestamp = marker, then a filler
 * field), spread over both hosts' first buffer. */
static void put_packets(struct fixture *f, unsigned n) {
  /* A fragment of 300: field 8 = marker, field 61 (nothing trusted) with 294 bytes. */
  uint8_t payload[2 + 300] = {0xAC, 0x02, 0x40, 0, 0xEA, 0x03, 0xA6, 0x02};
  for (unsigned i = 1; i <= n; i++) {
    payload[3] = (uint8_t)i;
    tr_tbuf_chunk c = {.producer_id = 1,
                       .writer_id = 1,
                       .chunk_id = i,
                       .fragments = 1,
                       .uid = 1000,
                       .pid = 42,
                       .payload = payload,
                       .payload_len = sizeof payload};
    assert_int_equal(tr_tbuf_write_chunk(f->tbufs[(i - 1) * 2 / n][0], &c), 0);
  }
}

static void test_file_pass_in_steps(void **state) {
  struct fixture f;
  struct file_run r = {.drain_fd = -1};
  uint8_t markers[64], last = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  put_packets(&f, 30);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  tr_trace_file *file = open_file(&f, dup(fileno(tmp)), 0);
  run_file_pass(&f, file, 1, &r); /* a budget of one byte: a step per packet */
  assert_int_equal(r.done_rc, 0);
  assert_false(tr_trace_file_writing(file));
  assert_true(r.iterations >= 30);
  tr_trace_file_close(file);
  assert_int_equal(uv_run(&f.loop, UV_RUN_DEFAULT), 0); /* the writer wrote and closed */
  assert_int_equal(file_markers(tmp, markers, 64, &last), 30);
  for (uint8_t i = 0; i < 30; i++)
    assert_int_equal(markers[i], i + 1);
  assert_int_equal(last, STATS_MARK); /* the tail closes the pass */
  fclose(tmp);
  teardown(&f);
}

/* A file that takes nothing (a pipe nobody reads, as a disk the kernel throttles): the loop
 * goes on (its timer ticks) while the pass waits, and the pass ends once the file takes it. */
static void test_file_blocked_write_keeps_loop_running(void **state) {
  struct fixture f;
  uint8_t markers[128], last = 0;
  int fds[2];
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  put_packets(&f, 100);
  assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
  assert_true(fcntl(fds[1], F_SETPIPE_SZ, 4096) >= 4096);
  assert_int_equal(fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  struct file_run r = {.drain_fd = fds[0], .drain_after = 50};
  tr_trace_file *file = open_file(&f, fds[1], 0);
  run_file_pass(&f, file, 1024, &r);
  assert_int_equal(r.done_rc, 0);
  assert_true(r.ticks >= 50); /* the loop ran while the writes waited */
  assert_true(r.drained_len > 100 * 300);
  tr_trace_file_close(file);
  assert_int_equal(uv_run(&f.loop, UV_RUN_DEFAULT), 0);
  drain_pipe(&r);
  assert_int_equal(record_markers(r.drained, r.drained_len, markers, 128, &last), 100);
  for (unsigned i = 0; i < 100; i++)
    assert_int_equal(markers[i], i + 1);
  assert_int_equal(last, STATS_MARK);
  free(r.drained);
  close(fds[0]);
  teardown(&f);
}

static void test_file_full_ends_the_pass(void **state) {
  struct fixture f;
  struct file_run r = {.drain_fd = -1};
  uint8_t markers[64], last = 0;
  (void)state;
  setup(&f, TR_TIMELINE_MACHINES);
  put_packets(&f, 10);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  tr_trace_file *file = open_file(&f, dup(fileno(tmp)), 1); /* not even the head fits */
  run_file_pass(&f, file, SIZE_MAX, &r);
  assert_int_equal(r.done_rc, TR_ERR_FULL);
  tr_trace_file_source src = {source_begin, source_next, source_reset, f.out};
  assert_int_equal(tr_trace_file_pass(file, &src, SIZE_MAX, on_file_pass_done, &r), TR_ERR_FULL);
  tr_trace_file_close(file);
  assert_int_equal(uv_run(&f.loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(file_markers(tmp, markers, 64, &last), 0);
  fclose(tmp);
  teardown(&f);
}

/* With the config's compression the file holds one compressed packet per group of about
 * 1 MiB (traced's write_into_file read), whatever the step budget: here the whole pass, every
 * packet of which is inside, in order, the tail included. */
static void file_compressed(const Perfetto__Protos__TraceConfig *asked, uint8_t field_tag_1,
                            uint8_t field_tag_2) {
  static uint8_t bytes[1 << 20], content[1 << 20];
  struct fixture f;
  struct file_run r = {.drain_fd = -1};
  uint8_t markers[64], last = 0;
  uint64_t n = 0;
  size_t at = 0, clen;
  setup(&f, TR_TIMELINE_MACHINES);
  put_packets(&f, 30);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  Perfetto__Protos__TraceConfig cfg = f.cfg;
  cfg.has_compression_type = asked->has_compression_type;
  cfg.compression_type = asked->compression_type;
  cfg.compression = asked->compression;
  tr_trace_file *file = open_file_cfg(&f, cfg, dup(fileno(tmp)), 0);
  run_file_pass(&f, file, 1, &r); /* a step per packet uncompressed; one group here */
  assert_int_equal(r.done_rc, 0);
  tr_trace_file_close(file);
  assert_int_equal(uv_run(&f.loop, UV_RUN_DEFAULT), 0);
  rewind(tmp);
  size_t len = fread(bytes, 1, sizeof bytes, tmp);
  /* one record: 0x0A len { field tag, len, compressed bytes } */
  assert_int_equal(bytes[at++], 0x0A);
  assert_true(tr_varint_get(bytes, len, &at, &n));
  assert_int_equal(n, len - at);
  assert_int_equal(bytes[at++], field_tag_1);
  assert_int_equal(bytes[at++], field_tag_2);
  assert_true(tr_varint_get(bytes, len, &at, &n));
  assert_int_equal(n, len - at);
  if (field_tag_2 == 0x03) { /* compressed_packets (50): zlib */
    uLongf out = sizeof content;
    assert_int_equal(uncompress(content, &out, bytes + at, (uLong)n), Z_OK);
    clen = out;
  } else {
    clen = ZSTD_decompress(content, sizeof content, bytes + at, n);
    assert_false(ZSTD_isError(clen));
  }
  assert_int_equal(record_markers(content, clen, markers, 64, &last), 30);
  for (uint8_t i = 0; i < 30; i++)
    assert_int_equal(markers[i], i + 1);
  assert_int_equal(last, STATS_MARK);
  assert_true(len < clen / 2);
  fclose(tmp);
  teardown(&f);
}

static void test_file_compressed(void **state) {
  (void)state;
  Perfetto__Protos__TraceConfig cfg = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__CompressionConfig c =
      PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__CompressionConfig__Zstd z =
      PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_CONFIG__ZSTD__INIT;
  cfg.has_compression_type = 1;
  cfg.compression_type = PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_TYPE__COMPRESSION_TYPE_DEFLATE;
  file_compressed(&cfg, 0x92, 0x03); /* field 50, wire type 2 */
  c.zstd = &z;
  cfg.compression = &c;
  file_compressed(&cfg, 0xAA, 0x08); /* field 133, wire type 2 */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pass_order),
      cmocka_unit_test(test_unanchored_host_waits),
      cmocka_unit_test(test_global_clocks_always_anchored),
      cmocka_unit_test(test_global_clocks_bound_follows_export),
      cmocka_unit_test(test_machines_no_edge_below_data_read),
      cmocka_unit_test(test_machines_edge_without_exchanges),
      cmocka_unit_test(test_machines_edge_past_stalled_frontier),
      cmocka_unit_test(test_global_clocks_bound_covers_replanned_export),
      cmocka_unit_test(test_global_clocks_bound_covers_held_breakpoints),
      cmocka_unit_test(test_machines_bound_reaches_final_data),
      cmocka_unit_test(test_global_clocks_bound_reaches_final_data),
      cmocka_unit_test(test_journal_thinning_keeps_anchor),
      cmocka_unit_test(test_journal_thinning_keeps_bound_samples),
      cmocka_unit_test(test_file_pass_in_steps),
      cmocka_unit_test(test_file_blocked_write_keeps_loop_running),
      cmocka_unit_test(test_file_full_ends_the_pass),
      cmocka_unit_test(test_file_compressed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
