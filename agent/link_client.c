/* link_client.c: the agent's end of the relay link (see link_client.h for the contract).
 *
 * The client owns three timers (batching, reconnect, a 100 ms tick for heartbeats, stats and
 * the shutdown deadline), at most one name resolution and at most one connection: a relay link
 * (relay/link/relay_link.h), which carries the frames, heartbeats and the one close path; this file
 * gives the frames their meaning. A connection ends only in the link's on_closed, which
 * schedules the next attempt. Beside it: link_clock.c answers clock probes and sends clock
 * snapshots, link_stats.c builds AgentStats, link_instances.c remembers what the service set
 * up, system_info.c fills the Hello's SystemInfo. Batches
 * are built from the chunk queue whether or not a connection is up: the spill queue
 * (tr_relay_agent) holds them, and the connection writes them out as the socket drains.
 * Batches are compressed when the last Welcome accepted zstd: a batch built before any
 * Welcome goes raw, and one built under a zstd Welcome stays compressed if it is resent (our
 * services always accept zstd; a service that stopped accepting it would refuse the batch). */
#include "agent/link_client.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "agent/batch_builder.h"
#include "agent/link_clock.h"
#include "agent/link_instances.h"
#include "agent/link_ordered.h"
#include "agent/link_stats.h"
#include "agent/system_info.h"
#include "relay/base/hostport.h"
#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link.h"
#include "relay/link/relay_session.h"
#include "relay/base/tr_error.h"

#define TICK_MS 100
#define STATS_PERIOD_MS 1000

struct tr_link_client {
  uv_loop_t *loop;
  struct tr_link_client_callbacks cbs;
  tr_tls_config *tls;
  char host[256], port[8], server_name[256];
  tr_chunkq *queue;
  uint64_t offered;
  struct tr_relay_link_opts link_opts;
  char link_label[300];
  unsigned backoff_min_ms, backoff_max_ms, attempts;
  bool refused_busy; /* the connection being closed was refused for want of capacity */

  tr_relay_agent agent;
  tr_batch_builder *builder;
  bool drain_all;        /* batch everything queued, not only full batches */
  uint64_t batched_qseq; /* the last chunk queue entry taken into a batch */

  tr_relay_link *link; /* the connection, from connect to on_closed */
  bool welcomed;
  uint64_t features; /* accepted by the last Welcome */
  size_t max_out;    /* the service's max frame: the batches' bound */
  uint64_t service_instance_id;
  int64_t t2;        /* BOOTTIME when the socket read being processed returned */

  uv_getaddrinfo_t resolve;
  bool resolving;
  uv_timer_t batch_timer, retry_timer, tick;
  tr_link_clock clock; /* probe answers and host clock snapshots */
  int handles_open;

  tr_link_ordered ordered; /* replies and producer ends waiting for their batches */
  tr_link_stats stats; /* for AgentStats */
  uint64_t welcomes; /* first Welcomes of a connection: the link came up this many times */
  uint64_t upstream_losses; /* UpstreamLost received: Hello said again on the same connection */
  bool rehello; /* the Hello awaiting its Welcome followed an UpstreamLost */
  tr_link_instances instances; /* of service_instance_id, for on_stale_instance */
  uint64_t next_stats_ms;
  uint64_t logged_lost_batches;

  struct tr_system_info sysinfo; /* for every Hello */

  bool stopping, finishing;
  uint64_t stop_deadline_ms;
  void (*done)(void *data);
  void *done_data;
};

__attribute__((format(printf, 2, 3))) static void retry_later(tr_link_client *lc,
                                                              const char *fmt, ...);
static void check_shutdown(tr_link_client *lc);

/* ---- writing ---- */

/* Sends f on the link; sent_ns: NULL, or where to put the exact send time
 * (tr_relay_link_send_stamped). */
static int send_frame_stamped(tr_link_client *lc, Tracerelay__RelayFrame *f, int64_t *sent_ns) {
  if (lc->link == NULL)
    return TR_ERR_CLOSED;
  return tr_relay_link_send_stamped(lc->link, f, sent_ns);
}

static int send_frame(tr_link_client *lc, Tracerelay__RelayFrame *f) {
  return send_frame_stamped(lc, f, NULL);
}

static bool link_up(const tr_link_client *lc) {
  return lc->link != NULL && !tr_relay_link_closing(lc->link);
}

