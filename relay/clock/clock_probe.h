/* clock_probe.h: the service's clock probes of its agents as a state machine, independent of
 * the transport: per peer the NTP-style exchange (ClockProbe {id, t1} out, the answer
 * {t2, t3} back at t4, optionally completed by a ClockFollowUp with the exact t3), and over all
 * peers the schedule that says who is probed when (docs/timeline.md, Probes). Pure logic: the
 * time is passed in (ms for the schedule, ns for t1..t4), frames are sent and exchanges
 * delivered through tr_clock_probe_ops; no sockets, no event loop.
 *
 * Exchange, per peer: IDLE -> SENT (the probe left) -> [ANSWERED (the answer is here, its
 * follow-up not yet), with the follow-up feature] -> IDLE, delivering t1..t4 to ops->done.
 * - One probe in flight per peer. A probe asked for while one is out, or while ops->send says
 *   the link is busy (TR_ERR_AGAIN), is "wanted": it goes as soon as the exchange in flight
 *   ends, or at a later tick.
 * - An answer or follow-up that does not match the probe in flight (another id, a repeat, a
 *   follow-up before its answer, anything after the timeout) is ignored; one that matches but
 *   carries a time outside [0, 2^62), or an answer whose t3 is before its t2, is a protocol
 *   error, and the exchange stays as it was.
 * - A probe unanswered for TR_CLOCK_PROBE_TIMEOUT_MS is forgotten at the next tick; its late
 *   answer is then ignored. An answer whose follow-up has not come TR_CLOCK_PROBE_FOLLOW_UP_MS
 *   after it is delivered at the next tick with its own t3 (a valid, looser bound: behind a
 *   saturated link's queue the follow-up waits for the answer's send stamp, then for the data
 *   queued meanwhile, and a probe lost there would leave the host without exchanges).
 * - t1 is what ops->send gave, improved once by ops->sent_time when the answer arrives (the
 *   kernel's send stamp may come after the write). A follow-up's t3 replaces the answer's
 *   only when it is not earlier (the answer's was read before encoding: the exact one is later).
 * - Probe ids are 1, 2, 3... over all peers of a schedule, one per probe that left: a late
 *   answer cannot be taken for another probe's, on any peer.
 *
 * Schedule: TR_CLOCK_PROBE_DENSE probes TR_CLOCK_PROBE_DENSE_MS apart after a peer is added
 * (a usable estimate within half a second), then one every TR_CLOCK_PROBE_PERIOD_MS; while a
 * session runs, one every tr_clock_probe_session_period_ms(drift of the host): 1 us / |drift|,
 * within [TR_CLOCK_PROBE_SESSION_MIN_MS, TR_CLOCK_PROBE_SESSION_MAX_MS]. The period is read at
 * every tick, so a session that just began shortens the wait at once.
 * - Budget: a tick sends at most TR_CLOCK_PROBES_PER_MS for every millisecond since the last
 *   tick, and at most TR_CLOCK_PROBE_BUDGET_MAX, in one burst (answers from different peers
 *   arrive on sockets of their own, stamped by the kernel, so they need no spacing).
 * - Fairness: the peers due go in the order of their due times, so those a spent budget left
 *   waiting go first at the next tick, and with more peers than the budget covers every peer's
 *   period stretches alike: when all are due, each gets its probe within ceil(peers / budget)
 *   ticks.
 * - On demand (tr_clock_probe_request, before a flush or a start): a probe unless the peer's
 *   last one is younger than its session period (as fresh as the schedule keeps any).
 *
 * Cost: a tick is O(log peers) for each peer it finds due (a probe, or the timeout of one in
 * flight) and nothing for the others: the peers wait in two heaps by due time (one for when an
 * idle peer's next probe is due, one for when the exchange in flight times out). A tick whose
 * session flag differs from the last tick's re-reads every idle peer's due time, O(peers log
 * peers), once as a session begins or ends. Every other call is O(log peers). ops->drift_ppm
 * is read when a peer is added and after each of its exchanges (the drift moves only with one).
 * Memory: one tr_clock_probe_peer per peer, owned by the caller. Not thread-safe. */
