/* fuzz_consumer_port.c: libFuzzer over every ConsumerPort request decoder and the EnableTracing
 * config validation (service/consumer_port.c, tr_consumer_port_check_request). Input: one byte
 * choosing the method (1..15, taken modulo 15), then the serialised request (args_proto).
 * Seeds in fuzz/corpus/consumer_port/ are the requests of the real perfetto CLI and SDK. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "service/consumer_port.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  unsigned method = 1u + data[0] % 15u;
  if (tr_consumer_port_check_request(method, data + 1, size - 1) != 0 || method != 1)
    return 0;
  /* An accepted config is copied by re-encoding (session.c) and its data source configs are
   * forwarded to the agents: it must re-encode into bytes that decode again. */
  Perfetto__Protos__EnableTracingRequest *r =
      perfetto__protos__enable_tracing_request__unpack(NULL, size - 1, data + 1);
  if (!r)
    abort();
  size_t n = perfetto__protos__trace_config__get_packed_size(r->trace_config);
  uint8_t *buf = malloc(n + 1);
  perfetto__protos__trace_config__pack(r->trace_config, buf);
  Perfetto__Protos__TraceConfig *copy = perfetto__protos__trace_config__unpack(NULL, n, buf);
  if (!copy)
    abort();
  perfetto__protos__trace_config__free_unpacked(copy, NULL);
  free(buf);
  perfetto__protos__enable_tracing_request__free_unpacked(r, NULL);
  return 0;
}
