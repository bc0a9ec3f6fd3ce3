/* relay_session.h: the bookkeeping of one relay link, independent of the transport: the
 * agent's resend window (its spill queue), the service's view of each agent instance's batch
 * sequence, heartbeat timing and feature negotiation. Pure logic: no sockets, no clocks (the
 * time is passed in), no protobuf messages.
 *
 * Guarantees, with batches numbered 1, 2, 3... per agent instance, across reconnects:
 * - Agent: every queued batch is held until the service acknowledges it; after a reconnect
 *   every held batch above Welcome.stored_seq is sent again, in order, none twice on one
 *   connection. The held frames are bounded in bytes (spill_bytes); beyond it the oldest are
 *   dropped and their chunks/bytes counted per producer. A dropped batch the service may
 *   still have received (sent on the last connection, not yet acked) is counted only once
 *   the next ack or Welcome says it was not stored, so a chunk is never both stored and
 *   counted lost.
 * - Service: per agent instance, the highest seq processed; a seq at or below it is a
 *   duplicate (ignored, counted); a seq above it + 1 is accepted and the skipped seqs are
 *   counted lost (the agent reports what they held in AgentStats).
 *
 * Costs: queueing and sending are O(1) per batch, acking O(1) per freed batch, plus
 * O(producers) per dropped batch and O(dropped-but-unsettled batches) per ack or Welcome; the
 * agent's memory is the held frames plus one small record per dropped-but-unsettled batch. */
#ifndef TR_RELAY_SESSION_H
#define TR_RELAY_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/link/relay_frame.h"

#define TR_RELAY_SPILL_DEFAULT (64u << 20)
#define TR_RELAY_HEARTBEAT_INTERVAL_NS 2000000000ull /* send one after 2 s of silence */
#define TR_RELAY_HEARTBEAT_TIMEOUT_NS 8000000000ull  /* peer dead after 8 s without a frame */
/* A side refused for being busy (tls_uv.h: no handshake slot in time; Goodbye
 * REASON_OVERLOADED) tries again this long later, uniformly at random: spread out, not in step. */
#define TR_RELAY_BUSY_RETRY_MIN_MS 5000
#define TR_RELAY_BUSY_RETRY_MAX_MS 20000

/* ---- features ---- */

#define TR_RELAY_FEATURE(f) (1ull << (f))
#define TR_RELAY_FEATURE_ZSTD TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_ZSTD_BATCHES)
#define TR_RELAY_FEATURE_CLOCK_PROBES TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_CLOCK_PROBES)
#define TR_RELAY_FEATURE_AGENT_STATS TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_AGENT_STATS)
#define TR_RELAY_FEATURE_HOST_CLOCKS                                                               \
  TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_HOST_CLOCK_SNAPSHOTS)
#define TR_RELAY_FEATURE_CLOCK_FOLLOW_UP                                                           \
  TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_CLOCK_FOLLOW_UP)
/* Only on a regional's relayed links (Hello.relayed_host): never offered by an agent. */
#define TR_RELAY_FEATURE_RELAYED_CLOCKS                                                            \
  TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_RELAYED_CLOCKS)
/* Only between an agent and its regional (regional.h): a service never sends UpstreamLost. */
#define TR_RELAY_FEATURE_UPSTREAM_LOST                                                             \
  TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_UPSTREAM_LOST)
/* A regional's carrier link (relay_link.h, carriers): offered in no agent's Hello. */
#define TR_RELAY_FEATURE_MULTIPLEX TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_MULTIPLEX)
#define TR_RELAY_FEATURE_TRIGGERS TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_TRIGGERS)
/* Features whose frames a regional must know to pass them on (it decodes every frame, and
 * closes a link that sends one it does not know): a regional's carrier Hello offers those it
 * passes on, and a host it relays gets one only if its carrier's Welcome accepted it. A 0.2.0
 * regional offers none, yet passes its agents' Hello feature bits on unchanged, unknown ones
 * too: without this its agents would be granted triggers and their links cut at the first. */