/* Writes held batches while the socket's queue is under the bound. */
static void pump(tr_link_client *lc) {
  while (lc->welcomed && link_up(lc) && tr_relay_link_queued(lc->link) < TR_LINK_WRITE_BOUND) {
    const uint8_t *frame;
    size_t len;
    uint64_t seq;
    if (tr_relay_agent_next(&lc->agent, &frame, &len, &seq) == 0)
      return;
    if (tr_relay_link_send_encoded(lc->link, frame, len) < 0)
      return;
  }
}

/* ---- batches ---- */

/* Starts the next batch on the builder's worker when there is one to build: a full batch's
 * worth, or everything queued once drain_all is set (the batch timer fired, a reply or the
 * shutdown waits for it). */
static void next_batch(tr_link_client *lc) {
  if (lc->finishing || tr_batch_builder_busy(lc->builder))
    return;
  if (tr_chunkq_peek(lc->queue) == NULL) {
    lc->drain_all = false;
    return;
  }
  if (!lc->drain_all && lc->queue->bytes < TR_LINK_BATCH_BYTES)
    return;
  size_t limit = TR_LINK_BATCH_BYTES;
  if (limit > lc->max_out - TR_RELAY_BATCH_HEADROOM)
    limit = lc->max_out - TR_RELAY_BATCH_HEADROOM;
  bool compress = (lc->features & TR_RELAY_FEATURE_ZSTD) != 0;
  tr_batch_builder_start(lc->builder, lc->agent.next_seq, compress, limit);
}

/* Batches everything the chunk queue holds, one batch after the other. */
static void drain_queue(tr_link_client *lc) {
  uv_timer_stop(&lc->batch_timer);
  lc->drain_all = true;
  next_batch(lc);
}

static void on_batch_timer(uv_timer_t *t) {
  drain_queue(t->data);
}

static void send_pending_frames(tr_link_client *lc);
static void maybe_done(tr_link_client *lc);

/* A batch came back from the builder: into the spill queue, then out. */
static void on_built(void *data, struct tr_built_batch *b) {
  tr_link_client *lc = data;
  if (lc->finishing) {
    free(b->frame);
    free(b->tally);
    maybe_done(lc);
    return;
  }
  if (b->rc < 0)
    TR_ERROR("link", "cannot build a batch of %zu queue entries (%zu bytes): %s; they are lost",
             b->entries, b->bytes, tr_strerror(b->rc));
  else /* takes frame and tally; a batch it drops at once is counted there */
    tr_relay_agent_queue(&lc->agent, b->seq, b->frame, b->len, b->tally, b->n_tally);
  lc->batched_qseq = b->last_qseq;
  /* Frames whose preceding entries are now in batches come after the last batch queued. */
  tr_link_ordered_resolve(&lc->ordered, lc->batched_qseq, lc->agent.next_seq - 1);
  next_batch(lc);
  if (!tr_batch_builder_busy(lc->builder) && tr_chunkq_peek(lc->queue) != NULL &&
      !uv_is_active((uv_handle_t *)&lc->batch_timer))
    uv_timer_start(&lc->batch_timer, on_batch_timer, TR_LINK_BATCH_MS, 0);
  pump(lc);
  send_pending_frames(lc);
  if (lc->stopping)
    check_shutdown(lc);
}

void tr_link_client_kick(tr_link_client *lc) {
  if (lc->finishing)
    return;
  next_batch(lc);
  if (!tr_batch_builder_busy(lc->builder) && !uv_is_active((uv_handle_t *)&lc->batch_timer))
    uv_timer_start(&lc->batch_timer, on_batch_timer, TR_LINK_BATCH_MS, 0);
}

void tr_link_client_send_queued(tr_link_client *lc) {
  if (!lc->finishing)
    drain_queue(lc);
}

/* ---- stats ---- */

static int send_stats_frame(void *data, Tracerelay__RelayFrame *f) { return send_frame(data, f); }

/* Sends AgentStats if it differs from the last one sent (or force). */
static void send_stats(tr_link_client *lc, bool force) {
  if (!lc->welcomed || !(lc->features & TR_RELAY_FEATURE_AGENT_STATS))
    return;
  if (lc->cbs.collect_stats != NULL)
    lc->cbs.collect_stats(lc);
  tr_link_stats_report(&lc->stats, lc->queue, &lc->agent, force, send_stats_frame, lc);
}

