/* packet_compress.c: groups of packets into one compressed TracePacket (packet_compress.h).
 *
 * The output buffer starts with HEAD bytes of room: the compressed packet's preamble (field
 * tag, varint length) is known only at the end, and is written right-aligned into that room,
 * so the packet is contiguous without moving the compressed bytes.
 *
 * deflate streams into the buffer as packets are added. zstd does not: its tables are sized
 * for the input, and only an input of known size lets it shrink them to the window (at level
 * 22, streamed with the window capped, it still took 674 MB; compressed whole, it fits in
 * tens of MiB). So a zstd group's records are gathered (about group_bytes, plus the last
 * packet) and compressed whole at finish, one frame that also states its content size. */
#include "relay/trace/packet_compress.h"

#include <limits.h>
#include <stdalign.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "relay/base/byte_buf.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

#define HEAD 16u /* > a 2-byte tag + a 10-byte varint */
#define FIRST_OUT (16u * 1024u)

struct tr_packet_compress {
  enum tr_packet_codec codec;
  size_t group_bytes;
  z_stream z;        /* deflate: its allocations counted in z_bytes */
  size_t z_bytes;
  ZSTD_CCtx *zc;     /* zstd */
  tr_byte_buf raw;   /* zstd: the group's records, compressed at finish */
  uint8_t *out;      /* HEAD bytes of room, then the group's compressed bytes */
  size_t out_cap;    /* bytes after HEAD */
  size_t out_len;
  size_t in_bytes;   /* of the packets added to the group */
  size_t packets;
  int broken;        /* the error that broke the group mid-way (finish returns it), or 0 */
};

/* deflate's allocations, counted so that tr_packet_compress_memory covers them. */
typedef union {
  size_t size;
  max_align_t align;
} z_header;

static voidpf z_alloc(voidpf opaque, uInt items, uInt size) {
  tr_packet_compress *pc = opaque;
  size_t n = (size_t)items * size;
  z_header *h = malloc(sizeof *h + n);
  if (!h)
    return Z_NULL;
  h->size = n;
  pc->z_bytes += n;
  return h + 1;
}

static void z_free(voidpf opaque, voidpf p) {
  tr_packet_compress *pc = opaque;
  z_header *h = (z_header *)p - 1;
  pc->z_bytes -= h->size;
  free(h);
}

enum tr_packet_codec tr_packet_compress_codec(const Perfetto__Protos__TraceConfig *cfg,
                                              int *level) {
  const Perfetto__Protos__TraceConfig__CompressionConfig *c = cfg->compression;
  *level = 0;
  if (c && c->zstd) {
    *level = c->zstd->has_level ? c->zstd->level : 0;
    return TR_PACKET_CODEC_ZSTD;
  }
  if ((c && c->deflate) ||
      (cfg->has_compression_type &&
       cfg->compression_type ==
           PERFETTO__PROTOS__TRACE_CONFIG__COMPRESSION_TYPE__COMPRESSION_TYPE_DEFLATE))
    return TR_PACKET_CODEC_DEFLATE;
  return TR_PACKET_CODEC_NONE;
}

static int start_codec(tr_packet_compress *pc, int level) {
  if (pc->codec == TR_PACKET_CODEC_DEFLATE) {
    pc->z.zalloc = z_alloc;
    pc->z.zfree = z_free;
    pc->z.opaque = pc;
    int zrc = deflateInit(&pc->z, TR_PACKET_COMPRESS_DEFLATE_LEVEL);
    return zrc == Z_OK ? 0 : zrc == Z_MEM_ERROR ? TR_ERR_NOMEM : TR_ERR_INVAL;
  }
  if (!(pc->zc = ZSTD_createCCtx()))
    return TR_ERR_NOMEM;
  /* zstd clamps a level outside its range itself, as traced relies on. */
  if (ZSTD_isError(ZSTD_CCtx_setParameter(pc->zc, ZSTD_c_compressionLevel, level)) ||
      ZSTD_isError(ZSTD_CCtx_setParameter(pc->zc, ZSTD_c_windowLog,
                                          TR_PACKET_COMPRESS_ZSTD_WINDOW_LOG)))
    return TR_ERR_INVAL;
  return 0;
}

int tr_packet_compress_new(enum tr_packet_codec codec, int level, size_t group_bytes,
                           tr_packet_compress **out) {
  *out = NULL;
  if ((codec != TR_PACKET_CODEC_DEFLATE && codec != TR_PACKET_CODEC_ZSTD) || group_bytes == 0)
    return TR_ERR_INVAL;
  tr_packet_compress *pc = calloc(1, sizeof *pc);
  if (!pc)
    return TR_ERR_NOMEM;
  pc->codec = codec;
  pc->group_bytes = group_bytes;
  int rc = start_codec(pc, level);
  if (rc != 0) {
    tr_packet_compress_free(pc);
    return rc;
  }
  *out = pc;
  return 0;
}

void tr_packet_compress_free(tr_packet_compress *pc) {
  if (!pc)
    return;
  if (pc->codec == TR_PACKET_CODEC_DEFLATE && pc->z.state)
    deflateEnd(&pc->z);
  ZSTD_freeCCtx(pc->zc);
  tr_byte_buf_free(&pc->raw);
  free(pc->out);
  free(pc);
}

