/* fuzz_clock_frames.c: what an agent's (or a regional's) clock frames do at the service, past
 * frame decoding, as link_server.c's on_frame dispatches them: ClockProbe answers and
 * ClockFollowUps into the probe schedule (relay/clock/clock_probe.c) and from there, as whole
 * exchanges, into the host's estimator (relay/clock/clocksync.c); RelayedClockExchanges mapped
 * through a regional's estimate into a relayed host's (tr_link_server_relayed_exchange); and
 * HostClockSnapshots into the host table (tr_hosts_add_clock_snapshot). Between frames the
 * schedule ticks and sends probes (their ids and t1 are the harness's), and both estimators are
 * read as the trace output reads them.
 *
 * Checked beyond memory safety: a refused frame is one the protocol refuses (TR_ERR_PROTO for
 * a relayed exchange with a time missing, past 2^62 or out of order; an answer or follow-up
 * out of range only when it matches the probe in flight); a snapshot kept holds 1..6 clocks
 * with ids 1..63; an estimate that maps a time gives a non-negative error bound.
 *
 * Input: a stream of relay frames (uint32 LE length + RelayFrame), as on the link. The first
 * byte sets the harness: bit 0 the regional's link answers with follow-ups, bits 1-7 how many
 * ms the clocks move per frame. A Heartbeat frame's timestamp moves them that many more ns. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_frames.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/clock/clock_probe.h"
#include "relay/clock/clocksync.h"
#include "relay/link/relay_frame.h"
#include "service/hosts.h"
#include "service/link_server.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  tr_log_set_level(TR_LOG_ERROR);
  return 0;
}

/* The service's time, moved by the input. */
static int64_t now_ns;
static uint64_t now_ms(void) { return (uint64_t)now_ns / 1000000u; }

/* ---- the probe schedule's transport: the regional's direct link ---- */

static uint64_t last_sent_id;

static int probe_send(void *data, uint64_t probe_id, int64_t *t1) {
  (void)data;
  last_sent_id = probe_id;
  *t1 = now_ns;
  return 0;
}

static int64_t probe_sent_time(void *data, int64_t t1) {
  (void)data;
  return t1;
}

static double probe_drift_ppm(void *data) {
  tr_host *h = data;
  return tr_clocksync_drift_ppm(h->clock);
}

/* As link_server.c's: an exchange the schedule completed goes to the host's estimator. */
static void probe_done(void *data, uint64_t probe_id, const struct tr_clocksync_probe *ex) {
  (void)probe_id;
  tr_host *h = data;
  CHECK(ex->t4 >= ex->t1 && ex->t3 >= ex->t2);
  tr_clocksync_add_probe(h->clock, ex);
}

static const struct tr_clock_probe_ops probe_ops = {
    .send = probe_send, .sent_time = probe_sent_time, .drift_ppm = probe_drift_ppm,
    .done = probe_done};

/* ---- checks ---- */

static void read_estimate(const tr_host *h) {
  const int64_t at[] = {0, now_ns, now_ns / 2, (INT64_C(1) << 62) - 1};
  for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
    int64_t mapped;
    if (tr_clocksync_map(h->clock, at[i], &mapped) == 0)
      CHECK(tr_clocksync_error_bound(h->clock, at[i]) >= 0);
  }
  tr_clocksync_offset_ns(h->clock);
  tr_clocksync_rtt_ns(h->clock);
}

static bool in_range(uint64_t t) { return t < (1ull << 62); }

static void on_snapshot(tr_host *h, const Tracerelay__HostClockSnapshot *m) {
  uint64_t before = h->clock_snapshots_taken;
  int rc = tr_hosts_add_clock_snapshot(h, m, now_ns);
  if (rc < 0) {
    CHECK(rc == TR_ERR_PROTO && h->clock_snapshots_taken == before);
    return;
  }
  CHECK(h->clock_snapshots_taken == before + 1);
  const struct tr_host_clock_snapshot *e =
      &h->clock_snapshots[before % TR_HOST_CLOCK_SNAPSHOTS];
  CHECK(e->snap.n >= 1 && e->snap.n <= TR_CLOCK_SNAPSHOT_MAX);
  for (uint32_t i = 0; i < e->snap.n; i++)
    CHECK(e->snap.clocks[i].clock_id >= 1 && e->snap.clocks[i].clock_id < 64);
}

