/* test_relay_session.c: the link bookkeeping without a network. An agent's spill queue and a
 * service's peer state are driven through cuts of the link at chosen points; after each, every
 * batch must be stored once or counted lost once, with exact per-producer counts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "relay/link/relay_session.h"
#include "relay/base/tr_error.h"

#define ID 0x1234abcdull
#define FRAME 300u

/* The service end of the test link: which seqs were stored, and how often. */
typedef struct service {
  tr_relay_peer peer;
  int stored[64];
} service;

/* Queues a fake batch (its bytes name its seq) of `chunks` chunks of 100 bytes of one producer. */
static int queue(tr_relay_agent *a, uint32_t producer, uint64_t chunks) {
  uint8_t *frame = malloc(FRAME);
  uint64_t seq = a->next_seq;
  memcpy(frame, &seq, sizeof seq);
  tr_relay_tally *t = malloc(sizeof *t);
  *t = (tr_relay_tally){.producer_id = producer, .chunks = chunks, .bytes = 100 * chunks};
  return tr_relay_agent_queue(a, seq, frame, FRAME, t, 1);
}

/* Sends up to n batches; the service stores the first `deliver` of them (the rest are lost
 * with the connection). Returns how many were sent. */
static int send_some(tr_relay_agent *a, service *s, int n, int deliver) {
  int sent = 0;
  const uint8_t *frame;
  size_t len;
  uint64_t seq;
  while (sent < n && tr_relay_agent_next(a, &frame, &len, &seq) == 1) {
    uint64_t in_frame;
    memcpy(&in_frame, frame, sizeof in_frame);
    assert_int_equal(in_frame, seq);
    if (sent < deliver) {
      int rc = tr_relay_peer_batch(&s->peer, seq);
      assert_true(rc >= 0);
      if (rc == 1)
        s->stored[seq]++;
    }
    sent++;
  }
  return sent;
}

static void link_up(tr_relay_agent *a, service *s) {
  uint64_t welcome;
  assert_int_equal(tr_relay_peer_hello(&s->peer, a->instance_id, a->acked_seq, &welcome), 0);
  assert_int_equal(tr_relay_agent_resume(a, welcome), 0);
}

static uint64_t lost_chunks(const tr_relay_agent *a, uint32_t producer) {
  for (size_t i = 0; i < a->n_lost; i++)
    if (a->lost[i].producer_id == producer)
      return a->lost[i].chunks;
  return 0;
}

static void test_resend_after_reconnect(void **state) {
  (void)state;
  /* The cut happens after the service stored 1..3 but only acked 2, then after it stored
   * only 1..2 of 1..3: both resume with nothing lost and nothing stored twice. */
  for (int delivered = 2; delivered <= 3; delivered++) {
    tr_relay_agent a;
    service s = {0};
    tr_relay_peer_init(&s.peer);
    assert_int_equal(tr_relay_agent_init(&a, ID, 0), 0);
    for (int i = 0; i < 5; i++)
      assert_int_equal(queue(&a, 1, 2), 0);
    const uint8_t *f;
    size_t len;
    uint64_t seq;
    assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 0); /* no Welcome yet */
    link_up(&a, &s);
    assert_int_equal(send_some(&a, &s, 3, delivered), 3);
    assert_int_equal(tr_relay_agent_ack(&a, 2), 0);
    assert_int_equal(a.held_bytes, 3 * FRAME);
    tr_relay_agent_disconnected(&a);
    assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 0);
    assert_int_equal(queue(&a, 1, 2), 0); /* seq 6, while the link is down */
    link_up(&a, &s);
    assert_int_equal(send_some(&a, &s, 100, 100), 6 - delivered);
    assert_int_equal(tr_relay_agent_ack(&a, s.peer.stored_seq), 0);
    for (int i = 1; i <= 6; i++)
      assert_int_equal(s.stored[i], 1);
    assert_int_equal(s.peer.duplicate_batches, 0);
    assert_int_equal(s.peer.lost_batches, 0);
    assert_int_equal(a.lost_batches, 0);
    assert_int_equal(a.held_bytes, 0);
    assert_null(a.head);
    /* Numbering goes on after the reconnect. */
    assert_int_equal(a.next_seq, 7);
    tr_relay_agent_free(&a);
  }
}

