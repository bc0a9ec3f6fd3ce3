/* regional.c: a regional service's forwarding of its agents' links upstream (see regional.h).
 *
 * One pump per agent connection: the agent's link ("down", accepted here) and its link to the
 * upstream ("up"), a slot of the one carrier link to the upstream (upstream_carrier.h). The
 * pump is freed once both links are closed. One timer drives every pump's clock probes (each
 * tick) and heartbeats (every HEARTBEAT_TICKS ticks), and the carrier's. */
#include "service/regional.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "relay/clock/clock.h"
#include "relay/clock/clock_probe.h"
#include "relay/clock/clocksync.h"
#include "relay/base/hostport.h"
#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link.h"
#include "relay/link/relay_session.h"
#include "relay/base/tr_error.h"
#include "service/link_server.h"
#include "service/upstream_carrier.h"

#define COMP "regional"
#define TICK_MS TR_CLOCK_PROBE_SESSION_MIN_MS
#define HEARTBEAT_TICKS 10
/* An upstream's estimate beyond this is not one (its estimator clamps at 1000 ppm). */
#define TR_REGIONAL_MAX_UPSTREAM_DRIFT_PPM 1000.0
#define PROBE_FEATURES (TR_RELAY_FEATURE_CLOCK_PROBES | TR_RELAY_FEATURE_CLOCK_FOLLOW_UP)
/* Features between an agent and us, never offered upstream. */
#define OWN_FEATURES (PROBE_FEATURES | TR_RELAY_FEATURE_UPSTREAM_LOST)
/* Upstream connects again for an agent whose link we keep: 250 ms doubling to 10 s, each
 * between half and one and a half times that, at random. */
#define RELINK_MIN_MS 250
#define RELINK_MAX_MS 10000

typedef struct pump pump;

struct pump {
  tr_regional *r;
  pump *prev, *next;
  tr_relay_link *down, *up; /* NULL once closed */
  char host[TR_TLS_MAX_NAME + 1];
  Tracerelay__RelayFrame *hello; /* the agent's, until the upstream welcomed it */
  uint64_t agent_features;       /* offered by the agent */
  uint64_t sent_features;        /* offered upstream */
  uint32_t agent_max_frame;
  bool awaiting_carrier; /* its Hello waits for the carrier to the upstream */
  bool counted;  /* said Hello: one of r->agents */
  bool welcomed; /* the upstream's Welcome went to the agent: frames flow */
  /* The agent's link outlives its upstream link (FEATURE_UPSTREAM_LOST, after a first
   * Welcome): relinking from the loss until the next Welcome; awaiting_hello from our
   * UpstreamLost until the agent's Hello; then connects are retried at relink_at_ms. */
  bool keeps_link, relinking, awaiting_hello, refused;
  unsigned relink_attempts;
  uint64_t relink_at_ms;
  uint64_t opened_ms;
  int64_t t4; /* BOOTTIME of the agent's read being processed */
  struct tr_clock_probe_peer probe;
  struct tr_clocksync *clock; /* our estimate of the host, for the probes' pace */
};

struct tr_regional {
  uv_loop_t *loop;
  tr_relay_link_listener *listener;
  tr_upstream_carrier *carrier; /* NULL once stopped */
  char upstream_host[256], upstream_port[8];
  char upstream_text[sizeof "[]:" + 256 + 8]; /* --upstream as given: HOST:PORT */
  struct tr_relay_link_opts down_opts;
  unsigned hello_timeout_ms, max_agents, agents;
  /* Of links closed: bytes received (tr_regional_stats adds the open ones') and upstream
   * links lost under their agent. */
  uint64_t closed_bytes_from_agents, closed_bytes_from_upstream, upstream_lost;
  /* Agents whose link we keep while their upstream link is made again, and since when the
   * first of them waits (logged once per outage); frames they sent for the lost link. */
  unsigned relinking;
  uint64_t relinking_since_ms, relink_dropped_frames;
  /* A session runs at the upstream (it says so on the carrier): the agents' clocks are probed
   * at the session rate only then. */
  bool upstream_session;
  /* The upstream's estimate of our clock's drift against its own, once it said one: a host's
   * drift against the upstream is its drift against us plus this. */
  bool upstream_drift_known;
  double upstream_drift_ppm;
  pump *pumps;
  struct tr_clock_probe_sched probes;
  uv_timer_t tick;
  unsigned ticks;
  bool stopping, tick_closed;
};

static void maybe_free_regional(tr_regional *r) {
  if (!r->stopping || !r->tick_closed || r->pumps != NULL || r->carrier != NULL)
    return;
  free(r);
}

/* p's agent is no longer waiting for its upstream link (welcomed again, or gone); says once
 * when the last of an outage's agents is. */
