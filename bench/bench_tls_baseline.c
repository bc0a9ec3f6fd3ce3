/* bench_tls_baseline.c: one bare-mbedTLS measurement (tls_baseline.h) as one line of JSON, for
 * scripts that compare the relay against it in the same run (bench/bench_relay).
 * Usage: bench_tls_baseline CIPHERSUITE_NAME RECORD_BYTES MIB
 *   e.g. bench_tls_baseline TLS-ECDHE-ECDSA-WITH-AES-128-GCM-SHA256 16384 256
 * Only ECDHE-ECDSA suites: the baseline's server uses mbedTLS's EC test certificate. */
#include "bench/tls_baseline.h"

#include <mbedtls/ssl.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: bench_tls_baseline CIPHERSUITE_NAME RECORD_BYTES MIB\n");
    return 2;
  }
  int suite = mbedtls_ssl_get_ciphersuite_id(argv[1]);
  long record = strtol(argv[2], NULL, 10), mib = strtol(argv[3], NULL, 10);
  if (suite == 0 || record <= 0 || record > 16384 || mib <= 0 || mib > 1 << 20) {
    fprintf(stderr, "bench_tls_baseline: unknown ciphersuite or bad size\n");
    return 2;
  }
  struct tr_bench_tls_result r;
  int ret = tr_bench_tls_baseline(suite, (size_t)record, (size_t)mib << 20, &r);
  if (ret != 0) {
    fprintf(stderr, "bench_tls_baseline: %s failed: -0x%04x\n", argv[1], (unsigned)-ret);
    return 1;
  }
  printf("{\"suite\":\"%s\",\"record\":%ld,\"bytes\":%zu,\"mb_per_s\":%.3f,\"cpu_s_per_mb\":%.6f}\n",
         r.suite, record, r.bytes, r.mb_per_s, r.cpu_s_per_mb);
  return 0;
}
