/* tls.c: TLS 1.2 sessions over memory buffers with mbedTLS 2.28 (see tls.h for the contract).
 *
 * The session's BIO callbacks read from and write to two buffers of TR_TLS_CIPHER_BUFFER
 * bytes, so mbedTLS never sees a socket. Each is allocated when bytes arrive and freed once
 * it is empty again, so an idle session holds none (at a malloc and a free per record, next
 * to the cost of a record's cipher: nothing). Application writes check for room before calling mbedtls_ssl_write(): that way
 * mbedTLS never returns WANT_WRITE in the middle of a record, and its rule "call again with
 * the same data" never reaches our callers. Certificate checks beyond mbedTLS's own (clientAuth
 * usage must be present, the peer must carry a valid machine name) run in the verify callback
 * so that they are reported through the same verify flags.
 *
 * Sessions of one config may run on several threads at once (tls_uv.c runs handshake steps on
 * libuv's workers). What they share is read-only but for two things: the random generator,
 * which mbedTLS locks when built with MBEDTLS_THREADING_C (required below), and the tables of
 * multiples of a curve's generator that mbedTLS 2.28 makes at a group's first use and keeps in
 * it (ecp.c, ecp_mul_comb): our key's group signs and the CA keys' groups verify in every
 * handshake, so their tables are made here, before any session exists. */
#include "relay/link/tls.h"

#include "relay/base/log.h"
#include "relay/link/tls_ciphers.h"
#include "relay/base/tr_error.h"

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/ecp.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crl.h>
#include <mbedtls/x509_crt.h>

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(MBEDTLS_THREADING_C)
#error "handshakes run on worker threads: mbedTLS must be built with MBEDTLS_THREADING_C"
#endif

struct tr_tls_config {
  int refs;
  enum tr_tls_role role;
  char *ca_path; /* named in error messages */
  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
  mbedtls_x509_crt ca;
  mbedtls_x509_crt cert;
  mbedtls_pk_context key;
  mbedtls_x509_crl crl; /* --crl; empty (version 0) without one */
  char *crl_path;
  char **deny; /* --deny, num_deny names */
  size_t num_deny;
  mbedtls_ssl_config conf;
  int suites[TR_TLS_MAX_SUITES]; /* conf points here */
  char ciphers[160];             /* the --cipher list in force, for error messages */
};

/* Bytes live in data[start, end); data is NULL while the buffer is empty. */
struct cipher_buf {
  size_t start, end;
  unsigned char *data; /* TR_TLS_CIPHER_BUFFER bytes */
};

struct tr_tls_session {
  tr_tls_config *cfg;
  mbedtls_ssl_context ssl;
  bool done;
  int error; /* sticky: 0, TR_ERR_TLS, TR_ERR_CLOSED or TR_ERR_NOMEM */
  bool has_peer_name;
  bool bad_peer_name;
  bool denied_peer; /* its name is on --deny */
  bool seen_input;
  unsigned char first_byte; /* of all input: a TLS handshake record starts with 0x16 */
  char server_name[256];
  char peer_name[TR_TLS_MAX_NAME + 1];
  /* The peer's leaf certificate as the verify callback saw it, for error messages. */
  char cert_name[TR_TLS_MAX_NAME + 1];
  mbedtls_x509_time valid_from, valid_to;
  char reason[512];
  struct cipher_buf in, out;
};

/* Room an alert record needs, whatever the ciphersuite. */
#define ALERT_ROOM 64

