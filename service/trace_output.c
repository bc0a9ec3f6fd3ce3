/* trace_output.c: turns a session into trace packets (see trace_output.h): service packets in
 * traced's order, every (buffer, host) central buffer with the trusted fields appended, then the
 * read-complete event and TraceStats with our per-host extension.
 *
 * Trusted slice of a host's packet (reference 4.8): the producer's uid and pid as the agent saw
 * them (SO_PEERCRED), a sequence id unique in the session across hosts (tr_tbuf_seqids keyed by
 * the session's host entry), machine_id = tr_machine_id(host name) in the `machines` timeline,
 * and previous_packet_dropped when the buffer lost data on that sequence. In the `global-clocks`
 * timeline each host packet is first rewritten to its host's global clock ids (with an ftrace
 * anchor before it when needed), and the head of each pass carries the cross-host snapshots and
 * the hosts' own clock snapshots (service/timeline_output.c).
 *
 * Stats layout (protos/tracerelay/tracerelay_stats.proto): TraceStats.buffer_stats has one entry
 * per (buffer, host entry that received data), buffer-major; the extension field 1000 lists
 * every host entry with its link/agent counters and which buffer_stats entries are its. */
#include "service/trace_output.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/log.h"
#include "relay/tr_error.h"
#include "service/status.h"
#include "service/timeline_output.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

#define COMP "output"
#define FILE_CHUNK (64u * 1024u)
#define SYNC_PERIOD_NS 5000000ll /* the estimator's exchange period */
#define SYNC_MAX_PER_PASS 1024 /* exchanges asked of the estimator at a time */
#define SYNC_HOST_MAX ((1ll << 62) - 1)
#define BOUND_STEP_NS 2000000ll /* host time between two evaluations of the error bound */
#define BOUND_QUANTUM_NS 100ll   /* bound values are rounded up to 0.1 us */

enum { PHASE_HEAD, PHASE_BUFFERS, PHASE_TAIL, PHASE_DONE };

static void free_svc(tr_session_reader *r) {
  tr_packet_list_free(&r->svc);
  r->next_svc = 0;
}

void tr_trace_output_reset(tr_session *s) {
  free_svc(&s->reader);
  memset(&s->reader, 0, sizeof s->reader);
}

/* Appends a packet the writer made (rc 0) into reserved room. */
static int push(tr_packet_list *l, int rc, tr_trace_writer_buf *b) {
  if (rc != 0)
    return rc;
  tr_packet_list_push(l, *b);
  return 0;
}

/* The session's first entry of entry index's host: a restarted agent's entries share it. */
static size_t first_entry(const tr_session *s, size_t index) {
  for (size_t i = 0; i < index; i++)
    if (s->hosts[i].host == s->hosts[index].host)
      return i;
  return index;
}

static bool host_listed_before(const tr_session *s, size_t index) {
  return first_entry(s, index) != index;
}

bool tr_trace_output_host_anchored(const tr_session *s, size_t index) {
  return s->svc->timeline != TR_TIMELINE_MACHINES || s->hosts[first_entry(s, index)].clock_anchored;
}

/* The host's clock anchor, once: at the last exchange written, or, in the final pass of a host
 * that never had one, at the session's start (trace_processor then assumes the two BOOTTIMEs
 * aligned, for this host alone). Pinned: the clock journal's thinning must not drop it. */
static int add_clock_anchor(tr_session *s, tr_session_host *sh, tr_packet_list *out, bool final) {
  int64_t at = sh->clock_sync_last.update_remote;
  tr_trace_writer_buf p;
  int rc;
  if (sh->clock_anchored || (at <= 0 && !final))
    return 0;
  if (at <= 0)
    at = (int64_t)s->start_clocks.clocks[0].ts_ns;
  if ((rc = tr_packet_list_reserve(out, 1)) != 0 ||
      (rc = tr_trace_writer_clock_anchor(s->svc->uid, sh->host->machine_id, (uint64_t)at, &p)) !=
          0)
    return rc;
  tr_packet_list_push_pinned(out, p);
  sh->clock_anchored = true;
  return 0;
}

static int add_events(tr_session *s, tr_packet_list *out) {
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = s->cfg->builtin_data_sources;
  int rc = 0;
  if (b && b->disable_service_events) {
    s->num_events = 0;
    return 0;
  }
  if ((rc = tr_packet_list_reserve(out, s->num_events)) != 0)
    return rc;
  for (size_t i = 0; i < s->num_events && rc == 0; i++) {
    tr_trace_writer_buf p;
    rc = push(out, tr_trace_writer_service_event(s->svc->uid, s->events[i].ts, s->events[i].event,
                                                  &p),
              &p);
  }
  s->num_events = 0;
  return rc;
}

