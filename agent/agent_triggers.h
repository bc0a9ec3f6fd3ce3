/* agent_triggers.h: the producers' triggers on their way to the service (ActivateTriggers ->
 * relay.proto Trigger). A trigger is worth its moment, but the moment an incident happens is
 * often the moment a link is down: while no Welcome is current a few are held (the oldest
 * dropped past TR_AGENT_TRIGGERS_HELD, logged) and sent after the next Welcome, behind the
 * producers' re-announcements. A service that does not take triggers (older than the agent)
 * gets none; each one is logged, so no trigger is lost unseen. Cost: O(1) per trigger. */
#ifndef TR_AGENT_TRIGGERS_H
#define TR_AGENT_TRIGGERS_H

#include <stddef.h>
#include <stdint.h>

#include "agent/link_client.h"

#define TR_AGENT_TRIGGERS_HELD 16u

struct tr_agent_trigger {
  char *name, *producer_name;
  uint32_t producer_id, producer_uid;
};

typedef struct tr_agent_triggers {
  struct tr_agent_trigger held[TR_AGENT_TRIGGERS_HELD];
  size_t first, n;   /* a ring: the oldest at first */
  uint64_t sent;     /* Trigger frames sent to the service */
  uint64_t dropped;  /* held ones pushed out, or the service could not take */
} tr_agent_triggers;

/* Sends trigger `name` of producer (id, name, uid) now, or holds it until the next Welcome.
 * Names longer than TR_RELAY_TRIGGER_NAME_MAX are refused (logged). */
void tr_agent_triggers_raise(tr_agent_triggers *t, tr_link_client *lc, uint32_t producer_id,
                             const char *producer_name, uint32_t producer_uid, const char *name);
/* A Welcome is current: sends what was held. */
void tr_agent_triggers_welcome(tr_agent_triggers *t, tr_link_client *lc);
void tr_agent_triggers_free(tr_agent_triggers *t);

#endif
