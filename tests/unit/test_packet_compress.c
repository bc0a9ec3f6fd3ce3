/* test_packet_compress.c: relay/trace/packet_compress.h. Groups compressed with deflate and
 * zstd are decoded here with zlib and zstd themselves and compared packet by packet (bytes
 * and appended trusted tail); each group also reads back through tr_trace_reader (what
 * `tracerelay inspect` and, by the same rules, trace_processor do). Also: where a group ends,
 * the codec a config selects, and a bound on memory that holds over many groups, at zstd's
 * highest level too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "relay/reading/trace_reader.h"
#include "relay/trace/packet_compress.h"

/* A packet as a producer's would be: a timestamp and a padding string of some length, half
 * three quarters repetitive (trace data
 * compresses), the rest not; and its trusted tail. */
typedef struct pkt {
  uint8_t *data;
  size_t len;
  uint8_t tail[8];
  size_t tail_len;
} pkt;

static uint32_t rnd_state = 12345;
static uint32_t rnd(void) {
  rnd_state = rnd_state * 1103515245u + 12345u;
  return rnd_state >> 8;
}

static pkt make_pkt(uint64_t ts, size_t pad) {
  pkt p = {0};
  p.data = malloc(32 + pad);
  assert_non_null(p.data);
  p.data[p.len++] = 0x40; /* timestamp (8), varint */
  p.len += tr_varint_put(p.data + p.len, ts);
  p.data[p.len++] = 0xA2; /* synchronization_marker (36), bytes: any bytes decode */
  p.data[p.len++] = 0x02;
  p.len += tr_varint_put(p.data + p.len, pad);
  for (size_t i = 0; i < pad; i++)
    p.data[p.len++] = i % 4 ? (uint8_t)("track_event"[i % 11]) : (uint8_t)rnd();
  p.tail[p.tail_len++] = 0x18; /* trusted_uid (3) */
  p.tail[p.tail_len++] = 0x2A;
  p.tail[p.tail_len++] = 0x50; /* trusted_packet_sequence_id (10) */
  p.tail[p.tail_len++] = (uint8_t)(2 + ts % 100);
  return p;
}

/* The compressed packet's content, checked to be exactly field `field`, decompressed. */
static uint8_t *decompress(const uint8_t *p, size_t len, uint32_t field, size_t *out_len) {
  uint64_t tag = 0, n = 0;
  size_t pos = 0;
  assert_true(tr_varint_get(p, len, &pos, &tag));
  assert_int_equal(tag, (uint64_t)field << 3 | 2);
  assert_true(tr_varint_get(p, len, &pos, &n));
  assert_int_equal(n, len - pos);
  const uint8_t *z = p + pos;
  size_t cap = 1u << 16, used = 0;
  uint8_t *out = malloc(cap);
  assert_non_null(out);
  if (field == TR_PACKET_COMPRESS_FIELD_DEFLATE) {
    z_stream s = {0};
    assert_int_equal(inflateInit(&s), Z_OK); /* zlib format, as trace_processor expects */
    s.next_in = (Bytef *)z;
    s.avail_in = (uInt)n;
    int zrc;
    do {
      if (used == cap)
        assert_non_null(out = realloc(out, cap *= 2));
      s.next_out = out + used;
      s.avail_out = (uInt)(cap - used);
      zrc = inflate(&s, Z_NO_FLUSH);
      used = cap - s.avail_out;
      assert_true(zrc == Z_OK || zrc == Z_STREAM_END);
    } while (zrc != Z_STREAM_END);
    assert_int_equal(s.avail_in, 0); /* one stream, nothing after it */
    inflateEnd(&s);
  } else {
    ZSTD_DCtx *d = ZSTD_createDCtx();
    ZSTD_inBuffer in = {z, n, 0};
    size_t left;
    do {
      if (used == cap)
        assert_non_null(out = realloc(out, cap *= 2));
      ZSTD_outBuffer ob = {out, cap, used};
      left = ZSTD_decompressStream(d, &ob, &in);
      assert_false(ZSTD_isError(left));
      used = ob.pos;
    } while (left != 0);
    assert_int_equal(in.pos, in.size); /* one frame, nothing after it */
    ZSTD_freeDCtx(d);
  }
  *out_len = used;
  return out;
}

/* Checks that content holds records of packets[from..from+count) exactly, in order. */
static void check_records(const uint8_t *c, size_t len, const pkt *packets, size_t from,
                          size_t count) {
  size_t pos = 0;
  for (size_t i = from; i < from + count; i++) {
    uint64_t n = 0;
    assert_true(pos < len);
    assert_int_equal(c[pos++], 0x0A);
    assert_true(tr_varint_get(c, len, &pos, &n));
    assert_int_equal(n, packets[i].len + packets[i].tail_len);
    assert_true(pos + n <= len);
    assert_memory_equal(c + pos, packets[i].data, packets[i].len);
    assert_memory_equal(c + pos + packets[i].len, packets[i].tail, packets[i].tail_len);
    pos += n;
  }
  assert_int_equal(pos, len);
}