bool tr_tls_valid_machine_name(const char *name, size_t len) {
  if (len < 1 || len > TR_TLS_MAX_NAME)
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '.' || c == '_' || c == '-'))
      return false;
  }
  return true;
}

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t err_len, const char *fmt, ...) {
  if (err_len == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
}

static const char *mbed_str(int ret, char *buf, size_t len) {
  mbedtls_strerror(ret, buf, len);
  return buf;
}

/* ---- configuration ---- */

/* Why a certificate or key file did not load: the file's own problem (missing, unreadable)
 * in plain words before mbedTLS's code ("PK - Read/write of file failed"). */
static const char *load_error(const char *path, int ret, char *buf, size_t cap) {
  if (access(path, R_OK) != 0)
    return strerror(errno);
  return ret < 0 ? mbed_str(ret, buf, cap) : "some entries are invalid";
}

/* A private key file others can read is refused, as OpenSSH refuses one: whoever can read it
 * can be this host. Bits for the group are refused too when the file is ours; a file owned by
 * another user (root) and shared with our group (root:tracerelay 0640, or Kubernetes' fsGroup
 * on a Secret) is the owner's deliberate choice, as OpenSSH judges it. */
static int check_key_mode(const char *path, char *err, size_t err_len) {
  struct stat st;
  if (stat(path, &st) != 0)
    return 0; /* the load that follows says why it cannot be read */
  mode_t open_bits = st.st_uid == geteuid() ? (S_IRWXG | S_IRWXO) : S_IRWXO;
  if ((st.st_mode & open_bits) == 0)
    return 0;
  set_err(err, err_len, "private key %s is readable by %s (mode %04o): anyone who can read it "
          "can be this host; restrict it with chmod 600 %s", path,
          st.st_mode & S_IRWXO ? "others" : "its group", (unsigned)(st.st_mode & 07777), path);
  return TR_ERR_CONFIG;
}

/* Our own certificate must be for our side of the link, as the peer will judge it (else every
 * handshake fails later, blamed on the peer): an agent's must say clientAuth, as the service's
 * verify_cb demands; the service's serverAuth, or no extended key usage at all, which agents
 * (mbedTLS) accept. */
static bool own_usage_ok(const mbedtls_x509_crt *crt, enum tr_tls_role role) {
  bool has_eku = crt->ext_types & MBEDTLS_X509_EXT_EXTENDED_KEY_USAGE;
  if (role == TR_TLS_SERVER)
    return !has_eku || mbedtls_x509_crt_check_extended_key_usage(
                           crt, MBEDTLS_OID_SERVER_AUTH,
                           MBEDTLS_OID_SIZE(MBEDTLS_OID_SERVER_AUTH)) == 0;
  return has_eku && mbedtls_x509_crt_check_extended_key_usage(
                        crt, MBEDTLS_OID_CLIENT_AUTH, MBEDTLS_OID_SIZE(MBEDTLS_OID_CLIENT_AUTH)) == 0;
}

/* Makes the generator table of an EC key's group now (1 x G), so that sessions on several
 * threads only read it (see the top of the file). Other keys: nothing to do. */
static int precompute_generator(mbedtls_pk_context *pk, mbedtls_ctr_drbg_context *drbg) {
  if (!mbedtls_pk_can_do(pk, MBEDTLS_PK_ECDSA))
    return 0;
  mbedtls_ecp_group *grp = &mbedtls_pk_ec(*pk)->grp;
  mbedtls_ecp_point r;
  mbedtls_mpi one;
  mbedtls_ecp_point_init(&r);
  mbedtls_mpi_init(&one);
  int ret = mbedtls_mpi_lset(&one, 1);
  if (ret == 0)
    ret = mbedtls_ecp_mul(grp, &r, &one, &grp->G, mbedtls_ctr_drbg_random, drbg);
  mbedtls_mpi_free(&one);
  mbedtls_ecp_point_free(&r);
  return ret;
}

/* The CRL of a CA we trust that a peer's certificate must not be on. */
static const mbedtls_x509_crt *crl_issuer(const tr_tls_config *cfg, const mbedtls_x509_crl *crl) {
  for (const mbedtls_x509_crt *ca = &cfg->ca; ca != NULL; ca = ca->next)
    if (ca->subject_raw.len == crl->issuer_raw.len &&
        memcmp(ca->subject_raw.p, crl->issuer_raw.p, crl->issuer_raw.len) == 0)
      return ca;
  return NULL;
}

/* --crl and --deny. A CRL that mbedTLS would hold against every peer (issued by another CA,
 * past its nextUpdate) is refused here, with the file named, rather than at every handshake. */
static int load_revocations(tr_tls_config *cfg, const struct tr_tls_config_opts *opts, char *err,
                            size_t err_len) {
  char why[128];
  if (opts->num_deny > 0) {
    cfg->deny = calloc(opts->num_deny, sizeof *cfg->deny);
    if (cfg->deny == NULL)
      return TR_ERR_NOMEM;
    for (; cfg->num_deny < opts->num_deny; cfg->num_deny++)
      if ((cfg->deny[cfg->num_deny] = strdup(opts->deny[cfg->num_deny])) == NULL)
        return TR_ERR_NOMEM;
  }
  if (opts->crl_path == NULL)
    return 0;
  if ((cfg->crl_path = strdup(opts->crl_path)) == NULL)
    return TR_ERR_NOMEM;
  int ret = mbedtls_x509_crl_parse_file(&cfg->crl, opts->crl_path);
  if (ret != 0) {
    set_err(err, err_len, "cannot load CRL %s: %s; write one with certs/make-certs.sh --revoke "
            "NAME", opts->crl_path, load_error(opts->crl_path, ret, why, sizeof why));
    return TR_ERR_CONFIG;
  }
  for (const mbedtls_x509_crl *c = &cfg->crl; c != NULL; c = c->next) {
    if (crl_issuer(cfg, c) == NULL) {
      set_err(err, err_len, "CRL %s was not issued by the CA %s: write it with that CA "
              "(certs/make-certs.sh --revoke NAME in its directory)", opts->crl_path,
              opts->ca_path);
      return TR_ERR_CONFIG;
    }
    if (mbedtls_x509_time_is_past(&c->next_update)) {
      set_err(err, err_len, "CRL %s is out of date (next update %04d-%02d-%02d): every peer "
              "would be refused; write a fresh one with certs/make-certs.sh --revoke",
              opts->crl_path, c->next_update.year, c->next_update.mon, c->next_update.day);
      return TR_ERR_CONFIG;
    }
  }
  return 0;
}

int tr_tls_config_new(const struct tr_tls_config_opts *opts, tr_tls_config **out, char *err,
                      size_t err_len) {
  static const char pers[] = "tracerelay tls";
  char why[128];
  int rc = TR_ERR_CONFIG;
  int ret;

  set_err(err, err_len, "%s", "");
  if (opts == NULL || out == NULL || opts->ca_path == NULL || opts->cert_path == NULL ||
      opts->key_path == NULL) {
    set_err(err, err_len, "TLS needs a CA, a certificate and a key path");
    return TR_ERR_INVAL;
  }
  tr_tls_config *cfg = calloc(1, sizeof *cfg);
  if (cfg == NULL)
    return TR_ERR_NOMEM;
  cfg->refs = 1;
  cfg->role = opts->role;
  mbedtls_entropy_init(&cfg->entropy);
  mbedtls_ctr_drbg_init(&cfg->drbg);
  mbedtls_x509_crt_init(&cfg->ca);
  mbedtls_x509_crt_init(&cfg->cert);
  mbedtls_pk_init(&cfg->key);
  mbedtls_x509_crl_init(&cfg->crl);
  mbedtls_ssl_config_init(&cfg->conf);
  cfg->ca_path = strdup(opts->ca_path);
  if (cfg->ca_path == NULL) {
    rc = TR_ERR_NOMEM;
    goto fail;
  }

  if (tr_tls_ciphers_parse(opts->ciphers, cfg->suites, err, err_len) != 0)
    goto fail; /* rc is TR_ERR_CONFIG */
  snprintf(cfg->ciphers, sizeof cfg->ciphers, "%s",
           opts->ciphers != NULL && opts->ciphers[0] != '\0' ? opts->ciphers
                                                              : TR_TLS_CIPHER_NAMES);

  ret = mbedtls_ctr_drbg_seed(&cfg->drbg, mbedtls_entropy_func, &cfg->entropy,
                              (const unsigned char *)pers, sizeof pers - 1);
  if (ret != 0) {
    set_err(err, err_len, "cannot seed the random generator: %s", mbed_str(ret, why, sizeof why));
    rc = TR_ERR_TLS;
    goto fail;
  }
  /* A positive return means some certificates in the file did not parse: refuse it whole. */
  ret = mbedtls_x509_crt_parse_file(&cfg->ca, opts->ca_path);
  if (ret != 0) {
    set_err(err, err_len, "cannot load CA certificate %s: %s; make one with certs/make-certs.sh",
            opts->ca_path, load_error(opts->ca_path, ret, why, sizeof why));
    goto fail;
  }
  ret = mbedtls_x509_crt_parse_file(&cfg->cert, opts->cert_path);
  if (ret != 0) {
    set_err(err, err_len, "cannot load certificate %s: %s; issue one with certs/make-certs.sh",
            opts->cert_path, load_error(opts->cert_path, ret, why, sizeof why));
    goto fail;
  }
  if (check_key_mode(opts->key_path, err, err_len) != 0)
    goto fail;
  ret = mbedtls_pk_parse_keyfile(&cfg->key, opts->key_path, NULL);
  if (ret != 0) {
    set_err(err, err_len, "cannot load private key %s: %s (an unencrypted PEM key is needed)",
            opts->key_path, load_error(opts->key_path, ret, why, sizeof why));
    goto fail;
  }
  ret = mbedtls_pk_check_pair(&cfg->cert.pk, &cfg->key);
  if (ret != 0) {
    set_err(err, err_len, "private key %s does not belong to certificate %s: install the pair "
            "certs/make-certs.sh wrote together", opts->key_path, opts->cert_path);
    goto fail;
  }
  if (!own_usage_ok(&cfg->cert, opts->role)) {
    set_err(err, err_len, "certificate %s is not a %s certificate: its extended key usage lacks "
            "%s (is it the %s's?); use the one certs/make-certs.sh issued for the %s",
            opts->cert_path, opts->role == TR_TLS_SERVER ? "service" : "agent",
            opts->role == TR_TLS_SERVER ? "serverAuth" : "clientAuth",
            opts->role == TR_TLS_SERVER ? "agent" : "service",
            opts->role == TR_TLS_SERVER ? "service" : "agent");
    goto fail;
  }
  if (!tr_tls_ciphers_key_ok(&cfg->key)) {
    set_err(err, err_len, "private key %s is not %s, which peers accept: issue a new pair with "
            "certs/make-certs.sh (P-256)", opts->key_path, TR_TLS_KEY_RULE);
    goto fail;
  }
  if (mbedtls_x509_time_is_past(&cfg->cert.valid_to))
    TR_WARN("tls", "certificate %s has expired: peers will refuse it; reissue it with "
            "certs/make-certs.sh", opts->cert_path);
  if (mbedtls_x509_time_is_future(&cfg->cert.valid_from))
    TR_WARN("tls", "certificate %s is not valid yet (check this machine's clock, or wait): "
            "peers will refuse it until then", opts->cert_path);

  if ((rc = load_revocations(cfg, opts, err, err_len)) != 0)
    goto fail;
  rc = TR_ERR_CONFIG;

  ret = mbedtls_ssl_config_defaults(&cfg->conf,
                                    opts->role == TR_TLS_SERVER ? MBEDTLS_SSL_IS_SERVER
                                                                : MBEDTLS_SSL_IS_CLIENT,
                                    MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
  if (ret != 0) {
    set_err(err, err_len, "TLS configuration failed: %s", mbed_str(ret, why, sizeof why));
    rc = TR_ERR_TLS;
    goto fail;
  }
  mbedtls_ssl_conf_rng(&cfg->conf, mbedtls_ctr_drbg_random, &cfg->drbg);
  mbedtls_ssl_conf_min_version(&cfg->conf, MBEDTLS_SSL_MAJOR_VERSION_3, MBEDTLS_SSL_MINOR_VERSION_3);
  mbedtls_ssl_conf_max_version(&cfg->conf, MBEDTLS_SSL_MAJOR_VERSION_3, MBEDTLS_SSL_MINOR_VERSION_3);
  mbedtls_ssl_conf_ciphersuites(&cfg->conf, cfg->suites);
  tr_tls_ciphers_restrict(&cfg->conf);
  mbedtls_ssl_conf_authmode(&cfg->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
  mbedtls_ssl_conf_ca_chain(&cfg->conf, &cfg->ca, cfg->crl_path != NULL ? &cfg->crl : NULL);
  ret = mbedtls_ssl_conf_own_cert(&cfg->conf, &cfg->cert, &cfg->key);
  if (ret != 0) {
    set_err(err, err_len, "cannot use certificate %s: %s", opts->cert_path,
            mbed_str(ret, why, sizeof why));
    rc = TR_ERR_TLS;
    goto fail;
  }
  ret = precompute_generator(&cfg->key, &cfg->drbg);
  for (mbedtls_x509_crt *ca = &cfg->ca; ret == 0 && ca != NULL; ca = ca->next)
    ret = precompute_generator(&ca->pk, &cfg->drbg);
  if (ret != 0) {
    set_err(err, err_len, "elliptic-curve setup failed: %s", mbed_str(ret, why, sizeof why));
    rc = TR_ERR_TLS;
    goto fail;
  }
  *out = cfg;
  return 0;

fail:
  tr_tls_config_unref(cfg);
  return rc;
}

tr_tls_config *tr_tls_config_ref(tr_tls_config *cfg) {
  if (cfg != NULL) /* as unref: none, for an end over a transport without TLS (fuzz/) */
    cfg->refs++;
  return cfg;
}

void tr_tls_config_unref(tr_tls_config *cfg) {
  if (cfg == NULL || --cfg->refs > 0)
    return;
  mbedtls_ssl_config_free(&cfg->conf);
  mbedtls_pk_free(&cfg->key);
  mbedtls_x509_crl_free(&cfg->crl);
  free(cfg->crl_path);
  for (size_t i = 0; i < cfg->num_deny; i++)
    free(cfg->deny[i]);
  free(cfg->deny);
  mbedtls_x509_crt_free(&cfg->cert);
  mbedtls_x509_crt_free(&cfg->ca);
  mbedtls_ctr_drbg_free(&cfg->drbg);
  mbedtls_entropy_free(&cfg->entropy);
  free(cfg->ca_path);
  free(cfg);
}

enum tr_tls_role tr_tls_config_role(const tr_tls_config *cfg) { return cfg->role; }

/* ---- certificate names and verification ---- */

/* The certificate's first SAN dNSName, else its CN; *len 0 if it has neither. */
static const unsigned char *cert_name(const mbedtls_x509_crt *crt, size_t *len) {
  if (crt->ext_types & MBEDTLS_X509_EXT_SUBJECT_ALT_NAME) {
    for (const mbedtls_x509_sequence *cur = &crt->subject_alt_names; cur != NULL; cur = cur->next) {
      if (cur->buf.tag == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_X509_SAN_DNS_NAME) &&
          cur->buf.len > 0) {
        *len = cur->buf.len;
        return cur->buf.p;
      }
    }
  }
  for (const mbedtls_x509_name *n = &crt->subject; n != NULL; n = n->next) {
    if (n->oid.p != NULL && MBEDTLS_OID_CMP(MBEDTLS_OID_AT_CN, &n->oid) == 0) {
      *len = n->val.len;
      return n->val.p;
    }
  }
  *len = 0;
  return NULL;
}

/* Copies a certificate name for a log line, replacing what is not printable. */
static void printable_copy(char *dst, size_t cap, const unsigned char *src, size_t len) {
  size_t n = len < cap - 1 ? len : cap - 1;
  for (size_t i = 0; i < n; i++)
    dst[i] = (src[i] >= 0x20 && src[i] < 0x7f && src[i] != '"') ? (char)src[i] : '?';
  dst[n] = '\0';
}

int tr_tls_config_own_name(const tr_tls_config *cfg, char *out, size_t cap) {
  if (cap == 0)
    return TR_ERR_INVAL;
  size_t len;
  const unsigned char *name = cert_name(&cfg->cert, &len);
  if (name == NULL || !tr_tls_valid_machine_name((const char *)name, len) || len >= cap) {
    printable_copy(out, cap, name ? name : (const unsigned char *)"", name ? len : 0);
    return TR_ERR_CONFIG;
  }
  memcpy(out, name, len);
  out[len] = '\0';
  return 0;
}

static int verify_cb(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags) {
  tr_tls_session *s = ctx;
  if (depth != 0)
    return 0;
  size_t len;
  const unsigned char *name = cert_name(crt, &len);
  printable_copy(s->cert_name, sizeof s->cert_name, name ? name : (const unsigned char *)"", len);
  s->valid_from = crt->valid_from;
  s->valid_to = crt->valid_to;
  if (s->cfg->role != TR_TLS_SERVER)
    return 0;
  /* mbedTLS accepts a certificate without any EKU extension; an agent's must say clientAuth. */
  if (!(crt->ext_types & MBEDTLS_X509_EXT_EXTENDED_KEY_USAGE) ||
      mbedtls_x509_crt_check_extended_key_usage(crt, MBEDTLS_OID_CLIENT_AUTH,
                                                MBEDTLS_OID_SIZE(MBEDTLS_OID_CLIENT_AUTH)) != 0)
    *flags |= MBEDTLS_X509_BADCERT_EXT_KEY_USAGE;
  if (name == NULL || !tr_tls_valid_machine_name((const char *)name, len)) {
    s->bad_peer_name = true;
    *flags |= MBEDTLS_X509_BADCERT_OTHER;
  } else if (tr_tls_config_denies(s->cfg, s->cert_name)) {
    s->denied_peer = true;
    *flags |= MBEDTLS_X509_BADCERT_OTHER;
  }
  return 0;
}

/* ---- error reasons ---- */

static void append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, cap - used, fmt, ap);
  va_end(ap);
}

