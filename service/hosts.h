/* hosts.h: the service's host table: one tr_host per machine name, kept while it is
 * connected or a session holds it, and for a while after it is gone, so that a host's stats,
 * producers and clock estimate survive reconnects: when more than TR_HOSTS_MAX_GONE hosts are
 * gone and held by no session, the longest gone is retired (freed, logged, counted in
 * tr_hosts_retired) as the next new entry is made; hosts.c says who may keep a pointer.
 *
 * The fields of the public tr_host (host.h) are written here only and read elsewhere (the
 * link server reports its connection and batches through the tr_hosts_link_* and
 * tr_hosts_batch_* functions). Besides the tr_host, each entry holds what only the link
 * needs across connections: the batch sequence bookkeeping of its agent instance
 * (tr_relay_peer), the AgentStats of earlier agent instances, and CommandReplies waiting for
 * their batches.
 *
 * Producers: host->producers holds the producers the agent says are connected. A
 * ProducerUpdate is applied, then the producers_changed event is called; a producer that
 * is gone is shown with connected = false during that call and removed right after it.
 * A new agent instance (restart) or a resync that does not re-announce a producer ends it the
 * same way.
 *
 * Costs: lookups by name are O(1) on average (a hash index; done once per connection) and
 * O(producers of the host + its data sources^2, at most 256^2) per update, O(buffers with
 * drops^2) per AgentStats, O(commands in flight) per reply. Memory per host is bounded by
 * TR_HOSTS_MAX_DESCRIBED_BYTES (producers), TR_HOSTS_MAX_HELD_BYTES (held frames),
 * TR_HOSTS_MAX_COMMANDS_IN_FLIGHT, TR_HOSTS_MAX_BUFFER_DROPS and the clock state: an
 * authenticated agent cannot make the root hold more for it (docs/security.md). Not
 * thread-safe (one loop). */
#ifndef TR_SERVICE_HOSTS_H
#define TR_SERVICE_HOSTS_H

#include <stdint.h>

#include "relay/link/relay_session.h"
#include "service/link_calls.h"

#define TR_HOSTS_MAX_PRODUCERS 4096
#define TR_HOSTS_MAX_HELD_FRAMES 1024
/* Bytes of those held frames together (each as encoded): an honest agent's replies and
 * producer ends are tens of bytes each. */
#define TR_HOSTS_MAX_HELD_BYTES (1u << 20)
/* Commands the service sent the host and awaits a CommandReply for (every kind but Flush,
 * which a FlushAck answers); beyond it the oldest is forgotten, and its reply, if it ever
 * comes, is refused as unexpected. */
#define TR_HOSTS_MAX_COMMANDS_IN_FLIGHT 4096
/* A producer's description (ProducerUpdate): its data sources, as many as the agent's
 * producer port takes (TR_PRODUCER_PORT_MAX_DATA_SOURCES); its name, sdk_version and each
 * data source's name in bytes; each descriptor as encoded; and every producer of a host
 * together, as encoded. */
#define TR_HOSTS_MAX_DATA_SOURCES 256
#define TR_HOSTS_MAX_NAME_BYTES 1024
#define TR_HOSTS_MAX_DESCRIPTOR_BYTES (64u << 10)
#define TR_HOSTS_MAX_DESCRIBED_BYTES (8u << 20)
/* Buffers a host's agent may report drops for; beyond them a buffer's drops count in the
 * host-wide counters only. */
#define TR_HOSTS_MAX_BUFFER_DROPS 1024
/* Hosts gone (disconnected) and in no session that the table keeps, in case they come back;
 * beyond them the longest gone is retired. */
#define TR_HOSTS_MAX_GONE 1024

typedef struct tr_hosts tr_hosts;

/* The service's one host table: the link server adds to it, the sessions, the status and the
 * metrics walk it. ev's calls go to svc: those made from here (producers_changed,
 * command_reply) and the link server's (tr_hosts_service, tr_hosts_events). */
int tr_hosts_new(tr_service *svc, const struct tr_link_events *ev, tr_hosts **out);
/* Frees every host. Nobody may hold a tr_host pointer afterwards. */
void tr_hosts_free(tr_hosts *hs);
/* What the table was made with. */
tr_service *tr_hosts_service(const tr_hosts *hs);
const struct tr_link_events *tr_hosts_events(const tr_hosts *hs);

/* Every host that ever said Hello, in that order:
 * for (tr_host *h = tr_hosts_first(hs); h; h = h->next). NULL if none. */
tr_host *tr_hosts_first(const tr_hosts *hs);
/* How many there are now (O(1)). */
size_t tr_hosts_count(const tr_hosts *hs);
/* Hosts retired so far (gone, held by no session, past the gone hosts the table keeps), and
 * how many it keeps (TR_HOSTS_MAX_GONE; a test sets fewer). */
