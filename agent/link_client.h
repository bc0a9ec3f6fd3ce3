/* link_client.h: the agent's end of the relay link (docs/relay-protocol.md): one TLS
 * connection to the service, kept up with reconnects, carrying the chunk queue's contents as
 * numbered batches that survive link loss.
 *
 * Guarantees:
 * - Identity: the service's certificate must carry service_name (default: the host part of
 *   --service). Our own identity is our certificate; we never claim a name.
 * - Nothing queued is lost silently: entries leave the chunk queue in order, in ChunkBatches of
 *   up to TR_LINK_BATCH_BYTES of items or TR_LINK_BATCH_MS of waiting, compressed with zstd
 *   when the service accepted it (and the caller allowed it). Every batch is held in the spill
 *   queue (tr_relay_agent) until acknowledged and resent after a reconnect from the service's
 *   stored_seq; when the spill queue is full, the oldest batches are dropped and counted, and
 *   the counts go to the service in AgentStats (once a second, when they changed).
 * - Flow control: batches are written only while less than TR_LINK_WRITE_BOUND bytes of
 *   ciphertext wait in the socket's queue, so a slow service fills the spill queue, never
 *   blocks the caller or a producer.
 * - Batches are packed and compressed on a worker thread (batch_builder.h), one at a time, so
 *   the loop goes back to the producers' CommitData (and frees their shared memory) at once.
 * - A CommandReply carries after_seq = the last batch queued once everything pushed to the
 *   chunk queue before the reply is in a batch, so the service applies it after the data that
 *   preceded it: a reply waits for those batches to be built, and replies made while
 *   disconnected wait (up to TR_LINK_MAX_PENDING_FRAMES) for the next Welcome. A producer's
 *   PRODUCER_DISCONNECTED keeps the same order, so a session that waits for that producer's
 *   data sources to stop never ends before the producer's last chunks are in.
 * - Clock probes are answered at once, with a ClockFollowUp (FEATURE_CLOCK_FOLLOW_UP) carrying
 *   the exact time the answer left once the kernel has it; host clock snapshots go while data
 *   sources run (link_clock.h).
 * - Reconnects: capped exponential backoff with +-20% jitter (100 ms doubling to 10 s by
 *   default), reset by each Welcome. The name is resolved again on each attempt. A service
 *   that refused us for being busy (no TLS handshake slot in time, tls_uv.h, or Goodbye
 *   REASON_OVERLOADED) is tried again after TR_RELAY_BUSY_RETRY_MIN_MS to _MAX_MS (5-20 s,
 *   relay_session.h), uniformly at random, so that a storm's refused agents come back spread
 *   out, not in step.
 * Everything else runs on the loop's thread. */
#ifndef TR_LINK_CLIENT_H
#define TR_LINK_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "agent/link_clock.h"
#include "agent/link_ordered.h"
#include "agent/link_stats.h"
#include "relay/producer/chunk_queue.h"
#include "relay/link/relay_session.h"
#include "relay/link/tls.h"
#include "tracerelay/relay.pb-c.h"

#define TR_LINK_BATCH_BYTES (1u << 20)
#define TR_LINK_BATCH_MS 20
#define TR_LINK_WRITE_BOUND (1u << 20)
#define TR_LINK_BACKOFF_MIN_MS 100
#define TR_LINK_BACKOFF_MAX_MS 10000

typedef struct tr_link_client tr_link_client;

struct tr_link_client_callbacks {
  void *data;
  /* A Welcome was handled: send a PRODUCER_CONNECTED update for every live producer now
   * (tr_link_client_send_producer_update). */
  void (*on_welcome)(tr_link_client *lc);
  /* A Command from the service; the callee answers it with tr_link_client_reply (except
   * flush, answered by a FlushAck in the chunk queue). cmd is valid during the call only. */
  void (*on_command)(tr_link_client *lc, const Tracerelay__Command *cmd);
  /* Optional: the link came back to a different service instance (it restarted), which knows
   * nothing of the data source instances the old one set up: stop each of them on its producer
   * (no reply goes anywhere), as traced does when a consumer goes away, so that the new
   * service's sessions can start them afresh. Called before on_welcome, once per instance. */
  void (*on_stale_instance)(tr_link_client *lc, uint32_t producer_id, uint64_t instance_id);
  /* Optional, before each AgentStats: refresh the counters (tr_link_client_set_producer_counts). */
  void (*collect_stats)(tr_link_client *lc);
};

struct tr_link_client_opts {
  const char *service;      /* "HOST:PORT" or "[V6]:PORT" */
  const char *service_name; /* name the service certificate must carry; NULL: HOST */
  tr_tls_config *tls;       /* client role; referenced */
  tr_chunkq *queue;         /* owned by the caller; drained by the link */
  size_t spill_bytes;       /* 0: TR_RELAY_SPILL_DEFAULT */
  bool compress;            /* zstd batches when the service accepts them */
  uint64_t features;        /* offered; 0: TR_RELAY_FEATURES_ALL */
  uint64_t heartbeat_interval_ms, heartbeat_timeout_ms; /* 0: the relay defaults */
  unsigned backoff_min_ms, backoff_max_ms;               /* 0: the defaults above */
  uint64_t clock_snapshot_interval_ms; /* HostClockSnapshot period; 0: TR_LINK_CLOCK_SNAPSHOT_MS */
};

