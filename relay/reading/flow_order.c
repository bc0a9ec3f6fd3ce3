/* flow_order.c: flows that cross hosts and whether they go forward in time (flow_order.h). */
#include "relay/reading/flow_order.h"

#include <stdlib.h>

#include "relay/base/tr_error.h"

struct slot {
  uint64_t id; /* 0: empty */
  bool has_depart, has_arrive;
  uint32_t from_host, to_host;
  int64_t depart_ts, arrive_ts;
};

struct tr_flow_order {
  struct slot *slots;
  size_t cap, used; /* cap a power of two */
  uint64_t extra;
};

int tr_flow_order_new(struct tr_flow_order **out) {
  struct tr_flow_order *f = calloc(1, sizeof *f);
  if (f == NULL || (f->slots = calloc(1024, sizeof *f->slots)) == NULL) {
    free(f);
    return TR_ERR_NOMEM;
  }
  f->cap = 1024;
  *out = f;
  return 0;
}

void tr_flow_order_free(struct tr_flow_order *f) {
  if (f == NULL)
    return;
  free(f->slots);
  free(f);
}

static struct slot *find(struct slot *slots, size_t cap, uint64_t id) {
  size_t i = (size_t)((id * 0x9e3779b97f4a7c15ull) >> 20) & (cap - 1);
  while (slots[i].id != 0 && slots[i].id != id)
    i = (i + 1) & (cap - 1);
  return &slots[i];
}

static int grow(struct tr_flow_order *f) {
  size_t cap = f->cap * 2;
  struct slot *slots = calloc(cap, sizeof *slots);
  if (slots == NULL)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < f->cap; i++)
    if (f->slots[i].id != 0)
      *find(slots, cap, f->slots[i].id) = f->slots[i];
  free(f->slots);
  f->slots = slots;
  f->cap = cap;
  return 0;
}

int tr_flow_order_add(struct tr_flow_order *f, uint64_t id, bool arrival, uint32_t host,
                      int64_t ts) {
  if (id == 0)
    return 0;
  if ((f->used + 1) * 2 > f->cap && grow(f) != 0)
    return TR_ERR_NOMEM;
  struct slot *s = find(f->slots, f->cap, id);
  if (s->id == 0) {
    s->id = id;
    f->used++;
  }
  if (arrival ? s->has_arrive : s->has_depart) {
    f->extra++;
  } else if (arrival) {
    s->has_arrive = true;
    s->to_host = host;
    s->arrive_ts = ts;
  } else {
    s->has_depart = true;
    s->from_host = host;
    s->depart_ts = ts;
  }
  return 0;
}

void tr_flow_order_cross_host(const struct tr_flow_order *f,
                              void (*fn)(const struct tr_flow_pair *p, void *arg), void *arg) {
  for (size_t i = 0; i < f->cap; i++) {
    const struct slot *s = &f->slots[i];
    if (s->id == 0 || !s->has_depart || !s->has_arrive || s->from_host == s->to_host)
      continue;
    struct tr_flow_pair p = {.id = s->id, .from_host = s->from_host, .to_host = s->to_host,
                             .depart_ts = s->depart_ts, .arrive_ts = s->arrive_ts};
    fn(&p, arg);
  }
}

uint64_t tr_flow_order_extra(const struct tr_flow_order *f) { return f->extra; }