int tr_link_client_set_producer_counts(tr_link_client *lc, uint32_t producer_id,
                                       const struct tr_link_producer_counts *c) {
  return tr_link_stats_set_producer(&lc->stats, producer_id, c);
}

/* ---- replies and producer ends, in order after the data before them ---- */

static int send_reply(tr_link_client *lc, uint64_t request_id, const char *error,
                      uint64_t after_seq) {
  Tracerelay__CommandReply r = TRACERELAY__COMMAND_REPLY__INIT;
  r.has_request_id = r.has_after_seq = 1;
  r.request_id = request_id;
  r.error = (char *)error;
  r.after_seq = after_seq;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY;
  f.command_reply = &r;
  return send_frame(lc, &f);
}

static int send_gone(tr_link_client *lc, uint32_t producer_id, uint64_t after_seq) {
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = u.has_after_seq = 1;
  u.producer_id = producer_id;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED;
  u.after_seq = after_seq;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE;
  f.producer_update = &u;
  return send_frame(lc, &f);
}

static int send_pending(tr_link_client *lc, const struct tr_link_ordered_frame *p,
                        uint64_t after_seq) {
  return p->gone_producer_id ? send_gone(lc, p->gone_producer_id, after_seq)
                             : send_reply(lc, p->request_id, p->error, after_seq);
}

/* Sends `what` at once when everything queued before it is in a batch and nothing waits
 * ahead of it; otherwise keeps a copy until then (a batch is started for it). */
static int send_ordered(tr_link_client *lc, const struct tr_link_ordered_frame *what) {
  uint64_t wait_qseq = lc->queue->next_seq - 1;
  bool batched = lc->batched_qseq >= wait_qseq;
  if (batched && tr_link_ordered_empty(&lc->ordered) && lc->welcomed &&
      send_pending(lc, what, lc->agent.next_seq - 1) == 0) {
    pump(lc);
    return 0;
  }
  int rc = tr_link_ordered_push(&lc->ordered, what, wait_qseq, batched, lc->agent.next_seq - 1);
  if (rc == 0 && !batched)
    drain_queue(lc);
  return rc;
}

int tr_link_client_reply(tr_link_client *lc, uint64_t request_id, const char *error) {
  struct tr_link_ordered_frame reply = {.request_id = request_id, .error = (char *)error};
  return send_ordered(lc, &reply);
}

/* Sends the waiting frames in order, up to the first still waiting for its batch. */
static void send_pending_frames(tr_link_client *lc) {
  const struct tr_link_ordered_frame *p;
  while (lc->welcomed && link_up(lc) && (p = tr_link_ordered_ready(&lc->ordered)) != NULL) {
    if (send_pending(lc, p, p->after_seq) < 0)
      return;
    tr_link_ordered_pop(&lc->ordered);
  }
}

/* ---- data source instances of this service instance ---- */

size_t tr_link_client_instances(const tr_link_client *lc,
                                void (*fn)(void *data, uint32_t producer_id, uint64_t instance_id),
                                void *data) {
  return tr_link_instances_each(&lc->instances, fn, data);
}

static void stop_stale(void *data, uint32_t producer_id, uint64_t instance_id) {
  tr_link_client *lc = data;
  lc->cbs.on_stale_instance(lc, producer_id, instance_id);
}

/* A new service instance: what the old one set up is stopped, then forgotten. */
static void stop_stale_instances(tr_link_client *lc) {
  size_t n = tr_link_instances_each(&lc->instances, NULL, NULL);
  if (n)
    TR_WARN("link", "the new service instance did not set up the %zu data source instance(s) "
            "still running here: stopping them", n);
  if (lc->cbs.on_stale_instance != NULL)
    tr_link_instances_each(&lc->instances, stop_stale, lc);
  tr_link_instances_clear(&lc->instances);
}

/* ---- frames from the service ---- */

