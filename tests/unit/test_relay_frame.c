/* test_relay_frame.c: the relay link's frame reader, RelayFrame codec and batch compression:
 * partial and coalesced frames, oversize and garbage input, compression round trips, and the
 * decompression cap against crafted zstd frames. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "relay/trace/chunk.h"
#include "relay/link/relay_frame.h"
#include "relay/base/tr_error.h"

static uint8_t *heartbeat_frame(uint64_t ts, size_t *len) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, ts);
  uint8_t *out;
  assert_int_equal(tr_relay_frame_encode(&f, TR_RELAY_MAX_FRAME_DEFAULT, &out, len), 0);
  return out;
}

/* Takes every ready frame and checks each is the heartbeat with the next expected stamp. */
static void drain(tr_relay_reader *r, uint64_t *next_ts) {
  const uint8_t *p;
  size_t n;
  int rc;
  while ((rc = tr_frame_reader_next(r, &p, &n)) == 1) {
    Tracerelay__RelayFrame *f = tr_relay_frame_decode(p, n);
    assert_non_null(f);
    assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT);
    assert_int_equal(f->heartbeat->timestamp_ns, *next_ts);
    (*next_ts)++;
    tr_relay_frame_free(f);
  }
  assert_int_equal(rc, 0);
}

static void feed(tr_relay_reader *r, const uint8_t *data, size_t len, size_t step,
                 uint64_t *next_ts) {
  while (len > 0) {
    size_t n = len < step ? len : step;
    int taken = tr_frame_reader_push(r, data, n);
    assert_true(taken >= 0);
    data += taken;
    len -= (size_t)taken;
    drain(r, next_ts);
  }
}

static void test_partial_and_multiple_frames(void **state) {
  (void)state;
  uint8_t stream[4096];
  size_t total = 0;
  for (uint64_t i = 0; i < 20; i++) {
    size_t len;
    uint8_t *fr = heartbeat_frame(1000 + i, &len);
    memcpy(stream + total, fr, len);
    total += len;
    free(fr);
  }
  static const size_t steps[] = {1, 3, 7, 4096};
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    tr_relay_reader r;
    assert_int_equal(tr_relay_reader_init(&r, 0), 0);
    uint64_t next_ts = 1000;
    feed(&r, stream, total, steps[s], &next_ts);
    assert_int_equal(next_ts, 1020);
    tr_frame_reader_free(&r);
  }
}

static void test_space_commit(void **state) {
  (void)state;
  tr_relay_reader r;
  assert_int_equal(tr_relay_reader_init(&r, 0), 0);
  size_t len;
  uint8_t *fr = heartbeat_frame(7, &len);
  uint8_t *dst;
  size_t room;
  assert_int_equal(tr_frame_reader_space(&r, &dst, &room), 0);
  assert_true(room >= len);
  memcpy(dst, fr, len);
  tr_frame_reader_commit(&r, len);
  uint64_t next_ts = 7;
  drain(&r, &next_ts);
  assert_int_equal(next_ts, 8);
  free(fr);
  tr_frame_reader_free(&r);
}

static void test_oversize_declared_length(void **state) {
  (void)state;
  tr_relay_reader r;
  assert_int_equal(tr_relay_reader_init(&r, 8192), 0);
  uint8_t hdr[4] = {0x01, 0x20, 0x00, 0x00}; /* 8193 */
  assert_int_equal(tr_frame_reader_push(&r, hdr, 4), 4);
  const uint8_t *p;
  size_t n;
  assert_int_equal(tr_frame_reader_next(&r, &p, &n), TR_ERR_TOO_BIG);
  /* The reader never buffers the body of an oversize frame. */
  assert_int_equal(tr_frame_reader_push(&r, hdr, 4), TR_ERR_TOO_BIG);
  assert_true(r.cap <= 4096 + 4);
  tr_frame_reader_free(&r);

  /* A declared length of exactly max_frame is fine. */
  assert_int_equal(tr_relay_reader_init(&r, 8192), 0);
  uint8_t ok[4] = {0x00, 0x20, 0x00, 0x00};
  assert_int_equal(tr_frame_reader_push(&r, ok, 4), 4);
  assert_int_equal(tr_frame_reader_next(&r, &p, &n), 0);
  tr_frame_reader_free(&r);

  assert_int_equal(tr_relay_reader_init(&r, 16), TR_ERR_INVAL);
  assert_int_equal(tr_relay_reader_init(&r, (size_t)TR_RELAY_MAX_FRAME_LIMIT + 1), TR_ERR_INVAL);
}

