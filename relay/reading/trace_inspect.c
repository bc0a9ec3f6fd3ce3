/* trace_inspect.c: the two passes of tracerelay's trace resolver (see trace_inspect.h).
 *
 * Pass 1 (collect) reads clock data into the clock graph and learns each sequence's clock domain
 * and the machines' names; between the passes sequences are grouped into hosts; pass 2 (resolve)
 * decodes per-sequence clock state again in file order and converts every timestamp. Snapshots
 * go to the graph as absolute values: this file, not the graph, decodes incremental clocks, so
 * that conversions can happen after every snapshot is known. */
#include "relay/reading/trace_inspect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/reading/clock_graph.h"
#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/trace/trace_writer.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

#define SEQ_CLOCK_FIRST 64
#define SEQ_CLOCK_END 128
#define FTRACE_SEQ_CLOCK 64          /* trace_processor's clock for GLOBAL/LOCAL ftrace */
#define SYNC_PAIR_NS 30000000000ull  /* exchanges paired by trace_processor (reference 7.5) */

struct seq_state {
  uint32_t machine, seq;
  bool state_lost; /* pass 2: a packet was lost and the incremental state not cleared since */
  uint32_t domain; /* first global id seen, then the host's BOOTTIME id after naming */
  uint32_t host;
  uint64_t packets;
  bool has_default;
  uint32_t default_clock;
  uint64_t incremental;   /* bit i: clock 64+i carries deltas */
  uint64_t has_base;      /* bit i: its last value is known */
  uint64_t *base;         /* 64 values, allocated at the first incremental snapshot */
};

struct name { /* one SystemInfo */
  uint32_t machine;
  bool explicit_name; /* machine_name, not utsname */
  bool used;          /* named a global-clocks host */
  char text[TR_INSPECT_NAME_MAX];
};

struct range { /* readings of one non-sequence clock of one machine */
  uint32_t machine, clock;
  uint64_t lo, hi;
};

/* TraceStats losses, collected in pass 1, given to hosts after it. The service writes a
 * TraceStats at the end of every read pass, each with its counters since the session began:
 * only the last one of a sequence counts (as trace_processor keeps the last), the earlier ones
 * only in trace_stats_packets. */
struct pending_stats {
  bool by_name;       /* from the per-host extension, else for the packet's sequence */
  size_t seq;         /* index in seqs of the TraceStats packet's sequence */
  uint64_t packet;    /* which TraceStats packet of the trace, from 1 */
  uint32_t machine;   /* HostStats.machine_id */
  uint32_t domain;    /* resolved in make_hosts */
  char name[TR_INSPECT_NAME_MAX];
  struct tr_inspect_losses l;
};

struct machine_sync { /* what remote_clock_sync packets said about one machine */
  uint32_t machine;
  bool has_offset;
  int64_t offset;
  int64_t round_trip; /* of the last packet's exchanges; -1: no usable pair */
};

/* Entries keyed by a pair of ids: open addressing, power-of-two size, at most half full. */
struct index_slot {
  uint32_t a, b;
  uint32_t entry; /* entry index + 1, 0: empty */
};
struct pair_index {
  struct index_slot *slots;
  size_t size, used;
};

struct ctx {
  struct tr_inspect_result *out;
  struct tr_clockgraph *g;
  /* Fed in pass 2 as the packets come (when there is a callback): the clock data read so far,
   * with which trace_processor converts a timestamp when it reads it. */
  struct tr_clockgraph *g_read;
  struct seq_state *seqs;
  size_t n_seqs, cap_seqs;
  struct pair_index seq_index, range_index, sync_index;
  struct pair_index clock_names; /* global clock id of a named machine -> names[] */
  uint64_t *rejected; /* packet indexes of snapshots the graph refused, ascending */
  size_t n_rejected, cap_rejected, next_rejected;
  struct name *names;
  size_t n_names, cap_names;
  struct range *ranges;
  size_t n_ranges, cap_ranges;
  struct machine_sync *syncs;
  size_t n_syncs, cap_syncs;
  struct pending_stats *stats;
  size_t n_stats, cap_stats;
  uint64_t n_trace_stats; /* TraceStats packets seen */
  tr_inspect_cb cb;
  void *arg;
};

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t n = *cap ? *cap * 2 : 8;
  void *p = reallocarray(*arr, n, elem);
  if (!p)
    return TR_ERR_NOMEM;
  *arr = p;
  *cap = n;
  return 0;
}

static bool is_seq_clock(uint32_t id) {
  return id >= SEQ_CLOCK_FIRST && id < SEQ_CLOCK_END;
}

static uint32_t machine_of(const Perfetto__Protos__TracePacket *p) {
  return p->has_machine_id ? p->machine_id : 0;
}

static uint32_t seq_of(const Perfetto__Protos__TracePacket *p) {
  return p->has_trusted_packet_sequence_id ? p->trusted_packet_sequence_id : 0;
}

static bool clears_state(const Perfetto__Protos__TracePacket *p) {
  return (p->has_sequence_flags &&
          (p->sequence_flags &
           PERFETTO__PROTOS__TRACE_PACKET__SEQUENCE_FLAGS__SEQ_INCREMENTAL_STATE_CLEARED)) ||
         (p->has_incremental_state_cleared && p->incremental_state_cleared);
}

/* ---- lookups ---- */

static struct index_slot *slot_of(const struct pair_index *ix, uint32_t a, uint32_t b) {
  uint64_t h = tr_fnv1a64(&(uint32_t[2]){a, b}, 2 * sizeof(uint32_t));
  size_t k = (size_t)h & (ix->size - 1);
  while (ix->slots[k].entry && (ix->slots[k].a != a || ix->slots[k].b != b))
    k = (k + 1) & (ix->size - 1);
  return &ix->slots[k];
}

/* The entry index of (a, b); if absent and next is not NULL, claims *next for it and bumps it
 * (the caller then fills that entry). -1 if absent, TR_ERR_NOMEM. */
static int64_t index_get(struct pair_index *ix, uint32_t a, uint32_t b, size_t *next) {
  if (next && (ix->used + 1) * 2 > ix->size) {
    struct pair_index bigger = {.size = ix->size ? ix->size * 2 : 64, .used = ix->used};
    if (*next >= UINT32_MAX - 1 || !(bigger.slots = calloc(bigger.size, sizeof(struct index_slot))))
      return TR_ERR_NOMEM;
    for (size_t i = 0; i < ix->size; i++)
      if (ix->slots[i].entry)
        *slot_of(&bigger, ix->slots[i].a, ix->slots[i].b) = ix->slots[i];
    free(ix->slots);
    *ix = bigger;
  }
  if (!ix->size)
    return -1;
  struct index_slot *s = slot_of(ix, a, b);
  if (s->entry)
    return s->entry - 1;
  if (!next)
    return -1;
  *s = (struct index_slot){a, b, (uint32_t)++*next};
  ix->used++;
  return s->entry - 1;
}

