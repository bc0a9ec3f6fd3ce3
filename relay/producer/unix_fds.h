/* unix_fds.h: stream I/O on a UNIX socket that carries file descriptors along (SCM_RIGHTS),
 * as Perfetto's IPC passes a producer's shared memory. The one sendmsg and recvmsg behind the
 * IPC host (ipc_host.c), its blocking client (ipc_client.c) and the producer-side reader
 * (ipc_recv.c). */
#ifndef TR_UNIX_FDS_H
#define TR_UNIX_FDS_H

#include <stddef.h>
#include <sys/types.h>

/* The most descriptors one message may carry; more is a protocol error (TR_ERR_PROTO). */
#define TR_UNIX_FDS_MAX 4

struct tr_unix_fds {
  int fd[TR_UNIX_FDS_MAX];
  size_t n;
};

/* One sendmsg of len bytes of data on sock (flags | MSG_NOSIGNAL), with fd attached when it
 * is >= 0. Returns the bytes sent or -1 with errno, as sendmsg does. */
ssize_t tr_unix_fds_send(int sock, const void *data, size_t len, int fd, int flags);

/* One recvmsg of up to room bytes into dst (flags | MSG_CMSG_CLOEXEC; EINTR retried). The
 * descriptors that came with the bytes land in *fds, owned by the caller from then on.
 * Returns the bytes read (0 at end of stream), TR_ERR_SYS(errno), or TR_ERR_PROTO when the
 * control data was cut short (every descriptor that came is closed then). */
ssize_t tr_unix_fds_recv(int sock, void *dst, size_t room, int flags, struct tr_unix_fds *fds);

#endif
