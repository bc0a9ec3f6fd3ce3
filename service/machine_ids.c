/* machine_ids.c: unique trace names and the ids made from them (machine_ids.h).
 *
 * Two open-addressing sets of 32-bit ids (linear probing, grown at half full, deletion by
 * shifting back the slots after), one for machine ids and one for global clock ids: the two
 * are different namespaces in a trace, so an id in one never blocks the same number in the
 * other. */
#include "service/machine_ids.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/clock/clock.h"

/* Probes for K: a bound so a broken hash cannot spin the loop; ids are 31 or 32 bits, so a
 * free K is among the first few unless billions of hosts are in the table. */
#define MAX_SUFFIX 1000000u

static size_t home(const struct tr_machine_id_set *s, uint32_t id) {
  /* The ids are hash values already; a multiply spreads the probing of near ids. */
  return (size_t)(id * 2654435761u) & (s->cap - 1);
}

static struct tr_machine_id_slot *find(const struct tr_machine_id_set *s, uint32_t id) {
  if (s->cap == 0)
    return NULL;
  for (size_t i = home(s, id);; i = (i + 1) & (s->cap - 1)) {
    if (s->slots[i].id == id)
      return &s->slots[i];
    if (s->slots[i].id == 0)
      return NULL;
  }
}

static void place(struct tr_machine_id_set *s, struct tr_machine_id_slot e) {
  size_t i = home(s, e.id);
  while (s->slots[i].id != 0)
    i = (i + 1) & (s->cap - 1);
  s->slots[i] = e;
  s->n++;
}

/* Room for more ids: the table at most half full after them. 0 or TR_ERR_NOMEM. */
static int room(struct tr_machine_id_set *s, size_t more) {
  if (2 * (s->n + more) <= s->cap)
    return 0;
  size_t cap = s->cap ? s->cap : 64;
  while (2 * (s->n + more) > cap)
    cap *= 2;
  struct tr_machine_id_slot *old = s->slots;
  size_t old_cap = s->cap;
  s->slots = calloc(cap, sizeof *s->slots);
  if (s->slots == NULL) {
    s->slots = old;
    return TR_ERR_NOMEM;
  }
  s->cap = cap;
  s->n = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].id != 0)
      place(s, old[i]);
  free(old);
  return 0;
}

static void drop(struct tr_machine_id_set *s, uint32_t id) {
  struct tr_machine_id_slot *e = find(s, id);
  if (e == NULL)
    return;
  size_t hole = (size_t)(e - s->slots);
  s->slots[hole].id = 0;
  s->n--;
  /* Slots after the hole whose probe passed through it move back into it. */
  for (size_t i = (hole + 1) & (s->cap - 1); s->slots[i].id != 0; i = (i + 1) & (s->cap - 1)) {
    size_t want = home(s, s->slots[i].id);
    bool passes = hole <= i ? (want <= hole || want > i) : (want <= hole && want > i);
    if (passes) {
      s->slots[hole] = s->slots[i];
      s->slots[i].id = 0;
      hole = i;
    }
  }
}

static void clock_ids(const char *trace_name, uint32_t out[TR_CLOCK_SNAPSHOT_MAX]) {
  for (uint32_t k = 0; k < TR_CLOCK_SNAPSHOT_MAX; k++)
    out[k] = tr_global_clock_id(trace_name, tr_clock_name(TR_CLOCK_REALTIME + k));
}

/* The holder of one of trace_name's ids, or NULL when they are all free. */
static const char *holder(const tr_machine_ids *ids, const char *trace_name) {
  const struct tr_machine_id_slot *e = find(&ids->machines, tr_machine_id(trace_name));
  if (e != NULL)
    return e->owner;
  uint32_t clocks[TR_CLOCK_SNAPSHOT_MAX];
  clock_ids(trace_name, clocks);
  for (size_t k = 0; k < TR_CLOCK_SNAPSHOT_MAX; k++)
    if ((e = find(&ids->clocks, clocks[k])) != NULL)
      return e->owner;
  return NULL;
}

int tr_machine_ids_claim(tr_machine_ids *ids, const char *name, char *trace_name,
                         uint32_t *machine_id, const char **collided_with) {
  size_t len = strlen(name);
  if (len + 11 > TR_MACHINE_IDS_NAME_MAX) /* '#' and 10 digits must fit */
    return TR_ERR_INVAL;
  if (room(&ids->machines, 1) < 0 || room(&ids->clocks, TR_CLOCK_SNAPSHOT_MAX) < 0)
    return TR_ERR_NOMEM;
  memcpy(trace_name, name, len + 1);
  const char *first = holder(ids, trace_name);
  if (collided_with != NULL)
    *collided_with = first;
  for (unsigned k = 1; first != NULL && holder(ids, trace_name) != NULL; k++) {
    if (k > MAX_SUFFIX)
      return TR_ERR_FULL;
    snprintf(trace_name + len, TR_MACHINE_IDS_NAME_MAX + 1 - len, "#%u", k);
  }
  *machine_id = tr_machine_id(trace_name);
  place(&ids->machines, (struct tr_machine_id_slot){*machine_id, trace_name});
  uint32_t clocks[TR_CLOCK_SNAPSHOT_MAX];
  clock_ids(trace_name, clocks);
  for (size_t k = 0; k < TR_CLOCK_SNAPSHOT_MAX; k++)
    if (find(&ids->clocks, clocks[k]) == NULL) /* two of its own clocks may hash alike */
      place(&ids->clocks, (struct tr_machine_id_slot){clocks[k], trace_name});
  return 0;
}

void tr_machine_ids_release(tr_machine_ids *ids, const char *trace_name) {
  struct tr_machine_id_slot *e = find(&ids->machines, tr_machine_id(trace_name));
  if (e != NULL && e->owner == trace_name)
    drop(&ids->machines, e->id);
  uint32_t clocks[TR_CLOCK_SNAPSHOT_MAX];
  clock_ids(trace_name, clocks);
  for (size_t k = 0; k < TR_CLOCK_SNAPSHOT_MAX; k++)
    if ((e = find(&ids->clocks, clocks[k])) != NULL && e->owner == trace_name)
      drop(&ids->clocks, clocks[k]);
}

void tr_machine_ids_free(tr_machine_ids *ids) {
  free(ids->machines.slots);
  free(ids->clocks.slots);
  *ids = (tr_machine_ids){0};
}
