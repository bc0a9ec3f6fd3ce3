/* test_trace_buffer.c: one test per invariant of the central buffer (relay/trace/trace_buffer.c),
 * plus the trusted slice, the producer packet check and sequence id allocation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/trace/chunk.h"
#include "relay/trace/packet_trusted.h"
#include "relay/trace/sequence_ids.h"
#include "relay/trace/trace_buffer.h"
#include "relay/base/tr_error.h"

#define FIRST TR_CHUNK_FIRST_CONTINUES
#define LAST TR_CHUNK_LAST_CONTINUES
#define PATCH TR_CHUNK_NEEDS_PATCHING
#define LOSS(bits) (TR_TBUF_LOSS_PRESENT | (bits))

/* A chunk payload under construction. */
struct cb {
  uint8_t buf[2048];
  size_t len;
  uint16_t frags;
};

/* A valid TracePacket of 5 + body bytes: timestamp = marker, then an unknown bytes field
 * (1000), which every reader keeps as it is. */
static size_t make_packet(uint8_t *out, uint8_t marker, size_t body) {
  assert_true(marker < 128 && body < 128);
  out[0] = 0x40;
  out[1] = marker;
  out[2] = 0xC2;
  out[3] = 0x3E;
  out[4] = (uint8_t)body;
  memset(out + 5, marker, body);
  return 5 + body;
}

static void add_frag(struct cb *c, const uint8_t *data, size_t n) {
  assert_true(n < 128);
  c->buf[c->len++] = (uint8_t)n;
  memcpy(c->buf + c->len, data, n);
  c->len += n;
  c->frags++;
}

static void add_packet(struct cb *c, uint8_t marker, size_t body) {
  uint8_t p[160];
  add_frag(c, p, make_packet(p, marker, body));
}

static void add_drop_marker(struct cb *c) {
  static const uint8_t drop[4] = {0xff, 0xff, 0xff, 0x7f};
  memcpy(c->buf + c->len, drop, 4);
  c->len += 4;
  c->frags++;
}

static int put_ex(tr_tbuf *b, uint32_t producer, uint16_t writer, uint32_t id, uint8_t flags,
                  bool incomplete, const struct cb *c) {
  tr_tbuf_chunk ch = {.producer_id = producer,
                      .writer_id = writer,
                      .chunk_id = id,
                      .fragments = c->frags,
                      .flags = flags,
                      .incomplete = incomplete,
                      .uid = 1000,
                      .pid = 4242,
                      .payload = c->buf,
                      .payload_len = c->len};
  return tr_tbuf_write_chunk(b, &ch);
}

static int put(tr_tbuf *b, uint32_t producer, uint16_t writer, uint32_t id, uint8_t flags,
               const struct cb *c) {
  return put_ex(b, producer, writer, id, flags, false, c);
}

/* A chunk holding one packet with a 104-byte payload (a 128-byte record). */
static int put_one(tr_tbuf *b, uint32_t producer, uint16_t writer, uint32_t id, uint8_t marker) {
  struct cb c = {0};
  add_packet(&c, marker, 98);
  return put(b, producer, writer, id, 0, &c);
}

struct got {
  uint8_t marker;
  size_t len;
  uint32_t producer;
  uint16_t writer;
  uint32_t dropped;
};

/* Reads one pass; copies what each packet says since its bytes live only until the next call. */
static size_t read_pass(tr_tbuf *b, bool final, struct got *g, size_t max) {
  size_t n = 0;
  tr_tbuf_packet p;
  int r;
  while ((r = tr_tbuf_read_packet(b, final, &p)) == 1) {
    assert_true(n < max);
    assert_true(p.len >= 5);
    assert_int_equal(p.uid, 1000);
    assert_int_equal(p.pid, 4242);
    g[n++] = (struct got){p.data[1], p.len, p.producer_id, p.writer_id, p.previous_packet_dropped};
  }
  assert_int_equal(r, 0);
  return n;
}

static tr_tbuf *new_buf(size_t size, enum tr_tbuf_policy policy) {
  tr_tbuf *b = NULL;
  assert_int_equal(tr_tbuf_new(size, policy, &b), 0);
  return b;
}

static tr_tbuf_stats stats(const tr_tbuf *b) {
  tr_tbuf_stats s;
  tr_tbuf_get_stats(b, &s);
  return s;
}

static void test_ring_wrap_overwrite(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(1024, TR_TBUF_RING_BUFFER); /* 8 records of 128 bytes */
  for (uint32_t i = 0; i < 12; i++)
    assert_int_equal(put_one(b, 1, 1, i, (uint8_t)i), 0);
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.buffer_size, 1024);
  assert_int_equal(s.chunks_written, 12);
  assert_int_equal(s.bytes_written, 12 * 104);
  assert_int_equal(s.chunks_overwritten, 4);
  assert_int_equal(s.bytes_overwritten, 4 * 104);
  assert_int_equal(s.write_wrap_count, 1);

  struct got g[16];
  assert_int_equal(read_pass(b, false, g, 16), 8);
  for (int i = 0; i < 8; i++) {
    assert_int_equal(g[i].marker, 4 + i);
    assert_int_equal(g[i].dropped, i == 0 ? LOSS(TR_TBUF_LOSS_OVERWRITE) : 0);
  }
  s = stats(b);
  assert_int_equal(s.chunks_read, 8);
  assert_int_equal(s.bytes_read, 8 * 104);

  /* Space that was read is reused without counting anything as overwritten. */
  for (uint32_t i = 12; i < 20; i++)
    assert_int_equal(put_one(b, 1, 1, i, (uint8_t)i), 0);
  assert_int_equal(read_pass(b, false, g, 16), 8);
  assert_int_equal(g[0].marker, 12);
  assert_int_equal(g[0].dropped, 0);
  s = stats(b);
  assert_int_equal(s.chunks_overwritten, 4);
  assert_int_equal(s.write_wrap_count, 2);
  tr_tbuf_free(b);
}

