/* test_chunk_item.c: the relay link's item wire mapping both ways (relay/producer/chunk_item.h): a
 * queued chunk becomes a Chunk item with every header field, its trusted ids and its payload,
 * and that item becomes the same central-buffer write; a patch's bytes survive the wire's
 * little-endian word both ways; a flush ack keeps its ids; out-of-range values a hostile agent
 * could send map to what the buffer refuses. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "relay/producer/chunk_item.h"

static tr_chunkq_entry *chunk_entry(void) {
  tr_chunkq q;
  tr_chunkq_init(&q, 1u << 20);
  uint8_t payload[64];
  for (size_t i = 0; i < sizeof payload; i++)
    payload[i] = (uint8_t)i;
  tr_chunkq_chunk c = {.producer_id = 9,
                       .target_buffer = 4,
                       .header = {.chunk_id = 0xfffffffe, .writer_id = 32767, .count = 1023,
                                  .flags = TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_NEEDS_PATCHING},
                       .incomplete = true,
                       .trusted_uid = 1001,
                       .trusted_pid = 77};
  assert_int_equal(tr_chunkq_push_chunk(&q, &c, payload, sizeof payload, 40), 0);
  tr_chunkq_entry *e = tr_chunkq_pop(&q);
  tr_chunkq_free(&q);
  return e;
}

static void test_chunk_round_trip(void **state) {
  (void)state;
  tr_chunkq_entry *e = chunk_entry();
  tr_chunk_item_slot s;
  tr_chunk_item_fill(&s, e);
  assert_int_equal(s.item.item_case, TRACERELAY__CHUNK_ITEM__ITEM_CHUNK);
  const Tracerelay__Chunk *m = s.item.chunk;
  assert_int_equal(m->target_buffer, 4);
  tr_tbuf_chunk c;
  tr_chunk_item_to_tbuf(m, &c);
  assert_int_equal(c.producer_id, 9);
  assert_int_equal(c.writer_id, 32767);
  assert_int_equal(c.chunk_id, 0xfffffffe);
  assert_int_equal(c.fragments, 1023);
  assert_int_equal(c.flags, TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_NEEDS_PATCHING);
  assert_true(c.incomplete);
  assert_int_equal(c.uid, 1001);
  assert_int_equal(c.pid, 77);
  /* needs patching: the whole payload travels, not only the used part */
  assert_int_equal(c.payload_len, 64);
  assert_ptr_equal(c.payload, e->data);
  tr_chunkq_entry_free(e);
}

static void test_hostile_chunk_values_map_to_refusals(void **state) {
  (void)state;
  Tracerelay__Chunk m = TRACERELAY__CHUNK__INIT;
  m.writer_id = 0x10001;   /* would wrap to writer 1 */
  m.packet_count = 70000;  /* saturates, over any real count */
  m.flags = 0xff;          /* only the header's 6 bits pass */
  tr_tbuf_chunk c;
  tr_chunk_item_to_tbuf(&m, &c);
  assert_int_equal(c.writer_id, 0);
  assert_int_equal(c.fragments, 0xffff);
  assert_int_equal(c.flags, 0x3f);
}

static void test_patch_bytes_survive_the_word(void **state) {
  (void)state;
  tr_chunkq q;
  tr_chunkq_init(&q, 1u << 20);
  tr_chunkq_patch p = {.producer_id = 3, .target_buffer = 2, .chunk_id = 12, .writer_id = 5,
                       .offset = 200, .data = {0xde, 0xad, 0xbe, 0xef}, .has_more = false};
  assert_int_equal(tr_chunkq_push_patch(&q, &p), 0);
  assert_int_equal(tr_chunkq_push_flush_ack(&q, 3, 99), 0);
  tr_chunkq_entry *e = tr_chunkq_pop(&q);
  tr_chunk_item_slot s;
  tr_chunk_item_fill(&s, e);
  assert_int_equal(s.item.item_case, TRACERELAY__CHUNK_ITEM__ITEM_PATCH);
  const Tracerelay__Patch *m = s.item.patch;
  assert_int_equal(m->writer_id, 5);
  assert_int_equal(m->chunk_id, 12);
  assert_false(m->has_more);
  assert_int_equal(m->entries[0]->offset, 200);
  assert_int_equal(m->entries[0]->data, 0xefbeadde);
  uint8_t back[TR_CHUNK_PATCH_SIZE];
  tr_chunk_item_patch_bytes(m->entries[0]->data, back);
  assert_memory_equal(back, p.data, TR_CHUNK_PATCH_SIZE);
  tr_chunkq_entry_free(e);

  e = tr_chunkq_pop(&q);
  tr_chunk_item_fill(&s, e);
  assert_int_equal(s.item.item_case, TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK);
  assert_int_equal(s.item.flush_ack->producer_id, 3);
  assert_int_equal(s.item.flush_ack->flush_request_id, 99);
  tr_chunkq_entry_free(e);
  tr_chunkq_free(&q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_round_trip),
      cmocka_unit_test(test_hostile_chunk_values_map_to_refusals),
      cmocka_unit_test(test_patch_bytes_survive_the_word),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
