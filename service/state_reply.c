/* state_reply.c: a QueryServiceState answer cut into IPC replies (state_reply.h). */
#include "service/state_reply.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

#define HDR_ROOM 6u /* room for 0x0A (service_state) + the varint of a length below 2^32 */
#define SLACK 16u   /* kept free below the cap */

int tr_state_reply_begin(tr_state_reply *o, tr_ipc_conn *conn, uint64_t req) {
  *o = (tr_state_reply){.conn = conn, .req = req, .buf = malloc(TR_STATE_REPLY_CAP)};
  return o->buf ? 0 : TR_ERR_NOMEM;
}

static void send_reply(tr_state_reply *o, bool has_more) {
  uint8_t hdr[HDR_ROOM];
  size_t hl = 0;
  if (o->failed)
    return;
  hdr[hl++] = 0x0A;
  hl += tr_varint_put(hdr + hl, o->used);
  memcpy(o->buf + HDR_ROOM - hl, hdr, hl);
  if (tr_ipc_conn_reply(o->conn, o->req, true, has_more, o->buf + HDR_ROOM - hl, hl + o->used,
                        -1) != 0)
    o->failed = true;
  o->used = 0;
}

/* Room for n more bytes of elements, sending the reply so far if need be; false when an
 * element of n bytes fits in no reply or a send failed. */
static bool make_room(tr_state_reply *o, size_t n) {
  if (o->failed || HDR_ROOM + n + SLACK > TR_STATE_REPLY_CAP)
    return false;
  if (HDR_ROOM + o->used + n + SLACK > TR_STATE_REPLY_CAP)
    send_reply(o, true);
  return !o->failed;
}

void tr_state_reply_add(tr_state_reply *o, const ProtobufCMessage *element) {
  size_t n = protobuf_c_message_get_packed_size(element);
  if (make_room(o, n))
    o->used += protobuf_c_message_pack(element, o->buf + HDR_ROOM + o->used);
}

void tr_state_reply_add_raw(tr_state_reply *o, const uint8_t *bytes, size_t n) {
  if (!make_room(o, n))
    return;
  memcpy(o->buf + HDR_ROOM + o->used, bytes, n);
  o->used += n;
}

void tr_state_reply_end(tr_state_reply *o) {
  send_reply(o, false);
  free(o->buf);
  o->buf = NULL;
}