static void test_discard_when_full(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(1024, TR_TBUF_DISCARD);
  struct got g[16];
  for (uint32_t i = 0; i < 8; i++)
    assert_int_equal(put_one(b, 1, 1, i, (uint8_t)i), 0);
  assert_int_equal(read_pass(b, false, g, 16), 8);
  /* What was read may be overwritten. */
  for (uint32_t i = 8; i < 16; i++)
    assert_int_equal(put_one(b, 1, 1, i, (uint8_t)i), 0);
  /* Unread data may not: refused, and from then on everything is. */
  assert_int_equal(put_one(b, 1, 1, 16, 16), TR_ERR_FULL);
  assert_int_equal(read_pass(b, false, g, 16), 8);
  assert_int_equal(g[0].marker, 8);
  assert_int_equal(g[7].marker, 15);
  assert_int_equal(put_one(b, 1, 1, 17, 17), TR_ERR_FULL);
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.chunks_discarded, 2);
  assert_int_equal(s.chunks_overwritten, 0);
  assert_int_equal(s.chunks_written, 16);
  /* A chunk larger than the buffer is refused whatever the policy. */
  struct cb big = {0};
  for (int i = 0; i < 9; i++)
    add_packet(&big, (uint8_t)i, 110);
  tr_tbuf *r = new_buf(1024, TR_TBUF_RING_BUFFER);
  assert_int_equal(put(r, 1, 1, 0, 0, &big), TR_ERR_TOO_BIG);
  assert_int_equal(stats(r).chunks_discarded, 1);
  tr_tbuf_free(r);
  tr_tbuf_free(b);
}

static void test_recommit_rules(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb two = {0}, three = {0}, shorter = {0};
  add_packet(&two, 1, 10);
  add_packet(&two, 2, 10);
  three = two;
  add_packet(&three, 3, 10);
  add_packet(&shorter, 1, 10);
  add_packet(&shorter, 2, 1);
  shorter.frags = 3;

  assert_int_equal(put(b, 1, 1, 5, 0, &two), 0);
  assert_int_equal(put(b, 1, 1, 5, 0, &three), 0); /* more fragments, longer */
  assert_int_equal(put(b, 1, 1, 5, 0, &three), 0); /* the same again */
  assert_int_equal(put(b, 1, 1, 5, 0, &two), TR_ERR_PROTO);     /* fewer fragments */
  assert_int_equal(put(b, 1, 1, 5, 0, &shorter), TR_ERR_PROTO); /* shorter payload */
  assert_int_equal(put(b, 1, 1, 6, LAST, &two), 0);
  assert_int_equal(put(b, 1, 1, 6, 0, &two), TR_ERR_PROTO); /* a flag went away */
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.chunks_written, 2);
  assert_int_equal(s.chunks_rewritten, 2);
  assert_int_equal(s.abi_violations, 3);

  struct got g[8];
  assert_int_equal(read_pass(b, false, g, 8), 4); /* 1, 2, 3, then 1 of chunk 6 */
  assert_int_equal(g[2].marker, 3);
  /* Chunk 6 is partly read (its last packet continues); chunk 5 is gone: committing it
   * again would emit its packets twice. */
  struct cb next = {0};
  add_packet(&next, 9, 3);
  assert_int_equal(put(b, 1, 1, 7, 0, &next), 0);
  assert_int_equal(read_pass(b, false, g, 8), 1); /* chunk 6's last packet was lost */
  assert_int_equal(g[0].dropped, LOSS(TR_TBUF_LOSS_REASSEMBLY_BROKEN_CHAIN));
  assert_int_equal(put(b, 1, 1, 7, 0, &next), TR_ERR_PROTO);
  assert_int_equal(read_pass(b, false, g, 8), 0);
  assert_int_equal(stats(b).abi_violations, 4);
  tr_tbuf_free(b);
}

/* Splits a packet into `n` pieces of the given sizes. */
static void split(const uint8_t *p, const size_t *sizes, size_t n, const uint8_t **pieces) {
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    pieces[i] = p + off;
    off += sizes[i];
  }
}