static void test_encode_refuses_oversize(void **state) {
  (void)state;
  static uint8_t big[8192];
  Tracerelay__Goodbye g = TRACERELAY__GOODBYE__INIT;
  char *text = malloc(sizeof big + 1);
  memset(text, 'x', sizeof big);
  text[sizeof big] = '\0';
  g.text = text;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GOODBYE;
  f.goodbye = &g;
  uint8_t *out;
  size_t len;
  assert_int_equal(tr_relay_frame_encode(&f, 8192, &out, &len), TR_ERR_TOO_BIG);
  assert_int_equal(tr_relay_frame_encode(&f, 16384, &out, &len), 0);
  assert_int_equal(len, 4 + 8192 + 3 + 3);
  free(out);
  free(text);
}

/* Several frames in one buffer (a command with the BatchAck before it): each read back in
 * turn; one too long refuses them all. */
static void test_frames_encode_back_to_back(void **state) {
  (void)state;
  Tracerelay__Heartbeat hb[3];
  Tracerelay__RelayFrame f[3];
  const Tracerelay__RelayFrame *frames[3];
  for (int i = 0; i < 3; i++) {
    tr_relay_frame_heartbeat(&f[i], &hb[i], 500 + (uint64_t)i);
    frames[i] = &f[i];
  }
  uint8_t *out;
  size_t len, one_len;
  assert_int_equal(tr_relay_frames_encode(frames, 3, TR_RELAY_MAX_FRAME_DEFAULT, &out, &len), 0);
  uint8_t *one = heartbeat_frame(500, &one_len);
  assert_int_equal(len, 3 * one_len);
  assert_memory_equal(out, one, one_len);
  free(one);
  tr_relay_reader r;
  assert_int_equal(tr_relay_reader_init(&r, 0), 0);
  uint64_t next_ts = 500;
  feed(&r, out, len, len, &next_ts);
  assert_int_equal(next_ts, 503);
  tr_frame_reader_free(&r);
  free(out);
  assert_int_equal(tr_relay_frames_encode(frames, 3, one_len - 4 - 1, &out, &len), TR_ERR_TOO_BIG);
}

static void test_garbage(void **state) {
  (void)state;
  static const uint8_t bad_varint[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff,
                                       0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  assert_null(tr_relay_frame_decode(bad_varint, sizeof bad_varint));
  static const uint8_t truncated[] = {0x0a, 0x10, 0x08, 0x01}; /* hello, 16 bytes promised */
  assert_null(tr_relay_frame_decode(truncated, sizeof truncated));
  static const uint8_t wire_type_7[] = {0x0f};
  assert_null(tr_relay_frame_decode(wire_type_7, sizeof wire_type_7));
  /* An empty payload parses to a frame without a message: the receiver's protocol error. */
  Tracerelay__RelayFrame *f = tr_relay_frame_decode((const uint8_t *)"", 0);
  assert_non_null(f);
  assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG__NOT_SET);
  tr_relay_frame_free(f);
}

