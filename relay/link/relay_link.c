/* relay_link.c: one relay link connection over tls_uv, for both ends (see relay_link.h).
 *
 * A link owns its tr_tls_uv_conn: tls_uv's callbacks are this file's, and the end hears
 * through its tr_relay_link_events. The link is allocated before the connection is shown to
 * the end (at connect, or at accept once the handshake is done) and freed after on_closed,
 * which tls_uv's on_close brings: the only place a link ends. A carrier, and the links it
 * carries, are relay_carrier.c's, below this file: here each call that differs for a carried
 * link hands it there, and the carrier calls back only through link_ops (relay_link_priv.h). */
#include "relay/link/relay_link.h"
#include "relay/link/relay_link_priv.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/base/hostport.h"
#include "relay/base/log.h"
#include "relay/link/relay_session.h"
#include "relay/base/tr_error.h"

struct tr_relay_link_listener {
  tr_tls_uv_server *server;
  struct tr_relay_link_opts opts;
  const struct tr_relay_link_events *ev;
  void *data;
};

static const struct tr_relay_link_ops link_ops;

static tr_relay_link *link_alloc(const struct tr_relay_link_opts *opts,
                                 const struct tr_relay_link_events *ev, void *data) {
  tr_relay_link *l = calloc(1, sizeof *l);
  if (l == NULL)
    return NULL;
  if (tr_relay_reader_init(&l->reader, 0) < 0) {
    free(l);
    return NULL;
  }
  l->ops = &link_ops;
  l->ev = ev;
  l->data = data;
  l->opts = *opts;
  if (opts->label != NULL)
    snprintf(l->label, sizeof l->label, "%s", opts->label);
  l->opts.label = NULL;
  if (l->opts.peer_role == NULL)
    l->opts.peer_role = "peer";
  l->max_out = TR_RELAY_MAX_FRAME_DEFAULT;
  return l;
}

static void link_free(tr_relay_link *l) {
  tr_frame_reader_free(&l->reader);
  tr_byte_buf_free(&l->stash);
  free(l);
}

/* ---- the one close path ---- */

static void hang_up(tr_relay_link *l) {
  l->closing = true;
  if (l->ev->on_closing != NULL)
    l->ev->on_closing(l);
  if (l->parent != NULL) {
    tr_relay_carried_hang_up(l);
    return;
  }
  /* What a carrier gathered was sent as far as its ends know: it leaves before the close, as
   * a plain link's queued bytes do (a Goodbye has sent it already). */
  if (l->carrier != NULL)
    tr_relay_carrier_flush(l);
  tr_tls_uv_close(l->conn);
}

static void goodbye(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *text) {
  Tracerelay__Goodbye bye = TRACERELAY__GOODBYE__INIT;
  bye.has_reason = 1;
  bye.reason = reason;
  bye.text = (char *)text;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GOODBYE;
  f.goodbye = &bye;
  uint8_t *buf;
  size_t len;
  if (l->parent != NULL) { /* on its slot: that ends the slot for the peer */
    l->said_goodbye = tr_relay_carried_write_frame(l, &f) == 0;
    return;
  }
  /* Not through the send path: what a full queue means there (close the link, with a
   * Goodbye) is already under way. After what a carrier gathered, in order. */
  if (l->carrier != NULL)
    tr_relay_carrier_flush(l);
  if (tr_relay_frame_encode(&f, l->max_out, &buf, &len) == 0) {
    tr_tls_uv_write(l->conn, buf, len);
    free(buf);
  }
}

static void close_v(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *prefix,
                    const char *fmt, va_list ap) {
  if (l->closing)
    return;
  l->closing = true;
  char text[256];
  size_t n = (size_t)snprintf(text, sizeof text, "%s", prefix);
  vsnprintf(text + n, sizeof text - n, fmt, ap);
  if (reason != TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN)
    TR_WARN("link", "closing %s: %s", l->label, text);
  if (reason != TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED)
    goodbye(l, reason, text);
  hang_up(l);
}

void tr_relay_link_close(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *fmt,
                         ...) {
  va_list ap;
  va_start(ap, fmt);
  close_v(l, reason, "", fmt, ap);
  va_end(ap);
}

void tr_relay_link_protocol_error(tr_relay_link *l, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  close_v(l, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR, "protocol error: ", fmt, ap);
  va_end(ap);
}

void tr_relay_link_hang_up(tr_relay_link *l) {
  if (!l->closing)
    hang_up(l);
}

