/* ipc_recv.h: one recvmsg of a Perfetto IPC stream (reference section 1.1) into its reader,
 * taking the file descriptor a message may carry (SCM_RIGHTS: the producer's shared memory),
 * for producer-side clients that expect at most one per message. */
#ifndef TR_IPC_RECV_H
#define TR_IPC_RECV_H

#include "relay/producer/ipc_frame.h"

/* Reads what fits into r from the socket sock with recvmsg flags (MSG_CMSG_CLOEXEC is added).
 * A descriptor that came with the bytes replaces *received_fd, closing the one there if it was
 * not taken (>= 0). 0 (also for EINTR, and EAGAIN with MSG_DONTWAIT), TR_ERR_CLOSED at end of
 * stream, TR_ERR_PROTO when control data was cut short, TR_ERR_SYS(errno), or the reader's
 * error when it is full. */
int tr_ipc_recv(tr_ipc_reader *r, int sock, int flags, int *received_fd);

#endif
