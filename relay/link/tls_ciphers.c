/* tls_ciphers.c: the table of AEAD ciphers behind --cipher (see tls_ciphers.h). */
#include "relay/link/tls_ciphers.h"

#include <mbedtls/ssl_ciphersuites.h>

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
