/* clock_probe.c: the clock probes' exchange and schedule (see clock_probe.h for the contract).
 *
 * Each scheduled peer waits in one of two heaps (relay/base/due_heap.h): the idle heap while no
 * exchange is in flight, keyed on when its next probe is due, else the in-flight heap, keyed on
 * when its exchange times out. A tick takes from each only what is due, so peers that are not
 * cost it nothing. A peer's key is set as it is queued, from its state and times then, so every
 * change of those happens while it is out of its heap: the public calls take it out
 * (unqueue), change it, and put it back where its state says (queue). Ops calls may remove the
 * peer they are for; it is out of its heap meanwhile, and a removed peer is not queued again.
 *
 * The idle keys depend on the session flag (the period in a session is the drift's): the
 * heap is built for the last tick's, and a tick with the other one rebuilds it. */
#include "relay/clock/clock_probe.h"

#include <math.h>
#include <stddef.h>

#include "relay/base/tr_error.h"

#define TS_LIMIT (1ull << 62)

static struct tr_clock_probe_peer *peer_of(struct tr_due_node *n) {
  return (struct tr_clock_probe_peer *)((char *)n - offsetof(struct tr_clock_probe_peer, node));
}

void tr_clock_probe_sched_init(struct tr_clock_probe_sched *s,
                               const struct tr_clock_probe_ops *ops) {
  *s = (struct tr_clock_probe_sched){.ops = ops};
}

/* The period as of now. */
static uint64_t period(const struct tr_clock_probe_peer *p, bool session) {
  return p->sent < TR_CLOCK_PROBE_DENSE ? TR_CLOCK_PROBE_DENSE_MS
         : session                      ? p->session_period_ms
                                        : TR_CLOCK_PROBE_PERIOD_MS;
}

/* When an idle peer's next probe is due: at next_ms, or a period after the last probe (sent on
 * demand, or under a period that has since shortened), whichever comes first. */
static uint64_t probe_due_ms(const struct tr_clock_probe_peer *p, bool session) {
  if (p->sent == 0)
    return p->next_ms;
  uint64_t after_last = p->sent_ms + period(p, session);
  return after_last < p->next_ms ? after_last : p->next_ms;
}

static struct tr_due_heap *heap_of(struct tr_clock_probe_sched *s,
                                   const struct tr_clock_probe_peer *p) {
  return p->state == TR_CLOCK_PROBE_IDLE ? &s->idle : &s->in_flight;
}

/* Puts a scheduled peer into the heap of its state, keyed on what it waits for. */
static void queue(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p) {
  if (!p->scheduled)
    return;
  uint64_t due = p->state == TR_CLOCK_PROBE_IDLE ? probe_due_ms(p, s->session)
                 : p->state == TR_CLOCK_PROBE_SENT
                     ? p->sent_ms + TR_CLOCK_PROBE_TIMEOUT_MS
                     : p->answered_ms + TR_CLOCK_PROBE_FOLLOW_UP_MS;
  tr_due_heap_insert(heap_of(s, p), &p->node, due);
  p->queued = true;
}

static void unqueue(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p) {
  if (!p->queued)
    return;
  tr_due_heap_remove(heap_of(s, p), &p->node);
  p->queued = false;
}

void tr_clock_probe_add(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p, void *data,
                        bool follow_up, uint64_t now_ms) {
  *p = (struct tr_clock_probe_peer){
      .follow_up = follow_up, .scheduled = true, .next_ms = now_ms, .data = data};
  p->session_period_ms = tr_clock_probe_session_period_ms(s->ops->drift_ppm(data));
  queue(s, p);
}

void tr_clock_probe_remove(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p) {
  if (!p->scheduled)
    return;
  unqueue(s, p);
  p->scheduled = false;
  p->state = TR_CLOCK_PROBE_IDLE;
  p->wanted = false;
}

uint64_t tr_clock_probe_session_period_ms(double drift_ppm) {
  double drift = fabs(drift_ppm) * 1e-6;
  double ms = drift > 0 ? TR_CLOCK_PROBE_DRIFT_NS / drift / 1e6 : TR_CLOCK_PROBE_SESSION_MAX_MS;
  return ms < TR_CLOCK_PROBE_SESSION_MIN_MS   ? TR_CLOCK_PROBE_SESSION_MIN_MS
         : ms > TR_CLOCK_PROBE_SESSION_MAX_MS ? TR_CLOCK_PROBE_SESSION_MAX_MS
                                              : (uint64_t)ms;
}

/* Sends a probe unless one is out or the transport says not now; then it is wanted. Returns
 * whether it was sent. */
static bool send_probe(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                       uint64_t now_ms) {
  if (p->state != TR_CLOCK_PROBE_IDLE) {
    p->wanted = true;
    return false;
  }
  int64_t t1 = 0;
  int rc = s->ops->send(p->data, s->last_id + 1, &t1);
  p->wanted = rc == TR_ERR_AGAIN;
  if (rc < 0)
    return false;
  p->id = ++s->last_id;
  p->ex = (struct tr_clocksync_probe){.t1 = t1};
  p->state = TR_CLOCK_PROBE_SENT;
  p->sent_ms = now_ms;
  p->sent++;
  return true;
}

static void finish(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                   uint64_t now_ms) {
  p->state = TR_CLOCK_PROBE_IDLE;
  s->ops->done(p->data, p->id, &p->ex);
  /* The drift moves only with an exchange: read once here, not at every tick (a cache miss
   * per peer every 5 ms was 12 % of the service's CPU with 1,000 agents in a session). */
  p->session_period_ms = tr_clock_probe_session_period_ms(s->ops->drift_ppm(p->data));
  if (p->wanted)
    send_probe(s, p, now_ms);
}

