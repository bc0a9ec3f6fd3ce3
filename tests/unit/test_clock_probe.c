/* test_clock_probe.c: the clock probes' exchange and schedule on fake time, without sockets.
 * Fake peers record what the schedule sends and delivers; the tests answer for the agents. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "relay/clock/clock_probe.h"
#include "relay/base/tr_error.h"

#define START_MS 10000 /* the loop's clock is never near 0 */
#define MAX_PEERS 1000

typedef struct fake {
  struct tr_clock_probe_peer probe;
  int send_rc;        /* what send returns before sending: TR_ERR_AGAIN (busy) or a failure */
  bool close_on_send; /* the send closes the peer (as a full queue does) */
  double drift_ppm;
  int64_t kernel_t1;  /* what sent_time returns, 0: no better t1 */
  unsigned sends;     /* probes that left */
  uint64_t probe_id;  /* of the last one */
  int64_t t1;
  uint64_t sent_ms[64];
  unsigned done;
  uint64_t done_id;
  struct tr_clocksync_probe ex;
} fake;

static struct tr_clock_probe_sched sched;
static fake peers[MAX_PEERS];
static uint64_t now_ms;
static char events[64]; /* 's' for a send, 'd' for a delivery, in order */
static size_t n_events;

static void event(char c) {
  if (n_events < sizeof events - 1)
    events[n_events++] = c;
}

static int fake_send(void *data, uint64_t probe_id, int64_t *t1) {
  fake *f = data;
  if (f->close_on_send) {
    tr_clock_probe_remove(&sched, &f->probe);
    return TR_ERR_CLOSED;
  }
  if (f->send_rc < 0)
    return f->send_rc;
  if (f->sends < 64)
    f->sent_ms[f->sends] = now_ms;
  f->sends++;
  f->probe_id = probe_id;
  f->t1 = (int64_t)now_ms * 1000000;
  *t1 = f->t1;
  event('s');
  return 0;
}

static int64_t fake_sent_time(void *data, int64_t t1) {
  fake *f = data;
  return f->kernel_t1 != 0 ? f->kernel_t1 : t1;
}

static double fake_drift_ppm(void *data) { return ((fake *)data)->drift_ppm; }

static void fake_done(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex) {
  fake *f = data;
  f->done++;
  f->done_id = probe_id;
  f->ex = *ex;
  event('d');
}

static const struct tr_clock_probe_ops ops = {.send = fake_send, .sent_time = fake_sent_time,
                                              .drift_ppm = fake_drift_ppm, .done = fake_done};

static int setup(void **state) {
  (void)state;
  memset(peers, 0, sizeof peers);
  memset(events, 0, sizeof events);
  n_events = 0;
  now_ms = START_MS;
  tr_clock_probe_sched_init(&sched, &ops);
  return 0;
}

static void add(fake *f, bool follow_up) {
  tr_clock_probe_add(&sched, &f->probe, f, follow_up, now_ms);
}

/* The agent's answer to the probe in flight: t2/t3 a little after t1. */
static int answer(fake *f) {
  int64_t t1 = f->t1;
  return tr_clock_probe_answer(&sched, &f->probe, f->probe_id, (uint64_t)t1 + 1000,
                               (uint64_t)t1 + 2000, t1 + 3000, now_ms);
}

static void answer_all(unsigned n) {
  for (unsigned i = 0; i < n; i++)
    if (peers[i].probe.state == TR_CLOCK_PROBE_SENT)
      assert_int_equal(answer(&peers[i]), 1);
}

/* One peer, its first probe out (id 1). */
static fake *first_probe(bool follow_up) {
  fake *f = &peers[0];
  add(f, follow_up);
  tr_clock_probe_tick(&sched, now_ms, false);
  return f;
}

static void test_exchange(void **state) {
  (void)state;
  peers[0].kernel_t1 = (int64_t)START_MS * 1000000 + 7; /* the stamp came after the write */
  fake *f = first_probe(false);
  assert_int_equal(f->sends, 1);
  assert_int_equal(f->probe_id, 1);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_SENT);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 1, 500, 600, 9000, now_ms), 1);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_IDLE);
  assert_int_equal(f->done, 1);
  assert_int_equal(f->done_id, 1);
  assert_int_equal(f->ex.t1, f->kernel_t1);
  assert_int_equal(f->ex.t2, 500);
  assert_int_equal(f->ex.t3, 600);
  assert_int_equal(f->ex.t4, 9000);
  /* The next probe is the next id, its exchange afresh. */
  now_ms += TR_CLOCK_PROBE_DENSE_MS;
  f->kernel_t1 = 0;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->probe_id, 2);
  assert_int_equal(answer(f), 1);
  assert_int_equal(f->ex.t1, f->t1);
  assert_int_equal(f->done_id, 2);
}

