/* agent_guests.c: the agent's copies of its guest machines (agent_guests.h). */
#include "agent/agent_guests.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"

static struct tr_agent_guest *find(tr_agent_guests *gs, uint32_t id) {
  for (size_t i = 0; i < gs->n; i++)
    if (gs->v[i].id == id)
      return &gs->v[i];
  return NULL;
}

/* A failed send is the service's to miss only when it cannot take guests: said once. */
static void sent(struct tr_agent_guest *g, int rc) {
  if (rc == TR_ERR_UNSUPPORTED && !g->refusal_logged) {
    g->refusal_logged = true;
    TR_WARN("agent", "guest machine \"%s\" behind the relay endpoint is not relayed: the service "
            "does not take guest machines (upgrade it); its producers are not announced", g->name);
  }
}

static void send_guest(struct tr_agent_guest *g, tr_link_client *lc, bool gone) {
  Tracerelay__GuestMachine m = TRACERELAY__GUEST_MACHINE__INIT;
  m.has_guest_id = true;
  m.guest_id = g->id;
  m.name = g->name;
  m.system_info = g->system_info;
  m.has_gone = gone;
  m.gone = gone;
  sent(g, tr_link_client_send_guest(lc, &m));
}

static void send_exchange(struct tr_agent_guest *g, tr_link_client *lc) {
  const struct tr_guest_exchange *x = &g->exchange;
  /* A host's snapshot carries at most TR_CLOCK_SNAPSHOT_MAX builtin clocks (ids 1..63): those
   * first in the guest's order (traced_relay's: BOOTTIME first, then the five a host sends, TSC
   * last), the rest left out. */
  Tracerelay__HostClockSnapshot__Clock clocks[TR_CLOCK_SNAPSHOT_MAX];
  Tracerelay__HostClockSnapshot__Clock *ptrs[TR_CLOCK_SNAPSHOT_MAX];
  size_t n = 0;
  for (size_t i = 0; i < x->num_clocks && n < TR_CLOCK_SNAPSHOT_MAX; i++) {
    if (x->clocks[i].clock_id == 0 || x->clocks[i].clock_id >= 64)
      continue;
    tracerelay__host_clock_snapshot__clock__init(&clocks[n]);
    clocks[n].has_clock_id = clocks[n].has_timestamp = true;
    clocks[n].clock_id = x->clocks[i].clock_id;
    clocks[n].timestamp = x->clocks[i].timestamp;
    ptrs[n] = &clocks[n];
    n++;
  }
  Tracerelay__GuestClockExchange m = TRACERELAY__GUEST_CLOCK_EXCHANGE__INIT;
  m.has_guest_id = m.has_t1 = m.has_t2 = m.has_t3 = m.has_t4 = true;
  m.guest_id = g->id;
  m.t1 = x->t1;
  m.t2 = x->t2;
  m.t3 = x->t3;
  m.t4 = x->t4;
  m.n_clocks = n;
  m.clocks = ptrs;
  sent(g, tr_link_client_send_guest_clock(lc, &m));
}

void tr_agent_guests_changed(tr_agent_guests *gs, tr_link_client *lc, const tr_guest *g,
                             bool gone) {
  struct tr_agent_guest *a = find(gs, g->id);
  if (a == NULL && !gone) {
    struct tr_agent_guest *v = realloc(gs->v, (gs->n + 1) * sizeof *v);
    if (v == NULL) {
      TR_ERROR("agent", "out of memory: guest machine \"%s\" is not relayed", g->name);
      return;
    }
    gs->v = v;
    a = &gs->v[gs->n++];
    *a = (struct tr_agent_guest){.id = g->id};
    memcpy(a->name, g->name, sizeof a->name);
  }
  if (a == NULL)
    return;
  if (g->system_info != NULL) {
    /* The port checked these bytes decode; decoded once here for every resend. */
    Perfetto__Protos__SystemInfo *si =
        perfetto__protos__system_info__unpack(NULL, g->system_info_len, g->system_info);
    if (si != NULL) {
      if (a->system_info)
        perfetto__protos__system_info__free_unpacked(a->system_info, NULL);
      a->system_info = si;
    }
  }
  send_guest(a, lc, gone);
  if (gone) {
    if (a->system_info)
      perfetto__protos__system_info__free_unpacked(a->system_info, NULL);
    *a = gs->v[--gs->n];
  }
}

void tr_agent_guests_clock(tr_agent_guests *gs, tr_link_client *lc, uint32_t guest_id,
                           const struct tr_guest_exchange *x) {
  struct tr_agent_guest *a = find(gs, guest_id);
  if (a == NULL)
    return;
  a->has_exchange = true;
  a->exchange = *x;
  send_exchange(a, lc);
}

void tr_agent_guests_welcome(tr_agent_guests *gs, tr_link_client *lc) {
  for (size_t i = 0; i < gs->n; i++) {
    send_guest(&gs->v[i], lc, false);
    if (gs->v[i].has_exchange)
      send_exchange(&gs->v[i], lc);
  }
}

void tr_agent_guests_free(tr_agent_guests *gs) {
  for (size_t i = 0; i < gs->n; i++)
    if (gs->v[i].system_info)
      perfetto__protos__system_info__free_unpacked(gs->v[i].system_info, NULL);
  free(gs->v);
  *gs = (tr_agent_guests){0};
}
