/* relay_frame.h: framing and batch compression for the agent <-> service relay link
 * (protos/tracerelay/relay.proto, docs/relay-protocol.md).
 *
 * A frame is a uint32 little-endian length, then one serialised tracerelay.RelayFrame. Every
 * size from the peer is bounded: a declared length over the reader's max_frame is a protocol
 * error (drop the connection), decoding a frame may allocate at most TR_RELAY_DECODE_AMP times
 * its size, and a compressed batch is decompressed only when its zstd frame declares a content
 * size no larger than the cap, into a buffer of exactly that size: a zip bomb costs at most the
 * cap. Pure code over memory (no sockets); transport-independent.
 *
 * Costs: the reader moves each byte once (plus one compaction of a partial frame per refill);
 * encoding is one protobuf-c pass; batch compression is one extra copy of the items plus zstd. */
#ifndef TR_RELAY_FRAME_H
#define TR_RELAY_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/base/frame_reader.h"

#include <zstd.h>

#include "tracerelay/relay.pb-c.h"

#define TR_RELAY_MAX_FRAME_DEFAULT (4u << 20) /* largest declared frame length, header excluded */
#define TR_RELAY_MAX_FRAME_LIMIT (64u << 20)  /* largest max_frame a side may configure */
#define TR_RELAY_MIN_FRAME 4096u              /* smallest max_frame a side may configure */
/* Room left in a frame for the batch envelope, so a batch whose items fit under
 * max_frame - TR_RELAY_BATCH_HEADROOM can always be sent uncompressed too. */
#define TR_RELAY_BATCH_HEADROOM 64u
#define TR_RELAY_ZSTD_LEVEL_DEFAULT (-1)
/* Decoding a message may allocate at most this many times its encoded size (plus 4 KiB):
 * enough for any honest frame (a 4-byte patch entry is the worst case, ~6x), and a ceiling
 * for frames made of empty sub-messages. */
#define TR_RELAY_DECODE_AMP 16u

/* The stream reader (relay/base/frame_reader.h) with the link's limit: at most one frame of
 * max_payload + 4 bytes is held. Read with the tr_frame_reader_* calls; free with
 * tr_frame_reader_free. */
typedef tr_frame_reader tr_relay_reader;

/* max_frame: largest declared length accepted; 0 = TR_RELAY_MAX_FRAME_DEFAULT. TR_ERR_INVAL
 * outside [TR_RELAY_MIN_FRAME, TR_RELAY_MAX_FRAME_LIMIT]. */
int tr_relay_reader_init(tr_relay_reader *r, size_t max_frame);

/* Decodes a frame payload; NULL when it does not parse or would allocate more than
 * TR_RELAY_DECODE_AMP times its size. Free with tr_relay_frame_free. A frame that parses may
 * still have no message set (msg_case NOT_SET): the caller treats that as a protocol error. */
Tracerelay__RelayFrame *tr_relay_frame_decode(const uint8_t *payload, size_t len);
void tr_relay_frame_free(Tracerelay__RelayFrame *frame);
/* Serialises the header and frame into a new malloc'd buffer. TR_ERR_TOO_BIG when the frame
 * is longer than max_frame. */
int tr_relay_frame_encode(const Tracerelay__RelayFrame *frame, size_t max_frame, uint8_t **out,
                          size_t *out_len);
/* The same for n frames, back to back in one buffer (one write); TR_ERR_TOO_BIG when any is
 * longer than max_frame. */
int tr_relay_frames_encode(const Tracerelay__RelayFrame *const *frames, size_t n, size_t max_frame,
                           uint8_t **out, size_t *out_len);
/* Makes *frame a Heartbeat stamped boottime_ns, held in *hb (both the caller's). */
void tr_relay_frame_heartbeat(Tracerelay__RelayFrame *frame, Tracerelay__Heartbeat *hb,
                              uint64_t boottime_ns);

/* Batch codec state for one connection or one agent: reusable zstd contexts. */
typedef struct tr_relay_codec {
  ZSTD_CCtx *cctx;
  ZSTD_DCtx *dctx;
  size_t max_frame; /* frames built are at most this long; decompression cap */
} tr_relay_codec;

/* level: zstd level (TR_RELAY_ZSTD_LEVEL_DEFAULT = -1, chosen by bench/bench_zstd_levels: the
 * least CPU per MB on both ends of levels -1 to 3; bench/README.md); max_frame as for the reader. */
int tr_relay_codec_init(tr_relay_codec *c, int level, size_t max_frame);
void tr_relay_codec_free(tr_relay_codec *c);

/* Builds a whole ChunkBatch frame (header included) holding items in order. With compress,
 * the serialised items go into one zstd frame, unless that is not smaller (then the batch is
 * sent raw). TR_ERR_TOO_BIG when the serialised items exceed
 * max_frame - TR_RELAY_BATCH_HEADROOM: the caller cuts batches smaller. */
int tr_relay_batch_encode(tr_relay_codec *c, uint64_t seq, bool compress,
                          Tracerelay__ChunkItem *const *items, size_t n_items, uint8_t **out,
                          size_t *out_len);

/* The items of a received batch. Raw batches lend their own items (*owned = NULL); zstd
 * batches are decompressed (cap: c->max_frame) and decoded into *owned, which the caller
 * frees with tr_relay_items_free. TR_ERR_PROTO for a batch inconsistent with its codec,
 * TR_ERR_TOO_BIG / TR_ERR_DECODE for compressed content over the cap or malformed. */
int tr_relay_batch_items(tr_relay_codec *c, const Tracerelay__ChunkBatch *batch,
                         Tracerelay__ChunkItems **owned, Tracerelay__ChunkItem ***items,
                         size_t *n_items);
void tr_relay_items_free(Tracerelay__ChunkItems *items);

/* Decompresses exactly one zstd frame into a new malloc'd buffer. Its content size must be
 * declared and at most cap (else TR_ERR_TOO_BIG), and the frame must fill src exactly and
 * decode to that size (else TR_ERR_DECODE). Allocates at most cap bytes. */
int tr_relay_decompress(tr_relay_codec *c, const uint8_t *src, size_t len, size_t cap,
                        uint8_t **out, size_t *out_len);

/* Chunks and payload bytes of one producer for one of the service's buffers, as carried in a
 * batch or counted lost (per buffer, so that each session counts only its own losses). */
typedef struct tr_relay_tally {
  uint32_t producer_id;
  uint32_t target_buffer;
  uint64_t chunks;
  uint64_t bytes;
  uint64_t packets; /* packets begun in those chunks (tr_chunk_packets_begun) */
} tr_relay_tally;

/* Counts the chunks of items per producer and target buffer into a new malloc'd array
 * (*out = NULL when there are none). O(items x (producer, buffer) pairs in the batch). */
int tr_relay_batch_tally(Tracerelay__ChunkItem *const *items, size_t n_items, tr_relay_tally **out,
                         size_t *n_out);
/* Adds t's chunks/bytes/packets to the entry of its producer and buffer in a growable tally
 * array. */
int tr_relay_tally_add(tr_relay_tally **arr, size_t *n, const tr_relay_tally *t);

#endif
