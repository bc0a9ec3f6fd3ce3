/* link_clock.c: the agent's side of the link's clocks (see link_clock.h). */
#include "agent/link_clock.h"

#include "relay/clock/clock.h"

void tr_link_clock_init(tr_link_clock *c, uv_loop_t *loop, uint64_t snapshot_interval_ms) {
  *c = (tr_link_clock){.loop = loop};
  c->snap_interval_ms = snapshot_interval_ms ? snapshot_interval_ms : TR_LINK_CLOCK_SNAPSHOT_MS;
  uv_timer_init(loop, &c->follow_up_timer);
  c->follow_up_timer.data = c;
}

/* ---- probes ---- */

/* Sends the ClockFollowUp once the answer's kernel send stamp is there: on a saturated link
 * the answer waits behind queued data first (tr_tls_uv_write_stamped), so this asks again, at
 * doubling intervals, for up to TR_LINK_FOLLOW_UP_MAX_WAIT_MS. */
static void on_follow_up_timer(uv_timer_t *t) {
  tr_link_clock *c = t->data;
  if (c->follow_up_link == NULL || tr_relay_link_closing(c->follow_up_link))
    return;
  tr_tls_uv_conn *conn = tr_relay_link_conn(c->follow_up_link);
  uint64_t now = uv_now(c->loop);
  if (tr_tls_uv_sent_time_pending(conn, c->follow_up_sent_ns) &&
      now - c->follow_up_since_ms < TR_LINK_FOLLOW_UP_MAX_WAIT_MS) {
    if (c->follow_up_wait_ms < TR_LINK_FOLLOW_UP_MAX_STEP_MS)
      c->follow_up_wait_ms *= 2;
    uv_timer_start(&c->follow_up_timer, on_follow_up_timer, c->follow_up_wait_ms, 0);
    return;
  }
  if (c->follow_up.has_t3) { /* the kernel's own send stamp of the answer, once there */
    c->follow_up.has_t3_late = c->follow_up.t3_late =
        tr_tls_uv_sent_time_pending(conn, c->follow_up_sent_ns);
    c->follow_up.t3 = (uint64_t)tr_tls_uv_sent_time(conn, c->follow_up_sent_ns);
  }
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_CLOCK_FOLLOW_UP;
  f.clock_follow_up = &c->follow_up;
  tr_relay_link_send(c->follow_up_link, &f);
}

/* Two-step with the follow-up: an encrypted message cannot carry its own send time. */
void tr_link_clock_answer(tr_link_clock *c, tr_relay_link *link, const Tracerelay__ClockProbe *q,
                          int64_t t2, bool follow_up) {
  Tracerelay__ClockProbe a = TRACERELAY__CLOCK_PROBE__INIT;
  a.has_probe_id = a.has_t1 = a.has_t2 = a.has_t3 = 1;
  a.probe_id = q->probe_id;
  a.t1 = q->t1;
  a.t2 = (uint64_t)t2;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE;
  f.clock_probe = &a;
  a.t3 = tr_clock_boottime_ns();
  int64_t sent = 0;
  if (tr_relay_link_send_stamped(link, &f, &sent) < 0 || !follow_up)
    return;
  Tracerelay__ClockFollowUp fu = TRACERELAY__CLOCK_FOLLOW_UP__INIT;
  fu.has_probe_id = 1;
  fu.probe_id = q->probe_id;
  fu.has_t3 = sent > 0;
  fu.t3 = (uint64_t)sent;
  c->follow_up = fu;
  c->follow_up_link = link;
  c->follow_up_sent_ns = sent;
  c->follow_up_wait_ms = TR_LINK_FOLLOW_UP_DELAY_MS;
  c->follow_up_since_ms = uv_now(c->loop);
  uv_timer_start(&c->follow_up_timer, on_follow_up_timer, TR_LINK_FOLLOW_UP_DELAY_MS, 0);
}

void tr_link_clock_link_down(tr_link_clock *c) {
  uv_timer_stop(&c->follow_up_timer);
  c->follow_up_link = NULL;
}

/* ---- snapshots ---- */

int tr_link_clock_send_snapshot(tr_relay_link *link) {
  struct tr_clock_snapshot snap;
  Tracerelay__HostClockSnapshot__Clock clocks[TR_CLOCK_SNAPSHOT_MAX];
  Tracerelay__HostClockSnapshot__Clock *ptrs[TR_CLOCK_SNAPSHOT_MAX];
  Tracerelay__HostClockSnapshot m = TRACERELAY__HOST_CLOCK_SNAPSHOT__INIT;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  int rc = tr_clock_snapshot(&snap);
  if (rc < 0)
    return rc;
  for (uint32_t i = 0; i < snap.n; i++) {
    clocks[i] = (Tracerelay__HostClockSnapshot__Clock)TRACERELAY__HOST_CLOCK_SNAPSHOT__CLOCK__INIT;
    clocks[i].has_clock_id = clocks[i].has_timestamp = 1;
    clocks[i].clock_id = snap.clocks[i].clock_id;
    clocks[i].timestamp = snap.clocks[i].ts_ns;
    ptrs[i] = &clocks[i];
  }
  m.n_clocks = snap.n;
  m.clocks = ptrs;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HOST_CLOCK_SNAPSHOT;
  f.host_clock_snapshot = &m;
  return tr_relay_link_send(link, &f);
}

static uint64_t snap_period(const tr_link_clock *c) {
  return c->snap_session_ms ? c->snap_session_ms : c->snap_interval_ms;
}

void tr_link_clock_schedule(tr_link_clock *c, bool active, uint32_t interval_ms) {
  if (!active || !c->snap_active)
    c->snap_session_ms = 0;
  if (active && interval_ms > 0) {
    uint64_t ms = interval_ms < TR_LINK_CLOCK_SNAPSHOT_MIN_MS ? TR_LINK_CLOCK_SNAPSHOT_MIN_MS
                                                              : interval_ms;
    if (c->snap_session_ms == 0 || ms < c->snap_session_ms)
      c->snap_session_ms = ms;
  }
  c->snap_active = active;
  c->snap_next_ms = uv_now(c->loop) + snap_period(c);
}

bool tr_link_clock_snapshot_due(tr_link_clock *c, uint64_t now_ms) {
  if (!c->snap_active || now_ms < c->snap_next_ms)
    return false;
  c->snap_next_ms = now_ms + snap_period(c);
  return true;
}

/* ---- closing ---- */

static void on_timer_closed(uv_handle_t *h) {
  tr_link_clock *c = h->data;
  c->closed(c->closed_data);
}

void tr_link_clock_close(tr_link_clock *c, void (*closed)(void *data), void *data) {
  c->closed = closed;
  c->closed_data = data;
  uv_close((uv_handle_t *)&c->follow_up_timer, on_timer_closed);
}
