/* trace_output.c: a session's read side (see trace_output.h): turns the session into trace
 * packets, service packets in traced's order, every (buffer, host) central buffer with the
 * trusted fields appended, then the read-complete event and the session's TraceStats; keeps the
 * clock journal between passes and runs the passes of write_into_file sessions into their file
 * (trace_file.c), a step per loop iteration.
 *
 * Trusted slice of a host's packet (reference 4.8): the producer's uid and pid as the agent saw
 * them (SO_PEERCRED), a sequence id unique in the session across hosts (tr_tbuf_seqids keyed by
 * the session's host entry), machine_id = tr_machine_id(host name) in the `machines` timeline,
 * and previous_packet_dropped when the buffer lost data on that sequence. In the `global-clocks`
 * timeline each host packet is first rewritten to its host's global clock ids (with an ftrace
 * anchor before it when needed), and the head of each pass carries the cross-host snapshots and
 * the hosts' own clock snapshots (service/timeline_output.c). */
#include "service/trace_output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/trace/trace_filter.h"
#include "service/config_check.h"
#include "service/trace_file.h"

#define COMP "output"
#define SYNC_MAX_PER_PASS 4096 /* edges asked of the estimator at a time */
#define SYNC_SLICE_NS 1000000000ll /* host time per ask (halved when it holds more) */
#define SYNC_HOST_MAX ((1ll << 62) - 1)
/* Host time between two evaluations of the error bound: an eighth of the probes' spacing,
 * within these (a host probed every 5 ms is evaluated every 2 ms, one probed once a second
 * every 125 ms: at 50 ms, 10,000 such hosts cost 200,000 evaluations a second). A step's
 * sample is the largest bound of its ends and the knots inside, so a longer step is coarser,
 * never lower. */
#define BOUND_STEP_MIN_NS 2000000ll
#define BOUND_STEP_MAX_NS 125000000ll
#define BOUND_QUANTUM_NS 100ll   /* bound values are rounded up to 0.1 us at least */

enum { PHASE_HEAD, PHASE_BUFFERS, PHASE_TAIL, PHASE_DONE };

/* One host entry of the session, and the writer's bookkeeping of its clock. */
typedef struct out_host {
  const tr_host *host;
  tr_tbuf *const *tbufs;      /* [num_buffers], the session's */
  /* The session's first entry of this host (its own index unless a restarted agent's), and
   * whether a newer entry of the host follows: kept as entries are added, as passes ask them
   * of every host (per packet, for the anchor) and 10,000 hosts made a walk each quadratic. */
  size_t first;
  bool superseded;
  int64_t clock_sync_from;    /* host BOOTTIME up to which remote_clock_sync was written */
  bool clock_sync_started;    /* clock_sync_from was set to the session's start */
  struct tr_clocksync_sync_pair clock_sync_last; /* the last one written */
  struct tr_clocksync_steps clock_steps;         /* the edges written, their steps bounded */
  bool clock_anchored; /* machines: its clock anchor is written (tr_trace_writer_clock_anchor):
                        * its ClockSnapshots and data may follow */
  /* machines: host BOOTTIME at and below which no edge may come any more: a read pass wrote
   * the host's data up to about there (read_horizon), which trace_processor converted with the
   * edges before it as it read them, or its bound track is written up to there with those
   * edges (bound_from). An edge written later below either would place that data elsewhere
   * than trace_processor does, and beyond the bound its track shows. */
  int64_t read_horizon;
  /* The host's clock error bound track: host BOOTTIME sampled up to, the last value written
   * (0: none yet), and in `machines` the offsets (service minus host) of the newest two
   * remote_clock_sync edges written, [0] the newest. */
  bool bound_tracks_written;
  bool bound_started;
  int64_t bound_from;
  int64_t bound_last_ns;
  int bound_edges;
  int64_t bound_edge_offset[2];
  /* global-clocks: the latest trace time the breakpoints written put a host time below
   * bound_from at, and the value in effect there. A re-planned mapping keys later samples
   * lower (at its own trace time), below events converted by the earlier breakpoints: samples
   * keyed below cover_ts show at least cover_ns. */
  int64_t cover_ts, cover_ns;
  bool unplaced_warned; /* a guest with data and no clock exchange: said once */
} out_host;

typedef struct out_event {
  uint64_t ts;
  enum tr_trace_writer_event event;
  uint32_t value; /* the buffer of TR_TW_BUFFER_CLONED */
} out_event;

typedef struct out_host_mark {
  uint64_t ts;
  const tr_host *host;
  enum tr_host_mark_kind kind;
} out_host_mark;

/* Read position of one pass. */
typedef struct out_reader {
  bool active;
  bool final;
  int phase;
  tr_packet_list svc; /* service packets of this pass */
  size_t next_svc;
  size_t buffer;
  size_t host;
  bool stats_written; /* the tail's TraceStats, made once every other packet went by */
} out_reader;

struct tr_trace_output {
  tr_trace_output_params p;
  size_t num_buffers;
  tr_tbuf_seqids *seqids;
  int64_t uuid_msb, uuid_lsb;
  struct tr_clock_snapshot start_clocks;
  out_host *hosts;
  size_t num_hosts;
  out_event events[TR_TRACE_OUTPUT_MAX_EVENTS]; /* not yet written to the trace */
  size_t num_events;
  out_host_mark host_marks[TR_TRACE_OUTPUT_MAX_HOST_MARKS]; /* likewise */
  size_t num_host_marks;
  tr_trace_writer_buf triggers[TR_TRACE_OUTPUT_MAX_TRIGGERS]; /* packets, likewise */
  size_t num_triggers;
  bool withheld; /* tr_trace_output_withhold */
  bool first_read_done;
  bool stopped;
  tr_trace_writer_buf head_extra; /* for the first pass's head (a clone's trigger); owned */
  out_reader reader;
  tr_packet_list clock_journal;   /* clock packets exported since the last pass (clock_timer) */
  uint64_t clock_journal_thinned; /* times it was thinned */
  tr_timeline_out *timeline;
  tr_trace_file *file; /* write_into_file, else NULL (and once its final pass is written) */
  bool final_pass_begun;
  /* trace_filter: the session config's filter (NULL: none), its output (the packet last
   * yielded), and what it took out of each buffer's packets (TraceStats.filter_stats). */
  tr_trace_filter *filter;
  uint8_t *filtered;
  size_t filtered_cap;
  uint64_t *filter_discarded; /* [num_buffers] */
  size_t filter_buffers_seen;  /* 1 + the highest buffer index filtered, as traced counts */
  uint64_t filter_bypassed_packets, filter_bypassed_bytes; /* the TraceStats packets */
  bool flushing_for_write; /* flush_before_write asked, tr_trace_output_write_now not yet */
  uv_timer_t write_timer, clock_timer;
  unsigned timers_open;
};

