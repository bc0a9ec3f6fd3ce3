/* metrics.c: the service's Prometheus metrics (--metrics-listen, relay/metrics_http.h): hosts
 * connected, sessions, and per host (label `host`, the machine name) its producers, traffic,
 * every loss counter of the trace's HostStats, disconnects, and its clock mapping (offset,
 * drift, probe RTT, error bound now), and the losses of its central buffers in the sessions
 * that exist now. Read on the loop's thread, like status.c. */
#include "service/metrics.h"

#include "relay/clock.h"
#include "relay/clocksync.h"
#include "relay/trace_buffer.h"
#include "service/session.h"

/* A per-host counter or gauge: one family, one sample per host. */
struct host_metric {
  const char *name, *type, *help;
  double (*value)(const tr_host *h);
};

#define STAT(field) static double field(const tr_host *h) { return (double)h->stats.field; }
STAT(bytes_received)
STAT(chunks_received)
STAT(batches_received)
STAT(link_lost_chunks)
STAT(agent_queue_dropped_chunks)
STAT(agent_spill_dropped_chunks)
STAT(agent_smb_full)
STAT(agent_abi_violations)
STAT(disconnects)
STAT(flushes_missed)
#undef STAT

static double connected(const tr_host *h) { return h->link != NULL; }

static double producers(const tr_host *h) {
  size_t n = 0;
  for (size_t i = 0; i < h->num_producers; i++)
    n += tr_host_producer_reachable(h, i);
  return (double)n;
}

static const struct host_metric kHostMetrics[] = {
    {"tracerelay_host_connected", "gauge", "1 while the host's agent is connected", connected},
    {"tracerelay_host_producers", "gauge", "producers reachable on the host now", producers},
    {"tracerelay_host_received_bytes_total", "counter", "chunk payload bytes received",
     bytes_received},
    {"tracerelay_host_received_chunks_total", "counter", "chunks received", chunks_received},
    {"tracerelay_host_received_batches_total", "counter", "batches received", batches_received},
    {"tracerelay_host_link_lost_chunks_total", "counter",
     "chunks lost on the link (batch sequence gaps)", link_lost_chunks},
    {"tracerelay_host_agent_queue_dropped_chunks_total", "counter",
     "chunks the agent's queue had no room for", agent_queue_dropped_chunks},
    {"tracerelay_host_agent_spill_dropped_chunks_total", "counter",
     "chunks dropped from the agent's spill queue", agent_spill_dropped_chunks},
    {"tracerelay_host_agent_smb_full_total", "counter",
     "times a producer's shared memory was found full (loss events, packet count unknown)",
     agent_smb_full},
    {"tracerelay_host_agent_abi_violations_total", "counter",
     "commits and chunks refused at the agent's producer port", agent_abi_violations},
    {"tracerelay_host_disconnects_total", "counter", "times the host's link went down",
     disconnects},
    {"tracerelay_host_flushes_missed_total", "counter",
     "flushes the host did not answer in time", flushes_missed},
};

/* The host's central buffers' losses, summed over the sessions that exist now. */
struct buffer_losses {
  double overwritten, discarded, lost_in_gaps;
};

static struct buffer_losses buffer_losses_of(const tr_service *svc, const tr_host *host) {
  struct buffer_losses l = {0};
  for (const tr_session *s = svc->sessions; s; s = s->next)
    for (size_t h = 0; h < s->num_hosts; h++) {
      const tr_session_host *sh = &s->hosts[h];
      for (size_t b = 0; sh->host == host && sh->tbufs && b < s->num_buffers; b++) {
        tr_tbuf_stats st;
        if (!sh->tbufs[b])
          continue;
        tr_tbuf_get_stats(sh->tbufs[b], &st);
        l.overwritten += (double)st.chunks_overwritten;
        l.discarded += (double)st.chunks_discarded;
        l.lost_in_gaps += (double)st.packets_lost_in_gaps;
      }
    }
  return l;
}

static void buffer_family(tr_prom_text *t, const tr_service *svc, const char *name,
                          const char *help, int which) {
  tr_prom_family(t, name, "gauge", help);
  for (size_t i = 0; i < svc->num_hosts; i++) {
    struct buffer_losses l = buffer_losses_of(svc, svc->hosts[i]);
    double v[] = {l.overwritten, l.discarded, l.lost_in_gaps};
    tr_prom_sample(t, name, svc->hosts[i]->name, v[which]);
  }
}