static struct seq_state *seq_get(struct ctx *c, uint32_t machine, uint32_t seq) {
  if (grow((void **)&c->seqs, &c->cap_seqs, c->n_seqs + 1, sizeof(*c->seqs)) < 0)
    return NULL;
  size_t before = c->n_seqs;
  int64_t i = index_get(&c->seq_index, machine, seq, &c->n_seqs);
  if (i < 0)
    return NULL;
  if (c->n_seqs != before)
    c->seqs[i] = (struct seq_state){.machine = machine, .seq = seq};
  return &c->seqs[i];
}

/* The clock a packet's timestamp is on. */
static uint32_t packet_clock(const struct seq_state *s, const Perfetto__Protos__TracePacket *p) {
  if (p->has_timestamp_clock_id)
    return p->timestamp_clock_id;
  return s->has_default ? s->default_clock : TR_CLOCK_BOOTTIME;
}

/* Sequence state every packet updates in both passes, in this order. */
static void update_defaults(struct seq_state *s, const Perfetto__Protos__TracePacket *p) {
  if (clears_state(p)) {
    s->has_default = false;
    s->has_base = 0;
  }
  const Perfetto__Protos__TracePacketDefaults *d = p->trace_packet_defaults;
  if (d && d->has_timestamp_clock_id) {
    s->has_default = true;
    s->default_clock = d->timestamp_clock_id;
  }
}

/* ---- pass 1: clock data ---- */

static int note_range(struct ctx *c, uint32_t machine, uint32_t clock, uint64_t ts) {
  if (grow((void **)&c->ranges, &c->cap_ranges, c->n_ranges + 1, sizeof(*c->ranges)) < 0)
    return TR_ERR_NOMEM;
  size_t before = c->n_ranges;
  int64_t i = index_get(&c->range_index, machine, clock, &c->n_ranges);
  if (i < 0)
    return (int)i;
  struct range *r = &c->ranges[i];
  if (c->n_ranges != before)
    *r = (struct range){machine, clock, ts, ts};
  r->lo = ts < r->lo ? ts : r->lo;
  r->hi = ts > r->hi ? ts : r->hi;
  return 0;
}

static int reject(struct ctx *c, uint64_t index) {
  c->out->snapshots_rejected++;
  if (grow((void **)&c->rejected, &c->cap_rejected, c->n_rejected + 1, sizeof(uint64_t)) < 0)
    return TR_ERR_NOMEM;
  c->rejected[c->n_rejected++] = index;
  return 0;
}

/* The snapshot's clocks for the graph, into clocks (TR_CLOCKGRAPH_MAX_CLOCKS); false for one the
 * graph must not see: no clock, too many, an incremental clock that is not a sequence's. */
static bool snapshot_clocks(const Perfetto__Protos__ClockSnapshot *cs,
                            struct tr_clockgraph_clock *clocks) {
  if (cs->n_clocks == 0 || cs->n_clocks > TR_CLOCKGRAPH_MAX_CLOCKS)
    return false;
  for (size_t i = 0; i < cs->n_clocks; i++) {
    const Perfetto__Protos__ClockSnapshot__Clock *k = cs->clocks[i];
    if (k->is_incremental && !is_seq_clock(k->clock_id))
      return false; /* only sequence clocks may be incremental */
    clocks[i] = (struct tr_clockgraph_clock){k->clock_id, k->timestamp, k->unit_multiplier_ns,
                                             false};
  }
  return true;
}

static int collect_snapshot(struct ctx *c, struct seq_state *s,
                            const Perfetto__Protos__ClockSnapshot *cs, uint64_t index) {
  c->out->clock_snapshots++;
  if (s->machine == 0 && cs->has_primary_trace_clock &&
      tr_clockgraph_set_trace_clock(c->g, (uint32_t)cs->primary_trace_clock) == 0)
    c->out->trace_clock = (uint32_t)cs->primary_trace_clock;
  size_t n = cs->n_clocks;
  struct tr_clockgraph_clock clocks[TR_CLOCKGRAPH_MAX_CLOCKS];
  if (!snapshot_clocks(cs, clocks))
    return reject(c, index);
  uint32_t first_global = 0;
  bool has_builtin = false;
  for (size_t i = 0; i < n; i++) {
    has_builtin |= clocks[i].clock_id < SEQ_CLOCK_FIRST;
    if (clocks[i].clock_id >= SEQ_CLOCK_END && !first_global)
      first_global = clocks[i].clock_id;
  }
  int rc = tr_clockgraph_add_snapshot(c->g, s->machine, s->seq, clocks, n);
  if (rc == TR_ERR_NOMEM)
    return rc;
  if (rc < 0)
    return reject(c, index);
  for (size_t i = 0; i < n; i++)
    if (!is_seq_clock(clocks[i].clock_id) &&
        (rc = note_range(c, s->machine, clocks[i].clock_id, clocks[i].timestamp)) < 0)
      return rc;
  if (s->machine == 0 && !has_builtin && first_global && !s->domain)
    s->domain = first_global;
  return 0;
}

/* GLOBAL/LOCAL ftrace clocks: the bundle's pair of readings ties clock 64 to BOOTTIME. */
static int collect_ftrace(struct tr_clockgraph *g, struct seq_state *s,
                          const Perfetto__Protos__FtraceEventBundle *b) {
  if (!b->has_ftrace_clock || (b->ftrace_clock != PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL &&
                               b->ftrace_clock != PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_LOCAL))
    return 0;
  if (!b->has_ftrace_timestamp || !b->has_boot_timestamp || b->ftrace_timestamp < 0 ||
      b->boot_timestamp < 0)
    return 0;
  struct tr_clockgraph_clock clocks[2] = {
      {TR_CLOCK_BOOTTIME, (uint64_t)b->boot_timestamp, 1, false},
      {FTRACE_SEQ_CLOCK, (uint64_t)b->ftrace_timestamp, 1, false}};
  int rc = tr_clockgraph_add_snapshot(g, s->machine, s->seq, clocks, 2);
  return rc == TR_ERR_NOMEM ? rc : 0; /* trace_processor ignores a bad pair too */
}