static void test_reassembly_two_chunks(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t big[160];
  size_t big_len = make_packet(big, 7, 100);
  const size_t sizes[2] = {40, big_len - 40};
  const uint8_t *pieces[2];
  split(big, sizes, 2, pieces);

  struct cb c0 = {0}, c1 = {0};
  add_packet(&c0, 1, 3);
  add_frag(&c0, pieces[0], sizes[0]);
  add_frag(&c1, pieces[1], sizes[1]);
  add_packet(&c1, 2, 3);
  assert_int_equal(put(b, 1, 1, 0, LAST, &c0), 0);

  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 1); /* the packet continuing waits */
  assert_int_equal(g[0].marker, 1);
  assert_int_equal(stats(b).chunks_read, 0);

  assert_int_equal(put(b, 1, 1, 1, FIRST, &c1), 0);
  tr_tbuf_packet p;
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1);
  assert_int_equal(p.len, big_len);
  assert_memory_equal(p.data, big, big_len);
  assert_int_equal(p.previous_packet_dropped, 0);
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(g[0].marker, 2);
  assert_int_equal(stats(b).chunks_read, 2);
  tr_tbuf_free(b);
}

static void test_reassembly_three_chunks(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t big[160];
  size_t big_len = make_packet(big, 7, 120);
  const size_t sizes[3] = {30, 60, big_len - 90};
  const uint8_t *pieces[3];
  split(big, sizes, 3, pieces);

  struct cb c0 = {0}, c1 = {0}, c2 = {0};
  add_packet(&c0, 1, 3);
  add_frag(&c0, pieces[0], sizes[0]);
  add_frag(&c1, pieces[1], sizes[1]);
  add_frag(&c2, pieces[2], sizes[2]);
  add_packet(&c2, 2, 3);
  assert_int_equal(put(b, 1, 1, 10, LAST, &c0), 0);
  assert_int_equal(put(b, 1, 1, 11, FIRST | LAST, &c1), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(put(b, 1, 1, 12, FIRST, &c2), 0);

  tr_tbuf_packet p;
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1);
  assert_int_equal(p.len, big_len);
  assert_memory_equal(p.data, big, big_len);
  assert_int_equal(p.previous_packet_dropped, 0);
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1);
  assert_int_equal(p.data[1], 2);
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 0);
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.chunks_read, 3);
  assert_int_equal(s.packets_read, 3);
  tr_tbuf_free(b);
}

static void test_gap_drops_spanning_packet(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t part[20];
  memset(part, 0x55, sizeof part);
  struct cb c0 = {0}, c2 = {0}, c3 = {0};
  add_packet(&c0, 1, 3);
  add_frag(&c0, part, sizeof part); /* continues in chunk 1, which never comes */
  add_packet(&c2, 2, 3);
  add_packet(&c3, 3, 3);
  assert_int_equal(put(b, 1, 1, 0, LAST, &c0), 0);
  assert_int_equal(put(b, 1, 1, 2, 0, &c2), 0);
  assert_int_equal(put(b, 1, 1, 3, 0, &c3), 0);

  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 3);
  assert_int_equal(g[0].marker, 1);
  assert_int_equal(g[0].dropped, 0);
  assert_int_equal(g[1].marker, 2);
  assert_int_equal(g[1].dropped, LOSS(TR_TBUF_LOSS_REASSEMBLY_GAP | TR_TBUF_LOSS_READ_GAP));
  assert_int_equal(g[2].dropped, 0); /* only the next packet carries it */
  assert_int_equal(stats(b).packets_lost_in_gaps, 1);

  /* On the final read a packet whose next chunk never came is dropped too. */
  assert_int_equal(put(b, 1, 1, 4, LAST, &c0), 0);
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(read_pass(b, true, g, 4), 0);
  assert_int_equal(stats(b).packets_lost_in_gaps, 2);
  assert_int_equal(stats(b).chunks_read, 4);
  tr_tbuf_free(b);
}

static void test_orphan_continuation_skipped(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t tail[12];
  memset(tail, 0x33, sizeof tail);
  struct cb c = {0};
  add_frag(&c, tail, sizeof tail);
  add_packet(&c, 4, 3);
  assert_int_equal(put(b, 1, 1, 7, FIRST, &c), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(g[0].marker, 4);
  assert_int_equal(g[0].dropped, LOSS(TR_TBUF_LOSS_ORPHAN_CONTINUATION));
  assert_int_equal(stats(b).orphan_continuations, 1);
  tr_tbuf_free(b);
}

/* A chunk whose only fragment's size is a zero 4-byte varint, to be patched. */
static void unpatched_chunk(struct cb *c, uint8_t marker, size_t *packet_len) {
  uint8_t p[160];
  *packet_len = make_packet(p, marker, 20);
  memset(c, 0, sizeof *c);
  memcpy(c->buf, "\x80\x80\x80\x00", 4);
  memcpy(c->buf + 4, p, *packet_len);
  c->len = 4 + *packet_len;
  c->frags = 1;
}

static void test_patches(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb c;
  size_t plen;
  unpatched_chunk(&c, 5, &plen);
  assert_int_equal(put(b, 1, 1, 0, PATCH, &c), 0);
  assert_int_equal(put_one(b, 1, 2, 0, 6), 0); /* another writer */

  tr_tbuf_patch ok = {.offset = 0, .data = {(uint8_t)(0x80 | plen), 0x80, 0x80, 0x00}};
  assert_int_equal(tr_tbuf_patch_chunk(b, 1, 1, 0, &ok, 1, true), 0);
  /* Still more patches to come: only writer 1 stalls. */
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(g[0].marker, 6);
  assert_int_equal(tr_tbuf_patch_chunk(b, 1, 1, 0, NULL, 0, false), 0);
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(g[0].marker, 5);
  assert_int_equal(g[0].len, plen);

  /* Out of bounds: offset + 4 past the payload. The chunk stays stalled. */
  unpatched_chunk(&c, 7, &plen);
  assert_int_equal(put(b, 1, 1, 1, PATCH, &c), 0);
  tr_tbuf_patch bad = {.offset = (uint32_t)c.len - 3};
  assert_int_equal(tr_tbuf_patch_chunk(b, 1, 1, 1, &bad, 1, false), TR_ERR_PROTO);
  /* Unknown chunk: every patch fails. */
  tr_tbuf_patch two[2] = {ok, ok};
  assert_int_equal(tr_tbuf_patch_chunk(b, 1, 1, 99, two, 2, false), TR_ERR_NOT_FOUND);
  assert_int_equal(tr_tbuf_patch_chunk(b, 9, 1, 1, two, 1, false), TR_ERR_NOT_FOUND);
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.patches_succeeded, 1);
  assert_int_equal(s.patches_failed, 4);

  assert_int_equal(read_pass(b, false, g, 4), 0);
  assert_int_equal(put_one(b, 1, 1, 2, 8), 0);
  assert_int_equal(read_pass(b, false, g, 4), 0); /* behind the unpatched chunk */
  /* Session end: the unpatched chunk is dropped and counted; the sequence goes on. */
  assert_int_equal(read_pass(b, true, g, 4), 1);
  assert_int_equal(g[0].marker, 8);
  assert_int_equal(g[0].dropped, LOSS(TR_TBUF_LOSS_CHUNK_CORRUPTED));
  assert_int_equal(stats(b).unpatched_chunks_dropped, 1);
  tr_tbuf_free(b);
}

