/* relay_frame.c: the RelayFrame codec, batch compression and the frame reader's link limits
 * behind relay_frame.h (the reader itself is relay/base/frame_reader.c).
 *
 * Decoding goes through a protobuf-c allocator with a budget proportional to
 * the input, because protobuf-c turns each 2-byte empty sub-message into a ~50-byte struct.
 * Decompression trusts nothing in the zstd frame but its declared content size, checked
 * against the cap before the one allocation; zstd then writes into that buffer and fails
 * rather than overflow it (one-shot decompression needs no window buffer). */
#include "relay/link/relay_frame.h"

#include <stdlib.h>
#include <string.h>

#include "relay/trace/chunk.h"
#include "relay/base/pb_valid.h"
#include "relay/base/tr_error.h"


static void write_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static int check_max_frame(size_t *max_frame) {
  if (*max_frame == 0)
    *max_frame = TR_RELAY_MAX_FRAME_DEFAULT;
  if (*max_frame < TR_RELAY_MIN_FRAME || *max_frame > TR_RELAY_MAX_FRAME_LIMIT)
    return TR_ERR_INVAL;
  return 0;
}

/* ---- reader ---- */

int tr_relay_reader_init(tr_relay_reader *r, size_t max_frame) {
  int rc = check_max_frame(&max_frame);
  tr_frame_reader_init(r, rc < 0 ? 0 : max_frame, false);
  return rc;
}

/* ---- decoding with an allocation budget ---- */

typedef struct budget {
  size_t left;
} budget;

static void *budget_alloc(void *data, size_t size) {
  budget *b = data;
  if (size > b->left)
    return NULL;
  b->left -= size;
  return malloc(size);
}

/* Frees during a failed unpack do not refund the budget: the unpack is abandoned anyway. */
static void plain_free(void *data, void *ptr) {
  (void)data;
  free(ptr);
}

static ProtobufCMessage *decode_bounded(const ProtobufCMessageDescriptor *desc,
                                        const uint8_t *data, size_t len) {
  budget b = {.left = 4096 + TR_RELAY_DECODE_AMP * len};
  ProtobufCAllocator alloc = {.alloc = budget_alloc, .free = plain_free, .allocator_data = &b};
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, &alloc, len, data);
  if (m && !tr_pb_tags_valid(m)) { /* would not re-encode: see pb_valid.h */
    protobuf_c_message_free_unpacked(m, NULL);
    return NULL;
  }
  return m;
}

Tracerelay__RelayFrame *tr_relay_frame_decode(const uint8_t *payload, size_t len) {
  return (Tracerelay__RelayFrame *)decode_bounded(&tracerelay__relay_frame__descriptor, payload,
                                                  len);
}

/* Decoded messages were allocated with malloc, so protobuf-c's default allocator frees them. */
void tr_relay_frame_free(Tracerelay__RelayFrame *frame) {
  if (frame)
    tracerelay__relay_frame__free_unpacked(frame, NULL);
}

void tr_relay_frame_heartbeat(Tracerelay__RelayFrame *frame, Tracerelay__Heartbeat *hb,
                              uint64_t boottime_ns) {
  tracerelay__heartbeat__init(hb);
  hb->has_timestamp_ns = 1;
  hb->timestamp_ns = boottime_ns;
  tracerelay__relay_frame__init(frame);
  frame->msg_case = TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT;
  frame->heartbeat = hb;
}

void tr_relay_items_free(Tracerelay__ChunkItems *items) {
  if (items)
    tracerelay__chunk_items__free_unpacked(items, NULL);
}

int tr_relay_frames_encode(const Tracerelay__RelayFrame *const *frames, size_t n, size_t max_frame,
                           uint8_t **out, size_t *out_len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    size_t size = tracerelay__relay_frame__get_packed_size(frames[i]);
    if (size > max_frame || size > UINT32_MAX)
      return TR_ERR_TOO_BIG;
    total += TR_FRAME_HEADER + size;
  }
  uint8_t *buf = malloc(total);
  if (!buf)
    return TR_ERR_NOMEM;
  uint8_t *at = buf;
  for (size_t i = 0; i < n; i++) {
    size_t size = tracerelay__relay_frame__pack(frames[i], at + TR_FRAME_HEADER);
    write_le32(at, (uint32_t)size);
    at += TR_FRAME_HEADER + size;
  }
  *out = buf;
  *out_len = total;
  return 0;
}

