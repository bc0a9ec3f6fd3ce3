/* ipc_client.c: the blocking Perfetto IPC client behind ipc_client.h.
 *
 * The socket stays blocking for sends (bounded by SO_SNDTIMEO) and is read with poll() plus
 * recvmsg(MSG_DONTWAIT). Matching fds to frames: Linux ends a stream read right after the
 * message that carried an fd, and senders attach it to the first sendmsg of its frame, so
 * the fd belongs to the frame holding the last byte of the read that delivered it. Each
 * pending fd remembers the stream offset where that read ended; the first frame handed out
 * that reaches that offset gets it. */
#include "relay/producer/ipc_client.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"
#include "relay/producer/unix_fds.h"

#define MAX_PENDING_FDS 4

typedef struct method_entry {
  char *name;
  uint32_t id;
} method_entry;

typedef struct pending_fd {
  int fd;
  uint64_t end; /* stream offset where the read that brought it ended */
} pending_fd;

struct tr_ipc_client {
  int fd;
  tr_ipc_reader reader;
  uint64_t rx_bytes;
  pending_fd pending[MAX_PENDING_FDS];
  size_t num_pending;
  uint64_t next_request_id;
  uint32_t service_id;
  method_entry *methods;
  size_t num_methods;
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left before the deadline, for poll(): -1 = no deadline, never below 0. */
static int remaining_ms(int64_t deadline) {
  if (deadline < 0)
    return -1;
  int64_t left = deadline - now_ms();
  return left < 0 ? 0 : (int)left;
}

static int64_t deadline_after(int timeout_ms) {
  return timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
}

int tr_ipc_client_connect(const char *path, int timeout_ms, tr_ipc_client **out) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof addr.sun_path)
    return TR_ERR_INVAL;
  strcpy(addr.sun_path, path);
  tr_ipc_client *c = calloc(1, sizeof *c);
  if (!c)
    return TR_ERR_NOMEM;
  int rc;
  c->next_request_id = 1;
  tr_ipc_reader_init(&c->reader);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = TR_ERR_SYS(errno);
    goto fail_client;
  }
  if (timeout_ms >= 0) {
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    if (setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0) {
      rc = TR_ERR_SYS(errno);
      goto fail_socket;
    }
  }
  if (connect(c->fd, (const struct sockaddr *)&addr, sizeof addr) < 0) {
    rc = errno == EAGAIN ? TR_ERR_TIMEOUT : TR_ERR_SYS(errno);
    goto fail_socket;
  }
  *out = c;
  return 0;

fail_socket:
  close(c->fd);
fail_client:
  free(c);
  return rc;
}

static void free_methods(tr_ipc_client *c) {
  for (size_t i = 0; i < c->num_methods; i++)
    free(c->methods[i].name);
  free(c->methods);
  c->methods = NULL;
  c->num_methods = 0;
}

void tr_ipc_client_close(tr_ipc_client *c) {
  if (!c)
    return;
  free_methods(c);
  tr_frame_reader_free(&c->reader);
  for (size_t i = 0; i < c->num_pending; i++)
    close(c->pending[i].fd);
  close(c->fd);
  free(c);
}

int tr_ipc_client_send_raw(tr_ipc_client *c, const uint8_t *data, size_t len, int fd) {
  size_t off = 0;
  do {
    ssize_t n = tr_unix_fds_send(c->fd, data + off, len - off, off == 0 ? fd : -1, 0);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? TR_ERR_TIMEOUT : TR_ERR_SYS(errno);
    }
    off += (size_t)n;
  } while (off < len);
  return 0;
}

int tr_ipc_client_send_frame(tr_ipc_client *c, const Perfetto__Protos__IPCFrame *frame, int fd) {
  uint8_t *data;
  size_t len;
  int rc = tr_ipc_frame_encode(frame, &data, &len);
  if (rc < 0)
    return rc;
  rc = tr_ipc_client_send_raw(c, data, len, fd);
  free(data);
  return rc;
}

/* Queues an fd received with a read ending at stream offset `end`. A peer that sends fds
 * faster than frames loses the oldest. */
static void add_pending(tr_ipc_client *c, int fd, uint64_t end) {
  if (c->num_pending == MAX_PENDING_FDS) {
    close(c->pending[0].fd);
    memmove(c->pending, c->pending + 1, (MAX_PENDING_FDS - 1) * sizeof c->pending[0]);
    c->num_pending--;
  }
  c->pending[c->num_pending++] = (pending_fd){.fd = fd, .end = end};
}

/* The fd for a frame ending at stream offset `end`, or -1. Older fds that no frame claimed
 * (several fds on one frame) are closed. */
static int take_pending(tr_ipc_client *c, uint64_t end) {
  int fd = -1;
  size_t n = 0;
  while (n < c->num_pending && c->pending[n].end <= end) {
    if (fd >= 0)
      close(fd);
    fd = c->pending[n++].fd;
  }
  memmove(c->pending, c->pending + n, (c->num_pending - n) * sizeof c->pending[0]);
  c->num_pending -= n;
  return fd;
}