static void test_incomplete_then_full_commit(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb full = {0}, part, next = {0};
  add_packet(&full, 1, 3);
  add_packet(&full, 2, 3);
  part = full;
  part.buf[part.len++] = 9; /* the third fragment, still being written */
  part.frags++;
  add_packet(&full, 3, 4);
  add_packet(&next, 4, 3);

  assert_int_equal(put_ex(b, 1, 1, 0, 0, true, &part), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 2);
  assert_int_equal(put(b, 1, 1, 1, 0, &next), 0);
  assert_int_equal(read_pass(b, false, g, 4), 0); /* waits for chunk 0 in full */
  assert_int_equal(put(b, 1, 1, 0, 0, &full), 0);
  assert_int_equal(read_pass(b, false, g, 4), 2);
  assert_int_equal(g[0].marker, 3);
  assert_int_equal(g[0].dropped, 0);
  assert_int_equal(g[1].marker, 4);
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.chunks_rewritten, 1);
  assert_int_equal(s.packets_read, 4);
  assert_int_equal(s.chunks_read, 2);

  assert_int_equal(s.packets_lost_in_gaps, 0);

  /* Never completed: the final read takes what there is and flags the loss, and counts the
   * packet that was being written (issue 24 item 7: a session ended before the scraped
   * chunk's full commit, and that packet was lost with every count 0). */
  assert_int_equal(put_ex(b, 1, 1, 2, 0, true, &part), 0);
  assert_int_equal(put(b, 1, 1, 3, 0, &next), 0);
  assert_int_equal(read_pass(b, false, g, 4), 2);
  assert_int_equal(read_pass(b, true, g, 4), 1);
  assert_int_equal(g[0].marker, 4);
  assert_int_equal(g[0].dropped, LOSS(TR_TBUF_LOSS_READ_GAP));
  assert_int_equal(stats(b).packets_lost_in_gaps, 1);
  /* An incomplete chunk of just the tail of a packet: the loss is its head's (a broken chain). */
  struct cb head = {0}, tail = {0};
  add_packet(&head, 5, 3);
  head.buf[head.len++] = 2;
  head.buf[head.len++] = 0x08;
  head.buf[head.len++] = 0x01;
  head.frags++;
  tail.buf[tail.len++] = 1;
  tail.buf[tail.len++] = 0x02;
  tail.frags++;
  assert_int_equal(put(b, 1, 1, 4, TR_CHUNK_LAST_CONTINUES, &head), 0);
  assert_int_equal(put_ex(b, 1, 1, 5, TR_CHUNK_FIRST_CONTINUES, true, &tail), 0);
  assert_int_equal(read_pass(b, true, g, 4), 1);
  assert_int_equal(g[0].marker, 5);
  assert_int_equal(stats(b).packets_lost_in_gaps, 2);
  tr_tbuf_free(b);
}