static void test_follow_up(void **state) {
  (void)state;
  fake *f = first_probe(true);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 1, 500, 600, 9000, now_ms), 1);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_ANSWERED);
  assert_int_equal(f->done, 0);
  /* The exact t3 is later than the one read before encoding: it replaces it. */
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 1, true, 650, false, now_ms), 1);
  assert_int_equal(f->done, 1);
  assert_int_equal(f->ex.t3, 650);
  assert_false(f->ex.t3_late);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_IDLE);

  /* An earlier one cannot be right: the answer's stays. So does it without a t3. */
  now_ms += TR_CLOCK_PROBE_DENSE_MS;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 2, 700, 800, 9500, now_ms), 1);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 2, true, 799, false, now_ms), 1);
  assert_int_equal(f->ex.t3, 800);
  now_ms += TR_CLOCK_PROBE_DENSE_MS;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 3, 900, 1000, 9900, now_ms), 1);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 3, false, 0, false, now_ms), 1);
  assert_int_equal(f->ex.t3, 1000);
  assert_true(f->ex.t3_late); /* no exact time: it may have waited behind queued bytes */
  assert_int_equal(f->done, 3);
  /* A t3 whose kernel stamp did not come is used, and marked late. */
  now_ms += TR_CLOCK_PROBE_DENSE_MS;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 4, 1100, 1200, 9990, now_ms), 1);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 4, true, 1250, true, now_ms), 1);
  assert_int_equal(f->ex.t3, 1250);
  assert_true(f->ex.t3_late);
  assert_int_equal(f->done, 4);
}

static void test_stale_and_mismatched(void **state) {
  (void)state;
  fake *f = &peers[0], *g = &peers[1];
  add(f, true);
  add(g, false);
  /* Nothing in flight: any answer or follow-up is ignored. */
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 1, 1, 2, 3, now_ms), 0);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 1, true, 2, false, now_ms), 0);
  tr_clock_probe_tick(&sched, now_ms, false);
  /* Both probed, ids 1 and 2 in either order. */
  uint64_t fid = f->probe_id, gid = g->probe_id;
  assert_int_equal(f->sends + g->sends, 2);
  assert_int_equal(fid + gid, 3);
  assert_int_not_equal(fid, gid);
  /* Another peer's id, a follow-up before its answer. */
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, gid, 1, 2, 3, now_ms), 0);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, fid, true, 2, false, now_ms), 0);
  /* Times out of range: a protocol error, and the exchange is as it was. */
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, fid, 1ull << 62, 2, 3, now_ms),
                   TR_ERR_PROTO);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, fid, 1, UINT64_MAX, 3, now_ms),
                   TR_ERR_PROTO);
  /* Sent back before the probe arrived (t3 before t2): no exchange, the same (issue 39 item 8,
   * fuzz_clock_frames: it reached the estimator, which dropped it uncounted). */
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, fid, 20, 10, 30, now_ms),
                   TR_ERR_PROTO);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_SENT);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, fid, 10, 20, 30, now_ms), 1);
  /* A repeat of the answer, a follow-up for another probe, one out of range. */
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, fid, 11, 21, 31, now_ms), 0);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, gid, true, 25, false, now_ms), 0);
  assert_int_equal(
      tr_clock_probe_follow_up(&sched, &f->probe, fid, true, 1ull << 62, false, now_ms),
      TR_ERR_PROTO);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_ANSWERED);
  assert_int_equal(f->done, 0);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, fid, true, 25, false, now_ms), 1);
  assert_int_equal(f->done, 1);
  assert_int_equal(f->ex.t2, 10);
  assert_int_equal(f->ex.t3, 25);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, fid, true, 26, false, now_ms), 0);
  /* Without the feature, a follow-up finds no answer waiting for it. */
  assert_int_equal(tr_clock_probe_answer(&sched, &g->probe, gid, 10, 20, 30, now_ms), 1);
  assert_int_equal(g->done, 1);
  assert_int_equal(tr_clock_probe_follow_up(&sched, &g->probe, gid, true, 25, false, now_ms), 0);
  assert_int_equal(g->done, 1);
  assert_int_equal(f->done, 1);
}

