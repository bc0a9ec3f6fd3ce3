/* session_stats.c: a session's TraceStats (see session.h), which the tail of every read pass
 * carries and GetTraceStats returns: per (buffer, host entry) central buffer stats, the
 * session's flush counts, and our per-host extension (links, agents, the session's losses on
 * each host, what the config matched nowhere).
 *
 * Layout (protos/tracerelay/tracerelay_stats.proto): TraceStats.buffer_stats has one entry
 * per (buffer, host entry that received data), buffer-major, and for a buffer no host has
 * written yet one empty entry of its per-host size that is no host's (traced reports every
 * buffer; the Perfetto UI shows "NaN %" buffer usage without one); the extension field 1000
 * lists every host entry with its link/agent counters and which buffer_stats entries are its.
 * Cost O(buffers x host entries + instances x host entries) per call.
 *
 * Also what the live status and the metrics show of a host in a session (its instances, its
 * central buffers' losses), summed over the host's entries. */
#include "service/session_priv.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "service/hosts.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

void tr_session_stats_fill_host(Tracerelay__HostStats *h, const tr_host *host, bool connected) {
  const tr_host_stats *st = &host->stats;
  h->machine_name = (char *)host->trace_name; /* the name its packets are known by */
  h->has_machine_id = 1;
  h->machine_id = host->machine_id;
  h->has_connected = 1;
  h->connected = connected;
#define SET(f)                                                                                    \
  h->has_##f = 1;                                                                                 \
  h->f = st->f
  SET(batches_received);
  SET(batches_duplicate);
  SET(chunks_received);
  SET(bytes_received);
  SET(link_lost_batches);
  SET(link_lost_chunks);
  SET(link_lost_bytes);
  SET(agent_queue_dropped_chunks);
  SET(agent_queue_dropped_bytes);
  SET(agent_spill_dropped_chunks);
  SET(agent_spill_dropped_bytes);
  SET(agent_smb_full);
  SET(agent_abi_violations);
  SET(disconnects);
  SET(flushes_missed);
  SET(agent_exits_unclean);
  SET(agent_producers_closed);
  SET(agent_exit_unscraped_chunks);
#undef SET
  h->has_agent_smb_full_ms = 1;
  h->agent_smb_full_ms = (st->agent_smb_full_ns + 999999u) / 1000000u; /* still an upper bound */
}

