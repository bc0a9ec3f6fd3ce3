/* metrics.c: the service's Prometheus metrics (--metrics-listen, relay/daemon/metrics_http.h):
 * hosts connected, sessions, and per host (label `host`, the machine name) its producers, traffic,
 * every loss counter of the trace's HostStats, disconnects, its clock mapping (offset, drift,
 * probe RTT, error bound now) and the losses of its central buffers in the sessions that exist
 * now; and the loop's own lag (relay/daemon/loop_lag.h) and the agents' TLS handshakes; for a
 * regional, its forwarding. Each host's figures are read once per scrape,
 * with status.c's and the sessions' readers, on the loop's thread. */
#include "service/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "relay/clock/clock.h"
#include "service/hosts.h"
#include "service/status.h"

/* One host's figures for one scrape. */
struct host_figures {
  const tr_host *host;
  double producers;
  bool clock_synced;
  struct tr_host_clock clock;
  struct tr_host_buffer_losses buffers;
};

/* How a per-host family is also written for the whole fleet, without the host label. */
enum fleet_fold { FOLD_NONE, FOLD_SUM, FOLD_MAX };

/* A per-host family: the value of a host, or false to leave the host out; and its fleet-wide
 * family over every host known (written always, also when a scrape asks for no per-host
 * series). */
struct host_metric {
  const char *name, *type, *help;
  bool (*value)(const struct host_figures *f, double *v);
  enum fleet_fold fold;
  const char *fleet_name;
};

/* A summed fleet-wide family's name: tracerelay_host_X -> tracerelay_hosts_X. */
#define SUMMED(family) FOLD_SUM, "tracerelay_hosts_" family

#define STAT(field)                                                                               \
  static bool field(const struct host_figures *f, double *v) {                                    \
    *v = (double)f->host->stats.field;                                                            \
    return true;                                                                                  \
  }
STAT(bytes_received)
STAT(chunks_received)
STAT(batches_received)
STAT(link_lost_chunks)
STAT(link_lost_bytes)
STAT(agent_queue_dropped_chunks)
STAT(agent_queue_dropped_bytes)
STAT(agent_queue_dropped_packets)
STAT(agent_spill_dropped_chunks)
STAT(agent_spill_dropped_bytes)
STAT(agent_spill_dropped_packets)
STAT(agent_smb_full)
STAT(agent_abi_violations)
STAT(disconnects)
STAT(flushes_missed)
STAT(agent_exits_unclean)
STAT(replies_unexpected)
#undef STAT
static bool agent_smb_full_seconds(const struct host_figures *f, double *v) {
  *v = (double)f->host->stats.agent_smb_full_ns / 1e9;
  return true;
}

#define BUFFERS(field)                                                                            \
  static bool field(const struct host_figures *f, double *v) {                                    \
    *v = (double)f->buffers.field;                                                                \
    return true;                                                                                  \
  }
BUFFERS(chunks_overwritten)
BUFFERS(chunks_discarded)
BUFFERS(packets_lost_in_gaps)
BUFFERS(trace_writer_packet_loss)
BUFFERS(patches_failed)
BUFFERS(invalid_packets)
BUFFERS(abi_violations)
#undef BUFFERS

static bool connected(const struct host_figures *f, double *v) {
  *v = f->host->link != NULL;
  return true;
}

static bool producers(const struct host_figures *f, double *v) {
  *v = f->producers;
  return true;
}

static bool clock_offset(const struct host_figures *f, double *v) {
  *v = (double)f->clock.offset_ns / 1e9;
  return f->clock_synced;
}

static bool clock_drift(const struct host_figures *f, double *v) {
  *v = f->clock.drift_ppm / 1e6;
  return f->clock_synced;
}

static bool clock_rtt(const struct host_figures *f, double *v) {
  *v = (double)f->clock.rtt_ns / 1e9;
  return f->clock_synced;
}

static bool clock_exchanges(const struct host_figures *f, double *v) {
  *v = (double)f->clock.probes;
  return f->clock_synced;
}

