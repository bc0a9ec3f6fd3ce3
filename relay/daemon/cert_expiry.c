/* cert_expiry.c: the daemons' certificate expiry warnings, metric and daily check (see
 * cert_expiry.h). */
#include "relay/daemon/cert_expiry.h"

#include <stdlib.h>
#include <time.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define DAY_S 86400
#define DAY_MS (DAY_S * 1000ull)

struct tr_cert_expiry_timer {
  uv_timer_t timer;
  void (*check)(void *data);
  void *data;
};

int64_t tr_cert_expiry_days_left(int64_t not_after, int64_t now) {
  int64_t left = not_after - now;
  return left >= 0 ? left / DAY_S : -((-left + DAY_S - 1) / DAY_S);
}

void tr_cert_expiry_check(const char *comp, const char *what, int64_t not_after, int64_t now) {
  int64_t days = tr_cert_expiry_days_left(not_after, now);
  if (days > TR_CERT_EXPIRY_WARN_DAYS)
    return;
  char when[32];
  struct tm tm;
  time_t t = (time_t)not_after;
  strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime_r(&t, &tm));
  if (not_after <= now)
    TR_ERROR(comp, "%s EXPIRED on %s: peers refuse it; issue a new one with certs/make-certs.sh "
             "and reload (SIGHUP)", what, when);
  else if (days <= TR_CERT_EXPIRY_URGENT_DAYS)
    TR_ERROR(comp, "%s expires in %lld days (%s), %d or fewer: issue a new one with "
             "certs/make-certs.sh and reload (SIGHUP) now", what, (long long)days, when,
             TR_CERT_EXPIRY_URGENT_DAYS);
  else
    TR_WARN(comp, "%s expires in %lld days (%s), %d or fewer: issue a new one with "
            "certs/make-certs.sh and reload (SIGHUP)", what, (long long)days, when,
            TR_CERT_EXPIRY_WARN_DAYS);
}

void tr_cert_expiry_metric_family(tr_prom_text *t) {
  tr_prom_family(t, TR_CERT_EXPIRY_METRIC, "gauge",
                 "when a TLS certificate stops being valid (Unix seconds): cert=\"service\" or "
                 "\"agent\" this daemon's own, \"ca\" the CA's, \"peers\" the earliest of the "
                 "peers connected now, \"crl\" the --crl's next update");
}

void tr_cert_expiry_metric(tr_prom_text *t, const char *whose, int64_t not_after) {
  tr_prom_sample_label(t, TR_CERT_EXPIRY_METRIC, "cert", whose, (double)not_after);
}

static void on_timer(uv_timer_t *h) {
  tr_cert_expiry_timer *t = h->data;
  t->check(t->data);
}

int tr_cert_expiry_timer_start(uv_loop_t *loop, void (*check)(void *data), void *data,
                               tr_cert_expiry_timer **out) {
  tr_cert_expiry_timer *t = calloc(1, sizeof *t);
  if (t == NULL)
    return TR_ERR_NOMEM;
  t->check = check;
  t->data = data;
  uv_timer_init(loop, &t->timer);
  t->timer.data = t;
  uv_timer_start(&t->timer, on_timer, DAY_MS, DAY_MS);
  uv_unref((uv_handle_t *)&t->timer);
  *out = t;
  return 0;
}

static void on_closed(uv_handle_t *h) { free(h->data); }

void tr_cert_expiry_timer_stop(tr_cert_expiry_timer *t) {
  if (t != NULL)
    uv_close((uv_handle_t *)&t->timer, on_closed);
}