static void describe_verify_failure(tr_tls_session *s, uint32_t flags) {
  char *r = s->reason;
  size_t cap = sizeof s->reason;
  bool server = s->cfg->role == TR_TLS_SERVER;
  const char *who = server ? "client" : "server";
  const mbedtls_x509_time *from = &s->valid_from, *to = &s->valid_to;

  snprintf(r, cap, "certificate verify failed:");
  if (flags & MBEDTLS_X509_BADCERT_MISSING)
    append(r, cap, " the %s sent no certificate; configure its --cert and --key;", who);
  if (flags & MBEDTLS_X509_BADCERT_NOT_TRUSTED)
    append(r, cap, " %s certificate '%s' is not trusted by CA %s: issue it from that CA with "
           "certs/make-certs.sh, or give this side the CA that issued it;",
           who, s->cert_name, s->cfg->ca_path);
  if (flags & MBEDTLS_X509_BADCERT_EXPIRED)
    append(r, cap, " %s certificate '%s' expired on %04d-%02d-%02d %02d:%02d UTC: issue a new one "
           "with certs/make-certs.sh;", who, s->cert_name, to->year, to->mon, to->day, to->hour,
           to->min);
  if (flags & MBEDTLS_X509_BADCERT_FUTURE)
    append(r, cap, " %s certificate '%s' is not valid before %04d-%02d-%02d %02d:%02d UTC: check "
           "the clocks of both hosts or reissue it;", who, s->cert_name, from->year, from->mon,
           from->day, from->hour, from->min);
  if (flags & MBEDTLS_X509_BADCERT_CN_MISMATCH)
    append(r, cap, " name mismatch: the server certificate is for '%s', not '%s': connect with a "
           "name from its subjectAltName or reissue it with certs/make-certs.sh --service-name %s;",
           s->cert_name, s->server_name, s->server_name);
  if (flags & MBEDTLS_X509_BADCERT_EXT_KEY_USAGE)
    append(r, cap, " %s certificate '%s' is missing the %s usage: reissue it with "
           "certs/make-certs.sh %s;", who, s->cert_name, server ? "clientAuth" : "serverAuth",
           server ? "--agent NAME" : "--service-name NAME");
  if (flags & MBEDTLS_X509_BADCERT_KEY_USAGE)
    append(r, cap, " %s certificate '%s' has a keyUsage that forbids TLS signatures: reissue it "
           "with certs/make-certs.sh;", who, s->cert_name);
  if (flags & MBEDTLS_X509_BADCERT_REVOKED)
    append(r, cap, " %s certificate '%s' is revoked (CRL %s): issue a new one with "
           "certs/make-certs.sh if the host is to come back;", who, s->cert_name,
           s->cfg->crl_path ? s->cfg->crl_path : "");
  if (flags & MBEDTLS_X509_BADCRL_EXPIRED)
    append(r, cap, " the CRL %s is past its next update: write a fresh one with "
           "certs/make-certs.sh --revoke;", s->cfg->crl_path ? s->cfg->crl_path : "");
  if (s->denied_peer)
    append(r, cap, " %s '%s' is denied (--deny);", who, s->cert_name);
  if (s->bad_peer_name)
    append(r, cap, " client certificate name '%s' is not a machine name (1-%d characters of "
           "[A-Za-z0-9._-]): reissue it with certs/make-certs.sh --agent NAME;", s->cert_name,
           TR_TLS_MAX_NAME);
  uint32_t explained = MBEDTLS_X509_BADCERT_MISSING | MBEDTLS_X509_BADCERT_NOT_TRUSTED |
                       MBEDTLS_X509_BADCERT_EXPIRED | MBEDTLS_X509_BADCERT_FUTURE |
                       MBEDTLS_X509_BADCERT_CN_MISMATCH | MBEDTLS_X509_BADCERT_EXT_KEY_USAGE |
                       MBEDTLS_X509_BADCERT_KEY_USAGE | MBEDTLS_X509_BADCERT_REVOKED |
                       MBEDTLS_X509_BADCRL_EXPIRED |
                       (s->bad_peer_name || s->denied_peer ? MBEDTLS_X509_BADCERT_OTHER : 0);
  if (flags & ~explained) {
    char info[256];
    mbedtls_x509_crt_verify_info(info, sizeof info, "", flags & ~explained);
    for (char *p = info; *p; p++)
      if (*p == '\n')
        *p = ';';
    append(r, cap, " %s", info);
  }
  size_t n = strlen(r);
  if (n > 0 && r[n - 1] == ';')
    r[n - 1] = '\0';
}