static struct machine_sync *sync_of(struct ctx *c, uint32_t machine) {
  if (grow((void **)&c->syncs, &c->cap_syncs, c->n_syncs + 1, sizeof(*c->syncs)) < 0)
    return NULL;
  size_t before = c->n_syncs;
  int64_t i = index_get(&c->sync_index, machine, 0, &c->n_syncs);
  if (i < 0)
    return NULL;
  if (c->n_syncs != before)
    c->syncs[i] = (struct machine_sync){.machine = machine, .round_trip = -1};
  return &c->syncs[i];
}

static bool boottime_of(const Perfetto__Protos__ClockSnapshot *cs, uint64_t *ts) {
  for (size_t i = 0; cs && i < cs->n_clocks; i++)
    if (cs->clocks[i]->clock_id == TR_CLOCK_BOOTTIME) {
      *ts = cs->clocks[i]->timestamp;
      return true;
    }
  return false;
}

/* The round trip of the exchange each pair is, averaged over the pairs: the mean of the
 * client's and the host's interval between their two readings. (Half of it bounds the offset
 * trace_processor takes from the pair; our service's pairs span a probe's whole round trip,
 * the agent's turnaround included, which its estimator takes out: docs/timeline.md,
 * "Clock error bound: three figures".) */
static int64_t sync_round_trip(const Perfetto__Protos__RemoteClockSync *rcs) {
  unsigned __int128 sum = 0;
  uint64_t pairs = 0;
  for (size_t i = 1; i < rcs->n_synced_clocks; i++) {
    const Perfetto__Protos__RemoteClockSync__SyncedClocks *a = rcs->synced_clocks[i - 1],
                                                          *b = rcs->synced_clocks[i];
    uint64_t t1c, t2c, t1h, t2h;
    if (!boottime_of(a->client_clocks, &t1c) || !boottime_of(b->client_clocks, &t2c) ||
        !boottime_of(a->host_clocks, &t1h) || !boottime_of(b->host_clocks, &t2h))
      continue;
    if (t2c - t1c >= SYNC_PAIR_NS || t2h < t1h)
      continue;
    sum += ((unsigned __int128)(t2c - t1c) + (t2h - t1h)) / 2;
    pairs++;
  }
  return pairs ? (int64_t)(sum / pairs) : -1;
}

static void collect_service_mark(struct ctx *c, uint32_t machine,
                                 const Perfetto__Protos__TracePacket *p) {
  const Perfetto__Protos__TrackEvent *te = p->track_event;
  if (machine != 0 || !p->has_timestamp || !te->has_track_uuid ||
      te->track_uuid != TR_TRACE_WRITER_SERVICE_TRACK_UUID ||
      te->name_field_case != PERFETTO__PROTOS__TRACK_EVENT__NAME_FIELD_NAME || !te->name)
    return;
  struct tr_inspect_result *out = c->out;
  out->service_marks_total++;
  if (out->n_service_marks == TR_INSPECT_MAX_SERVICE_MARKS)
    return;
  struct tr_inspect_mark *m = &out->service_marks[out->n_service_marks++];
  m->ts = p->timestamp;
  snprintf(m->name, sizeof m->name, "%s", te->name);
}

/* A remote_clock_sync packet of machine into graph g: c->g in pass 1, which also notes its
 * readings and offset for the host summaries, or c->g_read in pass 2. */
static int add_remote_sync(struct ctx *c, struct tr_clockgraph *g, uint32_t machine,
                           const Perfetto__Protos__RemoteClockSync *rcs) {
  bool collecting = g == c->g;
  c->out->remote_clock_syncs += collecting;
  if (machine == 0 || rcs->n_synced_clocks == 0)
    return 0;
  size_t total = 0;
  for (size_t i = 0; i < rcs->n_synced_clocks; i++) {
    const Perfetto__Protos__RemoteClockSync__SyncedClocks *e = rcs->synced_clocks[i];
    total += (e->client_clocks ? e->client_clocks->n_clocks : 0) +
             (e->host_clocks ? e->host_clocks->n_clocks : 0);
  }
  struct tr_clockgraph_sync *syncs = calloc(rcs->n_synced_clocks, sizeof(*syncs));
  struct tr_clockgraph_clock *clocks = calloc(total ? total : 1, sizeof(*clocks));
  int rc = TR_ERR_NOMEM;
  if (!syncs || !clocks)
    goto done;
  struct tr_clockgraph_clock *k = clocks;
  for (size_t i = 0; i < rcs->n_synced_clocks; i++) {
    const Perfetto__Protos__ClockSnapshot *side[2] = {rcs->synced_clocks[i]->client_clocks,
                                                      rcs->synced_clocks[i]->host_clocks};
    syncs[i].client = k;
    syncs[i].n_client = side[0] ? side[0]->n_clocks : 0;
    for (size_t j = 0; j < syncs[i].n_client; j++, k++) {
      *k = (struct tr_clockgraph_clock){side[0]->clocks[j]->clock_id,
                                        side[0]->clocks[j]->timestamp, 1, false};
      if (collecting && !is_seq_clock(k->clock_id) &&
          (rc = note_range(c, machine, k->clock_id, k->timestamp)) < 0)
        goto done;
    }
    syncs[i].host = k;
    syncs[i].n_host = side[1] ? side[1]->n_clocks : 0;
    for (size_t j = 0; j < syncs[i].n_host; j++, k++)
      *k = (struct tr_clockgraph_clock){side[1]->clocks[j]->clock_id,
                                        side[1]->clocks[j]->timestamp, 1, false};
  }
  int64_t offset = INT64_MIN; /* stays so when no offset was computed */
  rc = tr_clockgraph_add_remote_sync(g, machine, syncs, rcs->n_synced_clocks, &offset);
  if (rc == TR_ERR_NOMEM || !collecting) {
    rc = rc == TR_ERR_NOMEM ? rc : 0;
    goto done;
  }
  c->out->sync_edges += rc > 0 ? (uint64_t)rc : 0;
  struct machine_sync *ms = sync_of(c, machine);
  rc = ms ? 0 : TR_ERR_NOMEM;
  if (ms && offset != INT64_MIN) {
    ms->has_offset = true;
    ms->offset = offset;
    ms->round_trip = sync_round_trip(rcs);
  }
done:
  free(clocks);
  free(syncs);
  return rc;
}

