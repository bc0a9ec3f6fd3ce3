/* link_server.c: the service's end of the relay link (see link_server.h for the contract).
 *
 * One tr_link_peer per TLS connection that finished its handshake, freed in tls_uv's
 * on_close: the one close path, reached by tr_tls_uv_close (ours, after an optional Goodbye)
 * or by the transport. What must outlive a connection (the batch sequence, held replies,
 * producers, the clock estimate) lives in the host table (hosts.c). One timer per server
 * drives heartbeats and clock probes for every peer: O(peers) every TICK_MS (TICK_SESSION_MS
 * while a session runs). Who is probed when, and what an answer means, is relay/clock_probe.c;
 * this file sends the probes and feeds the completed exchanges to the host's estimator. */
#include "service/link_server.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "relay/clock.h"
#include "relay/clock_probe.h"
#include "relay/clocksync.h"
#include "relay/hostport.h"
#include "relay/log.h"
#include "relay/relay_conn.h"
#include "relay/relay_frame.h"
#include "relay/relay_session.h"
#include "relay/tls_uv.h"
#include "relay/tr_error.h"

#define TICK_MS 50
#define TICK_SESSION_MS TR_CLOCK_PROBE_SESSION_MIN_MS /* while a session runs */

struct tr_link_peer {
  tr_link_server *ls;
  tr_tls_uv_conn *conn;
  tr_link_peer *prev, *next;
  tr_host *host; /* set once Hello was accepted */
  uint64_t connected_ms; /* handshake done: Hello is due within hello_timeout_ms */
  tr_relay_reader reader;
  tr_relay_heartbeat hb;
  uint64_t features;  /* accepted */
  size_t max_out;     /* largest frame the agent accepts */
  uint64_t acked;     /* last seq acknowledged on this connection */
  bool resyncing;     /* between Welcome and the first frame that is not a re-announcement */
  bool closing;
  bool paused;        /* our output is backed up: socket reading is paused, and the rest of
                         the read that was being processed waits in stash */
  uint8_t *stash;
  size_t stash_len, stash_cap;
  int64_t t4;         /* BOOTTIME when the socket read being processed returned */
  struct tr_clock_probe_peer probe; /* scheduled from Welcome (with the feature) to closing */
};

struct tr_link_server {
  uv_loop_t *loop;
  tr_service *svc;
  const struct tr_link_events *ev; /* the upward calls, made with svc */
  tr_hosts *hosts;
  tr_tls_uv_server *tls;
  uv_timer_t tick;
  tr_link_peer *peers;
  uint64_t features;
  uint64_t instance_id;
  uint64_t hb_interval_ns, hb_timeout_ns;
  unsigned hello_timeout_ms;
  unsigned max_agents, connected; /* agents Welcomed now, and their bound */
  struct tr_clock_probe_sched probes;
  tr_relay_codec codec; /* decompresses every peer's batches */
  bool stopping;
  bool tick_closed;
};

/* ---- writing ---- */

static void peer_close(tr_link_peer *p, Tracerelay__Goodbye__Reason reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void hang_up(tr_link_peer *p);

/* Encodes and queues one frame. A full queue means the agent stopped reading: it is closed.
 * sent_ns: NULL, or where to put the exact send time (tr_tls_uv_write_stamped). */
static int send_frame_stamped(tr_link_peer *p, Tracerelay__RelayFrame *f, int64_t *sent_ns) {
  int rc = tr_relay_conn_send(p->conn, f, p->max_out, sent_ns);
  if (rc == TR_ERR_FULL && !p->closing)
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
               "the agent does not read what the service sends (%u bytes queued)",
               (unsigned)tr_tls_uv_queued(p->conn));
  if (rc < 0)
    return rc;
  tr_relay_heartbeat_sent(&p->hb, uv_hrtime());
  if ((size_t)rc > TR_LINK_MAX_QUEUED / 2 && !p->paused) {
    p->paused = true;
    tr_tls_uv_pause_read(p->conn); /* TCP now holds the agent back, not our memory */
  }
  return 0;
}

static int send_frame(tr_link_peer *p, Tracerelay__RelayFrame *f) {
  return send_frame_stamped(p, f, NULL);
}

