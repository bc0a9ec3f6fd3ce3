/* tls_baseline.c: bare mbedTLS 2.28 loopback in memory (see tls_baseline.h).
 *
 * The server uses mbedTLS's built-in EC test certificate and the client does not verify it:
 * authentication is not what is measured, and the benchmark needs no files. */
#include "bench/tls_baseline.h"

#include <mbedtls/certs.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/x509_crt.h>

#include <string.h>
#include <time.h>

/* One direction of the in-memory wire; big enough for a full handshake flight. */
struct pipe {
  size_t start, end;
  unsigned char data[64 * 1024];
};

static int pipe_send(void *ctx, const unsigned char *p, size_t len) {
  struct pipe *q = ctx;
  if (q->start == q->end)
    q->start = q->end = 0;
  size_t room = sizeof q->data - q->end;
  if (room == 0)
    return MBEDTLS_ERR_SSL_WANT_WRITE;
  size_t n = len < room ? len : room;
  memcpy(q->data + q->end, p, n);
  q->end += n;
  return (int)n;
}

static int pipe_recv(void *ctx, unsigned char *p, size_t len) {
  struct pipe *q = ctx;
  size_t avail = q->end - q->start;
  if (avail == 0)
    return MBEDTLS_ERR_SSL_WANT_READ;
  size_t n = len < avail ? len : avail;
  memcpy(p, q->data + q->start, n);
  q->start += n;
  return (int)n;
}

