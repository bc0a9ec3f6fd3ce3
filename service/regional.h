/* regional.h: the regional side of tiers (docs/relay-protocol.md#tiers): a service started
 * with --upstream accepts agents as a service does and forwards each agent's relay link to the
 * upstream service in a slot of one carrier link (upstream_carrier.h), made with the regional's
 * certificate, naming the agent's host in Hello.relayed_host (the upstream checks that the
 * regional may speak for it). Many agents' frames share the carrier's TLS records and system
 * calls (docs/relay-protocol.md#multiplexing).
 *
 * Per agent: the regional checks the agent's certificate (the machine name is the
 * certificate's, never a message), forwards its Hello upstream, and answers it with the
 * upstream's Welcome; from then on every frame goes through in order both ways, re-encoded
 * but not interpreted (batches stay compressed), except:
 * - clock probes: the regional probes its agents itself (relay/clock/clock_probe.h, as the service
 *   does, at the session rate while the upstream says a session runs) and sends each completed
 *   exchange upstream as a
 *   RelayedClockExchange; the upstream composes it with its own measurement of the regional's
 *   clock (relay/clock/clocksync.h, tr_clocksync_relay_exchange);
 * - heartbeats: each agent's link keeps its own; the carrier's speak for its slots.
 * Nothing is stored here: batches are acknowledged by the upstream end to end, so an agent
 * keeps what the upstream did not acknowledge in its spill queue across a regional's restart.
 * - Backpressure: while more than half of TR_REGIONAL_UPSTREAM_QUEUE bytes wait on the
 *   carrier, the frames of each agent that sends more are held (tr_relay_link_hold_input) until
 *   it drains;
 *   TCP then holds the agent, whose own queues bound and count what it cannot send.
 * - The agent's link closing closes its upstream link; an agent's Goodbye is passed upstream.
 * - The upstream link closing closes the agent's, passing an upstream Goodbye (e.g.
 *   NOT_AUTHORIZED) with its reason and text, and a busy upstream as Goodbye OVERLOADED (the
 *   agent comes back 5-20 s later), except for an agent that offered FEATURE_UPSTREAM_LOST and
 *   was welcomed: its link is kept through a lost upstream link or the upstream's shutdown
 *   (docs/relay-protocol.md, Tiers): UpstreamLost, the agent's Hello again, a new slot once
 *   there is a carrier (made again with backoff while the upstream is not back), the new
 *   Welcome. What it
 *   sends in between is dropped and counted (relink_dropped_frames). Such an agent also waits
 *   for its first Welcome as long as the upstream takes (busy, or down): we send it heartbeats
 *   from its Hello on and wait for the carrier, rather than send it away.
 * The regional's own clock reaches the upstream through an agent embedded in the regional
 * process (service_daemon.c), connected under the regional's certificate name.
 * Everything runs on the loop's thread. */
#ifndef TR_SERVICE_REGIONAL_H
#define TR_SERVICE_REGIONAL_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "relay/link/tls.h"

#define TR_REGIONAL_UPSTREAM_QUEUE (64u << 20) /* the carrier's queue bound */

typedef struct tr_regional tr_regional;

struct tr_regional_opts {
  const char *listen;          /* ADDR:PORT for agents */
  tr_tls_config *tls;          /* server role, for agents; referenced */
  const char *upstream;        /* HOST:PORT of the upstream service */
  const char *upstream_name;   /* the name its certificate must carry; NULL: HOST */
  tr_tls_config *upstream_tls; /* client role: the regional's certificate; referenced */
  unsigned handshake_timeout_ms; /* 0: TR_TLS_UV_HANDSHAKE_TIMEOUT_MS */
  /* What one agent's source address may hold before it is authenticated (tls_uv.h); 0: the
   * defaults. */
  unsigned max_handshakes_per_source, max_waiting_per_source;
  unsigned max_agents;           /* 0: TR_LINK_DEFAULT_MAX_AGENTS */
};

/* Listens for agents. TR_ERR_CONFIG (address; logged), or the listen error (logged). */
int tr_regional_start(uv_loop_t *loop, const struct tr_regional_opts *opts, tr_regional **out);
/* Agents accepted from now on use cfg (referenced); open links carry on, but for those of
 * agents cfg refuses (tr_tls_peer_refusal: certificate on its CRL, name denied), closed with
 * Goodbye REASON_NOT_AUTHORIZED and a log line; their upstream links end with them. */
void tr_regional_reload_tls(tr_regional *r, tr_tls_config *cfg, tr_tls_config *upstream_cfg);
/* The earliest notAfter (Unix seconds) among the connected agents' certificates, and whose
 * (*name); 0 with none. */
int64_t tr_regional_peer_expiry(const tr_regional *r, const char **name);
/* Agents connected and forwarded now. */
unsigned tr_regional_agents(const tr_regional *r);
/* What the forwarding does, for the regional's /metrics (service/metrics.h). */
struct tr_regional_stats {
  unsigned agents;    /* agents connected that said Hello */
  unsigned forwarded; /* of them, Welcomed by the upstream: their frames flow both ways */
  unsigned held;      /* of them, read no further while their upstream queue drains */
  unsigned relinking; /* of them, their link kept while their upstream link is made again */
  uint64_t bytes_from_agents;   /* received from agents (TLS bytes), since the start */
  uint64_t bytes_from_upstream; /* received from the upstream for them (their frames) */
  uint64_t upstream_lost;       /* agents' upstream links that closed under a connected agent */
  uint64_t relink_dropped_frames; /* frames agents sent for an upstream link that was gone */
  /* The carrier to the upstream (upstream_carrier.h): up now; since the start, carriers made
   * and lost, frames written to them and the writes those went out in. */
  bool carrier_up;
  bool upstream_session; /* the upstream says a session runs there */
  /* The upstream's estimate of our clock's drift against its own (ratio - 1), once it said one:
   * the agents' probes in a session are paced by their drift plus this. */
  bool upstream_drift_known;
  double upstream_drift_ppm;
  uint64_t carrier_connects, carrier_lost, carrier_frames_out, carrier_writes;
};
void tr_regional_stats(const tr_regional *r, struct tr_regional_stats *out);
/* HOST:PORT of the upstream. */
const char *tr_regional_upstream(const tr_regional *r);
/* One agent that said Hello, as `tracerelay status` shows it (regional_status.h). */
struct tr_regional_agent {
  const char *name;     /* its certificate's machine name */
  bool connected;       /* its link to the regional is open */
  bool forwarded;       /* the upstream welcomed it: frames flow both ways */
  bool held;            /* its frames wait while its upstream link drains */
  uint64_t connected_ms; /* since its link opened */
  uint64_t bytes_from_agent, bytes_from_upstream; /* on its open links (TLS bytes) */
};
/* Calls fn for each agent that said Hello, in order of connection. */
void tr_regional_each_agent(const tr_regional *r,
                            void (*fn)(void *data, const struct tr_regional_agent *a),
                            void *data);
/* Stops listening, closes every link (agents get Goodbye SHUTDOWN and reconnect elsewhere or
 * later; the upstream sees their links drop, not end), and frees r once all are closed. */
void tr_regional_stop(tr_regional *r);

#endif