/* One recvmsg into the reader. */
static int recv_some(tr_ipc_client *c) {
  uint8_t *dst;
  size_t room;
  int rc = tr_frame_reader_space(&c->reader, &dst, &room);
  if (rc < 0)
    return rc;
  struct tr_unix_fds fds;
  ssize_t n = tr_unix_fds_recv(c->fd, dst, room, MSG_DONTWAIT, &fds);
  if (n == TR_ERR_SYS(EAGAIN) || n == TR_ERR_SYS(EWOULDBLOCK))
    return 0;
  if (n < 0)
    return (int)n;
  c->rx_bytes += (uint64_t)n;
  tr_frame_reader_commit(&c->reader, (size_t)n);
  for (size_t i = 0; i < fds.n; i++)
    add_pending(c, fds.fd[i], c->rx_bytes);
  return n == 0 ? TR_ERR_CLOSED : 0;
}

static int recv_until(tr_ipc_client *c, int64_t deadline, Perfetto__Protos__IPCFrame **frame,
                      int *fd) {
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int rc = tr_frame_reader_next(&c->reader, &payload, &len);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(payload, len);
      uint64_t end = c->rx_bytes - (c->reader.len - c->reader.start);
      int got = take_pending(c, end);
      if (got >= 0 && (!f || !fd)) {
        close(got);
        got = -1;
      }
      if (!f)
        continue;
      *frame = f;
      if (fd)
        *fd = got;
      return 0;
    }
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int n = poll(&pfd, 1, remaining_ms(deadline));
    if (n < 0 && errno != EINTR)
      return TR_ERR_SYS(errno);
    if (n == 0)
      return TR_ERR_TIMEOUT;
    if (n > 0 && (rc = recv_some(c)) < 0)
      return rc;
  }
}

int tr_ipc_client_recv(tr_ipc_client *c, int timeout_ms, Perfetto__Protos__IPCFrame **frame,
                       int *fd) {
  return recv_until(c, deadline_after(timeout_ms), frame, fd);
}

/* Keeps the {id, name} entries Perfetto clients keep: a name and a non-zero id. */
static int store_methods(tr_ipc_client *c, const Perfetto__Protos__IPCFrame__BindServiceReply *r) {
  free_methods(c);
  c->methods = calloc(r->n_methods + 1, sizeof *c->methods);
  if (!c->methods)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < r->n_methods; i++) {
    const Perfetto__Protos__IPCFrame__BindServiceReply__MethodInfo *m = r->methods[i];
    if (!m->name || !m->name[0] || !m->id)
      continue;
    char *name = strdup(m->name);
    if (!name) {
      free_methods(c);
      return TR_ERR_NOMEM;
    }
    c->methods[c->num_methods++] = (method_entry){.name = name, .id = m->id};
  }
  c->service_id = r->service_id;
  return 0;
}

int tr_ipc_client_bind(tr_ipc_client *c, const char *service, int timeout_ms) {
  int64_t deadline = deadline_after(timeout_ms);
  Perfetto__Protos__IPCFrame__BindService bs = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  bs.service_name = (char *)service;
  Perfetto__Protos__IPCFrame req = PERFETTO__PROTOS__IPCFRAME__INIT;
  req.has_request_id = true;
  req.request_id = c->next_request_id++;
  req.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  req.msg_bind_service = &bs;
  int rc = tr_ipc_client_send_frame(c, &req, -1);
  if (rc < 0)
    return rc;
  for (;;) {
    Perfetto__Protos__IPCFrame *f;
    rc = recv_until(c, deadline, &f, NULL);
    if (rc < 0)
      return rc;
    if (f->request_id == req.request_id &&
        f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY) {
      const Perfetto__Protos__IPCFrame__BindServiceReply *r = f->msg_bind_service_reply;
      rc = r->success ? store_methods(c, r) : TR_ERR_NOT_FOUND;
      tr_ipc_frame_free(f);
      return rc;
    }
    tr_ipc_frame_free(f);
  }
}

int tr_ipc_client_method_id(const tr_ipc_client *c, const char *method) {
  for (size_t i = 0; i < c->num_methods; i++) {
    if (strcmp(c->methods[i].name, method) == 0)
      return (int)c->methods[i].id;
  }
  return TR_ERR_UNSUPPORTED;
}

int tr_ipc_client_invoke(tr_ipc_client *c, const char *method, const uint8_t *args,
                         size_t args_len, bool drop_reply, int fd, uint64_t *request_id) {
  int id = tr_ipc_client_method_id(c, method);
  if (id < 0)
    return id;
  Perfetto__Protos__IPCFrame__InvokeMethod im = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  im.has_service_id = true;
  im.service_id = c->service_id;
  im.has_method_id = true;
  im.method_id = (uint32_t)id;
  im.has_args_proto = true;
  im.args_proto.data = (uint8_t *)args;
  im.args_proto.len = args_len;
  im.has_drop_reply = true;
  im.drop_reply = drop_reply;
  Perfetto__Protos__IPCFrame req = PERFETTO__PROTOS__IPCFRAME__INIT;
  req.has_request_id = true;
  req.request_id = c->next_request_id++;
  req.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  req.msg_invoke_method = &im;
  int rc = tr_ipc_client_send_frame(c, &req, fd);
  if (rc < 0)
    return rc;
  *request_id = req.request_id;
  return 0;
}
