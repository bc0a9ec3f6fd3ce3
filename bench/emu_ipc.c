/* emu_ipc.c: a non-blocking Perfetto IPC client connection on a libuv loop (see emu_ipc.h).
 *
 * Each poll callback does at most one recvmsg and hands every whole frame it completed to
 * on_frame, so one busy connection cannot hold the loop (the frame reader never holds more
 * than one maximal frame). Writes go straight to the socket; what it does not take waits in
 * one buffer, and UV_WRITABLE is watched only while that buffer holds bytes. */
#include "bench/emu_ipc.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "relay/producer/ipc_recv.h"
#include "relay/base/tr_error.h"

struct emu_ipc {
  uv_poll_t poll;
  int fd;
  int events; /* what poll watches now */
  struct emu_ipc_callbacks cbs;
  tr_ipc_reader reader;
  int received_fd;
  uint8_t *out;
  size_t out_len, out_off, out_cap;
  bool ended, closing;
  void (*done)(void *data);
  void *done_data;
};

static void on_poll(uv_poll_t *handle, int status, int events);

/* Stops watching and tells the owner, once. */
static void end(emu_ipc *c, int status) {
  if (c->ended || c->closing)
    return;
  c->ended = true;
  uv_poll_stop(&c->poll);
  c->cbs.on_ended(c, status);
}

static void watch(emu_ipc *c, int events) {
  if (events == c->events || c->ended || c->closing)
    return;
  c->events = events;
  uv_poll_start(&c->poll, events, on_poll);
}

/* Writes what is buffered until the socket would block. */
static int flush_out(emu_ipc *c) {
  while (c->out_off < c->out_len) {
    ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n < 0)
      return errno == EPIPE || errno == ECONNRESET ? TR_ERR_CLOSED : TR_ERR_SYS(errno);
    c->out_off += (size_t)n;
  }
  if (c->out_off == c->out_len)
    c->out_off = c->out_len = 0;
  watch(c, UV_READABLE | (c->out_len ? UV_WRITABLE : 0));
  return 0;
}

/* Appends bytes after the unsent ones, compacting first; bounded by EMU_IPC_MAX_OUT. */
static int append_out(emu_ipc *c, const uint8_t *data, size_t len) {
  if (c->out_off > 0) {
    memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
    c->out_len -= c->out_off;
    c->out_off = 0;
  }
  if (c->out_len + len > EMU_IPC_MAX_OUT)
    return TR_ERR_FULL;
  if (c->out_len + len > c->out_cap) {
    size_t cap = c->out_cap ? c->out_cap : 4096;
    while (cap < c->out_len + len)
      cap *= 2;
    uint8_t *grown = realloc(c->out, cap);
    if (grown == NULL)
      return TR_ERR_NOMEM;
    c->out = grown;
    c->out_cap = cap;
  }
  memcpy(c->out + c->out_len, data, len);
  c->out_len += len;
  return 0;
}

int emu_ipc_send(emu_ipc *c, const Perfetto__Protos__IPCFrame *frame) {
  if (c->ended || c->closing)
    return TR_ERR_CLOSED;
  uint8_t *buf;
  size_t len;
  int rc = tr_ipc_frame_encode(frame, &buf, &len);
  if (rc < 0)
    return rc;
  rc = append_out(c, buf, len);
  free(buf);
  if (rc == 0)
    rc = flush_out(c);
  if (rc < 0) /* a frame that cannot be queued breaks the stream: the connection is over */
    end(c, rc);
  return rc;
}

/* Hands every whole frame to on_frame until none is left or the owner closed. */
static int dispatch(emu_ipc *c) {
  while (!c->ended && !c->closing) {
    const uint8_t *payload;
    size_t len;
    int rc = tr_frame_reader_next(&c->reader, &payload, &len);
    if (rc <= 0)
      return rc;
    Perfetto__Protos__IPCFrame *frame = tr_ipc_frame_decode(payload, len);
    if (frame == NULL)
      continue; /* undecodable: skipped, as Perfetto's client does */
    c->cbs.on_frame(c, frame);
    tr_ipc_frame_free(frame);
  }
  return 0;
}

static void on_poll(uv_poll_t *handle, int status, int events) {
  emu_ipc *c = handle->data;
  int rc = status < 0 ? TR_ERR_SYS(-status) : 0;
  if (rc == 0 && (events & UV_WRITABLE))
    rc = flush_out(c);
  if (rc == 0 && (events & UV_READABLE))
    rc = tr_ipc_recv(&c->reader, c->fd, MSG_DONTWAIT, &c->received_fd);
  if (rc == 0)
    rc = dispatch(c);
  if (rc < 0)
    end(c, rc);
}

int emu_ipc_open(uv_loop_t *loop, const char *path, const struct emu_ipc_callbacks *cbs,
                 emu_ipc **out) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path)
    return TR_ERR_INVAL;
  strcpy(addr.sun_path, path);
  emu_ipc *c = calloc(1, sizeof *c);
  if (c == NULL)
    return TR_ERR_NOMEM;
  c->cbs = *cbs;
  c->received_fd = -1;
  tr_ipc_reader_init(&c->reader);
  int rc = 0;
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  /* A listening UNIX socket accepts at once unless its backlog is full (then EAGAIN). */
  if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0)
    rc = TR_ERR_SYS(errno);
  if (rc == 0)
    rc = uv_poll_init(loop, &c->poll, c->fd);
  if (rc < 0) {
    if (c->fd >= 0)
      close(c->fd);
    tr_frame_reader_free(&c->reader);
    free(c);
    return rc;
  }
  c->poll.data = c;
  watch(c, UV_READABLE);
  *out = c;
  return 0;
}

int emu_ipc_take_fd(emu_ipc *c) {
  int fd = c->received_fd;
  c->received_fd = -1;
  return fd;
}

void *emu_ipc_data(const emu_ipc *c) { return c->cbs.data; }

static void on_closed(uv_handle_t *handle) {
  emu_ipc *c = handle->data;
  close(c->fd);
  if (c->received_fd >= 0)
    close(c->received_fd);
  tr_frame_reader_free(&c->reader);
  free(c->out);
  void (*done)(void *) = c->done;
  void *data = c->done_data;
  free(c);
  if (done != NULL)
    done(data);
}

void emu_ipc_close(emu_ipc *c, void (*done)(void *data), void *data) {
  if (c->closing)
    return;
  c->closing = true;
  c->done = done;
  c->done_data = data;
  uv_close((uv_handle_t *)&c->poll, on_closed);
}
