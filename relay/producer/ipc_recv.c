/* ipc_recv.c: one recvmsg into a Perfetto IPC reader (see ipc_recv.h). */
#include "relay/producer/ipc_recv.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "relay/base/tr_error.h"
#include "relay/producer/unix_fds.h"

int tr_ipc_recv(tr_ipc_reader *r, int sock, int flags, int *received_fd) {
  uint8_t *dst;
  size_t room;
  int rc = tr_frame_reader_space(r, &dst, &room);
  if (rc < 0)
    return rc;
  struct tr_unix_fds fds;
  ssize_t n = tr_unix_fds_recv(sock, dst, room, flags, &fds);
  for (size_t i = 0; i < fds.n; i++) {
    if (*received_fd >= 0)
      close(*received_fd);
    *received_fd = fds.fd[i];
  }
  if (n == TR_ERR_SYS(EAGAIN) || n == TR_ERR_SYS(EWOULDBLOCK))
    return 0;
  if (n < 0)
    return (int)n;
  if (n == 0)
    return TR_ERR_CLOSED;
  tr_frame_reader_commit(r, (size_t)n);
  return 0;
}
