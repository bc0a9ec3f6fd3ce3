/* tls_ciphers.h: the AEAD ciphers a tracerelay link may use, by the names --cipher takes.
 *
 * Every cipher is TLS 1.2 with ECDHE (forward secrecy) and a 16-byte tag. The default order is
 * the measured one, cheapest CPU per MB first (bench/bench_tls, bench/README.md#bench_tls):
 * mbedTLS 2.28 runs AES-CCM on AES-NI a block at a time, while its GCM computes GHASH one block
 * at a time in C, which makes GCM the dearest of the AES modes here. The server's order decides
 * which cipher a link uses; a client offers only what its list names. */
#ifndef TR_TLS_CIPHERS_H
#define TR_TLS_CIPHERS_H

#include <stddef.h>

/* The names, cheapest first, for --help and error messages. */
#define TR_TLS_CIPHER_NAMES \
  "aes-128-ccm, chacha20-poly1305, aes-256-ccm, aes-128-gcm, aes-256-gcm"

/* Room for every ciphersuite id a list can give (ECDSA and RSA variants) and the closing 0. */
#define TR_TLS_MAX_SUITES 12

/* Turns a comma-separated list of cipher names (NULL or "" for the default, all of them in
 * the order above) into mbedTLS ciphersuite ids, 0-terminated, in the list's order. Returns 0,
 * or -1 with a reason naming the bad word and the valid names in err. */
int tr_tls_ciphers_parse(const char *list, int suites[TR_TLS_MAX_SUITES], char *err,
                         size_t err_len);

#endif