static int collect_name(struct ctx *c, uint32_t machine, const Perfetto__Protos__SystemInfo *si) {
  if (grow((void **)&c->names, &c->cap_names, c->n_names + 1, sizeof(*c->names)) < 0)
    return TR_ERR_NOMEM;
  struct name *n = &c->names[c->n_names++];
  *n = (struct name){.machine = machine};
  if (si->machine_name && si->machine_name[0]) {
    n->explicit_name = true;
    snprintf(n->text, sizeof(n->text), "%s", si->machine_name);
  } else if (si->utsname) {
    const Perfetto__Protos__Utsname *u = si->utsname;
    snprintf(n->text, sizeof(n->text), "%s %s %s", u->sysname ? u->sysname : "",
             u->release ? u->release : "", u->machine ? u->machine : "");
  }
  return 0;
}

static void add_buffer(struct tr_inspect_losses *l,
                       const Perfetto__Protos__TraceStats__BufferStats *b) {
  l->chunks_overwritten += b->chunks_overwritten;
  l->bytes_overwritten += b->bytes_overwritten;
  l->chunks_discarded += b->chunks_discarded;
  l->abi_violations += b->abi_violations;
  l->trace_writer_packet_loss += b->trace_writer_packet_loss;
  l->patches_failed += b->patches_failed;
}

static void take_max(uint64_t *to, uint64_t v) {
  if (v > *to)
    *to = v;
}

/* One HostStats entry into l. A host whose agent restarted during the session has two entries
 * (the retired one and its successor) in one TraceStats: the host's own counters (link, agent
 * and flush figures since it first connected) are the same host's in both and are taken once,
 * the session_ and _packets figures are each entry's own and add up. */
static void add_host_counters(struct tr_inspect_losses *l, const Tracerelay__HostStats *h) {
  l->has_host_stats = true;
  l->connected |= h->connected;
  take_max(&l->link_lost_chunks, h->link_lost_chunks);
  take_max(&l->link_lost_bytes, h->link_lost_bytes);
  take_max(&l->agent_queue_dropped_chunks, h->agent_queue_dropped_chunks);
  take_max(&l->agent_spill_dropped_chunks, h->agent_spill_dropped_chunks);
  take_max(&l->agent_smb_full, h->agent_smb_full);
  take_max(&l->agent_abi_violations, h->agent_abi_violations);
  take_max(&l->flushes_missed, h->flushes_missed);
  l->session_chunks_refused += h->session_chunks_refused;
  l->session_flushes_missed += h->session_flushes_missed;
  l->session_disconnects += h->session_disconnects;
  l->session_smb_full += h->session_smb_full;
  l->session_smb_full_ms += h->session_smb_full_ms;
  l->session_agent_exits_unclean += h->session_agent_exits_unclean;
  l->session_stops_timed_out += h->session_stops_timed_out;
  l->session_exit_unscraped_chunks += h->session_exit_unscraped_chunks;
  for (size_t i = 0; i < h->n_session_producers_closed; i++)
    l->session_producers_closed += h->session_producers_closed[i]->connections;
  l->session_instances_not_started += h->session_instances_not_started;
  l->agent_queue_dropped_packets += h->agent_queue_dropped_packets;
  l->agent_spill_dropped_packets += h->agent_spill_dropped_packets;
  l->session_packets_lost_in_gaps += h->session_packets_lost_in_gaps;
  for (size_t i = 0; i < h->n_session_disconnected_at_ns; i++)
    if (l->num_disconnected_at < TR_INSPECT_MAX_MARKS)
      l->disconnected_at_ns[l->num_disconnected_at++] = h->session_disconnected_at_ns[i];
}

static void add_losses(struct tr_inspect_losses *d, const struct tr_inspect_losses *s) {
  d->trace_stats_packets += s->trace_stats_packets;
  d->chunks_overwritten += s->chunks_overwritten;
  d->bytes_overwritten += s->bytes_overwritten;
  d->chunks_discarded += s->chunks_discarded;
  d->abi_violations += s->abi_violations;
  d->trace_writer_packet_loss += s->trace_writer_packet_loss;
  d->patches_failed += s->patches_failed;
  d->patches_discarded += s->patches_discarded;
  d->invalid_packets += s->invalid_packets;
  d->flushes_failed += s->flushes_failed;
  if (!s->has_host_stats)
    return;
  d->has_host_stats = true;
  d->connected = s->connected;
  d->link_lost_chunks += s->link_lost_chunks;
  d->link_lost_bytes += s->link_lost_bytes;
  d->agent_queue_dropped_chunks += s->agent_queue_dropped_chunks;
  d->agent_spill_dropped_chunks += s->agent_spill_dropped_chunks;
  d->agent_smb_full += s->agent_smb_full;
  d->agent_abi_violations += s->agent_abi_violations;
  d->flushes_missed += s->flushes_missed;
  d->session_chunks_refused += s->session_chunks_refused;
  d->session_flushes_missed += s->session_flushes_missed;
  d->session_disconnects += s->session_disconnects;
  d->session_smb_full += s->session_smb_full;
  d->session_smb_full_ms += s->session_smb_full_ms;
  d->session_agent_exits_unclean += s->session_agent_exits_unclean;
  d->session_stops_timed_out += s->session_stops_timed_out;
  d->session_exit_unscraped_chunks += s->session_exit_unscraped_chunks;
  d->session_producers_closed += s->session_producers_closed;
  d->session_instances_not_started = s->session_instances_not_started;
  d->agent_queue_dropped_packets += s->agent_queue_dropped_packets;
  d->agent_spill_dropped_packets += s->agent_spill_dropped_packets;
  d->session_packets_lost_in_gaps += s->session_packets_lost_in_gaps;
  for (size_t i = 0; i < s->num_disconnected_at; i++)
    if (d->num_disconnected_at < TR_INSPECT_MAX_MARKS)
      d->disconnected_at_ns[d->num_disconnected_at++] = s->disconnected_at_ns[i];
}

static struct pending_stats *new_stats(struct ctx *c) {
  if (grow((void **)&c->stats, &c->cap_stats, c->n_stats + 1, sizeof(*c->stats)) < 0)
    return NULL;
  c->stats[c->n_stats] = (struct pending_stats){0};
  return &c->stats[c->n_stats++];
}

/* The per-host extension travels as unknown field 1000 of TraceStats: re-encoding the message
 * (protobuf-c keeps unknown fields) and decoding that as the extension reads it. NULL if absent
 * or undecodable. */
