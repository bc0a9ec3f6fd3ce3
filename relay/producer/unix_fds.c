/* unix_fds.c: sendmsg and recvmsg with SCM_RIGHTS descriptors (see unix_fds.h). */
#include "relay/producer/unix_fds.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay/base/tr_error.h"

ssize_t tr_unix_fds_send(int sock, const void *data, size_t len, int fd, int flags) {
  struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctrl;
  if (fd >= 0) {
    memset(&ctrl, 0, sizeof ctrl);
    msg.msg_control = ctrl.buf;
    msg.msg_controllen = sizeof ctrl.buf;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
}

ssize_t tr_unix_fds_recv(int sock, void *dst, size_t room, int flags, struct tr_unix_fds *fds) {
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * TR_UNIX_FDS_MAX)];
  } ctrl;
  struct iovec iov = {.iov_base = dst, .iov_len = room};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
                       .msg_controllen = sizeof ctrl.buf};
  fds->n = 0;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return TR_ERR_SYS(errno);
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
      continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count && fds->n < TR_UNIX_FDS_MAX; i++)
      memcpy(&fds->fd[fds->n++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    while (fds->n > 0)
      close(fds->fd[--fds->n]);
    return TR_ERR_PROTO;
  }
  return n;
}