#ifndef TR_CLOCK_PROBE_H
#define TR_CLOCK_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "relay/base/due_heap.h"
#include "relay/clock/clocksync.h"

#define TR_CLOCK_PROBE_DENSE 10           /* after a peer is added, this many probes... */
#define TR_CLOCK_PROBE_DENSE_MS 50        /* ...this far apart, */
#define TR_CLOCK_PROBE_PERIOD_MS 1000     /* then one a second; while a session runs: */
#define TR_CLOCK_PROBE_DRIFT_NS 1000.0    /* as often as the drift moves the clock this much, */
#define TR_CLOCK_PROBE_SESSION_MIN_MS 5   /* but this often at most */
#define TR_CLOCK_PROBE_SESSION_MAX_MS 1000 /* and at least (as between sessions) */
#define TR_CLOCK_PROBES_PER_MS 8          /* the budget over all peers: this many a ms, */
#define TR_CLOCK_PROBE_BUDGET_MAX 400     /* at most this many in a tick's burst (50 ms worth) */
/* An unanswered probe is forgotten after this: an answer comes late only behind a queue (its
 * hold is measured and taken out), so a late one is still a valid exchange; 5 s left a starved
 * host behind a saturated link without any (answers took up to 4.6 s under ASan here). */
#define TR_CLOCK_PROBE_TIMEOUT_MS 30000
#define TR_CLOCK_PROBE_FOLLOW_UP_MS 3000  /* an answer's follow-up is awaited this long */

enum tr_clock_probe_state {
  TR_CLOCK_PROBE_IDLE = 0,
  TR_CLOCK_PROBE_SENT,     /* the probe left, its answer is awaited */
  TR_CLOCK_PROBE_ANSWERED, /* the answer is here, its follow-up (the exact t3) is awaited */
};

/* What the schedule needs from the transport; data is the peer's (tr_clock_probe_add). Each
 * call may close the peer it is for (and only it), which then calls tr_clock_probe_remove. */
struct tr_clock_probe_ops {
  /* Sends ClockProbe {probe_id, t1} and sets *t1 to its send time (BOOTTIME ns). 0 once sent;
   * TR_ERR_AGAIN when it should not go now (the link is busy: a probe queued behind other
   * frames would measure the queue), then it is wanted; another negative code when sending
   * failed (nothing left). */
  int (*send)(void *data, uint64_t probe_id, int64_t *t1);
  /* A better t1 for the probe in flight when the transport has one by now, else t1. */
  int64_t (*sent_time)(void *data, int64_t t1);
  /* The peer's clock drift in ppm (its sign does not matter; 0 when unknown). */
  double (*drift_ppm)(void *data);
  /* A completed exchange, t1/t4 on the service's clock, t2/t3 on the peer's; called before a
   * wanted probe is sent. */
  void (*done)(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex);
};

/* One peer's probes. Written by clock_probe.c only: zero it or leave it to tr_clock_probe_add. */
struct tr_clock_probe_peer {
  enum tr_clock_probe_state state;
  bool wanted;    /* a probe was asked for that could not go yet */
  bool follow_up; /* answers are completed by a follow-up */
  bool scheduled; /* between tr_clock_probe_add and tr_clock_probe_remove */
  uint64_t id;    /* of the probe in flight, or of the last one */
  struct tr_clocksync_probe ex; /* its times so far */
  uint64_t sent_ms;  /* when the last probe left */
  uint64_t answered_ms; /* when its answer came (state ANSWERED) */
  uint64_t next_ms;  /* when the schedule's next probe is due */
  unsigned sent;     /* probes sent to this peer */
  uint64_t session_period_ms; /* tr_clock_probe_session_period_ms of its drift */
  /* In the schedule's idle heap while IDLE (due: its next probe), else in its in-flight heap
   * (due: the timeout of the exchange), when queued; not queued while an ops call for it runs. */
  struct tr_due_node node;
  bool queued;
  struct tr_clock_probe_peer *aside_next; /* a tick's list of peers out of their heap */
  void *data;
};