static bool clock_bound(const struct host_figures *f, double *v) {
  *v = (double)f->clock.bound_ns / 1e9;
  return f->clock_synced && f->clock.bound_ns >= 0;
}

static const struct host_metric kHostMetrics[] = {
    {"tracerelay_host_connected", "gauge", "1 while the host's agent is connected", connected,
     FOLD_NONE, NULL},
    {"tracerelay_host_producers", "gauge", "producers reachable on the host now", producers,
     SUMMED("producers")},
    {"tracerelay_host_received_bytes_total", "counter", "chunk payload bytes received",
     bytes_received, SUMMED("received_bytes_total")},
    {"tracerelay_host_received_chunks_total", "counter", "chunks received", chunks_received,
     SUMMED("received_chunks_total")},
    {"tracerelay_host_received_batches_total", "counter", "batches received", batches_received,
     SUMMED("received_batches_total")},
    {"tracerelay_host_link_lost_chunks_total", "counter",
     "chunks lost on the link (batch sequence gaps)", link_lost_chunks,
     SUMMED("link_lost_chunks_total")},
    {"tracerelay_host_link_lost_bytes_total", "counter",
     "payload bytes of the chunks lost on the link", link_lost_bytes,
     SUMMED("link_lost_bytes_total")},
    {"tracerelay_host_agent_queue_dropped_chunks_total", "counter",
     "chunks the agent's queue had no room for", agent_queue_dropped_chunks,
     SUMMED("agent_queue_dropped_chunks_total")},
    {"tracerelay_host_agent_queue_dropped_bytes_total", "counter",
     "payload bytes of the chunks the agent's queue had no room for",
     agent_queue_dropped_bytes, SUMMED("agent_queue_dropped_bytes_total")},
    {"tracerelay_host_agent_queue_dropped_packets_total", "counter",
     "packets begun in the chunks the agent's queue had no room for",
     agent_queue_dropped_packets, SUMMED("agent_queue_dropped_packets_total")},
    {"tracerelay_host_agent_spill_dropped_chunks_total", "counter",
     "chunks dropped from the agent's spill queue", agent_spill_dropped_chunks,
     SUMMED("agent_spill_dropped_chunks_total")},
    {"tracerelay_host_agent_spill_dropped_bytes_total", "counter",
     "payload bytes of the chunks dropped from the agent's spill queue",
     agent_spill_dropped_bytes, SUMMED("agent_spill_dropped_bytes_total")},
    {"tracerelay_host_agent_spill_dropped_packets_total", "counter",
     "packets begun in the chunks dropped from the agent's spill queue",
     agent_spill_dropped_packets, SUMMED("agent_spill_dropped_packets_total")},
    {"tracerelay_host_agent_smb_full_total", "counter",
     "times a producer's shared memory was found full (loss events, packet count unknown)",
     agent_smb_full, SUMMED("agent_smb_full_total")},
    {"tracerelay_host_agent_smb_full_seconds_total", "counter",
     "how long producers' shared memory was full, at most (the time since the commit before "
     "each finding)",
     agent_smb_full_seconds, SUMMED("agent_smb_full_seconds_total")},
    {"tracerelay_host_agent_abi_violations_total", "counter",
     "commits and chunks refused at the agent's producer port", agent_abi_violations,
     SUMMED("agent_abi_violations_total")},
    {"tracerelay_host_disconnects_total", "counter", "times the host's link went down", disconnects,
     SUMMED("disconnects_total")},
    {"tracerelay_host_flushes_missed_total", "counter", "flushes the host did not answer in time",
     flushes_missed, SUMMED("flushes_missed_total")},
    {"tracerelay_host_agent_exits_unclean_total", "counter",
     "agent processes replaced without an orderly stop (loss events, packet count unknown)",
     agent_exits_unclean, SUMMED("agent_exits_unclean_total")},
    {"tracerelay_host_replies_unexpected_total", "counter",
     "CommandReplies for no command in flight, refused unheld (a misbehaving agent)",
     replies_unexpected, SUMMED("replies_unexpected_total")},
    {"tracerelay_host_session_chunks_overwritten", "gauge",
     "chunks of the host overwritten in RING_BUFFER central buffers (sessions now)",
     chunks_overwritten, SUMMED("session_chunks_overwritten")},
    {"tracerelay_host_session_chunks_discarded", "gauge",
     "chunks of the host a full DISCARD central buffer refused (sessions now)", chunks_discarded,
     SUMMED("session_chunks_discarded")},
    {"tracerelay_host_session_packets_lost_in_gaps", "gauge",
     "packets of the host cut by a lost chunk (sessions now)", packets_lost_in_gaps,
     SUMMED("session_packets_lost_in_gaps")},
    {"tracerelay_host_session_writer_packet_loss", "gauge",
     "packets its writers marked as dropped (sessions now)", trace_writer_packet_loss,
     SUMMED("session_writer_packet_loss")},
    {"tracerelay_host_session_patches_failed", "gauge",
     "patches that found no chunk to apply to (sessions now)", patches_failed,
     SUMMED("session_patches_failed")},
    {"tracerelay_host_session_invalid_packets", "gauge",
     "packets refused at read time as malformed (sessions now)", invalid_packets,
     SUMMED("session_invalid_packets")},
    {"tracerelay_host_session_abi_violations", "gauge",
     "chunks the central buffers refused as malformed (sessions now)", abi_violations,
     SUMMED("session_abi_violations")},
    {"tracerelay_host_clock_offset_seconds", "gauge",
     "service clock minus the host's (BOOTTIME), as the timeline maps it", clock_offset, FOLD_NONE,
     NULL},
    {"tracerelay_host_clock_drift_ratio", "gauge",
     "the drift of the service's clock minus the host's (-1e-6: the host's clock runs 1 ppm "
     "fast)",
     clock_drift, FOLD_NONE, NULL},
    {"tracerelay_host_clock_rtt_seconds", "gauge", "round trip of the best recent clock probe",
     clock_rtt, FOLD_NONE, NULL},
    {"tracerelay_host_clock_error_bound_seconds", "gauge",
     "clock error bound now: how far from its true instant the trace may place this host's "
     "next event (docs/timeline.md)",
     clock_bound, FOLD_MAX, "tracerelay_hosts_clock_error_bound_max_seconds"},
    {"tracerelay_host_clock_exchanges_total", "counter",
     "clock exchanges the host's estimator took (its own, or relayed by its regional)",
     clock_exchanges, SUMMED("clock_exchanges_total")},
};

