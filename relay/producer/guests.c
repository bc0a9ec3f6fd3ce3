/* guests.c: the guest machine table behind guests.h. Entries live in one array, looked up by
 * linear scan (a few guests per agent); a gone guest is removed by moving the last one into
 * its place, so ids, not positions, name a guest. */
#include "relay/producer/guests.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

#define BUILTIN_CLOCK_BOOTTIME 6
#define TIME_LIMIT (1ull << 62) /* as a clock probe's answer: room for sums of two */

void tr_guests_init(tr_guests *gs) { *gs = (tr_guests){.next_id = 1}; }

void tr_guests_free(tr_guests *gs) {
  for (size_t i = 0; i < gs->n; i++)
    free(gs->v[i].system_info);
  free(gs->v);
  tr_guests_init(gs);
}

static tr_guest *find(const tr_guests *gs, uint32_t id) {
  for (size_t i = 0; i < gs->n; i++)
    if (gs->v[i].id == id)
      return &gs->v[i];
  return NULL;
}

const tr_guest *tr_guests_find(const tr_guests *gs, uint32_t id) { return find(gs, id); }

static bool name_taken(const tr_guests *gs, const char *name) {
  for (size_t i = 0; i < gs->n; i++)
    if (strcmp(gs->v[i].name, name) == 0)
      return true;
  return false;
}

static bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

/* The claimed name in the machine-name alphabet (other bytes become '_'), or "guest-" and the
 * key's first characters; then a suffix while another guest has it. */
static void derive_name(const tr_guests *gs, const char *claimed, const char *key,
                        char out[TR_GUEST_NAME_MAX + 8]) {
  char base[TR_GUEST_NAME_MAX + 1];
  size_t n = 0;
  if (claimed && claimed[0]) {
    for (; claimed[n] && n < TR_GUEST_NAME_MAX; n++)
      base[n] = name_char(claimed[n]) ? claimed[n] : '_';
  } else {
    n = (size_t)snprintf(base, sizeof base, "guest-");
    for (size_t i = 0; key[i] && n < 14; i++)
      base[n++] = name_char(key[i]) ? key[i] : '_';
  }
  base[n] = '\0';
  snprintf(out, TR_GUEST_NAME_MAX + 8, "%s", base);
  for (unsigned k = 2; name_taken(gs, out); k++) /* at most TR_GUESTS_MAX tries */
    snprintf(out, TR_GUEST_NAME_MAX + 8, "%s-%u", base, k);
}

int tr_guests_attach(tr_guests *gs, const char *key, const char *claimed_name, uint32_t *id,
                     bool *created) {
  char k[TR_GUEST_KEY_MAX + 1];
  if (!key || !key[0])
    return TR_ERR_INVAL;
  snprintf(k, sizeof k, "%s", key); /* a longer claim is cut: still one guest per claim */
  for (size_t i = 0; i < gs->n; i++) {
    if (strcmp(gs->v[i].key, k) == 0) {
      gs->v[i].conns++;
      *id = gs->v[i].id;
      *created = false;
      return 0;
    }
  }
  if (gs->n >= TR_GUESTS_MAX || gs->next_id == 0)
    return TR_ERR_FULL;
  if (gs->n == gs->cap) {
    size_t cap = gs->cap ? 2 * gs->cap : 4;
    tr_guest *v = realloc(gs->v, cap * sizeof *v);
    if (!v)
      return TR_ERR_NOMEM;
    gs->v = v;
    gs->cap = cap;
  }
  tr_guest *g = &gs->v[gs->n];
  *g = (tr_guest){.id = gs->next_id, .conns = 1};
  memcpy(g->key, k, sizeof k);
  derive_name(gs, claimed_name, k, g->name);
  gs->n++;
  gs->next_id++;
  *id = g->id;
  *created = true;
  return 0;
}

bool tr_guests_detach(tr_guests *gs, uint32_t id) {
  tr_guest *g = find(gs, id);
  if (!g || --g->conns > 0)
    return false;
  free(g->system_info);
  *g = gs->v[--gs->n];
  return true;
}

int tr_guests_set_system_info(tr_guests *gs, uint32_t id, const uint8_t *data, size_t len) {
  tr_guest *g = find(gs, id);
  if (!g)
    return TR_ERR_NOT_FOUND;
  if (len > TR_GUEST_SYSINFO_MAX)
    return TR_ERR_TOO_BIG;
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy)
    return TR_ERR_NOMEM;
  if (len)
    memcpy(copy, data, len);
  free(g->system_info);
  g->system_info = copy;
  g->system_info_len = len;
  return 0;
}

/* The guest's BOOTTIME among its clocks, once, with no repeated id and every time in range. */
static int check_clocks(const struct tr_guest_clock *clocks, size_t n, uint64_t *boottime) {
  bool found = false;
  for (size_t i = 0; i < n; i++) {
    if (clocks[i].timestamp >= TIME_LIMIT)
      return TR_ERR_INVAL;
    for (size_t j = 0; j < i; j++)
      if (clocks[j].clock_id == clocks[i].clock_id)
        return TR_ERR_INVAL;
    if (clocks[i].clock_id == BUILTIN_CLOCK_BOOTTIME) {
      *boottime = clocks[i].timestamp;
      found = true;
    }
  }
  return found ? 0 : TR_ERR_INVAL;
}

int tr_guests_sync_clock(tr_guests *gs, uint32_t id, enum tr_guest_phase phase,
                         const struct tr_guest_clock *clocks, size_t num_clocks, uint64_t now_ns,
                         struct tr_guest_exchange *out) {
  tr_guest *g = find(gs, id);
  if (!g)
    return TR_ERR_NOT_FOUND;
  uint64_t boottime = 0;
  if (num_clocks > TR_GUEST_CLOCKS_MAX || now_ns >= TIME_LIMIT ||
      check_clocks(clocks, num_clocks, &boottime) < 0) {
    g->ping_seen = false; /* the pair is broken: wait for the next PING */
    return TR_ERR_INVAL;
  }
  if (phase == TR_GUEST_PING) {
    g->ping_seen = true;
    g->ping_host_ns = now_ns;
    return 0;
  }
  if (phase != TR_GUEST_UPDATE || !g->ping_seen || now_ns < g->ping_host_ns) {
    g->ping_seen = false;
    return phase == TR_GUEST_UPDATE ? 0 : TR_ERR_INVAL;
  }
  g->ping_seen = false;
  *out = (struct tr_guest_exchange){.t1 = g->ping_host_ns, .t2 = boottime, .t3 = boottime,
                                    .t4 = now_ns, .num_clocks = num_clocks};
  memcpy(out->clocks, clocks, num_clocks * sizeof *clocks);
  return 1;
}
