/* session_unstopped.c: data source instances whose stop never reached their agent. A stop goes
 * out once, over the host's link; when that link is down as the session stops, or drops before
 * the agent answered (a partition, a service stalled past the heartbeat timeout), the session
 * ends without it and the producer would write for a session that no longer exists, until the
 * service restarts. So such an instance is asked to stop again: at once if the host's link is
 * up, else when the same agent instance reconnects (an agent that restarted took its instances
 * with it). The list is the service's, since the session may be freed long before. */
#include <stdlib.h>

#include "relay/base/log.h"
#include "service/session_priv.h"

#define COMP "session"
#define MAX_UNSTOPPED 4096u

struct tr_unstopped {
  tr_host *host;
  uint64_t agent_instance_id;
  uint32_t producer_id;
  uint64_t instance_id;
};

static int send_stop(tr_service *svc, tr_host *host, uint32_t producer_id, uint64_t instance_id) {
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__StopDataSource stop = TRACERELAY__COMMAND__STOP_DATA_SOURCE__INIT;
  stop.has_instance_id = 1;
  stop.instance_id = instance_id;
  cmd.has_request_id = 1;
  cmd.request_id = ++svc->next_request_id; /* its answer matches no pending request */
  cmd.has_producer_id = 1;
  cmd.producer_id = producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE;
  cmd.stop_data_source = &stop;
  return svc->link->send_command(host, &cmd);
}

void tr_session_unstopped_add(tr_service *svc, tr_host *host, uint64_t agent_instance_id,
                              uint32_t producer_id, uint64_t instance_id) {
  if (host->agent_instance_id != agent_instance_id)
    return; /* the agent restarted: the instance went with it */
  if (host->link && send_stop(svc, host, producer_id, instance_id) == 0)
    return;
  if (svc->num_unstopped >= MAX_UNSTOPPED) {
    TR_WARN(COMP, "instance %llu on %s: more than %u unconfirmed stops; not asked again",
            (unsigned long long)instance_id, host->name, MAX_UNSTOPPED);
    return;
  }
  struct tr_unstopped *grown =
      realloc(svc->unstopped, (svc->num_unstopped + 1) * sizeof *svc->unstopped);
  if (!grown) {
    TR_ERROR(COMP, "out of memory: instance %llu on %s will not be asked to stop again",
             (unsigned long long)instance_id, host->name);
    return;
  }
  svc->unstopped = grown;
  svc->unstopped[svc->num_unstopped++] =
      (struct tr_unstopped){host, agent_instance_id, producer_id, instance_id};
}

void tr_session_unstopped_reconnected(tr_service *svc, tr_host *host) {
  size_t kept = 0;
  for (size_t i = 0; i < svc->num_unstopped; i++) {
    struct tr_unstopped *u = &svc->unstopped[i];
    if (u->host != host) {
      svc->unstopped[kept++] = *u;
      continue;
    }
    if (u->agent_instance_id != host->agent_instance_id)
      continue; /* a new agent instance: nothing of the old one runs */
    TR_INFO(COMP, "%s is back: asking it again to stop instance %llu of producer %u, whose "
            "session ended while its link was down", host->name,
            (unsigned long long)u->instance_id, u->producer_id);
    if (send_stop(svc, host, u->producer_id, u->instance_id) != 0)
      svc->unstopped[kept++] = *u; /* down again already: at the next reconnect */
  }
  svc->num_unstopped = kept;
}

void tr_session_unstopped_free(tr_service *svc) {
  free(svc->unstopped);
  svc->unstopped = NULL;
  svc->num_unstopped = 0;
}

bool tr_session_unstopped_holds(const tr_service *svc, const tr_host *host) {
  for (size_t i = 0; i < svc->num_unstopped; i++)
    if (svc->unstopped[i].host == host)
      return true;
  return false;
}
