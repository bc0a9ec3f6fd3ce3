/* emu_ipc.h: one Perfetto IPC client connection on a libuv loop, for the in-process producers
 * of bench/many_agents (emu_producer.h), where a thousand of them share one loop thread and so
 * cannot use the blocking clients of relay/producer/ipc_client.h or tools/loadgen/ipc_conn.h.
 *
 * A non-blocking AF_UNIX socket watched by a uv_poll_t, as relay/producer/ipc_host.c does on the other
 * end: frames (relay/producer/ipc_frame.h) out through a bounded send buffer, frames and SCM_RIGHTS fds
 * in through a bounded frame reader (one maximal frame). Received fds follow Perfetto's rule:
 * the last one that arrived is kept until the handler that expects it takes it.
 *
 * Lifecycle: emu_ipc_open, then on_frame for every frame and at most one on_ended (the peer
 * closed, an I/O error, an oversize frame or a full send buffer); the owner then, or whenever
 * it likes, calls emu_ipc_close, whose done runs once the poll handle is closed and c is freed.
 * No callback runs after emu_ipc_close. Everything runs on the loop's thread. */
#ifndef EMU_IPC_H
#define EMU_IPC_H

#include <stddef.h>
#include <uv.h>

#include "relay/producer/ipc_frame.h"

/* Unsent bytes one connection may hold: a producer that cannot write this much to its agent
 * has lost it (ours send a few hundred bytes per event and flush). */
#define EMU_IPC_MAX_OUT (256u << 10)

typedef struct emu_ipc emu_ipc;

struct emu_ipc_callbacks {
  void *data;
  /* A decoded frame, valid during the call; the callee may call emu_ipc_close. */
  void (*on_frame)(emu_ipc *c, const Perfetto__Protos__IPCFrame *frame);
  /* The connection is over (status: TR_ERR_CLOSED when the peer closed, else the error). */
  void (*on_ended)(emu_ipc *c, int status);
};

/* Connects to the socket at path (an agent's producer socket, already listening).
 * TR_ERR_INVAL for a path too long, TR_ERR_NOMEM, or the connect error. */
int emu_ipc_open(uv_loop_t *loop, const char *path, const struct emu_ipc_callbacks *cbs,
                 emu_ipc **out);
/* Encodes frame and queues it behind what is unsent. TR_ERR_CLOSED once ended or closing,
 * TR_ERR_FULL (the connection then ends) over EMU_IPC_MAX_OUT, TR_ERR_TOO_BIG, TR_ERR_NOMEM. */
int emu_ipc_send(emu_ipc *c, const Perfetto__Protos__IPCFrame *frame);
/* The last fd received (the caller owns it now), or -1. */
int emu_ipc_take_fd(emu_ipc *c);
void *emu_ipc_data(const emu_ipc *c);
/* Closes the socket and any fd not taken; done(data) (if not NULL) runs once c is freed. */
void emu_ipc_close(emu_ipc *c, void (*done)(void *data), void *data);

#endif