/* ---- the clock error bound tracks (docs/querying.md) ----
 * Per host, a counter of how far the trace may place the host's events from their true
 * instants: the estimator's bound on its mapping M (relay/clocksync.h), plus how far
 * trace_processor's conversion in this encoding may stray from M: the breakpoints' tolerance
 * in `global-clocks`; in `machines`, |h + edge offset - M(h)| for the newest two edges (near
 * an edge, which one trace_processor takes depends on the reading it keys the edge by). The
 * bound is evaluated every BOUND_STEP_NS of host time, as the larger of the step's two ends,
 * and written where it rises or falls below 4/5 of the last value written, so the value shown
 * is never below the bound at the points evaluated. Cost O(host time / step * log knots). */

static int add_bound_tracks(tr_session *s, tr_session_host *sh, tr_packet_list *out) {
  tr_trace_writer_buf host, bound;
  int rc;
  if (sh->bound_tracks_written)
    return 0;
  if ((rc = tr_packet_list_reserve(out, 2)) != 0 ||
      (rc = tr_trace_writer_host_tracks(s->svc->uid, sh->host->name, &host, &bound)) != 0)
    return rc;
  tr_packet_list_push_pinned(out, host); /* the journal's thinning must keep them */
  tr_packet_list_push_pinned(out, bound);
  sh->bound_tracks_written = true;
  return 0;
}

static int64_t encoding_error(const tr_session *s, const tr_session_host *sh, int64_t h,
                              int64_t m) {
  int64_t worst = 0;
  if (s->svc->timeline == TR_TIMELINE_GLOBAL_CLOCKS)
    return TR_TIMELINE_TOLERANCE_NS + 2;
  for (int i = 0; i < sh->bound_edges; i++) {
    int64_t e = llabs(h + sh->bound_edge_offset[i] - m);
    worst = e > worst ? e : worst;
  }
  return worst + 2; /* trace_processor's integer halves */
}

/* The bound at host time h, with *service_ts = M(h); -1 when the estimator has none. */
static int64_t bound_at(const tr_session *s, const tr_session_host *sh, int64_t h,
                        int64_t *service_ts) {
  int64_t b = tr_clocksync_error_bound(sh->host->clock, h);
  if (b < 0 || tr_clocksync_map(sh->host->clock, h, service_ts) != 0)
    return -1;
  return b + encoding_error(s, sh, h, *service_ts);
}

/* Samples over host times [sh->bound_from, to). */
static int add_bound_samples(tr_session *s, tr_session_host *sh, tr_packet_list *out, int64_t to) {
  for (int64_t end; sh->bound_from < to; sh->bound_from = end) {
    int64_t h = sh->bound_from;
    end = h + BOUND_STEP_NS < to ? h + BOUND_STEP_NS : to; /* the next call goes on from `to` */
    int64_t ts, ts_end, b = bound_at(s, sh, h, &ts), b_end = bound_at(s, sh, end, &ts_end);
    tr_trace_writer_buf p;
    int rc;
    if (b < 0 || b_end < 0 || ts < 0)
      continue;
    b = b_end > b ? b_end : b;
    b = (b + BOUND_QUANTUM_NS - 1) / BOUND_QUANTUM_NS * BOUND_QUANTUM_NS;
    if (sh->bound_last_ns && b <= sh->bound_last_ns && b * 5 >= sh->bound_last_ns * 4)
      continue;
    if ((rc = add_bound_tracks(s, sh, out)) != 0 || (rc = tr_packet_list_reserve(out, 1)) != 0 ||
        (rc = tr_trace_writer_counter(s->svc->uid, (uint64_t)ts,
                                      tr_trace_writer_bound_track_uuid(sh->host->name),
                                      (double)b / 1000.0, &p)) != 0)
      return rc;
    tr_packet_list_push(out, p);
    sh->bound_last_ns = b;
  }
  return 0;
}

/* machines: a remote_clock_sync edge was written. Host times before the first edge convert by
 * it (trace_processor's rule), so the samples wait for it; later ones run up to the new edge
 * with the edges before it. */
