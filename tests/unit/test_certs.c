/* test_certs.c: a throwaway PKI for the tests that speak TLS (see test_certs.h). */
#include "tests/unit/test_certs.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

int test_certs_make(char *dir, size_t dir_len, const char *name, const char *args) {
  snprintf(dir, dir_len, "/tmp/%s.XXXXXX", name);
  if (mkdtemp(dir) == NULL)
    return -1;
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/certs/make-certs.sh %s %s >/dev/null", TR_SOURCE_DIR, dir, args);
  return system(cmd) == 0 ? 0 : -1;
}

int test_certs_remove(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

tr_tls_config *test_certs_config(const char *ca_dir, const char *cert_dir, enum tr_tls_role role,
                                 const char *name) {
  char ca[512], crt[512], key[512], err[512];
  snprintf(ca, sizeof ca, "%s/ca.crt", ca_dir);
  snprintf(crt, sizeof crt, "%s/%s.crt", cert_dir, name);
  snprintf(key, sizeof key, "%s/%s.key", cert_dir, name);
  struct tr_tls_config_opts opts = {.role = role, .ca_path = ca, .cert_path = crt, .key_path = key};
  tr_tls_config *cfg = NULL;
  if (tr_tls_config_new(&opts, &cfg, err, sizeof err) != 0)
    fail_msg("config %s: %s", name, err);
  return cfg;
}
