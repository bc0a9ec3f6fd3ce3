/* timeline_output.c: the timeline part of a session's trace output (see timeline_output.h and
 * docs/timeline.md).
 *
 * Host clock snapshots. Each agent sends HostClockSnapshot when a data source starts or stops
 * and periodically while one runs; the service keeps the last TR_HOST_CLOCK_SNAPSHOTS per host
 * (tr_host.clock_snapshots, filled by hosts.c). Each call (the clock journal's, a read pass's) takes those
 * received since the session started and not yet written, as packets of that host: `machines`, on sequence 1 with the host's
 * machine_id (TP scopes them to the machine); `global-clocks`, rewritten to the host's global
 * ids (relay/trace/packet_rewrite.h) on a sequence of their own (the (host entry, producer 0) key of
 * the session's sequence ids: producer ids are never 0), without primary_trace_clock.
 *
 * Cross-host snapshots (`global-clocks`). Per host, the estimator's mapping exported as
 * breakpoints every TR_TIMELINE_TOLERANCE_NS of error (tr_clocksync_export), from an
 * export point that starts one second before the session's start and moves forward at each
 * call (every second into the session's clock journal, and at each read pass) to a little past
 * the host's present. They are written in a pass's head, before the host data of that pass; trace_processor converts by the latest snapshot at or below a value, so
 * data read later but stamped earlier still finds its breakpoint. Beyond the estimator's
 * frontier the mapping is its plan (slope 1 + drift), which later probes may re-plan by at most
 * a few microseconds over the second or so a call covers; a breakpoint that would not strictly
 * follow the last one written on both clocks is left out, so each series stays monotonic as
 * trace_processor needs. */
#include "service/timeline_output.h"

#include <stdlib.h>
#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/clock/clocksync.h"
#include "relay/base/log.h"
#include "relay/trace/packet_rewrite.h"
#include "relay/base/tr_error.h"

#define COMP "timeline"
#define EXPORT_BEFORE_START_NS 1000000000ll /* data stamped just before the session started */
#define EXPORT_AHEAD_NS 20000000ll          /* past the host's present at a non-final pass */
#define EXPORT_STEP_NS 1000000000ll         /* host time exported per tr_clocksync_export call */
#define EXPORT_CAP 4096 /* breakpoints per call: 1 s up to about 390 ppm at 99 ns, else halved */
#define HOST_MAX ((1ll << 62) - 1)

typedef struct tl_host {
  bool rw_init;
  tr_rewrite_host rw;
  uint64_t snapshots_written; /* host->clock_snapshots_taken already looked at */
  bool started;               /* export_from is set */
  int64_t export_from;        /* host BOOTTIME the next export starts at */
  bool exported;
  int64_t last_host, last_service; /* the last breakpoint written */
  struct tr_clocksync_steps steps;  /* the series written, its steps back bounded */
  /* Where the last call left breakpoints out (host BOOTTIME [held_from, held_to)): the mapping
   * was re-planned below the last one written, which trace_processor applies there instead,
   * up to held_dev from the mapping. */
  int64_t held_from, held_to, held_dev;
  bool held_open; /* held_from is set, held_to not yet */
  int64_t held_reach; /* the latest trace time a held range's conversion reached */
  uint64_t invalid;
} tl_host;

struct tr_timeline_out {
  enum tr_timeline timeline;
  int32_t uid;
  tr_tbuf_seqids *seqids; /* the read side's */
  int64_t start_ns;       /* the session's start, service BOOTTIME */
  tl_host *hosts;
  size_t n_hosts;
  tr_rewrite_seq *seqs; /* by sequence id */
  size_t n_seqs;
  uint8_t *buf;
  size_t cap;
  uint8_t anchor[TR_REWRITE_ANCHOR_MAX + TR_TBUF_TRUSTED_MAX];
  struct tr_clocksync_breakpoint *bp;
  bool pending;
  size_t pending_len;
  uint8_t pending_trusted[TR_TBUF_TRUSTED_MAX];
  size_t pending_trusted_len;
};

