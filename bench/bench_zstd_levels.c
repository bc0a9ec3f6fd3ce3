/* bench_zstd_levels.c: which zstd level the agent's link should use, by measurement (issue 26
 * item 3). The agent's CPU per MB of trace on the link is the batch's encoding, its zstd
 * compression and the cipher over the bytes that remain; a higher level puts fewer bytes on
 * the wire (less cipher, less network) for more zstd.
 *
 * The trace files given (real Perfetto traces: their packets stand in for chunk payloads) are
 * cut into 4 KiB chunks and 1 MiB batches as the agent cuts them, and each batch is encoded by
 * tr_relay_batch_encode, the agent's own call, once raw and once per level. Per level it
 * prints the bytes on the wire per MB of trace and the CPU seconds per MB of: encoding and
 * compressing, decompressing (the service's side), the default cipher over the wire bytes
 * (bare mbedTLS, one end's share, measured in the same run) and their sum for the agent.
 *
 * Usage: bench_zstd_levels [--mib N] [--levels L,L,...] [--suite AES-128-CCM|...] TRACE... */
#include "bench/tls_baseline.h"
#include "relay/link/relay_frame.h"

#include <mbedtls/ssl_ciphersuites.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHUNK_BYTES 4096u
#define BATCH_BYTES (1u << 20)

struct corpus {
  uint8_t *data;
  size_t len;
};

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int read_file(struct corpus *c, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return -1;
  }
  uint8_t buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    uint8_t *grown = realloc(c->data, c->len + n);
    if (!grown) {
      fclose(f);
      return -1;
    }
    c->data = grown;
    memcpy(c->data + c->len, buf, n);
    c->len += n;
  }
  fclose(f);
  return 0;
}

/* One batch's items: chunks of the corpus from offset *pos on (wrapping), about BATCH_BYTES,
 * or the whole corpus once if it is smaller: a batch never holds the same bytes twice, which
 * zstd would find and real traces do not offer. */
struct batch {
  Tracerelay__Chunk chunks[BATCH_BYTES / CHUNK_BYTES];
  Tracerelay__ChunkItem items[BATCH_BYTES / CHUNK_BYTES];
  Tracerelay__ChunkItem *ptrs[BATCH_BYTES / CHUNK_BYTES];
  size_t n;
  size_t payload;
};

static void fill_batch(struct batch *b, const struct corpus *c, size_t *pos) {
  b->n = 0;
  b->payload = 0;
  size_t room = BATCH_BYTES - 4 * CHUNK_BYTES; /* the items' own fields fit beside */
  if (room > c->len)
    room = c->len;
  while (b->payload < room) {
    size_t len = c->len - *pos < CHUNK_BYTES ? c->len - *pos : CHUNK_BYTES;
    if (len > room - b->payload)
      len = room - b->payload;
    Tracerelay__Chunk *m = &b->chunks[b->n];
    *m = (Tracerelay__Chunk)TRACERELAY__CHUNK__INIT;
    m->has_producer_id = m->has_writer_id = m->has_chunk_id = m->has_packet_count = 1;
    m->has_target_buffer = m->has_payload = 1;
    m->producer_id = 1;
    m->writer_id = 1 + (uint32_t)(b->n % 4);
    m->chunk_id = (uint32_t)(*pos / CHUNK_BYTES);
    m->packet_count = 16;
    m->payload.data = c->data + *pos;
    m->payload.len = len;
    b->items[b->n] = (Tracerelay__ChunkItem)TRACERELAY__CHUNK_ITEM__INIT;
    b->items[b->n].item_case = TRACERELAY__CHUNK_ITEM__ITEM_CHUNK;
    b->items[b->n].chunk = m;
    b->ptrs[b->n] = &b->items[b->n];
    b->n++;
    b->payload += len;
    *pos = (*pos + len) % c->len;
  }
}

struct level_result {
  double wire_per_mb; /* bytes on the wire per byte of trace */
  double encode_s;    /* CPU s per MB: encode (+ compress) */
  double decode_s;    /* CPU s per MB: decompress, the service's side */
};

