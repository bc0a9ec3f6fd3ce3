/* upstream_carrier.c: a regional's carrier link to its upstream (see upstream_carrier.h): the
 * attempts and their pacing, the carrier's Hello and Welcome, and its heartbeats. What rides on
 * it is regional.c's. */
#include "service/upstream_carrier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_session.h"

#define COMP "regional"
#define RETRY_MIN_MS 250
#define RETRY_MAX_MS 10000
/* What the agents' links write upstream may wait this long for more (relay_link.h): a root
 * woke about 270 times a second for 1,000 hosts' flushes through one regional, 130 with 5 ms,
 * 100 with 15 (bench/README.md). Nothing on it is timed by its arrival: the regional's
 * own clock is probed on its own link, and relayed clock exchanges carry their times. */
#define LINGER_MS 15
/* Offered in our carrier Hello: multiplexing, and the agents' features whose frames we pass on
 * (TR_RELAY_FEATURES_CARRIED): an upstream grants our hosts only those it accepted here. */
#define CARRIER_FEATURES (TR_RELAY_FEATURE_MULTIPLEX | TR_RELAY_FEATURES_CARRIED)

enum state { IDLE, RESOLVING, CONNECTING, WELCOMED };

struct tr_upstream_carrier {
  uv_loop_t *loop;
  struct tr_upstream_carrier_opts opts;
  char host[256], port[8], server_name[256];
  const struct tr_upstream_carrier_events *ev;
  void *data;
  enum state state;
  tr_relay_link *link; /* from the connect to its on_closed */
  uv_getaddrinfo_t resolve;
  bool wanted, stopping;
  unsigned failures;      /* attempts failed in a row */
  uint64_t retry_at_ms;   /* no attempt before */
  uint64_t connects, lost;
  struct tr_relay_carrier_stats ended; /* the sums of the carriers that ended */
  Tracerelay__Goodbye__Reason refusal; /* the upstream's Goodbye on the carrier, if one came */
  char refusal_text[256];
};

static void maybe_free(tr_upstream_carrier *c) {
  if (!c->stopping || c->state == RESOLVING || c->link != NULL)
    return;
  void *data = c->data;
  const struct tr_upstream_carrier_events *ev = c->ev;
  tr_tls_config_unref(c->opts.tls);
  free(c);
  ev->stopped(data);
}

static uint32_t random_below(uint32_t n) {
  uint32_t rnd = 0;
  getrandom(&rnd, sizeof rnd, 0);
  return n ? rnd % n : 0;
}

/* The attempt failed or the carrier ended (reason, why): the next one waits its time. */
static void went_down(tr_upstream_carrier *c, int reason, const char *why) {
  bool was_up = c->state == WELCOMED;
  c->state = IDLE;
  if (was_up) {
    c->lost++;
    c->failures = 0; /* the first attempt after a lost carrier goes soon */
  }
  uint64_t delay = RETRY_MIN_MS;
  for (unsigned i = 0; i < c->failures && delay < RETRY_MAX_MS; i++)
    delay *= 2;
  if (delay > RETRY_MAX_MS)
    delay = RETRY_MAX_MS;
  delay = reason == TR_ERR_BUSY
              ? TR_RELAY_BUSY_RETRY_MIN_MS +
                    random_below(TR_RELAY_BUSY_RETRY_MAX_MS - TR_RELAY_BUSY_RETRY_MIN_MS + 1)
              : delay / 2 + random_below((uint32_t)delay + 1);
  c->failures++;
  c->retry_at_ms = uv_now(c->loop) + delay;
  if (was_up && !c->stopping)
    c->ev->sessions(c->data, false, false, 0);
  Tracerelay__Goodbye__Reason refusal = c->refusal;
  c->refusal = TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED;
  if (!c->stopping)
    c->ev->down(c->data, reason, refusal, refusal ? c->refusal_text : why);
}

/* ---- the carrier link's events ---- */

static void carrier_open(tr_relay_link *l) {
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_features = h.has_max_frame_bytes = h.has_agent_instance_id = 1;
  h.features = CARRIER_FEATURES;
  getrandom(&h.agent_instance_id, sizeof h.agent_instance_id, 0);
  h.max_frame_bytes = (uint32_t)tr_relay_link_max_in(l);
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  f.hello = &h;
  tr_relay_link_send(l, &f);
}