static Tracerelay__TraceStatsExtension *stats_extension(const Perfetto__Protos__TraceStats *ts) {
  if (ts->base.n_unknown_fields == 0)
    return NULL;
  size_t n = perfetto__protos__trace_stats__get_packed_size(ts);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf)
    return NULL;
  perfetto__protos__trace_stats__pack(ts, buf);
  Tracerelay__TraceStatsExtension *x = tracerelay__trace_stats_extension__unpack(NULL, n, buf);
  free(buf);
  return x;
}

/* The extension's unmatched data sources and absent machines, as one sentence. */
static void describe_missing(char *out, size_t cap, const Tracerelay__TraceStatsExtension *x) {
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < x->n_tracerelay_unmatched_data_sources && used + 1 < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%sdata source '%.128s' matched no producer "
                             "on any host", used ? "; " : "", x->tracerelay_unmatched_data_sources[i]);
  for (size_t i = 0; i < x->n_tracerelay_machines_not_connected && used + 1 < cap; i++)
    used += (size_t)snprintf(out + used, cap - used, "%smachine '%.128s' is not connected",
                             used ? "; " : "", x->tracerelay_machines_not_connected[i]);
}

/* The entry of hs's host among those of the TraceStats packet at own (a host whose agent
 * restarted is listed twice), or a new one; NULL when out of memory. */
static struct pending_stats *host_entry(struct ctx *c, size_t own,
                                        const Tracerelay__HostStats *hs) {
  const char *name = hs->machine_name ? hs->machine_name : "";
  for (size_t i = own + 1; i < c->n_stats; i++)
    if (c->stats[i].machine == hs->machine_id && strncmp(c->stats[i].name, name,
                                                         sizeof c->stats[i].name - 1) == 0)
      return &c->stats[i];
  struct pending_stats *p = new_stats(c);
  if (!p)
    return NULL;
  p->by_name = true;
  p->seq = c->stats[own].seq;
  p->packet = c->stats[own].packet;
  p->machine = hs->machine_id;
  snprintf(p->name, sizeof(p->name), "%s", name);
  return p;
}

/* Losses of one TraceStats: the extension's hosts get their own BufferStats entries and
 * counters; the packet's sequence gets the totals and every entry no host claimed. */
static int collect_stats(struct ctx *c, size_t seq, const Perfetto__Protos__TraceStats *ts) {
  Tracerelay__TraceStatsExtension *x = stats_extension(ts);
  bool *claimed = calloc(ts->n_buffer_stats + 1, sizeof(bool));
  size_t own = c->n_stats; /* an index: new_stats() may move the array */
  int rc = TR_ERR_NOMEM;
  if (!claimed || !new_stats(c))
    goto done;
  c->stats[own].seq = seq;
  c->stats[own].packet = ++c->n_trace_stats;
  c->stats[own].l = (struct tr_inspect_losses){
      .trace_stats_packets = 1, .chunks_discarded = ts->chunks_discarded,
      .patches_discarded = ts->patches_discarded, .invalid_packets = ts->invalid_packets,
      .flushes_failed = ts->flushes_failed};
  for (size_t i = 0; x && i < x->n_tracerelay_hosts; i++) {
    const Tracerelay__HostStats *hs = x->tracerelay_hosts[i];
    struct pending_stats *p = host_entry(c, own, hs);
    if (!p)
      goto done;
    add_host_counters(&p->l, hs);
    for (size_t k = 0; k < hs->n_buffer_stats_index; k++) {
      uint32_t b = hs->buffer_stats_index[k];
      if (b < ts->n_buffer_stats && !claimed[b]) {
        claimed[b] = true;
        add_buffer(&p->l, ts->buffer_stats[b]);
      }
    }
  }
  for (size_t b = 0; b < ts->n_buffer_stats; b++)
    if (!claimed[b])
      add_buffer(&c->stats[own].l, ts->buffer_stats[b]);
  if (x)
    describe_missing(c->out->missing, sizeof c->out->missing, x);
  rc = 0;
done:
  free(claimed);
  if (x)
    tracerelay__trace_stats_extension__free_unpacked(x, NULL);
  return rc;
}

static int collect(struct ctx *c, const Perfetto__Protos__TracePacket *p, uint64_t index) {
  struct seq_state *s = seq_get(c, machine_of(p), seq_of(p));
  if (!s)
    return TR_ERR_NOMEM;
  update_defaults(s, p);
  int rc = 0;
  switch (p->data_case) {
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT:
    rc = collect_snapshot(c, s, p->clock_snapshot, index);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_FTRACE_EVENTS:
    rc = collect_ftrace(c->g, s, p->ftrace_events);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_REMOTE_CLOCK_SYNC:
    rc = add_remote_sync(c, c->g, s->machine, p->remote_clock_sync);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_SYSTEM_INFO:
    rc = collect_name(c, s->machine, p->system_info);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_STATS:
    rc = collect_stats(c, (size_t)(s - c->seqs), p->trace_stats);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT:
    collect_service_mark(c, s->machine, p);
    if (s->machine == 0 && s->seq == TR_INSPECT_SERVICE_SEQ && p->has_timestamp)
      rc = tr_trace_bounds_add_event(&c->out->bounds, p->timestamp, p->track_event);
    break;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_DESCRIPTOR:
    if (s->machine == 0 && s->seq == TR_INSPECT_SERVICE_SEQ)
      rc = tr_trace_bounds_add_track(&c->out->bounds, p->track_descriptor);
    break;
  default:
    break;
  }
  uint32_t clock = packet_clock(s, p);
  if (s->machine == 0 && p->has_timestamp && clock >= SEQ_CLOCK_END && !s->domain)
    s->domain = clock;
  return rc;
}

/* ---- between the passes: hosts ---- */

/* Indexes the global ids of the builtin clocks of every machine_name; the first name wins. */
static int index_clock_names(struct ctx *c) {
  for (size_t i = 0; i < c->n_names; i++) {
    for (uint32_t k = TR_CLOCK_REALTIME; c->names[i].explicit_name && k <= TR_CLOCK_BOOTTIME; k++) {
      size_t entry = i; /* index_get stores names[i] for a new id */
      int64_t rc = index_get(&c->clock_names,
                             tr_global_clock_id(c->names[i].text, tr_clock_name(k)), 0, &entry);
      if (rc < 0)
        return (int)rc;
    }
  }
  return 0;
}

/* The BOOTTIME id of the named machine whose global clock this is, naming it; else the id. */
static uint32_t name_domain(struct ctx *c, uint32_t domain, const char **name) {
  int64_t i = index_get(&c->clock_names, domain, 0, NULL);
  if (i < 0)
    return domain;
  c->names[i].used = true;
  *name = c->names[i].text;
  return tr_global_clock_id(c->names[i].text, "BOOTTIME");
}

