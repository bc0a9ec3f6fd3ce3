/* ipc_frame.c: the IPCFrame codec behind ipc_frame.h, and the frame reader's IPC limits
 * (the reader itself is relay/base/frame_reader.c). */
#include "relay/producer/ipc_frame.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/pb_valid.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"


void tr_ipc_reader_init(tr_ipc_reader *r) { tr_frame_reader_init(r, TR_IPC_MAX_PAYLOAD, true); }

Perfetto__Protos__IPCFrame *tr_ipc_frame_decode(const uint8_t *payload, size_t len) {
  Perfetto__Protos__IPCFrame *f = perfetto__protos__ipcframe__unpack(NULL, len, payload);
  if (f && !tr_pb_tags_valid(&f->base)) { /* would not re-encode: see pb_valid.h */
    perfetto__protos__ipcframe__free_unpacked(f, NULL);
    return NULL;
  }
  return f;
}

void tr_ipc_frame_free(Perfetto__Protos__IPCFrame *frame) {
  if (frame)
    perfetto__protos__ipcframe__free_unpacked(frame, NULL);
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) { return p + tr_varint_put(p, v); }

/* protozero reserves 4 bytes for a nested message's length and only shrinks it to one byte
 * when the message turns out shorter than 128 bytes. */
static size_t nested_len_size(size_t len) { return len < 0x80 ? 1 : 4; }

static uint8_t *put_nested_len(uint8_t *p, size_t len) {
  if (len < 0x80)
    return put_varint(p, len);
  for (int i = 0; i < 3; i++)
    *p++ = (uint8_t)((len >> (7 * i)) | 0x80);
  *p++ = (uint8_t)((len >> 21) & 0x7f);
  return p;
}

int tr_ipc_frame_encode(const Perfetto__Protos__IPCFrame *frame, uint8_t **out, size_t *out_len) {
  size_t size = 0;
  for (size_t i = 0; i < frame->n_data_for_testing; i++) {
    size_t n = frame->data_for_testing[i].len;
    if (n > TR_IPC_MAX_PAYLOAD)
      return TR_ERR_TOO_BIG;
    size += 1 + tr_varint_len(n) + n;
    if (size > TR_IPC_MAX_PAYLOAD)
      return TR_ERR_TOO_BIG;
  }
  if (frame->has_request_id)
    size += 1 + tr_varint_len(frame->request_id);
  /* Every member of the msg union is a pointer to a message, so any one names it. */
  const ProtobufCMessage *msg = NULL;
  size_t msg_len = 0;
  if (frame->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG__NOT_SET) {
    msg = (const ProtobufCMessage *)frame->msg_bind_service;
    msg_len = protobuf_c_message_get_packed_size(msg);
    if (msg_len > TR_IPC_MAX_PAYLOAD)
      return TR_ERR_TOO_BIG;
    size += 1 + nested_len_size(msg_len) + msg_len;
  }
  if (size > TR_IPC_MAX_PAYLOAD)
    return TR_ERR_TOO_BIG;

  uint8_t *buf = malloc(TR_FRAME_HEADER + size);
  if (!buf)
    return TR_ERR_NOMEM;
  uint8_t *p = buf;
  *p++ = (uint8_t)size;
  *p++ = (uint8_t)(size >> 8);
  *p++ = (uint8_t)(size >> 16);
  *p++ = (uint8_t)(size >> 24);
  for (size_t i = 0; i < frame->n_data_for_testing; i++) {
    *p++ = (1 << 3) | 2;
    p = put_varint(p, frame->data_for_testing[i].len);
    if (frame->data_for_testing[i].len > 0)
      memcpy(p, frame->data_for_testing[i].data, frame->data_for_testing[i].len);
    p += frame->data_for_testing[i].len;
  }
  if (frame->has_request_id) {
    *p++ = 2 << 3;
    p = put_varint(p, frame->request_id);
  }
  if (msg) {
    *p++ = (uint8_t)((unsigned)frame->msg_case << 3 | 2);
    p = put_nested_len(p, msg_len);
    p += protobuf_c_message_pack(msg, p);
  }
  *out = buf;
  *out_len = TR_FRAME_HEADER + size;
  return 0;
}

int tr_ipc_frame_invoke(Perfetto__Protos__IPCFrame *frame,
                        Perfetto__Protos__IPCFrame__InvokeMethod *inv, uint32_t service_id,
                        uint32_t method_id, uint64_t request_id, const ProtobufCMessage *args,
                        bool drop_reply, uint8_t **args_buf) {
  size_t len = protobuf_c_message_get_packed_size(args);
  uint8_t *buf = malloc(len ? len : 1);
  if (buf == NULL)
    return TR_ERR_NOMEM;
  protobuf_c_message_pack(args, buf);
  *inv = (Perfetto__Protos__IPCFrame__InvokeMethod)PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  inv->has_service_id = inv->has_method_id = inv->has_args_proto = inv->has_drop_reply = 1;
  inv->service_id = service_id;
  inv->method_id = method_id;
  inv->args_proto = (ProtobufCBinaryData){len, buf};
  inv->drop_reply = drop_reply;
  *frame = (Perfetto__Protos__IPCFrame)PERFETTO__PROTOS__IPCFRAME__INIT;
  frame->has_request_id = 1;
  frame->request_id = request_id;
  frame->msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  frame->msg_invoke_method = inv;
  *args_buf = buf;
  return 0;
}

void tr_ipc_producer_method_ids(const Perfetto__Protos__IPCFrame__BindServiceReply *r,
                                uint32_t ids[TR_PM_COUNT]) {
  static const char *const names[TR_PM_COUNT] = {
      NULL, "InitializeConnection", "RegisterDataSource", "UnregisterDataSource", "CommitData",
      "GetAsyncCommand", "RegisterTraceWriter", "UnregisterTraceWriter",
      "NotifyDataSourceStarted", "NotifyDataSourceStopped", "ActivateTriggers", "Sync",
      "UpdateDataSource"};
  memset(ids, 0, TR_PM_COUNT * sizeof ids[0]);
  for (size_t i = 0; i < r->n_methods; i++)
    for (int m = 1; m < TR_PM_COUNT; m++)
      if (r->methods[i]->name != NULL && strcmp(r->methods[i]->name, names[m]) == 0)
        ids[m] = r->methods[i]->id;
}