/* ---- writing ---- */

/* The bytes of a whole encoded frame (header included) onto l's connection; for a carrier
 * through its gathered output. The bytes now queued, or an error (tls_uv's write). */
static int link_write(tr_relay_link *l, const uint8_t *buf, size_t len) {
  return l->carrier != NULL ? tr_relay_carrier_write(l, buf, len)
                            : tr_tls_uv_write(l->conn, buf, len);
}

/* What a write returned, as the link takes it (struct tr_relay_link_ops, wrote). */
static int link_wrote(tr_relay_link *l, int rc) {
  if (rc == TR_ERR_FULL)
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "the %s does not read what we send (%zu bytes queued)",
                        l->opts.peer_role, tr_tls_uv_queued(l->conn));
  if (rc < 0)
    return rc;
  tr_relay_heartbeat_sent(&l->hb, uv_hrtime());
  if (l->opts.pause_read_above != 0 && (size_t)rc > l->opts.pause_read_above && !l->paused) {
    if (!l->held)
      tr_tls_uv_pause_read(l->conn); /* TCP now holds the peer back, not our memory */
    l->paused = true;
  }
  return 0;
}

static void link_close_text(tr_relay_link *l, Tracerelay__Goodbye__Reason reason,
                            const char *text) {
  tr_relay_link_close(l, reason, "%s", text);
}

static const struct tr_relay_link_ops link_ops = {
    .alloc = link_alloc, .free = link_free, .wrote = link_wrote, .close = link_close_text};

int tr_relay_link_send_stamped(tr_relay_link *l, const Tracerelay__RelayFrame *f,
                               int64_t *sent_ns) {
  if (l->parent != NULL) { /* no stamps: its writes are its carrier's, gathered */
    if (sent_ns != NULL)
      *sent_ns = 0;
    return tr_relay_carried_send(l, f);
  }
  if (l->closing)
    return TR_ERR_CLOSED;
  uint8_t *buf;
  size_t len;
  int rc = tr_relay_frame_encode(f, l->max_out, &buf, &len);
  if (rc < 0)
    return rc;
  if (sent_ns != NULL && l->carrier != NULL) /* at once, after what was gathered */
    rc = link_wrote(l, tr_relay_carrier_flush(l));
  if (rc == 0)
    rc = sent_ns != NULL ? tr_tls_uv_write_stamped(l->conn, buf, len, sent_ns)
                         : link_write(l, buf, len);
  free(buf);
  return link_wrote(l, rc);
}

int tr_relay_link_send(tr_relay_link *l, const Tracerelay__RelayFrame *f) {
  return tr_relay_link_send_stamped(l, f, NULL);
}

int tr_relay_link_send_encoded(tr_relay_link *l, const uint8_t *frame, size_t len) {
  if (l->parent != NULL) /* its frames need their slot, which an encoded one lacks */
    return TR_ERR_UNSUPPORTED;
  if (l->closing)
    return TR_ERR_CLOSED;
  return link_wrote(l, link_write(l, frame, len));
}

int tr_relay_link_send_heartbeat(tr_relay_link *l, bool at_once) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, tr_clock_boottime_ns());
  /* at_once takes the stamped write's path to the socket; its stamp goes unused. A plain write
   * would reach the socket as soon, yet warmed the path less: the probes' error bounds came
   * 0.4-0.6 us wider (bench/README.md, issue 25 item 1, sixth session). */
  int64_t sent = 0;
  return tr_relay_link_send_stamped(l, &f, at_once ? &sent : NULL);
}

/* ---- heartbeats ---- */

bool tr_relay_link_check_alive(tr_relay_link *l, uint64_t now_ns) {
  if (tr_relay_link_closing(l))
    return false;
  if (l->parent != NULL) /* its carrier's heartbeats speak for it */
    return true;
  if (!l->open || !tr_relay_heartbeat_dead(&l->hb, now_ns))
    return true;
  unsigned long long ms = l->hb.timeout_ns / 1000000;
  if (l->paused) /* we stopped reading because the peer stopped reading */
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "the %s has not read what we sent for %llu ms", l->opts.peer_role, ms);
  else if (l->held) /* we stopped reading because where its frames go is backed up */
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "the %s's frames could not be passed on for %llu ms", l->opts.peer_role,
                        ms);
  else
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED,
                        "nothing received for %llu ms", ms);
  return false;
}