static void free_svc(out_reader *r) {
  tr_packet_list_free(&r->svc);
  r->next_svc = 0;
}

void tr_trace_output_reset(tr_trace_output *o) {
  free_svc(&o->reader);
  memset(&o->reader, 0, sizeof o->reader);
}

/* Appends a packet the writer made (rc 0) into reserved room. */
static int push(tr_packet_list *l, int rc, tr_trace_writer_buf *b) {
  if (rc != 0)
    return rc;
  tr_packet_list_push(l, *b);
  return 0;
}

/* The session's first entry of entry index's host: a restarted agent's entries share it. */
static size_t first_entry(const tr_trace_output *o, size_t index) {
  return o->hosts[index].first;
}

static bool host_listed_before(const tr_trace_output *o, size_t index) {
  return first_entry(o, index) != index;
}

/* The entry that speaks for a host: the newest one (a restarted agent's). */
static bool newest_entry(const tr_trace_output *o, size_t index) {
  return !o->hosts[index].superseded;
}

static int64_t start_ns(const tr_trace_output *o) {
  return (int64_t)o->start_clocks.clocks[0].ts_ns; /* BOOTTIME comes first */
}

bool tr_trace_output_host_anchored(const tr_trace_output *o, size_t index) {
  return o->p.timeline != TR_TIMELINE_MACHINES || o->hosts[first_entry(o, index)].clock_anchored;
}

/* The host's clock anchor, once: at the last exchange written, or, in the final pass of a host
 * that never had one, at the session's start (trace_processor then assumes the two BOOTTIMEs
 * aligned, for this host alone). Pinned: the clock journal's thinning must not drop it. */
static int add_clock_anchor(tr_trace_output *o, out_host *sh, tr_packet_list *out, bool final) {
  int64_t at = sh->clock_sync_last.update_remote;
  tr_trace_writer_buf p;
  int rc;
  if (sh->clock_anchored || (at <= 0 && !final))
    return 0;
  if (at <= 0)
    at = start_ns(o);
  if ((rc = tr_packet_list_reserve(out, 1)) != 0 ||
      (rc = tr_trace_writer_clock_anchor(o->p.uid, sh->host->machine_id, (uint64_t)at, &p)) != 0)
    return rc;
  tr_packet_list_push_pinned(out, p);
  sh->clock_anchored = true;
  return 0;
}

static int add_events(tr_trace_output *o, tr_packet_list *out) {
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = o->p.cfg->builtin_data_sources;
  int rc = 0;
  if (b && b->disable_service_events) {
    o->num_events = 0;
    return 0;
  }
  if ((rc = tr_packet_list_reserve(out, o->num_events)) != 0)
    return rc;
  for (size_t i = 0; i < o->num_events && rc == 0; i++) {
    tr_trace_writer_buf p;
    const out_event *e = &o->events[i];
    rc = push(out,
              e->event == TR_TW_BUFFER_CLONED
                  ? tr_trace_writer_buffer_cloned(o->p.uid, e->ts, e->value, &p)
                  : tr_trace_writer_service_event(o->p.uid, e->ts, e->event, &p),
              &p);
  }
  o->num_events = 0;
  return rc;
}

void tr_trace_output_add_event(tr_trace_output *o, enum tr_trace_writer_event ev) {
  tr_trace_output_add_event_at(o, tr_clock_boottime_ns(), ev, 0);
}

void tr_trace_output_add_event_at(tr_trace_output *o, uint64_t ts, enum tr_trace_writer_event ev,
                                  uint32_t value) {
  bool repeats = ev == TR_TW_FLUSH_STARTED || ev == TR_TW_ALL_DATA_SOURCES_FLUSHED;
  size_t i = o->num_events;
  if (o->num_events == TR_TRACE_OUTPUT_MAX_EVENTS ||
      (repeats && o->num_events >= TR_TRACE_OUTPUT_MAX_EVENTS / 2))
    return;
  for (; i > 0 && o->events[i - 1].ts > ts; i--)
    o->events[i] = o->events[i - 1];
  o->events[i] = (out_event){.ts = ts, .event = ev, .value = value};
  o->num_events++;
}

int tr_trace_output_add_trigger(tr_trace_output *o, uint64_t boottime_ns,
                                const struct tr_trace_writer_trigger *t) {
  if (o->num_triggers == TR_TRACE_OUTPUT_MAX_TRIGGERS) {
    TR_WARN(COMP, "session %llu: %u triggers since the last read; trigger \"%s\" is in the log "
            "only", (unsigned long long)o->p.session_id, TR_TRACE_OUTPUT_MAX_TRIGGERS,
            t->trigger_name);
    return TR_ERR_FULL;
  }
  int rc = tr_trace_writer_trigger(o->p.uid, boottime_ns, t, &o->triggers[o->num_triggers]);
  if (rc == 0)
    o->num_triggers++;
  return rc;
}

/* traced's place for them: after the trace config, and like it not with disable_trace_config. */
static int add_triggers(tr_trace_output *o, tr_packet_list *out) {
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = o->p.cfg->builtin_data_sources;
  int rc = 0;
  if (!(b && b->disable_trace_config) && (rc = tr_packet_list_reserve(out, o->num_triggers)) == 0)
    for (size_t i = 0; i < o->num_triggers; i++) {
      tr_packet_list_push(out, o->triggers[i]);
      o->triggers[i] = (tr_trace_writer_buf){0};
    }
  for (size_t i = 0; i < o->num_triggers; i++)
    tr_trace_writer_buf_free(&o->triggers[i]);
  o->num_triggers = 0;
  return rc;
}

void tr_trace_output_withhold(tr_trace_output *o, bool withheld) { o->withheld = withheld; }

void tr_trace_output_add_host_mark(tr_trace_output *o, const tr_host *host,
                                   enum tr_host_mark_kind kind) {
  if (o->num_host_marks == TR_TRACE_OUTPUT_MAX_HOST_MARKS) {
    TR_WARN(COMP, "session %llu: too many host link changes since the last read; the one of "
            "%s is in the stats only", (unsigned long long)o->p.session_id, host->name);
    return;
  }
  o->host_marks[o->num_host_marks++] =
      (out_host_mark){.ts = tr_clock_boottime_ns(), .host = host, .kind = kind};
}

