/* test_chunk_queue.c: the agent's outgoing queue (relay/producer/chunk_queue.h): order, sequence
 * numbers, trimming, the byte bound and per-producer drop counters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "relay/producer/chunk_queue.h"
#include "relay/base/tr_error.h"

static tr_chunkq_chunk chunk_meta(uint32_t producer, uint32_t id, uint8_t flags) {
  return (tr_chunkq_chunk){
      .producer_id = producer,
      .target_buffer = 3,
      .header = {.chunk_id = id, .writer_id = 5, .count = 2, .flags = flags},
      .incomplete = false,
      .trusted_uid = 1000,
      .trusted_pid = 4242,
  };
}

static void test_order_and_seq(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 1 << 20);
  uint8_t payload[64];
  memset(payload, 0x5a, sizeof(payload));
  tr_chunkq_chunk c = chunk_meta(1, 10, 0);
  c.incomplete = true;
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, sizeof(payload), 40), 0);
  memset(payload, 0, sizeof(payload)); /* the queue holds its own copy */
  tr_chunkq_patch p = {.producer_id = 1, .target_buffer = 3, .chunk_id = 10, .writer_id = 5,
                       .offset = 12, .data = {1, 2, 3, 4}, .has_more = true};
  assert_int_equal(tr_chunkq_push_patch(&q, &p), 0);
  assert_int_equal(tr_chunkq_push_flush_ack(&q, 1, 77), 0);
  tr_chunkq_chunk c2 = chunk_meta(2, 11, TR_CHUNK_NEEDS_PATCHING | TR_CHUNK_LAST_CONTINUES);
  assert_int_equal(tr_chunkq_push_chunk(&q, &c2, payload, sizeof(payload), 10), 0);
  assert_int_equal(q.len, 4);
  assert_int_equal(q.bytes, 4 * tr_chunkq_entry_cost(0) + 40 + 64);

  const tr_chunkq_entry *head = tr_chunkq_peek(&q);
  assert_non_null(head);
  assert_int_equal(head->seq, 1);

  tr_chunkq_entry *e = tr_chunkq_pop(&q);
  assert_ptr_equal(e, head);
  assert_int_equal(e->kind, TR_CHUNKQ_CHUNK);
  assert_int_equal(e->seq, 1);
  assert_int_equal(e->u.chunk.producer_id, 1);
  assert_int_equal(e->u.chunk.target_buffer, 3);
  assert_int_equal(e->u.chunk.header.chunk_id, 10);
  assert_int_equal(e->u.chunk.header.writer_id, 5);
  assert_int_equal(e->u.chunk.header.count, 2);
  assert_true(e->u.chunk.incomplete);
  assert_int_equal(e->u.chunk.trusted_uid, 1000);
  assert_int_equal(e->u.chunk.trusted_pid, 4242);
  assert_int_equal(e->len, 40); /* trimmed to the used size */
  for (size_t i = 0; i < e->len; i++)
    assert_int_equal(e->data[i], 0x5a);
  tr_chunkq_entry_free(e);

  e = tr_chunkq_pop(&q);
  assert_int_equal(e->kind, TR_CHUNKQ_PATCH);
  assert_int_equal(e->seq, 2);
  assert_int_equal(e->u.patch.chunk_id, 10);
  assert_int_equal(e->u.patch.offset, 12);
  assert_memory_equal(e->u.patch.data, "\1\2\3\4", 4);
  assert_true(e->u.patch.has_more);
  assert_int_equal(e->len, 0);
  tr_chunkq_entry_free(e);

  e = tr_chunkq_pop(&q);
  assert_int_equal(e->kind, TR_CHUNKQ_FLUSH_ACK);
  assert_int_equal(e->seq, 3);
  assert_int_equal(e->u.flush_ack.producer_id, 1);
  assert_int_equal(e->u.flush_ack.request_id, 77);
  tr_chunkq_entry_free(e);

  e = tr_chunkq_pop(&q);
  assert_int_equal(e->kind, TR_CHUNKQ_CHUNK);
  assert_int_equal(e->seq, 4);
  assert_int_equal(e->len, 64); /* needs patching: kept whole */
  tr_chunkq_entry_free(e);

  assert_null(tr_chunkq_pop(&q));
  assert_null(tr_chunkq_peek(&q));
  assert_int_equal(q.len, 0);
  assert_int_equal(q.bytes, 0);
  /* Sequence numbers keep growing after the queue drained. */
  assert_int_equal(tr_chunkq_push_flush_ack(&q, 1, 78), 0);
  assert_int_equal(tr_chunkq_peek(&q)->seq, 5);
  tr_chunkq_free(&q);
}