static const char *alert_name(unsigned char alert) {
  switch (alert) {
  case MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE: return "handshake_failure";
  case MBEDTLS_SSL_ALERT_MSG_BAD_CERT: return "bad_certificate";
  case MBEDTLS_SSL_ALERT_MSG_UNSUPPORTED_CERT: return "unsupported_certificate";
  case MBEDTLS_SSL_ALERT_MSG_CERT_REVOKED: return "certificate_revoked";
  case MBEDTLS_SSL_ALERT_MSG_CERT_EXPIRED: return "certificate_expired";
  case MBEDTLS_SSL_ALERT_MSG_CERT_UNKNOWN: return "certificate_unknown";
  case MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA: return "unknown_ca";
  case MBEDTLS_SSL_ALERT_MSG_ACCESS_DENIED: return "access_denied";
  case MBEDTLS_SSL_ALERT_MSG_PROTOCOL_VERSION: return "protocol_version";
  case MBEDTLS_SSL_ALERT_MSG_INSUFFICIENT_SECURITY: return "insufficient_security";
  case MBEDTLS_SSL_ALERT_MSG_DECODE_ERROR: return "decode_error";
  case MBEDTLS_SSL_ALERT_MSG_BAD_RECORD_MAC: return "bad_record_mac";
  case MBEDTLS_SSL_ALERT_MSG_UNEXPECTED_MESSAGE: return "unexpected_message";
  case MBEDTLS_SSL_ALERT_MSG_INTERNAL_ERROR: return "internal_error";
  }
  return "other";
}

