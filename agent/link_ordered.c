/* link_ordered.c: frames that follow the data queued before them (see link_ordered.h). */
#include "agent/link_ordered.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

int tr_link_ordered_push(tr_link_ordered *q, const struct tr_link_ordered_frame *what,
                         uint64_t wait_qseq, bool batched, uint64_t after_seq) {
  if (q->n >= TR_LINK_MAX_PENDING_FRAMES)
    return TR_ERR_FULL;
  struct tr_link_ordered_frame *p = calloc(1, sizeof *p);
  if (p == NULL || (what->error != NULL && (p->error = strdup(what->error)) == NULL)) {
    free(p);
    return TR_ERR_NOMEM;
  }
  p->gone_producer_id = what->gone_producer_id;
  p->request_id = what->request_id;
  p->wait_qseq = wait_qseq;
  p->resolved = batched;
  p->after_seq = after_seq;
  if (q->tail != NULL)
    q->tail->next = p;
  else
    q->head = p;
  q->tail = p;
  q->n++;
  return 0;
}

void tr_link_ordered_resolve(tr_link_ordered *q, uint64_t batched_qseq, uint64_t last_seq) {
  for (struct tr_link_ordered_frame *p = q->head; p != NULL; p = p->next)
    if (!p->resolved && p->wait_qseq <= batched_qseq) {
      p->resolved = true;
      p->after_seq = last_seq;
    }
}

const struct tr_link_ordered_frame *tr_link_ordered_ready(const tr_link_ordered *q) {
  return q->head != NULL && q->head->resolved ? q->head : NULL;
}

void tr_link_ordered_pop(tr_link_ordered *q) {
  struct tr_link_ordered_frame *p = q->head;
  if (p == NULL)
    return;
  q->head = p->next;
  if (q->head == NULL)
    q->tail = NULL;
  q->n--;
  free(p->error);
  free(p);
}

bool tr_link_ordered_empty(const tr_link_ordered *q) { return q->head == NULL; }

void tr_link_ordered_free(tr_link_ordered *q) {
  while (q->head != NULL)
    tr_link_ordered_pop(q);
}
