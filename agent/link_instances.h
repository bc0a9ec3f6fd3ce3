/* link_instances.h: the data source instances the current service instance set up on this
 * agent and has not stopped, recorded as its commands pass. If the service restarts, the new
 * instance knows nothing of them: the agent stops them (link_client.h, on_stale_instance), and
 * at shutdown it waits for them to stop.
 *
 * Bounded by TR_LINK_INSTANCES_MAX: past it an instance is not remembered (logged), so it is
 * left running if the service restarts. Cost: O(instances) per stop and per producer gone. */
#ifndef TR_LINK_INSTANCES_H
#define TR_LINK_INSTANCES_H

#include <stddef.h>
#include <stdint.h>

#include "tracerelay/relay.pb-c.h"

#define TR_LINK_INSTANCES_MAX 65536

struct tr_link_instance {
  uint32_t producer_id;
  uint64_t instance_id;
};

/* Zero-initialised is empty. Fields are link_instances.c's. */
typedef struct tr_link_instances {
  struct tr_link_instance *v;
  size_t n, cap;
} tr_link_instances;

/* Records a SetupDataSource, forgets the instance of a StopDataSource; other commands pass. */
void tr_link_instances_track(tr_link_instances *t, const Tracerelay__Command *cmd);
/* Forgets every instance of a producer that is gone. */
void tr_link_instances_forget_producer(tr_link_instances *t, uint32_t producer_id);
/* Calls fn (if not NULL) for every instance; returns how many there are. fn must not change t. */
size_t tr_link_instances_each(const tr_link_instances *t,
                              void (*fn)(void *data, uint32_t producer_id, uint64_t instance_id),
                              void *data);
/* Forgets them all (the service that set them up is gone). */
void tr_link_instances_clear(tr_link_instances *t);
void tr_link_instances_free(tr_link_instances *t);

#endif
