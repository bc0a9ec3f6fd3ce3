/* prom_text.h: the Prometheus text exposition format (version 0.0.4), written into a growable
 * buffer: a family's # HELP and # TYPE lines, then its samples, each with an optional `host`
 * label whose value is escaped (backslash, double quote, newline) as the format requires.
 * Pure: no I/O. An allocation failure sticks (tr_prom_text.failed) and later calls do nothing. */
#ifndef TR_PROM_TEXT_H
#define TR_PROM_TEXT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tr_prom_text {
  char *buf;
  size_t len, cap;
  bool failed;
} tr_prom_text;

/* type: "counter" or "gauge". help: one line, no backslash or newline. */
void tr_prom_family(tr_prom_text *t, const char *name, const char *type, const char *help);
/* One sample of the family just started; host NULL for none. */
void tr_prom_sample(tr_prom_text *t, const char *name, const char *host, double value);
void tr_prom_text_free(tr_prom_text *t);

#endif