static void on_welcome(tr_link_client *lc, const Tracerelay__Welcome *w) {
  if (tr_relay_features_check(lc->offered, w->features) < 0) {
    tr_relay_link_protocol_error(lc->link, "Welcome accepts features %#llx, we offered %#llx",
                                 (unsigned long long)w->features, (unsigned long long)lc->offered);
    return;
  }
  uint32_t max = tr_relay_max_frame_said(w->has_max_frame_bytes, w->max_frame_bytes);
  if (max == 0) {
    tr_relay_link_protocol_error(lc->link, "Welcome.max_frame_bytes %u out of range",
                                 w->max_frame_bytes);
    return;
  }
  if (tr_relay_agent_resume(&lc->agent, w->stored_seq) < 0) {
    tr_relay_link_protocol_error(
        lc->link, "Welcome.stored_seq %llu does not match what we sent (acked %llu, next %llu)",
        (unsigned long long)w->stored_seq, (unsigned long long)lc->agent.acked_seq,
        (unsigned long long)lc->agent.next_seq);
    return;
  }
  if (lc->service_instance_id != w->service_instance_id) {
    if (lc->service_instance_id != 0)
      TR_WARN("link", "the service restarted (instance %016llx -> %016llx)",
              (unsigned long long)lc->service_instance_id,
              (unsigned long long)w->service_instance_id);
    stop_stale_instances(lc);
  }
  lc->service_instance_id = w->service_instance_id;
  lc->features = w->features;
  lc->max_out = max;
  tr_relay_link_established(lc->link, max);
  lc->welcomed = true;
  lc->welcomes += !lc->rehello;
  lc->rehello = false;
  lc->attempts = 0;
  TR_INFO("link", "connected to %s:%s as %s (features %#llx, service has batch %llu, %zu bytes "
          "held, %s)", lc->host, lc->port, w->machine_name ? w->machine_name : "?",
          (unsigned long long)w->features, (unsigned long long)w->stored_seq,
          lc->agent.held_bytes, tr_tls_uv_ciphersuite(tr_relay_link_conn(lc->link)));
  /* The order the protocol asks: producers, then the batch stream (replies wait on it). */
  if (lc->cbs.on_welcome != NULL)
    lc->cbs.on_welcome(lc);
  send_stats(lc, true);
  send_pending_frames(lc);
  pump(lc);
}

int tr_link_client_send_clock_snapshot(tr_link_client *lc) {
  if (!lc->welcomed || !(lc->features & TR_RELAY_FEATURE_HOST_CLOCKS))
    return TR_ERR_CLOSED;
  return tr_link_clock_send_snapshot(lc->link);
}

void tr_link_client_clock_snapshots(tr_link_client *lc, bool active, uint32_t interval_ms) {
  tr_link_client_send_clock_snapshot(lc);
  tr_link_clock_schedule(&lc->clock, active, interval_ms);
}

static void send_hello(tr_link_client *lc);

/* Our regional lost its upstream link for us (relay.proto, UpstreamLost): what a lost link
 * does (on_closed), but the connection stays and Hello goes again on it. */
static void on_upstream_lost(tr_link_client *lc, const Tracerelay__UpstreamLost *u) {
  tr_link_clock_link_down(&lc->clock);
  lc->welcomed = false;
  lc->rehello = true;
  lc->upstream_losses++;
  tr_relay_agent_disconnected(&lc->agent);
  TR_WARN("link", "%s:%s lost its link to the upstream for us: %s; %zu bytes held for "
          "resending; Hello again on this link", lc->host, lc->port,
          u->text != NULL ? u->text : "", lc->agent.held_bytes);
  send_hello(lc);
}