/* Every peer of one service. Written by clock_probe.c only. */
struct tr_clock_probe_sched {
  const struct tr_clock_probe_ops *ops;
  struct tr_due_heap idle;      /* idle peers by when their next probe is due */
  struct tr_due_heap in_flight; /* the others by when their exchange times out */
  bool session;                 /* the last tick's: the idle peers' due times follow it */
  uint64_t last_id;
  uint64_t last_tick_ms; /* when the budget was last refilled */
  uint64_t examined;     /* peers the ticks looked at (for the tests of their cost) */
};

void tr_clock_probe_sched_init(struct tr_clock_probe_sched *s,
                               const struct tr_clock_probe_ops *ops);
/* Starts probing a peer (after Welcome), its first probe due now. follow_up: its answers are
 * completed by a ClockFollowUp. */
void tr_clock_probe_add(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p, void *data,
                        bool follow_up, uint64_t now_ms);
/* Stops probing it (it is closing); the exchange in flight is dropped. Does nothing for a peer
 * not scheduled, so a zeroed one may be removed. Safe from inside an ops call for that peer. */
void tr_clock_probe_remove(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p);
/* Forgets timed-out probes and sends those due, within the budget (above). session: a tracing
 * session exists (the drift-paced periods apply). */
void tr_clock_probe_tick(struct tr_clock_probe_sched *s, uint64_t now_ms, bool session);
/* When the next tick has something to do (a probe due, an exchange to time out), in the last
 * tick's session state; UINT64_MAX when no peer is scheduled. A peer left due by a spent budget
 * or a busy link is due already (a time not after the last tick's). O(1). */
uint64_t tr_clock_probe_next_due_ms(const struct tr_clock_probe_sched *s);
/* A probe now unless the peer's last is younger than its session period; wanted if it cannot
 * go yet. Nothing for a peer not scheduled. */
void tr_clock_probe_request(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                            uint64_t now_ms);
/* True while p's probe is out and its answer is awaited (its arrival time will be needed). */
bool tr_clock_probe_awaiting_answer(const struct tr_clock_probe_peer *p);
/* The answer to probe_id: t2, t3 as the peer sent them, t4 when it arrived (BOOTTIME ns).
 * Returns 1 when taken (without the follow-up feature the exchange is delivered to ops->done,
 * and a wanted probe sent), 0 when ignored (not the probe in flight), TR_ERR_PROTO for t2 or t3
 * outside [0, 2^62). */
int tr_clock_probe_answer(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                          uint64_t probe_id, uint64_t t2, uint64_t t3, int64_t t4,
                          uint64_t now_ms);
/* The follow-up of probe_id: has_t3, the exact send time of the answer, unless t3_late (the
 * peer's kernel stamp did not come: t3 is when the answer went to its kernel, which may have
 * held it). Without t3, or with t3_late, the exchange is delivered with t3_late set (as it is
 * when no follow-up came in time). Returns and delivers as tr_clock_probe_answer
 * (TR_ERR_PROTO for t3 outside [0, 2^62)). */
int tr_clock_probe_follow_up(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                             uint64_t probe_id, bool has_t3, uint64_t t3, bool t3_late,
                             uint64_t now_ms);
/* While a session runs: often enough that the drift moves the host's clock by at most
 * TR_CLOCK_PROBE_DRIFT_NS between probes (5 ms at 200 ppm, 50 ms at 20 ppm, 1 s at 1 ppm or
 * less), so that in `machines` an edge is never older than 1 us of drift; hosts whose clocks
 * keep time cost a probe a second, as between sessions: what lets one service probe a
 * thousand. */
uint64_t tr_clock_probe_session_period_ms(double drift_ppm);

#endif
