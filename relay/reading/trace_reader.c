/* trace_reader.c: walks the records of a Perfetto trace and unpacks each TracePacket, inflating
 * compressed packets in place of the packet that carried them. See trace_reader.h. */
#include "relay/reading/trace_reader.h"

#include <stdlib.h>
#include <string.h>

#include <zlib.h>
#include <zstd.h>

#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

#define PACKET_FIELD 1 /* Trace.packet */

void tr_trace_reader_init(struct tr_trace_reader *r, const void *data, size_t len) {
  memset(r, 0, sizeof(*r));
  r->outer = (struct tr_trace_cursor){.data = data, .len = len};
  r->error.inner = -1;
}

static void drop_packet(struct tr_trace_reader *r) {
  if (r->packet)
    perfetto__protos__trace_packet__free_unpacked(r->packet, NULL);
  r->packet = NULL;
}

static void drop_inner(struct tr_trace_reader *r) {
  free(r->inflated);
  r->inflated = NULL;
  r->inner = (struct tr_trace_cursor){0};
}

void tr_trace_reader_free(struct tr_trace_reader *r) {
  drop_packet(r);
  drop_inner(r);
}

static int fail(struct tr_trace_reader *r, int code, uint64_t offset, int64_t inner,
                const char *what) {
  drop_packet(r);
  drop_inner(r);
  r->error = (struct tr_trace_reader_error){code, offset, inner, what};
  return code;
}

/* 0 and *v, or -1 if the varint is cut short or longer than 10 bytes. */
static int read_varint(struct tr_trace_cursor *c, uint64_t *v) {
  return tr_varint_get(c->data, c->len, &c->pos, v) ? 0 : -1;
}

/* Skips one field of wire type wt, or returns the reason it cannot. */
static const char *skip_field(struct tr_trace_cursor *c, unsigned wt) {
  uint64_t v;
  size_t n;
  switch (wt) {
  case 0:
    return read_varint(c, &v) ? "truncated varint field" : NULL;
  case 1:
    n = 8;
    break;
  case 5:
    n = 4;
    break;
  case 2:
    if (read_varint(c, &v))
      return "truncated field length";
    if (v > c->len - c->pos)
      return "field length runs past the end";
    c->pos += v;
    return NULL;
  default:
    return "bad wire type";
  }
  if (n > c->len - c->pos)
    return "fixed-size field runs past the end";
  c->pos += n;
  return NULL;
}

/* Finds the next packet record in c: 1 with its start and length, 0 at the end, or -1 (-2 over
 * the size cap) with *what saying why. */
static int next_record(struct tr_trace_cursor *c, uint64_t *skipped, size_t *start, size_t *len,
                       size_t *record_start, const char **what) {
  while (c->pos < c->len) {
    *record_start = c->pos;
    uint64_t tag;
    if (read_varint(c, &tag)) {
      *what = "truncated field tag";
      return -1;
    }
    unsigned wt = tag & 7;
    if (tag >> 3 == 0) {
      *what = "field number 0";
      return -1;
    }
    if (tag >> 3 != PACKET_FIELD) {
      if ((*what = skip_field(c, wt)))
        return -1;
      (*skipped)++;
      continue;
    }
    uint64_t n;
    if (wt != 2) {
      *what = "packet field with a wire type other than length-delimited";
      return -1;
    }
    if (read_varint(c, &n)) {
      *what = "truncated packet length";
      return -1;
    }
    if (n > TR_TRACE_READER_MAX_PACKET) {
      *what = "packet length over the maximum packet size";
      return -2;
    }
    if (n > c->len - c->pos) {
      *what = "packet length runs past the end of the input";
      return -1;
    }
    *start = c->pos;
    *len = n;
    c->pos += n;
    return 1;
  }
  return 0;
}

/* Doubles the output buffer (at least 64 KiB or hint), up to TR_TRACE_READER_MAX_INFLATED. */
static int grow_out(uint8_t **out, size_t *cap, size_t hint) {
  if (*cap >= TR_TRACE_READER_MAX_INFLATED)
    return TR_ERR_TOO_BIG;
  size_t n = *cap ? *cap * 2 : (hint < 65536 ? 65536 : hint);
  if (n > TR_TRACE_READER_MAX_INFLATED)
    n = TR_TRACE_READER_MAX_INFLATED;
  uint8_t *p = realloc(*out, n);
  if (!p)
    return TR_ERR_NOMEM;
  *out = p;
  *cap = n;
  return 0;
}