int tr_relay_frame_encode(const Tracerelay__RelayFrame *frame, size_t max_frame, uint8_t **out,
                          size_t *out_len) {
  return tr_relay_frames_encode(&frame, 1, max_frame, out, out_len);
}

/* ---- batches ---- */

int tr_relay_codec_init(tr_relay_codec *c, int level, size_t max_frame) {
  memset(c, 0, sizeof *c);
  int rc = check_max_frame(&max_frame);
  if (rc < 0)
    return rc;
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
    return TR_ERR_INVAL;
  c->max_frame = max_frame;
  c->cctx = ZSTD_createCCtx();
  if (!c->cctx)
    goto nomem;
  c->dctx = ZSTD_createDCtx();
  if (!c->dctx)
    goto nomem;
  if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_compressionLevel, level)) ||
      ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_contentSizeFlag, 1))) {
    tr_relay_codec_free(c);
    return TR_ERR_INVAL;
  }
  return 0;
nomem:
  tr_relay_codec_free(c);
  return TR_ERR_NOMEM;
}

void tr_relay_codec_free(tr_relay_codec *c) {
  ZSTD_freeCCtx(c->cctx);
  ZSTD_freeDCtx(c->dctx);
  memset(c, 0, sizeof *c);
}

/* Compresses the serialised items into *z; *z stays NULL when compression does not pay. */
static int compress_items(tr_relay_codec *c, const Tracerelay__ChunkItems *list, size_t raw_len,
                          uint8_t **z, size_t *z_len) {
  *z = NULL;
  uint8_t *raw = malloc(raw_len ? raw_len : 1);
  if (!raw)
    return TR_ERR_NOMEM;
  tracerelay__chunk_items__pack(list, raw);
  size_t bound = ZSTD_compressBound(raw_len);
  uint8_t *buf = malloc(bound);
  if (!buf) {
    free(raw);
    return TR_ERR_NOMEM;
  }
  size_t n = ZSTD_compress2(c->cctx, buf, bound, raw, raw_len);
  free(raw);
  if (ZSTD_isError(n)) {
    free(buf);
    return TR_ERR_INVAL;
  }
  if (n >= raw_len) {
    free(buf);
    return 0;
  }
  *z = buf;
  *z_len = n;
  return 0;
}

int tr_relay_batch_encode(tr_relay_codec *c, uint64_t seq, bool compress,
                          Tracerelay__ChunkItem *const *items, size_t n_items, uint8_t **out,
                          size_t *out_len) {
  Tracerelay__ChunkItems list = TRACERELAY__CHUNK_ITEMS__INIT;
  list.n_items = n_items;
  list.items = (Tracerelay__ChunkItem **)items;
  size_t raw_len = tracerelay__chunk_items__get_packed_size(&list);
  if (raw_len > c->max_frame - TR_RELAY_BATCH_HEADROOM)
    return TR_ERR_TOO_BIG;

  uint8_t *z = NULL;
  size_t z_len = 0;
  if (compress && n_items > 0) {
    int rc = compress_items(c, &list, raw_len, &z, &z_len);
    if (rc < 0)
      return rc;
  }
  Tracerelay__ChunkBatch batch = TRACERELAY__CHUNK_BATCH__INIT;
  batch.has_seq = 1;
  batch.seq = seq;
  batch.has_codec = 1;
  if (z) {
    batch.codec = TRACERELAY__CODEC__CODEC_ZSTD;
    batch.has_zstd_items = 1;
    batch.zstd_items.data = z;
    batch.zstd_items.len = z_len;
  } else {
    batch.codec = TRACERELAY__CODEC__CODEC_NONE;
    batch.n_items = n_items;
    batch.items = list.items;
  }
  Tracerelay__RelayFrame frame = TRACERELAY__RELAY_FRAME__INIT;
  frame.msg_case = TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH;
  frame.chunk_batch = &batch;
  int rc = tr_relay_frame_encode(&frame, c->max_frame, out, out_len);
  free(z);
  return rc;
}

