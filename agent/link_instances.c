/* link_instances.c: the data source instances the service set up here (see link_instances.h). */
#include "agent/link_instances.h"

#include <stdbool.h>
#include <stdlib.h>

#include "relay/base/log.h"

static void forget(tr_link_instances *t, uint32_t producer_id, bool all_of_producer,
                   uint64_t instance_id) {
  for (size_t i = 0; i < t->n;) {
    struct tr_link_instance *e = &t->v[i];
    if (e->producer_id == producer_id && (all_of_producer || e->instance_id == instance_id))
      *e = t->v[--t->n];
    else
      i++;
  }
}

void tr_link_instances_track(tr_link_instances *t, const Tracerelay__Command *cmd) {
  if (cmd->cmd_case == TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE) {
    forget(t, cmd->producer_id, false, cmd->stop_data_source->instance_id);
    return;
  }
  if (cmd->cmd_case != TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE)
    return;
  if (t->n == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    struct tr_link_instance *grown = NULL;
    if (cap <= TR_LINK_INSTANCES_MAX)
      grown = realloc(t->v, cap * sizeof(*grown));
    if (grown == NULL) {
      TR_WARN("link", "cannot track data source instance %llu of producer %u: if the service "
              "restarts now it stays running",
              (unsigned long long)cmd->setup_data_source->instance_id, cmd->producer_id);
      return;
    }
    t->v = grown;
    t->cap = cap;
  }
  t->v[t->n++] = (struct tr_link_instance){cmd->producer_id, cmd->setup_data_source->instance_id};
}

void tr_link_instances_forget_producer(tr_link_instances *t, uint32_t producer_id) {
  forget(t, producer_id, true, 0);
}

size_t tr_link_instances_each(const tr_link_instances *t,
                              void (*fn)(void *data, uint32_t producer_id, uint64_t instance_id),
                              void *data) {
  size_t n = t->n;
  for (size_t i = 0; i < n && fn != NULL; i++)
    fn(data, t->v[i].producer_id, t->v[i].instance_id);
  return n;
}

void tr_link_instances_clear(tr_link_instances *t) { t->n = 0; }

void tr_link_instances_free(tr_link_instances *t) {
  free(t->v);
  *t = (tr_link_instances){0};
}
