/* prom_text.c: the Prometheus text exposition writer (prom_text.h). */
#include "relay/daemon/prom_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for len more bytes and the NUL after them: false (and t->failed) when there is none. */
static bool reserve(tr_prom_text *t, size_t len) {
  if (t->failed)
    return false;
  if (t->len + len < t->cap)
    return true;
  size_t cap = t->cap ? t->cap : 4096;
  while (cap <= t->len + len)
    cap *= 2;
  char *grown = realloc(t->buf, cap);
  if (!grown) {
    t->failed = true;
    return false;
  }
  t->buf = grown;
  t->cap = cap;
  return true;
}

static void put(tr_prom_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tr_prom_text *t, const char *fmt, ...) {
  for (size_t room = 0; reserve(t, room);) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if (t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    room = (size_t)n; /* too little room: grow, then again */
  }
}

void tr_prom_family(tr_prom_text *t, const char *name, const char *type, const char *help) {
  put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Appends len bytes as they are. */
static void put_bytes(tr_prom_text *t, const char *s, size_t len) {
  if (!reserve(t, len))
    return;
  memcpy(t->buf + t->len, s, len);
  t->len += len;
  t->buf[t->len] = '\0';
}

static void put_str(tr_prom_text *t, const char *s) { put_bytes(t, s, strlen(s)); }

/* " <v>\n" in decimal, without printf (most samples are whole numbers). */
static void put_integer_line(tr_prom_text *t, long long v) {
  char digits[24];
  size_t at = sizeof digits;
  digits[--at] = '\n';
  unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  do
    digits[--at] = (char)('0' + u % 10);
  while ((u /= 10) != 0);
  if (v < 0)
    digits[--at] = '-';
  digits[--at] = ' ';
  put_bytes(t, digits + at, sizeof digits - at);
}

/* The value escaped; runs without a character to escape go in one piece (a scrape of 10,000
 * hosts writes 300,000 labels on the loop's thread). */
static void put_label_value(tr_prom_text *t, const char *v) {
  for (;;) {
    size_t plain = strcspn(v, "\\\"\n");
    put_bytes(t, v, plain);
    v += plain;
    if (!*v)
      return;
    put_str(t, *v == '\n' ? "\\n" : *v == '\\' ? "\\\\" : "\\\"");
    v++;
  }
}

void tr_prom_sample(tr_prom_text *t, const char *name, const char *host, double value) {
  tr_prom_sample_label(t, name, "host", host, value);
}

void tr_prom_sample_label(tr_prom_text *t, const char *name, const char *label,
                          const char *label_value, double value) {
  put_str(t, name);
  if (label_value) {
    put_str(t, "{");
    put_str(t, label);
    put_str(t, "=\"");
    put_label_value(t, label_value);
    put_str(t, "\"}");
  }
  if (isnan(value))
    put_str(t, " NaN\n");
  else if (isinf(value))
    put_str(t, value > 0 ? " +Inf\n" : " -Inf\n");
  else if (value == (double)(long long)value && fabs(value) < 9e15)
    put_integer_line(t, (long long)value);
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