uint64_t tr_hosts_retired(const tr_hosts *hs);
void tr_hosts_set_max_gone(tr_hosts *hs, size_t max_gone);
/* The entry's number in its table: 0, 1, 2... in the order they were made, never reused, not
 * even by a retired host that comes back (an index for arrays by host, e.g. a session's host
 * entries). */
size_t tr_hosts_ordinal(const tr_host *h);
/* The host called name, or NULL. */
tr_host *tr_hosts_find(const tr_hosts *hs, const char *name);
/* The host called name, created (with its clock estimator) if new, gone until its link is up;
 * making it may retire other hosts first (any tr_host pointer not held by a session may be
 * freed by this call). name must be a valid machine name (tr_tls_valid_machine_name).
 * TR_ERR_INVAL or TR_ERR_NOMEM. */
int tr_hosts_get(tr_hosts *hs, const char *name, tr_host **out);

/* Whether host's producer i can be reached now: connected to its agent, and the agent's link
 * up. What status and QueryServiceState list; a link that drops keeps the producers for the
 * sessions (they carry on when it comes back) but shows none while it is down. */
static inline bool tr_hosts_producer_reachable(const tr_host *host, size_t i) {
  return host->link != NULL && host->producers[i].connected;
}

/* The host's batch sequence bookkeeping, over all its agent instances. */
tr_relay_peer *tr_hosts_peer(tr_host *host);

/* A Hello from the host's agent: instance bookkeeping (tr_relay_peer_hello), a restarted
 * agent's producers ended and its held replies applied, the system info kept (with
 * machine_name = the host's name). *welcome_seq is for Welcome.stored_seq. TR_ERR_PROTO for a
 * Hello the bookkeeping refuses, TR_ERR_NOMEM. */
int tr_hosts_hello(tr_hosts *hs, tr_host *host, const Tracerelay__Hello *hello,
                   uint64_t *welcome_seq);

/* Starts a resync after Welcome: the producers not re-announced with PRODUCER_CONNECTED
 * before tr_hosts_resync_end are ended then, the host's and its guests' alike. */
int tr_hosts_resync_begin(tr_hosts *hs, tr_host *host);
void tr_hosts_resync_end(tr_hosts *hs, tr_host *host);

/* Whether the host may take the ProducerUpdate: 0, or TR_ERR_PROTO with err saying which
 * limit it passes (producer id 0, an unknown state, more than TR_HOSTS_MAX_PRODUCERS producers
 * or TR_HOSTS_MAX_DATA_SOURCES data sources, a name over TR_HOSTS_MAX_NAME_BYTES, a descriptor
 * over TR_HOSTS_MAX_DESCRIPTOR_BYTES, the host's descriptions over
 * TR_HOSTS_MAX_DESCRIBED_BYTES). O(the update's size + the producer's data sources). */
int tr_hosts_producer_update_check(const tr_host *host, const Tracerelay__ProducerUpdate *u,
                                   char *err, size_t err_len);
/* Applies a ProducerUpdate and tells the sessions. The update is the entry's it names: with
 * guest_id, that relayed guest's of host (a guest the service refused or that left: ignored,
 * so the producer is known nowhere, gets no data source and can write into no buffer);
 * without, the owner of the producer (tr_hosts_producer_owner). TR_ERR_PROTO for an update
 * tr_hosts_producer_update_check refuses (nothing applied); an update for an unknown producer
 * is ignored (it may have been ended by a resync). TR_ERR_NOMEM. */
/* The entry a ProducerUpdate of host's link is for: the relayed guest it names (NULL: one the
 * service refused or that left), else the producer's owner (tr_hosts_producer_owner). */
tr_host *tr_hosts_update_entry(tr_host *host, const Tracerelay__ProducerUpdate *u);
int tr_hosts_producer_update(tr_hosts *hs, tr_host *host, const Tracerelay__ProducerUpdate *u);

/* AgentStats: the latest counters of the current agent instance, added to those of its
 * earlier instances in host->stats. */
void tr_hosts_agent_stats(tr_host *host, const Tracerelay__AgentStats *stats);

/* What the host's agents dropped of the chunks for buffer global_id (all zero if nothing). */
tr_host_buffer_drops tr_hosts_buffer_drops(const tr_host *host, uint32_t global_id);

/* A flush the host did not answer in time (stats.flushes_missed). */
void tr_hosts_count_flush_missed(tr_host *host);

/* The link server's news of the host's connection: its link came up (link, at service
 * BOOTTIME now_ns; relayed_by: the regional carrying it, or NULL) or went down (stats.disconnects), the agent said goodbye (orderly: with
 * REASON_SHUTDOWN, which a restart then does not count as unclean). */