bool tr_clock_probe_awaiting_answer(const struct tr_clock_probe_peer *p) {
  return p->state == TR_CLOCK_PROBE_SENT;
}

int tr_clock_probe_answer(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                          uint64_t probe_id, uint64_t t2, uint64_t t3, int64_t t4,
                          uint64_t now_ms) {
  if (p->state != TR_CLOCK_PROBE_SENT || probe_id != p->id)
    return 0; /* answered after we gave up on it, or twice */
  /* An answer sent before its probe arrived is no exchange: the estimator would refuse it,
   * uncounted (fuzz_clock_frames found it passed through), as a relayed one is refused. */
  if (t2 >= TS_LIMIT || t3 >= TS_LIMIT || t3 < t2)
    return TR_ERR_PROTO;
  p->ex.t1 = s->ops->sent_time(p->data, p->ex.t1); /* the kernel's, once there */
  p->ex.t2 = (int64_t)t2;
  p->ex.t3 = (int64_t)t3;
  p->ex.t4 = t4;
  unqueue(s, p);
  if (p->follow_up) {
    p->state = TR_CLOCK_PROBE_ANSWERED; /* the exact t3 follows */
    p->answered_ms = now_ms;
  }
  else
    finish(s, p, now_ms);
  queue(s, p);
  return 1;
}

int tr_clock_probe_follow_up(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                             uint64_t probe_id, bool has_t3, uint64_t t3, bool t3_late,
                             uint64_t now_ms) {
  if (p->state != TR_CLOCK_PROBE_ANSWERED || probe_id != p->id)
    return 0;
  if (has_t3 && t3 >= TS_LIMIT)
    return TR_ERR_PROTO;
  /* The answer's t3 was read before encoding: the exact one can only be later. */
  if (has_t3 && (int64_t)t3 >= p->ex.t3)
    p->ex.t3 = (int64_t)t3;
  p->ex.t3_late = !has_t3 || t3_late;
  unqueue(s, p);
  finish(s, p, now_ms);
  queue(s, p);
  return 1;
}

void tr_clock_probe_request(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                            uint64_t now_ms) {
  if (!p->scheduled)
    return;
  /* A probe younger than the peer's session period is as fresh as the schedule keeps any: the
   * drift moved its clock by at most 1 us since (flushes every 250 ms through 1,000 hosts
   * sent 4,000 probes a second more, whatever the hosts' drift). */
  if (p->sent > 0 && now_ms - p->sent_ms < p->session_period_ms)
    return;
  unqueue(s, p);
  send_probe(s, p, now_ms);
  queue(s, p);
}

/* The idle peers' due times for a session flag other than the last tick's. */
static void rekey_idle(struct tr_clock_probe_sched *s, bool session) {
  struct tr_clock_probe_peer *all = NULL;
  for (struct tr_due_node *n; (n = tr_due_heap_first(&s->idle)) != NULL;) {
    struct tr_clock_probe_peer *p = peer_of(n);
    unqueue(s, p);
    p->aside_next = all;
    all = p;
    s->examined++;
  }
  s->session = session;
  for (; all != NULL; all = all->aside_next)
    queue(s, all);
}

/* An exchange in flight that timed out: a probe unanswered is forgotten, an answer without its
 * follow-up is delivered as it is. */
static void time_out(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                     uint64_t now_ms) {
  unqueue(s, p);
  if (p->state == TR_CLOCK_PROBE_SENT)
    p->state = TR_CLOCK_PROBE_IDLE;
  else {
    p->ex.t3_late = true; /* the answer's own t3, read before it was queued */
    finish(s, p, now_ms);
  }
  queue(s, p);
}

void tr_clock_probe_tick(struct tr_clock_probe_sched *s, uint64_t now_ms, bool session) {
  uint64_t budget = (now_ms - s->last_tick_ms) * TR_CLOCK_PROBES_PER_MS;
  unsigned left = budget > TR_CLOCK_PROBE_BUDGET_MAX ? TR_CLOCK_PROBE_BUDGET_MAX : (unsigned)budget;
  s->last_tick_ms = now_ms;
  if (session != s->session)
    rekey_idle(s, session);
  struct tr_due_node *n;
  while ((n = tr_due_heap_first(&s->in_flight)) != NULL && n->due <= now_ms) {
    s->examined++;
    time_out(s, peer_of(n), now_ms);
  }
  /* Those due whose link is busy keep their turn: aside until the others had theirs. */
  struct tr_clock_probe_peer *busy = NULL;
  while (left > 0 && (n = tr_due_heap_first(&s->idle)) != NULL && n->due <= now_ms) {
    struct tr_clock_probe_peer *p = peer_of(n);
    s->examined++;
    uint64_t every = period(p, session);
    unqueue(s, p);
    if (send_probe(s, p, now_ms)) {
      left--;
      p->next_ms = now_ms + every;
    }
    else if (p->scheduled) {
      p->aside_next = busy;
      busy = p;
      continue;
    }
    queue(s, p);
  }
  for (; busy != NULL; busy = busy->aside_next)
    queue(s, busy);
}

uint64_t tr_clock_probe_next_due_ms(const struct tr_clock_probe_sched *s) {
  const struct tr_due_node *idle = tr_due_heap_first(&s->idle);
  const struct tr_due_node *in_flight = tr_due_heap_first(&s->in_flight);
  uint64_t due = idle != NULL ? idle->due : UINT64_MAX;
  return in_flight != NULL && in_flight->due < due ? in_flight->due : due;
}