static double seconds(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct bench {
  mbedtls_entropy_context entropy;
  mbedtls_ctr_drbg_context drbg;
  mbedtls_x509_crt crt;
  mbedtls_pk_context key;
  mbedtls_ssl_config server_conf, client_conf;
  mbedtls_ssl_context server, client;
  struct pipe to_server, to_client;
  int suites[2];
};

static int setup(struct bench *b, int ciphersuite) {
  int ret = mbedtls_ctr_drbg_seed(&b->drbg, mbedtls_entropy_func, &b->entropy, NULL, 0);
  if (ret == 0)
    ret = mbedtls_x509_crt_parse(&b->crt, (const unsigned char *)mbedtls_test_srv_crt_ec,
                                 mbedtls_test_srv_crt_ec_len);
  if (ret == 0)
    ret = mbedtls_pk_parse_key(&b->key, (const unsigned char *)mbedtls_test_srv_key_ec,
                               mbedtls_test_srv_key_ec_len, NULL, 0);
  if (ret == 0)
    ret = mbedtls_ssl_config_defaults(&b->server_conf, MBEDTLS_SSL_IS_SERVER,
                                      MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
  if (ret == 0)
    ret = mbedtls_ssl_config_defaults(&b->client_conf, MBEDTLS_SSL_IS_CLIENT,
                                      MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
  if (ret != 0)
    return ret;
  b->suites[0] = ciphersuite;
  b->suites[1] = 0;
  mbedtls_ssl_config *confs[] = {&b->server_conf, &b->client_conf};
  for (int i = 0; i < 2; i++) {
    mbedtls_ssl_conf_rng(confs[i], mbedtls_ctr_drbg_random, &b->drbg);
    mbedtls_ssl_conf_ciphersuites(confs[i], b->suites);
    mbedtls_ssl_conf_min_version(confs[i], MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3);
  }
  mbedtls_ssl_conf_authmode(&b->client_conf, MBEDTLS_SSL_VERIFY_NONE);
  ret = mbedtls_ssl_conf_own_cert(&b->server_conf, &b->crt, &b->key);
  if (ret == 0)
    ret = mbedtls_ssl_setup(&b->server, &b->server_conf);
  if (ret == 0)
    ret = mbedtls_ssl_setup(&b->client, &b->client_conf);
  return ret;
}

/* Each side sends into one pipe and reads from the other. */
struct side_bio {
  struct pipe *out, *in;
};

static int side_send(void *ctx, const unsigned char *p, size_t len) {
  return pipe_send(((struct side_bio *)ctx)->out, p, len);
}

static int side_recv(void *ctx, unsigned char *p, size_t len) {
  return pipe_recv(((struct side_bio *)ctx)->in, p, len);
}

static int handshake(struct bench *b) {
  for (int i = 0; i < 100; i++) {
    int rc = mbedtls_ssl_handshake(&b->client);
    int rs = mbedtls_ssl_handshake(&b->server);
    if (rc == 0 && rs == 0)
      return 0;
    if (rc != 0 && rc != MBEDTLS_ERR_SSL_WANT_READ && rc != MBEDTLS_ERR_SSL_WANT_WRITE)
      return rc;
    if (rs != 0 && rs != MBEDTLS_ERR_SSL_WANT_READ && rs != MBEDTLS_ERR_SSL_WANT_WRITE)
      return rs;
  }
  return -1;
}

/* Client writes, server reads, one record at a time. */
static int transfer(struct bench *b, size_t record_size, size_t bytes) {
  static unsigned char out[16384], in[16384];
  memset(out, 0x5a, sizeof out);
  size_t sent = 0;
  while (sent < bytes) {
    size_t n = bytes - sent < record_size ? bytes - sent : record_size;
    int ret = mbedtls_ssl_write(&b->client, out, n);
    if (ret < 0)
      return ret;
    sent += (size_t)ret;
    for (;;) {
      ret = mbedtls_ssl_read(&b->server, in, sizeof in);
      if (ret == MBEDTLS_ERR_SSL_WANT_READ)
        break;
      if (ret < 0)
        return ret;
    }
  }
  return 0;
}

int tr_bench_tls_baseline(int ciphersuite, size_t record_size, size_t bytes,
                          struct tr_bench_tls_result *out) {
  if (record_size == 0 || record_size > 16384 || out == NULL)
    return -1;
  static struct bench b; /* 128 KiB of pipes: keep them off the stack */
  memset(&b, 0, sizeof b);
  mbedtls_entropy_init(&b.entropy);
  mbedtls_ctr_drbg_init(&b.drbg);
  mbedtls_x509_crt_init(&b.crt);
  mbedtls_pk_init(&b.key);
  mbedtls_ssl_config_init(&b.server_conf);
  mbedtls_ssl_config_init(&b.client_conf);
  mbedtls_ssl_init(&b.server);
  mbedtls_ssl_init(&b.client);
  struct side_bio server_bio = {.out = &b.to_client, .in = &b.to_server};
  struct side_bio client_bio = {.out = &b.to_server, .in = &b.to_client};

  int ret = setup(&b, ciphersuite);
  if (ret != 0)
    goto done;
  mbedtls_ssl_set_bio(&b.server, &server_bio, side_send, side_recv, NULL);
  mbedtls_ssl_set_bio(&b.client, &client_bio, side_send, side_recv, NULL);
  ret = handshake(&b);
  if (ret != 0)
    goto done;

  double wall0 = seconds(CLOCK_MONOTONIC), cpu0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
  ret = transfer(&b, record_size, bytes);
  if (ret != 0)
    goto done;
  out->wall_s = seconds(CLOCK_MONOTONIC) - wall0;
  out->cpu_s = seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
  out->suite = mbedtls_ssl_get_ciphersuite(&b.client);
  out->bytes = bytes;
  out->mb_per_s = (double)bytes / out->wall_s / 1e6;
  out->cpu_s_per_mb = out->cpu_s / ((double)bytes / 1e6);

done:
  mbedtls_ssl_free(&b.client);
  mbedtls_ssl_free(&b.server);
  mbedtls_ssl_config_free(&b.client_conf);
  mbedtls_ssl_config_free(&b.server_conf);
  mbedtls_pk_free(&b.key);
  mbedtls_x509_crt_free(&b.crt);
  mbedtls_ctr_drbg_free(&b.drbg);
  mbedtls_entropy_free(&b.entropy);
  return ret;
}
