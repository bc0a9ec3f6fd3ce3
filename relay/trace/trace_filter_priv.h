/* trace_filter_priv.h: the inside of relay/trace/trace_filter (trace_filter.c and
 * trace_filter_string.c only): the string filter chain that the bytecode walker calls on each
 * "filter_string" field it lets through. */
#ifndef TR_TRACE_FILTER_PRIV_H
#define TR_TRACE_FILTER_PRIV_H

#include <regex.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/trace/trace_filter.h"

typedef struct tr_trace_filter_srule {
  int policy;
  regex_t full;   /* ^(pattern)$: whole-string matches, the pattern's groups from 2 on */
  regex_t search; /* the pattern as given, for the repeated search policy only */
  bool has_search;
  char *prefix;
  size_t prefix_len;
  char *name;
  uint64_t types[2]; /* semantic type bitmask, bit t for type t < 128 */
} tr_trace_filter_srule;

typedef struct tr_trace_filter_chain {
  tr_trace_filter_srule *rules;
  size_t n, cap;
  regmatch_t *m; /* match scratch, room for the largest rule's groups */
  size_t m_cap;
  char *copy; /* the string being filtered, NUL-terminated */
  size_t copy_cap;
} tr_trace_filter_chain;

int tr_trace_filter_string_add(tr_trace_filter_chain *c, const tr_trace_filter_rule *r,
                               char *err, size_t err_len);
bool tr_trace_filter_string_apply(tr_trace_filter_chain *c, char *s, size_t len,
                                  uint32_t semantic_type);
void tr_trace_filter_string_free(tr_trace_filter_chain *c);

#endif