static void test_timeout(void **state) {
  (void)state;
  fake *f = first_probe(true);
  /* Still awaited one tick before the timeout: nothing new goes. */
  now_ms = START_MS + TR_CLOCK_PROBE_TIMEOUT_MS - 1;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->sends, 1);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_SENT);
  /* Forgotten at the timeout; the next probe, long due, goes at once. */
  now_ms++;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->sends, 2);
  assert_int_equal(f->probe_id, 2);
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 1, 10, 20, 30, now_ms), 0);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_SENT);
  /* An answer whose follow-up does not come is delivered with its own t3 once
   * TR_CLOCK_PROBE_FOLLOW_UP_MS have passed since it came; a late follow-up is then ignored. */
  now_ms += 100;
  assert_int_equal(tr_clock_probe_answer(&sched, &f->probe, 2, 10, 20, 30, now_ms), 1);
  uint64_t answered = now_ms;
  now_ms = answered + TR_CLOCK_PROBE_FOLLOW_UP_MS - 1;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->done, 0);
  assert_int_equal(f->probe.state, TR_CLOCK_PROBE_ANSWERED);
  now_ms++;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->done, 1);
  assert_int_equal(f->ex.t2, 10);
  assert_int_equal(f->ex.t3, 20);
  assert_int_equal(f->ex.t4, 30);
  assert_true(f->ex.t3_late);
  assert_int_equal(f->sends, 3); /* the next one, long due, went at once */
  assert_int_equal(tr_clock_probe_follow_up(&sched, &f->probe, 2, true, 25, false, now_ms), 0);
  assert_int_equal(f->done, 1);
}

/* Ticks every `step` ms until `until`, answering every probe at once. */
static void run(unsigned n, uint64_t step, uint64_t until, bool session) {
  for (; now_ms <= until; now_ms += step) {
    tr_clock_probe_tick(&sched, now_ms, session);
    answer_all(n);
  }
}

static void test_schedule_periods(void **state) {
  (void)state;
  fake *f = &peers[0];
  add(f, false);
  f->drift_ppm = -20; /* read with each exchange; it matters only in a session */
  /* Dense after Welcome: a probe every 50 ms, then one a second. */
  run(1, 5, START_MS + 2600, false);
  assert_int_equal(f->sends, TR_CLOCK_PROBE_DENSE + 3);
  for (unsigned i = 0; i <= TR_CLOCK_PROBE_DENSE; i++)
    assert_int_equal(f->sent_ms[i], START_MS + i * TR_CLOCK_PROBE_DENSE_MS);
  uint64_t last = f->sent_ms[TR_CLOCK_PROBE_DENSE];
  assert_int_equal(f->sent_ms[TR_CLOCK_PROBE_DENSE + 1], last + TR_CLOCK_PROBE_PERIOD_MS);
  assert_int_equal(f->sent_ms[TR_CLOCK_PROBE_DENSE + 2], last + 2 * TR_CLOCK_PROBE_PERIOD_MS);
  /* A session begins (20 ppm: every 50 ms): the wait shortens at once. */
  last = f->sent_ms[TR_CLOCK_PROBE_DENSE + 2];
  unsigned before = f->sends;
  run(1, 5, now_ms, true);
  assert_int_equal(f->sends, before + 1);
  assert_int_equal(f->sent_ms[before], START_MS + 2605);
  run(1, 5, START_MS + 2805, true);
  assert_int_equal(f->sends, before + 5);
  assert_int_equal(f->sent_ms[before + 4], START_MS + 2805);
  /* 200 ppm, as the exchange at 2855 (still 50 ms after the last) will say: from then on
   * every 5 ms, as often as the ticks go. */
  f->drift_ppm = 200;
  before = f->sends;
  run(1, 5, START_MS + 2900, true);
  assert_int_equal(f->sends, before + 10);
  assert_int_equal(f->sent_ms[before], START_MS + 2855);
  assert_int_equal(f->sent_ms[before + 1], START_MS + 2860);
}