#define TR_RELAY_FEATURES_CARRIED TR_RELAY_FEATURE_TRIGGERS
#define TR_RELAY_FEATURE_GUESTS TR_RELAY_FEATURE(TRACERELAY__FEATURE__FEATURE_GUEST_MACHINES)
/* The longest guest name a GuestMachine frame carries (relay.proto). */
#define TR_RELAY_GUEST_NAME_MAX 40u
/* The longest trigger name a Trigger frame carries (relay.proto). */
#define TR_RELAY_TRIGGER_NAME_MAX 256u
/* Everything an agent's link implements. */
#define TR_RELAY_FEATURES_ALL                                                                      \
  (TR_RELAY_FEATURE_ZSTD | TR_RELAY_FEATURE_CLOCK_PROBES | TR_RELAY_FEATURE_AGENT_STATS |       \
   TR_RELAY_FEATURE_HOST_CLOCKS | TR_RELAY_FEATURE_CLOCK_FOLLOW_UP |                            \
   TR_RELAY_FEATURE_UPSTREAM_LOST | TR_RELAY_FEATURE_TRIGGERS | TR_RELAY_FEATURE_GUESTS)

/* The largest frame a Hello or Welcome says its sender accepts (has ? bytes : absent), 0 or
 * absent meaning TR_RELAY_MAX_FRAME_DEFAULT; 0 if outside [TR_RELAY_MIN_FRAME,
 * TR_RELAY_MAX_FRAME_LIMIT] (a protocol error). */
uint32_t tr_relay_max_frame_said(bool has, uint32_t bytes);
/* Service: the features to accept in Welcome (bits unknown to us are dropped). */
uint64_t tr_relay_features_negotiate(uint64_t ours, uint64_t offered);
/* Agent: 0 if the service accepted only what was offered, else TR_ERR_PROTO. */
int tr_relay_features_check(uint64_t offered, uint64_t accepted);

/* ---- agent: the spill queue and resend window ---- */

typedef struct tr_relay_batch tr_relay_batch; /* one held or dropped batch (private) */

typedef struct tr_relay_agent {
  uint64_t instance_id;
  uint64_t next_seq;   /* seq of the next batch queued */
  uint64_t acked_seq;  /* highest seq the service confirmed (Hello.acked_seq) */
  uint64_t sent_seq;   /* highest seq written since the last Welcome (or acked_seq) */
  size_t spill_bytes;  /* bound on held frame bytes */
  size_t held_bytes;   /* frame bytes held now */
  bool resumed;        /* a Welcome was handled on the current connection */
  tr_relay_batch *head, *tail; /* held batches, oldest first */
  tr_relay_batch *cursor;      /* next held batch to send, NULL when all are sent */
  tr_relay_batch *doubt_head, *doubt_tail; /* dropped after sending: stored or not? */
  /* Counted losses (read-only outside): per producer and target buffer, and the dropped
   * frames. */
  tr_relay_tally *lost;
  size_t n_lost;
  uint64_t lost_batches;
  uint64_t lost_frame_bytes;
} tr_relay_agent;

/* instance_id: non-zero, random per agent process. spill_bytes: 0 = TR_RELAY_SPILL_DEFAULT. */
int tr_relay_agent_init(tr_relay_agent *a, uint64_t instance_id, size_t spill_bytes);
void tr_relay_agent_free(tr_relay_agent *a);
/* Queues a whole ChunkBatch frame (tr_relay_batch_encode) built with seq = a->next_seq, with
 * the tally of its chunks. Takes ownership of frame and tally on every path. Drops the oldest
 * batches while more than spill_bytes would be held. A frame larger than spill_bytes on its
 * own is dropped and counted (TR_ERR_TOO_BIG); a wrong seq is TR_ERR_INVAL. */
int tr_relay_agent_queue(tr_relay_agent *a, uint64_t seq, uint8_t *frame, size_t len,
                         tr_relay_tally *tally, size_t n_tally);
