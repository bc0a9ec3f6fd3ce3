/* agent_triggers.c: the producers' triggers on their way to the service (see
 * agent_triggers.h). */
#include "agent/agent_triggers.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_session.h"

#define COMP "agent"

static void free_one(struct tr_agent_trigger *h) {
  free(h->name);
  free(h->producer_name);
  memset(h, 0, sizeof *h);
}

/* 0 sent, 1 to hold (no Welcome current), <0 never to be sent. */
static int send_one(tr_link_client *lc, const struct tr_agent_trigger *h) {
  Tracerelay__Trigger f = TRACERELAY__TRIGGER__INIT;
  f.name = h->name;
  f.producer_name = h->producer_name;
  f.has_producer_id = f.has_producer_uid = 1;
  f.producer_id = h->producer_id;
  f.producer_uid = h->producer_uid;
  int rc = tr_link_client_send_trigger(lc, &f);
  if (rc == TR_ERR_CLOSED)
    return 1;
  if (rc == TR_ERR_UNSUPPORTED)
    TR_WARN(COMP,
            "trigger \"%s\" of producer %s is lost: the service, or a regional between it "
            "and this agent, does not take triggers (a tracerelay older than 0.3.0: upgrade it)",
            h->name, h->producer_name);
  else if (rc < 0)
    TR_WARN(COMP, "trigger \"%s\" of producer %s is lost: %s", h->name, h->producer_name,
            tr_strerror(rc));
  else
    TR_INFO(COMP, "trigger \"%s\" of producer %s sent to the service", h->name, h->producer_name);
  return rc;
}

static void hold(tr_agent_triggers *t, struct tr_agent_trigger *h) {
  if (t->n == TR_AGENT_TRIGGERS_HELD) {
    struct tr_agent_trigger *old = &t->held[t->first];
    TR_WARN(COMP,
            "trigger \"%s\" of producer %s is lost: %u more came while the "
            "link was down",
            old->name, old->producer_name, TR_AGENT_TRIGGERS_HELD);
    free_one(old);
    t->first = (t->first + 1) % TR_AGENT_TRIGGERS_HELD;
    t->n--;
    t->dropped++;
  }
  t->held[(t->first + t->n) % TR_AGENT_TRIGGERS_HELD] = *h;
  t->n++;
  TR_INFO(COMP, "trigger \"%s\" of producer %s held until the link is up", h->name,
          h->producer_name);
}

void tr_agent_triggers_raise(tr_agent_triggers *t, tr_link_client *lc, uint32_t producer_id,
                             const char *producer_name, uint32_t producer_uid, const char *name) {
  if (strlen(name) > TR_RELAY_TRIGGER_NAME_MAX) {
    TR_WARN(COMP,
            "producer %s activated a trigger named with %zu bytes (at most "
            "%u): refused",
            producer_name, strlen(name), TR_RELAY_TRIGGER_NAME_MAX);
    t->dropped++;
    return;
  }
  struct tr_agent_trigger h = {.name = strdup(name),
                               .producer_name = strndup(producer_name, TR_RELAY_TRIGGER_NAME_MAX),
                               .producer_id = producer_id,
                               .producer_uid = producer_uid};
  if (h.name == NULL || h.producer_name == NULL) {
    TR_ERROR(COMP, "out of memory: trigger \"%s\" of producer %s is lost", name, producer_name);
    free_one(&h);
    t->dropped++;
    return;
  }
  int rc = send_one(lc, &h);
  if (rc == 1) {
    hold(t, &h); /* takes h */
    return;
  }
  t->sent += rc == 0;
  t->dropped += rc < 0;
  free_one(&h);
}

void tr_agent_triggers_welcome(tr_agent_triggers *t, tr_link_client *lc) {
  while (t->n > 0) {
    struct tr_agent_trigger *h = &t->held[t->first];
    int rc = send_one(lc, h);
    if (rc == 1)
      return; /* the link went down again */
    t->sent += rc == 0;
    t->dropped += rc < 0;
    free_one(h);
    t->first = (t->first + 1) % TR_AGENT_TRIGGERS_HELD;
    t->n--;
  }
}

void tr_agent_triggers_free(tr_agent_triggers *t) {
  for (size_t i = 0; i < t->n; i++)
    free_one(&t->held[(t->first + i) % TR_AGENT_TRIGGERS_HELD]);
  t->n = 0;
}
