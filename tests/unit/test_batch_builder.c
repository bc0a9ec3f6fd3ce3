/* test_batch_builder.c: the agent's batch builder (agent/batch_builder.h) on a real libuv loop
 * and worker thread, driven by a chunk queue filled here and a fake on_built: every entry
 * kind's wire mapping (chunk fields and payload, patch bytes, flush ack), the byte limit that
 * cuts batches (at least one entry each), queue order across batches, the seq and last_qseq
 * handed back, the per-producer tally, zstd and raw encodings, and the refusals (busy, empty). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "agent/batch_builder.h"
#include "relay/trace/chunk.h"
#include "relay/link/relay_frame.h"
#include "relay/base/tr_error.h"

#define PAYLOAD 1000

struct fixture {
  uv_loop_t loop;
  tr_chunkq queue;
  tr_batch_builder *builder;
  tr_relay_codec codec; /* the receiving side's, to decode what was built */
  struct tr_built_batch built[16];
  size_t n_built;
};

static void on_built(void *data, struct tr_built_batch *b) {
  struct fixture *f = data;
  assert_true(f->n_built < 16);
  f->built[f->n_built++] = *b;
}

static int setup(void **state) {
  struct fixture *f = calloc(1, sizeof *f);
  assert_non_null(f);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  tr_chunkq_init(&f->queue, 64u << 20);
  assert_int_equal(tr_batch_builder_new(&f->loop, &f->queue, on_built, f, &f->builder), 0);
  assert_int_equal(tr_relay_codec_init(&f->codec, TR_RELAY_ZSTD_LEVEL_DEFAULT, 0), 0);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  struct fixture *f = *state;
  for (size_t i = 0; i < f->n_built; i++) {
    free(f->built[i].frame);
    free(f->built[i].tally);
  }
  tr_batch_builder_free(f->builder);
  tr_relay_codec_free(&f->codec);
  tr_chunkq_free(&f->queue);
  assert_int_equal(uv_loop_close(&f->loop), 0);
  free(f);
  return 0;
}

/* Pushes a chunk of PAYLOAD bytes, each byte its chunk id's low byte. */
static void push_chunk(struct fixture *f, uint32_t producer, uint32_t chunk_id, uint16_t count) {
  uint8_t payload[PAYLOAD];
  memset(payload, (int)(chunk_id & 0xff), sizeof payload);
  tr_chunkq_chunk c = {.producer_id = producer,
                       .target_buffer = 7,
                       .header = {.chunk_id = chunk_id, .writer_id = 3, .count = count,
                                  .flags = TR_CHUNK_LAST_CONTINUES},
                       .incomplete = chunk_id % 2 == 1,
                       .trusted_uid = 1000,
                       .trusted_pid = 42};
  assert_int_equal(tr_chunkq_push_chunk(&f->queue, &c, payload, sizeof payload, sizeof payload), 0);
}

/* Builds one batch and waits for it. */
static struct tr_built_batch *build(struct fixture *f, uint64_t seq, bool compress,
                                    size_t limit) {
  size_t before = f->n_built;
  assert_true(tr_batch_builder_start(f->builder, seq, compress, limit));
  assert_true(tr_batch_builder_busy(f->builder));
  assert_false(tr_batch_builder_start(f->builder, seq + 1, compress, limit)); /* one at a time */
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_false(tr_batch_builder_busy(f->builder));
  assert_int_equal(f->n_built, before + 1);
  struct tr_built_batch *b = &f->built[before];
  assert_int_equal(b->rc, 0);
  assert_int_equal(b->seq, seq);
  return b;
}

/* The batch's frame, and its items in *items (from *owned when it was compressed). */
static Tracerelay__RelayFrame *decode(struct fixture *f, const struct tr_built_batch *b,
                                      Tracerelay__ChunkItems **owned,
                                      Tracerelay__ChunkItem ***items, size_t *n) {
  assert_true(b->len > TR_FRAME_HEADER);
  Tracerelay__RelayFrame *frame =
      tr_relay_frame_decode(b->frame + TR_FRAME_HEADER, b->len - TR_FRAME_HEADER);
  assert_non_null(frame);
  assert_int_equal(frame->msg_case, TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH);
  assert_int_equal(frame->chunk_batch->seq, b->seq);
  assert_int_equal(tr_relay_batch_items(&f->codec, frame->chunk_batch, owned, items, n), 0);
  return frame;
}