static void handle_frame(tr_link_client *lc, const Tracerelay__RelayFrame *f) {
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_GOODBYE) {
    const Tracerelay__Goodbye *g = f->goodbye;
    const char *text = g->text != NULL ? g->text : "";
    lc->refused_busy = g->reason == TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED;
    if (g->reason == TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST)
      TR_ERROR("link", "the service refused us: %s (is another agent running with this "
               "machine's certificate?)", text);
    else
      TR_WARN("link", "the service said goodbye (reason %d): %s", (int)g->reason, text);
    tr_relay_link_hang_up(lc->link);
    return;
  }
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT)
    return; /* also while a Hello said again waits: the regional keeps the link alive */
  if (!lc->welcomed) {
    if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_WELCOME)
      on_welcome(lc, f->welcome);
    else
      tr_relay_link_protocol_error(lc->link, "expected Welcome, got frame type %d",
                                   (int)f->msg_case);
    return;
  }
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_UPSTREAM_LOST:
    if (lc->features & TR_RELAY_FEATURE_UPSTREAM_LOST)
      on_upstream_lost(lc, f->upstream_lost);
    else
      tr_relay_link_protocol_error(lc->link, "UpstreamLost without the feature");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_BATCH_ACK:
    if (tr_relay_agent_ack(&lc->agent, f->batch_ack->seq) < 0)
      tr_relay_link_protocol_error(lc->link, "ack for batch %llu, never sent",
                                   (unsigned long long)f->batch_ack->seq);
    else if (lc->stopping)
      check_shutdown(lc);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_COMMAND:
    tr_link_instances_track(&lc->instances, f->command);
    if (lc->cbs.on_command != NULL)
      lc->cbs.on_command(lc, f->command);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE:
    if (lc->features & TR_RELAY_FEATURE_CLOCK_PROBES)
      tr_link_clock_answer(&lc->clock, lc->link, f->clock_probe, lc->t2,
                           lc->features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP);
    else
      tr_relay_link_protocol_error(lc->link, "clock probe without the feature");
    break;
  default:
    tr_relay_link_protocol_error(lc->link, "unexpected frame type %d", (int)f->msg_case);
    break;
  }
}

/* ---- the connection: the events of its relay link ---- */

static void on_frame(tr_relay_link *link, Tracerelay__RelayFrame *f) {
  handle_frame(tr_relay_link_data(link), f);
  tr_relay_frame_free(f);
}

static void on_read(tr_relay_link *link) {
  tr_link_client *lc = tr_relay_link_data(link);
  /* A probe's receive time, taken before decryption, checked for reordering since the last
   * read, which marks for the next (the service's side of the link carries little, so checking
   * every read costs little). */
  lc->t2 = tr_tls_uv_read_time_checked(tr_relay_link_conn(link), true);
}

static void on_writable(tr_relay_link *link) { pump(tr_relay_link_data(link)); }

/* Hello, on a new connection or again after UpstreamLost. */
static void send_hello(tr_link_client *lc) {
  tr_relay_link *link = lc->link;
  lc->max_out = TR_RELAY_MAX_FRAME_DEFAULT;
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_features = h.has_agent_instance_id = h.has_acked_seq = h.has_max_frame_bytes = 1;
  h.features = lc->offered;
  h.agent_instance_id = lc->agent.instance_id;
  h.system_info = &lc->sysinfo.msg;
  h.acked_seq = lc->agent.acked_seq;
  h.max_frame_bytes = (uint32_t)tr_relay_link_max_in(link);
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  f.hello = &h;
  send_frame(lc, &f);
}

static void on_open(tr_relay_link *link) { send_hello(tr_relay_link_data(link)); }

static void maybe_done(tr_link_client *lc) {
  if (!lc->finishing || lc->link != NULL || lc->resolving || lc->handles_open > 0 ||
      tr_batch_builder_busy(lc->builder))
    return;
  tr_relay_agent_free(&lc->agent);
  tr_batch_builder_free(lc->builder);
  tr_tls_config_unref(lc->tls);
  tr_link_ordered_free(&lc->ordered);
  tr_link_stats_free(&lc->stats);
  tr_link_instances_free(&lc->instances);
  void (*done)(void *) = lc->done;
  void *data = lc->done_data;
  free(lc);
  if (done != NULL)
    done(data);
}

static void on_closed(tr_relay_link *link, int reason, const char *why) {
  tr_link_client *lc = tr_relay_link_data(link);
  bool was_up = lc->welcomed;
  lc->link = NULL;
  lc->rehello = false;
  tr_link_clock_link_down(&lc->clock); /* a follow-up owed went with this connection */
  lc->welcomed = false;
  tr_relay_agent_disconnected(&lc->agent);
  if (reason == TR_ERR_BUSY)
    lc->refused_busy = true;
  if (lc->finishing) {
    TR_INFO("link", "link to %s:%s closed", lc->host, lc->port);
    maybe_done(lc);
  } else if (was_up) {
    retry_later(lc, "link to %s:%s lost: %s; %zu bytes held for resending", lc->host, lc->port,
                reason ? why : "closed by this side", lc->agent.held_bytes);
  } else {
    retry_later(lc, "cannot connect to %s:%s: %s", lc->host, lc->port,
                reason ? why : "closed by this side");
  }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  tr_link_client *lc = req->data;
  lc->resolving = false;
  if (lc->finishing) {
    uv_freeaddrinfo(res);
    maybe_done(lc);
    return;
  }
  if (status < 0) {
    retry_later(lc, "cannot resolve %s: %s", lc->host, uv_strerror(status));
    return;
  }
  static const struct tr_relay_link_events events = {
      .on_open = on_open, .on_read = on_read, .on_frame = on_frame, .on_read_done = on_writable,
      .on_drain = on_writable, .on_closed = on_closed};
  int rc = tr_relay_link_connect(lc->loop, lc->tls, lc->server_name, res->ai_addr, &lc->link_opts,
                                 &events, lc, &lc->link);
  uv_freeaddrinfo(res);
  if (rc < 0) {
    lc->link = NULL;
    retry_later(lc, "cannot connect to %s:%s: %s", lc->host, lc->port, tr_strerror(rc));
  }
}

