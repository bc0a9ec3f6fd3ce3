/* link_server.c: the service's end of the relay link (see link_server.h for the contract).
 *
 * One tr_link_peer per relay link (relay/link/relay_link.h) that finished its TLS handshake, freed
 * in the link's on_closed. The link core owns the connection: frames in and out, heartbeats,
 * backpressure, Goodbye and the one close path; this file gives the frames their meaning.
 * What must outlive a connection (the batch sequence, held replies, producers, the clock
 * estimate) lives in the host table (hosts.c). One timer per server drives heartbeats and
 * clock probes: the probes' schedule every TICK_MS, at the cost of the peers due only; while a
 * session runs, when the next probe is due (or the walk), but not sooner than TICK_SESSION_MS
 * after the last tick: a root whose hosts are all behind regionals probes only the regionals
 * and need not wake 200 times a second. Heartbeats, deadlines and acks due in a walk over
 * every peer every WALK_MS.
 * Who is probed when, and what an answer means, is relay/clock/clock_probe.c; this file sends the
 * probes and feeds the completed exchanges to the host's estimator.
 * A BatchAck waits for the next command to its agent and rides in the command's TLS record
 * (one record and one system call instead of two: in a flushing session every host gets a
 * flush command each flush period), at most TR_LINK_ACK_DELAY_MS; a burst of at least
 * TR_LINK_ACK_AT_ONCE_BYTES of chunks is acked at once, so a busy agent frees its spill queue
 * as it did with an ack per read burst. */
#include "service/link_server.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "relay/clock/clock.h"
#include "relay/clock/clock_probe.h"
#include "relay/clock/clocksync.h"
#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link.h"
#include "relay/link/relay_session.h"
#include "relay/base/tr_error.h"
#include "service/relay_allow.h"

#define TICK_MS 50
#define TICK_SESSION_MS TR_CLOCK_PROBE_SESSION_MIN_MS /* while a session runs */
/* Heartbeats (after 2 s of silence), deadlines (8 s, the handshake's 10 s) and acks due (500
 * ms) need no finer grain: the walk over 1,000 peers every 50 ms was 4.5 % of the service's
 * CPU in a flushing session. */
#define WALK_MS 250

struct tr_link_peer {
  tr_link_server *ls;
  tr_relay_link *link;
  tr_link_peer *prev, *next;
  tr_host *host; /* set once Hello was accepted */
  uint64_t connected_ms; /* handshake done: Hello is due within hello_timeout_ms */
  uint64_t features;  /* accepted */
  uint64_t acked;     /* last seq acknowledged on this connection */
  uint64_t ack_owed_ms;    /* when a batch beyond acked was stored (0: no ack owed) */
  uint64_t bytes_at_ack;   /* host->stats.bytes_received when the last ack went */
  bool resyncing;     /* between Welcome and the first frame that is not a re-announcement */
  int64_t t4;         /* BOOTTIME when the socket read being processed returned */
  /* A regional's link for one of its hosts (Hello.relayed_host): the regional probes the host
   * and sends RelayedClockExchange; we probe the regional on its own link. */
  bool relayed;
  /* A regional's carrier (FEATURE_MULTIPLEX): speaks for no host; the links it carries, one
   * per relayed host, are peers of their own (accepted as its slots open). */
  bool carrier;
  /* A carried link: the TR_RELAY_FEATURES_CARRIED its carrier's Welcome accepted, those its
   * regional passes on; 0 on any other link (a regional's link without a carrier is older). */
  uint64_t carried_features;
  /* A carrier: the regional's drift last told (UpstreamSessions), and whether any was. */
  bool drift_told;
  double drift_told_ppm;
  bool warned_reply; /* a reply to no command in flight was logged */
  struct tr_clock_probe_peer probe; /* scheduled from Welcome (with the feature) to closing */
};

struct tr_link_server {
  uv_loop_t *loop;
  tr_service *svc;
  const struct tr_link_events *ev; /* the upward calls, made with svc */
  tr_hosts *hosts;                 /* the service's, made with svc and ev */
  tr_relay_link_listener *listener;
  uv_timer_t tick;
  tr_link_peer *peers;
  uint64_t features;
  uint64_t instance_id;
  unsigned hello_timeout_ms;
  unsigned ack_delay_ms;
  struct tr_link_server_counts counts;
  unsigned max_agents, connected; /* agents Welcomed now, and their bound */
  uint64_t walked_ms; /* when on_tick last walked the peers */
  uint64_t ticked_ms; /* when on_tick last ran */
  bool session; /* a session ran at the last tick: what the carriers were told */
  struct tr_clock_probe_sched probes;
  tr_relay_codec codec; /* decompresses every peer's batches */
  const tr_relay_allow *relay_allow;
  tr_tls_config *tls; /* the one new connections get: its --deny also judges relayed names */
  bool stopping;
  bool tick_closed;
};

static void on_tick(uv_timer_t *t);
static void tick_sooner(tr_link_server *ls);

/* ---- writing ---- */

static bool ack_owed(const tr_link_peer *p) {
  return tr_hosts_peer(p->host)->stored_seq > p->acked;
}

static void ack_frame(tr_link_peer *p, Tracerelay__BatchAck *ack, Tracerelay__RelayFrame *f) {
  *ack = (Tracerelay__BatchAck)TRACERELAY__BATCH_ACK__INIT;
  ack->has_seq = 1;
  ack->seq = tr_hosts_peer(p->host)->stored_seq;
  *f = (Tracerelay__RelayFrame)TRACERELAY__RELAY_FRAME__INIT;
  f->msg_case = TRACERELAY__RELAY_FRAME__MSG_BATCH_ACK;
  f->batch_ack = ack;
}

static void acked(tr_link_peer *p, uint64_t seq) {
  p->acked = seq;
  p->ack_owed_ms = 0;
  p->bytes_at_ack = p->host->stats.bytes_received;
  p->ls->counts.acks_sent++;
}

static void send_ack(tr_link_peer *p) {
  if (!ack_owed(p) || tr_relay_link_closing(p->link))
    return;
  Tracerelay__BatchAck ack;
  Tracerelay__RelayFrame f;
  ack_frame(p, &ack, &f);
  if (tr_relay_link_send(p->link, &f) == 0) {
    acked(p, ack.seq);
    p->ls->counts.acks_alone++;
  }
}

/* f, after the BatchAck owed if there is one, in one write: one TLS record, one system call.
 * A frame beyond the smallest max frame a peer may set goes on its own, after the ack, and so
 * do both on a carried link (its carrier gathers them into one write anyway). */