static void test_every_kind_maps_to_its_item(void **state) {
  struct fixture *f = *state;
  push_chunk(f, 5, 11, 4);
  tr_chunkq_patch p = {.producer_id = 5, .target_buffer = 7, .chunk_id = 10, .writer_id = 3,
                       .offset = 96, .data = {0x01, 0x02, 0x03, 0x04}, .has_more = true};
  assert_int_equal(tr_chunkq_push_patch(&f->queue, &p), 0);
  assert_int_equal(tr_chunkq_push_flush_ack(&f->queue, 5, 77), 0);
  uint64_t last_qseq = f->queue.next_seq - 1;

  struct tr_built_batch *b = build(f, 9, false, 1u << 20);
  assert_int_equal(b->entries, 3);
  assert_int_equal(b->last_qseq, last_qseq);
  assert_null(tr_chunkq_peek(&f->queue));
  assert_int_equal(b->n_tally, 1);
  assert_int_equal(b->tally[0].producer_id, 5);
  assert_int_equal(b->tally[0].chunks, 1);
  assert_int_equal(b->tally[0].bytes, PAYLOAD);

  Tracerelay__ChunkItems *owned;
  Tracerelay__ChunkItem **items;
  size_t n;
  Tracerelay__RelayFrame *frame = decode(f, b, &owned, &items, &n);
  assert_null(owned); /* raw: the frame lends its items */
  assert_int_equal(n, 3);
  const Tracerelay__Chunk *c = items[0]->chunk;
  assert_int_equal(items[0]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_CHUNK);
  assert_int_equal(c->producer_id, 5);
  assert_int_equal(c->writer_id, 3);
  assert_int_equal(c->chunk_id, 11);
  assert_int_equal(c->packet_count, 4);
  assert_int_equal(c->flags, TR_CHUNK_LAST_CONTINUES);
  assert_int_equal(c->target_buffer, 7);
  assert_true(c->incomplete);
  assert_int_equal(c->trusted_uid, 1000);
  assert_int_equal(c->trusted_pid, 42);
  assert_int_equal(c->payload.len, PAYLOAD);
  assert_int_equal(c->payload.data[0], 11);
  assert_int_equal(c->payload.data[PAYLOAD - 1], 11);
  const Tracerelay__Patch *pm = items[1]->patch;
  assert_int_equal(items[1]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_PATCH);
  assert_int_equal(pm->chunk_id, 10);
  assert_true(pm->has_more);
  assert_int_equal(pm->n_entries, 1);
  assert_int_equal(pm->entries[0]->offset, 96);
  assert_int_equal(pm->entries[0]->data, 0x04030201u); /* the bytes in order, little-endian */
  assert_int_equal(items[2]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK);
  assert_int_equal(items[2]->flush_ack->flush_request_id, 77);
  assert_int_equal(items[2]->flush_ack->producer_id, 5);
  tr_relay_frame_free(frame);
}

static void test_limit_cuts_batches_in_queue_order(void **state) {
  struct fixture *f = *state;
  for (uint32_t id = 1; id <= 10; id++)
    push_chunk(f, id <= 5 ? 1 : 2, id, 1);
  /* Room for two or three entries a batch (the builder counts a payload and an item's
   * envelope estimate). */
  size_t limit = 3 * tr_chunkq_entry_cost(PAYLOAD);
  uint32_t next_id = 1;
  uint64_t prev_qseq = 0;
  for (uint64_t seq = 1; tr_chunkq_peek(&f->queue) != NULL; seq++) {
    struct tr_built_batch *b = build(f, seq, seq % 2 == 0, limit);
    assert_true(b->entries >= 2 || tr_chunkq_peek(&f->queue) == NULL);
    assert_true(b->entries <= 3);
    assert_true(b->last_qseq > prev_qseq);
    prev_qseq = b->last_qseq;
    Tracerelay__ChunkItems *owned;
    Tracerelay__ChunkItem **items;
    size_t n;
    Tracerelay__RelayFrame *frame = decode(f, b, &owned, &items, &n);
    assert_int_equal(n, b->entries);
    for (size_t i = 0; i < n; i++)
      assert_int_equal(items[i]->chunk->chunk_id, next_id++);
    tr_relay_items_free(owned);
    tr_relay_frame_free(frame);
  }
  assert_int_equal(next_id, 11);
  assert_true(f->n_built >= 4);
  /* A limit below one entry still takes one. */
  push_chunk(f, 1, 11, 1);
  assert_int_equal(build(f, 99, false, 1)->entries, 1);
}

static void test_compressed_batch_is_smaller_and_decodes(void **state) {
  struct fixture *f = *state;
  for (uint32_t id = 1; id <= 8; id++)
    push_chunk(f, 1, id, 1);
  struct tr_built_batch *b = build(f, 1, true, 1u << 20);
  assert_int_equal(b->entries, 8);
  assert_true(b->len < 8 * PAYLOAD / 4); /* runs of one byte shrink a lot */
  Tracerelay__ChunkItems *owned;
  Tracerelay__ChunkItem **items;
  size_t n;
  Tracerelay__RelayFrame *frame = decode(f, b, &owned, &items, &n);
  assert_non_null(owned);
  assert_int_equal(n, 8);
  assert_int_equal(items[7]->chunk->payload.len, PAYLOAD);
  assert_int_equal(items[7]->chunk->payload.data[PAYLOAD / 2], 8);
  tr_relay_items_free(owned);
  tr_relay_frame_free(frame);
}

static void test_empty_queue_starts_nothing(void **state) {
  struct fixture *f = *state;
  assert_false(tr_batch_builder_start(f->builder, 1, true, 1u << 20));
  assert_false(tr_batch_builder_busy(f->builder));
  assert_int_equal(f->n_built, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_kind_maps_to_its_item, setup, teardown),
      cmocka_unit_test_setup_teardown(test_limit_cuts_batches_in_queue_order, setup, teardown),
      cmocka_unit_test_setup_teardown(test_compressed_batch_is_smaller_and_decodes, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_empty_queue_starts_nothing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