/* The compressed packet as a trace file's record, read back by tr_trace_reader. */
static void check_reader(const uint8_t *p, size_t len, size_t count, bool zstd) {
  size_t file_len = 1 + 10 + len, hl = 1;
  uint8_t *file = malloc(file_len);
  assert_non_null(file);
  file[0] = 0x0A;
  hl += tr_varint_put(file + 1, len);
  memcpy(file + hl, p, len);
  struct tr_trace_reader r;
  struct tr_trace_record rec;
  size_t n = 0;
  tr_trace_reader_init(&r, file, hl + len);
  int rc;
  while ((rc = tr_trace_reader_next(&r, &rec)) == 1) {
    assert_true(rec.packet->has_trusted_uid);
    assert_int_equal(rec.packet->trusted_uid, 42);
    n++;
  }
  assert_int_equal(rc, 0);
  assert_int_equal(n, count);
  assert_int_equal(r.undecodable_packets, 0);
  assert_int_equal(zstd ? r.zstd_packets : r.zlib_packets, 1);
  tr_trace_reader_free(&r);
  free(file);
}

static void round_trip(enum tr_packet_codec codec, int level) {
  enum { N = 600 };
  pkt packets[N];
  tr_packet_compress *pc;
  size_t group_start = 0, groups = 0, raw = 0, packed = 0;
  uint32_t field = codec == TR_PACKET_CODEC_ZSTD ? TR_PACKET_COMPRESS_FIELD_ZSTD
                                                 : TR_PACKET_COMPRESS_FIELD_DEFLATE;
  for (size_t i = 0; i < N; i++) {
    packets[i] = make_pkt(1000000 + i * 977, i % 50 == 7 ? 70000 : rnd() % 400);
    raw += packets[i].len + packets[i].tail_len;
  }
  assert_int_equal(tr_packet_compress_new(codec, level, TR_PACKET_COMPRESS_READ_GROUP, &pc), 0);
  for (size_t i = 0; i < N; i++) {
    assert_false(tr_packet_compress_full(pc));
    assert_int_equal(tr_packet_compress_add(pc, packets[i].data, packets[i].len, packets[i].tail,
                                            packets[i].tail_len),
                     0);
    if (!tr_packet_compress_full(pc) && i + 1 < N)
      continue;
    const uint8_t *out;
    size_t len, clen;
    size_t count = i + 1 - group_start;
    assert_int_equal(tr_packet_compress_count(pc), count);
    assert_int_equal(tr_packet_compress_finish(pc, &out, &len), 0);
    uint8_t *content = decompress(out, len, field, &clen);
    check_records(content, clen, packets, group_start, count);
    free(content);
    check_reader(out, len, count, codec == TR_PACKET_CODEC_ZSTD);
    packed += len;
    groups++;
    group_start = i + 1;
  }
  assert_int_equal(group_start, N);
  assert_true(groups > 10);
  /* three quarters of each padding is text; zstd's fast modes (negative levels) trade ratio */
  assert_true(packed < (level < 0 ? raw : raw * 3 / 4));
  tr_packet_compress_free(pc);
  for (size_t i = 0; i < N; i++)
    free(packets[i].data);
}

static void test_round_trip_deflate(void **state) {
  (void)state;
  round_trip(TR_PACKET_CODEC_DEFLATE, 0);
}

static void test_round_trip_zstd(void **state) {
  (void)state;
  round_trip(TR_PACKET_CODEC_ZSTD, 0);
  round_trip(TR_PACKET_CODEC_ZSTD, 19);
  round_trip(TR_PACKET_CODEC_ZSTD, -5);   /* a fast mode */
  round_trip(TR_PACKET_CODEC_ZSTD, 1000); /* clamped by zstd, as traced passes it on */
}

/* A group ends on the packet that reaches group_bytes (counted without record headers), not
 * before: traced's threshold. One packet larger than a group is a group of its own. */
