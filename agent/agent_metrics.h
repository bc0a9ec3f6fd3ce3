/* agent_metrics.h: the agent's Prometheus metrics (--metrics-listen, relay/daemon/metrics_http.h). */
#ifndef TR_AGENT_METRICS_H
#define TR_AGENT_METRICS_H

#include <stddef.h>

#include "agent/agent_triggers.h"
#include "agent/link_client.h"
#include "relay/link/tls.h"
#include "relay/producer/chunk_queue.h"
#include "relay/daemon/prom_text.h"

/* Writes the agent's metrics (docs/operations.md#metrics) from its link, its chunk queue, the
 * bytes in the producer-port thread's outbox (agent/port_thread.h), the number of producers
 * connected, its producers' triggers sent and lost, and its TLS configuration (its
 * certificate's and the CA's expiry, the family
 * tracerelay_tls_certificate_expiry_timestamp_seconds, written last). */
void tr_agent_metrics_write(tr_prom_text *t, const tr_link_client *lc, const tr_chunkq *queue,
                            size_t outbox_bytes, size_t producers,
                            const tr_agent_triggers *triggers, const tr_tls_config *tls);

#endif