static void relink_done(pump *p) {
  tr_regional *r = p->r;
  if (!p->relinking)
    return;
  p->relinking = false;
  if (--r->relinking == 0)
    TR_INFO(COMP, "every agent kept through the upstream's loss is forwarded again or gone, "
            "%.1f s after the first loss", (double)(uv_now(r->loop) - r->relinking_since_ms) / 1e3);
}

static void maybe_free_pump(pump *p) {
  if (p->down != NULL || p->up != NULL)
    return;
  tr_regional *r = p->r;
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    r->pumps = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  if (p->counted)
    r->agents--;
  relink_done(p);
  tr_relay_frame_free(p->hello);
  tr_clocksync_free(p->clock);
  free(p);
  maybe_free_regional(r);
}

/* ---- clock probes of the agents: the transport's side of relay/clock/clock_probe.h ---- */

static int probe_send(void *data, uint64_t probe_id, int64_t *t1) {
  pump *p = data;
  return tr_relay_link_send_clock_probe(p->down, probe_id, t1);
}

static int64_t probe_sent_time(void *data, int64_t t1) {
  pump *p = data;
  return tr_tls_uv_sent_time(tr_relay_link_conn(p->down), t1);
}

/* The session's pace follows the host's drift against the upstream, whose timeline the host
 * is placed on: ours against the host's alone would probe two clocks that drift alike (the
 * host's and ours) needlessly often, and two in step too rarely while we drift. */
static double probe_drift_ppm(void *data) {
  pump *p = data;
  return tr_clocksync_drift_ppm(p->clock) + p->r->upstream_drift_ppm;
}

/* Our own estimate paces the probes; the exchange itself goes upstream, where it counts, if
 * it is a valid one (the upstream's widening could make an invalid one pass there). */
static void probe_done(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex) {
  pump *p = data;
  int rc = tr_clocksync_add_probe(p->clock, ex);
  TR_DEBUG(COMP, "host %s: clock probe %llu t1 %lld t2 %lld t3 %lld%s t4 %lld: %s", p->host,
           (unsigned long long)probe_id, (long long)ex->t1, (long long)ex->t2,
           (long long)ex->t3, ex->t3_late ? " (late)" : "", (long long)ex->t4,
           rc < 0 ? tr_strerror(rc) : "used");
  if (rc < 0 || p->up == NULL || !p->welcomed || tr_relay_link_closing(p->up))
    return;
  Tracerelay__RelayedClockExchange x = TRACERELAY__RELAYED_CLOCK_EXCHANGE__INIT;
  x.has_t1 = x.has_t2 = x.has_t3 = x.has_t4 = x.has_t3_late = 1;
  x.t1 = (uint64_t)ex->t1;
  x.t2 = (uint64_t)ex->t2;
  x.t3 = (uint64_t)ex->t3;
  x.t4 = (uint64_t)ex->t4;
  x.t3_late = ex->t3_late;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_RELAYED_CLOCK_EXCHANGE;
  f.relayed_clock_exchange = &x;
  tr_relay_link_send(p->up, &f);
}

static const struct tr_clock_probe_ops probe_ops = {
    .send = probe_send, .sent_time = probe_sent_time, .drift_ppm = probe_drift_ppm,
    .done = probe_done};

/* ---- the upstream link of one agent ---- */

/* The agent waits for its first Welcome, which it sends nothing before (its side of the link is
 * not established), while we send it heartbeats (down_hello): its silence is expected. */
static bool waits_quietly(const pump *p) {
  return p->counted && !p->welcomed && !p->keeps_link &&
         (p->agent_features & TR_RELAY_FEATURE_UPSTREAM_LOST);
}

/* p's agent's link outlives its upstream link (regional.h): it took UpstreamLost in its Welcome,
 * or waits for its first Welcome while we send it heartbeats, and was not refused. */
static bool outlives_upstream(const pump *p) {
  return p->down != NULL && !tr_relay_link_closing(p->down) && !p->refused && !p->r->stopping &&
         (p->keeps_link || waits_quietly(p));
}

static uint32_t min_frame(uint32_t a, size_t b) { return (size_t)a < b ? a : (uint32_t)b; }

/* The agent's Hello, as the regional's: naming the host, its probes done here. */
static void up_open(tr_relay_link *up) {
  pump *p = tr_relay_link_data(up);
  Tracerelay__Hello *h = p->hello->hello;
  h->relayed_host = p->host;
  p->sent_features = p->agent_features & ~OWN_FEATURES;
  if (p->agent_features & TR_RELAY_FEATURE_CLOCK_PROBES)
    p->sent_features |= TR_RELAY_FEATURE_RELAYED_CLOCKS;
  h->features = p->sent_features;
  h->has_max_frame_bytes = 1;
  h->max_frame_bytes = min_frame(p->agent_max_frame, tr_relay_link_max_in(up));
  tr_relay_link_send(up, p->hello);
  h->relayed_host = NULL; /* not ours to free */
}

