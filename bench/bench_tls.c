/* bench_tls.c: bare mbedTLS throughput of every ECDHE-ECDSA AEAD ciphersuite at 16 KiB records, the baseline for
 * the relay's TLS benchmarks. Usage: bench_tls [MiB per suite, default 128].
 *
 * Each figure is one core encrypting and decrypting every byte (client and server share the
 * thread), so a one-way link needs about half this CPU on each end. */
#include "bench/tls_baseline.h"

#include <mbedtls/ssl_ciphersuites.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  long mib = argc > 1 ? strtol(argv[1], NULL, 10) : 128;
  if (argc > 2 || mib <= 0 || mib > 1 << 20) {
    fprintf(stderr, "usage: bench_tls [MiB per ciphersuite, default 128]\n");
    return 2;
  }
  /* Every AEAD suite with ECDHE-ECDSA that Debian's mbedTLS 2.28 offers (ARIA is compiled out) */
  static const int suites[] = {
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CCM,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_CCM,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CCM_8,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_CCM_8,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_CAMELLIA_128_GCM_SHA256,
      MBEDTLS_TLS_ECDHE_ECDSA_WITH_CAMELLIA_256_GCM_SHA384,
  };
  printf("bare mbedTLS loopback in memory, 16384-byte records, %ld MiB per suite, "
         "encrypt + decrypt on one core\n", mib);
  printf("%-48s %10s %14s\n", "ciphersuite", "MB/s", "CPU s per MB");
  for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
    struct tr_bench_tls_result r;
    int ret = tr_bench_tls_baseline(suites[i], 16384, (size_t)mib << 20, &r);
    if (ret != 0) {
      fprintf(stderr, "bench_tls: suite 0x%04x failed: -0x%04x\n", (unsigned)suites[i],
              (unsigned)-ret);
      return 1;
    }
    printf("%-48s %10.1f %14.6f\n", r.suite, r.mb_per_s, r.cpu_s_per_mb);
  }
  return 0;
}