/* The next batch to write on the link, in seq order, marked sent: 1 and *frame, *len, *seq
 * (valid until the next call on a), or 0 when none is waiting or no Welcome was handled yet.
 * Flow control is the caller's: take a batch only when the transport has room for it. */
int tr_relay_agent_next(tr_relay_agent *a, const uint8_t **frame, size_t *len, uint64_t *seq);
/* BatchAck: frees every batch up to seq. TR_ERR_PROTO for a seq never sent; an older ack is
 * ignored. */
int tr_relay_agent_ack(tr_relay_agent *a, uint64_t seq);
/* Welcome: stored_seq (0 = the service does not know this instance) settles every batch at
 * or below it as stored, every dropped batch above it as lost, and rewinds the sending to the
 * oldest held batch. TR_ERR_PROTO when the service claims a seq never queued or less than it
 * already acknowledged. */
int tr_relay_agent_resume(tr_relay_agent *a, uint64_t stored_seq);
/* The link is gone: nothing more is sent until the next Welcome. */
void tr_relay_agent_disconnected(tr_relay_agent *a);

/* ---- service: one agent instance's batch sequence ---- */

typedef struct tr_relay_peer {
  uint64_t instance_id; /* 0 until the first Hello */
  uint64_t stored_seq;  /* highest seq processed: stored or counted lost */
  /* Counters, over every instance of this host's agent. */
  uint64_t duplicate_batches;
  uint64_t lost_batches; /* seqs the agent skipped (dropped from its spill queue) */
  uint64_t agent_restarts;
} tr_relay_peer;

void tr_relay_peer_init(tr_relay_peer *p);
/* Hello: sets *welcome_seq to the value for Welcome.stored_seq. A new instance id (first
 * connection, or a restarted agent) starts at the agent's acked_seq and gets 0. TR_ERR_PROTO
 * for instance id 0, or an agent claiming acks beyond what was stored. */
int tr_relay_peer_hello(tr_relay_peer *p, uint64_t instance_id, uint64_t agent_acked_seq,
                        uint64_t *welcome_seq);
/* A ChunkBatch arrived: 1 = store it (the seqs skipped before it are counted lost), 0 = a
 * duplicate to ignore, TR_ERR_PROTO for seq 0. Ack p->stored_seq once it is stored. The seq
 * is spent either way: a batch the caller then cannot store (its items do not decode) is
 * counted by the caller in lost_batches before it drops the link, or nobody would count it. */
int tr_relay_peer_batch(tr_relay_peer *p, uint64_t seq);

/* ---- heartbeats: pure functions of the time passed in (ns, any monotonic clock) ---- */

typedef struct tr_relay_heartbeat {
  uint64_t interval_ns;
  uint64_t timeout_ns;
  uint64_t last_sent_ns;
  uint64_t last_heard_ns;
} tr_relay_heartbeat;

/* 0 = the defaults above. TR_ERR_INVAL unless interval < timeout. */
int tr_relay_heartbeat_init(tr_relay_heartbeat *hb, uint64_t interval_ns, uint64_t timeout_ns,
                            uint64_t now_ns);
/* Any frame written / read counts. */
void tr_relay_heartbeat_sent(tr_relay_heartbeat *hb, uint64_t now_ns);
void tr_relay_heartbeat_heard(tr_relay_heartbeat *hb, uint64_t now_ns);
/* True when nothing was sent for interval: send a Heartbeat. */
bool tr_relay_heartbeat_due(const tr_relay_heartbeat *hb, uint64_t now_ns);
/* True when nothing was heard for timeout: close the link. */
bool tr_relay_heartbeat_dead(const tr_relay_heartbeat *hb, uint64_t now_ns);
/* When to check again: the earlier of the two deadlines. */
uint64_t tr_relay_heartbeat_deadline(const tr_relay_heartbeat *hb);

#endif