/* The upstream's Welcome, as ours: the agent's probes are answered to us. */
static void up_welcome(pump *p, Tracerelay__RelayFrame *f) {
  Tracerelay__Welcome *w = f->welcome;
  uint32_t max = tr_relay_max_frame_said(w->has_max_frame_bytes, w->max_frame_bytes);
  if (tr_relay_features_check(p->sent_features, w->features) < 0 || max == 0) {
    tr_relay_link_protocol_error(p->up, "Welcome accepts features %#llx (offered %#llx), "
                                 "max_frame_bytes %u", (unsigned long long)w->features,
                                 (unsigned long long)p->sent_features, w->max_frame_bytes);
    return;
  }
  tr_relay_link_established(p->up, max);
  uint64_t features = (w->features & ~TR_RELAY_FEATURE_RELAYED_CLOCKS) |
                      (p->agent_features & OWN_FEATURES);
  w->features = features;
  w->has_max_frame_bytes = 1;
  w->max_frame_bytes = min_frame(max, tr_relay_link_max_in(p->down));
  if (tr_relay_link_send(p->down, f) < 0)
    return;
  tr_relay_link_established(p->down, p->agent_max_frame);
  p->welcomed = true;
  p->keeps_link = (features & TR_RELAY_FEATURE_UPSTREAM_LOST) != 0;
  p->relink_attempts = 0;
  tr_relay_frame_free(p->hello);
  p->hello = NULL;
  relink_done(p);
  if ((features & TR_RELAY_FEATURE_CLOCK_PROBES) && p->clock != NULL)
    tr_clock_probe_add(&p->r->probes, &p->probe, p, features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP,
                       uv_now(p->r->loop));
  TR_INFO(COMP, "host %s (%s) forwarded upstream (features %#llx, upstream has batch %llu)",
          p->host, tr_tls_uv_peer_address(tr_relay_link_conn(p->down)),
          (unsigned long long)features, (unsigned long long)w->stored_seq);
}

/* The upstream's words to the agent, passed on with its reason (e.g. NOT_AUTHORIZED). */
static void up_goodbye(pump *p, const Tracerelay__Goodbye *g) {
  const char *text = g->text != NULL ? g->text : "";
  /* Passing: the upstream shuts down, or has yet to notice the link we lost (a duplicate). */
  if (outlives_upstream(p) && (g->reason == TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN ||
                               (p->relinking &&
                                g->reason == TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST))) {
    TR_DEBUG(COMP, "host %s: the upstream ends its link (reason %d): %s", p->host,
             (int)g->reason, text);
    tr_relay_link_hang_up(p->up); /* up_closed keeps the agent's link */
    return;
  }
  p->refused = true;
  TR_WARN(COMP, "host %s: the upstream ends its link (reason %d): %s", p->host, (int)g->reason,
          text);
  tr_relay_link_close(p->down, g->has_reason ? g->reason : TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                      "the upstream service: %s", text);
  tr_relay_link_hang_up(p->up);
}

static void up_frame(tr_relay_link *up, Tracerelay__RelayFrame *f) {
  pump *p = tr_relay_link_data(up);
  if (p->down == NULL || tr_relay_link_closing(p->down)) {
    tr_relay_frame_free(f);
    return;
  }
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    up_goodbye(p, f->goodbye);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_WELCOME:
    if (p->welcomed)
      tr_relay_link_protocol_error(up, "a second Welcome");
    else
      up_welcome(p, f);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE:
    tr_relay_link_protocol_error(up, "clock probe on a relayed link");
    break;
  default:
    if (!p->welcomed)
      tr_relay_link_protocol_error(up, "expected Welcome, got frame type %d", (int)f->msg_case);
    else if (tr_relay_link_send(p->down, f) == TR_ERR_TOO_BIG)
      tr_relay_link_protocol_error(up, "a frame larger than the agent of %s accepts", p->host);
    break;
  }
  tr_relay_frame_free(f);
}

/* The upstream's queue fell to half its bound again: the agent's frames may follow. */
static void up_drain(tr_relay_link *up) {
  pump *p = tr_relay_link_data(up);
  if (p->down != NULL)
    tr_relay_link_release_input(p->down);
}

/* When to connect upstream again for p's agent: RELINK_MIN_MS doubling to RELINK_MAX_MS,
 * spread at random; after a busy upstream's refusal 5-20 s (as an agent waits, link_client.h). */
