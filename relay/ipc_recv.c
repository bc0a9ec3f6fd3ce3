/* ipc_recv.c: one recvmsg into a Perfetto IPC reader (see ipc_recv.h). */
#include "relay/ipc_recv.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay/tr_error.h"

int tr_ipc_recv(tr_ipc_reader *r, int sock, int flags, int *received_fd) {
  uint8_t *dst;
  size_t room;
  int rc = tr_frame_reader_space(r, &dst, &room);
  if (rc < 0)
    return rc;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control;
  struct iovec iov = {.iov_base = dst, .iov_len = room};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
  ssize_t n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0)
    return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK ? 0 : TR_ERR_SYS(errno);
  if (n == 0)
    return TR_ERR_CLOSED;
  if (msg.msg_flags & MSG_CTRUNC)
    return TR_ERR_PROTO;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int))) {
      if (*received_fd >= 0)
        close(*received_fd);
      memcpy(received_fd, CMSG_DATA(cm), sizeof(int));
    }
  }
  tr_frame_reader_commit(r, (size_t)n);
  return 0;
}