/* At least `need` bytes of room after out_len for the codec to write into, by doubling. */
static int out_room(tr_packet_compress *pc, size_t need) {
  if (pc->out_cap - pc->out_len >= need)
    return 0;
  size_t cap = pc->out_cap ? pc->out_cap : FIRST_OUT;
  while (cap - pc->out_len < need)
    cap *= 2;
  uint8_t *grown = realloc(pc->out, HEAD + cap);
  if (!grown)
    return TR_ERR_NOMEM;
  pc->out = grown;
  pc->out_cap = cap;
  return 0;
}

/* Feeds bytes to the codec (end: and ends its stream). */
static int feed_deflate(tr_packet_compress *pc, const uint8_t *p, size_t n, bool end) {
  for (;;) {
    int rc = out_room(pc, 1);
    if (rc != 0)
      return rc;
    uInt in = n > UINT_MAX ? UINT_MAX : (uInt)n;
    size_t room = pc->out_cap - pc->out_len;
    pc->z.next_in = (Bytef *)p;
    pc->z.avail_in = in;
    pc->z.next_out = pc->out + HEAD + pc->out_len;
    pc->z.avail_out = room > UINT_MAX ? UINT_MAX : (uInt)room;
    uInt avail_out = pc->z.avail_out;
    int zrc = deflate(&pc->z, end ? Z_FINISH : Z_NO_FLUSH);
    pc->out_len += avail_out - pc->z.avail_out;
    p += in - pc->z.avail_in;
    n -= in - pc->z.avail_in;
    if (zrc == Z_STREAM_END)
      return 0;
    /* Z_BUF_ERROR: no progress possible for want of output room, which the next turn adds */
    if (zrc != Z_OK && zrc != Z_BUF_ERROR)
      return TR_ERR_INVAL;
    if (!end && n == 0)
      return 0;
  }
}

static int feed_zstd(tr_packet_compress *pc, const uint8_t *p, size_t n, bool end) {
  if (!end)
    return tr_byte_buf_append(&pc->raw, p, n, FIRST_OUT);
  int rc = out_room(pc, ZSTD_compressBound(pc->raw.len));
  if (rc != 0)
    return rc;
  size_t z = ZSTD_compress2(pc->zc, pc->out + HEAD, pc->out_cap, pc->raw.data, pc->raw.len);
  if (ZSTD_isError(z))
    return ZSTD_getErrorCode(z) == ZSTD_error_memory_allocation ? TR_ERR_NOMEM : TR_ERR_INVAL;
  pc->out_len = z;
  return 0;
}

static int feed(tr_packet_compress *pc, const uint8_t *p, size_t n, bool end) {
  int rc = pc->codec == TR_PACKET_CODEC_DEFLATE ? feed_deflate(pc, p, n, end)
                                                : feed_zstd(pc, p, n, end);
  if (rc != 0)
    pc->broken = rc;
  return rc;
}

int tr_packet_compress_add(tr_packet_compress *pc, const uint8_t *data, size_t len,
                           const uint8_t *tail, size_t tail_len) {
  uint8_t head[1 + 10];
  size_t size = len + tail_len, hl;
  int rc;
  if (pc->broken)
    return pc->broken;
  if (len > UINT32_MAX || tail_len > UINT32_MAX || size > UINT32_MAX)
    return TR_ERR_TOO_BIG;
  head[0] = 0x0A; /* Trace.packet, length-delimited */
  hl = 1 + tr_varint_put(head + 1, size);
  if ((rc = feed(pc, head, hl, false)) != 0 || (len && (rc = feed(pc, data, len, false)) != 0) ||
      (tail_len && (rc = feed(pc, tail, tail_len, false)) != 0))
    return rc;
  pc->in_bytes += size;
  pc->packets++;
  return 0;
}

bool tr_packet_compress_full(const tr_packet_compress *pc) {
  return pc->in_bytes >= pc->group_bytes;
}

size_t tr_packet_compress_count(const tr_packet_compress *pc) { return pc->packets; }

static void restart(tr_packet_compress *pc) {
  if (pc->codec == TR_PACKET_CODEC_DEFLATE)
    deflateReset(&pc->z);
  pc->raw.len = 0;
  pc->out_len = 0;
  pc->in_bytes = 0;
  pc->packets = 0;
  pc->broken = 0;
}

int tr_packet_compress_finish(tr_packet_compress *pc, const uint8_t **packet, size_t *len) {
  uint8_t pre[HEAD];
  size_t pl;
  *packet = NULL;
  *len = 0;
  if (pc->packets == 0 && !pc->broken)
    return TR_ERR_STATE;
  int rc = pc->broken ? pc->broken : feed(pc, NULL, 0, true);
  if (rc != 0) {
    restart(pc);
    return rc;
  }
  uint32_t field = pc->codec == TR_PACKET_CODEC_DEFLATE ? TR_PACKET_COMPRESS_FIELD_DEFLATE
                                                        : TR_PACKET_COMPRESS_FIELD_ZSTD;
  pl = tr_varint_put(pre, (uint64_t)field << 3 | 2);
  pl += tr_varint_put(pre + pl, pc->out_len);
  memcpy(pc->out + HEAD - pl, pre, pl);
  *packet = pc->out + HEAD - pl;
  *len = pl + pc->out_len;
  restart(pc); /* the bytes stay in out until the next add writes over them */
  return 0;
}

void tr_packet_compress_reset(tr_packet_compress *pc) { restart(pc); }

size_t tr_packet_compress_memory(const tr_packet_compress *pc) {
  size_t codec = pc->codec == TR_PACKET_CODEC_DEFLATE ? pc->z_bytes : ZSTD_sizeof_CCtx(pc->zc);
  return sizeof *pc + codec + pc->raw.cap + (pc->out ? HEAD + pc->out_cap : 0);
}