/* Records why the session failed and makes the failure sticky. */
static int fail(tr_tls_session *s, int ret) {
  char why[160];
  if (ret == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY) {
    snprintf(s->reason, sizeof s->reason, "the peer closed the TLS session");
    s->error = TR_ERR_CLOSED;
    return s->error;
  }
  s->error = TR_ERR_TLS;
  switch (ret) {
  case MBEDTLS_ERR_X509_CERT_VERIFY_FAILED:
    describe_verify_failure(s, mbedtls_ssl_get_verify_result(&s->ssl));
    break;
  case MBEDTLS_ERR_SSL_NO_CLIENT_CERTIFICATE:
    describe_verify_failure(s, MBEDTLS_X509_BADCERT_MISSING);
    break;
  case MBEDTLS_ERR_SSL_FATAL_ALERT_MESSAGE: {
    /* mbedTLS leaves the alert in in_msg: [level, description]. */
    unsigned char alert = s->ssl.in_msg != NULL ? s->ssl.in_msg[1] : 0;
    bool cert_alert = alert >= MBEDTLS_SSL_ALERT_MSG_BAD_CERT &&
                      alert <= MBEDTLS_SSL_ALERT_MSG_UNKNOWN_CA;
    if (alert == MBEDTLS_SSL_ALERT_MSG_HANDSHAKE_FAILURE && !s->done) {
      snprintf(s->reason, sizeof s->reason, "the peer refused the session (alert %s, %u): no "
               "cipher in common, most likely; this side offers %s (--cipher), and the peer's "
               "log says what it accepts", alert_name(alert), alert, s->cfg->ciphers);
      break;
    }
    snprintf(s->reason, sizeof s->reason, "the peer refused the session (alert %s, %u)%s",
             alert_name(alert), alert,
             cert_alert ? ": it did not accept this side's certificate; its log says why (CA, "
                          "validity, name or usage)"
                        : "; its log says why");
    break;
  }
  case MBEDTLS_ERR_SSL_NO_USABLE_CIPHERSUITE:
  case MBEDTLS_ERR_SSL_NO_CIPHER_CHOSEN:
    snprintf(s->reason, sizeof s->reason, "no cipher in common: this side accepts %s "
             "(--cipher); the peer offers none of them (its --cipher)", s->cfg->ciphers);
    break;
  case MBEDTLS_ERR_SSL_BAD_HS_PROTOCOL_VERSION:
    snprintf(s->reason, sizeof s->reason, "the peer does not offer TLS 1.2, the only version "
             "tracerelay speaks");
    break;
  case MBEDTLS_ERR_SSL_INVALID_RECORD:
  case MBEDTLS_ERR_SSL_BAD_HS_CLIENT_HELLO:
  case MBEDTLS_ERR_SSL_BAD_HS_SERVER_HELLO:
  case MBEDTLS_ERR_SSL_UNEXPECTED_MESSAGE:
    if (!s->done && s->first_byte != MBEDTLS_SSL_MSG_HANDSHAKE) {
      snprintf(s->reason, sizeof s->reason, "the peer is not speaking TLS (its first byte is "
               "0x%02x): %s", s->first_byte, s->cfg->role == TR_TLS_SERVER
               ? "is a plain-TCP or HTTP client pointed at the relay port?"
               : "is the address a tracerelay service's relay port?");
      break;
    }
    /* fall through */
  default:
    snprintf(s->reason, sizeof s->reason, "TLS error: %s (-0x%04x)",
             mbed_str(ret, why, sizeof why), (unsigned)-ret);
  }
  return s->error;
}