static int bound_edge_written(tr_session *s, tr_session_host *sh, tr_packet_list *out,
                              const struct tr_clocksync_sync_pair *pair) {
  int64_t offset = (pair->ping_service + pair->update_service) / 2 - pair->update_remote;
  int rc = sh->bound_edges ? add_bound_samples(s, sh, out, pair->ping_remote) : 0;
  sh->bound_edge_offset[1] = sh->bound_edge_offset[0];
  sh->bound_edge_offset[0] = offset;
  if (sh->bound_edges < 2)
    sh->bound_edges++;
  return rc;
}

/* The samples of every host up to its estimator's frontier (what later probes do not revise);
 * final: on to the host's present, where data stamped after the last probe is converted. */
static int add_bounds(tr_session *s, tr_packet_list *out, bool final) {
  for (size_t h = 0; h < s->num_hosts; h++) {
    tr_session_host *sh = &s->hosts[h];
    int64_t frontier;
    int rc;
    if (host_listed_before(s, h) || !sh->host->clock ||
        (frontier = tr_clocksync_frontier(sh->host->clock)) < 0)
      continue;
    if (!sh->bound_started) {
      sh->bound_from = (int64_t)s->start_clocks.clocks[0].ts_ns -
                       tr_clocksync_offset_ns(sh->host->clock);
      sh->bound_from = sh->bound_from < 0 ? 0 : sh->bound_from;
      sh->bound_started = true;
    }
    if (s->svc->timeline == TR_TIMELINE_MACHINES && sh->bound_edges == 0)
      continue;
    if (final) {
      int64_t now = (int64_t)tr_session_now() - tr_clocksync_offset_ns(sh->host->clock);
      frontier = now > frontier ? now : frontier;
    }
    if ((rc = add_bound_samples(s, sh, out, frontier + 1)) != 0)
      return rc;
  }
  return 0;
}

/* remote_clock_sync packets (machines timeline): the best real exchanges of each host since
 * the session started (trace_processor converts data stamped before the first one by it), one
 * packet per exchange and per SYNC_PERIOD_NS of host time, so trace_processor gets one
 * cross-machine edge per period and follows the drift piecewise. A non-final pass
 * stops at the estimator's frontier (what it will not revise); the final one takes all. */
static int add_clock_syncs(tr_session *s, tr_packet_list *out, bool final) {
  struct tr_clocksync_probe ex[SYNC_MAX_PER_PASS];
  for (size_t h = 0; h < s->num_hosts; h++) {
    tr_session_host *sh = &s->hosts[h];
    int64_t to;
    int n, rc;
    if (host_listed_before(s, h))
      continue;
    if (!sh->host->clock) {
      if ((rc = add_clock_anchor(s, sh, out, true)) != 0) /* no exchange will ever come */
        return rc;
      continue;
    }
    to = final ? SYNC_HOST_MAX : tr_clocksync_frontier(sh->host->clock);
    if (!sh->clock_sync_started && to >= 0) {
      /* From the session's start on: an exchange from before it would be the edge for the
       * first data until the first exchange of the session, and is up to a second old. */
      int64_t start = (int64_t)s->start_clocks.clocks[0].ts_ns;
      sh->clock_sync_from = start - tr_clocksync_offset_ns(sh->host->clock);
      if (sh->clock_sync_from < 0)
        sh->clock_sync_from = 0;
      sh->clock_sync_started = true;
      sh->bound_from = sh->clock_sync_from;
      sh->bound_started = true;
    }
    /* In slices of SYNC_MAX_PER_PASS: a session read only at its end has them all at once. */
    do {
      if (to <= sh->clock_sync_from)
        break;
      n = tr_clocksync_best_exchanges(sh->host->clock, sh->clock_sync_from, to, SYNC_PERIOD_NS,
                                      &sh->clock_sync_last, ex, SYNC_MAX_PER_PASS);
      if (n <= 0)
        break;
      for (int i = 0; i < n; i++) {
        struct tr_clocksync_sync_pair pair;
        tr_trace_writer_buf p;
        sh->clock_sync_from = (ex[i].t2 + ex[i].t3) / 2 + 1;
        if (tr_clocksync_pair_from_exchange(&ex[i], &pair) != 0)
          continue;
        if (tr_packet_list_reserve(out, 1) != 0) /* bound samples go in between */
          return TR_ERR_NOMEM;
        rc = push(out, tr_trace_writer_remote_clock_sync(s->svc->uid, sh->host->machine_id, &pair,
                                                         &p),
                  &p);
        rc = rc ? rc : bound_edge_written(s, sh, out, &pair);
        if (rc != 0)
          return rc;
      }
    } while (n == SYNC_MAX_PER_PASS);
    if ((rc = add_clock_anchor(s, sh, out, final)) != 0)
      return rc;
  }
  return 0;
}