/* ---- the clock error bound tracks (docs/querying.md) ----
 * Per host, a counter of how far the trace may place the host's events from their true
 * instants: the estimator's bound on its mapping M (relay/clock/clocksync.h), plus how far
 * trace_processor's conversion in this encoding may stray from M: the breakpoints' tolerance
 * in `global-clocks`; in `machines`, |h + edge offset - M(h)| for the newest two edges (near
 * an edge, which one trace_processor takes depends on the reading it keys the edge by). The
 * bound is evaluated in steps of host time (an eighth of the probes' spacing, 2 to 50 ms), as
 * the larger of the step's two ends and of any knot of the estimator inside it: between knots
 * both the estimator's bound and the encoding's error are linear or convex in h, so that is
 * their maximum over the step,
 * and written where it rises or falls below 4/5 of the last value written, so the value shown
 * is never below the bound over the step. Cost O(host time / step * log knots): for 1,000
 * hosts whose clocks keep time (probed once a second) 20 steps per host and second, where a
 * fixed 2 ms step took 500 (the largest share of the service's CPU in a session). */

static int add_bound_tracks(const tr_trace_output *o, out_host *sh, tr_packet_list *out) {
  tr_trace_writer_buf host, bound;
  int rc;
  if (sh->bound_tracks_written)
    return 0;
  if ((rc = tr_packet_list_reserve(out, 2)) != 0 ||
      (rc = tr_trace_writer_host_tracks(o->p.uid, sh->host->name, &host, &bound)) != 0)
    return rc;
  tr_packet_list_push_pinned(out, host); /* the journal's thinning must keep them */
  tr_packet_list_push_pinned(out, bound);
  sh->bound_tracks_written = true;
  return 0;
}

static int64_t encoding_error(const tr_trace_output *o, const out_host *sh, int64_t h,
                              int64_t m) {
  int64_t worst = 0;
  if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS)
    return TR_TIMELINE_TOLERANCE_NS + 2;
  for (int i = 0; i < sh->bound_edges; i++) {
    int64_t e = llabs(h + sh->bound_edge_offset[i] - m);
    worst = e > worst ? e : worst;
  }
  return worst + 2; /* trace_processor's integer halves */
}

/* The estimator's bound at host time h (-1 when it has none), with *service_ts = M(h) and
 * *shown = that bound plus this encoding's own error. */
static int64_t bound_at(const tr_trace_output *o, const out_host *sh, int64_t h,
                        int64_t *service_ts, int64_t *shown) {
  int64_t b = tr_clocksync_error_bound(sh->host->clock, h);
  if (b < 0 || tr_clocksync_map(sh->host->clock, h, service_ts) != 0)
    return -1;
  *shown = b + encoding_error(o, sh, h, *service_ts);
  return b;
}

/* b rounded up onto a grid of a power of two times BOUND_QUANTUM_NS between 1/64 and 1/32 of
 * it: at most 3.2 % above, and a bound creeping up by a host's drift between two probes leaves
 * its grid cell, and so gets a sample, a few times a second rather than at every step (with a
 * 0.1 us grid a host probed once a second wrote a sample every 50 ms: 200,000 a second at
 * 10,000 hosts). Rounding up keeps the track an upper bound, and monotonic in b. */
static int64_t bound_on_grid(int64_t b) {
  int64_t q = BOUND_QUANTUM_NS;
  while (q * 64 < b)
    q *= 2;
  return (b + q - 1) / q * q;
}

/* Samples over host times [sh->bound_from, to). */
static int add_bound_samples(const tr_trace_output *o, out_host *sh, tr_packet_list *out,
                             int64_t to) {
  /* A step's end is the next step's start: its bound is taken once. */
  int64_t prev_end = -1, prev_est = -1, prev_ts = 0, prev_b = 0;
  for (int64_t end; sh->bound_from < to; sh->bound_from = end) {
    int64_t h = sh->bound_from;
    int64_t step = tr_clocksync_knot_gap(sh->host->clock, h) / 8;
    step = step < BOUND_STEP_MIN_NS ? BOUND_STEP_MIN_NS
           : step > BOUND_STEP_MAX_NS ? BOUND_STEP_MAX_NS : step;
    end = h + step < to ? h + step : to; /* the next call goes on from `to` */
    int64_t ts = prev_ts, ts_end = 0, b = prev_b, b_end = 0;
    int64_t est = h == prev_end ? prev_est : bound_at(o, sh, h, &ts, &b);
    int64_t est_end = bound_at(o, sh, end, &ts_end, &b_end);
    prev_end = end;
    prev_est = est_end;
    prev_ts = ts_end;
    prev_b = b_end;
    tr_trace_writer_buf p;
    int rc;
    if (est < 0 || est_end < 0 || ts < 0)
      continue;
    b = b_end > b ? b_end : b;
    if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS) /* breakpoints left out there */
      b += tr_timeline_output_held_excess(o->timeline, (size_t)(sh - o->hosts), h, end);
    /* A knot inside the step can peak above both ends: its excess over the ends' estimator
     * bound is added (the encoding's share is the ends'). */
    int64_t knot = tr_clocksync_knot_bound_max(sh->host->clock, h, end);
    est = est_end > est ? est_end : est;
    if (knot > est)
      b += knot - est;
    if (ts < sh->cover_ts && b < sh->cover_ns)
      b = sh->cover_ns;
    b = bound_on_grid(b);
    if (sh->bound_last_ns && b <= sh->bound_last_ns && b * 5 >= sh->bound_last_ns * 4)
      continue;
    if ((rc = add_bound_tracks(o, sh, out)) != 0 || (rc = tr_packet_list_reserve(out, 1)) != 0 ||
        (rc = tr_trace_writer_counter(o->p.uid, (uint64_t)ts,
                                      tr_trace_writer_bound_track_uuid(sh->host->name),
                                      (double)b / 1000.0, &p)) != 0)
      return rc;
    /* Pinned: a sample is written only where the bound changes, so the journal's thinning
     * dropping one would show the one before for longer (the first: events before the track,
     * in a 12 s global-clocks trace whose journal was thinned). */
    tr_packet_list_push_pinned(out, p);
    sh->bound_last_ns = b;
  }
  return 0;
}

/* machines: a remote_clock_sync edge was written. Host times before the first edge convert by
 * it (trace_processor's rule), so the samples wait for it; later ones run up to the new edge
 * with the edges before it. */
static int bound_edge_written(const tr_trace_output *o, out_host *sh, tr_packet_list *out,
                              const struct tr_clocksync_sync_pair *pair) {
  int64_t offset = (pair->ping_service + pair->update_service) / 2 - pair->update_remote;
  int rc = sh->bound_edges ? add_bound_samples(o, sh, out, pair->ping_remote) : 0;
  sh->bound_edge_offset[1] = sh->bound_edge_offset[0];
  sh->bound_edge_offset[0] = offset;
  if (sh->bound_edges < 2)
    sh->bound_edges++;
  return rc;
}

/* The samples of every host up to its estimator's frontier (what later probes do not revise);
 * final: on to the host's present, where data stamped after the last probe is converted. In
 * `global-clocks`, up to where the mapping was just exported (from the same estimator state,
 * so past the frontier the samples bound the plan the trace converts by: bounding the mapping
 * that later probes made there instead fell 1% short of a saturated host's true error, its
 * plan having run 2 s past the frontier). */
