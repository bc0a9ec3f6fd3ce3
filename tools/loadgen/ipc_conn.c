/* ipc_conn.c: socket I/O for the loadgen's Perfetto IPC connection (see ipc_conn.h). */
#include "tools/loadgen/ipc_conn.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "relay/producer/ipc_recv.h"
#include "relay/base/tr_error.h"

int lg_conn_open(lg_conn *c, const char *path) {
  memset(c, 0, sizeof(*c));
  c->fd = c->wake_fd = c->received_fd = -1;
  tr_ipc_reader_init(&c->reader);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof(addr.sun_path))
    return TR_ERR_INVAL;
  strcpy(addr.sun_path, path);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    return TR_ERR_SYS(errno);
  if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
    goto fail;
  c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (c->wake_fd < 0)
    goto fail;
  return 0;
fail:;
  int rc = TR_ERR_SYS(errno);
  lg_conn_close(c);
  return rc;
}

void lg_conn_close(lg_conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  if (c->wake_fd >= 0)
    close(c->wake_fd);
  if (c->received_fd >= 0)
    close(c->received_fd);
  c->fd = c->wake_fd = c->received_fd = -1;
  tr_frame_reader_free(&c->reader);
}

int lg_conn_send(lg_conn *c, const Perfetto__Protos__IPCFrame *frame) {
  uint8_t *buf;
  size_t len;
  int rc = tr_ipc_frame_encode(frame, &buf, &len);
  if (rc < 0)
    return rc;
  for (size_t off = 0; off < len;) {
    ssize_t n = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      rc = errno == EPIPE || errno == ECONNRESET ? TR_ERR_CLOSED : TR_ERR_SYS(errno);
      break;
    }
    off += (size_t)n;
  }
  free(buf);
  return rc;
}

void lg_conn_wake(lg_conn *c) {
  uint64_t one = 1;
  /* A full counter already means "wake up". */
  (void)!write(c->wake_fd, &one, sizeof(one));
}

int lg_conn_take_fd(lg_conn *c) {
  int fd = c->received_fd;
  c->received_fd = -1;
  return fd;
}

int lg_conn_next(lg_conn *c, int timeout_ms, Perfetto__Protos__IPCFrame **frame) {
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int rc = tr_frame_reader_next(&c->reader, &payload, &len);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      *frame = tr_ipc_frame_decode(payload, len);
      if (*frame)
        return 1;
      continue;
    }
    struct pollfd fds[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->wake_fd, .events = POLLIN}};
    int n = poll(fds, 2, timeout_ms);
    if (n < 0)
      return errno == EINTR ? 0 : TR_ERR_SYS(errno);
    if (n == 0)
      return 0;
    if (fds[1].revents & POLLIN) {
      uint64_t count;
      (void)!read(c->wake_fd, &count, sizeof(count));
      return 0;
    }
    rc = tr_ipc_recv(&c->reader, c->fd, 0, &c->received_fd);
    if (rc < 0)
      return rc;
  }
}