/* ---- memory BIO ---- */

static size_t buf_room(struct cipher_buf *b) {
  if (b->start > 0 && b->end == TR_TLS_CIPHER_BUFFER) {
    memmove(b->data, b->data + b->start, b->end - b->start);
    b->end -= b->start;
    b->start = 0;
  }
  return TR_TLS_CIPHER_BUFFER - b->end;
}

/* TR_ERR_NOMEM when the buffer could not be allocated, else the bytes taken. */
static ssize_t buf_push(struct cipher_buf *b, const void *p, size_t len) {
  if (len == 0)
    return 0;
  if (b->data == NULL && (b->data = malloc(TR_TLS_CIPHER_BUFFER)) == NULL)
    return TR_ERR_NOMEM;
  size_t n = buf_room(b);
  if (n > len)
    n = len;
  memcpy(b->data + b->end, p, n);
  b->end += n;
  return (ssize_t)n;
}

static size_t buf_pop(struct cipher_buf *b, void *p, size_t cap) {
  size_t n = b->end - b->start;
  if (n > cap)
    n = cap;
  if (n > 0)
    memcpy(p, b->data + b->start, n);
  b->start += n;
  if (b->start == b->end) { /* empty: an idle session keeps no buffer */
    free(b->data);
    *b = (struct cipher_buf){0};
  }
  return n;
}