/* Ends the connection; the rest happens in on_close. reason UNSPECIFIED: no Goodbye. */
static void peer_close(tr_link_peer *p, Tracerelay__Goodbye__Reason reason, const char *fmt, ...) {
  if (p->closing)
    return;
  p->closing = true;
  char text[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (reason != TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN)
    TR_WARN("link", "closing the link of %s (%s): %s", tr_tls_uv_peer_name(p->conn),
            tr_tls_uv_peer_address(p->conn), text);
  if (reason != TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED)
    tr_relay_conn_goodbye(p->conn, reason, text, p->max_out);
  hang_up(p);
}

static void hang_up(tr_link_peer *p) {
  p->closing = true;
  tr_clock_probe_remove(&p->ls->probes, &p->probe);
  tr_tls_uv_close(p->conn);
}

#define PROTO_ERROR(p, ...) peer_close((p), TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR, \
                                       "protocol error: " __VA_ARGS__)

static void send_ack(tr_link_peer *p) {
  uint64_t stored = tr_hosts_peer(p->host)->stored_seq;
  if (stored <= p->acked || p->closing)
    return;
  Tracerelay__BatchAck ack = TRACERELAY__BATCH_ACK__INIT;
  ack.has_seq = 1;
  ack.seq = stored;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_BATCH_ACK;
  f.batch_ack = &ack;
  if (send_frame(p, &f) == 0)
    p->acked = stored;
}

/* at_once: written straight to the socket (a stamped write, its time unused), not queued. */
static void send_heartbeat(tr_link_peer *p, bool at_once) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, tr_clock_boottime_ns());
  int64_t sent = 0;
  send_frame_stamped(p, &f, at_once ? &sent : NULL);
}

/* ---- clock probes: the transport's side of relay/clock_probe.h ---- */

/* A probe goes only when our output is idle: one queued behind other frames would only
 * measure the queue. */
static int probe_send(void *data, uint64_t probe_id, int64_t *t1) {
  tr_link_peer *p = data;
  if (p->closing)
    return TR_ERR_CLOSED;
  if (p->paused || tr_tls_uv_queued(p->conn) > 0)
    return TR_ERR_AGAIN;
  /* A heartbeat right before the probe warms the kernel's sending path to the host, idle for
   * milliseconds between probes: a cold send took 7-17 us from the write to the driver against
   * 3-5 us for the next one, and the probe's leg is then as short as the way back
   * (docs/timeline.md, Measured accuracy). */
  send_heartbeat(p, true);
  if (p->closing)
    return TR_ERR_CLOSED;
  Tracerelay__ClockProbe probe = TRACERELAY__CLOCK_PROBE__INIT;
  probe.has_probe_id = probe.has_t1 = 1;
  probe.probe_id = probe_id;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE;
  f.clock_probe = &probe;
  /* The exact t1 is taken once the frame is encrypted, right before the kernel takes it; this
   * earlier reading stands in when the bytes had to be queued (still a valid bound). */
  *t1 = (int64_t)tr_clock_boottime_ns();
  probe.t1 = (uint64_t)*t1;
  int64_t sent = 0;
  int rc = send_frame_stamped(p, &f, &sent);
  if (rc < 0)
    return rc;
  if (sent > 0)
    *t1 = sent;
  return 0;
}

static int64_t probe_sent_time(void *data, int64_t t1) {
  tr_link_peer *p = data;
  return tr_tls_uv_sent_time(p->conn, t1);
}

static double probe_drift_ppm(void *data) {
  tr_link_peer *p = data;
  return p->host->clock ? tr_clocksync_drift_ppm(p->host->clock) : 0;
}

static void probe_done(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex) {
  tr_link_peer *p = data;
  int rc = tr_clocksync_add_probe(p->host->clock, ex->t1, ex->t2, ex->t3, ex->t4);
  TR_DEBUG("link", "host %s: clock probe %llu t1 %lld t2 %lld t3 %lld t4 %lld: %s",
           p->host->name, (unsigned long long)probe_id, (long long)ex->t1, (long long)ex->t2,
           (long long)ex->t3, (long long)ex->t4, rc < 0 ? tr_strerror(rc) : "used");
}