static int add_bounds(tr_trace_output *o, tr_packet_list *out, bool final) {
  for (size_t h = 0; h < o->num_hosts; h++) {
    out_host *sh = &o->hosts[h];
    int64_t frontier, to;
    int rc;
    if (host_listed_before(o, h) || !sh->host->clock ||
        (frontier = tr_clocksync_frontier(sh->host->clock)) < 0)
      continue;
    if (!sh->bound_started) {
      sh->bound_from = start_ns(o) - tr_clocksync_offset_ns(sh->host->clock);
      sh->bound_from = sh->bound_from < 0 ? 0 : sh->bound_from;
      sh->bound_started = true;
    }
    if (o->p.timeline == TR_TIMELINE_MACHINES && sh->bound_edges == 0)
      continue;
    if (final) {
      int64_t now = (int64_t)tr_clock_boottime_ns() - tr_clocksync_offset_ns(sh->host->clock);
      frontier = now > frontier ? now : frontier;
    }
    to = frontier + 1;
    if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS &&
        (to = tr_timeline_output_exported_to(o->timeline, h)) < 0)
      continue;
    if ((rc = add_bound_samples(o, sh, out, to)) != 0)
      return rc;
    if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS) {
      sh->cover_ts = tr_timeline_output_reach(o->timeline, h, sh->bound_from);
      sh->cover_ns = sh->bound_last_ns;
    }
  }
  return 0;
}

/* The points of the host's edge series on the way to M's point bp (tr_clocksync_steps_next),
 * none with its PING at or below host time floor, each as a remote_clock_sync edge. */
static int add_edges(tr_trace_output *o, out_host *sh, tr_packet_list *out,
                     const struct tr_clocksync_breakpoint *bp, int64_t floor) {
  struct tr_clocksync_breakpoint pt;
  while (tr_clocksync_steps_next(&sh->clock_steps, sh->host->clock, bp, floor + 3, &pt) > 0) {
    struct tr_clocksync_sync_pair pair;
    tr_trace_writer_buf p;
    int rc;
    if (pt.service_ts < 3)
      continue;
    if ((rc = tr_packet_list_reserve(out, 1)) != 0) /* bound samples go in between */
      return rc;
    tr_clocksync_pair_from_breakpoint(&pt, &pair);
    if ((rc = push(out, tr_trace_writer_remote_clock_sync(o->p.uid, sh->host->machine_id, &pair,
                                                          &p),
                   &p)) != 0 ||
        (rc = bound_edge_written(o, sh, out, &pair)) != 0)
      return rc;
    sh->clock_sync_last = pair;
  }
  return 0;
}

/* machines: the estimator's mapping at host time `at` as an edge (its PING at `at`, or the
 * series' steps towards it): the trace's only mapping there, converted by trace_processor
 * within the bound the track then shows. */
static int add_mapped_edge(tr_trace_output *o, out_host *sh, tr_packet_list *out, int64_t at) {
  struct tr_clocksync_breakpoint bp = {.host_ts = at + 3};
  if (!sh->clock_sync_started || tr_clocksync_map(sh->host->clock, bp.host_ts, &bp.service_ts) != 0)
    return 0;
  return add_edges(o, sh, out, &bp, at - 1);
}

/* A guest machine whose traced_relay made no clock exchange (SyncClock: Perfetto's relay has
 * RelayPort only from v48) has no mapping: its data stays in the trace, unplaced (inspect counts
 * it unresolved). Said once per session, at the final pass, if the guest sent data. */
static void warn_unplaced_guest(tr_trace_output *o, out_host *sh) {
  bool data = false;
  if (!sh->host->guest_of || sh->unplaced_warned)
    return;
  for (size_t b = 0; b < o->num_buffers && !data; b++)
    data = sh->tbufs[b] != NULL;
  if (!data)
    return;
  sh->unplaced_warned = true;
  TR_WARN(COMP,
          "session %llu: guest machine %s sent data but its traced_relay made no clock exchange "
          "(SyncClock; Perfetto's traced_relay has it from v48): its timestamps have no place on "
          "the timeline and stay as the guest wrote them (tracerelay inspect counts them "
          "unresolved); upgrade that traced_relay",
          (unsigned long long)o->p.session_id, sh->host->name);
}

/* remote_clock_sync packets (machines timeline): each host's mapping M since the session
 * started (trace_processor converts data stamped before the first edge by it) as edges, one
 * per remote_clock_sync packet, placed as global-clocks places its breakpoints
 * (tr_clocksync_export_steps, tr_clocksync_steps_next): trace_processor's constant offset
 * from one edge to the next stays within TR_TIMELINE_TOLERANCE_NS of M and never steps back
 * by more than TR_TIMELINE_STEP_NS. Real exchanges as edges (until issue 41) carried each
 * one's noise and asymmetry into its offset, so the offset stepped back by microseconds at
 * edges 5 ms apart even on a host running slow, and events of a sequence closer than that
 * swapped. A non-final pass stops at the estimator's frontier (what it will not revise); the
 * final one goes on to the host's present. No edge at or below host time a pass covered
 * (read_horizon, bound_from). */