static void schedule_relink(pump *p, bool busy) {
  uint64_t delay = RELINK_MIN_MS;
  for (unsigned i = 0; i < p->relink_attempts && delay < RELINK_MAX_MS; i++)
    delay *= 2;
  if (delay > RELINK_MAX_MS)
    delay = RELINK_MAX_MS;
  uint32_t rnd = 0;
  getrandom(&rnd, sizeof rnd, 0);
  delay = busy ? TR_RELAY_BUSY_RETRY_MIN_MS +
                     rnd % (TR_RELAY_BUSY_RETRY_MAX_MS - TR_RELAY_BUSY_RETRY_MIN_MS + 1)
               : delay / 2 + rnd % (delay + 1);
  p->relink_attempts++;
  p->relink_at_ms = uv_now(p->r->loop) + delay;
}

/* p's agent waits for an upstream link made again (why the last one is not there); the first
 * of an outage is logged, and the end (relink_done). */
static void mark_relinking(pump *p, const char *why) {
  tr_regional *r = p->r;
  if (p->relinking)
    return;
  p->relinking = true;
  if (r->relinking++ == 0) {
    r->relinking_since_ms = uv_now(r->loop);
    TR_WARN(COMP, "no link to the upstream %s:%s for host %s (%s): keeping the agents' links "
            "while each is made again (logged once, and when all are forwarded)",
            r->upstream_host, r->upstream_port, p->host, why);
  }
}

/* The upstream link of an agent whose link we keep ended (why): the agent hears UpstreamLost
 * and says Hello again, which goes upstream on a new link; while the upstream is not back,
 * connects are tried again (schedule_relink, from the tick). Logged once per outage. */
static void relink(pump *p, int reason, const char *why) {
  tr_regional *r = p->r;
  mark_relinking(p, why);
  if (!p->welcomed) { /* the Hello said again waits: the upstream is not back yet */
    schedule_relink(p, reason == TR_ERR_BUSY);
    return;
  }
  p->welcomed = false;
  tr_clock_probe_remove(&r->probes, &p->probe); /* none until its next Welcome */
  Tracerelay__UpstreamLost u = TRACERELAY__UPSTREAM_LOST__INIT;
  u.text = (char *)why;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_UPSTREAM_LOST;
  f.upstream_lost = &u;
  p->awaiting_hello = true;
  if (tr_relay_link_send(p->down, &f) == 0)
    tr_relay_link_release_input(p->down); /* what it sent meanwhile is dropped, its Hello taken */
}

static void up_closed(tr_relay_link *up, int reason, const char *why) {
  pump *p = tr_relay_link_data(up);
  p->up = NULL;
  p->r->closed_bytes_from_upstream += tr_relay_link_bytes_in(up);
  if (p->down != NULL && !tr_relay_link_closing(p->down))
    p->r->upstream_lost++;
  if (outlives_upstream(p)) {
    relink(p, reason, reason ? why : "closed by us");
    return;
  }
  if (p->down != NULL) /* the agent comes back later (and spread out) if the upstream is busy */
    tr_relay_link_close(p->down,
                        reason == TR_ERR_BUSY ? TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED
                                              : TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "its link to the upstream %s:%s closed: %s", p->r->upstream_host,
                        p->r->upstream_port, reason ? why : "closed by us");
  maybe_free_pump(p);
}

static const struct tr_relay_link_events up_events = {
    .on_open = up_open, .on_frame = up_frame, .on_drain = up_drain, .on_closed = up_closed};

/* No upstream link could be started for p's agent: one whose link we keep waits and we try
 * again; a new one is told to come back later. */
