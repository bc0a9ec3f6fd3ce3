/* tls_ciphers.h: the cryptography a tracerelay link may use: the AEAD ciphers, by the names
 * --cipher takes, and the key-exchange groups, signature hashes and certificate keys both ends
 * accept (tr_tls_ciphers_restrict).
 *
 * Every cipher is TLS 1.2 with ECDHE (forward secrecy) and a 16-byte tag. The default order is
 * the measured one, cheapest CPU per MB first (bench/bench_tls, bench/README.md#bench_tls):
 * mbedTLS 2.28 runs AES-CCM on AES-NI a block at a time, while its GCM computes GHASH one block
 * at a time in C, which makes GCM the dearest of the AES modes here. The server's order decides
 * which cipher a link uses; a client offers only what its list names. */
#ifndef TR_TLS_CIPHERS_H
#define TR_TLS_CIPHERS_H

#include <stdbool.h>
#include <stddef.h>

#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>

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

/* What every link allows beyond its ciphers, on both ends (mbedTLS's defaults take any curve
 * it knows, SHA-224 signatures and SHA-224 certificates):
 * - ECDHE over X25519, P-256 or P-384 only;
 * - handshake signatures (ServerKeyExchange, CertificateVerify) with SHA-256, -384 or -512;
 * - peer certificates signed with SHA-256 or stronger, their keys ECDSA on P-256 or P-384, or
 *   RSA of 2048 bits or more.
 * A peer that offers nothing of these fails its handshake (no cipher in common, or a
 * certificate refused as using a bad key or hash). conf must outlive nothing it is given: the
 * lists are static. */
void tr_tls_ciphers_restrict(mbedtls_ssl_config *conf);
/* True if this side's own key is one the other end accepts under those rules (P-256, P-384,
 * RSA >= 2048): a certificate on another curve would load and then fail every handshake. */
bool tr_tls_ciphers_key_ok(const mbedtls_pk_context *key);
/* The rule tr_tls_ciphers_key_ok applies, for error messages. */
#define TR_TLS_KEY_RULE "an EC key on P-256 or P-384, or RSA of at least 2048 bits"

#endif