/* The hosts' link changes since the last pass, as instants on the service's track and on the
 * host's own track (its descriptors written again before them: cheap, and marks are rare). */
static int add_host_marks(tr_session *s, tr_packet_list *out) {
  static const char *const what[] = {"disconnected", "reconnected", "agent restarted"};
  tr_trace_writer_buf p, host, bound;
  int32_t uid = s->svc->uid;
  int rc = 0;
  if (s->num_host_marks == 0)
    return 0;
  if ((rc = tr_packet_list_reserve(out, 1 + 4 * s->num_host_marks)) != 0)
    return rc;
  rc = push(out, tr_trace_writer_service_track(uid, &p), &p);
  for (size_t i = 0; i < s->num_host_marks && rc == 0; i++) {
    const tr_session_host_mark *m = &s->host_marks[i];
    char name[sizeof m->host->name + 32];
    snprintf(name, sizeof name, "host %s %s", m->host->name, what[m->kind]);
    rc = push(out,
              tr_trace_writer_instant(uid, m->ts, TR_TRACE_WRITER_SERVICE_TRACK_UUID, name, &p),
              &p);
    if (rc == 0 && (rc = tr_trace_writer_host_tracks(uid, m->host->name, &host, &bound)) == 0) {
      tr_packet_list_push(out, host);
      tr_packet_list_push(out, bound);
      rc = push(out,
                tr_trace_writer_instant(uid, m->ts, tr_trace_writer_host_track_uuid(m->host->name),
                                        what[m->kind], &p),
                &p);
    }
  }
  s->num_host_marks = 0;
  return rc;
}

/* The clock packets up to the hosts' present (final: all of them). */
static int add_clocks(tr_session *s, tr_packet_list *out, bool final) {
  int rc = 0;
  if (s->svc->timeline == TR_TIMELINE_MACHINES)
    rc = add_clock_syncs(s, out, final);
  rc = rc ? rc : add_bounds(s, out, final);
  /* Host clock snapshots; in global-clocks the cross-host snapshots, before the host data. */
  return rc ? rc : tr_timeline_head(s, out, final);
}

int tr_trace_output_journal_clocks(tr_session *s) {
  int rc = add_clocks(s, &s->clock_journal, false);
  size_t cap = TR_CLOCK_JOURNAL_PER_HOST * (s->num_hosts ? s->num_hosts : 1);
  if (s->clock_journal.n > cap) {
    tr_packet_list_thin(&s->clock_journal);
    if (!s->clock_journal_thinned++)
      TR_WARN(COMP, "session %llu: unread for long: the clock journal passed %zu packets, its "
              "older half is thinned (the timeline there is less exact)",
              (unsigned long long)s->id, cap);
  }
  return rc;
}

/* The first pass's head: clocks, marker, config, uuid, system infos; then pending events, the
 * clock journal and the clocks since. */