static void connect_now(tr_link_client *lc) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  lc->resolve.data = lc;
  int rc = uv_getaddrinfo(lc->loop, &lc->resolve, on_resolved, lc->host, lc->port, &hints);
  if (rc < 0) {
    retry_later(lc, "cannot resolve %s: %s", lc->host, uv_strerror(rc));
    return;
  }
  lc->resolving = true;
}

static void on_retry(uv_timer_t *t) { connect_now(t->data); }

/* Logs why the link is not up and connects again after the backoff, saying when. */
static void retry_later(tr_link_client *lc, const char *fmt, ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  uint64_t delay = lc->backoff_min_ms;
  for (unsigned i = 0; i < lc->attempts && delay < lc->backoff_max_ms; i++)
    delay *= 2;
  if (delay > lc->backoff_max_ms)
    delay = lc->backoff_max_ms;
  uint32_t r = 0;
  getrandom(&r, sizeof r, 0);
  delay = delay * (80 + r % 41) / 100; /* +-20% so that agents do not reconnect in step */
  if (lc->refused_busy) /* come back later, spread over the whole window (link_client.h) */
    delay = TR_RELAY_BUSY_RETRY_MIN_MS +
            r % (TR_RELAY_BUSY_RETRY_MAX_MS - TR_RELAY_BUSY_RETRY_MIN_MS + 1);
  lc->refused_busy = false;
  lc->attempts++;
  uv_timer_start(&lc->retry_timer, on_retry, delay, 0);
  TR_WARN("link", "%s; trying again in %.1f s", why, (double)delay / 1000.0);
}

/* ---- the tick: heartbeats, stats, shutdown deadline ---- */

static void on_tick(uv_timer_t *t) {
  tr_link_client *lc = t->data;
  uint64_t now_ns = uv_hrtime(), now_ms = uv_now(lc->loop);
  if (lc->link != NULL && tr_relay_link_check_alive(lc->link, now_ns))
    tr_relay_link_keep_alive(lc->link, now_ns);
  if (tr_link_clock_snapshot_due(&lc->clock, now_ms))
    tr_link_client_send_clock_snapshot(lc);
  if (now_ms >= lc->next_stats_ms) {
    lc->next_stats_ms = now_ms + STATS_PERIOD_MS;
    send_stats(lc, false);
    if (lc->agent.lost_batches != lc->logged_lost_batches) {
      lc->logged_lost_batches = lc->agent.lost_batches;
      TR_WARN("link", "spill queue full (%zu bytes): %llu batches (%llu bytes) dropped so far; "
              "raise --spill-mb or check the link", lc->agent.spill_bytes,
              (unsigned long long)lc->agent.lost_batches,
              (unsigned long long)lc->agent.lost_frame_bytes);
    }
  }
  if (lc->stopping)
    check_shutdown(lc);
}

/* ---- lifecycle ---- */

static void on_handle_closed(uv_handle_t *h) {
  tr_link_client *lc = h->data;
  lc->handles_open--;
  maybe_done(lc);
}

static void on_clock_closed(void *data) {
  tr_link_client *lc = data;
  lc->handles_open--;
  maybe_done(lc);
}