static int send_with_ack(tr_link_peer *p, const Tracerelay__RelayFrame *f) {
  Tracerelay__BatchAck ack;
  Tracerelay__RelayFrame af;
  uint8_t *both = NULL;
  size_t len;
  if (ack_owed(p) && !tr_relay_link_closing(p->link) && !tr_relay_link_carried(p->link)) {
    ack_frame(p, &ack, &af);
    const Tracerelay__RelayFrame *pair[] = {&af, f};
    if (tr_relay_frames_encode(pair, 2, TR_RELAY_MIN_FRAME, &both, &len) == 0) {
      int rc = tr_relay_link_send_encoded(p->link, both, len);
      free(both);
      if (rc == 0)
        acked(p, ack.seq);
      return rc;
    }
  }
  send_ack(p);
  return tr_relay_link_send(p->link, f);
}

/* The ack owed for longer than the delay, or for a burst of chunks too large to wait; on a
 * carried link at once (it costs no record or system call of its own there). */
static void send_ack_due(tr_link_peer *p, uint64_t now_ms) {
  if (p->host == NULL || !ack_owed(p))
    return;
  if (tr_relay_link_carried(p->link)) {
    send_ack(p);
    return;
  }
  if (p->ack_owed_ms == 0)
    p->ack_owed_ms = now_ms;
  if (now_ms - p->ack_owed_ms >= p->ls->ack_delay_ms ||
      p->host->stats.bytes_received - p->bytes_at_ack >= TR_LINK_ACK_AT_ONCE_BYTES)
    send_ack(p);
}

/* ---- clock probes: the transport's side of relay/clock/clock_probe.h ---- */

static int probe_send(void *data, uint64_t probe_id, int64_t *t1) {
  tr_link_peer *p = data;
  return tr_relay_link_send_clock_probe(p->link, probe_id, t1);
}

static int64_t probe_sent_time(void *data, int64_t t1) {
  tr_link_peer *p = data;
  return tr_tls_uv_sent_time(tr_relay_link_conn(p->link), t1);
}

static double probe_drift_ppm(void *data) {
  tr_link_peer *p = data;
  return p->host->clock ? tr_clocksync_drift_ppm(p->host->clock) : 0;
}

static void probe_done(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex) {
  tr_link_peer *p = data;
  int rc = tr_clocksync_add_probe(p->host->clock, ex);
  TR_DEBUG("link", "host %s: clock probe %llu t1 %lld t2 %lld t3 %lld%s t4 %lld: %s",
           p->host->name, (unsigned long long)probe_id, (long long)ex->t1, (long long)ex->t2,
           (long long)ex->t3, ex->t3_late ? " (late)" : "", (long long)ex->t4,
           rc < 0 ? tr_strerror(rc) : "used");
}

static const struct tr_clock_probe_ops probe_ops = {
    .send = probe_send, .sent_time = probe_sent_time, .drift_ppm = probe_drift_ppm,
    .done = probe_done};

/* ---- frames from the agent ---- */

/* The machine name a Hello speaks for: its certificate's, or, from a regional, the host it
 * relays if the rules let that certificate speak for it (relay_allow.h). NULL: refused (the
 * link is closing). */
static const char *hello_name(tr_link_peer *p, const Tracerelay__Hello *hello) {
  const char *cert = tr_tls_uv_peer_name(tr_relay_link_conn(p->link));
  if (hello->relayed_host == NULL && tr_relay_link_carried(p->link)) {
    tr_relay_link_protocol_error(p->link, "a carried link's Hello without relayed_host");
    return NULL;
  }
  if (hello->relayed_host == NULL)
    return cert;
  const char *host = hello->relayed_host;
  if (!tr_tls_valid_machine_name(host, strlen(host))) {
    tr_relay_link_protocol_error(p->link, "Hello.relayed_host is not a machine name");
    return NULL;
  }
  if (p->ls->relay_allow == NULL || !tr_relay_allow_permits(p->ls->relay_allow, cert, host)) {
    TR_WARN("link", "%s (%s) is not authorized to relay host %s: refused (--relay-allow)", cert,
            tr_tls_uv_peer_address(tr_relay_link_conn(p->link)), host);
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                        "%s is not authorized to relay host %s (the service's --relay-allow)",
                        cert, host);
    return NULL;
  }
  if (tr_tls_config_denies(p->ls->tls, host)) {
    TR_WARN("link", "host %s relayed by %s refused: it is denied (--deny)", host, cert);
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                        "host %s is denied by the service (--deny)", host);
    return NULL;
  }
  p->relayed = true;
  return host;
}

static const struct tr_relay_link_events link_events, carried_events;

/* The regional's own host entry (its embedded agent, under the regional's certificate name),
 * looked up each time (O(1), the table's name index) rather than kept: the table may retire
 * it while its embedded agent is away (hosts.c). NULL while unknown. */
static const tr_host *regional_host(tr_link_peer *p) {
  return tr_hosts_find(p->ls->hosts, tr_tls_uv_peer_name(tr_relay_link_conn(p->link)));
}

/* Our estimate of a carrier's regional's clock drift, once its own host (its embedded agent,
 * under the same certificate) has been measured. */
static bool regional_drift(tr_link_peer *p, double *ppm) {
  const tr_host *via = regional_host(p);
  struct tr_clocksync_stats cs;
  if (via == NULL || via->clock == NULL)
    return false;
  tr_clocksync_get_stats(via->clock, &cs);
  if (cs.probes == 0)
    return false;
  *ppm = tr_clocksync_drift_ppm(via->clock);
  return true;
}

/* Tells a regional's carrier whether a session runs here, and its clock's drift against ours:
 * it probes its hosts at the session rate only then, paced by their drift against us (their
 * exchanges come here, a fit each). */
static void send_sessions(tr_link_peer *p, bool running) {
  Tracerelay__UpstreamSessions u = TRACERELAY__UPSTREAM_SESSIONS__INIT;
  u.has_running = 1;
  u.running = running;
  if (regional_drift(p, &u.regional_drift_ppm)) {
    u.has_regional_drift_ppm = 1;
    p->drift_told = true;
    p->drift_told_ppm = u.regional_drift_ppm;
  }
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_UPSTREAM_SESSIONS;
  f.upstream_sessions = &u;
  tr_relay_link_send(p->link, &f);
}

/* Again when the regional's drift was first measured or moved by more than this. */
#define DRIFT_RETELL_PPM 0.5

static void tell_drift_moved(tr_link_peer *p) {
  double ppm;
  if (regional_drift(p, &ppm) && (!p->drift_told || fabs(ppm - p->drift_told_ppm) > DRIFT_RETELL_PPM))
    send_sessions(p, p->ls->session);
}

