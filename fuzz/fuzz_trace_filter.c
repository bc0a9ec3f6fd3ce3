/* fuzz_trace_filter.c: feeds fuzzer bytes to relay/trace/trace_filter as an untrusted filter
 * and packet. Layout: [u16 LE bytecode length][u16 LE overlay length][bytecode][overlay]
 * [split byte][packet]. A bytecode that loads is tried as traced uses it (root moved to field
 * 1 when it can be) with one redacting string rule, over the packet cut in two slices at the
 * split byte, and checked: the output never outgrows the input, an error leaves no output, and
 * the same packet in one slice gives the same bytes (ASan watches the exact-size buffers). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/trace/trace_filter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 5)
    return 0;
  size_t code_len = data[0] | (size_t)data[1] << 8, ov_len = data[2] | (size_t)data[3] << 8;
  if (4 + code_len + ov_len + 1 > size)
    return 0;
  const uint8_t *code = data + 4, *ov = code + code_len, *rest = ov + ov_len;
  size_t split = rest[0], len = size - (size_t)(rest + 1 - data);
  const uint8_t *pkt = rest + 1;
  tr_trace_filter *f = tr_trace_filter_new();
  char err[256];
  tr_trace_filter_rule rule = {.policy = TR_SFP_ATRACE_REPEATED_SEARCH_REDACT_GROUPS,
                               .regex = "=([a-z0-9]+)"};
  tr_trace_filter_rule rule2 = {.policy = TR_SFP_MATCH_REDACT_GROUPS, .regex = "(.)(.*)"};
  if (!f || tr_trace_filter_add_rule(f, &rule, err, sizeof err) != 0 ||
      tr_trace_filter_add_rule(f, &rule2, err, sizeof err) != 0)
    abort();
  int rc = tr_trace_filter_load(f, code, code_len, ov, ov_len);
  if (rc != 0) {
    if (rc != TR_ERR_DECODE)
      abort();
    tr_trace_filter_free(f);
    return 0;
  }
  (void)tr_trace_filter_set_root(f, 1);
  if (split > len)
    split = len;
  uint8_t *copy = malloc(len + 1), *out = malloc(len + 1), *out1 = malloc(len + 1);
  memcpy(copy, pkt, len);
  tr_trace_filter_slice two[2] = {{copy, split}, {copy + split, len - split}}, one = {copy, len};
  size_t n2 = 99, n1 = 99;
  int rc2 = tr_trace_filter_run(f, two, 2, out, &n2);
  int rc1 = tr_trace_filter_run(f, &one, 1, out1, &n1);
  if (n2 > len || rc2 != rc1 || n2 != n1 || (rc2 != 0 && n2 != 0) ||
      (rc2 != 0 && rc2 != TR_ERR_DECODE) || memcmp(out, out1, n1) != 0 ||
      memcmp(copy, pkt, len) != 0)
    abort();
  free(copy);
  free(out);
  free(out1);
  tr_trace_filter_free(f);
  return 0;
}
