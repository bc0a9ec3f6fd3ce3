/* ipc_client.h: a small blocking Perfetto IPC client for tools and tests (tracerelay-loadgen
 * as a producer, the `tracerelay` CLI as a consumer).
 *
 * One AF_UNIX connection, one bound service. It follows Perfetto's client rules (reference
 * 1.4): request ids count from 1, BindService first, and a method missing from the bind
 * reply fails locally without sending anything. Reads are bounded like the host's (one
 * maximal frame buffered) and every wait takes a timeout in milliseconds (negative: none).
 * Not thread-safe; one client per thread. */
#ifndef TR_IPC_CLIENT_H
#define TR_IPC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/ipc/wire_protocol.pb-c.h"

typedef struct tr_ipc_client tr_ipc_client;

/* Connects to the socket at `path`. Sends block for at most timeout_ms. */
int tr_ipc_client_connect(const char *path, int timeout_ms, tr_ipc_client **out);
/* Closes the connection and any fd received and not taken. NULL is a no-op. */
void tr_ipc_client_close(tr_ipc_client *c);

/* BindService(name) and waits for its reply, ignoring other frames. Returns 0,
 * TR_ERR_NOT_FOUND if the host does not offer the service, TR_ERR_TIMEOUT, or an I/O error. */
int tr_ipc_client_bind(tr_ipc_client *c, const char *service, int timeout_ms);
/* The bound service's id for `method`, or TR_ERR_UNSUPPORTED if the host did not list it. */
int tr_ipc_client_method_id(const tr_ipc_client *c, const char *method);
/* Sends InvokeMethod(method, args) with fd (>= 0) attached; *request_id gets its id.
 * TR_ERR_UNSUPPORTED, with nothing sent, if the bind reply did not list the method. */
int tr_ipc_client_invoke(tr_ipc_client *c, const char *method, const uint8_t *args,
                         size_t args_len, bool drop_reply, int fd, uint64_t *request_id);

/* Waits for the next frame. *frame is decoded (free with tr_ipc_frame_free); *fd (if not
 * NULL) gets the fd that arrived with it, or -1, and the caller owns it. Undecodable frames
 * are skipped. Returns 0, TR_ERR_TIMEOUT, TR_ERR_CLOSED at end of stream, TR_ERR_TOO_BIG
 * for an oversize frame, or an I/O error. */
int tr_ipc_client_recv(tr_ipc_client *c, int timeout_ms, Perfetto__Protos__IPCFrame **frame,
                       int *fd);

/* Sends an encoded frame (or any bytes: tests replay recordings and send malformed input)
 * in one sendmsg sequence, with fd (>= 0) on the first one. */
int tr_ipc_client_send_raw(tr_ipc_client *c, const uint8_t *data, size_t len, int fd);
/* Encodes and sends a frame, with fd (>= 0) attached. */
int tr_ipc_client_send_frame(tr_ipc_client *c, const Perfetto__Protos__IPCFrame *frame, int fd);

#endif