static int bio_send(void *ctx, const unsigned char *p, size_t len) {
  tr_tls_session *s = ctx;
  ssize_t n = buf_push(&s->out, p, len);
  if (n < 0)
    return MBEDTLS_ERR_SSL_ALLOC_FAILED; /* fatal: the session fails with it */
  return n == 0 ? MBEDTLS_ERR_SSL_WANT_WRITE : (int)n;
}

static int bio_recv(void *ctx, unsigned char *p, size_t len) {
  tr_tls_session *s = ctx;
  size_t n = buf_pop(&s->in, p, len);
  return n == 0 ? MBEDTLS_ERR_SSL_WANT_READ : (int)n;
}

/* Free space in the output buffer, counting what compaction would reclaim. */
static size_t out_free(const tr_tls_session *s) {
  return TR_TLS_CIPHER_BUFFER - (s->out.end - s->out.start);
}

/* Pushes out the rest of a record mbedTLS could only partly hand to bio_send (an alert sent
 * while reading, say). mbedtls_ssl_write() with len 0 only flushes when bytes are pending. */
static int flush_pending(tr_tls_session *s) {
  if (s->ssl.out_left == 0)
    return 0;
  int ret = mbedtls_ssl_write(&s->ssl, (const unsigned char *)"", 0);
  if (ret == MBEDTLS_ERR_SSL_WANT_WRITE)
    return TR_ERR_AGAIN;
  return ret < 0 ? fail(s, ret) : 0;
}

/* ---- sessions ---- */

int tr_tls_session_new(tr_tls_config *cfg, const char *server_name, tr_tls_session **out) {
  bool client = cfg->role == TR_TLS_CLIENT;
  if (client && (server_name == NULL || server_name[0] == '\0' ||
                 strlen(server_name) >= sizeof ((tr_tls_session *)0)->server_name))
    return TR_ERR_INVAL;
  tr_tls_session *s = calloc(1, sizeof *s);
  if (s == NULL)
    return TR_ERR_NOMEM;
  s->cfg = tr_tls_config_ref(cfg);
  mbedtls_ssl_init(&s->ssl);
  int rc = TR_ERR_TLS;
  if (mbedtls_ssl_setup(&s->ssl, &cfg->conf) != 0) {
    rc = TR_ERR_NOMEM; /* the only thing setup can run out of is its record buffers */
    goto fail;
  }
  if (client) {
    strcpy(s->server_name, server_name);
    if (mbedtls_ssl_set_hostname(&s->ssl, server_name) != 0) {
      rc = TR_ERR_INVAL;
      goto fail;
    }
  }
  mbedtls_ssl_set_bio(&s->ssl, s, bio_send, bio_recv, NULL);
  mbedtls_ssl_set_verify(&s->ssl, verify_cb, s);
  *out = s;
  return 0;

fail:
  tr_tls_session_free(s);
  return rc;
}

void tr_tls_session_free(tr_tls_session *s) {
  if (s == NULL)
    return;
  mbedtls_ssl_free(&s->ssl);
  tr_tls_config_unref(s->cfg);
  free(s->in.data);
  free(s->out.data);
  free(s);
}

size_t tr_tls_feed_cipher(tr_tls_session *s, const void *data, size_t len) {
  if (!s->seen_input && len > 0) {
    s->seen_input = true;
    s->first_byte = *(const unsigned char *)data;
  }
  ssize_t n = buf_push(&s->in, data, len);
  if (n < 0 && s->error == 0) { /* sticky: the next handshake, read or write reports it */
    snprintf(s->reason, sizeof s->reason, "out of memory for the TLS input buffer");
    s->error = TR_ERR_NOMEM;
  }
  return n < 0 ? 0 : (size_t)n;
}

size_t tr_tls_cipher_pending(const tr_tls_session *s) { return s->out.end - s->out.start; }

size_t tr_tls_take_cipher(tr_tls_session *s, void *buf, size_t cap) {
  return buf_pop(&s->out, buf, cap);
}

/* Takes the peer's name from its certificate once the handshake is over. */
static int finish_handshake(tr_tls_session *s) {
  const mbedtls_x509_crt *peer = mbedtls_ssl_get_peer_cert(&s->ssl);
  size_t len = 0;
  const unsigned char *name = peer ? cert_name(peer, &len) : NULL;
  if (name != NULL && tr_tls_valid_machine_name((const char *)name, len)) {
    memcpy(s->peer_name, name, len);
    s->peer_name[len] = '\0';
    s->has_peer_name = true;
  } else if (s->cfg->role == TR_TLS_SERVER) {
    /* The verify callback refuses such certificates; this is the belt to its braces. */
    snprintf(s->reason, sizeof s->reason, "client certificate carries no valid machine name");
    s->error = TR_ERR_TLS;
    return s->error;
  }
  s->done = true;
  return 0;
}

int tr_tls_handshake(tr_tls_session *s) {
  if (s->error)
    return s->error;
  if (s->done)
    return 0;
  int ret = mbedtls_ssl_handshake(&s->ssl);
  if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE)
    return TR_ERR_AGAIN;
  if (ret != 0)
    return fail(s, ret);
  return finish_handshake(s);
}

bool tr_tls_handshake_done(const tr_tls_session *s) { return s->done; }