static int build_head(tr_session *s) {
  tr_session_reader *r = &s->reader;
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = s->cfg->builtin_data_sources;
  int32_t uid = s->svc->uid;
  tr_trace_writer_buf p;
  int rc = tr_packet_list_reserve(&r->svc, 8 + s->num_hosts);

  if (rc == 0 && !s->first_read_done) {
    struct tr_clock_snapshot now;
    if (!(b && b->disable_clock_snapshotting)) {
      rc = rc ? rc : push(&r->svc, tr_trace_writer_clock_snapshot(uid, &s->start_clocks, &p), &p);
      if (tr_clock_snapshot(&now) == 0)
        rc = rc ? rc : push(&r->svc, tr_trace_writer_clock_snapshot(uid, &now, &p), &p);
    }
    rc = rc ? rc : push(&r->svc, tr_trace_writer_sync_marker(uid, tr_session_now(), &p), &p);
    if (!(b && b->disable_trace_config))
      rc = rc ? rc : push(&r->svc, tr_trace_writer_trace_config(uid, s->cfg, &p), &p);
    rc = rc ? rc
            : push(&r->svc, tr_trace_writer_trace_uuid(uid, s->uuid_msb, s->uuid_lsb, &p), &p);
    if (!(b && b->disable_system_info)) {
      rc = rc ? rc : push(&r->svc, tr_trace_writer_system_info(uid, s->svc->system_info, 0, &p), &p);
      for (size_t h = 0; h < s->num_hosts && rc == 0; h++) {
        const tr_host *host = s->hosts[h].host;
        uint32_t mid = s->svc->timeline == TR_TIMELINE_MACHINES ? host->machine_id : 0;
        if (!host->system_info || host_listed_before(s, h))
          continue;
        rc = push(&r->svc, tr_trace_writer_system_info(uid, host->system_info, mid, &p), &p);
      }
    }
    s->first_read_done = true;
  }
  /* traced's order: lifecycle events, then remote_clock_sync. */
  if (rc == 0)
    rc = add_events(s, &r->svc);
  if (rc == 0)
    rc = add_host_marks(s, &r->svc);
  if (rc == 0 && (rc = tr_packet_list_reserve(&r->svc, s->clock_journal.n)) == 0) {
    for (size_t i = 0; i < s->clock_journal.n; i++)
      tr_packet_list_push(&r->svc, s->clock_journal.items[i]);
    s->clock_journal.n = 0; /* the bytes moved to the pass */
  }
  return rc ? rc : add_clocks(s, &r->svc, r->final);
}

static int build_tail(tr_session *s) {
  tr_session_reader *r = &s->reader;
  Perfetto__Protos__TraceStats *stats = NULL;
  uint8_t *ext = NULL;
  size_t ext_len = 0;
  tr_trace_writer_buf p;
  int rc;

  free_svc(r);
  tr_session_add_event(s, TR_TW_READ_TRACING_BUFFERS_COMPLETED);
  if ((rc = add_events(s, &r->svc)) != 0 || (rc = tr_packet_list_reserve(&r->svc, 1)) != 0)
    return rc;
  if ((rc = tr_trace_output_stats(s, &stats, &ext, &ext_len)) != 0)
    return rc;
  rc = tr_trace_writer_trace_stats(s->svc->uid, tr_session_now(), stats, ext, ext_len, &p);
  tr_trace_output_free_stats(stats);
  free(ext);
  return push(&r->svc, rc, &p);
}

int tr_trace_output_begin(tr_session *s) {
  int rc;
  tr_trace_output_reset(s);
  s->reader.active = true;
  s->reader.final = s->state == TR_SESSION_STOPPED;
  s->reader.phase = PHASE_HEAD;
  if ((rc = build_head(s)) != 0)
    tr_trace_output_reset(s);
  return rc;
}

static int next_buffer_packet(tr_session *s, tr_output_packet *out) {
  tr_session_reader *r = &s->reader;
  for (; r->buffer < s->num_buffers; r->buffer++, r->host = 0) {
    for (; r->host < s->num_hosts; r->host++) {
      tr_session_host *sh = &s->hosts[r->host];
      tr_tbuf *b = sh->tbufs[r->buffer];
      tr_tbuf_packet pkt;
      tr_tbuf_trusted t;
      int rc;
      if (!b || (!r->final && !tr_trace_output_host_anchored(s, r->host)))
        continue;
      rc = tr_tbuf_read_packet(b, r->final, &pkt);
      if (rc < 0)
        return rc;
      if (rc == 0)
        continue;
      memset(&t, 0, sizeof t);
      t.uid = pkt.uid;
      t.pid = pkt.pid;
      t.previous_packet_dropped = pkt.previous_packet_dropped;
      t.machine_id = s->svc->timeline == TR_TIMELINE_MACHINES ? sh->host->machine_id : 0;
      rc = tr_tbuf_seqids_get(s->seqids, (uint32_t)r->host, pkt.producer_id, pkt.writer_id,
                              &t.sequence_id);
      if (rc < 0)
        return rc;
      if (s->svc->timeline == TR_TIMELINE_GLOBAL_CLOCKS) {
        rc = tr_timeline_packet(s, r->host, pkt.data, pkt.len, &t, out);
        return rc == 0 ? 2 : rc; /* 2: malformed, dropped and counted; read on */
      }
      out->data = pkt.data;
      out->len = pkt.len;
      rc = tr_tbuf_append_trusted(out->trusted, sizeof out->trusted, &t);
      if (rc < 0)
        return rc;
      out->trusted_len = (size_t)rc;
      return 1;
    }
  }
  return 0;
}