void tr_hosts_link_up(tr_host *host, tr_link_peer *link, uint64_t now_ns,
                      const char *relayed_by);
void tr_hosts_link_down(tr_host *host);
void tr_hosts_agent_goodbye(tr_host *host, bool orderly);
/* And of its batches: after tr_relay_peer_batch on tr_hosts_peer(host) (stats follow its
 * duplicate and lost counts); a batch whose seq is spent but which could not be used (counted
 * lost); each chunk delivered, of payload_len bytes; a batch applied whole. */
void tr_hosts_batch_seen(tr_host *host);
void tr_hosts_batch_unusable(tr_host *host);
void tr_hosts_chunk_received(tr_host *host, size_t payload_len);
void tr_hosts_batch_applied(tr_host *host);

/* ---- guest machines (relay.proto GuestMachine, FEATURE_GUEST_MACHINES) ----
 * A guest is an entry of the table like a host, named "<host>/<name>" (no certificate name
 * has a '/', so a guest can never pass for a host), kept for the service's life; while its
 * agent relays it, guest_id is set and its link is its host's. */

#define TR_HOSTS_MAX_GUESTS 64 /* guest entries per host, over the service's life */

/* A GuestMachine (not gone) on host's link: the guest's entry, made if new, given its id, its
 * host's agent instance and link, and its system info (machine_name = its name). *joined: it
 * was not relayed before (the sessions should hear it connected). TR_ERR_PROTO for id 0, a
 * name outside the machine-name alphabet or over TR_RELAY_GUEST_NAME_MAX, or an id another
 * guest of the host has; TR_ERR_FULL for a new guest past TR_HOSTS_MAX_GUESTS; TR_ERR_NOMEM. */
int tr_hosts_guest_join(tr_hosts *hs, tr_host *host, const Tracerelay__GuestMachine *g,
                        tr_host **out, bool *joined);
/* The relayed guest of host with that id, or NULL. */
tr_host *tr_hosts_guest_find(const tr_host *host, uint32_t guest_id);
/* The guest left (GuestMachine.gone), or its host's link went down: no longer relayed (no
 * link, no id). Its producers stay until their own ordered PRODUCER_DISCONNECTED, which follows
 * their last chunks (or a resync or agent restart ends them). The caller tells the sessions it
 * disconnected. */
void tr_hosts_guest_leave(tr_host *guest);
/* A guest's clock exchange its host's clock estimate could not map yet (none yet at the first
 * exchange, which traced_relay sends as it connects, then only every 30 s): the latest one is
 * kept, and taken (true) when the host's clock has been measured. */
void tr_hosts_guest_hold_clock(tr_host *guest, const struct tr_clocksync_probe *ex);
bool tr_hosts_guest_held_clock(tr_host *guest, struct tr_clocksync_probe *ex);
/* Host's guests, relayed or not (ever made): *n of them. */
tr_host *const *tr_hosts_guests(const tr_host *host, size_t *n);
/* The entry a producer id of host's agent belongs to: one of its relayed guests if that guest
 * has the producer, else host. O(the guests' producers). */
tr_host *tr_hosts_producer_owner(tr_host *host, uint32_t producer_id);

/* Keeps a HostClockSnapshot of the host's agent, received at service BOOTTIME received_ns, in
 * host->clock_snapshots. TR_ERR_PROTO for an empty snapshot, more than TR_CLOCK_SNAPSHOT_MAX
 * clocks, or ids outside 1..63 (service/timeline_output.c). */
int tr_hosts_add_clock_snapshot(tr_host *host, const Tracerelay__HostClockSnapshot *snap,
                                int64_t received_ns);

/* A command is going to the host's agent (the link server's send_command): a reply to it is
 * expected, unless it is a Flush. */
void tr_hosts_command_sent(tr_host *host, const Tracerelay__Command *cmd);

/* Keeps a frame the agent ordered after its batches (ownership taken, freed with
 * tr_relay_frame_free) until the host's stored_seq reaches its after_seq: a CommandReply, or a
 * ProducerUpdate PRODUCER_DISCONNECTED (so a producer's end never overtakes its data, and a
 * session waiting for it does not end before its last chunks are in). The frame is freed and
 * not held on TR_ERR_NOT_FOUND, a reply to no command in flight (counted in
 * stats.replies_unexpected), and on TR_ERR_FULL, when TR_HOSTS_MAX_HELD_FRAMES or
 * TR_HOSTS_MAX_HELD_BYTES would be passed. */
int tr_hosts_hold_ordered(tr_host *host, Tracerelay__RelayFrame *frame);
/* Applies, in arrival order, the held frames whose after_seq the host's stored_seq has
 * reached: replies through the command_reply event, producer ends through
 * tr_hosts_producer_update. */
void tr_hosts_release_ordered(tr_hosts *hs, tr_host *host);

#endif