static void test_grouping_limits(void **state) {
  tr_packet_compress *pc;
  const uint8_t *out;
  size_t len;
  uint8_t buf[5000] = {0};
  (void)state;
  assert_int_equal(tr_packet_compress_new(TR_PACKET_CODEC_DEFLATE, 0, 1000, &pc), 0);
  assert_int_equal(tr_packet_compress_finish(pc, &out, &len), TR_ERR_STATE); /* empty */
  assert_int_equal(tr_packet_compress_add(pc, buf, 396, buf, 4), 0);
  assert_false(tr_packet_compress_full(pc));
  assert_int_equal(tr_packet_compress_add(pc, buf, 399, NULL, 0), 0);
  assert_false(tr_packet_compress_full(pc)); /* 799 */
  assert_int_equal(tr_packet_compress_add(pc, buf, 200, NULL, 0), 0);
  assert_false(tr_packet_compress_full(pc)); /* 999 */
  assert_int_equal(tr_packet_compress_add(pc, buf, 1, NULL, 0), 0);
  assert_true(tr_packet_compress_full(pc)); /* 1000 */
  assert_int_equal(tr_packet_compress_count(pc), 4);
  assert_int_equal(tr_packet_compress_finish(pc, &out, &len), 0);
  assert_false(tr_packet_compress_full(pc));
  assert_int_equal(tr_packet_compress_count(pc), 0);
  assert_int_equal(tr_packet_compress_add(pc, buf, sizeof buf, NULL, 0), 0);
  assert_true(tr_packet_compress_full(pc));
  assert_int_equal(tr_packet_compress_count(pc), 1);
  /* a dropped group leaves nothing behind: the next group holds only its own packets */
  tr_packet_compress_reset(pc);
  assert_int_equal(tr_packet_compress_count(pc), 0);
  assert_int_equal(tr_packet_compress_finish(pc, &out, &len), TR_ERR_STATE);
  pkt one = make_pkt(7, 10);
  assert_int_equal(tr_packet_compress_add(pc, one.data, one.len, one.tail, one.tail_len), 0);
  assert_int_equal(tr_packet_compress_finish(pc, &out, &len), 0);
  size_t clen;
  uint8_t *content = decompress(out, len, TR_PACKET_COMPRESS_FIELD_DEFLATE, &clen);
  check_records(content, clen, &one, 0, 1);
  free(content);
  free(one.data);
  /* a packet's size must fit the record's 32-bit length; refused before reading a byte */
  assert_int_equal(tr_packet_compress_add(pc, buf, (size_t)UINT32_MAX + 1, NULL, 0),
                   TR_ERR_TOO_BIG);
  assert_int_equal(tr_packet_compress_count(pc), 0);
  tr_packet_compress_free(pc);
  assert_int_equal(tr_packet_compress_new(TR_PACKET_CODEC_NONE, 0, 1000, &pc), TR_ERR_INVAL);
  assert_int_equal(tr_packet_compress_new(TR_PACKET_CODEC_ZSTD, 0, 0, &pc), TR_ERR_INVAL);
}

/* Memory stays bounded however many groups pass, at zstd's highest level too (its default
 * window there would be 128 MiB): the codec's state plus an output buffer sized by the
 * largest group. 12 write_into_file groups of about 1 MiB each. */
static void memory_bound(enum tr_packet_codec codec, int level, size_t bound) {
  enum { PACKET = 60000 };
  pkt p = make_pkt(1, PACKET);
  tr_packet_compress *pc;
  size_t after_first = 0;
  assert_int_equal(tr_packet_compress_new(codec, level, TR_PACKET_COMPRESS_FILE_GROUP, &pc), 0);
  for (int g = 0; g < 12; g++) {
    const uint8_t *out;
    size_t len;
    while (!tr_packet_compress_full(pc))
      assert_int_equal(tr_packet_compress_add(pc, p.data, p.len, p.tail, p.tail_len), 0);
    assert_int_equal(tr_packet_compress_finish(pc, &out, &len), 0);
    size_t m = tr_packet_compress_memory(pc);
    if (g == 0) {
      after_first = m;
      print_message("codec %d level %d: %zu bytes held\n", codec, level, m);
    }
    assert_true(m <= bound);
    assert_int_equal(m, after_first); /* nothing accumulates from group to group */
  }
  tr_packet_compress_free(pc);
  free(p.data);
}

static void test_memory_bound(void **state) {
  (void)state;
  /* deflate: 256 KiB window and hash tables + 64 KiB pending, and the output buffer */
  memory_bound(TR_PACKET_CODEC_DEFLATE, 0, 2u << 20);
  memory_bound(TR_PACKET_CODEC_ZSTD, 3, 8u << 20);
  memory_bound(TR_PACKET_CODEC_ZSTD, 22, 48u << 20);
}

/* traced's order: compression.zstd, else compression.deflate or the old compression_type. */
static void test_codec_from_config(void **state) {
  Perfetto__Protos__TraceConfig cfg = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__CompressionConfig c =
      PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__CompressionConfig__Deflate d =
      PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_CONFIG__DEFLATE__INIT;
  Perfetto__Protos__TraceConfig__CompressionConfig__Zstd z =
      PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_CONFIG__ZSTD__INIT;
  int level = -1;
  (void)state;
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_NONE);
  cfg.has_compression_type = 1;
  cfg.compression_type = PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_TYPE__COMPRESSION_TYPE_DEFLATE;
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_DEFLATE);
  cfg.compression = &c; /* an empty compression message falls back to compression_type */
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_DEFLATE);
  cfg.has_compression_type = 0;
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_NONE);
  c.deflate = &d;
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_DEFLATE);
  c.zstd = &z; /* both: zstd, the higher field number */
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_ZSTD);
  assert_int_equal(level, 0);
  z.has_level = 1;
  z.level = 9;
  assert_int_equal(tr_packet_compress_codec(&cfg, &level), TR_PACKET_CODEC_ZSTD);
  assert_int_equal(level, 9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip_deflate), cmocka_unit_test(test_round_trip_zstd),
      cmocka_unit_test(test_grouping_limits),    cmocka_unit_test(test_memory_bound),
      cmocka_unit_test(test_codec_from_config),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