static void finish(tr_link_client *lc) {
  lc->finishing = true;
  if (lc->agent.head != NULL)
    TR_WARN("link", "shutting down with %zu bytes of batches not acknowledged by the service: "
            "they are lost", lc->agent.held_bytes);
  if (lc->resolving)
    uv_cancel((uv_req_t *)&lc->resolve);
  if (lc->link != NULL)
    tr_relay_link_close(lc->link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN,
                        "the agent is shutting down");
  uv_close((uv_handle_t *)&lc->batch_timer, on_handle_closed);
  uv_close((uv_handle_t *)&lc->retry_timer, on_handle_closed);
  uv_close((uv_handle_t *)&lc->tick, on_handle_closed);
  tr_link_clock_close(&lc->clock, on_clock_closed, lc);
}

static void check_shutdown(tr_link_client *lc) {
  if (lc->finishing)
    return;
  bool all_acked = lc->agent.head == NULL && tr_chunkq_peek(lc->queue) == NULL &&
                   !tr_batch_builder_busy(lc->builder);
  if (all_acked || uv_now(lc->loop) >= lc->stop_deadline_ms)
    finish(lc);
}

void tr_link_client_shutdown(tr_link_client *lc, unsigned timeout_ms, void (*done)(void *data),
                             void *data) {
  if (lc->stopping)
    return;
  lc->stopping = true;
  lc->done = done;
  lc->done_data = data;
  lc->stop_deadline_ms = uv_now(lc->loop) + timeout_ms;
  drain_queue(lc);
  pump(lc);
  check_shutdown(lc);
}

/* --service, checked by the agent's flag parser already (relay/base/hostport.h). */
static int parse_service(tr_link_client *lc, const char *s) {
  struct tr_hostport hp;
  int rc = tr_hostport_parse(s, false, &hp);
  if (rc < 0 || strlen(hp.host) >= sizeof lc->host)
    return TR_ERR_CONFIG;
  snprintf(lc->host, sizeof lc->host, "%s", hp.host);
  snprintf(lc->port, sizeof lc->port, "%u", hp.port);
  return 0;
}

int tr_link_client_start(uv_loop_t *loop, const struct tr_link_client_opts *opts,
                         const struct tr_link_client_callbacks *cbs, tr_link_client **out) {
  tr_link_client *lc = calloc(1, sizeof *lc);
  if (lc == NULL)
    return TR_ERR_NOMEM;
  int rc = TR_ERR_CONFIG;
  if (opts->service == NULL || parse_service(lc, opts->service) < 0) {
    TR_ERROR("link", "bad --service '%s': give HOST:PORT, e.g. relay.example:7393",
             opts->service ? opts->service : "");
    goto fail_free;
  }
  snprintf(lc->server_name, sizeof lc->server_name, "%s",
           opts->service_name ? opts->service_name : lc->host);
  uint64_t instance_id = 0;
  while (instance_id == 0) {
    if (getrandom(&instance_id, sizeof instance_id, 0) != sizeof instance_id) {
      rc = TR_ERR_SYS(errno);
      goto fail_free;
    }
  }
  rc = tr_relay_agent_init(&lc->agent, instance_id, opts->spill_bytes);
  if (rc < 0)
    goto fail_free;
  rc = tr_batch_builder_new(loop, opts->queue, on_built, lc, &lc->builder);
  if (rc < 0)
    goto fail_agent;
  lc->loop = loop;
  lc->cbs = *cbs;
  lc->tls = tr_tls_config_ref(opts->tls);
  lc->queue = opts->queue;
  lc->offered = opts->features ? opts->features : TR_RELAY_FEATURES_ALL;
  if (!opts->compress)
    lc->offered &= ~TR_RELAY_FEATURE_ZSTD;
  snprintf(lc->link_label, sizeof lc->link_label, "the link to %s:%s", lc->host, lc->port);
  lc->link_opts = (struct tr_relay_link_opts){
      .tls = {.max_queued = 2 * TR_LINK_WRITE_BOUND},
      .heartbeat_interval_ms = opts->heartbeat_interval_ms,
      .heartbeat_timeout_ms = opts->heartbeat_timeout_ms,
      .peer_role = "service",
      .label = lc->link_label};
  lc->backoff_min_ms = opts->backoff_min_ms ? opts->backoff_min_ms : TR_LINK_BACKOFF_MIN_MS;
  lc->backoff_max_ms = opts->backoff_max_ms ? opts->backoff_max_ms : TR_LINK_BACKOFF_MAX_MS;
  lc->max_out = TR_RELAY_MAX_FRAME_DEFAULT;
  tr_system_info_read(&lc->sysinfo);
  uv_timer_init(loop, &lc->batch_timer);
  uv_timer_init(loop, &lc->retry_timer);
  uv_timer_init(loop, &lc->tick);
  tr_link_clock_init(&lc->clock, loop, opts->clock_snapshot_interval_ms);
  lc->batch_timer.data = lc->retry_timer.data = lc->tick.data = lc;
  lc->handles_open = 4;
  uv_timer_start(&lc->tick, on_tick, TICK_MS, TICK_MS);
  TR_INFO("link", "agent instance %016llx: connecting to %s:%s (certificate name %s)",
          (unsigned long long)instance_id, lc->host, lc->port, lc->server_name);
  connect_now(lc);
  *out = lc;
  return 0;

fail_agent:
  tr_relay_agent_free(&lc->agent);
fail_free:
  free(lc);
  return rc;
}

