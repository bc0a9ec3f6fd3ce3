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
#include "relay/base/frame_reader.h"

#define TR_IPC_MAX_FRAME 131072u                /* kIPCBufferSize, header included */
#define TR_IPC_MAX_PAYLOAD (TR_IPC_MAX_FRAME - 4u)

/* The stream reader (relay/base/frame_reader.h) with Perfetto's limits: payloads up to
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

/* ProducerPort's methods by their number in the .proto (reference 2.1), for the producers that
 * call a port from this side (the loadgen, bench/many_agents' emulation, the hostile producer). */
enum tr_producer_method {
  TR_PM_INITIALIZE_CONNECTION = 1,
  TR_PM_REGISTER_DATA_SOURCE = 2,
  TR_PM_UNREGISTER_DATA_SOURCE = 3,
  TR_PM_COMMIT_DATA = 4,
  TR_PM_GET_ASYNC_COMMAND = 5,
  TR_PM_REGISTER_TRACE_WRITER = 6,
  TR_PM_UNREGISTER_TRACE_WRITER = 7,
  TR_PM_NOTIFY_STARTED = 8,
  TR_PM_NOTIFY_STOPPED = 9,
  TR_PM_ACTIVATE_TRIGGERS = 10,
  TR_PM_SYNC = 11,
  TR_PM_UPDATE_DATA_SOURCE = 12,
  TR_PM_COUNT = 13
};
/* From a BindService reply: ids[m] = the id the service gave method m by its name, 0 for one it
 * did not offer (ids[0] is 0). */
void tr_ipc_producer_method_ids(const Perfetto__Protos__IPCFrame__BindServiceReply *r,
                                uint32_t ids[TR_PM_COUNT]);

#endif
