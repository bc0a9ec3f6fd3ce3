/* test_certs.h: a throwaway PKI for the tests that speak TLS (test_tls_uv, test_relay_link,
 * test_link): certs/make-certs.sh run into a new temporary directory, tr_tls configs read
 * from it, and its removal. */
#ifndef TR_TEST_CERTS_H
#define TR_TEST_CERTS_H

#include <stddef.h>

#include "relay/link/tls.h"

/* Makes /tmp/<name>.XXXXXX into dir (dir_len bytes) and runs make-certs.sh there with args
 * (e.g. "--service-name relay.test --agent web-1"). 0, or -1 on any failure. */
int test_certs_make(char *dir, size_t dir_len, const char *name, const char *args);
/* Removes a directory made by test_certs_make. 0 or -1. */
int test_certs_remove(const char *dir);
/* A config of role with ca_dir's CA and the certificate `name` of cert_dir (name.crt,
 * name.key); fails the test when it cannot be made. */
tr_tls_config *test_certs_config(const char *ca_dir, const char *cert_dir, enum tr_tls_role role,
                                 const char *name);

#endif