__attribute__((format(printf, 2, 3))) static void upstream_failed(pump *p, const char *fmt,
                                                                  ...) {
  char why[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  if (outlives_upstream(p)) {
    mark_relinking(p, why);
    TR_DEBUG(COMP, "host %s: %s; trying again", p->host, why);
    schedule_relink(p, false);
    return;
  }
  tr_relay_link_close(p->down, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "%s", why);
}

/* Opens p's agent's link upstream, a slot of the carrier (up_open sends its Hello), or waits
 * for the carrier (carrier_up). */
static void connect_upstream(pump *p) {
  tr_regional *r = p->r;
  tr_relay_link *carrier = tr_upstream_carrier_link(r->carrier);
  if (carrier == NULL) {
    p->awaiting_carrier = true;
    tr_upstream_carrier_want(r->carrier);
    return;
  }
  p->awaiting_carrier = false;
  int rc = tr_relay_link_open_slot(carrier, &up_events, p, &p->up);
  if (rc < 0) {
    p->up = NULL;
    upstream_failed(p, "cannot open its link on the carrier to the upstream %s:%s: %s",
                    r->upstream_host, r->upstream_port, tr_strerror(rc));
  }
}

/* The carrier is up: the agents waiting for it go upstream. */
static void carrier_up(void *data) {
  tr_regional *r = data;
  for (pump *p = r->pumps; p != NULL; p = p->next)
    if (p->awaiting_carrier && p->down != NULL && !tr_relay_link_closing(p->down))
      connect_upstream(p);
}

/* No carrier (why): agents whose link we keep wait for the next; others are told to come back
 * later; the upstream's refusal (other than its shutting down) goes to every agent waiting, as
 * its Goodbye on an agent's own link would (up_goodbye). Agents that were on the carrier heard
 * up_closed already. */
static void carrier_down(void *data, int reason, Tracerelay__Goodbye__Reason refusal,
                         const char *why) {
  tr_regional *r = data;
  bool refused = refusal != TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED &&
                 refusal != TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN;
  for (pump *p = r->pumps; p != NULL; p = p->next) {
    if (!p->awaiting_carrier || p->down == NULL || tr_relay_link_closing(p->down))
      continue;
    if (refused) {
      p->awaiting_carrier = false;
      p->refused = true;
      tr_relay_link_close(p->down, refusal, "the upstream service: %s", why);
      continue;
    }
    if (outlives_upstream(p)) {
      mark_relinking(p, why);
      continue;
    }
    p->awaiting_carrier = false;
    tr_relay_link_close(p->down,
                        reason == TR_ERR_BUSY ? TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED
                                              : TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "no link to the upstream %s:%s: %s", r->upstream_host, r->upstream_port,
                        why);
  }
}

static void carrier_sessions(void *data, bool running, bool has_drift, double drift_ppm) {
  tr_regional *r = data;
  if (running != r->upstream_session)
    TR_DEBUG(COMP, "a session %s at the upstream: probing the agents' clocks at the %s rate",
             running ? "runs" : "no longer runs", running ? "session" : "idle");
  r->upstream_session = running;
  if (has_drift && isfinite(drift_ppm) && fabs(drift_ppm) < TR_REGIONAL_MAX_UPSTREAM_DRIFT_PPM) {
    r->upstream_drift_known = true;
    r->upstream_drift_ppm = drift_ppm;
  }
}

static void carrier_stopped(void *data) {
  tr_regional *r = data;
  r->carrier = NULL;
  maybe_free_regional(r);
}

static const struct tr_upstream_carrier_events carrier_events = {
    .up = carrier_up, .down = carrier_down, .sessions = carrier_sessions,
    .stopped = carrier_stopped};

/* ---- the agent's link ---- */

static void down_hello(pump *p, Tracerelay__RelayFrame *f) {
  tr_regional *r = p->r;
  const Tracerelay__Hello *h = f->hello;
  uint32_t max = tr_relay_max_frame_said(h->has_max_frame_bytes, h->max_frame_bytes);
  if (max == 0 || h->relayed_host != NULL) {
    tr_relay_link_protocol_error(p->down, "Hello with max_frame_bytes %u%s", h->max_frame_bytes,
                                 h->relayed_host != NULL ? " and relayed_host" : "");
    tr_relay_frame_free(f);
    return;
  }
  if (!p->counted) { /* not for a Hello said again after UpstreamLost */
    if (r->agents >= r->max_agents) {
      tr_relay_link_close(p->down, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                          "the regional already serves %u agents, its --max-agents; host %s "
                          "refused", r->agents, p->host);
      tr_relay_frame_free(f);
      return;
    }
    p->counted = true;
    r->agents++;
    if (tr_clocksync_init(&p->clock, NULL) < 0)
      p->clock = NULL; /* no probes then: the upstream maps the host through none */
  }
  p->awaiting_hello = false;
  p->hello = f;
  p->agent_features = h->features;
  p->agent_max_frame = max;
  /* An agent that takes UpstreamLost takes heartbeats before its Welcome too: it waits for a
   * busy upstream (a storm there) without its silence timeout closing its link. */
  if (p->agent_features & TR_RELAY_FEATURE_UPSTREAM_LOST)
    tr_relay_link_established(p->down, max);
  connect_upstream(p);
}

/* After Welcome: the agent's frames go upstream, but for its probe answers. */
static void down_forward(pump *p, Tracerelay__RelayFrame *f) {
  tr_regional *r = p->r;
  uint64_t now_ms = uv_now(r->loop);
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE:
    if (!(p->agent_features & TR_RELAY_FEATURE_CLOCK_PROBES) ||
        tr_clock_probe_answer(&r->probes, &p->probe, f->clock_probe->probe_id, f->clock_probe->t2,
                              f->clock_probe->t3, p->t4, now_ms) < 0)
      tr_relay_link_protocol_error(p->down, "clock probe answer out of range or unasked");
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CLOCK_FOLLOW_UP: {
    const Tracerelay__ClockFollowUp *fu = f->clock_follow_up;
    if (!(p->agent_features & TR_RELAY_FEATURE_CLOCK_FOLLOW_UP) ||
        tr_clock_probe_follow_up(&r->probes, &p->probe, fu->probe_id, fu->has_t3, fu->t3,
                                 fu->has_t3_late && fu->t3_late, now_ms) < 0)
      tr_relay_link_protocol_error(p->down, "clock follow-up out of range or unasked");
    break;
  }
  case TRACERELAY__RELAY_FRAME__MSG_HELLO:
  case TRACERELAY__RELAY_FRAME__MSG_RELAYED_CLOCK_EXCHANGE:
    tr_relay_link_protocol_error(p->down, "unexpected frame type %d", (int)f->msg_case);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    TR_INFO(COMP, "host %s says goodbye (reason %d): passed upstream", p->host,
            (int)f->goodbye->reason);
    tr_relay_link_send(p->up, f);
    tr_relay_link_hang_up(p->down);
    break;
  default:
    if (tr_relay_link_send(p->up, f) == TR_ERR_TOO_BIG)
      tr_relay_link_protocol_error(p->down, "a frame larger than the upstream accepts");
    else if (tr_relay_link_queued(p->up) > TR_REGIONAL_UPSTREAM_QUEUE / 2)
      tr_relay_link_hold_input(p->down);
    break;
  }
  tr_relay_frame_free(f);
}

