/* metrics_http.h: the daemons' HTTP endpoint for Prometheus and Kubernetes (--metrics-listen):
 * GET /metrics (text exposition format; `?hosts=none` leaves the per-host series out,
 * `?hosts=all` is the default), /healthz (200 while the loop runs) and /readyz (200 when the
 * daemon says it is ready, else 503 with the reason). Anything else is 404, any method but GET
 * and HEAD 405, a hosts= value other than those two 400.
 *
 * HTTP is libmicrohttpd's (Debian's libmicrohttpd), run inside the caller's libuv loop with no
 * thread of its own: MHD's epoll fd is watched with uv_poll and MHD_run is called on the loop's
 * thread, so the render and readiness callbacks run there too and may read the daemon's state
 * freely; nothing else touches it. Bounded: 256 connections, 8 from one address (more are
 * closed at once), 10 s idle timeout: slow clients from a few addresses cannot keep the
 * probes out. The endpoint has no authentication: bind it to the pod's or host's own address
 * and let a NetworkPolicy or firewall say who reaches it (docs/operations.md). */
#ifndef TR_METRICS_HTTP_H
#define TR_METRICS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "relay/daemon/prom_text.h"

/* What a scrape of /metrics asked for. */
struct tr_metrics_request {
  /* false for /metrics?hosts=none: the per-host series (label `host`) left out, the fleet-wide
   * ones kept (a daemon without per-host series ignores it). */
  bool host_series;
};

struct tr_metrics_handlers {
  void *data;
  void (*render)(void *data, const struct tr_metrics_request *req, tr_prom_text *out);
  /* NULL when ready, else why not (static text). */
  const char *(*not_ready)(void *data);
};

typedef struct tr_metrics_http tr_metrics_http;

/* listen: IPADDR:PORT (an IPv4 or IPv6 literal; port 0 picks one). 0, or TR_ERR_CONFIG with the
 * reason in err (bad address, port in use, ...). */
int tr_metrics_http_start(uv_loop_t *loop, const char *listen, const struct tr_metrics_handlers *h,
                          tr_metrics_http **out, char *err, size_t errlen);
/* The port it listens on. */
unsigned tr_metrics_http_port(const tr_metrics_http *m);
/* Stops serving and frees it once its handles closed; then done(data) (may be NULL). */
void tr_metrics_http_close(tr_metrics_http *m, void (*done)(void *data), void *data);

#endif