/* A regional's carrier: one link for every host it relays, if the rules name it. */
static void on_carrier_hello(tr_link_peer *p, const Tracerelay__Hello *hello) {
  tr_link_server *ls = p->ls;
  tr_tls_uv_conn *conn = tr_relay_link_conn(p->link);
  const char *cert = tr_tls_uv_peer_name(conn);
  uint32_t max_frame = tr_relay_max_frame_said(hello->has_max_frame_bytes, hello->max_frame_bytes);
  if (hello->relayed_host != NULL || tr_relay_link_carried(p->link) || max_frame == 0) {
    tr_relay_link_protocol_error(p->link, "a carrier's Hello with relayed_host, on a carried "
                                 "link, or with max_frame_bytes %u", hello->max_frame_bytes);
    return;
  }
  if (ls->relay_allow == NULL || !tr_relay_allow_regional(ls->relay_allow, cert)) {
    TR_WARN("link", "%s (%s) is not authorized to relay hosts: its carrier refused "
            "(--relay-allow)", cert, tr_tls_uv_peer_address(conn));
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                        "%s is not authorized to relay hosts (the service's --relay-allow)",
                        cert);
    return;
  }
  /* Room for the slots of hosts refused for --max-agents (on_hello: OVERLOADED, on their
   * slot) beside those it serves: only more than that ends the carrier. */
  if (tr_relay_link_carry(p->link, &carried_events, p, 2 * ls->max_agents) < 0) {
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "out of memory");
    return;
  }
  p->carrier = true;
  p->features =
      TR_RELAY_FEATURE_MULTIPLEX | (hello->features & ls->features & TR_RELAY_FEATURES_CARRIED);
  tr_relay_link_established(p->link, max_frame);
  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.has_features = w.has_service_instance_id = w.has_max_frame_bytes = 1;
  w.features = p->features;
  w.service_instance_id = ls->instance_id;
  w.max_frame_bytes = (uint32_t)tr_relay_link_max_in(p->link);
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  if (tr_relay_link_send(p->link, &f) < 0)
    return;
  send_sessions(p, ls->ev->any_session(ls->svc));
  TR_INFO("link", "regional %s carries its hosts on one link from %s (%s, features %#llx)", cert,
          tr_tls_uv_peer_address(conn), tr_tls_uv_ciphersuite(conn),
          (unsigned long long)p->features);
}

static void on_hello(tr_link_peer *p, const Tracerelay__Hello *hello) {
  tr_link_server *ls = p->ls;
  if (hello->features & TR_RELAY_FEATURE_MULTIPLEX) {
    on_carrier_hello(p, hello);
    return;
  }
  const char *name = hello_name(p, hello);
  if (name == NULL)
    return;
  tr_host *host = tr_hosts_find(ls->hosts, name);
  if (host != NULL && host->link != NULL) {
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST,
                        "host %s is already connected from %s; refusing the second connection",
                        name, tr_tls_uv_peer_address(tr_relay_link_conn(host->link->link)));
    return;
  }
  if (ls->connected >= ls->max_agents) {
    TR_WARN("link", "host %s refused: %u agents are connected, the most this service takes "
            "(--max-agents)", name, ls->connected);
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "the service already serves %u agents, its --max-agents; host %s refused",
                        ls->connected, name);
    return;
  }
  uint32_t max_frame = tr_relay_max_frame_said(hello->has_max_frame_bytes, hello->max_frame_bytes);
  if (max_frame == 0) {
    tr_relay_link_protocol_error(p->link, "Hello.max_frame_bytes %u outside [%u, %u]",
                                 hello->max_frame_bytes,
                                 TR_RELAY_MIN_FRAME, TR_RELAY_MAX_FRAME_LIMIT);
    return;
  }
  int rc = host != NULL ? 0 : tr_hosts_get(ls->hosts, name, &host);
  uint64_t welcome_seq = 0;
  if (rc == 0)
    rc = tr_hosts_hello(ls->hosts, host, hello, &welcome_seq);
  if (rc == TR_ERR_PROTO) {
    tr_relay_link_protocol_error(p->link, "Hello refused: agent instance %016llx, acked_seq %llu",
                                 (unsigned long long)hello->agent_instance_id,
                                 (unsigned long long)hello->acked_seq);
    return;
  }
  if (rc < 0) {
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "cannot take the agent: %s", tr_strerror(rc));
    return;
  }
  tr_relay_link_established(p->link, max_frame);
  uint64_t ours = ls->features;
  if (p->relayed) {
    ours = (ours & ~(TR_RELAY_FEATURE_CLOCK_PROBES | TR_RELAY_FEATURE_CLOCK_FOLLOW_UP)) |
           TR_RELAY_FEATURE_RELAYED_CLOCKS;
    uint64_t withheld = hello->features & ours & TR_RELAY_FEATURES_CARRIED & ~p->carried_features;
    if (withheld)
      TR_INFO("link", "host %s: its regional %s does not pass on features %#llx (a tracerelay "
              "older than this service): not used on its link until the regional is upgraded",
              name, tr_tls_uv_peer_name(tr_relay_link_conn(p->link)),
              (unsigned long long)withheld);
    ours &= ~withheld;
  }
  p->features = tr_relay_features_negotiate(ours, hello->features);
  p->host = host;
  tr_hosts_link_up(host, p, tr_clock_boottime_ns(),
                   p->relayed ? tr_tls_uv_peer_name(tr_relay_link_conn(p->link)) : NULL);
  ls->connected++;

  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.has_features = w.has_service_instance_id = w.has_stored_seq = w.has_max_frame_bytes = 1;
  w.features = p->features;
  w.machine_name = host->name;
  w.service_instance_id = ls->instance_id;
  w.stored_seq = welcome_seq;
  w.max_frame_bytes = (uint32_t)tr_relay_link_max_in(p->link);
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  if (tr_relay_link_send(p->link, &f) < 0)
    return;
  p->acked = tr_hosts_peer(host)->stored_seq;
  p->resyncing = tr_hosts_resync_begin(ls->hosts, host) == 0;
  if (p->features & TR_RELAY_FEATURE_CLOCK_PROBES) {
    tr_clock_probe_add(&ls->probes, &p->probe, p, p->features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP,
                       uv_now(ls->loop));
    tick_sooner(ls); /* its first probe is due now */
  }
  TR_INFO("link", "host %s connected from %s%s%s (agent %016llx, features %#llx, resuming after "
          "batch %llu, %s)", host->name, tr_tls_uv_peer_address(tr_relay_link_conn(p->link)),
          p->relayed ? " through regional " : "",
          p->relayed ? tr_tls_uv_peer_name(tr_relay_link_conn(p->link)) : "",
          (unsigned long long)host->agent_instance_id, (unsigned long long)p->features,
          (unsigned long long)welcome_seq, tr_tls_uv_ciphersuite(tr_relay_link_conn(p->link)));
  ls->ev->host_connected(ls->svc, host);
}

