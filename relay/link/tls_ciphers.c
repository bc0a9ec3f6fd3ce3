/* tls_ciphers.c: the table of AEAD ciphers behind --cipher, and the groups, hashes and
 * certificate keys a link accepts (see tls_ciphers.h). */
#include "relay/link/tls_ciphers.h"

#include <mbedtls/ecp.h>
#include <mbedtls/ssl_ciphersuites.h>
#include <mbedtls/x509_crt.h>

#include <stdio.h>
#include <string.h>

struct cipher {
  const char *name;
  int ecdsa_suite;
  int rsa_suite; /* 0: TLS defines no ECDHE-RSA suite with this cipher */
};

/* Cheapest CPU per MB first, as bench_tls measured (tls_ciphers.h). */
static const struct cipher kCiphers[] = {
    {"aes-128-ccm", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CCM, 0},
    {"chacha20-poly1305", MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
     MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256},
    {"aes-256-ccm", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_CCM, 0},
    {"aes-128-gcm", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
     MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256},
    {"aes-256-gcm", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
     MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384},
};
enum { CIPHER_COUNT = sizeof kCiphers / sizeof kCiphers[0] };
_Static_assert(2 * CIPHER_COUNT + 1 <= TR_TLS_MAX_SUITES, "TR_TLS_MAX_SUITES is too small");

static const struct cipher *find(const char *word, size_t len) {
  for (size_t i = 0; i < CIPHER_COUNT; i++)
    if (strlen(kCiphers[i].name) == len && strncmp(kCiphers[i].name, word, len) == 0)
      return &kCiphers[i];
  return NULL;
}

static int add(int suites[TR_TLS_MAX_SUITES], int *n, const struct cipher *c) {
  for (int i = 0; i < *n; i++)
    if (suites[i] == c->ecdsa_suite)
      return -1;
  suites[(*n)++] = c->ecdsa_suite;
  if (c->rsa_suite != 0)
    suites[(*n)++] = c->rsa_suite;
  return 0;
}

int tr_tls_ciphers_parse(const char *list, int suites[TR_TLS_MAX_SUITES], char *err,
                         size_t err_len) {
  int n = 0;
  if (list == NULL || list[0] == '\0') {
    for (size_t i = 0; i < CIPHER_COUNT; i++)
      add(suites, &n, &kCiphers[i]);
    suites[n] = 0;
    return 0;
  }
  for (const char *p = list; *p != '\0';) {
    size_t len = strcspn(p, ",");
    const struct cipher *c = find(p, len);
    if (c == NULL || add(suites, &n, c) != 0) {
      snprintf(err, err_len, "%s cipher '%.*s': give a comma-separated list of %s",
               c == NULL ? "unknown" : "repeated", (int)len, p, TR_TLS_CIPHER_NAMES);
      return -1;
    }
    p += len;
    if (*p == ',' && *++p == '\0') {
      snprintf(err, err_len, "a cipher name is missing after the last comma");
      return -1;
    }
  }
  suites[n] = 0;
  return 0;
}

/* X25519 first: the cheapest of the three, and what most TLS stacks prefer. */
static const mbedtls_ecp_group_id kGroups[] = {MBEDTLS_ECP_DP_CURVE25519, MBEDTLS_ECP_DP_SECP256R1,
                                               MBEDTLS_ECP_DP_SECP384R1, MBEDTLS_ECP_DP_NONE};
static const int kSigHashes[] = {MBEDTLS_MD_SHA256, MBEDTLS_MD_SHA384, MBEDTLS_MD_SHA512,
                                 MBEDTLS_MD_NONE};
/* X25519 is no signature curve: certificates' EC keys are on P-256 or P-384. */
static const mbedtls_x509_crt_profile kCertProfile = {
    .allowed_mds = MBEDTLS_X509_ID_FLAG(MBEDTLS_MD_SHA256) |
                   MBEDTLS_X509_ID_FLAG(MBEDTLS_MD_SHA384) | MBEDTLS_X509_ID_FLAG(MBEDTLS_MD_SHA512),
    .allowed_pks = MBEDTLS_X509_ID_FLAG(MBEDTLS_PK_ECDSA) | MBEDTLS_X509_ID_FLAG(MBEDTLS_PK_ECKEY) |
                   MBEDTLS_X509_ID_FLAG(MBEDTLS_PK_RSA),
    .allowed_curves = MBEDTLS_X509_ID_FLAG(MBEDTLS_ECP_DP_SECP256R1) |
                      MBEDTLS_X509_ID_FLAG(MBEDTLS_ECP_DP_SECP384R1),
    .rsa_min_bitlen = 2048,
};

void tr_tls_ciphers_restrict(mbedtls_ssl_config *conf) {
  mbedtls_ssl_conf_curves(conf, kGroups);
  mbedtls_ssl_conf_sig_hashes(conf, kSigHashes);
  mbedtls_ssl_conf_cert_profile(conf, &kCertProfile);
}

bool tr_tls_ciphers_key_ok(const mbedtls_pk_context *key) {
  if (mbedtls_pk_can_do(key, MBEDTLS_PK_ECKEY)) {
    mbedtls_ecp_group_id id = mbedtls_pk_ec(*key)->grp.id;
    return id == MBEDTLS_ECP_DP_SECP256R1 || id == MBEDTLS_ECP_DP_SECP384R1;
  }
  return mbedtls_pk_get_type(key) == MBEDTLS_PK_RSA && mbedtls_pk_get_bitlen(key) >= 2048;
}