static void test_used_beyond_payload_is_a_caller_bug(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 1 << 20);
  uint8_t payload[8] = {0};
  tr_chunkq_chunk c = chunk_meta(1, 1, 0);
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, 8, 9), TR_ERR_INVAL);
  assert_int_equal(q.len, 0);
  assert_int_equal(q.total.chunks, 0);
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, 8, 0), 0); /* empty is fine */
  assert_int_equal(tr_chunkq_peek(&q)->seq, 1);
  tr_chunkq_free(&q);
}

static void test_byte_bound_and_drops(void **state) {
  (void)state;
  const size_t chunk_cost = tr_chunkq_entry_cost(1000);
  tr_chunkq q;
  tr_chunkq_init(&q, 3 * chunk_cost);
  uint8_t payload[1000] = {0};
  tr_chunkq_chunk a = chunk_meta(1, 0, 0), b = chunk_meta(2, 0, 0);

  assert_int_equal(tr_chunkq_push_chunk(&q, &a, payload, 1000, 1000), 0);
  assert_int_equal(tr_chunkq_push_chunk(&q, &b, payload, 1000, 1000), 0);
  assert_int_equal(tr_chunkq_push_chunk(&q, &a, payload, 1000, 1000), 0);
  assert_int_equal(q.bytes, 3 * chunk_cost);
  /* Full: refused at once, counted per producer with its bytes. */
  assert_int_equal(tr_chunkq_push_chunk(&q, &a, payload, 1000, 1000), TR_ERR_FULL);
  assert_int_equal(tr_chunkq_push_chunk(&q, &a, payload, 1000, 30), TR_ERR_FULL);
  assert_int_equal(tr_chunkq_push_chunk(&q, &b, payload, 1000, 1000), TR_ERR_FULL);
  tr_chunkq_drops d = tr_chunkq_drops_of(&q, 1);
  assert_int_equal(d.producer_id, 1);
  assert_int_equal(d.chunks, 2);
  assert_int_equal(d.bytes, 1030);
  d = tr_chunkq_drops_of(&q, 2);
  assert_int_equal(d.chunks, 1);
  assert_int_equal(d.bytes, 1000);
  d = tr_chunkq_drops_of(&q, 3);
  assert_int_equal(d.producer_id, 3);
  assert_int_equal(d.chunks, 0);
  assert_int_equal(q.total.chunks, 3);
  assert_int_equal(q.total.bytes, 2030);
  assert_int_equal(q.num_drops, 2);
  assert_int_equal(q.len, 3);

  /* Patches and flush acks still fit, in the reserve above the bound... */
  size_t reserve = q.max_bytes / 8;
  size_t fit = reserve / tr_chunkq_entry_cost(0);
  assert_true(fit >= 2);
  tr_chunkq_patch p = {.producer_id = 2};
  assert_int_equal(tr_chunkq_push_flush_ack(&q, 2, 1), 0);
  for (size_t i = 1; i < fit; i++)
    assert_int_equal(tr_chunkq_push_patch(&q, &p), 0);
  /* ...until it is used up too. */
  assert_int_equal(tr_chunkq_push_patch(&q, &p), TR_ERR_FULL);
  assert_int_equal(tr_chunkq_push_flush_ack(&q, 2, 2), TR_ERR_FULL);
  d = tr_chunkq_drops_of(&q, 2);
  assert_int_equal(d.patches, 1);
  assert_int_equal(d.flush_acks, 1);
  assert_int_equal(q.total.patches, 1);
  assert_int_equal(q.total.flush_acks, 1);

  /* Sequence numbers have no gaps: refused pushes took none. */
  uint64_t want = 1;
  tr_chunkq_entry *e;
  while ((e = tr_chunkq_pop(&q)) != NULL) {
    assert_int_equal(e->seq, want++);
    tr_chunkq_entry_free(e);
  }
  assert_int_equal(want, 1 + 3 + fit);
  assert_int_equal(q.bytes, 0);

  /* Room again; the counters are cumulative. */
  assert_int_equal(tr_chunkq_push_chunk(&q, &a, payload, 1000, 1000), 0);
  assert_int_equal(tr_chunkq_drops_of(&q, 1).chunks, 2);
  /* A chunk larger than the whole bound can never be queued. */
  uint8_t big[2048] = {0};
  tr_chunkq_free(&q);
  tr_chunkq_init(&q, 2048);
  assert_int_equal(tr_chunkq_push_chunk(&q, &a, big, sizeof(big), sizeof(big)), TR_ERR_FULL);
  assert_int_equal(tr_chunkq_drops_of(&q, 1).bytes, 2048);
  tr_chunkq_free(&q);
}