tr_timeline_out *tr_timeline_output_new(enum tr_timeline timeline, int32_t uid,
                                        tr_tbuf_seqids *seqids, int64_t start_ns) {
  tr_timeline_out *tl = calloc(1, sizeof *tl);
  if (!tl)
    return NULL;
  tl->timeline = timeline;
  tl->uid = uid;
  tl->seqids = seqids;
  tl->start_ns = start_ns;
  return tl;
}

void tr_timeline_output_free(tr_timeline_out *tl) {
  if (!tl)
    return;
  free(tl->hosts);
  free(tl->seqs);
  free(tl->buf);
  free(tl->bp);
  free(tl);
}

/* Host entry index's state, made on first use; NULL when out of memory. */
static tl_host *host_state(tr_timeline_out *tl, size_t index) {
  size_t n_hosts = index + 1;
  if (tl->n_hosts < n_hosts) {
    tl_host *g = realloc(tl->hosts, n_hosts * sizeof *g);
    if (!g)
      return NULL;
    memset(g + tl->n_hosts, 0, (n_hosts - tl->n_hosts) * sizeof *g);
    tl->hosts = g;
    tl->n_hosts = n_hosts;
  }
  return &tl->hosts[index];
}

static const tr_rewrite_host *rewrite_host(tl_host *th, const tr_host *host) {
  if (!th->rw_init) {
    if (tr_rewrite_host_init(&th->rw, host->trace_name, NULL, 0) < 0)
      return NULL; /* cannot happen: certificate names are valid machine names */
    th->rw_init = true;
  }
  return &th->rw;
}

/* Appends bytes (packet + trusted slice) as one service packet; room was reserved before. */
static int push_bytes(tr_packet_list *out, const uint8_t *a, size_t alen, const uint8_t *b,
                      size_t blen) {
  uint8_t *d = malloc(alen + blen);
  if (!d)
    return TR_ERR_NOMEM;
  memcpy(d, a, alen);
  memcpy(d + alen, b, blen);
  tr_packet_list_push(out, (tr_trace_writer_buf){d, alen + blen});
  return 0;
}

/* ---- host clock snapshots ---- */

static int host_snapshot_packet(tr_timeline_out *tl, tr_packet_list *dst, size_t index,
                                tl_host *th, const tr_host *host,
                                const struct tr_clock_snapshot *snap) {
  Perfetto__Protos__ClockSnapshot cs = PERFETTO__PROTOS__CLOCK_SNAPSHOT__INIT;
  Perfetto__Protos__ClockSnapshot__Clock clocks[TR_CLOCK_SNAPSHOT_MAX];
  Perfetto__Protos__ClockSnapshot__Clock *ptrs[TR_CLOCK_SNAPSHOT_MAX];
  Perfetto__Protos__TracePacket p = PERFETTO__PROTOS__TRACE_PACKET__INIT;
  uint8_t raw[256], out[TR_REWRITE_OUT_MAX(256)], trusted[TR_TBUF_TRUSTED_MAX];
  tr_tbuf_trusted t = {.uid = tl->uid, .sequence_id = 1};
  const uint8_t *bytes = raw;
  size_t len;
  int rc;

  for (uint32_t i = 0; i < snap->n; i++) {
    perfetto__protos__clock_snapshot__clock__init(&clocks[i]);
    clocks[i].has_clock_id = clocks[i].has_timestamp = 1;
    clocks[i].clock_id = snap->clocks[i].clock_id;
    clocks[i].timestamp = snap->clocks[i].ts_ns;
    ptrs[i] = &clocks[i];
  }
  cs.n_clocks = snap->n;
  cs.clocks = ptrs;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT;
  p.clock_snapshot = &cs;
  len = perfetto__protos__trace_packet__get_packed_size(&p);
  if (len > sizeof raw)
    return 0; /* six clocks are about 80 bytes */
  perfetto__protos__trace_packet__pack(&p, raw);
  if (tl->timeline == TR_TIMELINE_GLOBAL_CLOCKS) {
    tr_rewrite_seq seq = {0};
    const tr_rewrite_host *rw = rewrite_host(th, host);
    uint8_t anchor[TR_REWRITE_ANCHOR_MAX];
    size_t alen = 0;
    if (!rw || (rc = tr_rewrite_packet(rw, &seq, raw, len, out, sizeof out, anchor, &alen)) < 0)
      return 0;
    bytes = out;
    len = (size_t)rc;
    if ((rc = tr_tbuf_seqids_get(tl->seqids, (uint32_t)index, 0, 0, &t.sequence_id)) < 0)
      return rc == TR_ERR_NOMEM ? rc : 0;
  } else {
    t.machine_id = host->machine_id;
  }
  rc = tr_tbuf_append_trusted(trusted, sizeof trusted, &t);
  if (rc < 0)
    return rc;
  return push_bytes(dst, bytes, len, trusted, (size_t)rc);
}

