/* relay_conn.h: RelayFrames over a tr_tls_uv connection, the plumbing both ends of the relay
 * link share (agent/link_client.c, service/link_server.c): a frame encoded and queued on the
 * connection, and frames taken one by one out of the plaintext read so far.
 *
 * What follows is each end's own business: what a full queue means (the peer stopped
 * reading), heartbeats, backpressure, and closing the link after a protocol error, for which
 * these calls only give the message. */
#ifndef TR_RELAY_CONN_H
#define TR_RELAY_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "relay/relay_frame.h"
#include "relay/tls_uv.h"

/* Encodes f (header included, at most max_frame bytes) and queues it on conn; sent_ns is NULL,
 * or where tr_tls_uv_write_stamped puts the exact send time. Returns as tr_tls_uv_write (the
 * bytes now queued, TR_ERR_FULL...), or TR_ERR_TOO_BIG / TR_ERR_NOMEM from the encoder, when
 * nothing was queued. */
int tr_relay_conn_send(tr_tls_uv_conn *conn, const Tracerelay__RelayFrame *f, size_t max_frame,
                       int64_t *sent_ns);
/* Sends a Goodbye saying why the link is being closed (reason, and text for the peer's log), as
 * tr_relay_conn_send. It bypasses the caller's own send path on purpose: what a full queue
 * means there (close the link, with a Goodbye) is already under way. */
int tr_relay_conn_goodbye(tr_tls_uv_conn *conn, Tracerelay__Goodbye__Reason reason,
                          const char *text, size_t max_frame);

/* Takes the next whole frame out of r and decodes it: 1 with *out (free it with
 * tr_relay_frame_free), 0 when r needs more bytes (tr_relay_conn_push), or TR_ERR_PROTO with
 * why the link must be closed in `why` (a frame longer than r allows, or one that does not
 * decode to a known message). */
int tr_relay_conn_next(tr_relay_reader *r, Tracerelay__RelayFrame **out, char *why,
                       size_t why_len);
/* Copies into r what fits of data[0, len): the bytes taken, or TR_ERR_PROTO with why as above. */
int tr_relay_conn_push(tr_relay_reader *r, const uint8_t *data, size_t len, char *why,
                       size_t why_len);

#endif
