/* link_server.h: the service's end of the relay link (docs/relay-protocol.md): accepts agents
 * over mutually-authenticated TLS and turns their frames into the upward calls of struct
 * tr_link_events (link_calls.h).
 *
 * Per agent connection:
 * - identity: the machine name is the one in the agent's certificate (tr_tls_uv_peer_name),
 *   never a message. A second connection for a name already connected is refused with
 *   Goodbye REASON_DUPLICATE_HOST and a log line; the connected one is not affected.
 * - Hello -> Welcome {accepted features, machine name, service instance id, stored_seq};
 *   the agent's re-announced producers, then batches in seq order. Batches at or below
 *   stored_seq are duplicates (ignored, counted); gaps are counted as link loss. Items go to
 *   the chunk / patch / flush_ack events in batch order. The BatchAck for what was stored
 *   rides in the TLS record of the next command to the agent (in a flushing session, the next
 *   flush), or goes alone once it waited ack_delay_ms, or at once after
 *   TR_LINK_ACK_AT_ONCE_BYTES of chunks not yet acked.
 * - CommandReply is held until its after_seq batch was processed (across reconnects of the
 *   same agent instance), so a reply never overtakes the data before it.
 * - ClockProbe (the exchange and the schedule: relay/clock/clock_probe.h): one probe in flight per
 *   host, 10 at 50 ms after Welcome, then one a second (while a session runs, every 5 ms to
 *   1 s: as often as the host's drift needs to move its clock by at most 1 us between probes),
 *   plus the probe_clock command on demand; at most 8 a millisecond over all hosts, the longest due
 *   first past that, and only when nothing of ours waits to be sent. t1 is
 *   when the encrypted probe left (the kernel's send stamp, tr_tls_uv_sent_time), t4 when
 *   the answer reached the socket (its receive stamp, before decryption); with FEATURE_CLOCK_FOLLOW_UP the answer is
 *   completed by the agent's ClockFollowUp (exact t3). Each completed probe feeds host->clock.
 * - Heartbeats both ways; a peer silent for the timeout is closed. Before Hello there are
 *   none: a peer that has not sent Hello within the handshake timeout is closed.
 * - Backpressure: while more than half of max_queued bytes of our frames wait to be sent to an
 *   agent, reading its socket is paused (tr_tls_uv_pause_read), so TCP flow control holds the
 *   agent back; only the rest of the read being processed is held (in a stash, bounded by
 *   TR_RELAY_LINK_STASH_MAX as a safety net). Once the queue drains, the held frames are
 *   processed and reading resumes. An agent that reads nothing for the heartbeat timeout is closed as
 *   overloaded.
 * - Disconnect: host->link = NULL, stats.disconnects++, the host_disconnected event.
 * Every connection ends through one path (relay/link/relay_link.h, whose core this file uses as
 * the agent's end does). */
#ifndef TR_LINK_SERVER_H
#define TR_LINK_SERVER_H

#include <stdint.h>
#include <uv.h>

#include "relay/link/tls.h"
#include "relay/link/tls_uv.h"
#include "service/hosts.h"
#include "service/link_calls.h"

#define TR_LINK_DEFAULT_PORT 7393
#define TR_LINK_MAX_QUEUED (1u << 20)
/* A BatchAck waits at most this long for a command to ride with: more than the 250 ms flush
 * period of a flushing session, so that there every ack rides with the next flush; what an
 * agent holds meanwhile is bounded by TR_LINK_ACK_AT_ONCE_BYTES. */
#define TR_LINK_ACK_DELAY_MS 500
#define TR_LINK_ACK_AT_ONCE_BYTES (64u << 10)

typedef struct tr_link_server tr_link_server;