static void down_frame(tr_relay_link *down, Tracerelay__RelayFrame *f) {
  pump *p = tr_relay_link_data(down);
  bool hello = f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HELLO;
  if (p->welcomed && p->up != NULL && !tr_relay_link_closing(p->up)) {
    down_forward(p, f);
  } else if (hello && (!p->counted || p->awaiting_hello)) {
    down_hello(p, f); /* takes f */
  } else if (p->keeps_link && !hello) {
    /* Its upstream link is gone or not back: what it sent for the lost one is dropped, as on
     * a broken link (relay.proto, UpstreamLost); heartbeats keep its own link alive. */
    p->r->relink_dropped_frames += f->msg_case != TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT;
    tr_relay_frame_free(f);
  } else {
    tr_relay_link_protocol_error(down, "frame type %d before Welcome", (int)f->msg_case);
    tr_relay_frame_free(f);
  }
}

static void down_open(tr_relay_link *down) {
  tr_regional *r = tr_relay_link_data(down);
  pump *p = calloc(1, sizeof *p);
  tr_relay_link_set_data(down, p);
  if (p == NULL) {
    tr_relay_link_close(down, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "out of memory");
    return;
  }
  p->r = r;
  p->down = down;
  p->opened_ms = uv_now(r->loop);
  snprintf(p->host, sizeof p->host, "%s", tr_tls_uv_peer_name(tr_relay_link_conn(down)));
  p->next = r->pumps;
  if (p->next != NULL)
    p->next->prev = p;
  r->pumps = p;
}

/* Before decryption: a probe answer's arrival (as link_server.c's on_read). */
static void down_read(tr_relay_link *down) {
  pump *p = tr_relay_link_data(down);
  tr_tls_uv_conn *conn = tr_relay_link_conn(down);
  p->t4 = tr_clock_probe_awaiting_answer(&p->probe) ? tr_tls_uv_read_time_checked(conn, false)
                                                     : tr_tls_uv_read_time(conn);
}

static void down_closing(tr_relay_link *down) {
  pump *p = tr_relay_link_data(down);
  if (p != NULL)
    tr_clock_probe_remove(&p->r->probes, &p->probe);
}

static void down_closed(tr_relay_link *down, int reason, const char *why) {
  pump *p = tr_relay_link_data(down);
  if (p == NULL)
    return;
  p->down = NULL;
  relink_done(p);
  p->r->closed_bytes_from_agents += tr_relay_link_bytes_in(down);
  if (p->counted)
    TR_INFO(COMP, "host %s disconnected: %s", p->host, reason ? why : "closed by us");
  p->awaiting_carrier = false;
  if (p->up != NULL) /* its queued frames (a Goodbye among them) still go out */
    tr_relay_link_close(p->up, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "the agent of %s disconnected", p->host);
  maybe_free_pump(p);
}

static const struct tr_relay_link_events down_events = {
    .on_open = down_open, .on_read = down_read, .on_frame = down_frame,
    .on_closing = down_closing, .on_closed = down_closed};

/* ---- timers ---- */

static void check_pump(pump *p, uint64_t now_ns, uint64_t now_ms) {
  if (p->relink_at_ms != 0 && now_ms >= p->relink_at_ms && p->up == NULL &&
      !p->awaiting_carrier && p->down != NULL && !tr_relay_link_closing(p->down)) {
    p->relink_at_ms = 0;
    connect_upstream(p);
  }
  bool alive = p->down != NULL && (waits_quietly(p) || tr_relay_link_check_alive(p->down, now_ns));
  if (alive && !p->counted && now_ms - p->opened_ms >= p->r->hello_timeout_ms)
    tr_relay_link_protocol_error(p->down, "no Hello within %u ms of the TLS handshake",
                                 p->r->hello_timeout_ms);
}