static int add_clock_syncs(tr_trace_output *o, tr_packet_list *out, bool final) {
  struct tr_clocksync_breakpoint bp[SYNC_MAX_PER_PASS];
  for (size_t h = 0; h < o->num_hosts; h++) {
    out_host *sh = &o->hosts[h];
    const struct tr_clocksync *clock = sh->host->clock;
    int64_t to, floor;
    int n, rc;
    if (host_listed_before(o, h))
      continue;
    if (!clock) {
      if (final)
        warn_unplaced_guest(o, sh);
      if ((rc = add_clock_anchor(o, sh, out, true)) != 0) /* no exchange will ever come */
        return rc;
      continue;
    }
    to = tr_clocksync_frontier(clock);
    if (final && to < 0)
      warn_unplaced_guest(o, sh);
    if (final && to >= 0) {
      int64_t now = (int64_t)tr_clock_boottime_ns() - tr_clocksync_offset_ns(clock);
      to = now > to ? now : to;
    }
    if (!sh->clock_sync_started && to >= 0) {
      /* From the session's start on: the mapping from before it would be the edge for the
       * first data until the first edge of the session. */
      sh->clock_sync_from = start_ns(o) - tr_clocksync_offset_ns(clock);
      if (sh->clock_sync_from < 0)
        sh->clock_sync_from = 0;
      sh->clock_sync_started = true;
      sh->clock_steps.step_ns = TR_TIMELINE_STEP_NS;
      sh->bound_from = sh->clock_sync_from;
      sh->bound_started = true;
      /* the first edge's PING there (tr_clocksync_pair_from_breakpoint) */
      sh->clock_sync_from += 3;
    }
    to = to < SYNC_HOST_MAX ? to : SYNC_HOST_MAX;
    /* In slices of SYNC_MAX_PER_PASS: a session read only at its end has them all at once. */
    for (int64_t step = SYNC_SLICE_NS; sh->clock_sync_started && sh->clock_sync_from <= to;) {
      int64_t end = sh->clock_sync_from + step - 1 < to ? sh->clock_sync_from + step - 1 : to;
      floor = sh->bound_from - 1 > sh->read_horizon ? sh->bound_from - 1 : sh->read_horizon;
      n = tr_clocksync_export_steps(clock, sh->clock_sync_from, end, TR_TIMELINE_TOLERANCE_NS,
                                    TR_TIMELINE_STEP_NS, bp, SYNC_MAX_PER_PASS);
      if (n == TR_ERR_FULL && step > 1000) {
        step /= 2;
        continue;
      }
      if (n < 0)
        break;
      for (int i = 0; i < n; i++)
        if ((rc = add_edges(o, sh, out, &bp[i], floor)) != 0)
          return rc;
      sh->clock_sync_from = end + 1;
    }
    /* Data a pass wrote past the last edge (the frontier lags the present behind a saturated
     * link) was converted by that edge's offset: the edges below it can no longer come (the
     * floor above), so the data after it gets the mapping there (its plan past the frontier). */
    if (sh->bound_edges > 0 && sh->clock_sync_last.update_remote < sh->read_horizon &&
        (rc = add_mapped_edge(o, sh, out, sh->read_horizon + 1)) != 0)
      return rc;
    if ((rc = add_clock_anchor(o, sh, out, final)) != 0)
      return rc;
  }
  return 0;
}

/* The hosts' link changes since the last pass, as instants on the service's track and on the
 * host's own track (its descriptors written again before them: cheap, and marks are rare). */
static int add_host_marks(tr_trace_output *o, tr_packet_list *out) {
  static const char *const what[] = {"disconnected", "reconnected", "agent restarted"};
  tr_trace_writer_buf p, host, bound;
  int32_t uid = o->p.uid;
  int rc = 0;
  if (o->num_host_marks == 0)
    return 0;
  if ((rc = tr_packet_list_reserve(out, 1 + 4 * o->num_host_marks)) != 0)
    return rc;
  rc = push(out, tr_trace_writer_service_track(uid, &p), &p);
  for (size_t i = 0; i < o->num_host_marks && rc == 0; i++) {
    const out_host_mark *m = &o->host_marks[i];
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
  o->num_host_marks = 0;
  return rc;
}

/* In global-clocks the cross-host snapshots, then the host clock snapshots of each host's
 * newest entry, once anchored; before the host data. */
static int add_timeline(tr_trace_output *o, tr_packet_list *out, bool final) {
  for (size_t h = 0; h < o->num_hosts; h++) {
    const tr_host *host = o->hosts[h].host;
    int rc;
    if (!newest_entry(o, h))
      continue;
    /* The export goes on from the host's first entry's state, which its bounds follow. */
    if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS &&
        (rc = tr_timeline_output_cross_host(o->timeline, first_entry(o, h), host, out,
                                            final)) < 0)
      return rc;
    if (tr_trace_output_host_anchored(o, h) &&
        (rc = tr_timeline_output_host_snapshots(o->timeline, h, host, out)) < 0)
      return rc;
  }
  return 0;
}

/* The clock packets up to the hosts' present (final: all of them). */
static int add_clocks(tr_trace_output *o, tr_packet_list *out, bool final) {
  int rc;
  if (o->p.timeline == TR_TIMELINE_MACHINES) {
    rc = add_clock_syncs(o, out, final);
    rc = rc ? rc : add_bounds(o, out, final);
    return rc ? rc : add_timeline(o, out, final);
  }
  rc = add_timeline(o, out, final); /* the bounds follow what it exported */
  return rc ? rc : add_bounds(o, out, final);
}

int tr_trace_output_journal_clocks(tr_trace_output *o) {
  int rc = add_clocks(o, &o->clock_journal, false);
  size_t cap = TR_CLOCK_JOURNAL_PER_HOST * (o->num_hosts ? o->num_hosts : 1);
  if (o->clock_journal.n > cap) {
    tr_packet_list_thin(&o->clock_journal);
    if (!o->clock_journal_thinned++)
      TR_WARN(COMP, "session %llu: unread for long: the clock journal passed %zu packets, its "
              "older half is thinned (the timeline there is less exact)",
              (unsigned long long)o->p.session_id, cap);
  }
  return rc;
}

/* The first pass's head: clocks, marker, config, uuid, system infos; then pending events, the
 * clock journal and the clocks since. */
static int build_head(tr_trace_output *o) {
  out_reader *r = &o->reader;
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = o->p.cfg->builtin_data_sources;
  int32_t uid = o->p.uid;
  tr_trace_writer_buf p;
  int rc = tr_packet_list_reserve(&r->svc, 9 + o->num_hosts);

  if (rc == 0 && !o->first_read_done) {
    struct tr_clock_snapshot now;
    if (!(b && b->disable_clock_snapshotting)) {
      rc = rc ? rc : push(&r->svc, tr_trace_writer_clock_snapshot(uid, &o->start_clocks, &p), &p);
      if (tr_clock_snapshot(&now) == 0)
        rc = rc ? rc : push(&r->svc, tr_trace_writer_clock_snapshot(uid, &now, &p), &p);
    }
    rc = rc ? rc : push(&r->svc, tr_trace_writer_sync_marker(uid, tr_clock_boottime_ns(), &p), &p);
    if (!(b && b->disable_trace_config))
      rc = rc ? rc : push(&r->svc, tr_trace_writer_trace_config(uid, o->p.cfg, &p), &p);
    rc = rc ? rc
            : push(&r->svc, tr_trace_writer_trace_uuid(uid, o->uuid_msb, o->uuid_lsb, &p), &p);
    if (rc == 0 && o->head_extra.data) { /* room: the reserve above counts it */
      tr_packet_list_push(&r->svc, o->head_extra);
      o->head_extra = (tr_trace_writer_buf){0};
    }
    if (!(b && b->disable_system_info)) {
      rc = rc ? rc : push(&r->svc, tr_trace_writer_system_info(uid, o->p.system_info, 0, &p), &p);
      for (size_t h = 0; h < o->num_hosts && rc == 0; h++) {
        const tr_host *host = o->hosts[h].host;
        uint32_t mid = o->p.timeline == TR_TIMELINE_MACHINES ? host->machine_id : 0;
        if (!host->system_info || host_listed_before(o, h))
          continue;
        rc = push(&r->svc, tr_trace_writer_system_info(uid, host->system_info, mid, &p), &p);
      }
    }
    o->first_read_done = true;
  }
  if (rc == 0)
    rc = add_triggers(o, &r->svc);
  /* traced's order: lifecycle events, then remote_clock_sync. */
  if (rc == 0)
    rc = add_events(o, &r->svc);
  if (rc == 0)
    rc = add_host_marks(o, &r->svc);
  if (rc == 0 && (rc = tr_packet_list_reserve(&r->svc, o->clock_journal.n)) == 0) {
    for (size_t i = 0; i < o->clock_journal.n; i++)
      tr_packet_list_push(&r->svc, o->clock_journal.items[i]);
    o->clock_journal.n = 0; /* the bytes moved to the pass */
  }
  return rc ? rc : add_clocks(o, &r->svc, r->final);
}