static void test_period_clamping(void **state) {
  (void)state;
  assert_int_equal(tr_clock_probe_session_period_ms(0), TR_CLOCK_PROBE_SESSION_MAX_MS);
  assert_int_equal(tr_clock_probe_session_period_ms(0.5), TR_CLOCK_PROBE_SESSION_MAX_MS);
  assert_int_equal(tr_clock_probe_session_period_ms(1), 1000);
  assert_int_equal(tr_clock_probe_session_period_ms(2), 500);
  assert_int_equal(tr_clock_probe_session_period_ms(20), 50);
  assert_int_equal(tr_clock_probe_session_period_ms(-20), 50);
  assert_int_equal(tr_clock_probe_session_period_ms(200), 5);
  assert_int_equal(tr_clock_probe_session_period_ms(-1000), TR_CLOCK_PROBE_SESSION_MIN_MS);
  assert_int_equal(tr_clock_probe_session_period_ms(1e9), TR_CLOCK_PROBE_SESSION_MIN_MS);
}

static void test_budget(void **state) {
  (void)state;
  for (unsigned i = 0; i < MAX_PEERS; i++)
    add(&peers[i], false);
  unsigned total = 0;
  /* The first tick since the start: a full burst, no more. */
  tr_clock_probe_tick(&sched, now_ms, false);
  for (unsigned i = 0; i < MAX_PEERS; i++)
    total += peers[i].sends;
  assert_int_equal(total, TR_CLOCK_PROBE_BUDGET_MAX);
  answer_all(MAX_PEERS);
  /* Then what the time since the last tick pays for. */
  now_ms += 3;
  tr_clock_probe_tick(&sched, now_ms, false);
  total = 0;
  for (unsigned i = 0; i < MAX_PEERS; i++)
    total += peers[i].sends;
  assert_int_equal(total, TR_CLOCK_PROBE_BUDGET_MAX + 3 * TR_CLOCK_PROBES_PER_MS);
  /* A tick at the same millisecond has nothing to spend. */
  tr_clock_probe_tick(&sched, now_ms, false);
  unsigned again = 0;
  for (unsigned i = 0; i < MAX_PEERS; i++)
    again += peers[i].sends;
  assert_int_equal(again, total);
}

static void test_rotation_fairness(void **state) {
  (void)state;
  /* 100 peers, 8 probes a tick: every one gets its first before any gets a second. */
  enum { N = 100 };
  for (unsigned i = 0; i < N; i++)
    add(&peers[i], false);
  sched.last_tick_ms = now_ms - 1;
  unsigned ticks = 0;
  for (;;) {
    tr_clock_probe_tick(&sched, now_ms, false);
    answer_all(N);
    ticks++;
    unsigned served = 0;
    for (unsigned i = 0; i < N; i++) {
      assert_true(peers[i].sends <= 1);
      served += peers[i].sends;
    }
    assert_int_equal(served, ticks * TR_CLOCK_PROBES_PER_MS < N ? ticks * TR_CLOCK_PROBES_PER_MS
                                                                 : N);
    if (served == N)
      break;
    now_ms++;
  }
  assert_int_equal(ticks, (N + TR_CLOCK_PROBES_PER_MS - 1) / TR_CLOCK_PROBES_PER_MS);

  /* 1,000 peers that all want a probe every 50 ms, against 400 per 50 ms: every period
   * stretches alike, no peer gets two probes more than another. */
  setup(NULL);
  for (unsigned i = 0; i < MAX_PEERS; i++)
    add(&peers[i], false);
  run(MAX_PEERS, 5, START_MS + 1000, false);
  unsigned lo = UINT32_MAX, hi = 0, total = 0;
  for (unsigned i = 0; i < MAX_PEERS; i++) {
    lo = peers[i].sends < lo ? peers[i].sends : lo;
    hi = peers[i].sends > hi ? peers[i].sends : hi;
    total += peers[i].sends;
  }
  assert_true(hi - lo <= 1);
  assert_true(lo >= 7);
  /* The budget of 1 s (the first tick's burst, then 8 a millisecond) was spent in full. */
  assert_int_equal(total, TR_CLOCK_PROBE_BUDGET_MAX + 1000 * TR_CLOCK_PROBES_PER_MS);
}

