/* link_calls.h: the calls between the link (link_server.c, and hosts.c for producers and
 * held replies) and the tracing sessions (session.c), both ways, each through a table of
 * function pointers that the other side is given, so that either side can be replaced by a
 * test or a fuzzer: upward, struct tr_link_events, which session.c fills and the link server
 * is started with; downward, struct tr_link_commands, which link_server.c fills and the
 * sessions' state is made with. Everything runs on one libuv loop; nothing here is
 * thread-safe. */
#ifndef TR_SERVICE_LINK_CALLS_H
#define TR_SERVICE_LINK_CALLS_H

#include <stdbool.h>

#include "service/host.h"
#include "tracerelay/relay.pb-c.h"

typedef struct tr_service tr_service; /* the sessions' state (session.h) */

/* Upward calls: what the link (link_server.c, and hosts.c for producers and held replies)
 * tells the sessions, each with the tr_service it was given. session.c implements them
 * (tr_session_link_events); tests and fuzzers give their own. Each is safe to call at any
 * time; a call for a host or producer no session uses is a no-op. */
struct tr_link_events {
  void (*host_connected)(tr_service *svc, tr_host *host);
  void (*host_disconnected)(tr_service *svc, tr_host *host, const char *reason);
  /* After hosts.c applied the update to host->producers. */
  void (*producers_changed)(tr_service *svc, tr_host *host, uint32_t producer_id);
  void (*chunk)(tr_service *svc, tr_host *host, const Tracerelay__Chunk *chunk);
  void (*patch)(tr_service *svc, tr_host *host, const Tracerelay__Patch *patch);
  /* arrived_ns: BOOTTIME when the bytes that carried the ack reached the service's socket
   * (tr_tls_uv_read_time), 0 if not known. */
  void (*flush_ack)(tr_service *svc, tr_host *host, const Tracerelay__FlushAck *ack,
                    int64_t arrived_ns);
  void (*command_reply)(tr_service *svc, tr_host *host, const Tracerelay__CommandReply *reply);
  /* A producer of the host activated a trigger (its name checked for length); NULL: triggers
   * are not taken. */
  void (*trigger)(tr_service *svc, tr_host *host, const Tracerelay__Trigger *trigger);
  /* A HostClockSnapshot from the host's agent: kept in host->clock_snapshots
   * (tr_hosts_add_clock_snapshot, whose errors it returns). */
  int (*host_clock_snapshot)(tr_service *svc, tr_host *host,
                             const Tracerelay__HostClockSnapshot *snap);
  /* Whether any tracing session records (has not stopped; the link probes clocks densely
   * then). */
  bool (*any_session)(const tr_service *svc);
  /* Whether the sessions hold the host (or one of its guests): a session has an entry for it,
   * or a stop waits for it. hosts.c retires only hosts that are gone and not held. NULL (a
   * test or fuzzer without sessions): none is held. */
  bool (*holds_host)(const tr_service *svc, const tr_host *host);
};

/* Downward calls: what the sessions ask of a host's agent. link_server.c implements them
 * (tr_link_server_commands); the session tests give their own. Each is safe to call for a
 * host that is not connected. */
struct tr_link_commands {
  /* Queues a command for the host's agent; the caller keeps ownership of cmd. TR_ERR_CLOSED
   * if the host is not connected. */
  int (*send_command)(tr_host *host, const Tracerelay__Command *cmd);
  /* Asks the host's agent to answer a clock probe now (before a flush or a start), if
   * connected and its last probe is older than its session probe period (younger is fresh
   * enough). */
  void (*probe_clock)(tr_host *host);
  /* When the certificate the host's agent connected with expires (Unix seconds), for
   * `tracerelay status`; 0 when it is not connected or is relayed (its regional watches that
   * one). NULL: never known. */
  int64_t (*cert_expiry)(const tr_host *host);
};

#endif
