/* port_msgs.h: the messages of agent/port_thread.c through its handoff (agent/port_handoff.h):
 * a command for the producer port (tr_port_command, as the agent gives it) with copies of its
 * arguments, and an event with a copy of what the producer port's callback saw, so that neither
 * thread keeps a pointer into the other's memory. */
#ifndef TR_PORT_MSGS_H
#define TR_PORT_MSGS_H

#include <stdbool.h>
#include <stdint.h>

#include "agent/port_handoff.h"
#include "relay/producer/producer_port.h"
#include "tracerelay/relay.pb-c.h"

enum tr_port_command_kind {
  TR_PORT_SETUP = 1, /* tr_producer_port_setup_data_source */
  TR_PORT_START,     /* ..._start_data_source */
  TR_PORT_STOP,      /* ..._stop_data_source */
  TR_PORT_FLUSH,     /* ..._flush */
  TR_PORT_CLEAR,     /* ..._clear_incremental_state */
  TR_PORT_STATS,     /* ..._stats */
};

/* A command for the port: the arguments of the tr_producer_port_* call it names. */
struct tr_port_command {
  enum tr_port_command_kind kind;
  uint32_t producer_id;
  uint64_t instance_id;                             /* setup, start, stop */
  const Perfetto__Protos__DataSourceConfig *config; /* setup */
  uint32_t timeout_ms;                              /* stop */
  uint64_t flush_request_id, flags;                 /* flush */
  const uint64_t *instance_ids;                     /* flush, clear */
  size_t num_instance_ids;
  uint64_t tag; /* the caller's, given back with the result */
  int why;      /* likewise */
};

struct tr_port_result {
  const struct tr_port_command *cmd; /* a copy of the command; valid during the callback */
  int rc;                            /* what the tr_producer_port_* call returned */
  tr_producer_stats stats;           /* TR_PORT_STATS with rc 0 */
};

/* Link to port. */
struct port_command {
  tr_port_msg msg;
  struct tr_port_command c; /* c.config and c.instance_ids point at the copies */
  bool close;               /* close the port instead (c unused) */
};

enum port_event_kind {
  PORT_EV_CONNECTED = 1,
  PORT_EV_DATA_SOURCES,
  PORT_EV_DISCONNECTED,
  PORT_EV_STARTED,
  PORT_EV_STOPPED,
  PORT_EV_FLUSH_ACKED,
  PORT_EV_COMMAND_DONE,
  PORT_EV_TRIGGER, /* ActivateTriggers: one event per trigger name */
  PORT_EV_GUEST,       /* a guest machine joined, sent its SystemInfo, or left */
  PORT_EV_GUEST_CLOCK, /* a guest's clock exchange */
  PORT_EV_CLOSED, /* the port is closed: the last event */
};

/* Port to link. */
struct port_event {
  tr_port_msg msg;
  enum port_event_kind kind;
  tr_producer_info info; /* CONNECTED, DATA_SOURCES, DISCONNECTED: its strings and
                          * descriptors are the event's copies; else only info.id is set */
  uint64_t id;           /* the instance (STARTED, STOPPED) or flush_request_id */
  bool timed_out;        /* STOPPED */
  struct port_command *cmd; /* COMMAND_DONE: the command, owned by the event */
  struct tr_port_result result; /* COMMAND_DONE */
  char *trigger_name;           /* TRIGGER: the event's copy */
  tr_guest guest;               /* GUEST: a copy, system_info the event's own */
  bool guest_gone;              /* GUEST */
  struct tr_guest_exchange clock; /* GUEST_CLOCK, for info.guest_id */
};

/* NULL when out of memory. */
struct port_command *tr_port_msgs_command_new(const struct tr_port_command *c);
/* The port's command for the service's Command cmd (kind, producer, instance, config, flush
 * arguments, pointing into cmd; tag the request id): 0, TR_ERR_INVAL for a setup without a
 * config, TR_ERR_UNSUPPORTED for a command the port has none for. */
int tr_port_msgs_from_relay(const Tracerelay__Command *cmd, struct tr_port_command *out);
void tr_port_msgs_command_free(struct port_command *m);

/* An event of a kind that carries no producer info (or NULL). */
struct port_event *tr_port_msgs_event_new(enum port_event_kind kind, uint32_t producer_id);
/* An event carrying a copy of *info (or NULL). */
struct port_event *tr_port_msgs_event_with_info(enum port_event_kind kind,
                                                const tr_producer_info *info);
/* A TRIGGER event for producer_id carrying a copy of name (or NULL). */
struct port_event *tr_port_msgs_event_trigger(uint32_t producer_id, const char *name);
/* A GUEST event carrying a copy of *g (or NULL). */
struct port_event *tr_port_msgs_event_guest(const tr_guest *g, bool gone);
/* Frees an event (and its command). */
void tr_port_msgs_event_free(struct port_event *e);

#endif