static void test_writer_abort_marker(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0};
  add_packet(&c0, 1, 3);
  add_drop_marker(&c0);
  add_packet(&c1, 2, 3);
  uint8_t head[10] = {0};
  add_frag(&c2, head, sizeof head); /* a packet abandoned in its second chunk */
  add_drop_marker(&c3);
  add_packet(&c4, 3, 3);
  assert_int_equal(put(b, 1, 1, 0, 0, &c0), 0);
  assert_int_equal(put(b, 1, 1, 1, 0, &c1), 0);
  assert_int_equal(put(b, 1, 1, 2, LAST, &c2), 0);
  assert_int_equal(put(b, 1, 1, 3, FIRST, &c3), 0);
  assert_int_equal(put(b, 1, 1, 4, 0, &c4), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 3);
  assert_int_equal(g[0].dropped, 0);
  assert_int_equal(g[1].marker, 2);
  assert_int_equal(g[1].dropped, LOSS(TR_TBUF_LOSS_WRITER_ABORT));
  assert_int_equal(g[2].marker, 3);
  assert_int_equal(g[2].dropped, LOSS(TR_TBUF_LOSS_WRITER_ABORT));
  tr_tbuf_stats s = stats(b);
  assert_int_equal(s.trace_writer_packet_loss, 2);
  assert_int_equal(s.abi_violations, 0);
  assert_int_equal(s.chunks_read, 5);
  tr_tbuf_free(b);
}

static void test_chunk_id_wraps(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t big[160];
  size_t big_len = make_packet(big, 7, 90);
  const size_t sizes[3] = {30, 30, big_len - 60};
  const uint8_t *pieces[3];
  split(big, sizes, 3, pieces);
  struct cb a = {0}, m = {0}, z = {0}, d = {0};
  add_packet(&a, 1, 3);
  add_frag(&a, pieces[0], sizes[0]);
  add_frag(&m, pieces[1], sizes[1]);
  add_frag(&z, pieces[2], sizes[2]);
  add_packet(&z, 2, 3);
  add_packet(&d, 3, 3);
  /* Out of order on purpose: the index sorts across the wrap. */
  assert_int_equal(put(b, 1, 1, 0xFFFFFFFEu, LAST, &a), 0);
  assert_int_equal(put(b, 1, 1, 0, FIRST, &z), 0);
  assert_int_equal(put(b, 1, 1, 1, 0, &d), 0);
  assert_int_equal(put(b, 1, 1, 0xFFFFFFFFu, FIRST | LAST, &m), 0);
  tr_tbuf_packet p;
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1);
  assert_int_equal(p.data[1], 1);
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1);
  assert_int_equal(p.len, big_len);
  assert_memory_equal(p.data, big, big_len);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 2);
  assert_int_equal(g[0].marker, 2);
  assert_int_equal(g[1].marker, 3);
  assert_int_equal(g[1].dropped, 0);
  /* A chunk id 2^31 away from the stored ones cannot be ordered: refused. */
  assert_int_equal(put_one(b, 1, 1, 2, 4), 0);
  assert_int_equal(put_one(b, 1, 1, 0x80000002u, 5), TR_ERR_PROTO);
  tr_tbuf_free(b);
}

static void test_sequences_interleaved(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(8192, TR_TBUF_RING_BUFFER);
  /* (producer, writer) pairs, written round-robin: 3 sequences of 5 chunks each. */
  const uint32_t prod[3] = {2, 1, 1};
  const uint16_t wr[3] = {1, 1, 2};
  for (uint32_t id = 0; id < 5; id++)
    for (int s = 0; s < 3; s++)
      assert_int_equal(put_one(b, prod[s], wr[s], id, (uint8_t)(s * 10 + id)), 0);
  struct got g[16];
  assert_int_equal(read_pass(b, false, g, 16), 15);
  /* Per sequence, chunk order; sequences in the order their first chunk was written. */
  for (int i = 0; i < 15; i++) {
    int s = i / 5;
    assert_int_equal(g[i].producer, prod[s]);
    assert_int_equal(g[i].writer, wr[s]);
    assert_int_equal(g[i].marker, s * 10 + i % 5);
    assert_int_equal(g[i].dropped, 0);
  }
  tr_tbuf_free(b);
}

static void test_instances_isolated(void **state) {
  (void)state;
  tr_tbuf *chatty = new_buf(1024, TR_TBUF_RING_BUFFER);
  tr_tbuf *quiet = new_buf(1024, TR_TBUF_RING_BUFFER);
  for (uint32_t i = 0; i < 3; i++)
    assert_int_equal(put_one(quiet, 1, 1, i, (uint8_t)i), 0);
  for (uint32_t i = 0; i < 100; i++)
    assert_int_equal(put_one(chatty, 1, 1, i, (uint8_t)(i % 100)), 0);
  struct got g[16];
  assert_int_equal(read_pass(quiet, false, g, 16), 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(g[i].marker, i);
    assert_int_equal(g[i].dropped, 0);
  }
  tr_tbuf_stats q = stats(quiet), c = stats(chatty);
  assert_int_equal(q.chunks_overwritten, 0);
  assert_int_equal(q.chunks_read, 3);
  assert_int_equal(c.chunks_overwritten, 92);
  assert_int_equal(read_pass(chatty, false, g, 16), 8);
  tr_tbuf_free(chatty);
  tr_tbuf_free(quiet);
}

