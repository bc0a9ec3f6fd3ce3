/* metrics.h: the service's Prometheus metrics (metrics.c), for relay/daemon/metrics_http.h. */
#ifndef TR_SERVICE_METRICS_H
#define TR_SERVICE_METRICS_H

#include "relay/daemon/loop_lag.h"
#include "relay/daemon/prom_text.h"
#include "relay/link/tls_uv.h"
#include "service/regional.h"
#include "service/session.h"

/* Writes the metrics of svc (docs/operations.md, "Metrics") into t: the service-wide and
 * fleet-wide families always, the per-host ones (label `host`) when host_series (a scrape of
 * /metrics?hosts=none asks for none: 30 series a host are 19 MB at 10,000 hosts). */
void tr_metrics_write(const tr_service *svc, bool host_series, tr_prom_text *t);
/* The service process's own figures: how long its loop kept events waiting, and the agents'
 * TLS handshakes (refused, and where their steps ran). */
void tr_metrics_write_loop(const tr_loop_lag *lag, const struct tr_tls_uv_server_stats *tls,
                           tr_prom_text *t);
/* A regional's forwarding (its /metrics are its own agent's, with these after them). */
void tr_metrics_write_regional(const struct tr_regional_stats *st, tr_prom_text *t);

#endif
