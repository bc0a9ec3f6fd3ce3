/* fuzz_trace_reader.c: `tracerelay inspect` on hostile bytes: the trace reader (record framing,
 * TracePacket decoding, zlib and zstd inflation under their caps) and the resolver behind it
 * (sequence state, incremental clocks, ftrace clocks, ClockSnapshots and remote_clock_sync in the
 * clock graph, host grouping). Any crash, leak, undefined behaviour or hang is a bug; malformed
 * input must only ever end in an error code with an offset inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "relay/reading/trace_inspect.h"

static void touch(const struct tr_inspect_point *p, void *arg) {
  uint64_t *sum = arg;
  *sum += p->raw_ts + p->clock_ts + (p->status == 0 ? (uint64_t)p->trace_ts : 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  uint64_t sum = 0;
  struct tr_inspect_result r;
  int rc = tr_inspect_trace(data, size, touch, &sum, &r);
  if (rc < 0 && r.error.code && r.error.offset >= size)
    abort();
  if (rc == 0) {
    uint64_t packets = 0;
    for (size_t i = 0; i < r.n_hosts; i++)
      packets += r.hosts[i].packets;
    if (packets != r.packets)
      abort();
  }
  tr_inspect_result_free(&r);
  return 0;
}
