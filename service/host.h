/* host.h: one host of the service as its agent told it, a tr_host: its producers and their
 * data sources, its link and agent counters, what its agent dropped per buffer, its clock
 * estimator and clock snapshots. hosts.c keeps one per machine name (the host table,
 * hosts.h) and alone writes its fields; the link server, the sessions, the read side, the
 * status and the metrics read them. */
#ifndef TR_SERVICE_HOST_H
#define TR_SERVICE_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/common/data_source_descriptor.pb-c.h"
#include "perfetto/trace/system_info.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/clock/clocksync.h"
#include "relay/producer/ipc_host.h"
#include "service/machine_ids.h"

typedef struct tr_host tr_host;
typedef struct tr_link_peer tr_link_peer; /* one agent connection, owned by link_server.c */

/* A producer on a remote host, as its agent described it (ProducerUpdate). */
typedef struct tr_remote_producer {
  uint32_t id;             /* agent-local producer id, never reused within an agent instance */
  char *name;
  uint32_t uid;
  int32_t pid;
  char *sdk_version;
  bool connected;
  Perfetto__Protos__DataSourceDescriptor **data_sources; /* owned, unknown fields kept */
  size_t num_data_sources;
  size_t described_bytes; /* its names and descriptors, as encoded (TR_HOSTS_MAX_DESCRIBED_BYTES) */
} tr_remote_producer;

/* What a host's agent dropped of the chunks meant for one of the service's buffers
 * (AgentStats.Buffer), over every agent instance: the losses a session counts as its own. */
typedef struct tr_host_buffer_drops {
  uint64_t queue_chunks, queue_bytes, queue_packets;
  uint64_t spill_chunks, spill_bytes, spill_packets;
  /* What producers' departures cost the buffer: chunks left unscraped, and the connections
   * the agent closed, by reason (an enum tr_ipc_close; a reason this service does not know
   * counts at [TR_IPC_CLOSE_REASONS]). */
  uint64_t exit_unscraped_chunks;
  uint64_t producers_closed[TR_IPC_CLOSE_REASONS + 1];
} tr_host_buffer_drops;

/* A host's drops for one buffer: its current agent instance's latest report, and the sum over
 * the instances before it. */
struct tr_host_buffer_drops_rec {
  uint32_t global_id;
  tr_host_buffer_drops earlier, current;
};

/* Loss and traffic counters of one host, monotonic over the service's life. Agent-side
 * counters are the latest AgentStats values summed over producers. */
typedef struct tr_host_stats {
  uint64_t batches_received;
  uint64_t batches_duplicate;     /* resent after a reconnect and already stored */
  uint64_t chunks_received;
  uint64_t bytes_received;        /* chunk payload bytes */
  uint64_t link_lost_batches;     /* seq gaps: batches the agent dropped from its spill queue */
  uint64_t link_lost_chunks;
  uint64_t link_lost_bytes;
  uint64_t agent_queue_dropped_chunks;
  uint64_t agent_queue_dropped_bytes;
  uint64_t agent_spill_dropped_chunks;
  uint64_t agent_spill_dropped_bytes;
  uint64_t agent_smb_full;
  uint64_t agent_smb_full_ns; /* how long, at most (AgentStats.Producer.smb_full_ns) */
  uint64_t agent_abi_violations;
  uint64_t agent_queue_dropped_packets; /* packets begun in the dropped chunks above */
  uint64_t agent_spill_dropped_packets;
  uint64_t disconnects;
  uint64_t flushes_missed;        /* flushes this host did not ack within the timeout */
  /* Agent instances replaced by a new one without having said an orderly Goodbye (killed,
   * crashed, host rebooted): what their producers wrote and they had not relayed is lost,
   * count unknown. */
  uint64_t agent_exits_unclean;
  /* Producer connections the agent closed (AgentStats.Producer.closed_by_agent), and chunks
   * left unscraped in producers' shared memory at their departure. */
  uint64_t agent_producers_closed;
  uint64_t agent_exit_unscraped_chunks;
  /* CommandReplies for no command in flight, refused unheld (service/hosts.h). */
  uint64_t replies_unexpected;
} tr_host_stats;

#define TR_HOST_CLOCK_SNAPSHOTS 64
/* A host's name: a certificate's (at most 64 bytes), or a guest machine's "<host>/<guest>"
 * (the guest's part at most TR_RELAY_GUEST_NAME_MAX, 40). */
#define TR_HOST_NAME_MAX 105

/* One HostClockSnapshot of an agent, as received. */
struct tr_host_clock_snapshot {
  struct tr_clock_snapshot snap; /* the host's clocks (simulated ones under --fake-clock) */
  int64_t received_ns;           /* service BOOTTIME at receipt */
};

struct tr_host {
  char name[TR_HOST_NAME_MAX + 1]; /* machine name, from the agent's certificate */
  /* A guest machine behind that host's agent (relay.proto GuestMachine): named "<host>/<its
   * name>", its producers, system info and clock its own, its link its host's. NULL: a host. */
  tr_host *guest_of;
  uint32_t guest_id;              /* while it is relayed: its agent-local id; else 0 */
  /* What traces call it, and its machine_id, tr_machine_id(trace_name): its name, or
   * "NAME#K" when the ids of its name are another host's (service/machine_ids.h). */
  char trace_name[TR_MACHINE_IDS_NAME_MAX + 1];
  uint32_t machine_id;
  uint64_t agent_instance_id;     /* from Hello; a new one means the agent restarted */
  bool agent_said_goodbye;        /* the current instance ended a link with Goodbye(SHUTDOWN) */
  bool restarted_unclean;         /* the last Hello came from a new instance that replaced one
                                   * without such a Goodbye (stats.agent_exits_unclean) */
  tr_link_peer *link;             /* NULL while disconnected; the host entry stays */
  char relayed_by[65];            /* tiers: the regional carrying the current (or last) link;
                                   * "" for a direct one */
  uint64_t connected_since_ns;    /* service BOOTTIME of the current (or last) connection */
  Perfetto__Protos__SystemInfo *system_info; /* from Hello, machine_name set by us; owned */
  tr_remote_producer *producers;  /* array */
  size_t num_producers;
  struct tr_clocksync *clock;     /* host BOOTTIME -> service BOOTTIME */
  /* The agent's HostClockSnapshots, the last TR_HOST_CLOCK_SNAPSHOTS of them: snapshot number
   * g (1, 2, ...) is at [(g - 1) % TR_HOST_CLOCK_SNAPSHOTS]; clock_snapshots_taken is the
   * newest g. Sessions write those received since they started (service/timeline_output.c). */
  struct tr_host_clock_snapshot clock_snapshots[TR_HOST_CLOCK_SNAPSHOTS];
  uint64_t clock_snapshots_taken;
  tr_host_stats stats;
  /* What the agent dropped per buffer it was meant for (tr_hosts_buffer_drops reads it). */
  struct tr_host_buffer_drops_rec *buffer_drops;
  size_t num_buffer_drops;
  tr_host *next;
};

#endif