int tr_trace_output_next(tr_session *s, tr_output_packet *out) {
  tr_session_reader *r = &s->reader;
  int rc;
  if (!r->active)
    return 0;
  for (;;) {
    switch (r->phase) {
    case PHASE_HEAD:
    case PHASE_TAIL:
      if (r->next_svc < r->svc.n) {
        out->data = r->svc.items[r->next_svc].data;
        out->len = r->svc.items[r->next_svc].len;
        out->trusted_len = 0;
        r->next_svc++;
        return 1;
      }
      if (r->phase == PHASE_TAIL) {
        r->phase = PHASE_DONE;
        break;
      }
      r->phase = PHASE_BUFFERS;
      break;
    case PHASE_BUFFERS:
      if (tr_timeline_pending(s, out))
        return 1; /* a rewritten packet behind its ftrace anchor */
      do
        rc = next_buffer_packet(s, out);
      while (rc == 2);
      if (rc != 0)
        return rc;
      if ((rc = build_tail(s)) != 0)
        return rc;
      r->phase = PHASE_TAIL;
      break;
    default:
      r->active = false;
      return 0;
    }
  }
}

/* ---- stats ---- */

void tr_trace_output_free_stats(Perfetto__Protos__TraceStats *stats) {
  if (!stats)
    return;
  if (stats->n_buffer_stats)
    free(stats->buffer_stats[0]);
  free(stats->buffer_stats);
  free(stats);
}

static void fill_buffer_stats(Perfetto__Protos__TraceStats__BufferStats *o,
                              const tr_tbuf_stats *t) {
  perfetto__protos__trace_stats__buffer_stats__init(o);
#define SET(f)                                                                                    \
  o->has_##f = 1;                                                                                 \
  o->f = t->f
  SET(buffer_size);
  SET(bytes_written);
  SET(bytes_overwritten);
  SET(bytes_read);
  SET(chunks_written);
  SET(chunks_rewritten);
  SET(chunks_overwritten);
  SET(chunks_discarded);
  SET(chunks_read);
  SET(write_wrap_count);
  SET(patches_succeeded);
  SET(patches_failed);
  SET(abi_violations);
  SET(trace_writer_packet_loss);
#undef SET
}

static void fill_host(Tracerelay__HostStats *h, const tr_session *s, size_t hi) {
  const tr_session_host *sh = &s->hosts[hi];
  const tr_host_stats *st = &sh->host->stats;
  tr_service_fill_host_stats(h, sh->host, !sh->gone && !sh->retired);
  /* The packets in the dropped chunks: for the accounting check, not in the live status. */
  h->has_agent_queue_dropped_packets = h->has_agent_spill_dropped_packets = 1;
  h->agent_queue_dropped_packets = st->agent_queue_dropped_packets;
  h->agent_spill_dropped_packets = st->agent_spill_dropped_packets;
  h->has_session_chunks_refused = 1;
  h->session_chunks_refused = sh->chunks_refused;
  h->has_session_flushes_missed = 1;
  h->session_flushes_missed = sh->flushes_missed;
  h->has_session_disconnects = 1;
  h->session_disconnects = sh->disconnects;
  h->has_session_agent_exits_unclean = 1;
  h->session_agent_exits_unclean = sh->agent_exits_unclean;
  h->has_session_stops_timed_out = 1;
  h->session_stops_timed_out = sh->stops_timed_out;
  h->has_session_smb_full = 1;
  h->session_smb_full = st->agent_smb_full > sh->smb_full_at_start
                            ? st->agent_smb_full - sh->smb_full_at_start
                            : 0;
  h->has_session_smb_full_ms = 1;
  h->session_smb_full_ms = st->agent_smb_full_ns > sh->smb_full_ns_at_start
                               ? (st->agent_smb_full_ns - sh->smb_full_ns_at_start + 999999u) /
                                     1000000u /* rounded up: still an upper bound */
                               : 0;
  h->has_session_instances_not_started = 1;
  for (size_t i = 0; i < s->num_instances; i++) {
    const tr_ds_instance *in = &s->instances[i];
    h->session_instances_not_started +=
        in->host_index == hi && in->state != TR_DS_SETUP && !in->was_started;
  }
  h->n_session_disconnected_at_ns = sh->num_disconnected_at;
  h->session_disconnected_at_ns = (uint64_t *)sh->disconnected_at;
}