static void carrier_welcome(tr_upstream_carrier *c, const Tracerelay__Welcome *w) {
  uint32_t max = tr_relay_max_frame_said(w->has_max_frame_bytes, w->max_frame_bytes);
  if (!(w->features & TR_RELAY_FEATURE_MULTIPLEX)) {
    tr_relay_link_close(c->link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "the upstream %s:%s does not multiplex (a tracerelay service older than "
                        "this regional): upgrade it first", c->host, c->port);
    return;
  }
  if (tr_relay_features_check(CARRIER_FEATURES, w->features) < 0 || max == 0) {
    tr_relay_link_protocol_error(c->link, "carrier Welcome with features %#llx, max_frame_bytes "
                                 "%u", (unsigned long long)w->features, w->max_frame_bytes);
    return;
  }
  if (tr_relay_link_carry(c->link, NULL, NULL, c->opts.max_slots) < 0) {
    tr_relay_link_close(c->link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "out of memory");
    return;
  }
  tr_relay_carrier_set_linger(c->link, LINGER_MS);
  tr_relay_link_established(c->link, max);
  c->state = WELCOMED;
  c->failures = 0;
  c->wanted = false;
  c->connects++;
  TR_INFO(COMP, "carrier to the upstream %s:%s up (%s, features %#llx): every agent's link "
          "rides on it", c->host, c->port, tr_tls_uv_ciphersuite(tr_relay_link_conn(c->link)),
          (unsigned long long)w->features);
  c->ev->up(c->data);
}

static void carrier_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  tr_upstream_carrier *c = tr_relay_link_data(l);
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_WELCOME:
    if (c->state == WELCOMED)
      tr_relay_link_protocol_error(l, "a second carrier Welcome");
    else
      carrier_welcome(c, f->welcome);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    c->refusal = f->goodbye->has_reason ? f->goodbye->reason
                                        : TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED;
    snprintf(c->refusal_text, sizeof c->refusal_text, "%s",
             f->goodbye->text != NULL ? f->goodbye->text : "");
    TR_WARN(COMP, "the upstream %s:%s ends the carrier (reason %d): %s", c->host, c->port,
            (int)c->refusal, c->refusal_text);
    tr_relay_link_hang_up(l);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    break;
  case TRACERELAY__RELAY_FRAME__MSG_UPSTREAM_SESSIONS:
    if (c->state == WELCOMED)
      c->ev->sessions(c->data, f->upstream_sessions->running,
                      f->upstream_sessions->has_regional_drift_ppm,
                      f->upstream_sessions->regional_drift_ppm);
    else
      tr_relay_link_protocol_error(l, "UpstreamSessions before the carrier's Welcome");
    break;
  default:
    tr_relay_link_protocol_error(l, "frame type %d on the carrier", (int)f->msg_case);
    break;
  }
  tr_relay_frame_free(f);
}

static void carrier_closed(tr_relay_link *l, int reason, const char *why) {
  tr_upstream_carrier *c = tr_relay_link_data(l);
  struct tr_relay_carrier_stats st;
  tr_relay_link_carrier_stats(l, &st);
  c->ended.frames_out += st.frames_out;
  c->ended.writes += st.writes;
  c->ended.dropped_frames += st.dropped_frames;
  c->link = NULL;
  if (!reason && c->refusal) { /* we hung up on its Goodbye */
    reason = TR_ERR_CLOSED;
    why = "ended by the upstream";
  }
  if (c->state == WELCOMED || !c->stopping)
    TR_WARN(COMP, "carrier to the upstream %s:%s %s: %s", c->host, c->port,
            c->state == WELCOMED ? "lost" : "not made", reason ? why : "closed by us");
  went_down(c, reason, reason ? why : "closed by us");
  maybe_free(c);
}

static const struct tr_relay_link_events carrier_events = {
    .on_open = carrier_open, .on_frame = carrier_frame, .on_closed = carrier_closed};