/* 1 MiB of empty ChunkItems would unpack into ~25 MiB of structs: over the decode budget. */
static void test_decode_amplification_bounded(void **state) {
  (void)state;
  size_t n_items = 1 << 19;
  size_t batch_len = 2 * n_items;
  uint8_t *p = malloc(batch_len + 16);
  size_t off = 0;
  p[off++] = (11 << 3) | 2; /* RelayFrame.chunk_batch */
  size_t v = batch_len;
  while (v >= 0x80) {
    p[off++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  p[off++] = (uint8_t)v;
  for (size_t i = 0; i < n_items; i++) {
    p[off++] = (3 << 3) | 2; /* ChunkBatch.items, empty */
    p[off++] = 0;
  }
  assert_null(tr_relay_frame_decode(p, off));
  free(p);

  /* Honest batches stay well under the budget, even of small chunks with every field set. */
  enum { N = 4000 };
  static Tracerelay__Chunk chunks[N];
  static Tracerelay__ChunkItem items[N];
  static Tracerelay__ChunkItem *ptrs[N];
  static uint8_t payload[16];
  for (int i = 0; i < N; i++) {
    chunks[i] = (Tracerelay__Chunk)TRACERELAY__CHUNK__INIT;
    Tracerelay__Chunk *c = &chunks[i];
    c->has_producer_id = c->has_writer_id = c->has_chunk_id = c->has_packet_count = 1;
    c->has_flags = c->has_target_buffer = c->has_incomplete = c->has_trusted_uid = 1;
    c->has_trusted_pid = c->has_payload = 1;
    c->producer_id = 1;
    c->writer_id = 2;
    c->chunk_id = (uint32_t)i;
    c->packet_count = 1;
    c->flags = 3;
    c->target_buffer = 1;
    c->incomplete = 1;
    c->trusted_uid = 1000;
    c->trusted_pid = 4321;
    c->payload.data = payload;
    c->payload.len = sizeof payload;
    items[i] = (Tracerelay__ChunkItem)TRACERELAY__CHUNK_ITEM__INIT;
    items[i].item_case = TRACERELAY__CHUNK_ITEM__ITEM_CHUNK;
    items[i].chunk = c;
    ptrs[i] = &items[i];
  }
  tr_relay_codec codec;
  assert_int_equal(tr_relay_codec_init(&codec, 1, 0), 0);
  uint8_t *fr;
  size_t len;
  assert_int_equal(tr_relay_batch_encode(&codec, 1, false, ptrs, N, &fr, &len), 0);
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(fr + 4, len - 4);
  assert_non_null(f);
  assert_int_equal(f->chunk_batch->n_items, N);
  tr_relay_frame_free(f);
  free(fr);
  tr_relay_codec_free(&codec);
}

static void test_unknown_fields_survive(void **state) {
  (void)state;
  /* RelayFrame{hello{features: 5, field 99: 42}} plus an unknown top-level field 60. */
  static const uint8_t in[] = {0x0a, 0x05, 0x08, 0x05, 0x98, 0x06, 0x2a, 0xe2, 0x03, 0x01, 0x41};
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(in, sizeof in);
  assert_non_null(f);
  assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG_HELLO);
  assert_int_equal(f->hello->features, 5);
  assert_int_equal(f->hello->base.n_unknown_fields, 1);
  uint8_t *out;
  size_t len;
  assert_int_equal(tr_relay_frame_encode(f, TR_RELAY_MAX_FRAME_DEFAULT, &out, &len), 0);
  assert_int_equal(len, 4 + sizeof in);
  assert_memory_equal(out + 4, in, sizeof in);
  free(out);
  tr_relay_frame_free(f);

  /* A message type from a newer peer decodes as "no message" with its bytes kept. */
  static const uint8_t newer[] = {0xb2, 0x03, 0x02, 0x08, 0x01}; /* field 54 */
  f = tr_relay_frame_decode(newer, sizeof newer);
  assert_non_null(f);
  assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG__NOT_SET);
  assert_int_equal(f->base.n_unknown_fields, 1);
  tr_relay_frame_free(f);
}

/* ---- batches ---- */

typedef struct items {
  Tracerelay__ChunkItem item[3];
  Tracerelay__ChunkItem *ptr[3];
  Tracerelay__Chunk chunk;
  Tracerelay__Patch patch;
  Tracerelay__Patch__Entry entry;
  Tracerelay__Patch__Entry *entries[1];
  Tracerelay__FlushAck ack;
  uint8_t payload[4000];
} items;

static void make_items(items *it, bool random_payload) {
  for (int i = 0; i < 3; i++) {
    it->item[i] = (Tracerelay__ChunkItem)TRACERELAY__CHUNK_ITEM__INIT;
    it->ptr[i] = &it->item[i];
  }
  for (size_t i = 0; i < sizeof it->payload; i++)
    it->payload[i] = random_payload ? (uint8_t)rand() : (uint8_t)(i % 16);
  it->chunk = (Tracerelay__Chunk)TRACERELAY__CHUNK__INIT;
  it->chunk.has_producer_id = it->chunk.has_writer_id = it->chunk.has_chunk_id = 1;
  it->chunk.producer_id = 3;
  it->chunk.writer_id = 1;
  it->chunk.chunk_id = 77;
  it->chunk.has_packet_count = 1;
  it->chunk.packet_count = 12;
  it->chunk.has_payload = 1;
  it->chunk.payload.data = it->payload;
  it->chunk.payload.len = sizeof it->payload;
  it->item[0].item_case = TRACERELAY__CHUNK_ITEM__ITEM_CHUNK;
  it->item[0].chunk = &it->chunk;

  it->entry = (Tracerelay__Patch__Entry)TRACERELAY__PATCH__ENTRY__INIT;
  it->entry.has_offset = it->entry.has_data = 1;
  it->entry.offset = 8;
  it->entry.data = 0x00000123;
  it->entries[0] = &it->entry;
  it->patch = (Tracerelay__Patch)TRACERELAY__PATCH__INIT;
  it->patch.has_producer_id = 1;
  it->patch.producer_id = 3;
  it->patch.n_entries = 1;
  it->patch.entries = it->entries;
  it->item[1].item_case = TRACERELAY__CHUNK_ITEM__ITEM_PATCH;
  it->item[1].patch = &it->patch;

  it->ack = (Tracerelay__FlushAck)TRACERELAY__FLUSH_ACK__INIT;
  it->ack.has_flush_request_id = it->ack.has_producer_id = 1;
  it->ack.flush_request_id = 9;
  it->ack.producer_id = 3;
  it->item[2].item_case = TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK;
  it->item[2].flush_ack = &it->ack;
}