/* Every item kind is checked before any is delivered, so a batch is applied whole or not. */
static void on_batch(tr_link_peer *p, const Tracerelay__ChunkBatch *batch) {
  tr_host *host = p->host;
  tr_relay_peer *seqs = tr_hosts_peer(host);
  if (batch->codec == TRACERELAY__CODEC__CODEC_ZSTD && !(p->features & TR_RELAY_FEATURE_ZSTD)) {
    tr_relay_link_protocol_error(p->link, "zstd batch %llu without the feature",
                                 (unsigned long long)batch->seq);
    return;
  }
  int rc = tr_relay_peer_batch(seqs, batch->seq);
  tr_hosts_batch_seen(host);
  if (rc <= 0) {
    if (rc < 0)
      tr_relay_link_protocol_error(p->link, "batch with seq 0");
    return;
  }
  Tracerelay__ChunkItems *owned = NULL;
  Tracerelay__ChunkItem **items = NULL;
  size_t n = 0;
  rc = tr_relay_batch_items(&p->ls->codec, batch, &owned, &items, &n);
  for (size_t i = 0; i < n && rc == 0; i++)
    if (items[i]->item_case == TRACERELAY__CHUNK_ITEM__ITEM__NOT_SET)
      rc = TR_ERR_PROTO;
  if (rc < 0) {
    /* Its seq is spent: count it, or nobody would. */
    tr_hosts_batch_unusable(host);
    tr_relay_link_protocol_error(p->link, "batch %llu is unusable: %s",
                                 (unsigned long long)batch->seq, tr_strerror(rc));
    tr_relay_items_free(owned);
    return;
  }
  tr_service *svc = p->ls->svc;
  const struct tr_link_events *ev = p->ls->ev;
  for (size_t i = 0; i < n; i++) {
    const Tracerelay__ChunkItem *it = items[i];
    /* A guest's producer's items go to the guest's entry: its buffers, its sessions. */
    switch (it->item_case) {
    case TRACERELAY__CHUNK_ITEM__ITEM_CHUNK: {
      tr_host *owner = tr_hosts_producer_owner(host, it->chunk->producer_id);
      tr_hosts_chunk_received(owner, it->chunk->payload.len);
      ev->chunk(svc, owner, it->chunk);
      break;
    }
    case TRACERELAY__CHUNK_ITEM__ITEM_PATCH:
      ev->patch(svc, tr_hosts_producer_owner(host, it->patch->producer_id), it->patch);
      break;
    case TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK:
      ev->flush_ack(svc, tr_hosts_producer_owner(host, it->flush_ack->producer_id),
                    it->flush_ack, tr_tls_uv_read_time(tr_relay_link_conn(p->link)));
      break;
    default:
      break;
    }
  }
  tr_relay_items_free(owned);
  tr_hosts_batch_applied(host);
  tr_hosts_release_ordered(p->ls->hosts, host);
}

/* A guest's exchange, mapped through its host's clock estimate into one on ours; held for
 * later while the host's clock is not measured yet. */
static void add_guest_exchange(tr_host *host, tr_host *guest, const struct tr_clocksync_probe *in) {
  struct tr_clocksync_probe ex;
  int rc = tr_clocksync_relay_exchange(host->clock, in, &ex);
  if (rc == TR_ERR_STATE)
    tr_hosts_guest_hold_clock(guest, in);
  else if (rc == 0)
    rc = tr_clocksync_add_probe(guest->clock, &ex);
  TR_DEBUG("link", "guest %s: clock exchange t1 %lld t2 %lld t4 %lld: %s", guest->name,
           (long long)in->t1, (long long)in->t2, (long long)in->t4,
           rc == TR_ERR_STATE ? "held until the host's clock is measured"
                              : rc < 0 ? tr_strerror(rc) : "used");
}

/* The host's clock moved on: its guests' held exchanges may be placed now. */
static void add_held_guest_exchanges(tr_host *host) {
  size_t n;
  tr_host *const *guests = tr_hosts_guests(host, &n);
  struct tr_clocksync_probe in;
  for (size_t i = 0; i < n; i++)
    if (guests[i]->link != NULL && tr_hosts_guest_held_clock(guests[i], &in))
      add_guest_exchange(host, guests[i], &in);
}

static void on_probe_answer(tr_link_peer *p, const Tracerelay__ClockProbe *a) {
  if (tr_clock_probe_answer(&p->ls->probes, &p->probe, a->probe_id, a->t2, a->t3, p->t4,
                            uv_now(p->ls->loop)) < 0)
    tr_relay_link_protocol_error(p->link, "clock probe answer with t2/t3 out of range or out of order");
  add_held_guest_exchanges(p->host);
  tick_sooner(p->ls);
}

/* Two-step probes: the exact send time of the answer, when the agent had one. */
static void on_probe_follow_up(tr_link_peer *p, const Tracerelay__ClockFollowUp *fu) {
  if (tr_clock_probe_follow_up(&p->ls->probes, &p->probe, fu->probe_id, fu->has_t3, fu->t3,
                               fu->has_t3_late && fu->t3_late,
                               uv_now(p->ls->loop)) < 0)
    tr_relay_link_protocol_error(p->link, "clock follow-up with t3 out of range");
  tick_sooner(p->ls);
}

/* Tiers: an exchange the regional measured with this host, on the regional's clock; made one
 * on ours through our estimate of the regional (its own link, under its certificate's name).
 * Until the regional's clock is measured there is nothing to map it with: skipped (the
 * regional's first probes come 50 ms apart from its Welcome, the host's 10 as well). */
static void on_relayed_exchange(tr_link_peer *p, const Tracerelay__RelayedClockExchange *x) {
  const char *regional = tr_tls_uv_peer_name(tr_relay_link_conn(p->link));
  struct tr_clocksync_probe ex;
  int rc = tr_link_server_relayed_exchange(p->host, regional_host(p), x, &ex);
  if (rc == TR_ERR_PROTO) {
    tr_relay_link_protocol_error(p->link, "relayed clock exchange with times missing or out of order");
    return;
  }
  if (rc == 0)
    add_held_guest_exchanges(p->host);
  TR_DEBUG("link", "host %s: clock probe via %s t1 %lld t2 %lld t3 %lld%s t4 %lld: %s",
           p->host->name, regional, (long long)ex.t1, (long long)ex.t2, (long long)ex.t3,
           ex.t3_late ? " (late)" : "", (long long)ex.t4,
           rc < 0 ? tr_strerror(rc) : "used");
}