/* ---- attempts ---- */

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  tr_upstream_carrier *c = req->data;
  if (c->stopping) {
    c->state = IDLE;
    uv_freeaddrinfo(res);
    maybe_free(c);
    return;
  }
  char why[512];
  if (status < 0) {
    snprintf(why, sizeof why, "cannot resolve the upstream %s: %s", c->host, uv_strerror(status));
    TR_WARN(COMP, "%s", why);
    went_down(c, TR_ERR_SYS(-status), why);
    return;
  }
  c->state = CONNECTING;
  int rc = tr_relay_link_connect(c->loop, c->opts.tls, c->server_name, res->ai_addr,
                                 &c->opts.link, &carrier_events, c, &c->link);
  uv_freeaddrinfo(res);
  if (rc < 0) {
    c->link = NULL;
    snprintf(why, sizeof why, "cannot connect to the upstream %s:%s: %s", c->host, c->port,
             tr_strerror(rc));
    TR_WARN(COMP, "%s", why);
    went_down(c, rc, why);
  }
}

static void attempt(tr_upstream_carrier *c) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  c->resolve.data = c;
  int rc = uv_getaddrinfo(c->loop, &c->resolve, on_resolved, c->host, c->port, &hints);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "cannot resolve the upstream %s: %s", c->host, uv_strerror(rc));
    went_down(c, TR_ERR_SYS(-rc), why);
    return;
  }
  c->state = RESOLVING;
}

void tr_upstream_carrier_want(tr_upstream_carrier *c) {
  c->wanted = true;
  if (c->state == IDLE && !c->stopping && uv_now(c->loop) >= c->retry_at_ms)
    attempt(c);
}

tr_relay_link *tr_upstream_carrier_link(const tr_upstream_carrier *c) {
  return c->state == WELCOMED && !tr_relay_link_closing(c->link) ? c->link : NULL;
}

void tr_upstream_carrier_tick(tr_upstream_carrier *c, uint64_t now_ns, uint64_t now_ms) {
  if (c->link != NULL && tr_relay_link_check_alive(c->link, now_ns))
    tr_relay_link_keep_alive(c->link, now_ns);
  if (c->wanted && c->state == IDLE && !c->stopping && now_ms >= c->retry_at_ms)
    attempt(c);
}

int tr_upstream_carrier_new(uv_loop_t *loop, const struct tr_upstream_carrier_opts *opts,
                            const struct tr_upstream_carrier_events *ev, void *data,
                            tr_upstream_carrier **out) {
  tr_upstream_carrier *c = calloc(1, sizeof *c);
  if (c == NULL)
    return TR_ERR_NOMEM;
  c->loop = loop;
  c->opts = *opts;
  snprintf(c->host, sizeof c->host, "%s", opts->host);
  snprintf(c->port, sizeof c->port, "%s", opts->port);
  snprintf(c->server_name, sizeof c->server_name, "%s", opts->server_name);
  c->opts.tls = tr_tls_config_ref(opts->tls);
  c->ev = ev;
  c->data = data;
  *out = c;
  return 0;
}

void tr_upstream_carrier_set_tls(tr_upstream_carrier *c, tr_tls_config *cfg) {
  tr_tls_config_unref(c->opts.tls);
  c->opts.tls = tr_tls_config_ref(cfg);
}

void tr_upstream_carrier_stats(const tr_upstream_carrier *c,
                               struct tr_upstream_carrier_stats *out) {
  struct tr_relay_carrier_stats st = {0};
  if (c->link != NULL)
    tr_relay_link_carrier_stats(c->link, &st);
  *out = (struct tr_upstream_carrier_stats){
      .up = tr_upstream_carrier_link(c) != NULL,
      .connects = c->connects,
      .lost = c->lost,
      .frames_out = c->ended.frames_out + st.frames_out,
      .writes = c->ended.writes + st.writes,
      .dropped_frames = c->ended.dropped_frames + st.dropped_frames};
}

void tr_upstream_carrier_stop(tr_upstream_carrier *c) {
  if (c->stopping)
    return;
  c->stopping = true;
  if (c->state == RESOLVING)
    uv_cancel((uv_req_t *)&c->resolve);
  if (c->link != NULL)
    tr_relay_link_close(c->link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN,
                        "the regional service is shutting down");
  maybe_free(c);
}