static void service_gauge(tr_prom_text *t, const char *name, const char *type, const char *help,
                          double v) {
  tr_prom_family(t, name, type, help);
  tr_prom_sample(t, name, NULL, v);
}

/* hm's fleet-wide family: the sum, or the largest value, over the hosts that have one. */
static void write_fleet_family(const struct host_metric *hm, const struct host_figures *figs,
                               size_t num_hosts, tr_prom_text *t) {
  if (hm->fold == FOLD_NONE)
    return;
  double folded = 0;
  size_t with_value = 0;
  for (size_t i = 0; i < num_hosts; i++) {
    double v;
    if (!hm->value(&figs[i], &v))
      continue;
    if (hm->fold == FOLD_SUM)
      folded += v;
    else if (with_value == 0 || v > folded)
      folded = v;
    with_value++;
  }
  char help[320];
  snprintf(help, sizeof help, "%s: %s",
           hm->fold == FOLD_SUM ? "summed over every host known" : "the largest of any host",
           hm->help);
  tr_prom_family(t, hm->fleet_name, hm->type, help);
  if (hm->fold == FOLD_SUM || with_value > 0)
    tr_prom_sample(t, hm->fleet_name, NULL, folded);
}

void tr_metrics_write(const tr_service *svc, bool host_series, tr_prom_text *t) {
  size_t num_hosts = tr_hosts_count(svc->hosts);
  struct host_figures *figs = calloc(num_hosts + 1, sizeof *figs);
  if (!figs) {
    t->failed = true;
    return;
  }
  uint64_t boot_now = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &boot_now);
  size_t up = 0, i = 0;
  for (const tr_host *host = tr_hosts_first(svc->hosts); host; host = host->next) {
    struct host_figures *f = &figs[i++];
    f->host = host;
    up += f->host->link != NULL;
    for (size_t p = 0; p < f->host->num_producers; p++)
      f->producers += tr_hosts_producer_reachable(f->host, p);
    f->clock_synced = tr_status_host_clock(f->host, boot_now, &f->clock);
    for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
      tr_session_stats_add_host_losses(s, f->host, &f->buffers);
  }
  service_gauge(t, "tracerelay_service_hosts_connected", "gauge", "agents connected now",
                (double)up);
  service_gauge(t, "tracerelay_service_hosts_known", "gauge",
                "hosts in the host table: connected, held by a session, or gone and kept",
                (double)num_hosts);
  service_gauge(t, "tracerelay_service_hosts_retired_total", "counter",
                "hosts retired from the host table: gone, in no session, past the gone hosts "
                "it keeps",
                (double)tr_hosts_retired(svc->hosts));
  service_gauge(t, "tracerelay_service_buffer_memory_reserved_bytes", "gauge",
                "central buffer memory the sessions reserve: each one's buffers once per host",
                (double)svc->buffer_memory_reserved);
  service_gauge(t, "tracerelay_service_buffer_memory_budget_bytes", "gauge",
                "--max-buffer-memory (0: no budget)", (double)svc->max_buffer_memory);
  service_gauge(t, "tracerelay_service_sessions", "gauge", "tracing sessions now",
                (double)svc->num_sessions);
  service_gauge(t, "tracerelay_service_chunks_unknown_buffer_total", "counter",
                "chunks for a buffer no session owns", (double)svc->chunks_unknown_buffer);
  tr_prom_histogram_write(t, "tracerelay_flush_duration_seconds",
                          "flushes through every host with a producer to flush, from the request "
                          "to the last ack (or the timeout)",
                          &svc->flush_durations);
  tr_prom_histogram_write(t, "tracerelay_flush_service_seconds",
                          "of the flushes every producer answered, the service's own part: the "
                          "round trip less the time from the fan-out's end to the last ack's "
                          "arrival in the service's socket (the network's and the agents')",
                          &svc->flush_service_parts);
  for (size_t m = 0; m < sizeof kHostMetrics / sizeof kHostMetrics[0]; m++)
    write_fleet_family(&kHostMetrics[m], figs, num_hosts, t);
  for (size_t m = 0; host_series && m < sizeof kHostMetrics / sizeof kHostMetrics[0]; m++) {
    const struct host_metric *hm = &kHostMetrics[m];
    tr_prom_family(t, hm->name, hm->type, hm->help);
    for (i = 0; i < num_hosts; i++) {
      double v;
      if (hm->value(&figs[i], &v))
        tr_prom_sample(t, hm->name, figs[i].host->name, v);
    }
  }
  free(figs);
}

