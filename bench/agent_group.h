/* agent_group.h: one loop thread of bench/many_agents: its share of the agents, each a real
 * agent (agent/agent.h: producer port, link client, batch builder, TLS to the service) with its
 * own certificate and producer socket, and, on demand, one emulated producer beside each
 * (emu_producer.h) on the same loop. The agents' producer ports run on that loop too
 * (tr_agent_opts.port_on_loop), not on a thread each.
 *
 * Agent i is named a%04d (as bench/bench_agents names them; with a prefix P, P%04d), its
 * certificate and key are PKI/agent-<name>.crt and .key beside PKI/ca.crt (certs/make-certs.sh),
 * its producer socket SOCKETS/<name>.sock. Commands come from any thread (agent_group_command) and run on the
 * group's loop; the figures every group shares are atomics in struct many_counts. */
#ifndef AGENT_GROUP_H
#define AGENT_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <uv.h>

/* What every group adds to; many_agents prints it. */
struct many_counts {
  unsigned agents_total;
  atomic_uint agents_started, agents_failed, agents_done; /* done: started or failed */
  atomic_uint producers_registered, producers_lost;
  atomic_ullong starts, stops, flushes, events_written, events_dropped;
};

struct agent_group_config {
  const char *service;      /* HOST:PORT */
  const char *service_name; /* the name on the service's certificate */
  const char *pki_dir, *socket_dir;
  const char *prefix;       /* of the agents' names: "a" gives a0000, a0001... */
  unsigned first, count;    /* agents a<first> .. a<first + count - 1> */
  double rate;              /* the producers' events per second; 0: no data */
  struct many_counts *counts;
};

enum agent_group_cmd {
  AGENT_GROUP_PRODUCERS_ON = 1,  /* connect a producer to every agent that has none */
  AGENT_GROUP_PRODUCERS_OFF = 2, /* disconnect them */
  AGENT_GROUP_STOP = 4,          /* producers off, agents shut down, the thread ends */
};

struct agent_group;

/* Starts the thread, which starts the agents on its own loop. TR_ERR_NOMEM or the thread
 * error; each agent that does not start is logged and counted (agents_failed). */
int agent_group_start(const struct agent_group_config *cfg, struct agent_group **out);
/* Safe from any thread; commands are done in the order above when several are pending. */
void agent_group_command(struct agent_group *g, enum agent_group_cmd cmd);
/* Waits for the thread (after AGENT_GROUP_STOP) and frees g. */
void agent_group_join(struct agent_group *g);

#endif
