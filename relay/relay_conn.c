/* relay_conn.c: RelayFrames over a tr_tls_uv connection (see relay_conn.h). */
#include "relay/relay_conn.h"

#include <stdio.h>
#include <stdlib.h>

#include "relay/tr_error.h"

int tr_relay_conn_send(tr_tls_uv_conn *conn, const Tracerelay__RelayFrame *f, size_t max_frame,
                       int64_t *sent_ns) {
  uint8_t *buf;
  size_t len;
  int rc = tr_relay_frame_encode(f, max_frame, &buf, &len);
  if (rc < 0)
    return rc;
  rc = sent_ns != NULL ? tr_tls_uv_write_stamped(conn, buf, len, sent_ns)
                       : tr_tls_uv_write(conn, buf, len);
  free(buf);
  return rc;
}

int tr_relay_conn_goodbye(tr_tls_uv_conn *conn, Tracerelay__Goodbye__Reason reason,
                          const char *text, size_t max_frame) {
  Tracerelay__Goodbye bye = TRACERELAY__GOODBYE__INIT;
  bye.has_reason = 1;
  bye.reason = reason;
  bye.text = (char *)text;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GOODBYE;
  f.goodbye = &bye;
  return tr_relay_conn_send(conn, &f, max_frame, NULL);
}

static int too_long(const tr_relay_reader *r, char *why, size_t why_len) {
  snprintf(why, why_len, "frame longer than %zu bytes", r->max_payload);
  return TR_ERR_PROTO;
}

int tr_relay_conn_next(tr_relay_reader *r, Tracerelay__RelayFrame **out, char *why,
                       size_t why_len) {
  const uint8_t *payload;
  size_t len;
  int rc = tr_frame_reader_next(r, &payload, &len);
  if (rc <= 0)
    return rc == 0 ? 0 : too_long(r, why, why_len);
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
  if (f == NULL || f->msg_case == TRACERELAY__RELAY_FRAME__MSG__NOT_SET) {
    tr_relay_frame_free(f);
    snprintf(why, why_len, "a frame of %zu bytes does not decode to a known message", len);
    return TR_ERR_PROTO;
  }
  *out = f;
  return 1;
}

int tr_relay_conn_push(tr_relay_reader *r, const uint8_t *data, size_t len, char *why,
                       size_t why_len) {
  int n = tr_frame_reader_push(r, data, len);
  return n < 0 ? too_long(r, why, why_len) : n;
}
