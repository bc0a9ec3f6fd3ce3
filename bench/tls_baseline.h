/* tls_baseline.h: the cost of bare mbedTLS, the yardstick for every TLS-related benchmark.
 *
 * tr_bench_tls_baseline() runs a TLS 1.2 client and server in one thread, joined by memory
 * buffers (no sockets, no tracerelay code), and times a one-way bulk transfer: every byte is
 * encrypted by the client and decrypted by the server on the same core. Later benchmarks call
 * it in the same run and print their figures as ratios against it. */
#ifndef TR_BENCH_TLS_BASELINE_H
#define TR_BENCH_TLS_BASELINE_H

#include <stddef.h>

struct tr_bench_tls_result {
  const char *suite;   /* the negotiated ciphersuite's name */
  size_t bytes;        /* plaintext bytes transferred */
  double wall_s;       /* elapsed time of the transfer (the handshake excluded) */
  double cpu_s;        /* process CPU time of the transfer */
  double mb_per_s;     /* bytes / wall_s / 1e6 */
  double cpu_s_per_mb; /* cpu_s / (bytes / 1e6) */
};

/* Transfers bytes of plaintext in writes of record_size (<= 16384) bytes with the given
 * ciphersuite (an MBEDTLS_TLS_* id, ECDHE-ECDSA). Returns 0, or a negative mbedTLS error
 * code or -1 for bad arguments. */
int tr_bench_tls_baseline(int ciphersuite, size_t record_size, size_t bytes,
                          struct tr_bench_tls_result *out);

#endif
