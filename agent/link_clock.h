/* link_clock.h: the agent's side of the link's clocks (docs/relay-protocol.md, Clock probes and
 * Host clock snapshots): answers to the service's ClockProbes with their ClockFollowUps, and
 * the host's builtin clocks as HostClockSnapshots on the sessions' schedule.
 *
 * - A probe is answered at once: t2 is when it reached the socket (the caller's
 *   tr_tls_uv_read_time_checked, before decryption); the exact t3, when the encrypted answer
 *   left (the kernel's send stamp, tr_tls_uv_sent_time), follows in a ClockFollowUp once the
 *   kernel has it: TR_LINK_FOLLOW_UP_DELAY_MS later on an idle link; on a saturated one the
 *   answer first waits for the data queued before it to reach the kernel, and the follow-up
 *   for its stamp (asked again at doubling intervals up to TR_LINK_FOLLOW_UP_MAX_STEP_MS, for at
 *   most TR_LINK_FOLLOW_UP_MAX_WAIT_MS; then the time it went to the kernel). One follow-up is
 *   owed at a time, on the link the answer went on.
 * - Snapshots: one whenever a data source starts or stops, then every period while one runs:
 *   the shortest snapshot_interval_ms a session gave since the host became active (at least
 *   TR_LINK_CLOCK_SNAPSHOT_MIN_MS), else the agent's own interval.
 * Everything runs on the loop's thread; the one handle is the follow-up timer. */
#ifndef TR_LINK_CLOCK_H
#define TR_LINK_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "relay/link/relay_link.h"

/* A probe's ClockFollowUp waits this long after the answer, so that the service reads the
 * answer's segment alone and its receive stamp is the answer's arrival, not the follow-up's. */
#define TR_LINK_FOLLOW_UP_DELAY_MS 1
#define TR_LINK_FOLLOW_UP_MAX_STEP_MS 32
#define TR_LINK_FOLLOW_UP_MAX_WAIT_MS 1500 /* within the service's wait (3 s, clock_probe.h) */
#define TR_LINK_CLOCK_SNAPSHOT_MS 10000 /* traced's default snapshot_interval_ms */
#define TR_LINK_CLOCK_SNAPSHOT_MIN_MS 100 /* a session cannot ask for more than 10 a second */

/* Fields are link_clock.c's. */
typedef struct tr_link_clock {
  uv_loop_t *loop;
  uv_timer_t follow_up_timer; /* sends the ClockFollowUp of the last answer, a little later */
  tr_relay_link *follow_up_link; /* where it is owed; NULL: none */
  Tracerelay__ClockFollowUp follow_up;
  int64_t follow_up_sent_ns;   /* names the answer for tr_tls_uv_sent_time */
  uint64_t follow_up_wait_ms;  /* the timer's last delay: doubles while the stamp is pending */
  uint64_t follow_up_since_ms; /* when the answer was written */
  void (*closed)(void *data);  /* after tr_link_clock_close */
  void *closed_data;
  bool snap_active;            /* a data source runs: a snapshot every period */
  uint64_t snap_interval_ms, snap_next_ms;
  uint64_t snap_session_ms;    /* the sessions' snapshot_interval_ms while active, 0: none */
} tr_link_clock;

/* snapshot_interval_ms: the period without a session's; 0: TR_LINK_CLOCK_SNAPSHOT_MS. c must
 * not move afterwards. */
void tr_link_clock_init(tr_link_clock *c, uv_loop_t *loop, uint64_t snapshot_interval_ms);
/* Answers probe q, which reached the socket at t2, on link; with follow_up (the feature was
 * accepted) its ClockFollowUp goes later. */
void tr_link_clock_answer(tr_link_clock *c, tr_relay_link *link, const Tracerelay__ClockProbe *q,
                          int64_t t2, bool follow_up);
/* The link the answer went on is closing: the follow-up owed goes with it. */
void tr_link_clock_link_down(tr_link_clock *c);

/* Sends the host's builtin clocks, read now, as a HostClockSnapshot on link. */
int tr_link_clock_send_snapshot(tr_relay_link *link);
/* A data source started or stopped: active (some data source runs), and the session's
 * snapshot_interval_ms (0 if none). The caller sends a snapshot now. */
void tr_link_clock_schedule(tr_link_clock *c, bool active, uint32_t interval_ms);
/* Whether a periodic snapshot is due at now_ms; if so the next one is scheduled. */
bool tr_link_clock_snapshot_due(tr_link_clock *c, uint64_t now_ms);

/* Closes the timer; closed(data) runs once it is closed. */
void tr_link_clock_close(tr_link_clock *c, void (*closed)(void *data), void *data);

#endif
