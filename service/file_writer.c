/* file_writer.c: ordered writes to a file on a thread of its own (file_writer.h).
 *
 * The queue is a singly linked list under one mutex; the thread sleeps on a condition
 * variable while it is empty. The loop's side and the thread each hold a reference to the
 * writer: the thread drops its own when it exits (after closing the file), the loop's side
 * when its uv_async_t is closed; whoever drops the last frees it. The thread signals the
 * loop only while the loop's side is open (checked under the mutex), so no uv_async_send
 * reaches a closed handle. */
#include "service/file_writer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "relay/base/tr_error.h"

typedef struct queued {
  struct queued *next;
  uint8_t *buf; /* NULL: a sync of the file (tr_file_writer_sync) */
  size_t n;
} queued;

struct tr_file_writer {
  uv_async_t written; /* the thread tells the loop */
  void (*on_written)(void *ud);
  void *ud;
  int fd;
  pthread_mutex_t mu;
  pthread_cond_t cond; /* work for the thread, or (for tr_file_writer_wait) the queue emptied */
  queued *head, *tail;
  size_t queued_bytes; /* waiting or being written */
  int error;
  uint64_t syncs;
  bool closing;     /* no more pushes: the thread writes the rest and exits */
  bool loop_closed; /* the uv_async_t is closing: no more signals */
  int refs;
};

static void unref(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  bool last = --w->refs == 0;
  pthread_mutex_unlock(&w->mu);
  if (!last)
    return;
  pthread_cond_destroy(&w->cond);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return TR_ERR_SYS(errno);
    }
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

/* fdatasync, as traced syncs its file; EINVAL and EROFS say the fd cannot be synced (a pipe,
 * a socket), which only means there is nothing to make durable. */
static int sync_file(int fd) {
  while (fdatasync(fd) != 0) {
    if (errno == EINTR)
      continue;
    return errno == EINVAL || errno == EROFS ? 0 : TR_ERR_SYS(errno);
  }
  return 0;
}

static void *writer_main(void *arg) {
  tr_file_writer *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (!w->head && !w->closing)
      pthread_cond_wait(&w->cond, &w->mu);
    queued *q = w->head;
    if (!q)
      break; /* closing, and all written */
    int error = w->error;
    pthread_mutex_unlock(&w->mu);
    if (error == 0)
      error = q->buf ? write_all(w->fd, q->buf, q->n) : sync_file(w->fd);
    pthread_mutex_lock(&w->mu);
    w->syncs += q->buf == NULL;
    if (w->error == 0)
      w->error = error;
    w->head = q->next;
    if (!w->head)
      w->tail = NULL;
    w->queued_bytes -= q->n;
    if (!w->loop_closed)
      uv_async_send(&w->written);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mu);
    free(q->buf);
    free(q);
    pthread_mutex_lock(&w->mu);
  }
  pthread_mutex_unlock(&w->mu);
  close(w->fd);
  unref(w);
  return NULL;
}

static void on_async(uv_async_t *a) {
  tr_file_writer *w = a->data;
  w->on_written(w->ud);
}

static void on_async_closed(uv_handle_t *h) { unref(h->data); }

int tr_file_writer_new(uv_loop_t *loop, int fd, void (*on_written)(void *ud), void *ud,
                       tr_file_writer **out) {
  tr_file_writer *w = calloc(1, sizeof *w);
  pthread_t thread;
  int rc;
  if (!w) {
    close(fd);
    return TR_ERR_NOMEM;
  }
  *w = (tr_file_writer){.on_written = on_written, .ud = ud, .fd = fd, .refs = 2};
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cond, NULL);
  if ((rc = uv_async_init(loop, &w->written, on_async)) != 0) {
    w->refs = 0;
    close(fd);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mu);
    free(w);
    return rc;
  }
  w->written.data = w;
  if ((rc = pthread_create(&thread, NULL, writer_main, w)) != 0) {
    w->refs = 1; /* the handle's only: its close frees the writer */
    close(fd);
    uv_close((uv_handle_t *)&w->written, on_async_closed);
    return TR_ERR_SYS(rc);
  }
  pthread_detach(thread); /* it ends by itself after tr_file_writer_close */
  *out = w;
  return 0;
}

int tr_file_writer_push(tr_file_writer *w, uint8_t *buf, size_t n) {
  queued *q = malloc(sizeof *q);
  pthread_mutex_lock(&w->mu);
  int rc = w->error;
  if (rc == 0 && !q)
    rc = TR_ERR_NOMEM;
  else if (rc == 0 && w->queued_bytes > 0 && w->queued_bytes + n > TR_FILE_WRITER_MAX_QUEUED)
    rc = TR_ERR_FULL;
  if (rc == 0) {
    *q = (queued){.buf = buf, .n = n};
    if (w->tail)
      w->tail->next = q;
    else
      w->head = q;
    w->tail = q;
    w->queued_bytes += n;
    pthread_cond_broadcast(&w->cond);
  }
  pthread_mutex_unlock(&w->mu);
  if (rc != 0) {
    free(q);
    if (rc != TR_ERR_FULL)
      free(buf);
  }
  return rc;
}

int tr_file_writer_sync(tr_file_writer *w) {
  return tr_file_writer_push(w, NULL, 0); /* a NULL buffer is a sync to the thread */
}

uint64_t tr_file_writer_syncs(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  uint64_t n = w->syncs;
  pthread_mutex_unlock(&w->mu);
  return n;
}

int tr_file_writer_error(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  int rc = w->error;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

bool tr_file_writer_idle(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  bool idle = w->head == NULL; /* a sync queued counts, though it has no bytes */
  pthread_mutex_unlock(&w->mu);
  return idle;
}

int tr_file_writer_wait(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  while (w->head)
    pthread_cond_wait(&w->cond, &w->mu);
  int rc = w->error;
  pthread_mutex_unlock(&w->mu);
  return rc;
}

void tr_file_writer_close(tr_file_writer *w) {
  pthread_mutex_lock(&w->mu);
  w->closing = true;
  w->loop_closed = true;
  pthread_cond_broadcast(&w->cond);
  pthread_mutex_unlock(&w->mu);
  uv_close((uv_handle_t *)&w->written, on_async_closed);
}
