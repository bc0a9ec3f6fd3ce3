/* chunk_queue.c: a singly-linked FIFO of malloc'd entries with a byte budget and drop counters
 * per producer and target buffer. See chunk_queue.h for the guarantees. */
#include "relay/producer/chunk_queue.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

void tr_chunkq_init(tr_chunkq *q, size_t max_bytes) {
  memset(q, 0, sizeof(*q));
  q->max_bytes = max_bytes;
  q->next_seq = 1;
}

void tr_chunkq_free(tr_chunkq *q) {
  tr_chunkq_entry *e;
  while ((e = tr_chunkq_pop(q)) != NULL)
    tr_chunkq_entry_free(e);
  free(q->drops);
  q->drops = NULL;
  q->num_drops = q->cap_drops = 0;
}

size_t tr_chunkq_entry_cost(size_t len) {
  return sizeof(tr_chunkq_entry) + len;
}

static void add_counts(tr_chunkq_drops *to, const tr_chunkq_drops *n) {
  to->chunks += n->chunks;
  to->bytes += n->bytes;
  to->packets += n->packets;
  to->patches += n->patches;
  to->flush_acks += n->flush_acks;
  to->unscraped_chunks += n->unscraped_chunks;
  if (n->closed_why)
    to->closed_why = n->closed_why;
}

/* The counters of a producer and target buffer, created on their first drop. NULL only if that
 * allocation fails: the drop then shows in the total alone. */
static tr_chunkq_drops *drops_for(tr_chunkq *q, uint32_t producer_id, uint32_t target_buffer) {
  for (size_t i = 0; i < q->num_drops; i++)
    if (q->drops[i].producer_id == producer_id && q->drops[i].target_buffer == target_buffer)
      return &q->drops[i];
  if (q->num_drops == q->cap_drops) {
    size_t cap = q->cap_drops ? 2 * q->cap_drops : 8;
    tr_chunkq_drops *d = realloc(q->drops, cap * sizeof(*d));
    if (!d)
      return NULL;
    q->drops = d;
    q->cap_drops = cap;
  }
  tr_chunkq_drops *d = &q->drops[q->num_drops++];
  memset(d, 0, sizeof(*d));
  d->producer_id = producer_id;
  d->target_buffer = target_buffer;
  return d;
}

tr_chunkq_drops tr_chunkq_drops_of(const tr_chunkq *q, uint32_t producer_id) {
  tr_chunkq_drops sum = {.producer_id = producer_id};
  for (size_t i = 0; i < q->num_drops; i++)
    if (q->drops[i].producer_id == producer_id)
      add_counts(&sum, &q->drops[i]);
  return sum;
}

/* Adds the counts of n (its ids unused) to those of (producer_id, target_buffer). */
static void add_to_table(tr_chunkq *q, uint32_t producer_id, uint32_t target_buffer,
                         const tr_chunkq_drops *n) {
  tr_chunkq_drops *d = drops_for(q, producer_id, target_buffer);
  if (d)
    add_counts(d, n);
}

/* And to the total. */
static void count_drop(tr_chunkq *q, uint32_t producer_id, uint32_t target_buffer,
                       const tr_chunkq_drops *n) {
  add_to_table(q, producer_id, target_buffer, n);
  add_counts(&q->total, n);
}

void tr_chunkq_count_exit(tr_chunkq *q, uint32_t producer_id, uint32_t target_buffer,
                          uint64_t unscraped_chunks, uint8_t closed_why) {
  count_drop(q, producer_id, target_buffer,
             &(tr_chunkq_drops){.unscraped_chunks = unscraped_chunks, .closed_why = closed_why});
}

static void count_chunk_drop(tr_chunkq *q, const tr_chunkq_chunk *c, const uint8_t *payload,
                             size_t len) {
  uint32_t begun = tr_chunk_packets_begun(payload, len, c->header.count, c->header.flags,
                                          c->incomplete);
  count_drop(q, c->producer_id, c->target_buffer,
             &(tr_chunkq_drops){.chunks = 1, .bytes = len, .packets = begun});
}

/* Allocates an entry if `cost` fits under `limit`; NULL with *rc set otherwise. */
static tr_chunkq_entry *new_entry(tr_chunkq *q, size_t len, size_t limit, int *rc) {
  size_t cost = tr_chunkq_entry_cost(len);
  if (q->bytes > limit || cost > limit - q->bytes) {
    *rc = TR_ERR_FULL;
    return NULL;
  }
  tr_chunkq_entry *e = malloc(cost);
  if (!e) {
    *rc = TR_ERR_NOMEM;
    return NULL;
  }
  memset(e, 0, sizeof(*e));
  e->len = len;
  return e;
}

