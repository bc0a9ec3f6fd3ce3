/* packet_list.c: the service's packet lists (see packet_list.h). */
#include "service/packet_list.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

int tr_packet_list_reserve(tr_packet_list *l, size_t more) {
  if (l->cap - l->n >= more)
    return 0;
  size_t cap = l->cap ? l->cap : 16;
  while (cap - l->n < more)
    cap *= 2;
  tr_trace_writer_buf *g = realloc(l->items, cap * sizeof *g);
  if (!g)
    return TR_ERR_NOMEM;
  l->items = g;
  bool *p = realloc(l->pinned, cap * sizeof *p);
  if (!p)
    return TR_ERR_NOMEM;
  l->pinned = p;
  l->cap = cap;
  return 0;
}

void tr_packet_list_push(tr_packet_list *l, tr_trace_writer_buf b) {
  l->pinned[l->n] = false;
  l->items[l->n++] = b;
}

void tr_packet_list_push_pinned(tr_packet_list *l, tr_trace_writer_buf b) {
  l->pinned[l->n] = true;
  l->items[l->n++] = b;
}

void tr_packet_list_free(tr_packet_list *l) {
  for (size_t i = 0; i < l->n; i++)
    tr_trace_writer_buf_free(&l->items[i]);
  free(l->items);
  free(l->pinned);
  memset(l, 0, sizeof *l);
}

void tr_packet_list_thin(tr_packet_list *l) {
  size_t half = l->n / 2, kept = 0;
  for (size_t i = 0; i < l->n; i++) {
    if (i < half && i % 2 == 1 && !l->pinned[i]) {
      tr_trace_writer_buf_free(&l->items[i]);
      continue;
    }
    l->pinned[kept] = l->pinned[i];
    l->items[kept++] = l->items[i];
  }
  l->n = kept;
}
