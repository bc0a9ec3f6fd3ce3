/* session_admit.c: whether a new session may join the others, as traced's EnableTracing
 * decides (session_priv.h): exclusive_prio, session_semaphores and the per-uid limit, with
 * traced's texts; and an exclusive session ending the ones it outranks. O(sessions) each. */
#include "service/session_priv.h"

#include <stdio.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "service/config_check.h"

#define COMP "session"


static uint32_t highest_exclusive_prio(const tr_service *svc) {
  uint32_t prio = 0;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    uint32_t p = tr_session_config(s)->exclusive_prio;
    prio = p > prio ? p : prio;
  }
  return prio;
}

/* traced's rule: of the running sessions holding the semaphore, no more than the smallest
 * max_other_session_count among them and cfg's. */
static int check_semaphore(const tr_service *svc,
                           const Perfetto__Protos__TraceConfig__SessionSemaphore *sem, char *err,
                           size_t err_len) {
  const char *name = sem->name ? sem->name : "";
  uint64_t holders = 0, smallest = UINT64_MAX;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    const Perfetto__Protos__TraceConfig *c = tr_session_config(s);
    if (tr_session_get_state(s) == TR_SESSION_STOPPED)
      continue;
    for (size_t i = 0; i < c->n_session_semaphores; i++) {
      const char *other = c->session_semaphores[i]->name ? c->session_semaphores[i]->name : "";
      if (strcmp(other, name) != 0)
        continue;
      holders++;
      if (c->session_semaphores[i]->max_other_session_count < smallest)
        smallest = c->session_semaphores[i]->max_other_session_count;
    }
  }
  if (holders == 0)
    return 0;
  uint64_t allowed = sem->max_other_session_count < smallest ? sem->max_other_session_count
                                                             : smallest;
  if (holders > allowed)
    return tr_config_check_refuse(err, err_len,
                   "Semaphore \"%s\" exceeds maximum allowed other session count (%llu > "
                   "min(%llu, %llu))",
                   name, (unsigned long long)holders,
                   (unsigned long long)sem->max_other_session_count,
                   (unsigned long long)smallest);
  return 0;
}

int tr_session_admit_check(const tr_service *svc, uid_t uid,
                           const Perfetto__Protos__TraceConfig *cfg, char *err, size_t err_len) {
  uint32_t current = highest_exclusive_prio(svc);
  if (current > 0 && current >= cfg->exclusive_prio)
    return tr_config_check_refuse(err, err_len,
                   "An exclusive session with priority %u >= requested priority %u is already "
                   "active.",
                   current, cfg->exclusive_prio);
  if (cfg->exclusive_prio > 0)
    return 0; /* every other session is ended before it starts (tr_session_admit_preempt) */
  for (size_t i = 0; i < cfg->n_session_semaphores; i++) {
    int rc = check_semaphore(svc, cfg->session_semaphores[i], err, err_len);
    if (rc != 0)
      return rc;
  }
  int of_uid = 0;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
    of_uid += tr_session_consumer_uid(s) == uid;
  if (of_uid >= TR_SESSION_MAX_SESSIONS_PER_UID) {
    snprintf(err, err_len, "Too many concurrent tracing sesions (%d) for uid %d limit is %d",
             of_uid, (int)uid, TR_SESSION_MAX_SESSIONS_PER_UID);
    return TR_ERR_FULL;
  }
  return 0;
}

void tr_session_admit_preempt(tr_service *svc, const Perfetto__Protos__TraceConfig *cfg) {
  char reason[128];
  if (cfg->exclusive_prio == 0)
    return;
  snprintf(reason, sizeof reason,
           "Aborted due to user requested higher-priority (%u) exclusive session.",
           cfg->exclusive_prio);
  for (tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    if (tr_session_get_state(s) == TR_SESSION_STOPPED)
      continue;
    TR_WARN(COMP, "session %llu: %s", (unsigned long long)tr_session_id(s), reason);
    /* Its instances are asked to stop; the end (and its consumer's reply) does not wait. */
    tr_session_disable(s);
    tr_session_end(s, reason);
  }
}