static const struct tr_clock_probe_ops probe_ops = {
    .send = probe_send, .sent_time = probe_sent_time, .drift_ppm = probe_drift_ppm,
    .done = probe_done};

/* ---- frames from the agent ---- */

static void on_hello(tr_link_peer *p, const Tracerelay__Hello *hello) {
  tr_link_server *ls = p->ls;
  const char *name = tr_tls_uv_peer_name(p->conn);
  tr_host *host = tr_hosts_find(ls->hosts, name);
  if (host != NULL && host->link != NULL) {
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST,
               "host %s is already connected from %s; refusing the second connection", name,
               tr_tls_uv_peer_address(host->link->conn));
    return;
  }
  if (ls->connected >= ls->max_agents) {
    TR_WARN("link", "host %s refused: %u agents are connected, the most this service takes "
            "(--max-agents)", name, ls->connected);
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
               "the service already serves %u agents, its --max-agents; host %s refused",
               ls->connected, name);
    return;
  }
  uint32_t max_frame = hello->has_max_frame_bytes ? hello->max_frame_bytes : 0;
  if (max_frame == 0)
    max_frame = TR_RELAY_MAX_FRAME_DEFAULT;
  if (max_frame < TR_RELAY_MIN_FRAME || max_frame > TR_RELAY_MAX_FRAME_LIMIT) {
    PROTO_ERROR(p, "Hello.max_frame_bytes %u outside [%u, %u]", max_frame, TR_RELAY_MIN_FRAME,
                TR_RELAY_MAX_FRAME_LIMIT);
    return;
  }
  int rc = host != NULL ? 0 : tr_hosts_get(ls->hosts, name, &host);
  uint64_t welcome_seq = 0;
  if (rc == 0)
    rc = tr_hosts_hello(ls->hosts, host, hello, &welcome_seq);
  if (rc == TR_ERR_PROTO) {
    PROTO_ERROR(p, "Hello refused: agent instance %016llx, acked_seq %llu",
                (unsigned long long)hello->agent_instance_id,
                (unsigned long long)hello->acked_seq);
    return;
  }
  if (rc < 0) {
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "cannot take the agent: %s",
               tr_strerror(rc));
    return;
  }
  p->max_out = max_frame;
  p->features = tr_relay_features_negotiate(ls->features, hello->features);
  p->host = host;
  tr_hosts_link_up(host, p, tr_clock_boottime_ns());
  ls->connected++;

  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.has_features = w.has_service_instance_id = w.has_stored_seq = w.has_max_frame_bytes = 1;
  w.features = p->features;
  w.machine_name = host->name;
  w.service_instance_id = ls->instance_id;
  w.stored_seq = welcome_seq;
  w.max_frame_bytes = (uint32_t)p->reader.max_payload;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  if (send_frame(p, &f) < 0)
    return;
  p->acked = tr_hosts_peer(host)->stored_seq;
  p->resyncing = tr_hosts_resync_begin(ls->hosts, host) == 0;
  if (p->features & TR_RELAY_FEATURE_CLOCK_PROBES)
    tr_clock_probe_add(&ls->probes, &p->probe, p, p->features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP,
                       uv_now(ls->loop));
  TR_INFO("link", "host %s connected from %s (agent %016llx, features %#llx, resuming after "
          "batch %llu, %s)", host->name, tr_tls_uv_peer_address(p->conn),
          (unsigned long long)host->agent_instance_id, (unsigned long long)p->features,
          (unsigned long long)welcome_seq, tr_tls_uv_ciphersuite(p->conn));
  ls->ev->host_connected(ls->svc, host);
}

