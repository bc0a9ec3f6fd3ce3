/* ipc_conn.h: the loadgen's end of one Perfetto IPC connection (reference 1.1, 1.5) over an
 * AF_UNIX socket: frames out, frames and SCM_RIGHTS fds in, and a wake-up that other threads
 * use to make the IPC thread send their commits at once.
 *
 * relay/producer/ipc_client.h is not used because it cannot be woken while it waits for a frame: writer
 * threads hand chunks to the IPC thread as the SDK's do, and a polling wait would delay every
 * commit and cap the load a benchmark can generate. Frames are encoded and decoded by
 * relay/producer/ipc_frame.h.
 *
 * Only lg_conn_wake may be called from other threads; everything else belongs to the IPC
 * thread. Received fds follow Perfetto's rule: the last fd that arrived is kept until the
 * handler that expects one takes it (lg_conn_take_fd). */
#ifndef LG_IPC_CONN_H
#define LG_IPC_CONN_H

#include "relay/producer/ipc_frame.h"

typedef struct lg_conn {
  int fd;
  int wake_fd;      /* eventfd */
  int received_fd;  /* last fd that arrived, -1 if none */
  tr_ipc_reader reader;
} lg_conn;

/* Connects to the AF_UNIX socket at path. */
int lg_conn_open(lg_conn *c, const char *path);
void lg_conn_close(lg_conn *c);

/* Encodes and sends one frame, blocking until it is written. */
int lg_conn_send(lg_conn *c, const Perfetto__Protos__IPCFrame *frame);
/* Makes the pending or next lg_conn_next return 0 early. Safe from any thread. */
void lg_conn_wake(lg_conn *c);
/* Waits up to timeout_ms (-1: forever) for a frame. Returns 1 with *frame (free with
 * tr_ipc_frame_free), 0 on a wake-up or timeout, TR_ERR_CLOSED when the peer closed, or another
 * negative code (an oversize frame, an I/O error). Frames that do not parse are skipped. */
int lg_conn_next(lg_conn *c, int timeout_ms, Perfetto__Protos__IPCFrame **frame);
/* The last fd received (the caller owns it now), or -1. */
int lg_conn_take_fd(lg_conn *c);

#endif