static void on_relayed(tr_host *host, const tr_host *via,
                       const Tracerelay__RelayedClockExchange *x) {
  struct tr_clocksync_probe ex;
  int rc = tr_link_server_relayed_exchange(host, via, x, &ex);
  bool valid = x->has_t1 && x->has_t2 && x->has_t3 && x->has_t4 && in_range(x->t1) &&
               in_range(x->t2) && in_range(x->t3) && in_range(x->t4) && x->t3 >= x->t2 &&
               x->t4 >= x->t1;
  CHECK((rc == TR_ERR_PROTO) == !valid);
}

static void on_answer(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                      const Tracerelay__ClockProbe *a) {
  bool matches = p->state == TR_CLOCK_PROBE_SENT && a->probe_id == p->id;
  int rc = tr_clock_probe_answer(s, p, a->probe_id, a->t2, a->t3, now_ns, now_ms());
  if (rc < 0)
    CHECK(matches && (!in_range(a->t2) || !in_range(a->t3) || a->t3 < a->t2));
}

static void on_follow_up(struct tr_clock_probe_sched *s, struct tr_clock_probe_peer *p,
                         const Tracerelay__ClockFollowUp *fu) {
  bool matches = p->state == TR_CLOCK_PROBE_ANSWERED && fu->probe_id == p->id;
  int rc = tr_clock_probe_follow_up(s, p, fu->probe_id, fu->has_t3, fu->t3,
                                    fu->has_t3_late && fu->t3_late, now_ms());
  if (rc < 0)
    CHECK(matches && fu->has_t3 && !in_range(fu->t3));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  bool follow_up = data[0] & 1;
  int64_t step_ns = (int64_t)(data[0] >> 1) * 1000000;
  data++;
  size--;
  now_ns = 1000000000;
  tr_hosts *hs;
  if (tr_hosts_new(NULL, NULL, &hs) < 0)
    return 0;
  tr_host *regional, *host;
  if (tr_hosts_get(hs, "regional-a", &regional) < 0 || tr_hosts_get(hs, "web-1", &host) < 0) {
    tr_hosts_free(hs);
    return 0;
  }
  struct tr_clock_probe_sched sched;
  struct tr_clock_probe_peer peer = {0};
  tr_clock_probe_sched_init(&sched, &probe_ops);
  tr_clock_probe_add(&sched, &peer, regional, follow_up, now_ms());

  const uint8_t *payload;
  size_t len;
  while (fuzz_next_frame(&data, &size, &payload, &len)) {
    Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
    now_ns += step_ns;
    tr_clock_probe_tick(&sched, now_ms(), false);
    if (f == NULL)
      continue;
    switch (f->msg_case) {
    case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
      if (f->heartbeat->has_timestamp_ns && f->heartbeat->timestamp_ns < (1ull << 40))
        now_ns += (int64_t)f->heartbeat->timestamp_ns;
      break;
    case TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE:
      on_answer(&sched, &peer, f->clock_probe);
      break;
    case TRACERELAY__RELAY_FRAME__MSG_CLOCK_FOLLOW_UP:
      on_follow_up(&sched, &peer, f->clock_follow_up);
      break;
    case TRACERELAY__RELAY_FRAME__MSG_RELAYED_CLOCK_EXCHANGE:
      on_relayed(host, regional, f->relayed_clock_exchange);
      break;
    case TRACERELAY__RELAY_FRAME__MSG_HOST_CLOCK_SNAPSHOT:
      on_snapshot(host, f->host_clock_snapshot);
      break;
    default:
      break;
    }
    tr_relay_frame_free(f);
    read_estimate(regional);
    read_estimate(host);
  }
  tr_clock_probe_remove(&sched, &peer);
  tr_hosts_free(hs);
  return 0;
}
