/* fuzz_relay_frame.c: the relay link's receive path on hostile bytes: the frame reader (fed in
 * pieces whose size the first input byte picks), RelayFrame decoding, re-encoding, and batch
 * decompression under a 64 KiB cap. Also tries the input as a bare zstd frame. Any crash,
 * leak or allocation past the caps is a bug.
 *
 * Only the first MAX_PIECES pieces have the picked size; the rest of the stream goes in as fast
 * as the reader takes it. Every state of the reader (part of a header, part of a payload,
 * frames left behind a refill) is reached within a few frames, while pushing a long stream a
 * byte at a time cost several times the decoding of its frames. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "relay/link/relay_frame.h"

#define CAP (64u << 10)
#define MAX_PIECES 256

static tr_relay_codec codec;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (tr_relay_codec_init(&codec, 1, CAP) < 0)
    abort();
  return 0;
}

static void handle(const uint8_t *payload, size_t len) {
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
  if (!f)
    return;
  uint8_t *out;
  size_t out_len;
  if (tr_relay_frame_encode(f, TR_RELAY_MAX_FRAME_LIMIT, &out, &out_len) == 0)
    free(out);
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH) {
    Tracerelay__ChunkItems *owned;
    Tracerelay__ChunkItem **items;
    size_t n;
    if (tr_relay_batch_items(&codec, f->chunk_batch, &owned, &items, &n) == 0) {
      tr_relay_tally *tally;
      size_t n_tally;
      if (tr_relay_batch_tally(items, n, &tally, &n_tally) == 0)
        free(tally);
      tr_relay_items_free(owned);
    }
  }
  tr_relay_frame_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  size_t step = 1 + data[0] % 64;
  data++;
  size--;

  uint8_t *raw;
  size_t raw_len;
  if (tr_relay_decompress(&codec, data, size, CAP, &raw, &raw_len) == 0)
    free(raw);

  tr_relay_reader r;
  if (tr_relay_reader_init(&r, TR_RELAY_MIN_FRAME * 16) < 0)
    abort();
  for (size_t pieces = 0; size > 0; pieces++) {
    size_t piece = pieces < MAX_PIECES && step < size ? step : size;
    int taken = tr_frame_reader_push(&r, data, piece);
    if (taken < 0)
      break;
    data += taken;
    size -= (size_t)taken;
    const uint8_t *payload;
    size_t len;
    int rc;
    while ((rc = tr_frame_reader_next(&r, &payload, &len)) == 1)
      handle(payload, len);
    if (rc < 0)
      break;
  }
  tr_frame_reader_free(&r);
  return 0;
}
