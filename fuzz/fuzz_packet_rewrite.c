/* fuzz_packet_rewrite.c: feeds fuzzer bytes to tr_rewrite_packet as a producer packet (the
 * first byte picks the sequence state) and checks what must always hold: the result fits
 * TR_REWRITE_OUT_MAX, is itself well-formed where the rewrite reads (rewriting it again never
 * fails to decode), so is the anchor, a buffer one byte short is refused without being overrun
 * (ASan watches the exact-size heap buffers), and a failed call leaves the state alone. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/trace/packet_rewrite.h"
#include "relay/base/tr_error.h"

static tr_rewrite_host host;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!host.machine[0]) {
    static const uint32_t shared[] = {0x80001234u};
    if (tr_rewrite_host_init(&host, "web-3", shared, 1) != 0)
      abort();
  }
  if (size < 1)
    return 0;
  tr_rewrite_seq seq = {.default_clock = data[0] & 1,
                        .anchored = (data[0] & 2) != 0,
                        .anchor_clock = host.builtin[6],
                        .anchor_ts = data[0] >> 2};
  tr_rewrite_seq before = seq;
  const uint8_t *packet = data + 1;
  size_t len = size - 1;

  size_t cap = TR_REWRITE_OUT_MAX(len);
  uint8_t *out = malloc(cap);
  uint8_t anchor[TR_REWRITE_ANCHOR_MAX];
  size_t anchor_len;
  int n = tr_rewrite_packet(&host, &seq, packet, len, out, cap, anchor, &anchor_len);
  if (n < 0) {
    if (n != TR_ERR_DECODE || memcmp(&seq, &before, sizeof seq) != 0 || anchor_len != 0)
      abort();
    free(out);
    return 0;
  }
  if ((size_t)n > cap || anchor_len > TR_REWRITE_ANCHOR_MAX)
    abort();

  /* One byte short: refused, nothing written past the end, state untouched. */
  if (n > 0) {
    uint8_t *tight = malloc((size_t)n - 1);
    tr_rewrite_seq s2 = before;
    size_t a2;
    if (tr_rewrite_packet(&host, &s2, packet, len, tight, (size_t)n - 1, anchor, &a2) !=
            TR_ERR_TOO_BIG ||
        memcmp(&s2, &before, sizeof s2) != 0)
      abort();
    free(tight);
  }

  /* The output and the anchor parse wherever the rewrite looks. */
  uint8_t *again = malloc(TR_REWRITE_OUT_MAX((size_t)n));
  tr_rewrite_seq s3 = {0};
  size_t a3;
  if (tr_rewrite_packet(&host, &s3, out, (size_t)n, again, TR_REWRITE_OUT_MAX((size_t)n), anchor,
                        &a3) < 0)
    abort();
  if (anchor_len) {
    uint8_t copy[TR_REWRITE_ANCHOR_MAX], anchor_out[TR_REWRITE_OUT_MAX(TR_REWRITE_ANCHOR_MAX)];
    memcpy(copy, anchor, anchor_len);
    s3 = (tr_rewrite_seq){0};
    if (tr_rewrite_packet(&host, &s3, copy, anchor_len, anchor_out, sizeof anchor_out, anchor,
                          &a3) < 0)
      abort();
  }
  free(again);
  free(out);
  return 0;
}