/* Every item kind is checked before any is delivered, so a batch is applied whole or not. */
static void on_batch(tr_link_peer *p, const Tracerelay__ChunkBatch *batch) {
  tr_host *host = p->host;
  tr_relay_peer *seqs = tr_hosts_peer(host);
  if (batch->codec == TRACERELAY__CODEC__CODEC_ZSTD && !(p->features & TR_RELAY_FEATURE_ZSTD)) {
    PROTO_ERROR(p, "zstd batch %llu without the feature", (unsigned long long)batch->seq);
    return;
  }
  int rc = tr_relay_peer_batch(seqs, batch->seq);
  tr_hosts_batch_seen(host);
  if (rc <= 0) {
    if (rc < 0)
      PROTO_ERROR(p, "batch with seq 0");
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
    PROTO_ERROR(p, "batch %llu is unusable: %s", (unsigned long long)batch->seq,
                tr_strerror(rc));
    tr_relay_items_free(owned);
    return;
  }
  tr_service *svc = p->ls->svc;
  const struct tr_link_events *ev = p->ls->ev;
  for (size_t i = 0; i < n; i++) {
    const Tracerelay__ChunkItem *it = items[i];
    switch (it->item_case) {
    case TRACERELAY__CHUNK_ITEM__ITEM_CHUNK:
      tr_hosts_chunk_received(host, it->chunk->payload.len);
      ev->chunk(svc, host, it->chunk);
      break;
    case TRACERELAY__CHUNK_ITEM__ITEM_PATCH:
      ev->patch(svc, host, it->patch);
      break;
    case TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK:
      ev->flush_ack(svc, host, it->flush_ack);
      break;
    default:
      break;
    }
  }
  tr_relay_items_free(owned);
  tr_hosts_batch_applied(host);
  tr_hosts_release_ordered(p->ls->hosts, host);
}

static void on_probe_answer(tr_link_peer *p, const Tracerelay__ClockProbe *a) {
  if (tr_clock_probe_answer(&p->ls->probes, &p->probe, a->probe_id, a->t2, a->t3, p->t4,
                            uv_now(p->ls->loop)) < 0)
    PROTO_ERROR(p, "clock probe answer with t2/t3 out of range");
}

/* Two-step probes: the exact send time of the answer, when the agent had one. */
static void on_probe_follow_up(tr_link_peer *p, const Tracerelay__ClockFollowUp *fu) {
  if (tr_clock_probe_follow_up(&p->ls->probes, &p->probe, fu->probe_id, fu->has_t3, fu->t3,
                               uv_now(p->ls->loop)) < 0)
    PROTO_ERROR(p, "clock follow-up with t3 out of range");
}

static bool is_reannouncement(const Tracerelay__RelayFrame *f) {
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
  if (tr_hosts_hold_ordered(p->host, f) < 0) /* takes f, even on failure */
    PROTO_ERROR(p, "too many replies and producer ends waiting for their batches");
  else
    tr_hosts_release_ordered(p->ls->hosts, p->host);
}

/* Handles one decoded frame; takes ownership of it. */
static void on_frame(tr_link_peer *p, Tracerelay__RelayFrame *f) {
  tr_link_server *ls = p->ls;
  if (p->host == NULL) {
    if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HELLO)
      on_hello(p, f->hello);
    else
      PROTO_ERROR(p, "expected Hello, got frame type %d", (int)f->msg_case);
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
    hang_up(p);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    break;
  case TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE:
    if (is_ordered_end(f->producer_update)) {
      hold_ordered(p, f);
      f = NULL; /* taken */
      break;
    }
    rc = tr_hosts_producer_update(ls->hosts, p->host, f->producer_update);
    if (rc < 0)
      PROTO_ERROR(p, "producer update for producer %u refused: %s",
                  f->producer_update->producer_id, tr_strerror(rc));
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
      PROTO_ERROR(p, "clock probe answer without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_FOLLOW_UP:
    if (p->features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP)
      on_probe_follow_up(p, f->clock_follow_up);
    else
      PROTO_ERROR(p, "clock follow-up without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_AGENT_STATS:
    if (p->features & TR_RELAY_FEATURE_AGENT_STATS)
      tr_hosts_agent_stats(p->host, f->agent_stats);
    else
      PROTO_ERROR(p, "agent stats without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HOST_CLOCK_SNAPSHOT:
    if (!(p->features & TR_RELAY_FEATURE_HOST_CLOCKS))
      PROTO_ERROR(p, "host clock snapshot without the feature");
    else if (ls->ev->host_clock_snapshot(ls->svc, p->host, f->host_clock_snapshot) < 0)
      PROTO_ERROR(p, "malformed host clock snapshot");
    break;
  default:
    PROTO_ERROR(p, "unexpected frame type %d", (int)f->msg_case);
    break;
  }
  tr_relay_frame_free(f);
}

/* ---- reading ---- */

static void stash(tr_link_peer *p, const uint8_t *data, size_t len) {
  if (p->stash_len + len > TR_LINK_STASH_MAX) {
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
               "the agent sent %zu bytes while its acknowledgements could not be sent",
               p->stash_len + len);
    return;
  }
  if (p->stash_len + len > p->stash_cap) {
    size_t cap = (p->stash_len + len) * 2;
    uint8_t *grown = realloc(p->stash, cap);
    if (grown == NULL) {
      peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "out of memory");
      return;
    }
    p->stash = grown;
    p->stash_cap = cap;
  }
  memcpy(p->stash + p->stash_len, data, len);
  p->stash_len += len;
}

