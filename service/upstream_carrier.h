/* upstream_carrier.h: a regional's one link to its upstream service, the carrier of every
 * agent's link it forwards (relay_link.h, carriers; docs/relay-protocol.md#multiplexing).
 *
 * The carrier is made when it is wanted (tr_upstream_carrier_want): the upstream's name is
 * resolved, the TLS link made with the regional's certificate, and a Hello offering only
 * FEATURE_MULTIPLEX sent; the upstream's Welcome must accept it (an upstream that does not
 * multiplex is refused, saying so). Then events->up: the owner opens a slot per agent
 * (tr_relay_link_open_slot on tr_upstream_carrier_link). A failed attempt, a refusal or a lost
 * carrier brings events->down, and the next attempt waits: 250 ms doubling to 10 s, each 0.5-1.5
 * times that at random; 5-20 s after a busy upstream's refusal; the first attempt after a
 * Welcome at once. Heartbeats and the silence timeout run from tr_upstream_carrier_tick. All on
 * the loop's thread. */
#ifndef TR_SERVICE_UPSTREAM_CARRIER_H
#define TR_SERVICE_UPSTREAM_CARRIER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "relay/link/relay_link.h"

typedef struct tr_upstream_carrier tr_upstream_carrier;

struct tr_upstream_carrier_events {
  /* Welcomed: slots may be opened. */
  void (*up)(void *data);
  /* No carrier (an attempt failed, was refused, or the carrier ended: its slots ended before
   * this); reason as relay_link's on_closed (TR_ERR_BUSY: the upstream was busy); refusal: the
   * reason of the upstream's Goodbye (e.g. REASON_NOT_AUTHORIZED: this regional may relay
   * nobody), why then its text; REASON_UNSPECIFIED if none came. */
  void (*down)(void *data, int reason, Tracerelay__Goodbye__Reason refusal, const char *why);
  /* The upstream says whether a session runs there (UpstreamSessions): after the Welcome and
   * whenever it changes; with it, once measured, its estimate of our clock's drift against its
   * own (drift_ppm, when has_drift). A carrier that goes down says nothing more: assume no
   * session. */
  void (*sessions)(void *data, bool running, bool has_drift, double drift_ppm);
  /* After tr_upstream_carrier_stop, once nothing of it is left: it is freed. */
  void (*stopped)(void *data);
};

struct tr_upstream_carrier_opts {
  const char *host, *port;  /* of the upstream */
  const char *server_name;  /* its certificate's name */
  tr_tls_config *tls;       /* client role; referenced */
  struct tr_relay_link_opts link;
  unsigned max_slots;
};

int tr_upstream_carrier_new(uv_loop_t *loop, const struct tr_upstream_carrier_opts *opts,
                            const struct tr_upstream_carrier_events *ev, void *data,
                            tr_upstream_carrier **out);
/* Starts an attempt now if there is no carrier, none under way and none waiting for its time;
 * a waiting one starts from the tick. */
void tr_upstream_carrier_want(tr_upstream_carrier *c);
/* The carrier, once welcomed and until it ends; else NULL. */
tr_relay_link *tr_upstream_carrier_link(const tr_upstream_carrier *c);
/* Heartbeats and silence, and a waiting attempt whose time came (if still wanted). */
void tr_upstream_carrier_tick(tr_upstream_carrier *c, uint64_t now_ns, uint64_t now_ms);
/* Attempts from now on use cfg (referenced). */
void tr_upstream_carrier_set_tls(tr_upstream_carrier *c, tr_tls_config *cfg);
struct tr_upstream_carrier_stats {
  bool up;
  uint64_t connects; /* carriers welcomed, since the start */
  uint64_t lost;     /* of them, ended */
  /* Since the start, over every carrier: frames written (their own and their slots'), the
   * writes they went out in, and frames dropped for slots gone. */
  uint64_t frames_out, writes, dropped_frames;
};
void tr_upstream_carrier_stats(const tr_upstream_carrier *c,
                               struct tr_upstream_carrier_stats *out);
/* Closes the carrier (its slots end first) and frees c; events->stopped follows. */
void tr_upstream_carrier_stop(tr_upstream_carrier *c);

#endif