static void on_tick(uv_timer_t *t) {
  tr_regional *r = t->data;
  uint64_t now_ns = uv_hrtime(), now_ms = uv_now(r->loop);
  bool heartbeats = ++r->ticks % HEARTBEAT_TICKS == 0;
  if (heartbeats)
    for (pump *p = r->pumps; p != NULL; p = p->next)
      check_pump(p, now_ns, now_ms);
  tr_clock_probe_tick(&r->probes, now_ms, r->upstream_session);
  if (heartbeats) {
    for (pump *p = r->pumps; p != NULL; p = p->next)
      if (p->down != NULL)
        tr_relay_link_keep_alive(p->down, now_ns);
    tr_upstream_carrier_tick(r->carrier, now_ns, now_ms);
  }
}

/* ---- the public side ---- */

int tr_regional_start(uv_loop_t *loop, const struct tr_regional_opts *opts, tr_regional **out) {
  struct sockaddr_storage addr;
  struct tr_hostport up;
  if (opts->listen == NULL || tr_relay_link_listen_addr(opts->listen, &addr) < 0) {
    TR_ERROR(COMP, "cannot listen on '%s': give ADDR:PORT, e.g. 0.0.0.0:%d", opts->listen ? opts->listen : "",
             TR_LINK_DEFAULT_PORT);
    return TR_ERR_CONFIG;
  }
  if (opts->upstream == NULL || tr_hostport_parse(opts->upstream, false, &up) < 0) {
    TR_ERROR(COMP, "--upstream '%s': give HOST:PORT of the upstream service",
             opts->upstream ? opts->upstream : "");
    return TR_ERR_CONFIG;
  }
  tr_regional *r = calloc(1, sizeof *r);
  if (r == NULL)
    return TR_ERR_NOMEM;
  r->loop = loop;
  snprintf(r->upstream_host, sizeof r->upstream_host, "%s", up.host);
  snprintf(r->upstream_port, sizeof r->upstream_port, "%u", (unsigned)up.port);
  snprintf(r->upstream_text, sizeof r->upstream_text, "%s", opts->upstream);
  r->hello_timeout_ms =
      opts->handshake_timeout_ms ? opts->handshake_timeout_ms : TR_TLS_UV_HANDSHAKE_TIMEOUT_MS;
  r->max_agents = opts->max_agents ? opts->max_agents : TR_LINK_DEFAULT_MAX_AGENTS;
  r->down_opts = (struct tr_relay_link_opts){
      .tls = {.max_queued = TR_LINK_MAX_QUEUED,
              .handshake_timeout_ms = r->hello_timeout_ms,
              .max_handshakes_per_source = opts->max_handshakes_per_source,
              .max_waiting_per_source = opts->max_waiting_per_source},
      .pause_read_above = TR_LINK_MAX_QUEUED / 2,
      .peer_role = "agent"};
  const char *upstream_name = opts->upstream_name ? opts->upstream_name : up.host;
  struct tr_upstream_carrier_opts carrier_opts = {
      .host = r->upstream_host,
      .port = r->upstream_port,
      .server_name = upstream_name,
      .tls = opts->upstream_tls,
      .link = {.tls = {.max_queued = TR_REGIONAL_UPSTREAM_QUEUE,
                       .handshake_timeout_ms = r->hello_timeout_ms},
               .peer_role = "upstream service"},
      .max_slots = r->max_agents};
  tr_clock_probe_sched_init(&r->probes, &probe_ops);
  int rc = tr_upstream_carrier_new(loop, &carrier_opts, &carrier_events, r, &r->carrier);
  if (rc == 0) {
    rc = tr_relay_link_listen(loop, opts->tls, (struct sockaddr *)&addr, &r->down_opts,
                              &down_events, r, &r->listener);
    if (rc < 0) {
      TR_ERROR(COMP, "cannot listen on %s: %s", opts->listen, tr_strerror(rc));
      r->stopping = r->tick_closed = true; /* freed once the carrier is */
      tr_upstream_carrier_stop(r->carrier);
      return rc;
    }
  }
  if (rc < 0) {
    free(r);
    return rc;
  }
  uv_timer_init(loop, &r->tick);
  r->tick.data = r;
  uv_timer_start(&r->tick, on_tick, TICK_MS, TICK_MS);
  TR_INFO(COMP, "listening for agents on %s (port %d); forwarding them to %s:%s (%s)",
          opts->listen, tr_relay_link_listener_port(r->listener), r->upstream_host,
          r->upstream_port, upstream_name);
  *out = r;
  return 0;
}