/* Takes whole frames out of the reader, then feeds it more of data, until data is used up,
 * the connection closes, or our output backs up (the rest is stashed). */
static void consume(tr_link_peer *p, const uint8_t *data, size_t len) {
  for (;;) {
    char why[96];
    while (!p->closing && !p->paused) {
      Tracerelay__RelayFrame *f;
      int rc = tr_relay_conn_next(&p->reader, &f, why, sizeof why);
      if (rc == 0)
        break;
      if (rc < 0) {
        PROTO_ERROR(p, "%s", why);
        return;
      }
      on_frame(p, f);
    }
    if (p->closing)
      return;
    if (p->paused) {
      stash(p, data, len);
      return;
    }
    if (len == 0)
      return;
    int n = tr_relay_conn_push(&p->reader, data, len, why, sizeof why);
    if (n < 0) {
      PROTO_ERROR(p, "%s", why);
      return;
    }
    data += n;
    len -= (size_t)n;
  }
}

static void end_burst(tr_link_peer *p) {
  if (p->host != NULL && !p->closing)
    send_ack(p);
}

static void on_read(tr_tls_uv_conn *conn, const void *data, size_t len) {
  tr_link_peer *p = tr_tls_uv_get_data(conn);
  /* Before decryption: a probe answer's arrival; checked for reordering while an answer is
   * due (a saturated, lossy link), plain otherwise (a getsockopt per read would cost). */
  p->t4 = tr_clock_probe_awaiting_answer(&p->probe) ? tr_tls_uv_read_time_checked(conn)
                                                     : tr_tls_uv_read_time(conn);
  if (p->closing)
    return;
  /* Any bytes prove the agent alive, even part of a long frame on a slow link. */
  tr_relay_heartbeat_heard(&p->hb, uv_hrtime());
  consume(p, data, len);
  end_burst(p);
}

static void on_drain(tr_tls_uv_conn *conn) {
  tr_link_peer *p = tr_tls_uv_get_data(conn);
  if (!p->paused || p->closing)
    return;
  p->paused = false;
  /* t4 stays the time of the read whose rest was stashed: when those bytes arrived. */
  uint8_t *held = p->stash;
  size_t len = p->stash_len;
  p->stash = NULL;
  p->stash_len = p->stash_cap = 0;
  consume(p, held, len);
  free(held);
  end_burst(p);
  if (!p->paused && !p->closing)
    tr_tls_uv_resume_read(p->conn);
}

/* ---- connections ---- */

static void maybe_free_server(tr_link_server *ls) {
  if (!ls->stopping || !ls->tick_closed || ls->peers != NULL)
    return;
  tr_hosts_free(ls->hosts);
  tr_relay_codec_free(&ls->codec);
  free(ls);
}

static void on_connect(tr_tls_uv_conn *conn) {
  tr_link_server *ls = tr_tls_uv_get_data(conn);
  tr_link_peer *p = calloc(1, sizeof *p);
  if (p == NULL || tr_relay_reader_init(&p->reader, 0) < 0) {
    free(p);
    goto fail;
  }
  p->ls = ls;
  p->conn = conn;
  p->max_out = TR_RELAY_MAX_FRAME_DEFAULT;
  p->connected_ms = uv_now(ls->loop);
  tr_relay_heartbeat_init(&p->hb, ls->hb_interval_ns, ls->hb_timeout_ns, uv_hrtime());
  p->next = ls->peers;
  if (p->next != NULL)
    p->next->prev = p;
  ls->peers = p;
  tr_tls_uv_set_data(conn, p);
  return;

fail:
  TR_WARN("link", "out of memory: dropping the connection of %s", tr_tls_uv_peer_name(conn));
  tr_tls_uv_set_data(conn, NULL);
  tr_tls_uv_close(conn);
}