int tr_relay_decompress(tr_relay_codec *c, const uint8_t *src, size_t len, size_t cap,
                        uint8_t **out, size_t *out_len) {
  unsigned long long size = ZSTD_getFrameContentSize(src, len);
  if (size == ZSTD_CONTENTSIZE_ERROR)
    return TR_ERR_DECODE;
  if (size == ZSTD_CONTENTSIZE_UNKNOWN || size > cap)
    return TR_ERR_TOO_BIG;
  /* One frame, nothing after it: trailing frames would add content the size did not declare. */
  size_t frame_len = ZSTD_findFrameCompressedSize(src, len);
  if (ZSTD_isError(frame_len) || frame_len != len)
    return TR_ERR_DECODE;
  uint8_t *buf = malloc(size ? (size_t)size : 1);
  if (!buf)
    return TR_ERR_NOMEM;
  size_t n = ZSTD_decompressDCtx(c->dctx, buf, (size_t)size, src, len);
  if (ZSTD_isError(n) || n != size) {
    free(buf);
    return TR_ERR_DECODE;
  }
  *out = buf;
  *out_len = n;
  return 0;
}

int tr_relay_batch_items(tr_relay_codec *c, const Tracerelay__ChunkBatch *batch,
                         Tracerelay__ChunkItems **owned, Tracerelay__ChunkItem ***items,
                         size_t *n_items) {
  *owned = NULL;
  switch (batch->codec) {
  case TRACERELAY__CODEC__CODEC_NONE:
    if (batch->has_zstd_items)
      return TR_ERR_PROTO;
    *items = batch->items;
    *n_items = batch->n_items;
    return 0;
  case TRACERELAY__CODEC__CODEC_ZSTD:
    break;
  default:
    return TR_ERR_PROTO;
  }
  if (batch->n_items > 0 || !batch->has_zstd_items)
    return TR_ERR_PROTO;
  uint8_t *raw;
  size_t raw_len;
  int rc = tr_relay_decompress(c, batch->zstd_items.data, batch->zstd_items.len, c->max_frame,
                               &raw, &raw_len);
  if (rc < 0)
    return rc;
  Tracerelay__ChunkItems *list =
      (Tracerelay__ChunkItems *)decode_bounded(&tracerelay__chunk_items__descriptor, raw, raw_len);
  free(raw);
  if (!list)
    return TR_ERR_DECODE;
  *owned = list;
  *items = list->items;
  *n_items = list->n_items;
  return 0;
}

/* ---- per-producer tallies ---- */

int tr_relay_tally_add(tr_relay_tally **arr, size_t *n, const tr_relay_tally *t) {
  for (size_t i = 0; i < *n; i++) {
    if ((*arr)[i].producer_id == t->producer_id && (*arr)[i].target_buffer == t->target_buffer) {
      (*arr)[i].chunks += t->chunks;
      (*arr)[i].bytes += t->bytes;
      (*arr)[i].packets += t->packets;
      return 0;
    }
  }
  tr_relay_tally *grown = realloc(*arr, (*n + 1) * sizeof **arr);
  if (!grown)
    return TR_ERR_NOMEM;
  grown[*n] = *t;
  *arr = grown;
  (*n)++;
  return 0;
}

int tr_relay_batch_tally(Tracerelay__ChunkItem *const *items, size_t n_items, tr_relay_tally **out,
                         size_t *n_out) {
  tr_relay_tally *arr = NULL;
  size_t n = 0;
  for (size_t i = 0; i < n_items; i++) {
    if (items[i]->item_case != TRACERELAY__CHUNK_ITEM__ITEM_CHUNK)
      continue;
    const Tracerelay__Chunk *chunk = items[i]->chunk;
    uint32_t begun = tr_chunk_packets_begun(chunk->payload.data, chunk->payload.len,
                                            (uint16_t)(chunk->packet_count & 0x3ff),
                                            (uint8_t)chunk->flags, chunk->incomplete);
    tr_relay_tally t = {.producer_id = chunk->producer_id,
                        .target_buffer = chunk->target_buffer,
                        .chunks = 1,
                        .bytes = chunk->payload.len,
                        .packets = begun};
    int rc = tr_relay_tally_add(&arr, &n, &t);
    if (rc < 0) {
      free(arr);
      return rc;
    }
  }
  *out = arr;
  *n_out = n;
  return 0;
}