/* The clock mapping's figures in seconds; false before the first probe. */
struct clock_figures {
  double offset_s, drift_ratio, rtt_s, bound_s;
};

static bool clock_of(const tr_host *h, uint64_t boot_now, struct clock_figures *c) {
  struct tr_clocksync_stats cs;
  if (!h->clock)
    return false;
  tr_clocksync_get_stats(h->clock, &cs);
  if (cs.probes == 0)
    return false;
  int64_t offset = tr_clocksync_offset_ns(h->clock);
  int64_t host_now = (int64_t)boot_now - offset;
  int64_t bound = tr_clocksync_error_bound(h->clock, host_now > 0 ? host_now : 0);
  c->offset_s = (double)offset / 1e9;
  c->drift_ratio = tr_clocksync_drift_ppm(h->clock) / 1e6;
  c->rtt_s = (double)tr_clocksync_rtt_ns(h->clock) / 1e9;
  c->bound_s = bound >= 0 ? (double)bound / 1e9 : -1;
  return true;
}

static void clock_family(tr_prom_text *t, const tr_service *svc, uint64_t boot_now,
                         const char *name, const char *help, int which) {
  tr_prom_family(t, name, "gauge", help);
  for (size_t i = 0; i < svc->num_hosts; i++) {
    struct clock_figures c;
    if (!clock_of(svc->hosts[i], boot_now, &c))
      continue;
    double v[] = {c.offset_s, c.drift_ratio, c.rtt_s, c.bound_s};
    if (v[which] >= 0 || which < 2)
      tr_prom_sample(t, name, svc->hosts[i]->name, v[which]);
  }
}

void tr_service_metrics(const tr_service *svc, tr_prom_text *t) {
  tr_prom_family(t, "tracerelay_service_hosts_connected", "gauge", "agents connected now");
  size_t up = 0;
  for (size_t i = 0; i < svc->num_hosts; i++)
    up += svc->hosts[i]->link != NULL;
  tr_prom_sample(t, "tracerelay_service_hosts_connected", NULL, (double)up);
  tr_prom_family(t, "tracerelay_service_hosts_known", "gauge",
                 "hosts seen since the service started");
  tr_prom_sample(t, "tracerelay_service_hosts_known", NULL, (double)svc->num_hosts);
  tr_prom_family(t, "tracerelay_service_sessions", "gauge", "tracing sessions now");
  tr_prom_sample(t, "tracerelay_service_sessions", NULL, (double)svc->num_sessions);
  tr_prom_family(t, "tracerelay_service_chunks_unknown_buffer_total", "counter",
                 "chunks for a buffer no session owns");
  tr_prom_sample(t, "tracerelay_service_chunks_unknown_buffer_total", NULL,
                 (double)svc->chunks_unknown_buffer);
  for (size_t m = 0; m < sizeof kHostMetrics / sizeof kHostMetrics[0]; m++) {
    const struct host_metric *hm = &kHostMetrics[m];
    tr_prom_family(t, hm->name, hm->type, hm->help);
    for (size_t i = 0; i < svc->num_hosts; i++)
      tr_prom_sample(t, hm->name, svc->hosts[i]->name, hm->value(svc->hosts[i]));
  }
  buffer_family(t, svc, "tracerelay_host_session_chunks_overwritten",
                "chunks of the host overwritten in RING_BUFFER central buffers (sessions now)", 0);
  buffer_family(t, svc, "tracerelay_host_session_chunks_discarded",
                "chunks of the host a full DISCARD central buffer refused (sessions now)", 1);
  buffer_family(t, svc, "tracerelay_host_session_packets_lost_in_gaps",
                "packets of the host cut by a lost chunk (sessions now)", 2);
  uint64_t boot_now = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &boot_now);
  clock_family(t, svc, boot_now, "tracerelay_host_clock_offset_seconds",
               "service clock minus the host's (BOOTTIME), as the timeline maps it", 0);
  clock_family(t, svc, boot_now, "tracerelay_host_clock_drift_ratio",
               "the host's clock rate relative to the service's, minus 1", 1);
  clock_family(t, svc, boot_now, "tracerelay_host_clock_rtt_seconds",
               "round trip of the best recent clock probe", 2);
  clock_family(t, svc, boot_now, "tracerelay_host_clock_error_bound_seconds",
               "bound of the mapping's error now (docs/timeline.md)", 3);
}