int tr_timeline_output_host_snapshots(tr_timeline_out *tl, size_t index, const tr_host *host,
                                      tr_packet_list *out) {
  tl_host *th = host_state(tl, index);
  uint64_t taken = host->clock_snapshots_taken;
  uint64_t g;
  int rc;
  if (!th)
    return TR_ERR_NOMEM;
  g = th->snapshots_written;
  if (taken > TR_HOST_CLOCK_SNAPSHOTS && g < taken - TR_HOST_CLOCK_SNAPSHOTS)
    g = taken - TR_HOST_CLOCK_SNAPSHOTS; /* older ones were overwritten before a pass came */
  if (g >= taken)
    return 0;
  if ((rc = tr_packet_list_reserve(out, (size_t)(taken - g))) < 0)
    return rc;
  for (; g < taken; g++) {
    const struct tr_host_clock_snapshot *e = &host->clock_snapshots[g % TR_HOST_CLOCK_SNAPSHOTS];
    if (e->received_ns < tl->start_ns)
      continue; /* from before this session */
    if ((rc = host_snapshot_packet(tl, out, index, th, host, &e->snap)) < 0)
      return rc;
  }
  th->snapshots_written = taken;
  return 0;
}

/* ---- cross-host snapshots ---- */

/* Ends the held range at host time `to`, where trace_processor's conversion by the last
 * breakpoint written stops. */
static void close_held(tl_host *th, const struct tr_clocksync *est, int64_t to) {
  int64_t m, dev, reach = th->last_service + (to - 1 - th->last_host);
  th->held_to = to;
  th->held_open = false;
  th->held_reach = reach > th->held_reach ? reach : th->held_reach;
  if (tr_clocksync_map(est, to - 1, &m) == 0 &&
      (dev = th->last_service + (to - 1 - th->last_host) - m) > th->held_dev)
    th->held_dev = dev;
}

/* Writes the points of the series (tr_clocksync_steps_next) on the way to M's breakpoint bp.
 * A point above M (catching up, a step at a time, with a mapping re-planned below a breakpoint
 * already written) makes a held range: trace_processor's conversion lies above M there, by up
 * to held_dev, which the bound track adds. */