int tr_link_server_relayed_exchange(tr_host *host, const tr_host *via,
                                    const Tracerelay__RelayedClockExchange *x,
                                    struct tr_clocksync_probe *ex) {
  struct tr_clocksync_probe in = {.t1 = (int64_t)x->t1, .t2 = (int64_t)x->t2,
                                  .t3 = (int64_t)x->t3, .t4 = (int64_t)x->t4,
                                  .t3_late = x->has_t3_late && x->t3_late};
  const uint64_t limit = 1ull << 62; /* as a probe's answer (relay/clock/clock_probe.h) */
  *ex = in;
  if (!x->has_t1 || !x->has_t2 || !x->has_t3 || !x->has_t4 || x->t1 >= limit ||
      x->t2 >= limit || x->t3 >= limit || x->t4 >= limit || in.t3 < in.t2 || in.t4 < in.t1)
    return TR_ERR_PROTO;
  int rc = via != NULL && via->clock != NULL ? tr_clocksync_relay_exchange(via->clock, &in, ex)
                                             : TR_ERR_STATE;
  if (rc < 0) {
    *ex = in;
    return rc;
  }
  return tr_clocksync_add_probe(host->clock, ex);
}

/* Guest machines: a GuestMachine joins (or ends) a guest of the link's host; the sessions hear
 * of it as of a host connecting (or disconnecting). A guest past the table's bound is refused
 * alone, logged: its producers are then known nowhere and get no data source. */
static void on_guest(tr_link_peer *p, const Tracerelay__GuestMachine *g) {
  tr_link_server *ls = p->ls;
  if (g->has_gone && g->gone) {
    tr_host *guest = tr_hosts_guest_find(p->host, g->guest_id);
    if (guest == NULL)
      return; /* one the service refused */
    tr_hosts_guest_leave(guest);
    TR_INFO("link", "guest machine %s left", guest->name);
    ls->ev->host_disconnected(ls->svc, guest, "the guest's relay disconnected");
    return;
  }
  tr_host *guest;
  bool joined;
  int rc = tr_hosts_guest_join(ls->hosts, p->host, g, &guest, &joined);
  if (rc == TR_ERR_FULL || rc == TR_ERR_NOMEM) {
    TR_WARN("link", "host %s: guest machine \"%.40s\" refused: %s (at most %d per host)",
            p->host->name, g->name ? g->name : "", tr_strerror(rc), TR_HOSTS_MAX_GUESTS);
    return;
  }
  if (rc < 0) {
    tr_relay_link_protocol_error(p->link, "guest machine %u refused: %s", g->guest_id,
                                 tr_strerror(rc));
    return;
  }
  if (joined) {
    TR_INFO("link", "guest machine %s joined through %s's relay endpoint", guest->name,
            p->host->name);
    ls->ev->host_connected(ls->svc, guest);
  }
}

/* A guest's SyncClock exchange, on its agent's clock at t1 and t4: made one on ours through
 * our estimate of the agent's host, as a regional's relayed exchange is. Until that host's
 * clock is measured the exchange cannot be placed: skipped (the agent sends it again after
 * each Welcome, and the guest every 30 s). Its clocks become the guest's clock snapshot. */
static void on_guest_clock(tr_link_peer *p, const Tracerelay__GuestClockExchange *x) {
  tr_link_server *ls = p->ls;
  tr_host *guest = tr_hosts_guest_find(p->host, x->guest_id);
  const uint64_t limit = 1ull << 62;
  if (!x->has_t1 || !x->has_t2 || !x->has_t3 || !x->has_t4 || x->t1 >= limit ||
      x->t2 >= limit || x->t3 >= limit || x->t4 >= limit || x->t3 < x->t2 || x->t4 < x->t1 ||
      x->n_clocks == 0) {
    tr_relay_link_protocol_error(p->link, "guest clock exchange with times missing or out of order");
    return;
  }
  if (guest == NULL)
    return; /* one the service refused, or that left meanwhile */
  struct tr_clocksync_probe in = {.t1 = (int64_t)x->t1, .t2 = (int64_t)x->t2,
                                  .t3 = (int64_t)x->t3, .t4 = (int64_t)x->t4};
  add_guest_exchange(p->host, guest, &in);
  Tracerelay__HostClockSnapshot snap = TRACERELAY__HOST_CLOCK_SNAPSHOT__INIT;
  snap.n_clocks = x->n_clocks;
  snap.clocks = x->clocks;
  if (ls->ev->host_clock_snapshot(ls->svc, guest, &snap) < 0)
    tr_relay_link_protocol_error(p->link, "malformed guest clock snapshot");
}

/* The frames of a Welcome's re-announcement: the guests, then every producer. */
static bool is_reannouncement(const Tracerelay__RelayFrame *f) {
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_GUEST_MACHINE ||
      f->msg_case == TRACERELAY__RELAY_FRAME__MSG_GUEST_CLOCK_EXCHANGE)
    return true;
  return f->msg_case == TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE &&
         f->producer_update->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
}

/* A producer's end that the agent ordered after its batches (ProducerUpdate.after_seq). */
static bool is_ordered_end(const Tracerelay__ProducerUpdate *u) {
  return u->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED &&
         u->has_after_seq && u->producer_id != 0;
}

/* Holds a reply or a producer's end until the batches queued before it are in (hosts.h). */
static void hold_ordered(tr_link_peer *p, Tracerelay__RelayFrame *f) {
  uint64_t request_id =
      f->msg_case == TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY ? f->command_reply->request_id : 0;
  int rc = tr_hosts_hold_ordered(p->host, f); /* takes f, even on failure */
  if (rc == TR_ERR_NOT_FOUND) {
    /* Counted (tracerelay_host_replies_unexpected_total); logged once a link, as the flood
     * that would make them many costs the loop more with every line. */
    if (!p->warned_reply)
      TR_WARN("link", "host %s: reply to request %llu, which no command in flight has: "
              "refused (tracerelay_host_replies_unexpected_total counts them)",
              p->host->name, (unsigned long long)request_id);
    p->warned_reply = true;
  } else if (rc < 0) {
    tr_relay_link_protocol_error(p->link, "more than %u replies and producer ends, or %u bytes "
                                 "of them, waiting for their batches",
                                 TR_HOSTS_MAX_HELD_FRAMES, TR_HOSTS_MAX_HELD_BYTES);
  } else {
    tr_hosts_release_ordered(p->ls->hosts, p->host);
  }
}

