/* state_reply.h: a QueryServiceState answer cut into IPC replies, for the service's and the
 * regional's consumer sockets.
 *
 * The answer is a list of elements, each a TracingServiceState's serialised fields (the
 * service, a producer, a session, our field-1000 host status...). Replies are cut at
 * TR_STATE_REPLY_CAP, where traced cuts its own (kIPCBufferSize - 128), so a state that fits
 * one traced reply fits one of ours. Each reply holds exactly ONE service_state field wrapping
 * whole elements (itself a valid TracingServiceState, as traced builds its chunks): Perfetto's
 * client decodes every reply with a cppgen parser for which a repeated singular service_state
 * replaces the previous one (clearing its repeated fields), so a second service_state in one
 * reply would hide the producers and data sources of the first. The Perfetto UI concatenates
 * the replies and decodes them once with protobufjs (7.6.5 in v58.2), for which too the last
 * service_state replaces the others: it sees everything only when there is one reply. The
 * consumer joins the replies' service_state payloads into one message.
 *
 * An element too big for any reply is left out (none of ours is: names are bounded). After a
 * failed send the rest of the answer is dropped; the connection's own close reports it. */
#ifndef TR_STATE_REPLY_H
#define TR_STATE_REPLY_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/producer/ipc_frame.h"
#include "relay/producer/ipc_host.h"

#define TR_STATE_REPLY_CAP (TR_IPC_MAX_FRAME - 128u)

typedef struct tr_state_reply {
  tr_ipc_conn *conn;
  uint64_t req;
  uint8_t *buf; /* header room, then the elements of the reply being built */
  size_t used;  /* bytes of elements in buf */
  bool failed;
} tr_state_reply;

/* Starts the answer to request req; returns 0 or TR_ERR_NOMEM (nothing sent). */
int tr_state_reply_begin(tr_state_reply *o, tr_ipc_conn *conn, uint64_t req);
/* Appends one element, sending the reply so far first when the element would not fit. */
void tr_state_reply_add(tr_state_reply *o, const ProtobufCMessage *element);
/* Appends one element already encoded. */
void tr_state_reply_add_raw(tr_state_reply *o, const uint8_t *bytes, size_t n);
/* Sends the last reply (has_more false) and frees what begin took. */
void tr_state_reply_end(tr_state_reply *o);

#endif