static int host_cmp(const void *a, const void *b) {
  const struct tr_inspect_host *x = a, *y = b;
  if (x->machine_id != y->machine_id)
    return x->machine_id < y->machine_id ? -1 : 1;
  return x->domain < y->domain ? -1 : x->domain > y->domain;
}

static int64_t find_host(const struct tr_inspect_result *out, uint32_t machine, uint32_t domain) {
  size_t lo = 0, hi = out->n_hosts;
  struct tr_inspect_host key = {.machine_id = machine, .domain = domain};
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int cmp = host_cmp(&out->hosts[mid], &key);
    if (cmp == 0)
      return (int64_t)mid;
    if (cmp < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return -1;
}

/* Sorts the first n hosts and drops duplicates, keeping a name if any duplicate has one. */
static void sort_unique(struct tr_inspect_result *out, size_t n) {
  qsort(out->hosts, n, sizeof(*out->hosts), host_cmp);
  out->n_hosts = 0;
  for (size_t i = 0; i < n; i++)
    if (!out->n_hosts || host_cmp(&out->hosts[out->n_hosts - 1], &out->hosts[i]) != 0)
      out->hosts[out->n_hosts++] = out->hosts[i];
    else if (!out->hosts[out->n_hosts - 1].name[0])
      memcpy(out->hosts[out->n_hosts - 1].name, out->hosts[i].name, TR_INSPECT_NAME_MAX);
}

/* The host a HostStats entry speaks for: its machine_id if packets carry it, else the
 * global-clocks host of its name, else a host of its own (machine_id, no domain). */
static void stats_host(const struct tr_inspect_result *out, struct pending_stats *p) {
  uint32_t d = p->name[0] ? tr_global_clock_id(p->name, "BOOTTIME") : 0;
  if (find_host(out, p->machine, 0) < 0 && d && find_host(out, 0, d) >= 0) {
    p->machine = 0;
    p->domain = d;
  }
}

/* One host per distinct (machine, domain) of the sequences and of the per-host stats, sorted;
 * then each sequence points at its host and losses and names are handed out. O(S log S). */
static int make_hosts(struct ctx *c) {
  struct tr_inspect_result *out = c->out;
  int rc = index_clock_names(c);
  if (rc < 0)
    return rc;
  out->hosts = calloc(c->n_seqs + c->n_stats + 1, sizeof(*out->hosts));
  if (!out->hosts)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < c->n_seqs; i++) {
    struct seq_state *s = &c->seqs[i];
    const char *name = "";
    if (s->domain)
      s->domain = name_domain(c, s->domain, &name);
    struct tr_inspect_host *h = &out->hosts[i];
    *h = (struct tr_inspect_host){.machine_id = s->machine, .domain = s->domain,
                                  .sync_round_trip_ns = -1};
    snprintf(h->name, sizeof(h->name), "%s", name);
  }
  sort_unique(out, c->n_seqs);
  size_t n = out->n_hosts;
  for (size_t i = 0; i < c->n_stats; i++) {
    struct pending_stats *p = &c->stats[i];
    if (!p->by_name)
      continue;
    stats_host(out, p);
    if (find_host(out, p->machine, p->domain) < 0)
      out->hosts[n++] = (struct tr_inspect_host){.machine_id = p->machine, .domain = p->domain,
                                                 .sync_round_trip_ns = -1};
  }
  sort_unique(out, n);
  for (size_t i = 0; i < c->n_seqs; i++)
    c->seqs[i].host = (uint32_t)find_host(out, c->seqs[i].machine, c->seqs[i].domain);
  uint64_t *last = calloc(c->n_seqs + 1, sizeof *last); /* per sequence, its last TraceStats */
  if (!last)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < c->n_stats; i++)
    take_max(&last[c->stats[i].seq], c->stats[i].packet);
  for (size_t i = 0; i < c->n_stats; i++) {
    const struct pending_stats *p = &c->stats[i];
    struct tr_inspect_host *h =
        &out->hosts[p->by_name ? find_host(out, p->machine, p->domain) : c->seqs[p->seq].host];
    if (p->packet == last[p->seq])
      add_losses(&h->losses, &p->l);
    else
      h->losses.trace_stats_packets += p->l.trace_stats_packets;
    if (!h->name[0])
      snprintf(h->name, sizeof(h->name), "%s", p->name);
  }
  free(last);
  for (size_t i = 0; i < c->n_names; i++) { /* the first SystemInfo of a machine names it */
    int64_t h = find_host(out, c->names[i].machine, 0);
    if (h >= 0 && !c->names[i].used && !out->hosts[h].name[0])
      snprintf(out->hosts[h].name, sizeof(out->hosts[h].name), "%s", c->names[i].text);
  }
  return 0;
}

/* ---- pass 2: timestamps ---- */

static void emit(struct ctx *c, struct tr_inspect_point *pt) {
  struct tr_inspect_host *h = &c->out->hosts[pt->host];
  h->timestamps++;
  if (pt->status == 0) {
    if (!h->has_range || pt->trace_ts < h->first_ts)
      h->first_ts = pt->trace_ts;
    if (!h->has_range || pt->trace_ts > h->last_ts)
      h->last_ts = pt->trace_ts;
    h->has_range = true;
  } else {
    bool same = h->n_unresolved_offsets &&
                h->unresolved_offsets[h->n_unresolved_offsets - 1] == pt->offset;
    if (!same && h->n_unresolved_offsets < TR_INSPECT_MAX_EXAMPLES)
      h->unresolved_offsets[h->n_unresolved_offsets++] = pt->offset;
    h->unresolved++;
  }
  if (c->cb)
    c->cb(pt, c->arg);
}

