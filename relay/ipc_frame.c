/* ipc_frame.c: the bounded frame reader and the IPCFrame codec behind ipc_frame.h.
 *
 * The reader keeps one buffer per connection that starts small (most frames are tens of
 * bytes) and grows to the size of the largest frame seen, never past TR_IPC_MAX_FRAME. The
 * length header is checked before any payload byte is buffered, so a peer cannot make us
 * hold more than one maximal frame. Each call is O(bytes moved): taking a frame is O(1),
 * making room compacts the unread tail once. */
#include "relay/ipc_frame.h"

#include <stdlib.h>
#include <string.h>

#include "relay/tr_error.h"

#define MIN_CAP 4096u
#define HEADER 4u

static uint32_t read_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tr_ipc_reader_init(tr_ipc_reader *r) { memset(r, 0, sizeof *r); }

void tr_ipc_reader_free(tr_ipc_reader *r) {
  free(r->buf);
  memset(r, 0, sizeof *r);
}

/* The bytes the buffer must be able to hold for the frame at `start`: its whole size once
 * its header is in, else the header. */
static int frame_need(const tr_ipc_reader *r, size_t *need) {
  if (r->len - r->start < HEADER) {
    *need = HEADER;
    return 0;
  }
  uint32_t size = read_le32(r->buf + r->start);
  if (size > TR_IPC_MAX_PAYLOAD)
    return TR_ERR_TOO_BIG;
  *need = HEADER + size;
  return 0;
}

int tr_ipc_reader_space(tr_ipc_reader *r, uint8_t **out, size_t *room) {
  size_t need;
  int rc = frame_need(r, &need);
  if (rc < 0)
    return rc;
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->len - r->start);
    r->len -= r->start;
    r->start = 0;
  }
  if (r->cap < need) {
    size_t cap = r->cap * 2 > need ? r->cap * 2 : need;
    if (cap < MIN_CAP)
      cap = MIN_CAP;
    if (cap > TR_IPC_MAX_FRAME)
      cap = TR_IPC_MAX_FRAME;
    uint8_t *buf = realloc(r->buf, cap);
    if (!buf)
      return TR_ERR_NOMEM;
    r->buf = buf;
    r->cap = cap;
  }
  *out = r->buf + r->len;
  *room = r->cap - r->len;
  return 0;
}

void tr_ipc_reader_commit(tr_ipc_reader *r, size_t n) { r->len += n; }

int tr_ipc_reader_push(tr_ipc_reader *r, const uint8_t *data, size_t len) {
  uint8_t *dst;
  size_t room;
  int rc = tr_ipc_reader_space(r, &dst, &room);
  if (rc < 0)
    return rc;
  size_t n = len < room ? len : room;
  if (n > 0)
    memcpy(dst, data, n);
  tr_ipc_reader_commit(r, n);
  return (int)n;
}

int tr_ipc_reader_next(tr_ipc_reader *r, const uint8_t **payload, size_t *len) {
  for (;;) {
    size_t avail = r->len - r->start;
    if (avail < HEADER)
      return 0;
    uint32_t size = read_le32(r->buf + r->start);
    if (size > TR_IPC_MAX_PAYLOAD)
      return TR_ERR_TOO_BIG;
    if (avail - HEADER < size)
      return 0;
    r->start += HEADER + size;
    if (size == 0)
      continue;
    *payload = r->buf + r->start - size;
    *len = size;
    return 1;
  }
}

Perfetto__Protos__IPCFrame *tr_ipc_frame_decode(const uint8_t *payload, size_t len) {
  return perfetto__protos__ipcframe__unpack(NULL, len, payload);
}

void tr_ipc_frame_free(Perfetto__Protos__IPCFrame *frame) {
  if (frame)
    perfetto__protos__ipcframe__free_unpacked(frame, NULL);
}

static size_t varint_size(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t *put_varint(uint8_t *p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

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
    size += 1 + varint_size(n) + n;
    if (size > TR_IPC_MAX_PAYLOAD)
      return TR_ERR_TOO_BIG;
  }
  if (frame->has_request_id)
    size += 1 + varint_size(frame->request_id);
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

  uint8_t *buf = malloc(HEADER + size);
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
  *out_len = HEADER + size;
  return 0;
}