/* Encodes batches of at least mib MiB of trace at this level (compress false: raw). */
static int measure(const struct corpus *c, struct batch *b, int level, bool compress, size_t mib,
                   struct level_result *out) {
  tr_relay_codec codec;
  int rc = tr_relay_codec_init(&codec, level, TR_RELAY_MAX_FRAME_DEFAULT);
  if (rc < 0)
    return rc;
  size_t pos = 0, trace = 0, wire = 0;
  double encode = 0, decode = 0;
  for (uint64_t seq = 1; rc == 0 && trace < mib << 20; seq++) {
    fill_batch(b, c, &pos);
    uint8_t *frame = NULL;
    size_t len = 0;
    double t0 = cpu_now();
    rc = tr_relay_batch_encode(&codec, seq, compress, b->ptrs, b->n, &frame, &len);
    encode += cpu_now() - t0;
    if (rc < 0)
      break;
    Tracerelay__RelayFrame *f = tracerelay__relay_frame__unpack(NULL, len - 4, frame + 4);
    if (!f || !f->chunk_batch) {
      rc = -1;
    } else {
      Tracerelay__ChunkItems *owned = NULL;
      Tracerelay__ChunkItem **items = NULL;
      size_t n = 0;
      t0 = cpu_now();
      rc = tr_relay_batch_items(&codec, f->chunk_batch, &owned, &items, &n);
      decode += cpu_now() - t0;
      if (rc == 0 && n != b->n)
        rc = -1;
      tr_relay_items_free(owned);
    }
    tracerelay__relay_frame__free_unpacked(f, NULL);
    free(frame);
    trace += b->payload;
    wire += len;
  }
  tr_relay_codec_free(&codec);
  double mb = (double)trace / 1e6;
  out->wire_per_mb = (double)wire / (double)trace;
  out->encode_s = encode / mb;
  out->decode_s = decode / mb;
  return rc;
}

static int parse_levels(const char *s, int *levels, int max) {
  int n = 0;
  char *copy = strdup(s), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t && n < max; t = strtok_r(NULL, ",", &save))
    levels[n++] = atoi(t);
  free(copy);
  return n;
}

static int suite_id(const char *name) {
  static const struct {
    const char *name;
    int id;
  } suites[] = {
      {"AES-128-CCM", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_CCM},
      {"AES-128-GCM", MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
      {"CHACHA20-POLY1305", MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256},
  };
  for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++)
    if (strcmp(suites[i].name, name) == 0)
      return suites[i].id;
  return -1;
}

int main(int argc, char **argv) {
  size_t mib = 64;
  const char *levels_arg = "-5,-1,1,2,3,4,6";
  const char *suite = "AES-128-CCM";
  static const struct option opts[] = {{"mib", required_argument, NULL, 'm'},
                                       {"levels", required_argument, NULL, 'l'},
                                       {"suite", required_argument, NULL, 's'},
                                       {NULL, 0, NULL, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    if (o == 'm')
      mib = (size_t)strtoul(optarg, NULL, 10);
    else if (o == 'l')
      levels_arg = optarg;
    else if (o == 's')
      suite = optarg;
    else
      return 2;
  }
  int levels[32];
  int n_levels = parse_levels(levels_arg, levels, 32);
  if (optind >= argc || mib == 0 || n_levels == 0 || suite_id(suite) < 0) {
    fprintf(stderr, "usage: bench_zstd_levels [--mib N] [--levels L,L,...] "
                    "[--suite AES-128-CCM|AES-128-GCM|CHACHA20-POLY1305] TRACE...\n");
    return 2;
  }
  struct corpus c = {0};
  for (int i = optind; i < argc; i++)
    if (read_file(&c, argv[i]) < 0)
      return 1;
  if (c.len == 0) {
    fprintf(stderr, "bench_zstd_levels: the traces are empty\n");
    return 1;
  }
  struct tr_bench_tls_result tls;
  int ret = tr_bench_tls_baseline(suite_id(suite), 16384, mib << 20, &tls);
  if (ret != 0) {
    fprintf(stderr, "bench_zstd_levels: the cipher baseline failed: -0x%04x\n", (unsigned)-ret);
    return 1;
  }
  double cipher_per_mb = tls.cpu_s_per_mb / 2; /* one end's share: encrypt or decrypt */
  struct batch *b = malloc(sizeof *b);
  if (!b)
    return 1;
  printf("corpus %zu bytes, %zu MiB of trace per level, 4 KiB chunks in 1 MiB batches; "
         "cipher %s %.5f CPU s per MB per end\n", c.len, mib, tls.suite, cipher_per_mb);
  printf("%-6s %12s %14s %14s %14s %14s\n", "level", "wire/trace", "encode s/MB",
         "cipher s/MB", "agent s/MB", "decode s/MB");
  for (int i = -1; i < n_levels; i++) {
    struct level_result r;
    bool compress = i >= 0;
    int level = compress ? levels[i] : TR_RELAY_ZSTD_LEVEL_DEFAULT;
    if (measure(&c, b, level, compress, mib, &r) < 0) {
      fprintf(stderr, "bench_zstd_levels: level %d failed\n", level);
      return 1;
    }
    double cipher = cipher_per_mb * r.wire_per_mb;
    char name[16];
    snprintf(name, sizeof name, compress ? "%d" : "raw", level);
    printf("%-6s %12.4f %14.5f %14.5f %14.5f %14.5f\n", name, r.wire_per_mb, r.encode_s,
           cipher, r.encode_s + cipher, r.decode_s);
  }
  free(b);
  free(c.data);
  return 0;
}
