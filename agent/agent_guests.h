/* agent_guests.h: the guest machines behind the agent's relay endpoint (relay/producer/
 * guests.h), on their way to the service as GuestMachine and GuestClockExchange frames
 * (relay.proto, FEATURE_GUEST_MACHINES). The agent keeps a copy of each live guest and its
 * latest clock exchange, because the link must announce them again after every Welcome, before
 * their producers. A service without the feature gets no guest and none of their producers:
 * logged once per guest, since their data then goes nowhere. Cost: O(guests) per event. */
#ifndef TR_AGENT_GUESTS_H
#define TR_AGENT_GUESTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/link_client.h"
#include "relay/producer/guests.h"

struct tr_agent_guest {
  uint32_t id;
  char name[TR_GUEST_NAME_MAX + 8];
  Perfetto__Protos__SystemInfo *system_info; /* decoded from the guest's bytes, or NULL */
  bool has_exchange;
  struct tr_guest_exchange exchange; /* the latest */
  bool refusal_logged;
};

typedef struct tr_agent_guests {
  struct tr_agent_guest *v;
  size_t n;
} tr_agent_guests;

/* The port's news of a guest (port_thread.h guest_changed): kept and sent, or, gone, sent and
 * forgotten. */
void tr_agent_guests_changed(tr_agent_guests *gs, tr_link_client *lc, const tr_guest *g,
                             bool gone);
/* A guest's clock exchange: kept as its latest and sent. */
void tr_agent_guests_clock(tr_agent_guests *gs, tr_link_client *lc, uint32_t guest_id,
                           const struct tr_guest_exchange *x);
/* A Welcome is current: every live guest again, with its latest exchange. */
void tr_agent_guests_welcome(tr_agent_guests *gs, tr_link_client *lc);
void tr_agent_guests_free(tr_agent_guests *gs);

#endif
