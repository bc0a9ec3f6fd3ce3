/* sequence_ids.c: (host, producer, writer) -> trusted_packet_sequence_id, linear probing. */
#include "relay/trace/sequence_ids.h"

#include <stdbool.h>
#include <stdlib.h>

#include "relay/base/tr_error.h"

struct slot {
  uint32_t host_id;
  uint32_t producer_id;
  uint32_t id; /* 0: empty slot */
  uint16_t writer_id;
};

struct tr_tbuf_seqids {
  struct slot *slots;
  uint32_t cap; /* power of two */
  uint32_t used;
  uint32_t max;
};

static uint32_t hash(uint32_t host_id, uint32_t producer_id, uint16_t writer_id) {
  /* splitmix64 finaliser over the packed key */
  uint64_t x = ((uint64_t)host_id << 32 | producer_id) ^ ((uint64_t)writer_id * 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)(x ^ (x >> 31));
}

static struct slot *probe(struct slot *slots, uint32_t cap, uint32_t host_id, uint32_t producer_id,
                          uint16_t writer_id) {
  for (uint32_t i = hash(host_id, producer_id, writer_id) & (cap - 1);; i = (i + 1) & (cap - 1)) {
    struct slot *s = &slots[i];
    if (s->id == 0 ||
        (s->host_id == host_id && s->producer_id == producer_id && s->writer_id == writer_id))
      return s;
  }
}

static int grow(tr_tbuf_seqids *m) {
  uint32_t cap = m->cap * 2;
  struct slot *slots = calloc(cap, sizeof *slots);
  if (!slots)
    return TR_ERR_NOMEM;
  for (uint32_t i = 0; i < m->cap; i++) {
    const struct slot *s = &m->slots[i];
    if (s->id)
      *probe(slots, cap, s->host_id, s->producer_id, s->writer_id) = *s;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  return 0;
}

int tr_tbuf_seqids_new(uint32_t max_sequences, tr_tbuf_seqids **out) {
  if (max_sequences == 0 || max_sequences > UINT32_MAX - TR_TBUF_FIRST_SEQUENCE_ID)
    return TR_ERR_INVAL;
  tr_tbuf_seqids *m = calloc(1, sizeof *m);
  if (!m)
    return TR_ERR_NOMEM;
  m->cap = 16;
  m->slots = calloc(m->cap, sizeof *m->slots);
  if (!m->slots) {
    free(m);
    return TR_ERR_NOMEM;
  }
  m->max = max_sequences;
  *out = m;
  return 0;
}

void tr_tbuf_seqids_free(tr_tbuf_seqids *m) {
  if (!m)
    return;
  free(m->slots);
  free(m);
}

int tr_tbuf_seqids_get(tr_tbuf_seqids *m, uint32_t host_id, uint32_t producer_id,
                       uint16_t writer_id, uint32_t *out) {
  struct slot *s = probe(m->slots, m->cap, host_id, producer_id, writer_id);
  if (s->id) {
    *out = s->id;
    return 0;
  }
  if (m->used == m->max)
    return TR_ERR_FULL;
  if ((m->used + 1) * 2 > m->cap) {
    int r = grow(m);
    if (r < 0)
      return r;
    s = probe(m->slots, m->cap, host_id, producer_id, writer_id);
  }
  *s = (struct slot){.host_id = host_id, .producer_id = producer_id, .writer_id = writer_id,
                     .id = TR_TBUF_FIRST_SEQUENCE_ID + m->used};
  m->used++;
  *out = s->id;
  return 0;
}