static void test_spill_bound_drops_oldest(void **state) {
  (void)state;
  tr_relay_agent a;
  service s = {0};
  tr_relay_peer_init(&s.peer);
  assert_int_equal(tr_relay_agent_init(&a, ID, 3 * FRAME), 0);
  /* Link down from the start: 7 batches, room for 3. Seqs 1..4 go, never sent. */
  for (uint32_t i = 0; i < 7; i++)
    assert_int_equal(queue(&a, 1 + i % 2, i + 1), 0);
  assert_int_equal(a.held_bytes, 3 * FRAME);
  assert_int_equal(a.lost_batches, 4);
  assert_int_equal(a.lost_frame_bytes, 4 * FRAME);
  /* producer 1 had batches 1 and 3 (1 + 3 chunks), producer 2 batches 2 and 4 (2 + 4). */
  assert_int_equal(lost_chunks(&a, 1), 4);
  assert_int_equal(lost_chunks(&a, 2), 6);
  assert_int_equal(a.lost[0].bytes + a.lost[1].bytes, 100 * 10);

  link_up(&a, &s);
  assert_int_equal(send_some(&a, &s, 100, 100), 3);
  /* The service sees the same 4 batches as a gap, and stores the rest. */
  assert_int_equal(s.peer.lost_batches, 4);
  assert_int_equal(s.stored[5] + s.stored[6] + s.stored[7], 3);
  assert_int_equal(s.peer.stored_seq, 7);

  /* A batch larger than the whole spill queue is refused and counted too. */
  uint8_t *big = malloc(4 * FRAME);
  tr_relay_tally *t = malloc(sizeof *t);
  *t = (tr_relay_tally){.producer_id = 3, .chunks = 9, .bytes = 900};
  assert_int_equal(tr_relay_agent_queue(&a, 8, big, 4 * FRAME, t, 1), TR_ERR_TOO_BIG);
  assert_int_equal(lost_chunks(&a, 3), 9);
  assert_int_equal(a.next_seq, 9);
  /* A wrong seq is the caller's bug. */
  assert_int_equal(tr_relay_agent_queue(&a, 3, malloc(8), 8, NULL, 0), TR_ERR_INVAL);
  tr_relay_agent_free(&a);
}

/* Batches sent just before a cut and then dropped: the Welcome decides which count as lost. */
static void test_dropped_after_send_settled_by_welcome(void **state) {
  (void)state;
  tr_relay_agent a;
  service s = {0};
  tr_relay_peer_init(&s.peer);
  assert_int_equal(tr_relay_agent_init(&a, ID, 3 * FRAME), 0);
  link_up(&a, &s);
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue(&a, 1, 10), 0);
  /* 1..3 written, the service got 1..2, no ack came back. */
  assert_int_equal(send_some(&a, &s, 3, 2), 3);
  tr_relay_agent_disconnected(&a);
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue(&a, 2, 1), 0);
  /* 1..3 were pushed out, but the service may have them: not counted yet. */
  assert_int_equal(a.lost_batches, 0);
  link_up(&a, &s); /* Welcome says 2: batch 3 never arrived */
  assert_int_equal(a.lost_batches, 1);
  assert_int_equal(lost_chunks(&a, 1), 10);
  assert_int_equal(lost_chunks(&a, 2), 0);
  assert_int_equal(send_some(&a, &s, 100, 100), 3);
  assert_int_equal(s.peer.lost_batches, 1); /* the same batch 3, from the service's side */
  assert_int_equal(s.stored[1] + s.stored[2] + s.stored[4] + s.stored[5] + s.stored[6], 5);
  assert_int_equal(s.stored[3], 0);
  tr_relay_agent_free(&a);
}