void tr_relay_link_keep_alive(tr_relay_link *l, uint64_t now_ns) {
  if (l->parent == NULL && l->established && !l->closing &&
      tr_relay_heartbeat_due(&l->hb, now_ns))
    tr_relay_link_send_heartbeat(l, false);
}

/* ---- reading ---- */

static void stash(tr_relay_link *l, const uint8_t *data, size_t len) {
  if (len == 0)
    return;
  if (l->stash.len + len > TR_RELAY_LINK_STASH_MAX) {
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED,
                        "the %s sent %zu bytes while it read nothing of ours",
                        l->opts.peer_role, l->stash.len + len);
    return;
  }
  if (tr_byte_buf_append(&l->stash, data, len, 2 * len) < 0)
    tr_relay_link_close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "out of memory");
}

static void frame_too_long(tr_relay_link *l) {
  tr_relay_link_protocol_error(l, "frame longer than %zu bytes", l->reader.max_payload);
}

/* Takes the next whole frame out of the reader: 1 with *out, 0 when it needs more bytes, or
 * a negative code once the link is closing for a protocol error. */
static int next_frame(tr_relay_link *l, Tracerelay__RelayFrame **out, size_t *out_len) {
  const uint8_t *payload;
  size_t len;
  int rc = tr_frame_reader_next(&l->reader, &payload, &len);
  if (rc < 0)
    frame_too_long(l);
  if (rc <= 0)
    return rc;
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
  if (f == NULL || f->msg_case == TRACERELAY__RELAY_FRAME__MSG__NOT_SET) {
    tr_relay_frame_free(f);
    tr_relay_link_protocol_error(l, "a frame of %zu bytes does not decode to a known message",
                                 len);
    return TR_ERR_PROTO;
  }
  if (f->has_slot && f->slot != 0 && l->carrier == NULL) {
    tr_relay_link_protocol_error(l, "a frame for slot %llu on a link that carries none",
                                 (unsigned long long)f->slot);
    tr_relay_frame_free(f);
    return TR_ERR_PROTO;
  }
  *out = f;
  *out_len = len;
  return 1;
}

/* Hands whole frames to the end, then feeds the reader more of data, until data is used up,
 * the link closes, or our output backs up (the rest is stashed). */
static void consume(tr_relay_link *l, const uint8_t *data, size_t len) {
  for (;;) {
    while (!l->closing && !l->paused && !l->held) {
      Tracerelay__RelayFrame *f;
      size_t flen;
      if (next_frame(l, &f, &flen) <= 0)
        break;
      if (f->has_slot && f->slot != 0)
        tr_relay_carrier_deliver(l, f, flen);
      else
        l->ev->on_frame(l, f);
    }
    if (l->closing)
      return;
    if (l->paused || l->held) {
      stash(l, data, len);
      return;
    }
    if (len == 0)
      return;
    int n = tr_frame_reader_push(&l->reader, data, len);
    if (n < 0) {
      frame_too_long(l);
      return;
    }
    data += n;
    len -= (size_t)n;
  }
}

static void read_done(tr_relay_link *l) {
  if (l->carrier != NULL)
    tr_relay_carrier_read_done(l);
  if (!l->closing && l->ev->on_read_done != NULL)
    l->ev->on_read_done(l);
}

/* ---- tls_uv's callbacks ---- */

static void open_link(tr_relay_link *l) {
  l->open = true;
  tr_relay_heartbeat_init(&l->hb, l->opts.heartbeat_interval_ms * 1000000ull,
                          l->opts.heartbeat_timeout_ms * 1000000ull, uv_hrtime());
  if (l->label[0] == '\0')
    snprintf(l->label, sizeof l->label, "the link of %s (%s)", tr_tls_uv_peer_name(l->conn),
             tr_tls_uv_peer_address(l->conn));
  if (l->ev->on_open != NULL)
    l->ev->on_open(l);
}

static void on_tls_connect(tr_tls_uv_conn *conn) { open_link(tr_tls_uv_get_data(conn)); }

/* A server connection passed its handshake: until now its data was the listener. */
static void on_tls_accept(tr_tls_uv_conn *conn) {
  tr_relay_link_listener *ls = tr_tls_uv_get_data(conn);
  tr_relay_link *l = link_alloc(&ls->opts, ls->ev, ls->data);
  if (l == NULL) {
    TR_WARN("link", "out of memory: dropping the connection of %s", tr_tls_uv_peer_name(conn));
    tr_tls_uv_set_data(conn, NULL);
    tr_tls_uv_close(conn);
    return;
  }
  l->conn = conn;
  tr_tls_uv_set_data(conn, l);
  open_link(l);
}