static void test_trusted_slice_bytes(void **state) {
  (void)state;
  uint8_t out[TR_TBUF_TRUSTED_MAX];
  tr_tbuf_trusted t = {.uid = 1000, .sequence_id = 2, .pid = 1234, .machine_id = 7,
                       .previous_packet_dropped = 3};
  static const uint8_t want[] = {0x18, 0xE8, 0x07, 0x50, 0x02, 0xF8, 0x04, 0xD2, 0x09,
                                 0x90, 0x06, 0x07, 0xD0, 0x02, 0x03};
  assert_int_equal(tr_tbuf_append_trusted(out, sizeof out, &t), sizeof want);
  assert_memory_equal(out, want, sizeof want);
  assert_int_equal(tr_tbuf_append_trusted(out, sizeof want - 1, &t), TR_ERR_TOO_BIG);

  /* Optional fields left out; a negative uid takes ten bytes, as protobuf int32 does. */
  tr_tbuf_trusted bare = {.uid = 0, .sequence_id = 300};
  static const uint8_t want_bare[] = {0x18, 0x00, 0x50, 0xAC, 0x02};
  assert_int_equal(tr_tbuf_append_trusted(out, sizeof out, &bare), sizeof want_bare);
  assert_memory_equal(out, want_bare, sizeof want_bare);
  tr_tbuf_trusted neg = {.uid = -1, .sequence_id = 2, .pid = -1};
  assert_int_equal(tr_tbuf_append_trusted(out, sizeof out, &neg), 1 + 10 + 2);

  /* Packet plus slice decodes as one TracePacket with the service's values. */
  uint8_t pkt[64 + TR_TBUF_TRUSTED_MAX];
  size_t n = make_packet(pkt, 42, 8);
  int r = tr_tbuf_append_trusted(pkt + n, sizeof pkt - n, &t);
  assert_true(r > 0);
  Perfetto__Protos__TracePacket *tp =
      perfetto__protos__trace_packet__unpack(NULL, n + (size_t)r, pkt);
  assert_non_null(tp);
  assert_true(tp->has_timestamp);
  assert_int_equal(tp->timestamp, 42);
  assert_true(tp->has_trusted_uid);
  assert_int_equal(tp->trusted_uid, 1000);
  assert_true(tp->has_trusted_packet_sequence_id);
  assert_int_equal(tp->trusted_packet_sequence_id, 2);
  assert_true(tp->has_trusted_pid);
  assert_int_equal(tp->trusted_pid, 1234);
  assert_true(tp->has_machine_id);
  assert_int_equal(tp->machine_id, 7);
  assert_true(tp->has_previous_packet_dropped);
  assert_int_equal(tp->previous_packet_dropped, 3);
  perfetto__protos__trace_packet__free_unpacked(tp, NULL);

  n = make_packet(pkt, 1, 2);
  r = tr_tbuf_append_trusted(pkt + n, sizeof pkt - n, &neg);
  tp = perfetto__protos__trace_packet__unpack(NULL, n + (size_t)r, pkt);
  assert_non_null(tp);
  assert_int_equal(tp->trusted_uid, -1);
  assert_false(tp->has_trusted_pid);
  assert_false(tp->has_machine_id);
  assert_false(tp->has_previous_packet_dropped);
  perfetto__protos__trace_packet__free_unpacked(tp, NULL);
}

static void test_invalid_packets_rejected(void **state) {
  (void)state;
  static const uint32_t reserved[] = {3, 10, 33, 35, 36, 50, 69, 79, 98, 124, 125, 133};
  for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
    uint8_t p[8] = {0x40, 0x01};
    size_t n = 2;
    uint32_t tag = reserved[i] << 3; /* varint field, value 0 */
    while (tag >= 0x80) {
      p[n++] = (uint8_t)(tag | 0x80);
      tag >>= 7;
    }
    p[n++] = (uint8_t)tag;
    p[n++] = 0;
    assert_int_equal(tr_tbuf_validate_packet(p, n), TR_ERR_PERM);
  }
  uint8_t ok[32];
  assert_int_equal(tr_tbuf_validate_packet(ok, make_packet(ok, 1, 20)), 0);
  assert_int_equal(tr_tbuf_validate_packet(ok, 0), 0);
  assert_int_equal(tr_tbuf_validate_packet(ok, 24), TR_ERR_DECODE); /* bytes field truncated */
  static const uint8_t fixed64_short[] = {0x09, 1, 2, 3};
  static const uint8_t varint_open[] = {0x40, 0x80};
  static const uint8_t field_zero[] = {0x00, 0x01};
  static const uint8_t group[] = {0x0B, 0x0C};
  static const uint8_t fixed32[] = {0x0D, 1, 2, 3, 4};
  assert_int_equal(tr_tbuf_validate_packet(fixed64_short, sizeof fixed64_short), TR_ERR_DECODE);
  assert_int_equal(tr_tbuf_validate_packet(varint_open, sizeof varint_open), TR_ERR_DECODE);
  assert_int_equal(tr_tbuf_validate_packet(field_zero, sizeof field_zero), TR_ERR_DECODE);
  assert_int_equal(tr_tbuf_validate_packet(group, sizeof group), TR_ERR_DECODE);
  assert_int_equal(tr_tbuf_validate_packet(fixed32, sizeof fixed32), 0);

  /* In the buffer: skipped and counted, the next one still comes out. */
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb c = {0};
  static const uint8_t forged[] = {0x40, 0x05, 0x50, 0x01}; /* sets trusted_packet_sequence_id */
  add_frag(&c, forged, sizeof forged);
  add_packet(&c, 6, 3);
  assert_int_equal(put(b, 1, 1, 0, 0, &c), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(g[0].marker, 6);
  assert_int_equal(g[0].dropped, 0);
  assert_int_equal(stats(b).invalid_packets, 1);
  tr_tbuf_free(b);
}