static int pack_extension(tr_session *s, uint8_t **ext, size_t *ext_len) {
  Tracerelay__TraceStatsExtension x = TRACERELAY__TRACE_STATS_EXTENSION__INIT;
  size_t nh = s->num_hosts;
  Tracerelay__HostStats *hosts = calloc(nh + 1, sizeof *hosts);
  Tracerelay__HostStats **ptrs = calloc(nh + 1, sizeof *ptrs);
  uint32_t *idx = calloc(nh * s->num_buffers * 2 + 1, sizeof *idx);
  int rc = TR_ERR_NOMEM;
  uint32_t bs_index = 0;

  if (!hosts || !ptrs || !idx)
    goto out;
  for (size_t h = 0; h < nh; h++) {
    tracerelay__host_stats__init(&hosts[h]);
    fill_host(&hosts[h], s, h);
    hosts[h].has_session_packets_lost_in_gaps = 1;
    for (size_t b = 0; b < s->num_buffers; b++) {
      tr_tbuf_stats t;
      if (s->hosts[h].tbufs[b]) {
        tr_tbuf_get_stats(s->hosts[h].tbufs[b], &t);
        hosts[h].session_packets_lost_in_gaps += t.packets_lost_in_gaps;
      }
    }
    hosts[h].buffer_stats_index = idx + h * s->num_buffers * 2;
    hosts[h].buffer_index = hosts[h].buffer_stats_index + s->num_buffers;
    ptrs[h] = &hosts[h];
  }
  /* buffer_stats are buffer-major: walk them in that order to number them. */
  for (size_t b = 0; b < s->num_buffers; b++)
    for (size_t h = 0; h < nh; h++) {
      if (!s->hosts[h].tbufs[b])
        continue;
      hosts[h].buffer_stats_index[hosts[h].n_buffer_stats_index++] = bs_index++;
      hosts[h].buffer_index[hosts[h].n_buffer_index++] = (uint32_t)b;
    }
  x.n_tracerelay_hosts = nh;
  x.tracerelay_hosts = ptrs;
  x.has_tracerelay_chunks_unknown_buffer = 1;
  x.tracerelay_chunks_unknown_buffer = s->svc->chunks_unknown_buffer;
  const char *unmatched[TR_SESSION_MAX_UNMATCHED], *absent[TR_SESSION_MAX_UNMATCHED];
  x.n_tracerelay_unmatched_data_sources =
      tr_session_unmatched_data_sources(s, unmatched, TR_SESSION_MAX_UNMATCHED);
  x.tracerelay_unmatched_data_sources = (char **)unmatched;
  x.n_tracerelay_machines_not_connected =
      tr_session_machines_not_connected(s, absent, TR_SESSION_MAX_UNMATCHED);
  x.tracerelay_machines_not_connected = (char **)absent;
  *ext_len = tracerelay__trace_stats_extension__get_packed_size(&x);
  *ext = malloc(*ext_len + 1);
  if (!*ext)
    goto out;
  tracerelay__trace_stats_extension__pack(&x, *ext);
  rc = 0;
out:
  free(idx);
  free(ptrs);
  free(hosts);
  return rc;
}

