/* cert_expiry.h: certificates seen before they expire. A fleet issued in one batch expires in
 * one batch, and a daemon only fails at its next handshake; so each daemon names the
 * certificates it holds (its own, the CA, its peers') and this module says in its log how long
 * they have left, once that is TR_CERT_EXPIRY_WARN_DAYS or fewer (a warning) and
 * TR_CERT_EXPIRY_URGENT_DAYS or fewer (an error line), at start, on every reload and once a
 * day while it runs (tr_cert_expiry_timer); and writes them for Prometheus as
 * tracerelay_tls_certificate_expiry_timestamp_seconds{cert="whose"}.
 * Times are Unix seconds. The timer runs on the daemon's loop. */
#ifndef TR_CERT_EXPIRY_H
#define TR_CERT_EXPIRY_H

#include <stdint.h>
#include <uv.h>

#include "relay/daemon/prom_text.h"

#define TR_CERT_EXPIRY_WARN_DAYS 30
#define TR_CERT_EXPIRY_URGENT_DAYS 7
#define TR_CERT_EXPIRY_METRIC "tracerelay_tls_certificate_expiry_timestamp_seconds"

/* Whole days from now until not_after (negative once it passed). */
int64_t tr_cert_expiry_days_left(int64_t not_after, int64_t now);
/* Logs, under comp, how long `what` (e.g. "certificate /etc/tracerelay/service.crt") has left
 * if that is TR_CERT_EXPIRY_WARN_DAYS or fewer; nothing otherwise. */
void tr_cert_expiry_check(const char *comp, const char *what, int64_t not_after, int64_t now);

/* The metric's # HELP and # TYPE lines, then one sample per certificate (whose: a label value
 * such as "service", "ca", "peers"). */
void tr_cert_expiry_metric_family(tr_prom_text *t);
void tr_cert_expiry_metric(tr_prom_text *t, const char *whose, int64_t not_after);

/* Calls check(data) once a day (the daemon checks at start and reload itself). The timer does
 * not keep the loop alive. */
typedef struct tr_cert_expiry_timer tr_cert_expiry_timer;
int tr_cert_expiry_timer_start(uv_loop_t *loop, void (*check)(void *data), void *data,
                               tr_cert_expiry_timer **out);
/* Stops it; it is freed once the loop has closed it. NULL is ignored. */
void tr_cert_expiry_timer_stop(tr_cert_expiry_timer *t);

#endif