struct tr_link_server_opts {
  const char *listen;      /* "ADDR:PORT", "[V6ADDR]:PORT" or "ADDR" (TR_LINK_DEFAULT_PORT) */
  tr_tls_config *tls;      /* server role; referenced */
  uint64_t features; /* offered to agents; 0 = TR_RELAY_FEATURES_ALL but UPSTREAM_LOST */
  uint64_t heartbeat_interval_ms, heartbeat_timeout_ms; /* 0 = the relay defaults */
  /* The TLS handshake must finish within handshake_timeout_ms of its start (tls_uv.h), and Hello
   * arrive within it after the handshake; else the connection is closed with a log line
   * naming the peer address. 0 = TR_TLS_UV_HANDSHAKE_TIMEOUT_MS. */
  unsigned handshake_timeout_ms;
  /* What one source address may hold before it is authenticated: TLS handshakes at once, and
   * connections waiting for one (tls_uv.h); 0 = TR_TLS_UV_MAX_HANDSHAKES_PER_SOURCE,
   * TR_TLS_UV_MAX_WAITING_PER_SOURCE. */
  unsigned max_handshakes_per_source, max_waiting_per_source;
  /* At most this many agents connected at once; Hello from one more is refused with a Goodbye
   * (REASON_OVERLOADED) naming the limit. 0 = TR_LINK_DEFAULT_MAX_AGENTS. */
  unsigned max_agents;
  /* Tiers: which regionals may relay which hosts (relay_allow.h; referenced). NULL or empty:
   * a Hello with relayed_host is refused (Goodbye REASON_NOT_AUTHORIZED, logged). */
  const struct tr_relay_allow *relay_allow;
  unsigned ack_delay_ms; /* 0 = TR_LINK_ACK_DELAY_MS */
};

#define TR_LINK_DEFAULT_MAX_AGENTS 4096u

/* Listens and returns the server, which keeps its hosts in the table hosts (hosts.h) and makes
 * its upward calls (link_calls.h) with the service state and events the table was made with;
 * all three must outlive the server. TR_ERR_CONFIG for an unparsable address, else the
 * tr_tls_uv_listen error (e.g. address in use); a message naming the address is logged. */
int tr_link_server_start(uv_loop_t *loop, tr_hosts *hosts, const struct tr_link_server_opts *opts,
                         tr_link_server **out);
/* The sessions' downward calls (link_calls.h), for tr_session_service_init: commands to a
 * host's agent, and its clock probed on demand. */
extern const struct tr_link_commands tr_link_server_commands;

/* The port listened on (useful with port 0), or a negative code. */
int tr_link_server_port(const tr_link_server *ls);
/* Uses cfg (referenced) for connections accepted from now on; connected agents keep their
 * session, unless cfg refuses them (tr_tls_peer_refusal: their certificate is on its CRL or
 * their name on its --deny list, or a relayed host's name is denied): those are closed with
 * Goodbye REASON_NOT_AUTHORIZED and a log line, which frees their names for others. */
void tr_link_server_reload_tls(tr_link_server *ls, tr_tls_config *cfg);
/* The earliest notAfter (Unix seconds) among the certificates of the peers connected now
 * (agents and regionals; relayed hosts' are their regional's to watch), and whose (*name),
 * or 0 with none. */
int64_t tr_link_server_peer_expiry(const tr_link_server *ls, const char **name);
/* What the server did so far (for the tests of its cost). */
struct tr_link_server_counts {
  uint64_t acks_sent;  /* BatchAcks */
  uint64_t acks_alone; /* ... of them in a record of their own (the others rode with a command) */
  uint64_t walks;      /* walks over every peer (heartbeats, deadlines, acks due) */
  uint64_t ticks;      /* times the timer of probes and walks ran */
};
void tr_link_server_counts(const tr_link_server *ls, struct tr_link_server_counts *out);
/* The agents' TLS handshakes: refused, and where their steps ran (relay/link/tls_uv.h). */
void tr_link_server_tls_stats(const tr_link_server *ls, struct tr_tls_uv_server_stats *out);
/* Closes the host's connection, if any, without a Goodbye: its agent reconnects and resumes.
 * For dropping a misbehaving agent, and for the link-loss tests. */
void tr_link_server_disconnect(tr_host *host, const char *why);
/* Tiers: a RelayedClockExchange a regional (via, its own host entry; NULL if unknown) measured
 * with host, on the regional's clock: checked, mapped onto ours through via's estimate and
 * added to host's (*ex: the exchange as used, or as received when it could not be). 0,
 * TR_ERR_PROTO (a time missing, past 2^62 or out of order: the link's protocol error),
 * TR_ERR_STATE (via not measured yet: skipped), or tr_clocksync_add_probe's refusal. */
int tr_link_server_relayed_exchange(tr_host *host, const tr_host *via,
                                    const Tracerelay__RelayedClockExchange *x,
                                    struct tr_clocksync_probe *ex);
/* Stops listening, says Goodbye (REASON_SHUTDOWN) to every agent and closes them; each gets
 * its host_disconnected event. The server is freed once the loop has closed everything; the
 * host table stays its owner's. */
void tr_link_server_stop(tr_link_server *ls);

#endif