/* The host time of the service's present plus the error bound there: the host stamped no data
 * that a pass has read by now any later (its clock's mapping inverted by two Newton steps). */
static int64_t host_present(const struct tr_clocksync *clock) {
  int64_t now = (int64_t)tr_clock_boottime_ns(), h = now - tr_clocksync_offset_ns(clock), s;
  for (int i = 0; i < 2 && tr_clocksync_map(clock, h, &s) == 0; i++)
    h -= s - now;
  int64_t bound = tr_clocksync_error_bound(clock, h);
  return bound > 0 ? h + bound : h;
}

/* machines, once a pass has read the buffers: how far each host's data it read reaches. */
static void note_read_horizons(tr_trace_output *o) {
  for (size_t h = 0; h < o->num_hosts && o->p.timeline == TR_TIMELINE_MACHINES; h++) {
    out_host *first = &o->hosts[first_entry(o, h)];
    if (!o->hosts[h].host->clock || tr_clocksync_frontier(o->hosts[h].host->clock) < 0 ||
        !(o->reader.final || tr_trace_output_host_anchored(o, h)))
      continue;
    int64_t horizon = host_present(o->hosts[h].host->clock);
    if (horizon > first->read_horizon)
      first->read_horizon = horizon;
  }
}

/* The final pass: its data can reach past the clocks its head wrote (data that arrived while it
 * was read, as a reconnecting agent's backlog), converted by the last edge or breakpoint. Too
 * late for clock data (it would come after that data, which trace_processor has converted):
 * the bound tracks are extended to the hosts' present instead, with that conversion's error. */
static int bound_final_reach(tr_trace_output *o, tr_packet_list *out) {
  for (size_t h = 0; h < o->num_hosts; h++) {
    out_host *sh = &o->hosts[h];
    int rc;
    if (host_listed_before(o, h) || !sh->host->clock || !sh->bound_started ||
        tr_clocksync_frontier(sh->host->clock) < 0 ||
        (o->p.timeline == TR_TIMELINE_MACHINES && sh->bound_edges == 0))
      continue;
    int64_t to = host_present(sh->host->clock) + 1;
    if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS &&
        (rc = tr_timeline_output_hold_to(o->timeline, h, sh->host, to)) != 0)
      return rc;
    if ((rc = add_bound_samples(o, sh, out, to)) != 0)
      return rc;
  }
  return 0;
}

static int build_tail(tr_trace_output *o) {
  out_reader *r = &o->reader;
  int rc;

  note_read_horizons(o);
  free_svc(r);
  if (r->final && (rc = bound_final_reach(o, &r->svc)) != 0)
    return rc;
  tr_trace_output_add_event(o, TR_TW_READ_TRACING_BUFFERS_COMPLETED);
  /* room for TraceStats, made by tail_stats once the rest of the pass was filtered */
  return (rc = add_events(o, &r->svc)) != 0 ? rc : tr_packet_list_reserve(&r->svc, 1);
}

/* The pass's last packet: the session's TraceStats, now that every other packet of the pass
 * went through the filter; like traced, it bypasses the filter itself, and is counted in the
 * filter's input and output after its stats were taken. */
static int tail_stats(tr_trace_output *o, tr_output_packet *out) {
  out_reader *r = &o->reader;
  tr_trace_writer_buf p;
  int rc = o->p.trace_stats(o->p.ud, tr_clock_boottime_ns(), &p);
  if (rc != 0)
    return rc;
  tr_packet_list_push(&r->svc, p);
  r->next_svc = r->svc.n;
  r->stats_written = true;
  if (o->filter) {
    o->filter_bypassed_packets++;
    o->filter_bypassed_bytes += p.len;
  }
  out->data = p.data;
  out->len = p.len;
  out->trusted_len = 0;
  return 1;
}

int tr_trace_output_begin(tr_trace_output *o) {
  int rc;
  tr_trace_output_reset(o);
  if (o->withheld)
    return 0; /* an inactive reader: no packet */
  o->reader.active = true;
  o->reader.final = o->stopped;
  o->reader.phase = PHASE_HEAD;
  if ((rc = build_head(o)) != 0)
    tr_trace_output_reset(o);
  return rc;
}

