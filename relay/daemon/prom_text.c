/* prom_text.c: the Prometheus text exposition writer (prom_text.h). */
#include "relay/daemon/prom_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void put(tr_prom_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tr_prom_text *t, const char *fmt, ...) {
  if (t->failed)
    return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap : 4096;
    while (cap <= t->len + (size_t)n)
      cap *= 2;
    char *grown = realloc(t->buf, cap);
    if (!grown) {
      t->failed = true;
      return;
    }
    t->buf = grown;
    t->cap = cap;
  }
}

void tr_prom_family(tr_prom_text *t, const char *name, const char *type, const char *help) {
  put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_label_value(tr_prom_text *t, const char *v) {
  for (; *v; v++) {
    if (*v == '\\' || *v == '"')
      put(t, "\\%c", *v);
    else if (*v == '\n')
      put(t, "\\n");
    else
      put(t, "%c", *v);
  }
}

void tr_prom_sample(tr_prom_text *t, const char *name, const char *host, double value) {
  put(t, "%s", name);
  if (host) {
    put(t, "{host=\"");
    put_label_value(t, host);
    put(t, "\"}");
  }
  if (isnan(value))
    put(t, " NaN\n");
  else if (isinf(value))
    put(t, value > 0 ? " +Inf\n" : " -Inf\n");
  else if (value == (double)(long long)value && fabs(value) < 9e15)
    put(t, " %lld\n", (long long)value);
  else
    put(t, " %.9g\n", value);
}

void tr_prom_histogram_observe(tr_prom_histogram *h, double value) {
  size_t i = 0;
  while (i < h->n && value > h->le[i])
    i++;
  h->in_bucket[i]++;
  h->count++;
  h->sum += value;
}

void tr_prom_histogram_write(tr_prom_text *t, const char *name, const char *help,
                             const tr_prom_histogram *h) {
  tr_prom_family(t, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= h->n; i++) {
    cumulative += h->in_bucket[i];
    if (i < h->n)
      put(t, "%s_bucket{le=\"%.9g\"} %llu\n", name, h->le[i], (unsigned long long)cumulative);
    else
      put(t, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cumulative);
  }
  put(t, "%s_sum %.9g\n%s_count %llu\n", name, h->sum, name, (unsigned long long)h->count);
}

void tr_prom_text_free(tr_prom_text *t) {
  free(t->buf);
  *t = (tr_prom_text){0};
}
