/* agent_metrics.c: the agent's Prometheus metrics: the link's state and how often it came up, the
 * producers connected, how full the chunk queue and the spill queue are, and the agent's loss
 * counters (the same figures the trace's HostStats carry for this host), its producers'
 * triggers sent and lost; and when its certificate and the CA's expire. */
#include "agent/agent_metrics.h"

#include "relay/daemon/cert_expiry.h"

static void one(tr_prom_text *t, const char *name, const char *type, const char *help,
                double value) {
  tr_prom_family(t, name, type, help);
  tr_prom_sample(t, name, NULL, value);
}

void tr_agent_metrics_write(tr_prom_text *t, const tr_link_client *lc, const tr_chunkq *queue,
                            size_t outbox_bytes, size_t producers,
                            const tr_agent_triggers *triggers, const tr_tls_config *tls) {
  struct tr_link_client_totals tot;
  tr_link_client_totals(lc, &tot);
  const tr_relay_agent *spill = tr_link_client_spill(lc);
  one(t, "tracerelay_agent_link_up", "gauge", "1 while the link to the service is up (Welcomed)",
      tr_link_client_connected(lc));
  one(t, "tracerelay_agent_link_connects_total", "counter",
      "times the link came up (the first connection and every reconnection)", (double)tot.welcomes);
  one(t, "tracerelay_agent_link_upstream_losses_total", "counter",
      "times the agent's regional lost its upstream link for it and the agent said Hello again "
      "on the same connection (no reconnection)",
      (double)tot.upstream_losses);
  one(t, "tracerelay_agent_producers", "gauge", "producers connected to the producer socket",
      (double)producers);
  one(t, "tracerelay_agent_queue_bytes", "gauge", "bytes waiting in the chunk queue",
      (double)queue->bytes);
  one(t, "tracerelay_agent_outbox_bytes", "gauge",
      "bytes the producer-port thread copied out of shared memory, not yet in the chunk queue",
      (double)outbox_bytes);
  one(t, "tracerelay_agent_queue_max_bytes", "gauge", "the chunk queue's bound (--queue-mb)",
      (double)queue->max_bytes);
  one(t, "tracerelay_agent_spill_bytes", "gauge",
      "bytes of batches sent and not yet acknowledged (the spill queue)", (double)spill->held_bytes);
  one(t, "tracerelay_agent_spill_max_bytes", "gauge", "the spill queue's bound (--spill-mb)",
      (double)spill->spill_bytes);
  one(t, "tracerelay_agent_queue_dropped_chunks_total", "counter",
      "chunks the chunk queue had no room for", (double)queue->total.chunks);
  one(t, "tracerelay_agent_spill_dropped_chunks_total", "counter",
      "chunks dropped from the spill queue", (double)tot.spill_dropped_chunks);
  one(t, "tracerelay_agent_smb_full_total", "counter",
      "times a producer's shared memory was found full (loss events, packet count unknown)",
      (double)tot.smb_full);
  one(t, "tracerelay_agent_smb_full_seconds_total", "counter",
      "how long producers' shared memory was full, at most (the time since the commit before "
      "each one that found it full)",
      (double)tot.smb_full_ns / 1e9);
  one(t, "tracerelay_agent_abi_violations_total", "counter",
      "commits and chunks refused at the producer port", (double)tot.abi_violations);
  one(t, "tracerelay_agent_triggers_sent_total", "counter",
      "producers' triggers (ActivateTriggers) sent to the service", (double)triggers->sent);
  one(t, "tracerelay_agent_triggers_lost_total", "counter",
      "producers' triggers never sent: more than 16 while the link was down, a service (or "
      "regional) that takes none, a name over 256 bytes (the log says which)",
      (double)triggers->dropped);
  /* Last: a regional's metrics_more goes on with this family (agent.h). */
  tr_cert_expiry_metric_family(t);
  tr_cert_expiry_metric(t, "agent", tr_tls_config_cert_expiry(tls));
  tr_cert_expiry_metric(t, "ca", tr_tls_config_ca_expiry(tls));
}