static int next_buffer_packet(tr_trace_output *o, tr_output_packet *out) {
  out_reader *r = &o->reader;
  for (; r->buffer < o->num_buffers; r->buffer++, r->host = 0) {
    for (; r->host < o->num_hosts; r->host++) {
      out_host *sh = &o->hosts[r->host];
      tr_tbuf *b = sh->tbufs[r->buffer];
      tr_tbuf_packet pkt;
      tr_tbuf_trusted t;
      int rc;
      if (!b || (!r->final && !tr_trace_output_host_anchored(o, r->host)))
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
      t.machine_id = o->p.timeline == TR_TIMELINE_MACHINES ? sh->host->machine_id : 0;
      rc = tr_tbuf_seqids_get(o->seqids, (uint32_t)r->host, pkt.producer_id, pkt.writer_id,
                              &t.sequence_id);
      if (rc < 0)
        return rc;
      if (o->p.timeline == TR_TIMELINE_GLOBAL_CLOCKS) {
        rc = tr_timeline_output_packet(o->timeline, r->host, sh->host, pkt.data, pkt.len, &t, out);
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

static int next_unfiltered(tr_trace_output *o, tr_output_packet *out) {
  out_reader *r = &o->reader;
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
        if (!r->stats_written)
          return tail_stats(o, out);
        r->phase = PHASE_DONE;
        break;
      }
      r->phase = PHASE_BUFFERS;
      break;
    case PHASE_BUFFERS:
      if (tr_timeline_output_pending(o->timeline, out))
        return 1; /* a rewritten packet behind its ftrace anchor */
      do
        rc = next_buffer_packet(o, out);
      while (rc == 2);
      if (rc != 0)
        return rc;
      if ((rc = build_tail(o)) != 0)
        return rc;
      r->phase = PHASE_TAIL;
      break;
    default:
      r->active = false;
      return 0;
    }
  }
}

/* Replaces the packet with what the session's trace_filter keeps of it (data and trusted
 * slice as one message); a packet the filter cannot parse becomes an empty one, counted in
 * its errors, as traced does: a filtered packet is never removed. */
static int filter_packet(tr_trace_output *o, tr_output_packet *out) {
  tr_trace_filter_slice s[2] = {{out->data, out->len}, {out->trusted, out->trusted_len}};
  size_t n = out->len + out->trusted_len, len;
  if (n > o->filtered_cap) {
    uint8_t *b = realloc(o->filtered, n);
    if (!b)
      return TR_ERR_NOMEM;
    o->filtered = b;
    o->filtered_cap = n;
  }
  int rc = tr_trace_filter_run(o->filter, s, 2, o->filtered, &len);
  if (rc == TR_ERR_NOMEM)
    return rc;
  if (rc == 0 && o->reader.phase == PHASE_BUFFERS) {
    size_t b = o->reader.buffer;
    o->filter_discarded[b] += n - len;
    if (b + 1 > o->filter_buffers_seen)
      o->filter_buffers_seen = b + 1;
  }
  out->data = o->filtered;
  out->len = rc == 0 ? len : 0;
  out->trusted_len = 0;
  return 1;
}

int tr_trace_output_next(tr_trace_output *o, tr_output_packet *out) {
  int rc = next_unfiltered(o, out);
  if (rc != 1 || !o->filter || (o->reader.phase == PHASE_TAIL && o->reader.stats_written &&
                                o->reader.next_svc == o->reader.svc.n))
    return rc;
  return filter_packet(o, out);
}

int tr_trace_output_check_filter(const Perfetto__Protos__TraceConfig *cfg, char *err,
                                 size_t err_len) {
  tr_trace_filter *f = NULL;
  int rc = cfg->trace_filter ? tr_trace_filter_from_config(cfg->trace_filter, &f, err, err_len)
                             : 0;
  tr_trace_filter_free(f);
  return rc;
}

bool tr_trace_output_filter_stats(const tr_trace_output *o, tr_trace_filter_stats *st,
                                  const uint64_t **discarded_per_buffer, size_t *n_buffers) {
  if (!o->filter)
    return false;
  tr_trace_filter_get_stats(o->filter, st);
  st->input_packets += o->filter_bypassed_packets;
  st->input_bytes += o->filter_bypassed_bytes;
  st->output_bytes += o->filter_bypassed_bytes;
  *discarded_per_buffer = o->filter_discarded;
  *n_buffers = o->filter_buffers_seen;
  return true;
}

/* ---- lifecycle ---- */

static void random_uuid(tr_trace_output *o) {
  uint64_t r[2] = {0, 0};
  if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
    r[0] = tr_clock_boottime_ns() ^ (uint64_t)getpid() << 32;
    r[1] = o->p.session_id * 0x9e3779b97f4a7c15ull;
  }
  o->uuid_msb = (int64_t)r[0];
  o->uuid_lsb = (int64_t)r[1];
}

static void choose_uuid(tr_trace_output *o) {
  const Perfetto__Protos__TraceConfig *c = o->p.cfg;
  if (c->trace_uuid_msb || c->trace_uuid_lsb) { /* the consumer's, as traced respects it */
    o->uuid_msb = c->trace_uuid_msb;
    o->uuid_lsb = c->trace_uuid_lsb;
    return;
  }
  random_uuid(o);
}

static void on_timer_closed(uv_handle_t *h) {
  tr_trace_output *o = h->data;
  if (--o->timers_open == 0)
    free(o);
}

static void init_timer(tr_trace_output *o, uv_timer_t *t) {
  uv_timer_init(o->p.loop, t);
  t->data = o;
  o->timers_open++;
}

static void close_file(tr_trace_output *o) {
  tr_trace_file_close(o->file);
  o->file = NULL;
}

int tr_trace_output_new(const tr_trace_output_params *p, int output_fd, tr_trace_output **out,
                        char *err, size_t err_len) {
  tr_trace_output *o = calloc(1, sizeof *o);
  int rc = TR_ERR_NOMEM;

  *out = NULL;
  if (!o)
    goto fail_fd;
  o->p = *p;
  o->num_buffers = p->cfg->n_buffers;
  rc = tr_trace_file_open(p->loop, p->cfg, p->session_id, output_fd, &o->file, err, err_len);
  output_fd = -1; /* taken */
  if (rc != 0)
    goto fail;
  if ((rc = tr_tbuf_seqids_new(TR_TRACE_OUTPUT_MAX_SEQUENCES, &o->seqids)) != 0)
    goto fail;
  /* from the session's copy of the config: a clone that cleared trace_filter gets none */
  if (p->cfg->trace_filter &&
      ((rc = tr_trace_filter_from_config(p->cfg->trace_filter, &o->filter, err, err_len)) != 0 ||
       !(o->filter_discarded = calloc(o->num_buffers ? o->num_buffers : 1, sizeof(uint64_t))))) {
    rc = rc ? rc : TR_ERR_NOMEM;
    goto fail;
  }
  choose_uuid(o);
  tr_clock_snapshot(&o->start_clocks);
  o->timeline = tr_timeline_output_new(p->timeline, p->uid, o->seqids, start_ns(o));
  if (!o->timeline) {
    rc = TR_ERR_NOMEM;
    goto fail;
  }
  init_timer(o, &o->write_timer);
  init_timer(o, &o->clock_timer);
  *out = o;
  return 0;
fail:
  tr_trace_file_close(o->file);
  tr_tbuf_seqids_free(o->seqids);
  tr_trace_filter_free(o->filter);
  free(o->filter_discarded);
  free(o);
fail_fd:
  if (output_fd >= 0)
    close(output_fd);
  return rc;
}

void tr_trace_output_free(tr_trace_output *o) {
  close_file(o);
  tr_trace_writer_buf_free(&o->head_extra);
  tr_trace_output_reset(o);
  tr_packet_list_free(&o->clock_journal);
  for (size_t i = 0; i < o->num_triggers; i++)
    tr_trace_writer_buf_free(&o->triggers[i]);
  tr_timeline_output_free(o->timeline);
  tr_tbuf_seqids_free(o->seqids);
  tr_trace_filter_free(o->filter);
  free(o->filtered);
  free(o->filter_discarded);
  free(o->hosts);
  uv_close((uv_handle_t *)&o->write_timer, on_timer_closed);
  uv_close((uv_handle_t *)&o->clock_timer, on_timer_closed);
}