static void test_on_demand(void **state) {
  (void)state;
  fake *f = &peers[0], *unscheduled = &peers[1];
  /* Not scheduled (no feature, or closing): never probed. */
  tr_clock_probe_request(&sched, &unscheduled->probe, now_ms);
  assert_int_equal(unscheduled->sends, 0);
  add(f, false);
  f->drift_ppm = 200; /* a session period of 5 ms */
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 1);
  assert_int_equal(answer(f), 1);
  /* Younger than the session period: as fresh as the schedule keeps any. */
  now_ms += 4;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 1);
  now_ms++;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 2);
  /* A probe still out: the new one is wanted, and goes right after the exchange is done. */
  now_ms += 10;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 2);
  assert_true(f->probe.wanted);
  n_events = 0;
  assert_int_equal(answer(f), 1);
  assert_int_equal(f->sends, 3);
  assert_int_equal(n_events, 2);
  assert_memory_equal(events, "ds", 2);
  /* Drift unknown from this exchange on (the drift is read with each): a second. */
  f->drift_ppm = 0;
  assert_int_equal(answer(f), 1);
  now_ms += TR_CLOCK_PROBE_SESSION_MAX_MS - 1;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 3);
  now_ms++;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_int_equal(f->sends, 4);
}

static void test_busy_link(void **state) {
  (void)state;
  fake *f = &peers[0], *g = &peers[1];
  add(f, false);
  add(g, false);
  /* g's link is busy: it keeps its turn and spends no budget; f's send fails: no id spent. */
  g->send_rc = TR_ERR_AGAIN;
  f->send_rc = TR_ERR_CLOSED;
  sched.last_tick_ms = now_ms - 1;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->sends + g->sends, 0);
  assert_true(g->probe.wanted);
  assert_false(f->probe.wanted);
  g->send_rc = f->send_rc = 0;
  now_ms++;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->sends + g->sends, 2);
  assert_int_equal(f->probe_id + g->probe_id, 3); /* 1 and 2: none spent before */
  assert_false(g->probe.wanted);
  /* Wanted while busy, then the exchange in flight ends: it goes then. */
  assert_int_equal(answer(f), 1);
  now_ms += TR_CLOCK_PROBE_SESSION_MAX_MS;
  f->send_rc = TR_ERR_AGAIN;
  tr_clock_probe_request(&sched, &f->probe, now_ms);
  assert_true(f->probe.wanted);
  f->send_rc = 0;
  assert_int_equal(answer(g), 1); /* another peer's exchange ends: f's probe waits on */
  assert_int_equal(f->sends, 1);
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(f->sends, 2);
  assert_false(f->probe.wanted);
}

static void test_remove(void **state) {
  (void)state;
  enum { N = 5 };
  for (unsigned i = 0; i < N; i++)
    add(&peers[i], false);
  /* 2 closes while its probe is sent; the others' go, with ids 1 to 4 (none spent on 2). */
  peers[2].close_on_send = true;
  tr_clock_probe_tick(&sched, now_ms, false);
  uint64_t ids = 0;
  for (unsigned i = 0; i < N; i++)
    if (i != 2) {
      assert_int_equal(peers[i].sends, 1);
      ids |= 1ull << peers[i].probe_id;
    }
  assert_int_equal(ids, 0x1e);
  assert_int_equal(peers[2].sends, 0);
  assert_false(peers[2].probe.scheduled);
  /* A removed peer takes no answer and no request; removing twice is harmless. */
  tr_clock_probe_remove(&sched, &peers[3].probe);
  tr_clock_probe_remove(&sched, &peers[3].probe);
  assert_int_equal(answer(&peers[3]), 0);
  tr_clock_probe_request(&sched, &peers[3].probe, now_ms + 5000);
  assert_int_equal(peers[3].sends, 1);
  /* Two more go, one with its probe in flight, one idle: the one left is still probed, and
   * the removed never again. */
  assert_int_equal(answer(&peers[0]), 1);
  tr_clock_probe_remove(&sched, &peers[4].probe);
  tr_clock_probe_remove(&sched, &peers[0].probe);
  answer_all(N);
  now_ms += TR_CLOCK_PROBE_DENSE_MS;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(peers[1].sends, 2);
  tr_clock_probe_remove(&sched, &peers[1].probe);
  for (unsigned t = 1; t <= 3; t++)
    tr_clock_probe_tick(&sched, now_ms + t * TR_CLOCK_PROBE_TIMEOUT_MS, t % 2);
  for (unsigned i = 0; i < N; i++)
    assert_int_equal(peers[i].sends, i == 1 ? 2 : i == 2 ? 0 : 1);
  /* Nothing is left queued. */
  assert_null(tr_due_heap_first(&sched.idle));
  assert_null(tr_due_heap_first(&sched.in_flight));
}

