/* clock_probe.c: the clock probes' exchange and schedule (see clock_probe.h for the contract).
 *
 * The peers form a doubly linked list from head to tail, the order a tick walks them in; a
 * tick that runs out of budget rotates the list (keeping its cyclic order) so that the first
 * peer it left waiting is the next tick's head. Ops calls may remove the peer they are for, so
 * a walk reads a peer's successor before acting on it. */
#include "relay/clock/clock_probe.h"

#include <math.h>
#include <stddef.h>

#include "relay/base/tr_error.h"

#define TS_LIMIT (1ull << 62)

void tr_clock_probe_sched_init(struct tr_clock_probe_sched *s,
                               const struct tr_clock_probe_ops *ops) {
  *s = (struct tr_clock_probe_sched){.ops = ops};
}

void tr_clock_probe_add(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p, void *data,
                        bool follow_up, uint64_t now_ms) {
  *p = (struct tr_clock_probe_peer){
      .follow_up = follow_up, .scheduled = true, .next_ms = now_ms, .next = s->head, .data = data};
  p->session_period_ms = tr_clock_probe_session_period_ms(s->ops->drift_ppm(data));
  if (s->head != NULL)
    s->head->prev = p;
  else
    s->tail = p;
  s->head = p;
}

void tr_clock_probe_remove(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p) {
  if (!p->scheduled)
    return;
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    s->head = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  else
    s->tail = p->prev;
  p->prev = p->next = NULL;
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

/* The period as of now. */
static uint64_t period(const struct tr_clock_probe_peer *p, bool session) {
  return p->sent < TR_CLOCK_PROBE_DENSE ? TR_CLOCK_PROBE_DENSE_MS
         : session                      ? p->session_period_ms
                                        : TR_CLOCK_PROBE_PERIOD_MS;
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
  if (t2 >= TS_LIMIT || t3 >= TS_LIMIT)
    return TR_ERR_PROTO;
  p->ex.t1 = s->ops->sent_time(p->data, p->ex.t1); /* the kernel's, once there */
  p->ex.t2 = (int64_t)t2;
  p->ex.t3 = (int64_t)t3;
  p->ex.t4 = t4;
  if (p->follow_up) {
    p->state = TR_CLOCK_PROBE_ANSWERED; /* the exact t3 follows */
    p->answered_ms = now_ms;
  }
  else
    finish(s, p, now_ms);
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
  finish(s, p, now_ms);
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
  send_probe(s, p, now_ms);
}

/* Returns true when a probe was due but the budget was spent. */
static bool tick_peer(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                      uint64_t now_ms, bool session, unsigned *budget) {
  if (p->state == TR_CLOCK_PROBE_SENT && now_ms - p->sent_ms >= TR_CLOCK_PROBE_TIMEOUT_MS)
    p->state = TR_CLOCK_PROBE_IDLE;
  else if (p->state == TR_CLOCK_PROBE_ANSWERED &&
           now_ms - p->answered_ms >= TR_CLOCK_PROBE_FOLLOW_UP_MS) {
    p->ex.t3_late = true; /* the answer's own t3, read before it was queued */
    finish(s, p, now_ms);
  }
  uint64_t every = period(p, session);
  bool due = now_ms >= p->next_ms || (p->sent > 0 && now_ms >= p->sent_ms + every);
  if (!due || p->state != TR_CLOCK_PROBE_IDLE)
    return false;
  if (*budget == 0)
    return true;
  if (send_probe(s, p, now_ms)) {
    --*budget;
    p->next_ms = now_ms + every;
  }
  return false;
}

/* Makes p the head, keeping the cyclic order. */
static void rotate_to(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p) {
  if (p == s->head)
    return;
  struct tr_clock_probe_peer *last = p->prev;
  s->tail->next = s->head;
  s->head->prev = s->tail;
  last->next = NULL;
  p->prev = NULL;
  s->head = p;
  s->tail = last;
}

void tr_clock_probe_tick(struct tr_clock_probe_sched *s, uint64_t now_ms, bool session) {
  uint64_t budget = (now_ms - s->last_tick_ms) * TR_CLOCK_PROBES_PER_MS;
  unsigned left = budget > TR_CLOCK_PROBE_BUDGET_MAX ? TR_CLOCK_PROBE_BUDGET_MAX : (unsigned)budget;
  s->last_tick_ms = now_ms;
  struct tr_clock_probe_peer *first_starved = NULL, *next;
  for (struct tr_clock_probe_peer *p = s->head; p != NULL; p = next) {
    next = p->next;
    if (tick_peer(s, p, now_ms, session, &left) && first_starved == NULL)
      first_starved = p;
  }
  if (first_starved != NULL)
    rotate_to(s, first_starved);
}
