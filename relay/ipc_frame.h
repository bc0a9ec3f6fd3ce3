/* ipc_frame.h: Perfetto IPC framing (reference section 1.1): a uint32 little-endian payload
 * length, then a serialised IPCFrame. The decoder is bounded: a declared size over
 * TR_IPC_MAX_FRAME (header included) is an error and the connection must be dropped.
 * Pure code over memory: no sockets here. */
#ifndef TR_IPC_FRAME_H
#define TR_IPC_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/ipc/wire_protocol.pb-c.h"
#include "relay/frame_reader.h"

#define TR_IPC_MAX_FRAME 131072u                /* kIPCBufferSize, header included */
#define TR_IPC_MAX_PAYLOAD (TR_IPC_MAX_FRAME - 4u)

/* The stream reader (relay/frame_reader.h) with Perfetto's limits: payloads up to
 * TR_IPC_MAX_PAYLOAD, zero-length frames skipped as Perfetto does. Read with the
 * tr_frame_reader_* calls; free with tr_frame_reader_free. */
typedef tr_frame_reader tr_ipc_reader;
void tr_ipc_reader_init(tr_ipc_reader *r);

/* Decodes a payload into an IPCFrame (free with tr_ipc_frame_free); NULL if it does not parse. */
Perfetto__Protos__IPCFrame *tr_ipc_frame_decode(const uint8_t *payload, size_t len);
void tr_ipc_frame_free(Perfetto__Protos__IPCFrame *frame);
/* Serialises header + frame into a new malloc'd buffer; TR_ERR_TOO_BIG over the frame limit.
 * The layout is protozero's, so our frames are byte-identical to traced's: the nested `msg`
 * gets a 4-byte padded length varint when it is 128 bytes or longer. */
int tr_ipc_frame_encode(const Perfetto__Protos__IPCFrame *frame, uint8_t **out, size_t *out_len);
/* Fills inv and frame as request request_id invoking method_id of service_id with args (no
 * reply wanted with drop_reply), args packed into a new buffer, *args_buf: free it once the
 * frame is sent. 0 or TR_ERR_NOMEM. */
int tr_ipc_frame_invoke(Perfetto__Protos__IPCFrame *frame,
                        Perfetto__Protos__IPCFrame__InvokeMethod *inv, uint32_t service_id,
                        uint32_t method_id, uint64_t request_id, const ProtobufCMessage *args,
                        bool drop_reply, uint8_t **args_buf);

#endif