void tr_session_stats_free(Perfetto__Protos__TraceStats *stats) {
  if (!stats)
    return;
  if (stats->n_buffer_stats)
    free(stats->buffer_stats[0]);
  free(stats->buffer_stats);
  if (stats->filter_stats)
    free(stats->filter_stats->bytes_discarded_per_buffer);
  free(stats->filter_stats);
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

/* Whether some host entry of the session has written into buffer b (has its central buffer). */
static bool buffer_written(const tr_session *s, size_t b) {
  for (size_t h = 0; h < s->num_hosts; h++)
    if (s->hosts[h].tbufs[b])
      return true;
  return false;
}

static uint64_t since(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

/* What the host's agent lost of this session's buffers while the entry was the host's
 * (another session's losses on the same host, or an earlier session's, are not this one's):
 * the packets in the chunks it dropped, and what producers' departures cost. */
static tr_host_buffer_drops session_drops(const tr_session *s, const tr_session_host *sh) {
  tr_host_buffer_drops sum = {0};
  for (size_t b = 0; b < s->num_buffers; b++) {
    const tr_host_buffer_drops *start = &sh->drops_at_start[b];
    tr_host_buffer_drops now = sh->retired
                                   ? sh->drops_at_end[b]
                                   : tr_hosts_buffer_drops(sh->host, s->buffers[b].global_id);
    sum.queue_packets += since(now.queue_packets, start->queue_packets);
    sum.spill_packets += since(now.spill_packets, start->spill_packets);
    sum.exit_unscraped_chunks += since(now.exit_unscraped_chunks, start->exit_unscraped_chunks);
    for (size_t i = 0; i <= TR_IPC_CLOSE_REASONS; i++)
      sum.producers_closed[i] += since(now.producers_closed[i], start->producers_closed[i]);
  }
  return sum;
}

/* One host entry's session_producers_closed: an entry per reason at most. */
struct host_closes {
  Tracerelay__HostStats__ProducersClosed e[TR_IPC_CLOSE_REASONS + 1];
  Tracerelay__HostStats__ProducersClosed *p[TR_IPC_CLOSE_REASONS + 1];
};

/* The session's share of the agent's losses on this host. For the accounting check and the
 * record CLI's summary, not in the live status. */
static void fill_session_drops(Tracerelay__HostStats *h, const tr_session *s,
                               const tr_session_host *sh, struct host_closes *c) {
  tr_host_buffer_drops d = session_drops(s, sh);
  h->has_agent_queue_dropped_packets = h->has_agent_spill_dropped_packets = 1;
  h->agent_queue_dropped_packets = d.queue_packets;
  h->agent_spill_dropped_packets = d.spill_packets;
  h->has_session_exit_unscraped_chunks = 1;
  h->session_exit_unscraped_chunks = d.exit_unscraped_chunks;
  for (size_t i = 0; i <= TR_IPC_CLOSE_REASONS; i++) {
    if (d.producers_closed[i] == 0)
      continue;
    Tracerelay__HostStats__ProducersClosed *e = &c->e[h->n_session_producers_closed];
    tracerelay__host_stats__producers_closed__init(e);
    e->reason = (char *)tr_ipc_close_name((enum tr_ipc_close)i);
    e->has_connections = 1;
    e->connections = d.producers_closed[i];
    c->p[h->n_session_producers_closed++] = e;
  }
  h->session_producers_closed = c->p;
}

static void fill_host(Tracerelay__HostStats *h, const tr_session *s, size_t hi,
                      struct host_closes *c) {
  const tr_session_host *sh = &s->hosts[hi];
  const tr_host_stats *st = &sh->host->stats;
  /* A clone's entries are all retired: its links are as they were at the clone. */
  tr_session_stats_fill_host(h, sh->host, !sh->gone && (!sh->retired || s->read_only));
  fill_session_drops(h, s, sh, c);
  h->has_session_chunks_refused = 1;
  h->session_chunks_refused = sh->chunks_refused;
  h->has_session_flushes_missed = 1;
  h->session_flushes_missed = tr_session_flush_missed(s, hi);
  h->has_session_disconnects = 1;
  h->session_disconnects = sh->disconnects;
  h->has_session_agent_exits_unclean = 1;
  h->session_agent_exits_unclean = sh->agent_exits_unclean;
  h->has_session_stops_timed_out = 1;
  h->session_stops_timed_out = sh->stops_timed_out;
  uint64_t smb_full = sh->retired ? sh->smb_full_at_end : st->agent_smb_full;
  uint64_t smb_full_ns = sh->retired ? sh->smb_full_ns_at_end : st->agent_smb_full_ns;
  h->has_session_smb_full = 1;
  h->session_smb_full = since(smb_full, sh->smb_full_at_start);
  h->has_session_smb_full_ms = 1;
  /* rounded up: still an upper bound */
  h->session_smb_full_ms = (since(smb_full_ns, sh->smb_full_ns_at_start) + 999999u) / 1000000u;
  h->has_session_instances_not_started = 1;
  for (size_t k = sh->first_instance; k != 0; k = s->instances[k - 1].next_of_entry) {
    const tr_ds_instance *in = &s->instances[k - 1];
    h->session_instances_not_started += in->state != TR_DS_SETUP && !in->was_started;
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
  struct host_closes *closes = calloc(nh + 1, sizeof *closes);
  int rc = TR_ERR_NOMEM;
  uint32_t bs_index = 0;

  if (!hosts || !ptrs || !idx || !closes)
    goto out;
  for (size_t h = 0; h < nh; h++) {
    tracerelay__host_stats__init(&hosts[h]);
    fill_host(&hosts[h], s, h, &closes[h]);
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
  for (size_t b = 0; b < s->num_buffers; b++) {
    if (!buffer_written(s, b))
      bs_index++; /* its empty entry, no host's */
    for (size_t h = 0; h < nh; h++) {
      if (!s->hosts[h].tbufs[b])
        continue;
      hosts[h].buffer_stats_index[hosts[h].n_buffer_stats_index++] = bs_index++;
      hosts[h].buffer_index[hosts[h].n_buffer_index++] = (uint32_t)b;
    }
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
      tr_session_unmatched_machines(s, absent, TR_SESSION_MAX_UNMATCHED);
  x.tracerelay_machines_not_connected = (char **)absent;
  *ext_len = tracerelay__trace_stats_extension__get_packed_size(&x);
  *ext = malloc(*ext_len + 1);
  if (!*ext)
    goto out;
  tracerelay__trace_stats_extension__pack(&x, *ext);
  rc = 0;
out:
  free(closes);
  free(idx);
  free(ptrs);
  free(hosts);
  return rc;
}

/* filter_stats, for a session with a trace_filter (the read side's counts). */
static int fill_filter_stats(tr_session *s, Perfetto__Protos__TraceStats *st) {
  tr_trace_filter_stats f;
  const uint64_t *discarded;
  size_t n;
  Perfetto__Protos__TraceStats__FilterStats *fs;
  if (!tr_trace_output_filter_stats(s->output, &f, &discarded, &n))
    return 0;
  if (!(fs = st->filter_stats = calloc(1, sizeof *fs)))
    return TR_ERR_NOMEM;
  perfetto__protos__trace_stats__filter_stats__init(fs);
  fs->has_input_packets = fs->has_input_bytes = fs->has_output_bytes = 1;
  fs->has_errors = fs->has_time_taken_ns = 1;
  fs->input_packets = f.input_packets;
  fs->input_bytes = f.input_bytes;
  fs->output_bytes = f.output_bytes;
  fs->errors = f.errors;
  fs->time_taken_ns = f.time_taken_ns;
  if (n && !(fs->bytes_discarded_per_buffer = malloc(n * sizeof(uint64_t))))
    return TR_ERR_NOMEM;
  if (n)
    memcpy(fs->bytes_discarded_per_buffer, discarded, n * sizeof(uint64_t));
  fs->n_bytes_discarded_per_buffer = n;
  return 0;
}

int tr_session_stats(tr_session *s, Perfetto__Protos__TraceStats **out, uint8_t **ext,
                     size_t *ext_len) {
  Perfetto__Protos__TraceStats *st = calloc(1, sizeof *st);
  Perfetto__Protos__TraceStats__BufferStats *bs = NULL;
  size_t n = 0, producers = 0, sources = 0;
  uint64_t discarded = 0, patches_failed = 0, invalid = 0;
  struct tr_session_flush_counts flushes;

  *out = NULL;
  *ext = NULL;
  if (!st)
    return TR_ERR_NOMEM;
  perfetto__protos__trace_stats__init(st);
  bs = calloc(s->num_buffers * (s->num_hosts + 1) + 1, sizeof *bs);
  st->buffer_stats = calloc(s->num_buffers * (s->num_hosts + 1) + 1, sizeof *st->buffer_stats);
  if (!bs || !st->buffer_stats)
    goto fail;
  for (size_t b = 0; b < s->num_buffers; b++) {
    if (!buffer_written(s, b)) {
      fill_buffer_stats(&bs[n], &(tr_tbuf_stats){.buffer_size = s->buffers[b].size});
      st->buffer_stats[n] = &bs[n];
      n++;
    }
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
  }
  st->n_buffer_stats = n;
  invalid += tr_trace_output_invalid_packets(s->output);
  if (n == 0)
    free(bs); /* free_stats frees buffer_stats[0] only when there is one */
  bs = NULL;
  for (const tr_host *host = tr_hosts_first(s->svc->hosts); host; host = host->next) {
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
  tr_session_flush_counts(s, &flushes);
  st->has_flushes_requested = 1;
  st->flushes_requested = flushes.requested;
  st->has_flushes_succeeded = 1;
  st->flushes_succeeded = flushes.succeeded;
  st->has_flushes_failed = 1;
  st->flushes_failed = flushes.failed;
  if (flushes.final_outcome) {
    st->has_final_flush_outcome = 1;
    st->final_flush_outcome = (Perfetto__Protos__TraceStats__FinalFlushOutcome)flushes.final_outcome;
  }
  if (fill_filter_stats(s, st) != 0 || pack_extension(s, ext, ext_len) != 0)
    goto fail;
  *out = st;
  return 0;
fail:
  free(bs);
  tr_session_stats_free(st);
  return TR_ERR_NOMEM;
}

int tr_session_stats_packet(tr_session *s, uint64_t ts, tr_trace_writer_buf *out) {
  Perfetto__Protos__TraceStats *stats = NULL;
  uint8_t *ext = NULL;
  size_t ext_len = 0;
  int rc = tr_session_stats(s, &stats, &ext, &ext_len);
  if (rc != 0)
    return rc;
  rc = tr_trace_writer_trace_stats(s->svc->uid, ts, stats, ext, ext_len, out);
  tr_session_stats_free(stats);
  free(ext);
  return rc;
}

void tr_session_stats_add_host_losses(const tr_session *s, const tr_host *host,
                                      struct tr_host_buffer_losses *out) {
  for (size_t e = tr_session_newest_entry(s, host); e != 0; e = s->hosts[e - 1].older_entry) {
    const tr_session_host *sh = &s->hosts[e - 1];
    for (size_t b = 0; sh->tbufs && b < s->num_buffers; b++) {
      tr_tbuf_stats st;
      if (!sh->tbufs[b])
        continue;
      tr_tbuf_get_stats(sh->tbufs[b], &st);
      out->chunks_overwritten += st.chunks_overwritten;
      out->bytes_overwritten += st.bytes_overwritten;
      out->chunks_discarded += st.chunks_discarded;
      out->packets_lost_in_gaps += st.packets_lost_in_gaps;
      out->trace_writer_packet_loss += st.trace_writer_packet_loss;
      out->patches_failed += st.patches_failed;
      out->invalid_packets += st.invalid_packets;
      out->abi_violations += st.abi_violations;
    }
  }
}

void tr_session_stats_host_summary(const tr_session *s, const tr_host *host,
                                   struct tr_session_host_summary *out) {
  size_t num_entries = 0;
  bool any_live = false;
  out->instances = out->instances_started = 0;
  for (size_t e = tr_session_newest_entry(s, host); e != 0; e = s->hosts[e - 1].older_entry) {
    const tr_session_host *sh = &s->hosts[e - 1];
    num_entries++;
    any_live |= !sh->gone && !sh->retired;
    for (size_t k = sh->first_instance; k != 0; k = s->instances[k - 1].next_of_entry) {
      out->instances++;
      out->instances_started += s->instances[k - 1].state == TR_DS_STARTED;
    }
  }
  out->gone = num_entries > 0 && !any_live;
}