/* Starts connecting. TR_ERR_CONFIG for an unparsable --service (logged), TR_ERR_NOMEM. */
int tr_link_client_start(uv_loop_t *loop, const struct tr_link_client_opts *opts,
                         const struct tr_link_client_callbacks *cbs, tr_link_client **out);
/* The chunk queue has new entries: they are batched within TR_LINK_BATCH_MS. */
void tr_link_client_kick(tr_link_client *lc);
/* Batches everything queued now, without the TR_LINK_BATCH_MS wait: a FlushAck was queued
 * behind its data, and the service's flush waits for it. */
void tr_link_client_send_queued(tr_link_client *lc);
/* Sends a ProducerUpdate now, except PRODUCER_DISCONNECTED, which goes once everything the
 * chunk queue held before it is in a batch, with after_seq (as a reply does), so the service
 * ends the producer after its last chunks. TR_ERR_CLOSED when no Welcome is current (the full
 * state is sent again after the next one); TR_ERR_UNSUPPORTED for a guest's producer when the
 * service did not accept FEATURE_GUEST_MACHINES; TR_ERR_FULL, TR_ERR_NOMEM. The caller keeps u. */
int tr_link_client_send_producer_update(tr_link_client *lc, const Tracerelay__ProducerUpdate *u);
/* Sends a Trigger frame (relay.proto). TR_ERR_CLOSED when no Welcome is current,
 * TR_ERR_UNSUPPORTED when the service did not accept FEATURE_TRIGGERS (an older one). */
int tr_link_client_send_trigger(tr_link_client *lc, const Tracerelay__Trigger *t);
/* Send a GuestMachine / GuestClockExchange frame (relay.proto). TR_ERR_CLOSED when no Welcome
 * is current, TR_ERR_UNSUPPORTED when the service did not accept FEATURE_GUEST_MACHINES. */
int tr_link_client_send_guest(tr_link_client *lc, const Tracerelay__GuestMachine *g);
int tr_link_client_send_guest_clock(tr_link_client *lc, const Tracerelay__GuestClockExchange *x);
/* Answers a Command. error: NULL for success. Batches everything in the chunk queue first, so
 * after_seq covers it. */
int tr_link_client_reply(tr_link_client *lc, uint64_t request_id, const char *error);
/* Sends the host's builtin clocks read now as a HostClockSnapshot. TR_ERR_CLOSED when no
 * Welcome is current or the service did not accept FEATURE_HOST_CLOCK_SNAPSHOTS (nothing is
 * kept for later: a snapshot is only worth its moment). */
int tr_link_client_send_clock_snapshot(tr_link_client *lc);
/* A data source started or stopped: sends a snapshot now, then every clock snapshot interval
 * while active (some data source of this host runs). interval_ms: the session's
 * snapshot_interval_ms, 0 if none; the shortest given since the host became active is used
 * (at least TR_LINK_CLOCK_SNAPSHOT_MIN_MS), else clock_snapshot_interval_ms. */
void tr_link_client_clock_snapshots(tr_link_client *lc, bool active, uint32_t interval_ms);
/* A producer's ABI violations and SMB-full findings so far (monotonic), for AgentStats
 * (link_stats.h). */
int tr_link_client_set_producer_counts(tr_link_client *lc, uint32_t producer_id,
                                       const struct tr_link_producer_counts *counts);
/* Calls fn (if not NULL) for every data source instance the service set up here and has not
 * stopped; returns how many there are. fn must not change the link's commands. */
size_t tr_link_client_instances(const tr_link_client *lc,
                                void (*fn)(void *data, uint32_t producer_id, uint64_t instance_id),
                                void *data);
/* Uses cfg (referenced) for the next connections. */
void tr_link_client_reload_tls(tr_link_client *lc, tr_tls_config *cfg);
/* Counters over the agent's life, for its metrics: Welcomes (the link came up), and summed
 * over producers (also departed ones, as of the last stats collection) ABI violations,
 * SMB-full findings and chunks dropped from the spill queue. */
struct tr_link_client_totals {
  uint64_t welcomes, upstream_losses, abi_violations, smb_full, smb_full_ns, spill_dropped_chunks;
};
void tr_link_client_totals(const tr_link_client *lc, struct tr_link_client_totals *t);
/* True while a Welcome is current on the connection. */
bool tr_link_client_connected(const tr_link_client *lc);
/* The spill queue (held batches, counted losses); read-only. */
const tr_relay_agent *tr_link_client_spill(const tr_link_client *lc);
void *tr_link_client_data(const tr_link_client *lc);

/* Batches what the chunk queue holds, waits up to timeout_ms for the service to acknowledge
 * every held batch, says Goodbye (REASON_SHUTDOWN) and closes. done(data) runs once every
 * handle is closed; lc is freed then. Unacknowledged batches are logged as lost. */
void tr_link_client_shutdown(tr_link_client *lc, unsigned timeout_ms, void (*done)(void *data),
                             void *data);

#endif