static void test_tick_examines_only_due(void **state) {
  (void)state;
  /* 100 peers added now, 100 more 20 ms later, each group probed and answered at once: the
   * first is due again 50 ms after its probe (dense), the second 20 ms after that. */
  enum { N = 200 };
  for (unsigned i = 0; i < N / 2; i++)
    add(&peers[i], false);
  tr_clock_probe_tick(&sched, now_ms, false);
  answer_all(N);
  now_ms += 20;
  for (unsigned i = N / 2; i < N; i++)
    add(&peers[i], false);
  tr_clock_probe_tick(&sched, now_ms, false);
  answer_all(N);
  for (unsigned i = 0; i < N; i++)
    assert_int_equal(peers[i].sends, 1);
  /* A tick with none due looks at none of them; in a session too, once its first tick has
   * re-read every peer's period. */
  uint64_t examined = sched.examined;
  now_ms += 5;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(sched.examined, examined);
  now_ms += 5;
  tr_clock_probe_tick(&sched, now_ms, true);
  examined = sched.examined;
  now_ms += 5;
  tr_clock_probe_tick(&sched, now_ms, true);
  assert_int_equal(sched.examined, examined);
  /* When the first group is due, the tick looks at it alone, and probes it. */
  now_ms = START_MS + TR_CLOCK_PROBE_DENSE_MS;
  tr_clock_probe_tick(&sched, now_ms, true);
  assert_int_equal(sched.examined, examined + N / 2);
  for (unsigned i = 0; i < N; i++)
    assert_int_equal(peers[i].sends, i < N / 2 ? 2 : 1);
}

/* The next tick's work: none scheduled; a new peer due at once; then its next probe, or the
 * timeout of the exchange in flight, whichever comes first; a busy link's probe stays due. */
static void test_next_due(void **state) {
  (void)state;
  assert_true(tr_clock_probe_next_due_ms(&sched) == UINT64_MAX);
  fake *f = first_probe(false); /* out at START_MS: its timeout is the only thing due */
  assert_int_equal(tr_clock_probe_next_due_ms(&sched), START_MS + TR_CLOCK_PROBE_TIMEOUT_MS);
  assert_int_equal(answer(f), 1);
  assert_int_equal(tr_clock_probe_next_due_ms(&sched), START_MS + TR_CLOCK_PROBE_DENSE_MS);
  fake *g = &peers[1];
  now_ms += 10;
  add(g, false);
  assert_int_equal(tr_clock_probe_next_due_ms(&sched), now_ms);
  g->send_rc = TR_ERR_AGAIN;
  tr_clock_probe_tick(&sched, now_ms, false);
  assert_int_equal(tr_clock_probe_next_due_ms(&sched), now_ms); /* still wanted */
  tr_clock_probe_remove(&sched, &g->probe);
  tr_clock_probe_remove(&sched, &f->probe);
  assert_true(tr_clock_probe_next_due_ms(&sched) == UINT64_MAX);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(test_exchange, setup),
      cmocka_unit_test_setup(test_follow_up, setup),
      cmocka_unit_test_setup(test_stale_and_mismatched, setup),
      cmocka_unit_test_setup(test_timeout, setup),
      cmocka_unit_test_setup(test_schedule_periods, setup),
      cmocka_unit_test_setup(test_period_clamping, setup),
      cmocka_unit_test_setup(test_budget, setup),
      cmocka_unit_test_setup(test_rotation_fairness, setup),
      cmocka_unit_test_setup(test_on_demand, setup),
      cmocka_unit_test_setup(test_busy_link, setup),
      cmocka_unit_test_setup(test_remove, setup),
      cmocka_unit_test_setup(test_tick_examines_only_due, setup),
      cmocka_unit_test_setup(test_next_due, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