/* Resolves pt->raw_ts on pt->clock_id; decodes incremental sequence clocks unless absolute. */
static void resolve_point(struct ctx *c, struct seq_state *s, struct tr_inspect_point *pt,
                          bool absolute) {
  pt->clock_ts = pt->raw_ts;
  if (!absolute && is_seq_clock(pt->clock_id) &&
      (s->incremental >> (pt->clock_id - SEQ_CLOCK_FIRST) & 1)) {
    uint32_t bit = pt->clock_id - SEQ_CLOCK_FIRST;
    if (!(s->has_base >> bit & 1)) {
      pt->status = TR_ERR_STATE;
      emit(c, pt);
      return;
    }
    if (__builtin_add_overflow(s->base[bit], pt->raw_ts, &pt->clock_ts)) {
      pt->status = TR_ERR_INVAL;
      emit(c, pt);
      return;
    }
    s->base[bit] = pt->clock_ts;
  }
  pt->status = tr_clockgraph_convert(c->g, s->machine, pt->clock_id, s->seq, pt->clock_ts,
                                     &pt->trace_ts);
  pt->read_trace_ts = pt->trace_ts;
  /* What cannot convert yet trace_processor defers (as the full graph resolves it). */
  int64_t read_ts;
  if (c->g_read && tr_clockgraph_convert(c->g_read, s->machine, pt->clock_id, s->seq,
                                         pt->clock_ts, &read_ts) == 0)
    pt->read_trace_ts = read_ts;
  emit(c, pt);
}

static int resolve_snapshot(struct seq_state *s, const Perfetto__Protos__ClockSnapshot *cs) {
  for (size_t i = 0; i < cs->n_clocks; i++) {
    const Perfetto__Protos__ClockSnapshot__Clock *k = cs->clocks[i];
    if (!is_seq_clock(k->clock_id) || !k->is_incremental)
      continue;
    if (!s->base && !(s->base = calloc(SEQ_CLOCK_END - SEQ_CLOCK_FIRST, sizeof(uint64_t))))
      return TR_ERR_NOMEM;
    uint32_t bit = k->clock_id - SEQ_CLOCK_FIRST;
    s->incremental |= 1ull << bit;
    s->has_base |= 1ull << bit;
    s->base[bit] = k->timestamp;
  }
  return 0;
}

static void resolve_ftrace(struct ctx *c, struct seq_state *s,
                           const Perfetto__Protos__FtraceEventBundle *b,
                           struct tr_inspect_point *pt) {
  int status = 0;
  switch (b->has_ftrace_clock ? b->ftrace_clock : 0) {
  case PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_UNSPECIFIED:
    pt->clock_id = TR_CLOCK_BOOTTIME;
    break;
  case PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_MONO_RAW:
    pt->clock_id = TR_CLOCK_MONOTONIC_RAW;
    break;
  case PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_GLOBAL:
  case PERFETTO__PROTOS__FTRACE_CLOCK__FTRACE_CLOCK_LOCAL:
    pt->clock_id = FTRACE_SEQ_CLOCK;
    break;
  default:
    pt->clock_id = 0;
    status = TR_ERR_UNSUPPORTED;
    break;
  }
  struct tr_inspect_host *h = &c->out->hosts[pt->host];
  const Perfetto__Protos__FtraceEventBundle__CompactSched *cs = b->compact_sched;
  const struct {
    enum tr_inspect_source source;
    size_t n;
    const uint64_t *deltas; /* NULL: events */
  } lists[3] = {
      {TR_INSPECT_FTRACE_EVENT, b->n_event, NULL},
      {TR_INSPECT_COMPACT_SWITCH, cs ? cs->n_switch_timestamp : 0, cs ? cs->switch_timestamp : NULL},
      {TR_INSPECT_COMPACT_WAKING, cs ? cs->n_waking_timestamp : 0, cs ? cs->waking_timestamp : NULL},
  };
  for (size_t l = 0; l < 3; l++) {
    uint64_t acc = 0;
    for (size_t i = 0; i < lists[l].n; i++) {
      if (!lists[l].deltas && !b->event[i]->has_timestamp)
        continue;
      acc = lists[l].deltas ? acc + lists[l].deltas[i] : b->event[i]->timestamp;
      pt->source = lists[l].source;
      pt->event = (uint32_t)i;
      pt->raw_ts = acc;
      h->ftrace_events++;
      if (status) {
        pt->clock_ts = acc;
        pt->status = status;
        emit(c, pt);
      } else {
        resolve_point(c, s, pt, true);
      }
    }
  }
}

/* The packet's clock data into c->g_read, before its own timestamp is read (a snapshot that pass
 * 1's graph refused is left out here too). */
static int read_clock_data(struct ctx *c, struct seq_state *s,
                           const Perfetto__Protos__TracePacket *p, bool rejected) {
  struct tr_clockgraph_clock clocks[TR_CLOCKGRAPH_MAX_CLOCKS];
  int rc = 0;
  switch (p->data_case) {
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT:
    if (!rejected && snapshot_clocks(p->clock_snapshot, clocks))
      rc = tr_clockgraph_add_snapshot(c->g_read, s->machine, s->seq, clocks,
                                      p->clock_snapshot->n_clocks);
    return rc == TR_ERR_NOMEM ? rc : 0;
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_FTRACE_EVENTS:
    return collect_ftrace(c->g_read, s, p->ftrace_events);
  case PERFETTO__PROTOS__TRACE_PACKET__DATA_REMOTE_CLOCK_SYNC:
    return add_remote_sync(c, c->g_read, s->machine, p->remote_clock_sync);
  default:
    return 0;
  }
}

static int resolve(struct ctx *c, const Perfetto__Protos__TracePacket *p, uint64_t index,
                   uint64_t offset) {
  struct seq_state *s = seq_get(c, machine_of(p), seq_of(p)); /* exists since pass 1 */
  if (!s)
    return TR_ERR_NOMEM;
  struct tr_inspect_host *h = &c->out->hosts[s->host];
  h->packets++;
  s->packets++;
  update_defaults(s, p);
  bool rejected = c->next_rejected < c->n_rejected && c->rejected[c->next_rejected] == index;
  c->next_rejected += rejected;
  int rc;
  if (c->g_read && (rc = read_clock_data(c, s, p, rejected)) < 0)
    return rc;
  if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT && !rejected &&
      (rc = resolve_snapshot(s, p->clock_snapshot)) < 0)
    return rc;
  if (p->has_previous_packet_dropped && p->previous_packet_dropped &&
      !(p->has_first_packet_on_sequence && p->first_packet_on_sequence)) {
    h->losses.previous_packet_dropped++;
    s->state_lost = true;
  }
  /* As trace_processor: after a loss, a packet that needs the sequence's incremental state
   * (interned data, deltas on an incremental clock) is skipped until the state is cleared; the
   * clear wins when one packet carries both. */
  if (clears_state(p))
    s->state_lost = false;
  if (s->state_lost && p->has_sequence_flags &&
      (p->sequence_flags &
       PERFETTO__PROTOS__TRACE_PACKET__SEQUENCE_FLAGS__SEQ_NEEDS_INCREMENTAL_STATE)) {
    h->skipped_after_loss++;
    return 0;
  }

  struct tr_inspect_point pt = {.packet = p, .index = index, .offset = offset, .host = s->host,
                                .machine_id = s->machine, .seq_id = s->seq};
  if (p->has_timestamp) {
    pt.source = TR_INSPECT_PACKET;
    pt.clock_id = packet_clock(s, p);
    pt.raw_ts = p->timestamp;
    resolve_point(c, s, &pt, false);
  }
  if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_FTRACE_EVENTS)
    resolve_ftrace(c, s, p->ftrace_events, &pt);
  return 0;
}