int tr_link_client_send_producer_update(tr_link_client *lc, const Tracerelay__ProducerUpdate *u) {
  if (u->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED)
    tr_link_instances_forget_producer(&lc->instances, u->producer_id);
  if (!lc->welcomed)
    return TR_ERR_CLOSED; /* the next Welcome's re-announcement leaves it out */
  /* A guest's producer announced to a service that knows no guests would pass for the host's. */
  if (u->guest_id != 0 && !(lc->features & TR_RELAY_FEATURE_GUESTS))
    return TR_ERR_UNSUPPORTED;
  if (u->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED) {
    struct tr_link_ordered_frame gone = {.gone_producer_id = u->producer_id};
    return send_ordered(lc, &gone);
  }
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE;
  f.producer_update = (Tracerelay__ProducerUpdate *)u;
  return send_frame(lc, &f);
}

/* A guest machine's frame, once the service took FEATURE_GUEST_MACHINES. */
static int send_guest_frame(tr_link_client *lc, Tracerelay__RelayFrame *f) {
  if (!lc->welcomed)
    return TR_ERR_CLOSED;
  if (!(lc->features & TR_RELAY_FEATURE_GUESTS))
    return TR_ERR_UNSUPPORTED;
  return send_frame(lc, f);
}

int tr_link_client_send_guest(tr_link_client *lc, const Tracerelay__GuestMachine *g) {
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GUEST_MACHINE;
  f.guest_machine = (Tracerelay__GuestMachine *)g;
  return send_guest_frame(lc, &f);
}

int tr_link_client_send_guest_clock(tr_link_client *lc, const Tracerelay__GuestClockExchange *x) {
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GUEST_CLOCK_EXCHANGE;
  f.guest_clock_exchange = (Tracerelay__GuestClockExchange *)x;
  return send_guest_frame(lc, &f);
}

int tr_link_client_send_trigger(tr_link_client *lc, const Tracerelay__Trigger *t) {
  if (!lc->welcomed)
    return TR_ERR_CLOSED;
  if (!(lc->features & TR_RELAY_FEATURE_TRIGGERS))
    return TR_ERR_UNSUPPORTED;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_TRIGGER;
  f.trigger = (Tracerelay__Trigger *)t;
  return send_frame(lc, &f);
}

void tr_link_client_reload_tls(tr_link_client *lc, tr_tls_config *cfg) {
  tr_tls_config *old = lc->tls;
  lc->tls = tr_tls_config_ref(cfg);
  tr_tls_config_unref(old);
}

bool tr_link_client_connected(const tr_link_client *lc) { return lc->welcomed; }

void tr_link_client_totals(const tr_link_client *lc, struct tr_link_client_totals *t) {
  struct tr_link_producer_counts sum = tr_link_stats_sum(&lc->stats);
  *t = (struct tr_link_client_totals){.welcomes = lc->welcomes,
                                      .upstream_losses = lc->upstream_losses,
                                      .abi_violations = sum.abi_violations,
                                      .smb_full = sum.smb_full,
                                      .smb_full_ns = sum.smb_full_ns};
  for (size_t i = 0; i < lc->agent.n_lost; i++)
    t->spill_dropped_chunks += lc->agent.lost[i].chunks;
}

const tr_relay_agent *tr_link_client_spill(const tr_link_client *lc) { return &lc->agent; }

void *tr_link_client_data(const tr_link_client *lc) { return lc->cbs.data; }