/* Encodes, reads back through the reader and decoder, and checks the items. Returns the codec. */
static int round_trip(tr_relay_codec *c, const items *it, bool compress, size_t *frame_len) {
  uint8_t *fr;
  assert_int_equal(tr_relay_batch_encode(c, 42, compress, it->ptr, 3, &fr, frame_len), 0);
  tr_relay_reader r;
  assert_int_equal(tr_relay_reader_init(&r, c->max_frame), 0);
  assert_int_equal(tr_frame_reader_push(&r, fr, *frame_len), (int)*frame_len);
  const uint8_t *p;
  size_t n;
  assert_int_equal(tr_frame_reader_next(&r, &p, &n), 1);
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(p, n);
  assert_non_null(f);
  assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH);
  assert_int_equal(f->chunk_batch->seq, 42);
  int codec = f->chunk_batch->codec;

  Tracerelay__ChunkItems *owned;
  Tracerelay__ChunkItem **got;
  size_t n_got;
  assert_int_equal(tr_relay_batch_items(c, f->chunk_batch, &owned, &got, &n_got), 0);
  assert_int_equal(n_got, 3);
  assert_int_equal(got[0]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_CHUNK);
  assert_int_equal(got[0]->chunk->chunk_id, 77);
  assert_int_equal(got[0]->chunk->payload.len, sizeof it->payload);
  assert_memory_equal(got[0]->chunk->payload.data, it->payload, sizeof it->payload);
  assert_int_equal(got[1]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_PATCH);
  assert_int_equal(got[1]->patch->entries[0]->data, 0x123);
  assert_int_equal(got[2]->item_case, TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK);
  assert_int_equal(got[2]->flush_ack->flush_request_id, 9);
  tr_relay_items_free(owned);
  tr_relay_frame_free(f);
  tr_frame_reader_free(&r);
  free(fr);
  return codec;
}

static void test_batch_round_trip(void **state) {
  (void)state;
  tr_relay_codec c;
  assert_int_equal(tr_relay_codec_init(&c, TR_RELAY_ZSTD_LEVEL_DEFAULT, 0), 0);
  items *it = malloc(sizeof *it);
  make_items(it, false);
  size_t raw_len, z_len;
  assert_int_equal(round_trip(&c, it, false, &raw_len), TRACERELAY__CODEC__CODEC_NONE);
  assert_int_equal(round_trip(&c, it, true, &z_len), TRACERELAY__CODEC__CODEC_ZSTD);
  assert_true(z_len * 10 < raw_len);
  /* The context is reused: a second compressed batch works the same. */
  assert_int_equal(round_trip(&c, it, true, &z_len), TRACERELAY__CODEC__CODEC_ZSTD);
  /* Incompressible payloads go raw even when compression is on. */
  make_items(it, true);
  assert_int_equal(round_trip(&c, it, true, &z_len), TRACERELAY__CODEC__CODEC_NONE);
  free(it);
  tr_relay_codec_free(&c);
}

static void test_batch_too_big(void **state) {
  (void)state;
  tr_relay_codec c;
  assert_int_equal(tr_relay_codec_init(&c, 1, 4096), 0);
  items *it = malloc(sizeof *it);
  make_items(it, false);
  uint8_t *fr;
  size_t len;
  assert_int_equal(tr_relay_batch_encode(&c, 1, true, it->ptr, 3, &fr, &len), TR_ERR_TOO_BIG);
  free(it);
  tr_relay_codec_free(&c);
  assert_int_equal(tr_relay_codec_init(&c, 1000, 0), TR_ERR_INVAL);
}