static void on_close(tr_tls_uv_conn *conn, int reason, const char *why) {
  tr_link_peer *p = tr_tls_uv_get_data(conn);
  if (p == NULL)
    return;
  tr_link_server *ls = p->ls;
  tr_clock_probe_remove(&ls->probes, &p->probe); /* when the transport ended it */
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    ls->peers = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  tr_host *host = p->host;
  if (host != NULL) {
    tr_hosts_link_down(host);
    ls->connected--;
    TR_INFO("link", "host %s disconnected: %s", host->name, reason ? why : "closed by us");
    ls->ev->host_disconnected(ls->svc, host, why);
  }
  tr_frame_reader_free(&p->reader);
  free(p->stash);
  free(p);
  maybe_free_server(ls);
}

/* ---- timers: heartbeats and clock probes ---- */

/* Closes a peer whose agent went silent, or that never said Hello. */
static void check_peer(tr_link_peer *p, uint64_t now_ns, uint64_t now_ms) {
  if (tr_relay_heartbeat_dead(&p->hb, now_ns)) {
    if (p->paused) /* we stopped reading because the agent stopped reading */
      peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                 "the agent has not read what the service sent for %llu ms",
                 (unsigned long long)(p->hb.timeout_ns / 1000000));
    else
      peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "nothing received for %llu ms",
                 (unsigned long long)(p->hb.timeout_ns / 1000000));
    return;
  }
  /* Bytes that never make a Hello (a client that stalls after the handshake, or trickles a
   * frame) must not hold a connection: heartbeats alone would let them. */
  if (p->host == NULL && now_ms - p->connected_ms >= p->ls->hello_timeout_ms)
    PROTO_ERROR(p, "no Hello within %u ms of the TLS handshake", p->ls->hello_timeout_ms);
}

static void on_tick(uv_timer_t *t) {
  tr_link_server *ls = t->data;
  uint64_t now_ns = uv_hrtime(), now_ms = uv_now(ls->loop);
  bool session = ls->ev->any_session(ls->svc);
  uv_timer_set_repeat(&ls->tick, session ? TICK_SESSION_MS : TICK_MS);
  /* Closing a peer frees it later (on_close), so the list stays walkable. The dead are closed
   * before the probes go; heartbeats go after them, as a probe brings one of its own and one
   * queued before it would hold it back. Nothing may precede Welcome. */
  for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
    if (!p->closing)
      check_peer(p, now_ns, now_ms);
  tr_clock_probe_tick(&ls->probes, now_ms, session);
  for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
    if (!p->closing && p->host != NULL && tr_relay_heartbeat_due(&p->hb, now_ns))
      send_heartbeat(p, false);
}

/* ---- the public side ---- */

int tr_link_server_send_command(tr_host *host, const Tracerelay__Command *cmd) {
  tr_link_peer *p = host->link;
  if (p == NULL || p->closing)
    return TR_ERR_CLOSED;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_COMMAND;
  f.command = (Tracerelay__Command *)cmd;
  int rc = send_frame(p, &f);
  return p->closing ? TR_ERR_CLOSED : rc;
}

void tr_link_server_probe_clock(tr_host *host) {
  tr_link_peer *p = host->link;
  if (p != NULL)
    tr_clock_probe_request(&p->ls->probes, &p->probe, uv_now(p->ls->loop));
}

void tr_link_server_disconnect(tr_host *host, const char *why) {
  if (host->link != NULL)
    peer_close(host->link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "%s", why);
}

/* "ADDR:PORT", "[V6]:PORT", "ADDR" or a bare IPv6 address (relay/hostport.h). */
static int parse_listen(const char *s, struct sockaddr_storage *out) {
  struct tr_hostport hp;
  if (tr_hostport_parse(s, true, &hp) < 0)
    return TR_ERR_CONFIG;
  if (uv_ip4_addr(hp.host, (int)hp.port, (struct sockaddr_in *)out) == 0 ||
      uv_ip6_addr(hp.host, (int)hp.port, (struct sockaddr_in6 *)out) == 0)
    return 0;
  return TR_ERR_CONFIG;
}