/* Handles one decoded frame; takes ownership of it. */
static void on_frame(tr_relay_link *link, Tracerelay__RelayFrame *f) {
  tr_link_peer *p = tr_relay_link_data(link);
  tr_link_server *ls = p->ls;
  if (p->carrier) { /* its own frames: the carried links' went to their peers */
    if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_GOODBYE)
      tr_relay_link_hang_up(link);
    else if (f->msg_case != TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT)
      tr_relay_link_protocol_error(link, "frame type %d on a carrier", (int)f->msg_case);
    tr_relay_frame_free(f);
    return;
  }
  if (p->host == NULL) {
    if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HELLO)
      on_hello(p, f->hello);
    else
      tr_relay_link_protocol_error(p->link, "expected Hello, got frame type %d", (int)f->msg_case);
    tr_relay_frame_free(f);
    return;
  }
  if (p->resyncing && !is_reannouncement(f)) {
    p->resyncing = false;
    tr_hosts_resync_end(ls->hosts, p->host);
  }
  int rc;
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    TR_INFO("link", "host %s says goodbye (reason %d): %s", p->host->name,
            (int)f->goodbye->reason, f->goodbye->text != NULL ? f->goodbye->text : "");
    tr_hosts_agent_goodbye(p->host, f->goodbye->has_reason &&
                                        f->goodbye->reason ==
                                            TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN);
    tr_relay_link_hang_up(link);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    break;
  case TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE:
    if (is_ordered_end(f->producer_update)) {
      hold_ordered(p, f);
      f = NULL; /* taken */
      break;
    }
    char why[160];
    tr_host *entry = tr_hosts_update_entry(p->host, f->producer_update);
    rc = entry ? tr_hosts_producer_update_check(entry, f->producer_update, why, sizeof why) : 0;
    if (rc == 0 && (rc = tr_hosts_producer_update(ls->hosts, p->host, f->producer_update)) < 0)
      snprintf(why, sizeof why, "%s", tr_strerror(rc));
    if (rc < 0)
      tr_relay_link_protocol_error(p->link, "producer update for producer %u refused: %s",
                                   f->producer_update->producer_id, why);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH:
    on_batch(p, f->chunk_batch);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY:
    hold_ordered(p, f);
    f = NULL; /* taken */
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE:
    if (p->features & TR_RELAY_FEATURE_CLOCK_PROBES)
      on_probe_answer(p, f->clock_probe);
    else
      tr_relay_link_protocol_error(p->link, "clock probe answer without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_FOLLOW_UP:
    if (p->features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP)
      on_probe_follow_up(p, f->clock_follow_up);
    else
      tr_relay_link_protocol_error(p->link, "clock follow-up without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_RELAYED_CLOCK_EXCHANGE:
    if (p->features & TR_RELAY_FEATURE_RELAYED_CLOCKS)
      on_relayed_exchange(p, f->relayed_clock_exchange);
    else
      tr_relay_link_protocol_error(p->link, "relayed clock exchange without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_AGENT_STATS:
    if (p->features & TR_RELAY_FEATURE_AGENT_STATS)
      tr_hosts_agent_stats(p->host, f->agent_stats);
    else
      tr_relay_link_protocol_error(p->link, "agent stats without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_TRIGGER:
    if (!(p->features & TR_RELAY_FEATURE_TRIGGERS))
      tr_relay_link_protocol_error(p->link, "trigger without the feature");
    else if (!f->trigger->name || strlen(f->trigger->name) > TR_RELAY_TRIGGER_NAME_MAX ||
             (f->trigger->producer_name &&
              strlen(f->trigger->producer_name) > TR_RELAY_TRIGGER_NAME_MAX))
      tr_relay_link_protocol_error(p->link, "trigger without a name, or a name over %u bytes",
                                   TR_RELAY_TRIGGER_NAME_MAX);
    else if (ls->ev->trigger)
      ls->ev->trigger(ls->svc, p->host, f->trigger);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GUEST_MACHINE:
    if (p->features & TR_RELAY_FEATURE_GUESTS)
      on_guest(p, f->guest_machine);
    else
      tr_relay_link_protocol_error(p->link, "guest machine without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GUEST_CLOCK_EXCHANGE:
    if (p->features & TR_RELAY_FEATURE_GUESTS)
      on_guest_clock(p, f->guest_clock_exchange);
    else
      tr_relay_link_protocol_error(p->link, "guest clock exchange without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HOST_CLOCK_SNAPSHOT:
    if (!(p->features & TR_RELAY_FEATURE_HOST_CLOCKS))
      tr_relay_link_protocol_error(p->link, "host clock snapshot without the feature");
    else if (ls->ev->host_clock_snapshot(ls->svc, p->host, f->host_clock_snapshot) < 0)
      tr_relay_link_protocol_error(p->link, "malformed host clock snapshot");
    break;
  default:
    tr_relay_link_protocol_error(p->link, "unexpected frame type %d", (int)f->msg_case);
    break;
  }
  tr_relay_frame_free(f);
}

/* ---- the link's other events ---- */

static void on_read(tr_relay_link *link) {
  tr_link_peer *p = tr_relay_link_data(link);
  tr_tls_uv_conn *conn = tr_relay_link_conn(link);
  /* Before decryption: a probe answer's arrival; checked for reordering while an answer is
   * due (a saturated, lossy link), plain otherwise (a getsockopt per read would cost). Frames
   * held while reading was paused keep the time of the read that brought them. */
  p->t4 = tr_clock_probe_awaiting_answer(&p->probe) ? tr_tls_uv_read_time_checked(conn, false)
                                                     : tr_tls_uv_read_time(conn);
}

/* The BatchAck for the burst waits for a command to ride with (send_with_ack), unless due. */
static void on_read_done(tr_relay_link *link) {
  tr_link_peer *p = tr_relay_link_data(link);
  send_ack_due(p, uv_now(p->ls->loop));
}

/* ---- connections ---- */

static void maybe_free_server(tr_link_server *ls) {
  if (!ls->stopping || !ls->tick_closed || ls->peers != NULL)
    return;
  tr_tls_config_unref(ls->tls);
  tr_relay_codec_free(&ls->codec);
  free(ls);
}

static tr_link_peer *peer_open(tr_relay_link *link, tr_link_server *ls) {
  tr_link_peer *p = calloc(1, sizeof *p);
  tr_relay_link_set_data(link, p);
  if (p == NULL) {
    tr_relay_link_close(link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "out of memory");
    return NULL;
  }
  p->ls = ls;
  p->link = link;
  p->connected_ms = uv_now(ls->loop);
  p->next = ls->peers;
  if (p->next != NULL)
    p->next->prev = p;
  ls->peers = p;
  return p;
}

static void on_open(tr_relay_link *link) { peer_open(link, tr_relay_link_data(link)); }

/* A slot a regional opened on its carrier (the carrier's peer is the link's data until now; it
 * outlives the slot: a carrier's links are closed before it). */
static void on_carried_open(tr_relay_link *link) {
  tr_link_peer *carrier = tr_relay_link_data(link);
  tr_link_peer *p = peer_open(link, carrier->ls);
  if (p != NULL)
    p->carried_features = carrier->features & TR_RELAY_FEATURES_CARRIED;
}

/* The link cannot send any more: no probe may be scheduled for it (clock_probe.h). */
static void on_closing(tr_relay_link *link) {
  tr_link_peer *p = tr_relay_link_data(link);
  if (p != NULL)
    tr_clock_probe_remove(&p->ls->probes, &p->probe);
}

static void on_closed(tr_relay_link *link, int reason, const char *why) {
  tr_link_peer *p = tr_relay_link_data(link);
  if (p == NULL)
    return;
  tr_link_server *ls = p->ls;
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    ls->peers = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  tr_host *host = p->host;
  if (p->carrier)
    TR_INFO("link", "the carrier of regional %s closed: %s",
            tr_tls_uv_peer_name(tr_relay_link_conn(link)), reason ? why : "closed by us");
  if (host != NULL) {
    tr_hosts_link_down(host);
    ls->connected--;
    TR_INFO("link", "host %s disconnected: %s", host->name, reason ? why : "closed by us");
    ls->ev->host_disconnected(ls->svc, host, why);
    /* Its guests were reached through it: gone with it until its agent announces them again. */
    size_t n;
    tr_host *const *guests = tr_hosts_guests(host, &n);
    for (size_t i = 0; i < n; i++) {
      if (guests[i]->link == NULL)
        continue;
      tr_hosts_guest_leave(guests[i]);
      ls->ev->host_disconnected(ls->svc, guests[i], why);
    }
  }
  free(p);
  maybe_free_server(ls);
}

static const struct tr_relay_link_events link_events = {
    .on_open = on_open, .on_read = on_read, .on_frame = on_frame, .on_read_done = on_read_done,
    .on_closing = on_closing, .on_closed = on_closed};
static const struct tr_relay_link_events carried_events = {
    .on_open = on_carried_open, .on_read = on_read, .on_frame = on_frame,
    .on_read_done = on_read_done, .on_closing = on_closing, .on_closed = on_closed};

/* ---- timers: heartbeats and clock probes ---- */

/* Closes a peer whose agent went silent, or that never said Hello. */
static void check_peer(tr_link_peer *p, uint64_t now_ns, uint64_t now_ms) {
  if (!tr_relay_link_check_alive(p->link, now_ns))
    return;
  /* Bytes that never make a Hello (a client that stalls after the handshake, or trickles a
   * frame) must not hold a connection: heartbeats alone would let them. */
  if (p->host == NULL && !p->carrier && now_ms - p->connected_ms >= p->ls->hello_timeout_ms)
    tr_relay_link_protocol_error(p->link, "no Hello within %u ms of the TLS handshake",
                                 p->ls->hello_timeout_ms);
}

/* In a session, when the tick has work next: the next probe due or the next walk, but not
 * sooner than TICK_SESSION_MS after the last tick. */
static uint64_t session_tick_due(const tr_link_server *ls) {
  uint64_t due = tr_clock_probe_next_due_ms(&ls->probes);
  uint64_t walk_due = ls->walked_ms + WALK_MS, soonest = ls->ticked_ms + TICK_SESSION_MS;
  if (walk_due < due)
    due = walk_due;
  return due < soonest ? soonest : due;
}

/* How long until the tick has work: between sessions TICK_MS; in a session until
 * session_tick_due, at most WALK_MS. */
static uint64_t tick_delay(const tr_link_server *ls, uint64_t now_ms) {
  if (!ls->session)
    return TICK_MS;
  uint64_t due = session_tick_due(ls);
  return due <= now_ms ? 0 : due - now_ms > WALK_MS ? WALK_MS : due - now_ms;
}

static void arm_tick(tr_link_server *ls, uint64_t now_ms) {
  uv_timer_start(&ls->tick, on_tick, tick_delay(ls, now_ms), 0);
}

/* After the probes' schedule changed (a peer added, an exchange ended, a probe asked for): a
 * session's tick set for later than the schedule now needs comes sooner. */
static void tick_sooner(tr_link_server *ls) {
  if (!ls->session || ls->stopping)
    return;
  uint64_t delay = tick_delay(ls, uv_now(ls->loop));
  if (delay < uv_timer_get_due_in(&ls->tick))
    uv_timer_start(&ls->tick, on_tick, delay, 0);
}

static void on_tick(uv_timer_t *t) {
  tr_link_server *ls = t->data;
  uint64_t now_ns = uv_hrtime(), now_ms = uv_now(ls->loop);
  bool session = ls->ev->any_session(ls->svc);
  ls->counts.ticks++;
  ls->ticked_ms = now_ms;
  if (session != ls->session) {
    ls->session = session;
    for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
      if (p->carrier)
        send_sessions(p, session);
  }
  bool walk = now_ms - ls->walked_ms >= WALK_MS;
  if (walk) {
    ls->walked_ms = now_ms;
    ls->counts.walks++;
  }
  /* Closing a peer frees it later (on_close), so the list stays walkable. The dead are closed
   * before the probes go; heartbeats go after them, as a probe brings one of its own and one
   * queued before it would hold it back. Nothing may precede Welcome. */
  if (walk)
    for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
      check_peer(p, now_ns, now_ms);
  tr_clock_probe_tick(&ls->probes, now_ms, session);
  if (walk)
    for (tr_link_peer *p = ls->peers; p != NULL; p = p->next) {
      send_ack_due(p, now_ms);
      if (p->carrier && !tr_relay_link_closing(p->link))
        tell_drift_moved(p);
      tr_relay_link_keep_alive(p->link, now_ns);
    }
  arm_tick(ls, now_ms);
}

/* ---- the public side ---- */

static int send_command(tr_host *host, const Tracerelay__Command *cmd) {
  if (host->link == NULL)
    return TR_ERR_CLOSED;
  tr_relay_link *link = host->link->link;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_COMMAND;
  f.command = (Tracerelay__Command *)cmd;
  tr_hosts_command_sent(host, cmd);
  int rc = send_with_ack(host->link, &f);
  return tr_relay_link_closing(link) ? TR_ERR_CLOSED : rc;
}

static void probe_clock(tr_host *host) {
  tr_link_peer *p = host->link;
  if (p != NULL) {
    tr_clock_probe_request(&p->ls->probes, &p->probe, uv_now(p->ls->loop));
    tick_sooner(p->ls);
  }
}

static int64_t cert_expiry(const tr_host *host) {
  const tr_link_peer *p = host->link;
  const tr_tls_session *tls = p != NULL ? tr_tls_uv_session(tr_relay_link_conn(p->link)) : NULL;
  return tls != NULL && !p->relayed ? tr_tls_peer_expiry(tls) : 0;
}

const struct tr_link_commands tr_link_server_commands = {.send_command = send_command,
                                                         .probe_clock = probe_clock,
                                                         .cert_expiry = cert_expiry};

void tr_link_server_disconnect(tr_host *host, const char *why) {
  if (host->link != NULL)
    tr_relay_link_close(host->link->link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "%s",
                        why);
}

int tr_link_server_start(uv_loop_t *loop, tr_hosts *hosts, const struct tr_link_server_opts *opts,
                         tr_link_server **out) {
  struct sockaddr_storage addr;
  if (opts->listen == NULL || tr_relay_link_listen_addr(opts->listen, &addr) < 0) {
    TR_ERROR("link", "cannot listen on '%s': give ADDR:PORT, e.g. 0.0.0.0:%d or [::]:%d",
             opts->listen ? opts->listen : "", TR_LINK_DEFAULT_PORT, TR_LINK_DEFAULT_PORT);
    return TR_ERR_CONFIG;
  }
  tr_link_server *ls = calloc(1, sizeof *ls);
  if (ls == NULL)
    return TR_ERR_NOMEM;
  /* One decompression context for every peer: batches are taken apart on this loop, one at a
   * time (a context per connection was 96 KiB each). The limit is every peer's reader's. */
  int rc =
      tr_relay_codec_init(&ls->codec, TR_RELAY_ZSTD_LEVEL_DEFAULT, TR_RELAY_MAX_FRAME_DEFAULT);
  if (rc < 0)
    goto fail_free;
  ls->loop = loop;
  ls->hosts = hosts;
  ls->svc = tr_hosts_service(hosts);
  ls->ev = tr_hosts_events(hosts);
  tr_clock_probe_sched_init(&ls->probes, &probe_ops);
  ls->features =
      opts->features ? opts->features : TR_RELAY_FEATURES_ALL & ~TR_RELAY_FEATURE_UPSTREAM_LOST;
  ls->max_agents = opts->max_agents ? opts->max_agents : TR_LINK_DEFAULT_MAX_AGENTS;
  ls->relay_allow = opts->relay_allow;
  ls->tls = tr_tls_config_ref(opts->tls);
  ls->hello_timeout_ms =
      opts->handshake_timeout_ms ? opts->handshake_timeout_ms : TR_TLS_UV_HANDSHAKE_TIMEOUT_MS;
  ls->ack_delay_ms = opts->ack_delay_ms ? opts->ack_delay_ms : TR_LINK_ACK_DELAY_MS;
  if (getrandom(&ls->instance_id, sizeof ls->instance_id, 0) != sizeof ls->instance_id) {
    rc = TR_ERR_SYS(errno);
    goto fail_codec;
  }
  struct tr_relay_link_opts link_opts = {
      .tls = {.max_queued = TR_LINK_MAX_QUEUED,
              .handshake_timeout_ms = ls->hello_timeout_ms,
              .max_handshakes_per_source = opts->max_handshakes_per_source,
              .max_waiting_per_source = opts->max_waiting_per_source},
      .heartbeat_interval_ms = opts->heartbeat_interval_ms,
      .heartbeat_timeout_ms = opts->heartbeat_timeout_ms,
      .pause_read_above = TR_LINK_MAX_QUEUED / 2,
      .peer_role = "agent"};
  rc = tr_relay_link_listen(loop, opts->tls, (struct sockaddr *)&addr, &link_opts, &link_events,
                            ls, &ls->listener);
  if (rc < 0) {
    TR_ERROR("link", "cannot listen on %s: %s", opts->listen, tr_strerror(rc));
    goto fail_codec;
  }
  uv_timer_init(loop, &ls->tick);
  ls->tick.data = ls;
  arm_tick(ls, uv_now(loop));
  TR_INFO("link", "listening for agents on %s (port %d)", opts->listen,
          tr_relay_link_listener_port(ls->listener));
  *out = ls;
  return 0;

fail_codec:
  tr_tls_config_unref(ls->tls);
  tr_relay_codec_free(&ls->codec);
fail_free:
  free(ls);
  return rc;
}

int tr_link_server_port(const tr_link_server *ls) {
  return tr_relay_link_listener_port(ls->listener);
}

void tr_link_server_counts(const tr_link_server *ls, struct tr_link_server_counts *out) {
  *out = ls->counts;
}

void tr_link_server_tls_stats(const tr_link_server *ls, struct tr_tls_uv_server_stats *out) {
  tr_relay_link_listener_stats(ls->listener, out);
}

/* Whether cfg, loaded now, refuses a connected peer: its certificate (an agent's, or a
 * regional's for the hosts it relays) revoked or its name denied, or a relayed host's name
 * denied. */
static bool peer_refused(const tr_link_peer *p, const tr_tls_config *cfg, char *why, size_t cap) {
  const tr_tls_session *tls = tr_tls_uv_session(tr_relay_link_conn(p->link));
  if (tls != NULL && tr_tls_peer_refusal(tls, cfg, why, cap))
    return true;
  if (p->relayed && p->host != NULL && tr_tls_config_denies(cfg, p->host->name)) {
    snprintf(why, cap, "%s is denied (--deny)", p->host->name);
    return true;
  }
  return false;
}

void tr_link_server_reload_tls(tr_link_server *ls, tr_tls_config *cfg) {
  tr_relay_link_listener_set_config(ls->listener, cfg);
  tr_tls_config_unref(ls->tls);
  ls->tls = tr_tls_config_ref(cfg);
  unsigned cut = 0;
  char why[256];
  for (tr_link_peer *p = ls->peers; p != NULL; p = p->next) {
    if (tr_relay_link_closing(p->link) || !peer_refused(p, cfg, why, sizeof why))
      continue;
    TR_WARN("link", "%s %s (%s): closing its link, %s since the reload",
            p->carrier ? "regional" : "host", p->host ? p->host->name : "(no Hello yet)",
            tr_tls_uv_peer_address(tr_relay_link_conn(p->link)), why);
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                        "%s: the service no longer accepts it", why);
    cut++;
  }
  TR_INFO("link", "TLS configuration reloaded: new agent connections use it; %u connected "
          "link(s) closed as revoked or denied", cut);
}

int64_t tr_link_server_peer_expiry(const tr_link_server *ls, const char **name) {
  int64_t earliest = 0;
  for (const tr_link_peer *p = ls->peers; p != NULL; p = p->next) {
    const tr_tls_session *tls = tr_tls_uv_session(tr_relay_link_conn(p->link));
    int64_t t = tls != NULL && !p->relayed ? tr_tls_peer_expiry(tls) : 0;
    if (t != 0 && (earliest == 0 || t < earliest)) {
      earliest = t;
      *name = tr_tls_peer_name(tls);
    }
  }
  return earliest;
}

static void on_tick_closed(uv_handle_t *h) {
  tr_link_server *ls = h->data;
  ls->tick_closed = true;
  maybe_free_server(ls);
}

void tr_link_server_stop(tr_link_server *ls) {
  if (ls->stopping)
    return;
  ls->stopping = true;
  tr_relay_link_listener_close(ls->listener);
  for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
    tr_relay_link_close(p->link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN,
                        "the service is shutting down");
  uv_close((uv_handle_t *)&ls->tick, on_tick_closed);
}