int tr_trace_output_stats(tr_session *s, Perfetto__Protos__TraceStats **out, uint8_t **ext,
                          size_t *ext_len) {
  Perfetto__Protos__TraceStats *st = calloc(1, sizeof *st);
  Perfetto__Protos__TraceStats__BufferStats *bs = NULL;
  size_t n = 0, producers = 0, sources = 0;
  uint64_t discarded = 0, patches_failed = 0, invalid = 0;

  *out = NULL;
  *ext = NULL;
  if (!st)
    return TR_ERR_NOMEM;
  perfetto__protos__trace_stats__init(st);
  bs = calloc(s->num_buffers * s->num_hosts + 1, sizeof *bs);
  st->buffer_stats = calloc(s->num_buffers * s->num_hosts + 1, sizeof *st->buffer_stats);
  if (!bs || !st->buffer_stats)
    goto fail;
  for (size_t b = 0; b < s->num_buffers; b++)
    for (size_t h = 0; h < s->num_hosts; h++) {
      tr_tbuf_stats t;
      if (!s->hosts[h].tbufs[b])
        continue;
      tr_tbuf_get_stats(s->hosts[h].tbufs[b], &t);
      fill_buffer_stats(&bs[n], &t);
      st->buffer_stats[n] = &bs[n];
      discarded += t.chunks_discarded;
      patches_failed += t.patches_failed;
      invalid += t.invalid_packets;
      n++;
    }
  st->n_buffer_stats = n;
  invalid += tr_timeline_invalid(s);
  if (n == 0)
    free(bs); /* free_stats frees buffer_stats[0] only when there is one */
  bs = NULL;
  for (size_t i = 0; i < s->svc->num_hosts; i++) {
    const tr_host *host = s->svc->hosts[i];
    for (size_t p = 0; p < host->num_producers; p++)
      if (host->producers[p].connected) {
        producers++;
        sources += host->producers[p].num_data_sources;
      }
  }
  st->has_producers_connected = 1;
  st->producers_connected = (uint32_t)producers;
  st->has_data_sources_registered = 1;
  st->data_sources_registered = (uint32_t)sources;
  st->has_tracing_sessions = 1;
  st->tracing_sessions = (uint32_t)s->svc->num_sessions;
  st->has_total_buffers = 1;
  st->total_buffers = (uint32_t)n;
  st->has_chunks_discarded = 1;
  st->chunks_discarded = discarded;
  st->has_patches_discarded = 1;
  st->patches_discarded = patches_failed;
  st->has_invalid_packets = 1;
  st->invalid_packets = invalid;
  st->has_flushes_requested = 1;
  st->flushes_requested = s->flushes_requested;
  st->has_flushes_succeeded = 1;
  st->flushes_succeeded = s->flushes_succeeded;
  st->has_flushes_failed = 1;
  st->flushes_failed = s->flushes_failed;
  if (s->final_flush_outcome) {
    st->has_final_flush_outcome = 1;
    st->final_flush_outcome = (Perfetto__Protos__TraceStats__FinalFlushOutcome)s->final_flush_outcome;
  }
  if (pack_extension(s, ext, ext_len) != 0)
    goto fail;
  *out = st;
  return 0;
fail:
  free(bs);
  tr_trace_output_free_stats(st);
  return TR_ERR_NOMEM;
}

/* ---- write_into_file ---- */

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return TR_ERR_SYS(errno);
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int tr_trace_output_write_file(tr_session *s) {
  uint64_t max = s->cfg->max_file_size_bytes;
  uint8_t *buf;
  size_t used = 0;
  tr_output_packet pkt;
  int rc;

  if (s->out_fd < 0 || s->file_full)
    return s->file_full ? TR_ERR_FULL : 0;
  buf = malloc(FILE_CHUNK);
  if (!buf)
    return TR_ERR_NOMEM;
  if ((rc = tr_trace_output_begin(s)) != 0)
    goto out;
  while ((rc = tr_trace_output_next(s, &pkt)) == 1) {
    uint8_t head[TR_TRACE_WRITER_RECORD_HEADER_MAX];
    size_t hl = tr_trace_writer_record_header(pkt.len + pkt.trusted_len, head);
    size_t rec = hl + pkt.len + pkt.trusted_len;
    if (max && s->file_bytes + rec > max) {
      TR_WARN(COMP, "session %llu: max_file_size_bytes %llu reached, stopping the session",
              (unsigned long long)s->id, (unsigned long long)max);
      s->file_full = true;
      rc = TR_ERR_FULL;
      break;
    }
    if (used + rec > FILE_CHUNK) {
      if ((rc = write_all(s->out_fd, buf, used)) != 0)
        break;
      used = 0;
    }
    if (rec > FILE_CHUNK) {
      if ((rc = write_all(s->out_fd, head, hl)) != 0 ||
          (rc = write_all(s->out_fd, pkt.data, pkt.len)) != 0 ||
          (rc = write_all(s->out_fd, pkt.trusted, pkt.trusted_len)) != 0)
        break;
    } else {
      memcpy(buf + used, head, hl);
      memcpy(buf + used + hl, pkt.data, pkt.len);
      memcpy(buf + used + hl + pkt.len, pkt.trusted, pkt.trusted_len);
      used += rec;
    }
    s->file_bytes += rec;
  }
  if (rc >= 0 || rc == TR_ERR_FULL) {
    int wrc = write_all(s->out_fd, buf, used);
    if (wrc != 0)
      rc = wrc;
  }
  if (rc < 0 && rc != TR_ERR_FULL)
    TR_ERROR(COMP, "session %llu: writing the trace file failed: %s", (unsigned long long)s->id,
             tr_strerror(rc));
  tr_trace_output_reset(s);
out:
  free(buf);
  return rc < 0 ? rc : 0;
}