void tr_metrics_write_loop(const tr_loop_lag *lag, const struct tr_tls_uv_server_stats *tls,
                           tr_prom_text *t) {
  tr_prom_histogram_write(t, "tracerelay_service_loop_lag_seconds",
                          "busy time of each iteration of the service's event loop: the longest "
                          "an event arriving in it waited",
                          tr_loop_lag_histogram(lag));
  service_gauge(t, "tracerelay_service_loop_lag_max_seconds", "gauge",
                "the longest busy iteration of the event loop since the service started",
                (double)tr_loop_lag_max_ns(lag) / 1e9);
  service_gauge(t, "tracerelay_service_loop_stalls_total", "counter",
                "iterations of the event loop busy for a second or more (each logged, with the "
                "share of it the loop's thread was on a CPU)",
                (double)tr_loop_lag_stalls(lag).count);
  service_gauge(t, "tracerelay_service_tls_refused_total", "counter",
                "agent connections dropped before their TLS handshake finished (logged with "
                "the reason)",
                (double)tls->refused);
  service_gauge(t, "tracerelay_service_tls_refused_busy_total", "counter",
                "of them, refused for want of a TLS handshake slot in time (the agent comes "
                "back later; logged once per storm)",
                (double)tls->refused_busy);
  service_gauge(t, "tracerelay_service_tls_refused_source_total", "counter",
                "of them, refused because their address already had the most connections one "
                "address may have waiting for a handshake (logged once per address)",
                (double)tls->refused_source);
  service_gauge(t, "tracerelay_service_tls_handshakes_abandoned_total", "counter",
                "TLS handshakes begun that the peer left or let time out (work for nobody)",
                (double)tls->abandoned);
  service_gauge(t, "tracerelay_service_tls_handshake_steps_on_loop_total", "counter",
                "TLS handshake steps run on the event loop's thread (0: they all ran on workers)",
                (double)tls->steps_on_loop);
  service_gauge(t, "tracerelay_service_tls_handshake_steps_on_workers_total", "counter",
                "TLS handshake steps run on worker threads", (double)tls->steps_on_workers);
}