static int push_breakpoint(const tr_timeline_out *tl, tr_packet_list *out, tl_host *th,
                           const tr_rewrite_host *rw, const struct tr_clocksync *est,
                           const struct tr_clocksync_breakpoint *bp) {
  struct tr_clocksync_breakpoint pt;
  uint8_t pkt[TR_REWRITE_SNAPSHOT_MAX], uid[11];
  int len, rc;
  while (tr_clocksync_steps_next(&th->steps, est, bp, -1, &pt) > 0) {
    size_t ul = 0;
    uint64_t v = (uint64_t)(int64_t)tl->uid; /* trusted_uid (3), sign-extended as protobuf */
    int64_t m;
    if (th->held_open)
      close_held(th, est, pt.host_ts); /* trace_processor takes this one from here on */
    len = tr_rewrite_cross_host_snapshot(rw, pt.service_ts, pt.host_ts, pkt, sizeof pkt);
    if (len < 0)
      continue;
    uid[ul++] = 0x18;
    do {
      uid[ul++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      v >>= 7;
    } while (v);
    if ((rc = tr_packet_list_reserve(out, 1)) < 0 ||
        (rc = push_bytes(out, pkt, (size_t)len, uid, ul)) < 0)
      return rc;
    th->exported = true;
    th->last_host = pt.host_ts;
    th->last_service = pt.service_ts;
    if (tr_clocksync_map(est, pt.host_ts, &m) == 0 && pt.service_ts > m) {
      if (th->held_to <= th->held_from)
        th->held_from = pt.host_ts;
      th->held_open = true; /* a second run in one call merges with the first */
      th->held_dev = pt.service_ts - m > th->held_dev ? pt.service_ts - m : th->held_dev;
    }
  }
  return 0;
}

int tr_timeline_output_cross_host(tr_timeline_out *tl, size_t index, const tr_host *host,
                                  tr_packet_list *out, bool final) {
  tl_host *th = host_state(tl, index);
  const struct tr_clocksync *est = host->clock;
  const tr_rewrite_host *rw;
  uint64_t now = 0;
  int64_t offset, host_now, to;
  int rc;
  if (!th)
    return TR_ERR_NOMEM;
  rw = rewrite_host(th, host);
  if (!est || !rw || tr_clocksync_frontier(est) < 0)
    return 0; /* no probe answered yet: the next pass exports from the same point */
  offset = tr_clocksync_offset_ns(est); /* service minus host */
  tr_clock_read(TR_CLOCK_BOOTTIME, &now);
  host_now = (int64_t)now - offset;
  if (!th->started) {
    th->export_from = tl->start_ns - offset - EXPORT_BEFORE_START_NS;
    if (th->export_from < 0)
      th->export_from = 0;
    th->started = true;
    th->steps.step_ns = TR_TIMELINE_STEP_NS;
  }
  to = host_now + EXPORT_AHEAD_NS;
  if (final && tr_clocksync_frontier(est) > to)
    to = tr_clocksync_frontier(est);
  if (to > HOST_MAX)
    to = HOST_MAX;
  if (!tl->bp && !(tl->bp = malloc(EXPORT_CAP * sizeof *tl->bp)))
    return TR_ERR_NOMEM;
  th->held_from = th->held_to = th->held_dev = 0;
  for (int64_t step = EXPORT_STEP_NS; th->export_from <= to;) {
    int64_t end = th->export_from + step - 1 < to ? th->export_from + step - 1 : to;
    int n = tr_clocksync_export_steps(est, th->export_from, end, TR_TIMELINE_TOLERANCE_NS,
                                      TR_TIMELINE_STEP_NS, tl->bp, EXPORT_CAP);
    if (n == TR_ERR_FULL && step > 1000) {
      step /= 2;
      continue;
    }
    if (n < 0) {
      TR_WARN(COMP, "host %s: clock mapping not exported: %s", host->name, tr_strerror(n));
      return 0;
    }
    if ((rc = tr_packet_list_reserve(out, (size_t)n)) < 0)
      return rc;
    for (int i = 0; i < n; i++)
      if ((rc = push_breakpoint(tl, out, th, rw, est, &tl->bp[i])) < 0)
        return rc;
    th->export_from = end + 1;
  }
  if (th->held_open)
    close_held(th, est, th->export_from); /* the next call goes on from there */
  return 0;
}

int64_t tr_timeline_output_exported_to(const tr_timeline_out *tl, size_t index) {
  return index < tl->n_hosts && tl->hosts[index].started ? tl->hosts[index].export_from : -1;
}

int64_t tr_timeline_output_reach(const tr_timeline_out *tl, size_t index, int64_t host_ts) {
  const tl_host *th = index < tl->n_hosts ? &tl->hosts[index] : NULL;
  if (!th || !th->exported || host_ts < th->last_host)
    return -1;
  int64_t at = th->last_service + (host_ts - th->last_host);
  return at > th->held_reach ? at : th->held_reach;
}

int tr_timeline_output_hold_to(tr_timeline_out *tl, size_t index, const tr_host *host,
                               int64_t to) {
  tl_host *th = host_state(tl, index);
  const struct tr_clocksync *est = host->clock;
  if (!th)
    return TR_ERR_NOMEM;
  if (!est || !th->exported || to <= th->export_from)
    return 0;
  if (!tl->bp && !(tl->bp = malloc(EXPORT_CAP * sizeof *tl->bp)))
    return TR_ERR_NOMEM;
  /* The mapping at its knots in the range (a tolerance no drift reaches: knots and ends only),
   * where the distance from the last breakpoint's line peaks. */
  int n = tr_clocksync_export(est, th->export_from, to - 1, HOST_MAX, tl->bp, EXPORT_CAP);
  if (n < 0)
    return 0;
  th->held_from = th->export_from;
  th->held_dev = 0;
  for (int i = 0; i < n; i++) {
    int64_t dev = llabs(th->last_service + (tl->bp[i].host_ts - th->last_host) - tl->bp[i].service_ts);
    th->held_dev = dev > th->held_dev ? dev : th->held_dev;
  }
  close_held(th, est, to);
  return 0;
}

int64_t tr_timeline_output_held_excess(const tr_timeline_out *tl, size_t index, int64_t from,
                                       int64_t to) {
  const tl_host *th = index < tl->n_hosts ? &tl->hosts[index] : NULL;
  /* The track is keyed by the mapping's trace time, which runs up to held_dev from the
   * conversion there: the samples that far either side of the range are read for its events
   * too. */
  if (!th || th->held_to <= th->held_from || th->held_dev <= TR_TIMELINE_TOLERANCE_NS ||
      to < th->held_from - th->held_dev || from >= th->held_to + th->held_dev)
    return 0;
  return th->held_dev - TR_TIMELINE_TOLERANCE_NS;
}

/* ---- host packets ---- */

int tr_timeline_output_packet(tr_timeline_out *tl, size_t index, const tr_host *host,
                              const uint8_t *data, size_t len, const tr_tbuf_trusted *t,
                              tr_output_packet *out) {
  tl_host *th = host_state(tl, index);
  const tr_rewrite_host *rw;
  size_t need = TR_REWRITE_OUT_MAX(len), alen = 0;
  int rc;
  if (!th)
    return TR_ERR_NOMEM;
  if (!(rw = rewrite_host(th, host)) || len > TR_REWRITE_PACKET_MAX) {
    th->invalid++;
    return 0;
  }
  if (t->sequence_id >= tl->n_seqs) {
    size_t n = tl->n_seqs ? tl->n_seqs : 64;
    while (n <= t->sequence_id)
      n *= 2;
    tr_rewrite_seq *g = realloc(tl->seqs, n * sizeof *g);
    if (!g)
      return TR_ERR_NOMEM;
    memset(g + tl->n_seqs, 0, (n - tl->n_seqs) * sizeof *g);
    tl->seqs = g;
    tl->n_seqs = n;
  }
  if (tl->cap < need) {
    uint8_t *g = realloc(tl->buf, need);
    if (!g)
      return TR_ERR_NOMEM;
    tl->buf = g;
    tl->cap = need;
  }
  rc = tr_rewrite_packet(rw, &tl->seqs[t->sequence_id], data, len, tl->buf, tl->cap, tl->anchor,
                         &alen);
  if (rc < 0) {
    th->invalid++;
    return 0;
  }
  out->data = tl->buf;
  out->len = (size_t)rc;
  if ((rc = tr_tbuf_append_trusted(out->trusted, sizeof out->trusted, t)) < 0)
    return rc;
  out->trusted_len = (size_t)rc;
  if (alen) {
    /* The anchor goes first on the same sequence; the loss mark stays with the packet. */
    tr_tbuf_trusted at = *t;
    at.previous_packet_dropped = 0;
    memcpy(tl->pending_trusted, out->trusted, out->trusted_len);
    tl->pending_trusted_len = out->trusted_len;
    tl->pending_len = out->len;
    tl->pending = true;
    out->data = tl->anchor;
    out->len = alen;
    if ((rc = tr_tbuf_append_trusted(out->trusted, sizeof out->trusted, &at)) < 0)
      return rc;
    out->trusted_len = (size_t)rc;
  }
  return 1;
}

int tr_timeline_output_pending(tr_timeline_out *tl, tr_output_packet *out) {
  if (!tl->pending)
    return 0;
  tl->pending = false;
  out->data = tl->buf;
  out->len = tl->pending_len;
  memcpy(out->trusted, tl->pending_trusted, tl->pending_trusted_len);
  out->trusted_len = tl->pending_trusted_len;
  return 1;
}

uint64_t tr_timeline_output_invalid(const tr_timeline_out *tl) {
  uint64_t n = 0;
  for (size_t i = 0; i < tl->n_hosts; i++)
    n += tl->hosts[i].invalid;
  return n;
}
