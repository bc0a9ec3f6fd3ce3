/* fuzz_ipc_frame.c: libFuzzer target for the IPC frame reader and codec (relay/producer/ipc_frame.h).
 * The first input byte picks the piece size; the rest is used twice: as one IPCFrame payload
 * (decode, re-encode, decode again), and as a byte stream pushed through tr_ipc_reader in
 * pieces of that size, with every frame it yields decoded and re-encoded. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "relay/producer/ipc_frame.h"

static void decode_and_reencode(const uint8_t *payload, size_t len) {
  Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(payload, len);
  if (!f)
    return;
  uint8_t *out;
  size_t out_len;
  if (tr_ipc_frame_encode(f, &out, &out_len) == 0) {
    Perfetto__Protos__IPCFrame *again = tr_ipc_frame_decode(out + 4, out_len - 4);
    if (!again)
      abort(); /* what we encode must parse */
    tr_ipc_frame_free(again);
    free(out);
  }
  tr_ipc_frame_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  size_t step = (size_t)data[0] * 97 + 1;
  decode_and_reencode(data + 1, size - 1);
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  size_t off = 1;
  while (off < size) {
    size_t n = size - off < step ? size - off : step;
    int taken = tr_frame_reader_push(&r, data + off, n);
    if (taken < 0)
      break;
    off += (size_t)taken;
    const uint8_t *payload;
    size_t len;
    int rc;
    while ((rc = tr_frame_reader_next(&r, &payload, &len)) == 1)
      decode_and_reencode(payload, len);
    if (rc < 0)
      break;
    if (r.cap > TR_IPC_MAX_FRAME)
      abort();
  }
  tr_frame_reader_free(&r);
  return 0;
}
