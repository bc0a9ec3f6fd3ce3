/* fuzz_consumer_port.c: libFuzzer over every ConsumerPort request decoder and the EnableTracing
 * config validation (service/consumer_port.c, tr_consumer_check_request). Input: one byte
 * choosing the method (1..15, taken modulo 15), then the serialised request (args_proto).
 * Seeds in fuzz/corpus/consumer_port/ are the requests of the real perfetto CLI and SDK. */
#include <stddef.h>
#include <stdint.h>

#include "service/consumer_port.h"

/* The decoders never reach the agents; the link server's downward calls are not linked in. */
int tr_host_send_command(tr_host *host, const Tracerelay__Command *cmd) {
  (void)host;
  (void)cmd;
  return 0;
}

void tr_host_probe_clock(tr_host *host) {
  (void)host;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  tr_consumer_check_request(1u + data[0] % 15u, data + 1, size - 1);
  return 0;
}
