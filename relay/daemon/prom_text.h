/* prom_text.h: the Prometheus text exposition format (version 0.0.4), written into a growable
 * buffer: a family's # HELP and # TYPE lines, then its samples, each with an optional label
 * (`host` unless said otherwise) whose value is escaped (backslash, double quote, newline) as
 * the format requires.
 * Pure: no I/O. An allocation failure sticks (tr_prom_text.failed) and later calls do nothing. */
#ifndef TR_PROM_TEXT_H
#define TR_PROM_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct tr_prom_text {
  char *buf;
  size_t len, cap;
  bool failed;
} tr_prom_text;

/* type: "counter", "gauge" or "histogram". help: one line, no backslash or newline. */
void tr_prom_family(tr_prom_text *t, const char *name, const char *type, const char *help);
/* One sample of the family just started; host NULL for none. */
void tr_prom_sample(tr_prom_text *t, const char *name, const char *host, double value);
/* The same with a label of another name (a Prometheus label name, not escaped); label_value
 * NULL for none. */
void tr_prom_sample_label(tr_prom_text *t, const char *name, const char *label,
                          const char *label_value, double value);
void tr_prom_text_free(tr_prom_text *t);

/* A histogram with fixed upper bounds le[0] < le[1] < ... (an implicit +Inf bucket after). */
#define TR_PROM_HISTOGRAM_MAX_BUCKETS 16
typedef struct tr_prom_histogram {
  const double *le;
  size_t n; /* at most TR_PROM_HISTOGRAM_MAX_BUCKETS */
  uint64_t in_bucket[TR_PROM_HISTOGRAM_MAX_BUCKETS + 1]; /* (le[i-1], le[i]]; [n]: above le[n-1] */
  uint64_t count;
  double sum;
} tr_prom_histogram;

void tr_prom_histogram_observe(tr_prom_histogram *h, double value);
/* The whole family: # HELP/# TYPE histogram, NAME_bucket{le="..."} (cumulative, +Inf last),
 * NAME_sum and NAME_count. */
void tr_prom_histogram_write(tr_prom_text *t, const char *name, const char *help,
                             const tr_prom_histogram *h);

#endif
