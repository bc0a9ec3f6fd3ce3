/* fuzz_trace_buffer.c: drives the central buffer (relay/trace/trace_buffer.c) with a fuzzer-chosen
 * run of writes, re-commits, patches and reads over a few sequences in a small ring, and
 * checks what must always hold: every packet emitted is valid and fits the buffer, and after
 * the final read every chunk stored is accounted for as read, overwritten or dropped unpatched. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/trace/packet_trusted.h"
#include "relay/trace/trace_buffer.h"

struct input {
  const uint8_t *p;
  size_t n;
};

static uint8_t take(struct input *in) {
  if (in->n == 0)
    return 0;
  in->n--;
  return *in->p++;
}

/* Ids near the 2^32 wrap, so that every run crosses it. */
static uint32_t chunk_id(struct input *in) {
  return 0xFFFFFFF8u + (take(in) & 15);
}

static void write_chunk(tr_tbuf *b, struct input *in) {
  uint8_t sel = take(in);
  tr_tbuf_chunk c = {.producer_id = sel & 1,
                     .writer_id = (uint16_t)(1 + ((sel >> 1) & 1)),
                     .chunk_id = chunk_id(in),
                     .fragments = take(in) & 7,
                     .flags = take(in) & 7,
                     .incomplete = (sel & 4) != 0,
                     .uid = 1,
                     .pid = 2};
  size_t len = take(in);
  if (len > in->n)
    len = in->n;
  c.payload = in->p;
  c.payload_len = len;
  in->p += len;
  in->n -= len;
  (void)tr_tbuf_write_chunk(b, &c);
}

/* (timestamp, 1) field pairs: tag 0x40 (field 8, varint), value 1. */
#define PAIRS4 "\x40\x01\x40\x01\x40\x01\x40\x01"
static const char pairs[] = PAIRS4 PAIRS4 PAIRS4 PAIRS4 PAIRS4 PAIRS4 PAIRS4 PAIRS4;

/* A chunk whose fragments mostly parse: sizes from the input, bodies cut from `pairs`, so that
 * packets joined across chunks are often valid; a size of 63 becomes the writer's drop
 * marker. */
static void write_structured_chunk(tr_tbuf *b, struct input *in) {
  uint8_t payload[8 * 68];
  size_t len = 0;
  uint8_t sel = take(in);
  tr_tbuf_chunk c = {.producer_id = sel & 1,
                     .writer_id = (uint16_t)(1 + ((sel >> 1) & 1)),
                     .chunk_id = chunk_id(in),
                     .fragments = take(in) & 7,
                     .flags = take(in) & 7,
                     .incomplete = (sel & 4) != 0,
                     .uid = 1,
                     .pid = 2,
                     .payload = payload};
  for (uint16_t i = 0; i < c.fragments; i++) {
    uint8_t n = take(in) & 63;
    if (n == 63) {
      memcpy(payload + len, "\xff\xff\xff\x7f", 4);
      len += 4;
      continue;
    }
    payload[len++] = n;
    memcpy(payload + len, pairs, n);
    len += n;
  }
  c.payload_len = len;
  (void)tr_tbuf_write_chunk(b, &c);
}

static void patch_chunk(tr_tbuf *b, struct input *in) {
  uint8_t sel = take(in);
  uint32_t id = chunk_id(in);
  tr_tbuf_patch p = {.offset = take(in)};
  for (int i = 0; i < 4; i++)
    p.data[i] = take(in);
  (void)tr_tbuf_patch_chunk(b, sel & 1, (uint16_t)(1 + ((sel >> 1) & 1)), id, &p, 1,
                            (sel & 4) != 0);
}

static void read_packets(tr_tbuf *b, size_t buf_size, bool final, size_t max) {
  tr_tbuf_packet pkt;
  for (size_t i = 0; i < max; i++) {
    int r = tr_tbuf_read_packet(b, final, &pkt);
    if (r == 0)
      return;
    if (r < 0 || pkt.len == 0 || pkt.len > buf_size || tr_tbuf_validate_packet(pkt.data, pkt.len) != 0)
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct input in = {data, size};
  tr_tbuf *b;
  size_t buf_size = TR_TBUF_MIN_SIZE + 64u * (take(&in) & 31);
  if (tr_tbuf_new(buf_size, (take(&in) & 1) ? TR_TBUF_DISCARD : TR_TBUF_RING_BUFFER, &b) != 0)
    return 0;
  while (in.n > 0) {
    switch (take(&in) & 3) {
    case 0:
      write_chunk(b, &in);
      break;
    case 1:
      write_structured_chunk(b, &in);
      break;
    case 2:
      patch_chunk(b, &in);
      break;
    case 3:
      read_packets(b, buf_size, false, take(&in) & 7);
      break;
    }
  }
  read_packets(b, buf_size, true, SIZE_MAX);
  tr_tbuf_stats s;
  tr_tbuf_get_stats(b, &s);
  if (s.chunks_written != s.chunks_read + s.chunks_overwritten + s.unpatched_chunks_dropped)
    abort();
  if (tr_tbuf_read_packet(b, true, &(tr_tbuf_packet){0}) != 0)
    abort();
  tr_tbuf_free(b);
  return 0;
}