/* While connected, a sent batch pushed out of the queue is stored if an ack covers it. */
static void test_dropped_after_send_settled_by_ack(void **state) {
  (void)state;
  tr_relay_agent a;
  service s = {0};
  tr_relay_peer_init(&s.peer);
  assert_int_equal(tr_relay_agent_init(&a, ID, 2 * FRAME), 0);
  link_up(&a, &s);
  assert_int_equal(queue(&a, 1, 1), 0);
  assert_int_equal(queue(&a, 1, 1), 0);
  assert_int_equal(send_some(&a, &s, 2, 2), 2);
  assert_int_equal(queue(&a, 1, 1), 0); /* pushes out 1, sent and in doubt */
  assert_int_equal(a.lost_batches, 0);
  assert_int_equal(tr_relay_agent_ack(&a, 2), 0);
  assert_null(a.doubt_head);
  assert_int_equal(a.lost_batches, 0);
  assert_int_equal(a.held_bytes, FRAME);
  tr_relay_agent_free(&a);
}

static void test_agent_protocol_errors(void **state) {
  (void)state;
  tr_relay_agent a;
  assert_int_equal(tr_relay_agent_init(&a, 0, 0), TR_ERR_INVAL);
  assert_int_equal(tr_relay_agent_init(&a, ID, 0), 0);
  assert_int_equal(tr_relay_agent_ack(&a, 1), TR_ERR_PROTO); /* before Welcome */
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue(&a, 1, 1), 0);
  assert_int_equal(tr_relay_agent_resume(&a, 4), TR_ERR_PROTO); /* never queued */
  assert_int_equal(tr_relay_agent_resume(&a, 0), 0);
  const uint8_t *f;
  size_t len;
  uint64_t seq;
  assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 1);
  assert_int_equal(seq, 1);
  assert_int_equal(tr_relay_agent_ack(&a, 2), TR_ERR_PROTO); /* not sent yet */
  assert_int_equal(tr_relay_agent_ack(&a, 1), 0);
  assert_int_equal(tr_relay_agent_ack(&a, 1), 0); /* repeated: harmless */
  tr_relay_agent_disconnected(&a);
  assert_int_equal(tr_relay_agent_resume(&a, 0), 0); /* service restarted: resend 2..3 */
  assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 1);
  assert_int_equal(seq, 2);
  tr_relay_agent_disconnected(&a);
  assert_int_equal(tr_relay_agent_resume(&a, 1), 0);
  assert_int_equal(tr_relay_agent_ack(&a, 1), 0);
  tr_relay_agent_disconnected(&a);
  tr_relay_agent_free(&a);

  /* A known service forgetting what it acked is a protocol error. */
  assert_int_equal(tr_relay_agent_init(&a, ID, 0), 0);
  for (int i = 0; i < 3; i++)
    assert_int_equal(queue(&a, 1, 1), 0);
  assert_int_equal(tr_relay_agent_resume(&a, 0), 0);
  assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 1);
  assert_int_equal(tr_relay_agent_next(&a, &f, &len, &seq), 1);
  assert_int_equal(tr_relay_agent_ack(&a, 2), 0);
  tr_relay_agent_disconnected(&a);
  assert_int_equal(tr_relay_agent_resume(&a, 1), TR_ERR_PROTO);
  tr_relay_agent_free(&a);
}

static void test_service_duplicates_and_gaps(void **state) {
  (void)state;
  tr_relay_peer p;
  tr_relay_peer_init(&p);
  uint64_t welcome = 99;
  assert_int_equal(tr_relay_peer_batch(&p, 1), TR_ERR_PROTO); /* before Hello */
  assert_int_equal(tr_relay_peer_hello(&p, 0, 0, &welcome), TR_ERR_PROTO);
  assert_int_equal(tr_relay_peer_hello(&p, ID, 0, &welcome), 0);
  assert_int_equal(welcome, 0);
  assert_int_equal(tr_relay_peer_batch(&p, 0), TR_ERR_PROTO);
  assert_int_equal(tr_relay_peer_batch(&p, 1), 1);
  assert_int_equal(tr_relay_peer_batch(&p, 2), 1);
  assert_int_equal(tr_relay_peer_batch(&p, 2), 0);
  assert_int_equal(tr_relay_peer_batch(&p, 1), 0);
  assert_int_equal(p.duplicate_batches, 2);
  assert_int_equal(tr_relay_peer_batch(&p, 6), 1); /* 3, 4, 5 dropped by the agent */
  assert_int_equal(p.lost_batches, 3);
  assert_int_equal(tr_relay_peer_batch(&p, 4), 0); /* too late: counted as a duplicate */
  assert_int_equal(p.duplicate_batches, 3);
  assert_int_equal(p.stored_seq, 6);

  /* Same instance reconnecting: told where to resume. */
  assert_int_equal(tr_relay_peer_hello(&p, ID, 5, &welcome), 0);
  assert_int_equal(welcome, 6);
  assert_int_equal(tr_relay_peer_hello(&p, ID, 7, &welcome), TR_ERR_PROTO);
  /* A restarted agent: new numbering, nothing known, counters kept. */
  assert_int_equal(tr_relay_peer_hello(&p, ID + 1, 0, &welcome), 0);
  assert_int_equal(welcome, 0);
  assert_int_equal(p.agent_restarts, 1);
  assert_int_equal(tr_relay_peer_batch(&p, 1), 1);
  assert_int_equal(p.lost_batches, 3);

  /* A restarted service meets an agent that was acked up to 40: 41 is no gap. */
  tr_relay_peer_init(&p);
  assert_int_equal(tr_relay_peer_hello(&p, ID, 40, &welcome), 0);
  assert_int_equal(welcome, 0);
  assert_int_equal(tr_relay_peer_batch(&p, 41), 1);
  assert_int_equal(p.lost_batches, 0);
  assert_int_equal(p.agent_restarts, 0);
}