int tr_tls_write(tr_tls_session *s, const void *buf, size_t len) {
  if (s->error)
    return s->error;
  if (!s->done)
    return TR_ERR_STATE;
  if (len == 0)
    return 0;
  int rc = flush_pending(s);
  if (rc < 0)
    return rc;
  size_t n = len < TR_TLS_RECORD_PLAINTEXT ? len : TR_TLS_RECORD_PLAINTEXT;
  int expansion = mbedtls_ssl_get_record_expansion(&s->ssl);
  if (expansion < 0)
    return fail(s, expansion);
  if (out_free(s) < n + (size_t)expansion)
    return TR_ERR_AGAIN;
  int ret = mbedtls_ssl_write(&s->ssl, buf, n);
  if (ret < 0)
    return fail(s, ret); /* not WANT_WRITE: the whole record fits */
  return ret;
}

int tr_tls_read(tr_tls_session *s, void *buf, size_t cap) {
  if (s->error)
    return s->error;
  if (!s->done)
    return TR_ERR_STATE;
  if (cap == 0)
    return TR_ERR_INVAL;
  int rc = flush_pending(s);
  if (rc < 0 && rc != TR_ERR_AGAIN)
    return rc;
  for (;;) {
    int ret = mbedtls_ssl_read(&s->ssl, buf, cap > INT32_MAX ? INT32_MAX : cap);
    if (ret > 0)
      return ret;
    if (ret == MBEDTLS_ERR_SSL_WANT_READ || ret == MBEDTLS_ERR_SSL_WANT_WRITE)
      return TR_ERR_AGAIN;
    if (ret < 0)
      return fail(s, ret);
    /* 0: an empty record was consumed; keep going so the input buffer drains. */
  }
}

int tr_tls_close_notify(tr_tls_session *s) {
  if (s->error == TR_ERR_TLS)
    return s->error;
  int rc = flush_pending(s);
  if (rc < 0)
    return rc;
  if (out_free(s) < ALERT_ROOM)
    return TR_ERR_AGAIN;
  int ret = mbedtls_ssl_close_notify(&s->ssl);
  if (ret != 0 && ret != MBEDTLS_ERR_SSL_WANT_WRITE)
    return fail(s, ret);
  return 0;
}

const char *tr_tls_peer_name(const tr_tls_session *s) {
  return s->done && s->has_peer_name ? s->peer_name : NULL;
}

const char *tr_tls_ciphersuite(const tr_tls_session *s) {
  return s->done ? mbedtls_ssl_get_ciphersuite(&s->ssl) : NULL;
}

const char *tr_tls_last_error(const tr_tls_session *s) { return s->reason; }

/* ---- trust after the handshake: revocation, denial, expiry ---- */

static int64_t unix_time(const mbedtls_x509_time *t) {
  struct tm tm = {.tm_year = t->year - 1900, .tm_mon = t->mon - 1, .tm_mday = t->day,
                  .tm_hour = t->hour, .tm_min = t->min, .tm_sec = t->sec};
  return (int64_t)timegm(&tm);
}

int64_t tr_tls_config_cert_expiry(const tr_tls_config *cfg) {
  return unix_time(&cfg->cert.valid_to);
}

int64_t tr_tls_config_ca_expiry(const tr_tls_config *cfg) {
  int64_t earliest = INT64_MAX;
  for (const mbedtls_x509_crt *ca = &cfg->ca; ca != NULL; ca = ca->next) {
    int64_t t = unix_time(&ca->valid_to);
    if (t < earliest)
      earliest = t;
  }
  return earliest;
}

int64_t tr_tls_config_crl_next_update(const tr_tls_config *cfg) {
  int64_t earliest = 0;
  for (const mbedtls_x509_crl *c = &cfg->crl; cfg->crl_path != NULL && c != NULL; c = c->next) {
    int64_t t = unix_time(&c->next_update);
    if (earliest == 0 || t < earliest)
      earliest = t;
  }
  return earliest;
}

bool tr_tls_config_denies(const tr_tls_config *cfg, const char *name) {
  for (size_t i = 0; i < cfg->num_deny; i++)
    if (strcmp(cfg->deny[i], name) == 0)
      return true;
  return false;
}

int64_t tr_tls_peer_expiry(const tr_tls_session *s) {
  const mbedtls_x509_crt *peer = s->done ? mbedtls_ssl_get_peer_cert(&s->ssl) : NULL;
  return peer != NULL ? unix_time(&peer->valid_to) : 0;
}

/* mbedtls_x509_crt_is_revoked reads one CRL's entries and not its issuer: each CRL of the
 * chain is asked only about certificates of its own CA. */
static bool revoked(const tr_tls_config *cfg, const mbedtls_x509_crt *peer) {
  if (cfg->crl_path == NULL)
    return false;
  for (const mbedtls_x509_crl *c = &cfg->crl; c != NULL; c = c->next)
    if (c->issuer_raw.len == peer->issuer_raw.len &&
        memcmp(c->issuer_raw.p, peer->issuer_raw.p, peer->issuer_raw.len) == 0 &&
        mbedtls_x509_crt_is_revoked(peer, c))
      return true;
  return false;
}

bool tr_tls_peer_refusal(const tr_tls_session *s, const tr_tls_config *cfg, char *why,
                         size_t cap) {
  const mbedtls_x509_crt *peer = s->done ? mbedtls_ssl_get_peer_cert(&s->ssl) : NULL;
  if (peer == NULL)
    return false;
  const char *name = s->has_peer_name ? s->peer_name : "?";
  if (revoked(cfg, peer)) {
    set_err(why, cap, "certificate of %s is revoked (CRL %s)", name, cfg->crl_path);
    return true;
  }
  if (s->has_peer_name && tr_tls_config_denies(cfg, s->peer_name)) {
    set_err(why, cap, "%s is denied (--deny)", name);
    return true;
  }
  return false;
}