/* zlib or gzip framing (trace_processor accepts both), one or more members back to back. */
static int inflate_zlib(const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len) {
  z_stream z = {0};
  if (inflateInit2(&z, 32 + MAX_WBITS) != Z_OK)
    return TR_ERR_NOMEM;
  size_t cap = 0, used = 0;
  int rc = 0, zrc = Z_OK;
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)in_len; /* in_len <= TR_TRACE_READER_MAX_PACKET fits in uInt */
  while (z.avail_in > 0 || zrc != Z_STREAM_END) {
    if (zrc == Z_STREAM_END && inflateReset(&z) != Z_OK) {
      rc = TR_ERR_DECODE;
      break;
    }
    if (used == cap && (rc = grow_out(out, &cap, in_len * 4)) < 0)
      break;
    z.next_out = *out + used;
    z.avail_out = (uInt)(cap - used);
    zrc = inflate(&z, Z_NO_FLUSH);
    used = cap - z.avail_out;
    /* there is always output room here, so Z_BUF_ERROR means the input ended mid-stream */
    if (zrc != Z_OK && zrc != Z_STREAM_END) {
      rc = TR_ERR_DECODE;
      break;
    }
  }
  inflateEnd(&z);
  *out_len = used;
  return rc;
}

/* One or more zstd frames; the frame header's content size is not trusted. */
static int inflate_zstd(const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len) {
  ZSTD_DCtx *d = ZSTD_createDCtx();
  if (!d)
    return TR_ERR_NOMEM;
  ZSTD_inBuffer ib = {in, in_len, 0};
  size_t cap = 0, used = 0, left = 1;
  int rc = 0;
  while (ib.pos < ib.size || left != 0) {
    if (used == cap && (rc = grow_out(out, &cap, in_len * 4)) < 0)
      break;
    ZSTD_outBuffer ob = {*out, cap, used};
    size_t prev_in = ib.pos, prev_out = used;
    left = ZSTD_decompressStream(d, &ob, &ib);
    used = ob.pos;
    if (ZSTD_isError(left)) {
      rc = TR_ERR_DECODE;
      break;
    }
    if (ib.pos == prev_in && used == prev_out && used < cap) {
      rc = TR_ERR_DECODE; /* no progress with room to spare: the input ends mid-frame */
      break;
    }
  }
  ZSTD_freeDCtx(d);
  *out_len = used;
  return rc;
}

/* Replaces the current compressed packet by its content, read next. */
static int open_compressed(struct tr_trace_reader *r, uint64_t offset) {
  const Perfetto__Protos__TracePacket *p = r->packet;
  bool zstd = p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_ZSTD_COMPRESSED_PACKETS;
  const ProtobufCBinaryData *b = zstd ? &p->zstd_compressed_packets : &p->compressed_packets;
  uint8_t *out = NULL;
  size_t len = 0;
  int rc = zstd ? inflate_zstd(b->data, b->len, &out, &len)
                : inflate_zlib(b->data, b->len, &out, &len);
  drop_packet(r);
  if (rc < 0) {
    free(out);
    return fail(r, rc, offset, -1,
                rc == TR_ERR_TOO_BIG ? "compressed packet inflates beyond the cap"
                : rc == TR_ERR_NOMEM ? "out of memory inflating a compressed packet"
                                     : "corrupt or truncated compressed packet");
  }
  if (zstd)
    r->zstd_packets++;
  else
    r->zlib_packets++;
  r->inflated_bytes += len;
  r->inflated = out;
  r->inner = (struct tr_trace_cursor){.data = out, .len = len};
  r->inner_base = offset;
  return 0;
}

static bool is_compressed(const Perfetto__Protos__TracePacket *p) {
  return p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_COMPRESSED_PACKETS ||
         p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_ZSTD_COMPRESSED_PACKETS;
}

int tr_trace_reader_next(struct tr_trace_reader *r, struct tr_trace_record *rec) {
  if (r->error.code)
    return r->error.code;
  drop_packet(r);
  for (;;) {
    bool in_inner = r->inner.data != NULL;
    struct tr_trace_cursor *c = in_inner ? &r->inner : &r->outer;
    size_t start, len, record_start;
    const char *what = NULL;
    int found = next_record(c, &r->skipped_fields, &start, &len, &record_start, &what);
    uint64_t offset = in_inner ? r->inner_base : record_start;
    int64_t inner = in_inner ? (int64_t)record_start : -1;
    if (found < 0)
      return fail(r, found == -2 ? TR_ERR_TOO_BIG : TR_ERR_DECODE, offset, inner, what);
    if (found == 0) {
      if (!in_inner)
        return 0;
      drop_inner(r);
      continue;
    }
    r->packet = perfetto__protos__trace_packet__unpack(NULL, len, c->data + start);
    if (!r->packet) {
      /* The record's framing is intact, only its content is bad (a producer can write a
       * malformed nested message: services check top-level fields only). Skip it, as
       * trace_processor does, and count it. */
      if (r->undecodable_packets++ == 0)
        r->first_undecodable_offset = offset;
      continue;
    }
    if (is_compressed(r->packet)) {
      if (in_inner)
        return fail(r, TR_ERR_DECODE, offset, inner, "compressed packet inside a compressed one");
      int rc = open_compressed(r, offset);
      if (rc < 0)
        return rc;
      continue;
    }
    r->records++;
    *rec = (struct tr_trace_record){r->packet, offset, inner, len};
    return 1;
  }
}
