/* commit_latency.c: commit-to-free latency sampling (commit_latency.h). */
#include "tools/loadgen/commit_latency.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay/base/tr_error.h"

#define SAMPLE_EVERY_NS 1000000ull /* one sample per millisecond at most */
#define POLL_NS 20000L
#define GIVE_UP_NS 10000000000ull
#define MAX_SAMPLES 200000

struct lg_latency {
  const lg_smb *smb;
  pthread_t thread;
  pthread_mutex_t lock; /* guards the offer below */
  bool pending;         /* an offer waits for the sampler */
  bool stop;
  uint32_t page, chunk;
  uint64_t t0_ns, last_taken_ns;
  uint8_t header[8]; /* the chunk's header when it was offered */
  uint64_t t_taken_ns; /* when the IPC thread took the pending commit; 0: not yet */
  uint64_t *samples_ns;
  uint64_t *to_send_ns; /* per sample, commit -> taken (the whole wait if never taken) */
  size_t n;
  uint64_t unfinished;
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void lg_latency_offer(lg_latency *l, uint32_t page, uint32_t chunk) {
  uint64_t t = now_ns();
  if (__atomic_load_n(&l->pending, __ATOMIC_RELAXED) ||
      t - __atomic_load_n(&l->last_taken_ns, __ATOMIC_RELAXED) < SAMPLE_EVERY_NS)
    return;
  pthread_mutex_lock(&l->lock);
  if (!l->pending) {
    l->page = page;
    l->chunk = chunk;
    memcpy(l->header, lg_smb_chunk_at(l->smb, page, chunk), sizeof l->header);
    l->t0_ns = t;
    l->t_taken_ns = 0;
    __atomic_store_n(&l->last_taken_ns, t, __ATOMIC_RELAXED);
    __atomic_store_n(&l->pending, true, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&l->lock);
}

void lg_latency_taken(lg_latency *l) {
  if (!__atomic_load_n(&l->pending, __ATOMIC_ACQUIRE))
    return;
  uint64_t t = now_ns();
  pthread_mutex_lock(&l->lock);
  if (l->pending && l->t_taken_ns == 0)
    l->t_taken_ns = t;
  pthread_mutex_unlock(&l->lock);
}

static bool freed(const lg_latency *l) {
  if (lg_smb_chunk_state(l->smb, l->page, l->chunk) == 0)
    return true;
  uint8_t now[8];
  memcpy(now, lg_smb_chunk_at(l->smb, l->page, l->chunk), sizeof now);
  return memcmp(now, l->header, sizeof now) != 0;
}

static void *sampler(void *arg) {
  lg_latency *l = arg;
  const struct timespec poll = {0, POLL_NS};
  while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
    if (!__atomic_load_n(&l->pending, __ATOMIC_ACQUIRE)) {
      nanosleep(&poll, NULL);
      continue;
    }
    pthread_mutex_lock(&l->lock);
    bool done = freed(l);
    uint64_t t = now_ns();
    if (done && l->n < MAX_SAMPLES) {
      l->to_send_ns[l->n] = (l->t_taken_ns ? l->t_taken_ns : t) - l->t0_ns;
      l->samples_ns[l->n++] = t - l->t0_ns;
    }
    if (!done && t - l->t0_ns > GIVE_UP_NS)
      l->unfinished++, done = true;
    if (done)
      __atomic_store_n(&l->pending, false, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&l->lock);
    nanosleep(&poll, NULL);
  }
  return NULL;
}

int lg_latency_start(lg_latency **out, const lg_smb *smb) {
  lg_latency *l = calloc(1, sizeof *l);
  if (!l)
    return TR_ERR_NOMEM;
  l->samples_ns = malloc(MAX_SAMPLES * sizeof *l->samples_ns);
  l->to_send_ns = malloc(MAX_SAMPLES * sizeof *l->to_send_ns);
  if (!l->samples_ns || !l->to_send_ns) {
    free(l->samples_ns);
    free(l->to_send_ns);
    free(l);
    return TR_ERR_NOMEM;
  }
  l->smb = smb;
  pthread_mutex_init(&l->lock, NULL);
  if (pthread_create(&l->thread, NULL, sampler, l) != 0) {
    pthread_mutex_destroy(&l->lock);
    free(l->samples_ns);
    free(l->to_send_ns);
    free(l);
    return TR_ERR_NOMEM;
  }
  *out = l;
  return 0;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Sorts v[0..n) (n > 0) and gives its median and 99th percentile in microseconds. */
static void percentiles(uint64_t *v, size_t n, double *p50_us, double *p99_us) {
  qsort(v, n, sizeof *v, cmp_u64);
  *p50_us = (double)v[n / 2] / 1e3;
  *p99_us = (double)v[(n * 99) / 100] / 1e3;
}

void lg_latency_stop(lg_latency *l, struct lg_latency_result *r) {
  __atomic_store_n(&l->stop, true, __ATOMIC_RELEASE);
  pthread_join(l->thread, NULL);
  *r = (struct lg_latency_result){.samples = l->n, .unfinished = l->unfinished + l->pending};
  if (l->n) {
    /* after send = whole - to send; samples_ns is reused for it once its own figures are out */
    uint64_t *after = malloc(l->n * sizeof *after);
    for (size_t i = 0; after && i < l->n; i++)
      after[i] = l->samples_ns[i] - l->to_send_ns[i];
    percentiles(l->samples_ns, l->n, &r->p50_us, &r->p99_us);
    r->max_us = (double)l->samples_ns[l->n - 1] / 1e3;
    percentiles(l->to_send_ns, l->n, &r->to_send_p50_us, &r->to_send_p99_us);
    if (after)
      percentiles(after, l->n, &r->after_send_p50_us, &r->after_send_p99_us);
    free(after);
  }
  pthread_mutex_destroy(&l->lock);
  free(l->samples_ns);
  free(l->to_send_ns);
  free(l);
}

void lg_latency_write_json(const struct lg_latency_result *r, FILE *f) {
  fprintf(f,
          "\"commit_to_free_us\":{\"samples\":%llu,\"unfinished\":%llu,\"p50\":%.1f,"
          "\"p99\":%.1f,\"max\":%.1f,\"to_send_p50\":%.1f,\"to_send_p99\":%.1f,"
          "\"after_send_p50\":%.1f,\"after_send_p99\":%.1f}",
          (unsigned long long)r->samples, (unsigned long long)r->unfinished, r->p50_us,
          r->p99_us, r->max_us, r->to_send_p50_us, r->to_send_p99_us, r->after_send_p50_us,
          r->after_send_p99_us);
}