static void test_features(void **state) {
  (void)state;
  uint64_t agent = TR_RELAY_FEATURE_ZSTD | TR_RELAY_FEATURE_CLOCK_PROBES | (1ull << 40);
  uint64_t service = TR_RELAY_FEATURES_ALL;
  uint64_t accepted = tr_relay_features_negotiate(service, agent);
  assert_int_equal(accepted, TR_RELAY_FEATURE_ZSTD | TR_RELAY_FEATURE_CLOCK_PROBES);
  assert_int_equal(tr_relay_features_check(agent, accepted), 0);
  assert_int_equal(tr_relay_features_check(agent, accepted | TR_RELAY_FEATURE_AGENT_STATS),
                   TR_ERR_PROTO);
  assert_int_equal(tr_relay_features_negotiate(service, 0), 0);
  assert_int_equal(TR_RELAY_FEATURE_ZSTD, 1);
}

static void test_heartbeat(void **state) {
  (void)state;
  tr_relay_heartbeat hb;
  assert_int_equal(tr_relay_heartbeat_init(&hb, 5, 5, 0), TR_ERR_INVAL);
  assert_int_equal(tr_relay_heartbeat_init(&hb, 0, 0, 1000), 0);
  assert_int_equal(hb.interval_ns, TR_RELAY_HEARTBEAT_INTERVAL_NS);
  assert_int_equal(tr_relay_heartbeat_init(&hb, 100, 400, 1000), 0);
  assert_false(tr_relay_heartbeat_due(&hb, 1099));
  assert_true(tr_relay_heartbeat_due(&hb, 1100));
  assert_int_equal(tr_relay_heartbeat_deadline(&hb), 1100);
  tr_relay_heartbeat_sent(&hb, 1100);
  assert_false(tr_relay_heartbeat_due(&hb, 1150));
  tr_relay_heartbeat_sent(&hb, 900); /* time never goes back */
  assert_int_equal(hb.last_sent_ns, 1100);
  assert_false(tr_relay_heartbeat_dead(&hb, 1399));
  assert_true(tr_relay_heartbeat_dead(&hb, 1400));
  tr_relay_heartbeat_heard(&hb, 1350);
  assert_false(tr_relay_heartbeat_dead(&hb, 1400));
  assert_int_equal(tr_relay_heartbeat_deadline(&hb), 1200);
  tr_relay_heartbeat_sent(&hb, 1700);
  assert_int_equal(tr_relay_heartbeat_deadline(&hb), 1750);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resend_after_reconnect),
      cmocka_unit_test(test_spill_bound_drops_oldest),
      cmocka_unit_test(test_dropped_after_send_settled_by_welcome),
      cmocka_unit_test(test_dropped_after_send_settled_by_ack),
      cmocka_unit_test(test_agent_protocol_errors),
      cmocka_unit_test(test_service_duplicates_and_gaps),
      cmocka_unit_test(test_features),
      cmocka_unit_test(test_heartbeat),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