static void append(tr_chunkq *q, tr_chunkq_entry *e, tr_chunkq_kind kind) {
  e->kind = kind;
  e->seq = q->next_seq++;
  e->next = NULL;
  if (q->tail)
    q->tail->next = e;
  else
    q->head = e;
  q->tail = e;
  q->len++;
  q->bytes += tr_chunkq_entry_cost(e->len);
}

static size_t control_limit(const tr_chunkq *q) {
  return q->max_bytes + q->max_bytes / 8;
}

int tr_chunkq_push_chunk(tr_chunkq *q, const tr_chunkq_chunk *c, const uint8_t *payload,
                         size_t payload_len, size_t used) {
  if (used > payload_len)
    return TR_ERR_INVAL;
  size_t len = (c->header.flags & TR_CHUNK_NEEDS_PATCHING) ? payload_len : used;
  int rc = 0;
  tr_chunkq_entry *e = new_entry(q, len, q->max_bytes, &rc);
  if (!e) {
    count_chunk_drop(q, c, payload, len);
    return rc;
  }
  e->u.chunk = *c;
  memcpy(e->data, payload, len);
  append(q, e, TR_CHUNKQ_CHUNK);
  return 0;
}

int tr_chunkq_push_patch(tr_chunkq *q, const tr_chunkq_patch *p) {
  int rc = 0;
  tr_chunkq_entry *e = new_entry(q, 0, control_limit(q), &rc);
  if (!e) {
    count_drop(q, p->producer_id, p->target_buffer, &(tr_chunkq_drops){.patches = 1});
    return rc;
  }
  e->u.patch = *p;
  append(q, e, TR_CHUNKQ_PATCH);
  return 0;
}

int tr_chunkq_push_flush_ack(tr_chunkq *q, uint32_t producer_id, uint64_t request_id) {
  int rc = 0;
  tr_chunkq_entry *e = new_entry(q, 0, control_limit(q), &rc);
  if (!e) {
    count_drop(q, producer_id, 0, &(tr_chunkq_drops){.flush_acks = 1});
    return rc;
  }
  e->u.flush_ack.producer_id = producer_id;
  e->u.flush_ack.request_id = request_id;
  append(q, e, TR_CHUNKQ_FLUSH_ACK);
  return 0;
}

const tr_chunkq_entry *tr_chunkq_peek(const tr_chunkq *q) {
  return q->head;
}

tr_chunkq_entry *tr_chunkq_pop(tr_chunkq *q) {
  tr_chunkq_entry *e = q->head;
  if (!e)
    return NULL;
  q->head = e->next;
  if (!q->head)
    q->tail = NULL;
  e->next = NULL;
  q->len--;
  q->bytes -= tr_chunkq_entry_cost(e->len);
  return e;
}

void tr_chunkq_entry_free(tr_chunkq_entry *e) {
  free(e);
}

void tr_chunkq_take(tr_chunkq *q, tr_chunkq *out) {
  *out = *q;
  q->head = q->tail = NULL;
  q->len = q->bytes = 0;
  memset(&q->total, 0, sizeof(q->total));
  q->drops = NULL;
  q->num_drops = q->cap_drops = 0;
}

/* Appends e, made by another queue, if it fits under this queue's bound; else counts it as
 * dropped here and frees it. */
static void admit(tr_chunkq *q, tr_chunkq_entry *e) {
  size_t limit = e->kind == TR_CHUNKQ_CHUNK ? q->max_bytes : control_limit(q);
  size_t cost = tr_chunkq_entry_cost(e->len);
  if (q->bytes <= limit && cost <= limit - q->bytes) {
    append(q, e, e->kind);
    return;
  }
  if (e->kind == TR_CHUNKQ_CHUNK)
    count_chunk_drop(q, &e->u.chunk, e->data, e->len);
  else if (e->kind == TR_CHUNKQ_PATCH)
    count_drop(q, e->u.patch.producer_id, e->u.patch.target_buffer,
               &(tr_chunkq_drops){.patches = 1});
  else
    count_drop(q, e->u.flush_ack.producer_id, 0, &(tr_chunkq_drops){.flush_acks = 1});
  tr_chunkq_entry_free(e);
}

void tr_chunkq_move(tr_chunkq *from, tr_chunkq *to, uint64_t up_to_seq) {
  while (from->head != NULL && from->head->seq <= up_to_seq)
    admit(to, tr_chunkq_pop(from));
}

void tr_chunkq_move_drops(tr_chunkq *from, tr_chunkq *to) {
  for (size_t i = 0; i < from->num_drops; i++)
    add_to_table(to, from->drops[i].producer_id, from->drops[i].target_buffer, &from->drops[i]);
  add_counts(&to->total, &from->total);
  free(from->drops);
  from->drops = NULL;
  from->num_drops = from->cap_drops = 0;
  memset(&from->total, 0, sizeof(from->total));
}