static void test_batch_codec_mismatch(void **state) {
  (void)state;
  tr_relay_codec c;
  assert_int_equal(tr_relay_codec_init(&c, 1, 0), 0);
  Tracerelay__ChunkBatch b = TRACERELAY__CHUNK_BATCH__INIT;
  Tracerelay__ChunkItems *owned;
  Tracerelay__ChunkItem **items;
  size_t n;
  b.codec = TRACERELAY__CODEC__CODEC_ZSTD; /* no zstd_items */
  assert_int_equal(tr_relay_batch_items(&c, &b, &owned, &items, &n), TR_ERR_PROTO);
  b.codec = TRACERELAY__CODEC__CODEC_NONE;
  b.has_zstd_items = 1;
  assert_int_equal(tr_relay_batch_items(&c, &b, &owned, &items, &n), TR_ERR_PROTO);
  b.codec = (Tracerelay__Codec)7;
  assert_int_equal(tr_relay_batch_items(&c, &b, &owned, &items, &n), TR_ERR_PROTO);
  /* Bytes that are not zstd at all. */
  b.codec = TRACERELAY__CODEC__CODEC_ZSTD;
  b.zstd_items.data = (uint8_t *)"not zstd";
  b.zstd_items.len = 8;
  assert_int_equal(tr_relay_batch_items(&c, &b, &owned, &items, &n), TR_ERR_DECODE);
  tr_relay_codec_free(&c);
}

static uint8_t *zstd_of_zeros(size_t n, bool content_size, size_t *z_len) {
  uint8_t *src = calloc(1, n);
  size_t bound = ZSTD_compressBound(n);
  uint8_t *z = malloc(bound);
  ZSTD_CCtx *cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, content_size);
  if (!content_size) {
    /* Streamed without a pledged size, as a hostile peer could. */
    ZSTD_inBuffer in = {src, n, 0};
    ZSTD_outBuffer out = {z, bound, 0};
    size_t left;
    do {
      left = ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_continue);
      assert_false(ZSTD_isError(left));
    } while (in.pos < in.size);
    do {
      left = ZSTD_compressStream2(cctx, &out, &in, ZSTD_e_end);
      assert_false(ZSTD_isError(left));
    } while (left != 0);
    *z_len = out.pos;
  } else {
    *z_len = ZSTD_compress2(cctx, z, bound, src, n);
    assert_false(ZSTD_isError(*z_len));
  }
  ZSTD_freeCCtx(cctx);
  free(src);
  return z;
}