/* ---- after pass 2 ---- */

static void map_host(struct ctx *c, struct tr_inspect_host *h) {
  uint32_t clock = h->domain ? h->domain : TR_CLOCK_BOOTTIME;
  int64_t s = h->domain ? -1 : index_get(&c->sync_index, h->machine_id, 0, NULL);
  if (s >= 0 && c->syncs[s].has_offset) {
    h->has_sync_offset = true;
    h->sync_offset_ns = c->syncs[s].offset;
    h->sync_round_trip_ns = c->syncs[s].round_trip;
  }
  h->on_trace_clock = h->machine_id == 0 && clock == c->out->trace_clock;
  int64_t ri = index_get(&c->range_index, h->machine_id, clock, NULL);
  const struct range *r = ri >= 0 ? &c->ranges[ri] : NULL;
  int64_t a, b;
  if (!r || r->lo > INT64_MAX || r->hi > INT64_MAX ||
      tr_clockgraph_convert(c->g, h->machine_id, clock, 0, r->lo, &a) < 0 ||
      tr_clockgraph_convert(c->g, h->machine_id, clock, 0, r->hi, &b) < 0)
    return;
  h->has_mapping = true;
  h->offset_ns = a - (int64_t)r->lo;
  h->mapping_span_ns = r->hi - r->lo;
  if (r->hi > r->lo)
    h->drift_ppm = ((double)(b - a) - (double)(r->hi - r->lo)) / (double)(r->hi - r->lo) * 1e6;
}

static int seq_cmp(const void *a, const void *b) {
  const struct tr_inspect_seq *x = a, *y = b;
  return x->seq_id < y->seq_id ? -1 : x->seq_id > y->seq_id;
}

static int finish_hosts(struct ctx *c) {
  struct tr_inspect_result *out = c->out;
  for (size_t i = 0; i < c->n_seqs; i++)
    out->hosts[c->seqs[i].host].n_seqs++;
  for (size_t i = 0; i < out->n_hosts; i++) {
    out->hosts[i].seqs = calloc(out->hosts[i].n_seqs, sizeof(struct tr_inspect_seq));
    if (!out->hosts[i].seqs)
      return TR_ERR_NOMEM;
    out->hosts[i].n_seqs = 0;
  }
  for (size_t i = 0; i < c->n_seqs; i++) {
    struct tr_inspect_host *h = &out->hosts[c->seqs[i].host];
    h->seqs[h->n_seqs++] = (struct tr_inspect_seq){c->seqs[i].seq, c->seqs[i].packets};
  }
  for (size_t i = 0; i < out->n_hosts; i++) {
    qsort(out->hosts[i].seqs, out->hosts[i].n_seqs, sizeof(struct tr_inspect_seq), seq_cmp);
    map_host(c, &out->hosts[i]);
  }
  return 0;
}

/* ---- driver ---- */

/* One pass over the trace; fn sees every packet. */
static int pass(struct ctx *c, const void *data, size_t len,
                int (*fn)(struct ctx *, const Perfetto__Protos__TracePacket *, uint64_t,
                          uint64_t)) {
  struct tr_trace_reader r;
  struct tr_trace_record rec;
  tr_trace_reader_init(&r, data, len);
  int rc;
  while ((rc = tr_trace_reader_next(&r, &rec)) > 0)
    if ((rc = fn(c, rec.packet, r.records - 1, rec.offset)) < 0)
      break;
  if (rc < 0 && r.error.code)
    c->out->error = r.error;
  c->out->packets = r.records;
  c->out->zlib_packets = r.zlib_packets;
  c->out->zstd_packets = r.zstd_packets;
  c->out->undecodable_packets = r.undecodable_packets;
  c->out->first_undecodable_offset = r.first_undecodable_offset;
  tr_trace_reader_free(&r);
  return rc;
}

static int collect_fn(struct ctx *c, const Perfetto__Protos__TracePacket *p, uint64_t index,
                      uint64_t offset) {
  (void)offset;
  return collect(c, p, index);
}

int tr_inspect_trace(const void *data, size_t len, tr_inspect_cb cb, void *arg,
                     struct tr_inspect_result *out) {
  memset(out, 0, sizeof(*out));
  out->bytes = len;
  out->trace_clock = TR_CLOCK_BOOTTIME;
  out->error.inner = -1;
  struct ctx c = {.out = out, .cb = cb, .arg = arg};
  int rc = tr_clockgraph_init(&c.g);
  if (rc < 0)
    return rc;
  if ((rc = pass(&c, data, len, collect_fn)) < 0 || (rc = make_hosts(&c)) < 0)
    goto done;
  for (size_t i = 0; i < c.n_seqs; i++) /* pass 2 rebuilds sequence state from the start */
    c.seqs[i].has_default = false;
  if (cb && ((rc = tr_clockgraph_init(&c.g_read)) < 0 ||
             (rc = tr_clockgraph_set_trace_clock(c.g_read, out->trace_clock)) < 0))
    goto done;
  if ((rc = pass(&c, data, len, resolve)) < 0)
    goto done;
  rc = finish_hosts(&c);
done:
  for (size_t i = 0; i < c.n_seqs; i++)
    free(c.seqs[i].base);
  free(c.seqs);
  free(c.seq_index.slots);
  free(c.range_index.slots);
  free(c.sync_index.slots);
  free(c.clock_names.slots);
  free(c.rejected);
  free(c.names);
  free(c.ranges);
  free(c.syncs);
  free(c.stats);
  tr_clockgraph_free(c.g);
  tr_clockgraph_free(c.g_read);
  return rc;
}

void tr_inspect_result_free(struct tr_inspect_result *r) {
  for (size_t i = 0; i < r->n_hosts; i++)
    free(r->hosts[i].seqs);
  free(r->hosts);
  r->hosts = NULL;
  r->n_hosts = 0;
  tr_trace_bounds_free(&r->bounds);
}