int tr_link_server_start(uv_loop_t *loop, tr_service *svc, const struct tr_link_events *ev,
                         const struct tr_link_server_opts *opts, tr_link_server **out) {
  struct sockaddr_storage addr;
  if (opts->listen == NULL || parse_listen(opts->listen, &addr) < 0) {
    TR_ERROR("link", "cannot listen on '%s': give ADDR:PORT, e.g. 0.0.0.0:%d or [::]:%d",
             opts->listen ? opts->listen : "", TR_LINK_DEFAULT_PORT, TR_LINK_DEFAULT_PORT);
    return TR_ERR_CONFIG;
  }
  tr_link_server *ls = calloc(1, sizeof *ls);
  if (ls == NULL)
    return TR_ERR_NOMEM;
  int rc = tr_hosts_new(svc, ev, &ls->hosts);
  if (rc < 0)
    goto fail_free;
  /* One decompression context for every peer: batches are taken apart on this loop, one at a
   * time (a context per connection was 96 KiB each). The limit is every peer's reader's. */
  rc = tr_relay_codec_init(&ls->codec, TR_RELAY_ZSTD_LEVEL_DEFAULT, TR_RELAY_MAX_FRAME_DEFAULT);
  if (rc < 0)
    goto fail_hosts;
  ls->loop = loop;
  ls->svc = svc;
  ls->ev = ev;
  tr_clock_probe_sched_init(&ls->probes, &probe_ops);
  ls->features = opts->features ? opts->features : TR_RELAY_FEATURES_ALL;
  ls->max_agents = opts->max_agents ? opts->max_agents : TR_LINK_DEFAULT_MAX_AGENTS;
  ls->hb_interval_ns = opts->heartbeat_interval_ms * 1000000ull;
  ls->hb_timeout_ns = opts->heartbeat_timeout_ms * 1000000ull;
  ls->hello_timeout_ms =
      opts->handshake_timeout_ms ? opts->handshake_timeout_ms : TR_TLS_UV_HANDSHAKE_TIMEOUT_MS;
  if (getrandom(&ls->instance_id, sizeof ls->instance_id, 0) != sizeof ls->instance_id) {
    rc = TR_ERR_SYS(errno);
    goto fail_hosts;
  }
  static const struct tr_tls_uv_callbacks cbs = {
      .on_connect = on_connect, .on_read = on_read, .on_drain = on_drain, .on_close = on_close};
  struct tr_tls_uv_options tls_opts = {.max_queued = TR_LINK_MAX_QUEUED,
                                       .handshake_timeout_ms = ls->hello_timeout_ms};
  rc = tr_tls_uv_listen(loop, opts->tls, (struct sockaddr *)&addr, &tls_opts, &cbs, ls, &ls->tls);
  if (rc < 0) {
    TR_ERROR("link", "cannot listen on %s: %s", opts->listen, tr_strerror(rc));
    goto fail_hosts;
  }
  uv_timer_init(loop, &ls->tick);
  ls->tick.data = ls;
  uv_timer_start(&ls->tick, on_tick, TICK_MS, TICK_MS);
  TR_INFO("link", "listening for agents on %s (port %d)", opts->listen,
          tr_tls_uv_server_port(ls->tls));
  *out = ls;
  return 0;

fail_hosts:
  tr_hosts_free(ls->hosts);
  tr_relay_codec_free(&ls->codec);
fail_free:
  free(ls);
  return rc;
}

int tr_link_server_port(const tr_link_server *ls) { return tr_tls_uv_server_port(ls->tls); }

tr_hosts *tr_link_server_hosts(tr_link_server *ls) { return ls->hosts; }

void tr_link_server_reload_tls(tr_link_server *ls, tr_tls_config *cfg) {
  tr_tls_uv_server_set_config(ls->tls, cfg);
  TR_INFO("link", "TLS configuration reloaded: new agent connections use it");
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
  tr_tls_uv_server_close(ls->tls);
  for (tr_link_peer *p = ls->peers; p != NULL; p = p->next)
    peer_close(p, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "the service is shutting down");
  uv_close((uv_handle_t *)&ls->tick, on_tick_closed);
}