static void test_abi_violation_in_chunk(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb c = {0}, next = {0};
  add_packet(&c, 1, 3);
  c.buf[c.len++] = 100; /* a size past the payload */
  c.buf[c.len++] = 0x40;
  c.frags++;
  add_packet(&next, 2, 3);
  assert_int_equal(put(b, 1, 1, 0, 0, &c), 0);
  assert_int_equal(put(b, 1, 1, 1, 0, &next), 0);
  struct got g[4];
  assert_int_equal(read_pass(b, false, g, 4), 2);
  assert_int_equal(g[1].dropped, LOSS(TR_TBUF_LOSS_CHUNK_CORRUPTED));
  assert_int_equal(stats(b).abi_violations, 1);
  /* Header fields out of range are refused at write. */
  tr_tbuf_chunk bad = {.producer_id = 1, .writer_id = 0, .payload = c.buf, .payload_len = 4};
  assert_int_equal(tr_tbuf_write_chunk(b, &bad), TR_ERR_PROTO);
  bad.writer_id = 1;
  bad.fragments = 1024;
  assert_int_equal(tr_tbuf_write_chunk(b, &bad), TR_ERR_PROTO);
  assert_int_equal(stats(b).abi_violations, 3);
  tr_tbuf_free(b);
}

static void test_sequence_ids(void **state) {
  (void)state;
  tr_tbuf_seqids *m = NULL;
  assert_int_equal(tr_tbuf_seqids_new(100, &m), 0);
  uint32_t id;
  assert_int_equal(tr_tbuf_seqids_get(m, 1, 1, 1, &id), 0);
  assert_int_equal(id, 2);
  assert_int_equal(tr_tbuf_seqids_get(m, 2, 1, 1, &id), 0); /* same ids, other host */
  assert_int_equal(id, 3);
  assert_int_equal(tr_tbuf_seqids_get(m, 1, 1, 2, &id), 0);
  assert_int_equal(id, 4);
  assert_int_equal(tr_tbuf_seqids_get(m, 1, 1, 1, &id), 0);
  assert_int_equal(id, 2);
  for (uint32_t i = 0; i < 97; i++)
    assert_int_equal(tr_tbuf_seqids_get(m, 3, i, 1, &id), 0);
  assert_int_equal(id, 100 + 1);
  assert_int_equal(tr_tbuf_seqids_get(m, 4, 1, 1, &id), TR_ERR_FULL);
  assert_int_equal(tr_tbuf_seqids_get(m, 3, 50, 1, &id), 0);
  assert_int_equal(id, 2 + 3 + 50);
  tr_tbuf_seqids_free(m);
  assert_int_equal(tr_tbuf_seqids_new(0, &m), TR_ERR_INVAL);
}

/* ---- tr_tbuf_clone: one test per invariant of the copy ---- */

/* Both passes (non-final, then final) of a and of b yield the same packets. */
static void assert_same_reads(tr_tbuf *a, tr_tbuf *b) {
  struct got ga[64], gb[64];
  for (int final = 0; final < 2; final++) {
    size_t na = read_pass(a, final, ga, 64), nb = read_pass(b, final, gb, 64);
    assert_int_equal(na, nb);
    for (size_t i = 0; i < na; i++) {
      assert_int_equal(ga[i].marker, gb[i].marker);
      assert_int_equal(ga[i].len, gb[i].len);
      assert_int_equal(ga[i].producer, gb[i].producer);
      assert_int_equal(ga[i].writer, gb[i].writer);
      assert_int_equal(ga[i].dropped, gb[i].dropped);
    }
  }
}

/* The copy yields exactly what the source would, across a wrapped ring and several sequences,
 * and carries its stats. */
static void test_clone_reads_as_source(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(1024, TR_TBUF_RING_BUFFER);
  for (uint32_t id = 0; id < 12; id++) /* 128-byte records: the ring wraps, chunks are lost */
    assert_int_equal(put_one(b, 1 + id % 3, 1, id / 3, (uint8_t)(10 + id)), 0);
  tr_tbuf *c = NULL;
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  tr_tbuf_stats sb = stats(b), sc = stats(c);
  assert_memory_equal(&sb, &sc, sizeof sb);
  assert_true(sb.chunks_overwritten > 0);
  assert_same_reads(b, c);
  sb = stats(b);
  sc = stats(c);
  assert_memory_equal(&sb, &sc, sizeof sb);
  tr_tbuf_free(b);
  tr_tbuf_free(c);
}

/* Neither sees what is written to or read from the other after the copy. */
static void test_clone_independent(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  assert_int_equal(put_one(b, 1, 1, 0, 1), 0);
  assert_int_equal(put_one(b, 1, 1, 1, 2), 0);
  tr_tbuf *c = NULL;
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  assert_int_equal(put_one(b, 1, 1, 2, 3), 0); /* the source goes on */
  struct got g[8];
  assert_int_equal(read_pass(c, true, g, 8), 2);
  assert_int_equal(g[0].marker, 1);
  assert_int_equal(g[1].marker, 2);
  assert_int_equal(read_pass(c, true, g, 8), 0); /* the copy is empty after its final read */
  assert_int_equal(read_pass(b, false, g, 8), 3); /* the source still has all of its own */
  assert_int_equal(g[2].marker, 3);
  assert_int_equal(stats(c).chunks_written, 2);
  assert_int_equal(stats(b).chunks_written, 3);
  tr_tbuf_free(b);
  tr_tbuf_free(c);
}