void tr_metrics_write_regional(const struct tr_regional_stats *st, tr_prom_text *t) {
  service_gauge(t, "tracerelay_regional_agents", "gauge",
                "agents connected to this regional (said Hello)", st->agents);
  service_gauge(t, "tracerelay_regional_agents_forwarded", "gauge",
                "of them, welcomed by the upstream: their frames flow both ways", st->forwarded);
  service_gauge(t, "tracerelay_regional_agents_held", "gauge",
                "of them, read no further until their upstream queue drains (backpressure)",
                st->held);
  service_gauge(t, "tracerelay_regional_received_from_agents_bytes_total", "counter",
                "bytes received from agents (TLS)", (double)st->bytes_from_agents);
  service_gauge(t, "tracerelay_regional_received_from_upstream_bytes_total", "counter",
                "bytes received from the upstream for the agents (their frames)",
                (double)st->bytes_from_upstream);
  service_gauge(t, "tracerelay_regional_upstream_lost_total", "counter",
                "agents' upstream links that closed under a connected agent",
                (double)st->upstream_lost);
  service_gauge(t, "tracerelay_regional_agents_relinking", "gauge",
                "of the agents, those whose link is kept while their upstream link is made "
                "again (after the upstream's restart)",
                st->relinking);
  service_gauge(t, "tracerelay_regional_relink_dropped_frames_total", "counter",
                "frames agents sent for an upstream link that had ended (their batches are "
                "resent, as after a broken link)",
                (double)st->relink_dropped_frames);
  service_gauge(t, "tracerelay_regional_carrier_up", "gauge",
                "1 while the one link to the upstream that carries every agent's link is up",
                st->carrier_up);
  service_gauge(t, "tracerelay_regional_upstream_session", "gauge",
                "1 while the upstream says a session runs there (the agents' clocks are probed "
                "at the session rate then)",
                st->upstream_session);
  if (st->upstream_drift_known)
    service_gauge(t, "tracerelay_regional_upstream_drift_ratio", "gauge",
                  "the drift of the upstream's clock minus this regional's, as the upstream "
                  "measures it (-1e-6: this regional's clock runs 1 ppm fast); the agents' "
                  "probes are paced by their drift against the upstream: theirs against this "
                  "regional plus this",
                  st->upstream_drift_ppm / 1e6);
  service_gauge(t, "tracerelay_regional_carrier_connects_total", "counter",
                "links to the upstream carrying the agents' links made (welcomed)",
                (double)st->carrier_connects);
  service_gauge(t, "tracerelay_regional_carrier_frames_total", "counter",
                "frames written to the upstream on the carrier, the agents' and its own",
                (double)st->carrier_frames_out);
  service_gauge(t, "tracerelay_regional_carrier_writes_total", "counter",
                "writes those frames went out in (several agents' frames share one)",
                (double)st->carrier_writes);
}
