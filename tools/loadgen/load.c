/* load.c: writer threads and their pacing (see load.h). */
#include "tools/loadgen/load.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Sleeps until the monotonic instant `when` unless stopped first. Returns true if stopped. */
static bool wait_until(lg_load *load, uint64_t when) {
  struct timespec ts = {.tv_sec = (time_t)(when / 1000000000u),
                        .tv_nsec = (long)(when % 1000000000u)};
  pthread_mutex_lock(&load->stop_lock);
  while (!load->stop && mono_ns() < when)
    if (pthread_cond_timedwait(&load->stop_cond, &load->stop_lock, &ts) == ETIMEDOUT)
      break;
  bool stop = load->stop;
  pthread_mutex_unlock(&load->stop_lock);
  return stop;
}

static bool stopped(lg_load *load) {
  pthread_mutex_lock(&load->stop_lock);
  bool stop = load->stop;
  pthread_mutex_unlock(&load->stop_lock);
  return stop;
}

/* Timestamps go through relay/clock/clock.h so that --fake-clock applies to every one of them. */
static int boottime(uint64_t *ts) { return tr_clock_read(TR_CLOCK_BOOTTIME, ts); }

static void *writer_main(void *arg) {
  lg_writer *w = arg;
  lg_load *load = w->load;
  const lg_load_config *cfg = &load->cfg;
  uint64_t start = mono_ns();
  uint64_t ts = 0;
  int rc = 0;
  pthread_mutex_lock(&w->lock);
  w->seq.tid = (int32_t)gettid();
  pthread_mutex_unlock(&w->lock);
  for (uint64_t i = 0; cfg->packets == 0 || i < cfg->packets; i++) {
    uint64_t due = cfg->rate > 0 ? start + (uint64_t)((double)i * 1e9 / cfg->rate) : 0;
    if (cfg->duration_s > 0 && (due ? due : mono_ns()) - start >= cfg->duration_s * 1e9)
      break;
    if (due ? wait_until(load, due) : stopped(load))
      break;
    lg_flows *flows = w == load->writers ? cfg->flows : NULL;
    pthread_mutex_lock(&w->lock);
    if (flows) { /* an arrival is read before the timestamp of the slice that ends it */
      w->seq.flow_in = w->seq.flow_in ? w->seq.flow_in : lg_flows_arrival(flows);
      w->seq.flow_out = w->seq.flow_out ? w->seq.flow_out : lg_flows_departure(flows);
    }
    if ((rc = boottime(&ts)) == 0)
      rc = lg_seq_write_event(&w->seq, ts);
    if (flows && w->seq.flow_written) { /* the departure is in the buffer: now tell the peer */
      lg_flows_sent(flows, w->seq.flow_written);
      w->seq.flow_written = 0;
    }
    pthread_mutex_unlock(&w->lock);
    if (rc == TR_ERR_FULL)
      rc = 0;
    if (rc < 0)
      break;
  }
  pthread_mutex_lock(&w->lock);
  if (cfg->hang && rc == 0 && !stopped(load)) {
    /* Part of a TracePacket's first field: the writer never gets to finish it. */
    static const uint8_t partial[] = {0x08, 0x96};
    if (lg_tw_begin_packet(&w->tw) >= 0)
      lg_tw_append(&w->tw, partial, sizeof partial);
    w->hung = true;
    pthread_mutex_unlock(&w->lock);
    return NULL;
  }
  if (rc == 0 && (rc = boottime(&ts)) == 0)
    rc = lg_seq_finish(&w->seq, ts);
  if (rc == TR_ERR_FULL)
    rc = 0;
  int flushed = lg_tw_flush(&w->tw);
  w->error = rc < 0 ? rc : flushed;
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

int lg_load_start(lg_load *load, const lg_load_config *cfg, lg_smb *smb, uint32_t target_buffer,
                  lg_commit_fn commit, void *ctx) {
  memset(load, 0, sizeof(*load));
  load->cfg = *cfg;
  pthread_mutex_init(&load->stop_lock, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&load->stop_cond, &attr);
  pthread_condattr_destroy(&attr);
  load->writers = calloc(cfg->writers, sizeof(lg_writer));
  if (!load->writers)
    return TR_ERR_NOMEM;
  for (unsigned i = 0; i < cfg->writers; i++) {
    lg_writer *w = &load->writers[i];
    uint16_t id = (uint16_t)(i + 1);
    w->load = load;
    pthread_mutex_init(&w->lock, NULL);
    lg_tw_init(&w->tw, smb, id, target_buffer, commit, ctx);
    lg_seq_init(&w->seq, &w->tw, id, cfg->packet_size, (int32_t)getpid(), 0);
  }
  for (; load->started < cfg->writers; load->started++) {
    lg_writer *w = &load->writers[load->started];
    int err = pthread_create(&w->thread, NULL, writer_main, w);
    if (err != 0) {
      lg_load_stop(load);
      return TR_ERR_SYS(err);
    }
  }
  return 0;
}

bool lg_load_all_hung(lg_load *load) {
  bool all = load->started == load->cfg.writers;
  for (unsigned i = 0; all && i < load->started; i++) {
    pthread_mutex_lock(&load->writers[i].lock);
    all = load->writers[i].hung;
    pthread_mutex_unlock(&load->writers[i].lock);
  }
  return all;
}

int lg_load_flush(lg_load *load) {
  int rc = 0;
  for (unsigned i = 0; i < load->started; i++) {
    lg_writer *w = &load->writers[i];
    pthread_mutex_lock(&w->lock);
    int err = lg_tw_flush(&w->tw);
    pthread_mutex_unlock(&w->lock);
    if (rc == 0)
      rc = err;
  }
  return rc;
}

void lg_load_clear_incremental_state(lg_load *load) {
  for (unsigned i = 0; i < load->started; i++) {
    lg_writer *w = &load->writers[i];
    pthread_mutex_lock(&w->lock);
    lg_seq_clear_incremental_state(&w->seq);
    pthread_mutex_unlock(&w->lock);
  }
}

int lg_load_stop(lg_load *load) {
  pthread_mutex_lock(&load->stop_lock);
  load->stop = true;
  pthread_cond_broadcast(&load->stop_cond);
  pthread_mutex_unlock(&load->stop_lock);
  int rc = 0;
  for (unsigned i = 0; i < load->started; i++) {
    pthread_join(load->writers[i].thread, NULL);
    if (rc == 0)
      rc = load->writers[i].error;
  }
  load->started = 0;
  return rc;
}

void lg_load_free(lg_load *load) {
  for (unsigned i = 0; load->writers && i < load->cfg.writers; i++)
    pthread_mutex_destroy(&load->writers[i].lock);
  free(load->writers);
  load->writers = NULL;
  pthread_cond_destroy(&load->stop_cond);
  pthread_mutex_destroy(&load->stop_lock);
}