void tr_regional_reload_tls(tr_regional *r, tr_tls_config *cfg, tr_tls_config *upstream_cfg) {
  tr_relay_link_listener_set_config(r->listener, cfg);
  tr_upstream_carrier_set_tls(r->carrier, upstream_cfg);
  char why[256];
  for (pump *p = r->pumps; p != NULL; p = p->next) {
    if (p->down == NULL || tr_relay_link_closing(p->down))
      continue;
    const tr_tls_session *tls = tr_tls_uv_session(tr_relay_link_conn(p->down));
    if (tls == NULL || !tr_tls_peer_refusal(tls, cfg, why, sizeof why))
      continue;
    TR_WARN(COMP, "host %s (%s): closing its link, %s since the reload", p->host,
            tr_tls_uv_peer_address(tr_relay_link_conn(p->down)), why);
    tr_relay_link_close(p->down, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                        "%s: the regional no longer accepts it", why);
  }
}

int64_t tr_regional_peer_expiry(const tr_regional *r, const char **name) {
  int64_t earliest = 0;
  for (const pump *p = r->pumps; p != NULL; p = p->next) {
    const tr_tls_session *tls = p->down ? tr_tls_uv_session(tr_relay_link_conn(p->down)) : NULL;
    int64_t t = tls != NULL ? tr_tls_peer_expiry(tls) : 0;
    if (t != 0 && (earliest == 0 || t < earliest)) {
      earliest = t;
      *name = p->host;
    }
  }
  return earliest;
}

unsigned tr_regional_agents(const tr_regional *r) { return r->agents; }

void tr_regional_stats(const tr_regional *r, struct tr_regional_stats *out) {
  *out = (struct tr_regional_stats){.agents = r->agents,
                                    .relinking = r->relinking,
                                    .bytes_from_agents = r->closed_bytes_from_agents,
                                    .bytes_from_upstream = r->closed_bytes_from_upstream,
                                    .upstream_lost = r->upstream_lost,
                                    .relink_dropped_frames = r->relink_dropped_frames};
  struct tr_upstream_carrier_stats cs = {0};
  if (r->carrier != NULL)
    tr_upstream_carrier_stats(r->carrier, &cs);
  out->carrier_up = cs.up;
  out->upstream_session = r->upstream_session;
  out->upstream_drift_known = r->upstream_drift_known;
  out->upstream_drift_ppm = r->upstream_drift_ppm;
  out->carrier_connects = cs.connects;
  out->carrier_lost = cs.lost;
  out->carrier_frames_out = cs.frames_out;
  out->carrier_writes = cs.writes;
  for (const pump *p = r->pumps; p != NULL; p = p->next) {
    if (p->down != NULL) {
      out->bytes_from_agents += tr_relay_link_bytes_in(p->down);
      out->held += p->counted && tr_relay_link_input_held(p->down);
    }
    if (p->up != NULL) {
      out->bytes_from_upstream += tr_relay_link_bytes_in(p->up);
      out->forwarded += p->welcomed && p->down != NULL;
    }
  }
}

const char *tr_regional_upstream(const tr_regional *r) { return r->upstream_text; }

void tr_regional_each_agent(const tr_regional *r,
                            void (*fn)(void *data, const struct tr_regional_agent *a),
                            void *data) {
  uint64_t now = uv_now(r->loop);
  const pump *last = r->pumps; /* the list is newest first */
  while (last != NULL && last->next != NULL)
    last = last->next;
  for (const pump *p = last; p != NULL; p = p->prev) {
    if (!p->counted)
      continue;
    struct tr_regional_agent a = {.name = p->host,
                                  .connected = p->down != NULL,
                                  .forwarded = p->welcomed && p->down && p->up,
                                  .connected_ms = now > p->opened_ms ? now - p->opened_ms : 0};
    if (p->down != NULL) {
      a.bytes_from_agent = tr_relay_link_bytes_in(p->down);
      a.held = tr_relay_link_input_held(p->down);
    }
    if (p->up != NULL)
      a.bytes_from_upstream = tr_relay_link_bytes_in(p->up);
    fn(data, &a);
  }
}

static void on_tick_closed(uv_handle_t *h) {
  tr_regional *r = h->data;
  r->tick_closed = true;
  maybe_free_regional(r);
}

void tr_regional_stop(tr_regional *r) {
  if (r->stopping)
    return;
  r->stopping = true;
  tr_relay_link_listener_close(r->listener);
  for (pump *p = r->pumps; p != NULL; p = p->next) {
    if (p->down != NULL)
      tr_relay_link_close(p->down, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN,
                          "the regional service is shutting down");
  }
  tr_upstream_carrier_stop(r->carrier); /* the agents' upstream links end with it */
  uv_close((uv_handle_t *)&r->tick, on_tick_closed);
}