static void on_tls_read(tr_tls_uv_conn *conn, const void *data, size_t len) {
  tr_relay_link *l = tr_tls_uv_get_data(conn);
  if (l->closing)
    return;
  if (l->ev->on_read != NULL)
    l->ev->on_read(l);
  /* Any bytes prove the peer alive, even part of a long frame on a slow link. */
  tr_relay_heartbeat_heard(&l->hb, uv_hrtime());
  consume(l, data, len);
  read_done(l);
}

/* Nothing holds the input back any more: the stashed frames go first, then the socket is
 * read again (unless they stopped it once more). */
static void restart_input(tr_relay_link *l) {
  tr_byte_buf stashed = l->stash;
  l->stash = (tr_byte_buf){0};
  consume(l, stashed.data, stashed.len);
  tr_byte_buf_free(&stashed);
  read_done(l);
  if (!l->paused && !l->held && !l->closing)
    tr_tls_uv_resume_read(l->conn);
}

/* The held frames first (our queue drained: the peer reads again), then the end's sending. */
static void on_tls_drain(tr_tls_uv_conn *conn) {
  tr_relay_link *l = tr_tls_uv_get_data(conn);
  if (l->paused && !l->closing) {
    l->paused = false;
    if (!l->held)
      restart_input(l);
  }
  if (!l->closing && l->carrier != NULL)
    tr_relay_carrier_drain(l);
  if (!l->closing && l->ev->on_drain != NULL)
    l->ev->on_drain(l);
}

static void on_tls_close(tr_tls_uv_conn *conn, int reason, const char *why) {
  tr_relay_link *l = tr_tls_uv_get_data(conn);
  if (l == NULL) /* accepted, and dropped before it became a link */
    return;
  if (!l->closing) { /* the transport ended it */
    l->closing = true;
    if (l->ev->on_closing != NULL)
      l->ev->on_closing(l);
  }
  if (l->carrier != NULL) /* the links it carries end first */
    tr_relay_carrier_end(l, reason, why);
  l->ev->on_closed(l, reason, why);
  link_free(l);
}

static const struct tr_tls_uv_callbacks connect_callbacks = {
    .on_connect = on_tls_connect, .on_read = on_tls_read, .on_drain = on_tls_drain,
    .on_close = on_tls_close};
static const struct tr_tls_uv_callbacks accept_callbacks = {
    .on_connect = on_tls_accept, .on_read = on_tls_read, .on_drain = on_tls_drain,
    .on_close = on_tls_close};

/* ---- making links ---- */

int tr_relay_link_connect(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                          const struct sockaddr *addr, const struct tr_relay_link_opts *opts,
                          const struct tr_relay_link_events *ev, void *data,
                          tr_relay_link **out) {
  tr_relay_link *l = link_alloc(opts, ev, data);
  if (l == NULL)
    return TR_ERR_NOMEM;
  int rc = tr_tls_uv_connect(loop, cfg, server_name, addr, &opts->tls, &connect_callbacks, l,
                             &l->conn);
  if (rc < 0) {
    link_free(l);
    return rc;
  }
  *out = l;
  return 0;
}

int tr_relay_link_listen(uv_loop_t *loop, tr_tls_config *cfg, const struct sockaddr *addr,
                         const struct tr_relay_link_opts *opts,
                         const struct tr_relay_link_events *ev, void *data,
                         tr_relay_link_listener **out) {
  tr_relay_link_listener *ls = calloc(1, sizeof *ls);
  if (ls == NULL)
    return TR_ERR_NOMEM;
  ls->opts = *opts;
  ls->opts.label = NULL; /* each accepted link is named after its peer */
  ls->ev = ev;
  ls->data = data;
  int rc = tr_tls_uv_listen(loop, cfg, addr, &opts->tls, &accept_callbacks, ls, &ls->server);
  if (rc < 0) {
    free(ls);
    return rc;
  }
  *out = ls;
  return 0;
}

int tr_relay_link_listen_addr(const char *s, struct sockaddr_storage *out) {
  struct tr_hostport hp;
  if (tr_hostport_parse(s, true, &hp) < 0)
    return TR_ERR_CONFIG;
  if (uv_ip4_addr(hp.host, (int)hp.port, (struct sockaddr_in *)out) == 0 ||
      uv_ip6_addr(hp.host, (int)hp.port, (struct sockaddr_in6 *)out) == 0)
    return 0;
  return TR_ERR_CONFIG;
}