/* The copy goes on from where the source's reading stopped: packets already read are not
 * read again, and a loss not yet reported is reported on the copy's next packet too. */
static void test_clone_keeps_read_position_and_loss(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  struct cb c0 = {0};
  add_packet(&c0, 1, 3);
  add_packet(&c0, 2, 3);
  assert_int_equal(put(b, 1, 1, 0, 0, &c0), 0);
  tr_tbuf_packet p;
  assert_int_equal(tr_tbuf_read_packet(b, false, &p), 1); /* marker 1, mid-chunk */
  assert_int_equal(put_one(b, 1, 1, 2, 3), 0);            /* chunk 1 never came: a gap */
  tr_tbuf *c = NULL;
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  struct got g[4];
  assert_int_equal(read_pass(c, false, g, 4), 2);
  assert_int_equal(g[0].marker, 2);
  assert_int_equal(g[0].dropped, 0);
  assert_int_equal(g[1].marker, 3);
  assert_int_equal(g[1].dropped, LOSS(TR_TBUF_LOSS_READ_GAP));
  struct got gs[4]; /* the source, read on by itself, yields the same */
  assert_int_equal(read_pass(b, false, gs, 4), 2);
  for (size_t i = 0; i < 2; i++) {
    assert_int_equal(gs[i].marker, g[i].marker);
    assert_int_equal(gs[i].dropped, g[i].dropped);
  }
  tr_tbuf_free(b);
  tr_tbuf_free(c);
}

/* A packet waiting in the source for its next chunk waits in the copy too, and the copy's final
 * read gives it up and counts it as the source's would. */
static void test_clone_pending_span(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(4096, TR_TBUF_RING_BUFFER);
  uint8_t big[160];
  struct cb c0 = {0};
  make_packet(big, 7, 100);
  add_packet(&c0, 1, 3);
  add_frag(&c0, big, 40);
  assert_int_equal(put(b, 1, 1, 0, LAST, &c0), 0);
  tr_tbuf *c = NULL;
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  struct got g[4];
  assert_int_equal(read_pass(c, false, g, 4), 1);
  assert_int_equal(g[0].marker, 1);
  assert_int_equal(read_pass(c, true, g, 4), 0);
  assert_int_equal(stats(c).packets_lost_in_gaps, 1);
  assert_int_equal(stats(b).packets_lost_in_gaps, 0);
  assert_int_equal(read_pass(b, false, g, 4), 1);
  assert_int_equal(read_pass(b, true, g, 4), 0);
  assert_int_equal(stats(b).packets_lost_in_gaps, 1);
  tr_tbuf_free(b);
  tr_tbuf_free(c);
}

/* An empty buffer copies to an empty buffer of the same size and policy (a DISCARD copy that
 * was full stays full). */
static void test_clone_empty_and_discarding(void **state) {
  (void)state;
  tr_tbuf *b = new_buf(512, TR_TBUF_DISCARD), *c = NULL;
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  struct got g[8];
  assert_int_equal(read_pass(c, true, g, 8), 0);
  assert_int_equal(stats(c).buffer_size, 512);
  tr_tbuf_free(c);
  for (uint32_t id = 0; id < 6; id++) /* 4 records of 128 bytes fill it */
    (void)put_one(b, 1, 1, id, (uint8_t)id);
  assert_int_equal(stats(b).chunks_discarded, 2);
  assert_int_equal(tr_tbuf_clone(b, &c), 0);
  assert_int_equal(read_pass(c, true, g, 8), 4);
  assert_int_equal(put_one(c, 1, 1, 9, 9), TR_ERR_FULL);
  tr_tbuf_free(b);
  tr_tbuf_free(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_wrap_overwrite),
      cmocka_unit_test(test_discard_when_full),
      cmocka_unit_test(test_recommit_rules),
      cmocka_unit_test(test_reassembly_two_chunks),
      cmocka_unit_test(test_reassembly_three_chunks),
      cmocka_unit_test(test_gap_drops_spanning_packet),
      cmocka_unit_test(test_orphan_continuation_skipped),
      cmocka_unit_test(test_patches),
      cmocka_unit_test(test_incomplete_then_full_commit),
      cmocka_unit_test(test_writer_abort_marker),
      cmocka_unit_test(test_chunk_id_wraps),
      cmocka_unit_test(test_sequences_interleaved),
      cmocka_unit_test(test_instances_isolated),
      cmocka_unit_test(test_trusted_slice_bytes),
      cmocka_unit_test(test_invalid_packets_rejected),
      cmocka_unit_test(test_abi_violation_in_chunk),
      cmocka_unit_test(test_sequence_ids),
      cmocka_unit_test(test_clone_reads_as_source),
      cmocka_unit_test(test_clone_independent),
      cmocka_unit_test(test_clone_keeps_read_position_and_loss),
      cmocka_unit_test(test_clone_pending_span),
      cmocka_unit_test(test_clone_empty_and_discarding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