static void test_decompress_cap(void **state) {
  (void)state;
  tr_relay_codec c;
  assert_int_equal(tr_relay_codec_init(&c, 1, 0), 0);
  uint8_t *out;
  size_t out_len, z_len;

  /* 8 MiB of zeros is a few hundred bytes: refused from its header alone. */
  uint8_t *bomb = zstd_of_zeros(8u << 20, true, &z_len);
  assert_true(z_len < 2048);
  assert_int_equal(tr_relay_decompress(&c, bomb, z_len, 4u << 20, &out, &out_len), TR_ERR_TOO_BIG);
  Tracerelay__ChunkBatch b = TRACERELAY__CHUNK_BATCH__INIT;
  b.codec = TRACERELAY__CODEC__CODEC_ZSTD;
  b.has_zstd_items = 1;
  b.zstd_items.data = bomb;
  b.zstd_items.len = z_len;
  Tracerelay__ChunkItems *owned;
  Tracerelay__ChunkItem **items;
  size_t n;
  assert_int_equal(tr_relay_batch_items(&c, &b, &owned, &items, &n), TR_ERR_TOO_BIG);
  free(bomb);

  /* Without a declared content size there is nothing to check: refused. */
  uint8_t *unsized = zstd_of_zeros(1000, false, &z_len);
  assert_int_equal(ZSTD_getFrameContentSize(unsized, z_len), ZSTD_CONTENTSIZE_UNKNOWN);
  assert_int_equal(tr_relay_decompress(&c, unsized, z_len, 4u << 20, &out, &out_len),
                   TR_ERR_TOO_BIG);
  free(unsized);

  /* A frame that lies: 1 MiB of content declared as 1000 bytes. zstd stops at the buffer. */
  uint8_t *liar = zstd_of_zeros(1u << 20, true, &z_len);
  /* Frame header: magic(4) descriptor(1) [window(1)] [dict id(0-4)] content size. */
  uint8_t fhd = liar[4];
  assert_int_equal(fhd >> 6, 2); /* a 4-byte content size field */
  static const size_t dict_id_len[4] = {0, 1, 2, 4};
  uint8_t *fcs = liar + 5 + ((fhd & 0x20) ? 0 : 1) + dict_id_len[fhd & 3];
  assert_int_equal(fcs[0] | fcs[1] << 8 | fcs[2] << 16 | (uint32_t)fcs[3] << 24, 1u << 20);
  fcs[0] = 0xe8;
  fcs[1] = 0x03;
  fcs[2] = fcs[3] = 0;
  assert_int_equal(ZSTD_getFrameContentSize(liar, z_len), 1000);
  assert_int_equal(tr_relay_decompress(&c, liar, z_len, 4u << 20, &out, &out_len), TR_ERR_DECODE);
  free(liar);

  /* Two frames back to back: the second would add undeclared content. */
  uint8_t *one = zstd_of_zeros(1000, true, &z_len);
  uint8_t *two = malloc(2 * z_len);
  memcpy(two, one, z_len);
  memcpy(two + z_len, one, z_len);
  assert_int_equal(tr_relay_decompress(&c, two, 2 * z_len, 4u << 20, &out, &out_len),
                   TR_ERR_DECODE);
  /* One of them, at the cap exactly, is fine. */
  assert_int_equal(tr_relay_decompress(&c, one, z_len, 1000, &out, &out_len), 0);
  assert_int_equal(out_len, 1000);
  free(out);
  assert_int_equal(tr_relay_decompress(&c, one, z_len, 999, &out, &out_len), TR_ERR_TOO_BIG);
  free(two);
  free(one);
  tr_relay_codec_free(&c);
}

static void test_tally(void **state) {
  (void)state;
  items *it = malloc(sizeof *it);
  make_items(it, false);
  Tracerelay__Chunk second = it->chunk;
  second.producer_id = 5;
  /* 4 fragments, the first the tail of a packet begun in the chunk before: 3 packets begun
   * (tr_chunk_packets_begun's every rule is tested in test_chunk.c). */
  static uint8_t four_fragments[10] = {1, 'a', 1, 'b', 1, 'c', 3, 'd', 'e', 'f'};
  second.payload.data = four_fragments;
  second.payload.len = sizeof four_fragments;
  second.packet_count = 4;
  second.flags = TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_LAST_CONTINUES;
  Tracerelay__ChunkItem extra = TRACERELAY__CHUNK_ITEM__INIT;
  extra.item_case = TRACERELAY__CHUNK_ITEM__ITEM_CHUNK;
  extra.chunk = &second;
  Tracerelay__ChunkItem *list[5] = {it->ptr[0], it->ptr[1], &extra, it->ptr[2], it->ptr[0]};
  tr_relay_tally *t;
  size_t n;
  assert_int_equal(tr_relay_batch_tally(list, 5, &t, &n), 0);
  assert_int_equal(n, 2);
  assert_int_equal(t[0].producer_id, 3);
  assert_int_equal(t[0].chunks, 2);
  assert_int_equal(t[0].bytes, 2 * sizeof it->payload);
  assert_int_equal(t[1].producer_id, 5);
  assert_int_equal(t[1].chunks, 1);
  assert_int_equal(t[1].bytes, sizeof four_fragments);
  assert_int_equal(t[1].packets, 3);
  free(t);
  assert_int_equal(tr_relay_batch_tally(list, 0, &t, &n), 0);
  assert_null(t);
  assert_int_equal(n, 0);
  free(it);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_partial_and_multiple_frames),
      cmocka_unit_test(test_space_commit),
      cmocka_unit_test(test_oversize_declared_length),
      cmocka_unit_test(test_encode_refuses_oversize),
      cmocka_unit_test(test_frames_encode_back_to_back),
      cmocka_unit_test(test_garbage),
      cmocka_unit_test(test_decode_amplification_bounded),
      cmocka_unit_test(test_unknown_fields_survive),
      cmocka_unit_test(test_batch_round_trip),
      cmocka_unit_test(test_batch_too_big),
      cmocka_unit_test(test_batch_codec_mismatch),
      cmocka_unit_test(test_decompress_cap),
      cmocka_unit_test(test_tally),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