int tr_relay_link_listener_port(const tr_relay_link_listener *ls) {
  return tr_tls_uv_server_port(ls->server);
}

void tr_relay_link_listener_set_config(tr_relay_link_listener *ls, tr_tls_config *cfg) {
  tr_tls_uv_server_set_config(ls->server, cfg);
}

void tr_relay_link_listener_stats(const tr_relay_link_listener *ls,
                                  struct tr_tls_uv_server_stats *out) {
  tr_tls_uv_server_stats(ls->server, out);
}

void tr_relay_link_listener_close(tr_relay_link_listener *ls) {
  tr_tls_uv_server_close(ls->server);
  free(ls);
}

/* ---- the rest of the API ---- */

void tr_relay_link_established(tr_relay_link *l, size_t max_out) {
  l->established = true;
  l->max_out = max_out;
}

bool tr_relay_link_closing(const tr_relay_link *l) {
  return l->closing || (l->parent != NULL && l->parent->closing);
}

bool tr_relay_link_idle(const tr_relay_link *l) {
  if (l->parent != NULL)
    return tr_relay_link_idle(l->parent);
  return !l->paused && tr_relay_link_queued(l) == 0;
}

size_t tr_relay_link_queued(const tr_relay_link *l) {
  if (l->parent != NULL)
    return tr_relay_link_queued(l->parent);
  return tr_tls_uv_queued(l->conn) + (l->carrier != NULL ? tr_relay_carrier_gathered(l) : 0);
}

void tr_relay_link_hold_input(tr_relay_link *l) {
  if (l->held || l->closing || l->parent != NULL)
    return;
  if (!l->paused)
    tr_tls_uv_pause_read(l->conn);
  l->held = true;
}

void tr_relay_link_release_input(tr_relay_link *l) {
  if (!l->held)
    return;
  l->held = false;
  if (!l->paused && !l->closing)
    restart_input(l);
}

bool tr_relay_link_input_held(const tr_relay_link *l) { return l->held; }

int tr_relay_link_send_clock_probe(tr_relay_link *l, uint64_t probe_id, int64_t *t1) {
  if (l->parent != NULL) /* it has no send stamps of its own */
    return TR_ERR_UNSUPPORTED;
  if (l->closing)
    return TR_ERR_CLOSED;
  if (!tr_relay_link_idle(l))
    return TR_ERR_AGAIN;
  /* A heartbeat right before the probe warms the kernel's sending path to the host, idle for
   * milliseconds between probes: a cold send took 7-17 us from the write to the driver against
   * 3-5 us for the next one, and the probe's leg is then as short as the way back
   * (docs/timeline.md, Measured accuracy). */
  tr_relay_link_send_heartbeat(l, true);
  if (l->closing)
    return TR_ERR_CLOSED;
  Tracerelay__ClockProbe probe = TRACERELAY__CLOCK_PROBE__INIT;
  probe.has_probe_id = probe.has_t1 = 1;
  probe.probe_id = probe_id;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_CLOCK_PROBE;
  f.clock_probe = &probe;
  /* The exact t1 is taken once the frame is encrypted, right before the kernel takes it; this
   * earlier reading stands in when the bytes had to be queued (still a valid bound). */
  *t1 = (int64_t)tr_clock_boottime_ns();
  probe.t1 = (uint64_t)*t1;
  /* Its answer's arrival stamp is trusted only if TCP reordered nothing from now on. */
  tr_tls_uv_mark_order(l->conn);
  int64_t sent = 0;
  int rc = tr_relay_link_send_stamped(l, &f, &sent);
  if (rc < 0)
    return rc;
  if (sent > 0)
    *t1 = sent;
  return 0;
}

size_t tr_relay_link_max_in(const tr_relay_link *l) { return l->reader.max_payload; }

tr_tls_uv_conn *tr_relay_link_conn(const tr_relay_link *l) {
  return l->parent != NULL ? l->parent->conn : l->conn;
}

uint64_t tr_relay_link_bytes_in(const tr_relay_link *l) {
  return l->parent != NULL ? l->bytes_in : tr_tls_uv_bytes_in(l->conn);
}

void *tr_relay_link_data(const tr_relay_link *l) { return l->data; }

void tr_relay_link_set_data(tr_relay_link *l, void *data) { l->data = data; }
