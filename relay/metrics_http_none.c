/* metrics_http_none.c: metrics_http.h in a static build (-DTR_STATIC=ON), which has no HTTP
 * library: --metrics-listen is refused, saying why. */
#include <stdio.h>

#include "relay/metrics_http.h"
#include "relay/tr_error.h"

int tr_metrics_http_start(uv_loop_t *loop, const char *listen, const struct tr_metrics_handlers *h,
                          tr_metrics_http **out, char *err, size_t errlen) {
  (void)loop;
  (void)h;
  (void)out;
  snprintf(err, errlen, "cannot serve metrics on %s: this is a static build (-DTR_STATIC=ON), "
                        "which has no HTTP library; use the Debian package or a default build",
           listen);
  return TR_ERR_CONFIG;
}

unsigned tr_metrics_http_port(const tr_metrics_http *m) {
  (void)m;
  return 0;
}

void tr_metrics_http_close(tr_metrics_http *m, void (*done)(void *data), void *data) {
  (void)m;
  if (done)
    done(data);
}