int tr_trace_output_clone(const tr_trace_output *src, const tr_trace_output_params *p,
                          tr_trace_output **out) {
  char err[64];
  tr_trace_output *o;
  int rc = tr_trace_output_new(p, -1, &o, err, sizeof err);
  if (rc != 0)
    return rc;
  /* The clone's trace begins where its source's did: same start clocks, same session start
   * for the timeline, and traced's uuid rule (a new msb, the source's lsb). */
  o->start_clocks = src->start_clocks;
  random_uuid(o); /* a new msb even where the config named the source's uuid */
  o->uuid_lsb = src->uuid_lsb;
  tr_timeline_output_free(o->timeline);
  if (!(o->timeline = tr_timeline_output_new(p->timeline, p->uid, o->seqids, start_ns(o)))) {
    tr_trace_output_free(o);
    return TR_ERR_NOMEM;
  }
  memcpy(o->events, src->events, src->num_events * sizeof *src->events);
  o->num_events = src->num_events;
  memcpy(o->host_marks, src->host_marks, src->num_host_marks * sizeof *src->host_marks);
  o->num_host_marks = src->num_host_marks;
  o->stopped = true;
  *out = o;
  return 0;
}

void tr_trace_output_set_head_packet(tr_trace_output *o, tr_trace_writer_buf pkt) {
  tr_trace_writer_buf_free(&o->head_extra);
  o->head_extra = pkt;
}

void tr_trace_output_uuid(const tr_trace_output *o, int64_t *msb, int64_t *lsb) {
  *msb = o->uuid_msb;
  *lsb = o->uuid_lsb;
}

int tr_trace_output_add_host(tr_trace_output *o, const tr_host *host, tr_tbuf *const *tbufs) {
  out_host *n = realloc(o->hosts, (o->num_hosts + 1) * sizeof *n);
  if (!n)
    return TR_ERR_NOMEM;
  o->hosts = n;
  size_t first = o->num_hosts;
  for (size_t i = o->num_hosts; i-- > 0;) /* the host's newest entry so far, if it has one */
    if (o->hosts[i].host == host) {
      first = o->hosts[i].first;
      o->hosts[i].superseded = true;
      break;
    }
  n = &o->hosts[o->num_hosts];
  memset(n, 0, sizeof *n);
  n->host = host;
  n->tbufs = tbufs;
  n->first = first;
  o->num_hosts++;
  return 0;
}

static void on_clock_journal(uv_timer_t *t) {
  tr_trace_output *o = t->data;
  if (tr_trace_output_journal_clocks(o) != 0)
    TR_WARN(COMP, "session %llu: out of memory for the clock journal: the next read pass "
            "exports the clocks instead", (unsigned long long)o->p.session_id);
}

static int source_begin(void *ud) { return tr_trace_output_begin(ud); }
static int source_next(void *ud, tr_output_packet *out) { return tr_trace_output_next(ud, out); }
static void source_reset(void *ud) { tr_trace_output_reset(ud); }

/* Passes of o, for its file. */
static tr_trace_file_source file_source(tr_trace_output *o) {
  return (tr_trace_file_source){source_begin, source_next, source_reset, o};
}

static void on_final_pass_done(void *ud, int rc) {
  tr_trace_output *o = ud;
  (void)rc; /* logged; the session ends either way */
  if (o->file)
    tr_trace_file_sync(o->file); /* traced syncs its file at the end, whatever fflush_post_write */
  close_file(o);
  o->p.on_file_done(o->p.ud);
}

/* The file's last pass; false when it cannot begin (the file is full, or out of memory):
 * the file is closed then, nothing to wait for. */
static bool begin_final_pass(tr_trace_output *o) {
  o->final_pass_begun = true;
  tr_trace_file_source src = file_source(o);
  if (tr_trace_file_pass(o->file, &src, TR_TRACE_FILE_STEP_BYTES, on_final_pass_done, o) == 0)
    return true;
  close_file(o);
  return false;
}

static void on_period_pass_done(void *ud, int rc) {
  tr_trace_output *o = ud;
  if (o->stopped) { /* stopped while this pass was written: the final one follows */
    if (!begin_final_pass(o))
      o->p.on_file_done(o->p.ud);
  } else if (rc == TR_ERR_FULL) {
    o->p.on_file_full(o->p.ud);
  } else if (rc == 0 && o->p.sync_after_write && tr_trace_file_sync(o->file) != 0) {
    TR_WARN(COMP, "session %llu: cannot sync the trace file (fflush_post_write)",
            (unsigned long long)o->p.session_id);
  }
}

/* A period's pass, unless the last one is still being written (a slow disk, or buffers larger
 * than a period's worth of steps): then this period is skipped. */
static void write_pass(tr_trace_output *o) {
  tr_trace_file_source src = file_source(o);
  if (tr_trace_file_writing(o->file))
    return;
  if (tr_trace_file_pass(o->file, &src, TR_TRACE_FILE_STEP_BYTES, on_period_pass_done, o) ==
      TR_ERR_FULL)
    o->p.on_file_full(o->p.ud);
}

/* Likewise a period whose flush before the write (write_flush_mode) is still out. */
static void on_write_period(uv_timer_t *t) {
  tr_trace_output *o = t->data;
  if (o->flushing_for_write || tr_trace_file_writing(o->file))
    return;
  if (o->p.flush_before_write) {
    o->flushing_for_write = true;
    o->p.flush_before_write(o->p.ud);
    return;
  }
  write_pass(o);
}

void tr_trace_output_write_now(tr_trace_output *o) {
  o->flushing_for_write = false;
  if (!o->stopped && o->file)
    write_pass(o);
}

void tr_trace_output_start_journal(tr_trace_output *o) {
  uv_timer_start(&o->clock_timer, on_clock_journal, TR_CLOCK_JOURNAL_MS, TR_CLOCK_JOURNAL_MS);
}

void tr_trace_output_start_writes(tr_trace_output *o) {
  uint64_t period = o->p.cfg->file_write_period_ms ? o->p.cfg->file_write_period_ms
                                                   : TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS;
  if (o->file)
    uv_timer_start(&o->write_timer, on_write_period, period, period);
}

bool tr_trace_output_stop(tr_trace_output *o) {
  o->stopped = true;
  uv_timer_stop(&o->write_timer);
  uv_timer_stop(&o->clock_timer);
  if (!o->file)
    return false;
  if (tr_trace_file_writing(o->file))
    return true; /* on_period_pass_done begins the final pass */
  return begin_final_pass(o);
}

void tr_trace_output_finish_file(tr_trace_output *o) {
  if (!o->file)
    return;
  tr_trace_file_source src = file_source(o);
  tr_trace_file_complete_now(o->file);
  if (!o->final_pass_begun &&
      tr_trace_file_pass(o->file, &src, TR_TRACE_FILE_STEP_BYTES, NULL, NULL) == 0)
    tr_trace_file_complete_now(o->file);
  close_file(o);
}

uint64_t tr_trace_output_invalid_packets(const tr_trace_output *o) {
  return tr_timeline_output_invalid(o->timeline);
}