/* A dropped chunk counts the packets begun in it: not its leading continuation, nor the
 * drop marker a writer leaves when the SMB is full (issue 24 item 2). */
static void test_dropped_packets(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 0);
  const uint8_t marker[] = {2, 'a', 'b', 1, 'c', 0xff, 0xff, 0xff, 0x7f};
  tr_chunkq_chunk c = chunk_meta(1, 7, 0);
  c.header.count = 3;
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, marker, sizeof(marker), sizeof(marker)),
                   TR_ERR_FULL);
  assert_int_equal(tr_chunkq_drops_of(&q, 1).packets, 2);
  c.header.flags = TR_CHUNK_FIRST_CONTINUES;
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, marker, sizeof(marker), sizeof(marker)),
                   TR_ERR_FULL);
  assert_int_equal(tr_chunkq_drops_of(&q, 1).packets, 3);
  assert_int_equal(q.total.packets, 3);
  tr_chunkq_free(&q);
}

static void test_many_producers_drop(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 0);
  uint8_t payload[4] = {0};
  for (uint32_t round = 0; round < 3; round++)
    for (uint32_t p = 100; p < 150; p++) {
      tr_chunkq_chunk c = chunk_meta(p, round, 0);
      assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, 4, p % 5), TR_ERR_FULL);
    }
  assert_int_equal(q.num_drops, 50);
  for (uint32_t p = 100; p < 150; p++) {
    tr_chunkq_drops d = tr_chunkq_drops_of(&q, p);
    assert_int_equal(d.chunks, 3);
    assert_int_equal(d.bytes, 3 * (p % 5));
  }
  assert_int_equal(q.total.chunks, 150);
  tr_chunkq_free(&q);
}

static void test_free_releases_queued_entries(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 1 << 20);
  uint8_t payload[1000] = {0};
  for (uint32_t i = 0; i < 100; i++) {
    tr_chunkq_chunk c = chunk_meta(1, i, 0);
    assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, sizeof(payload), 1000), 0);
  }
  tr_chunkq_free(&q); /* ASan reports a leak otherwise */
  assert_null(tr_chunkq_peek(&q));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_and_seq),
      cmocka_unit_test(test_used_beyond_payload_is_a_caller_bug),
      cmocka_unit_test(test_byte_bound_and_drops),
      cmocka_unit_test(test_dropped_packets),
      cmocka_unit_test(test_many_producers_drop),
      cmocka_unit_test(test_free_releases_queued_entries),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
