/* fake_tls_uv.c: the tls_uv.h calls relay_link.c and relay_carrier.c make, over no socket (see
 * fake_tls_uv.h). Only what those two files call is here: a new call there fails the fuzz
 * target's link, which is the cue to fake it too. */
#include "fuzz/fake_tls_uv.h"

#include <stdint.h>
#include <stdlib.h>

#include "relay/base/tr_error.h"

struct tr_tls_uv_conn {
  uv_loop_t *loop;
  const struct tr_tls_uv_callbacks *cbs;
  void *data;
  bool connected, closing, paused;
  uint64_t bytes_in;
  tr_tls_uv_conn *next; /* in the list of live connections */
};

struct tr_tls_uv_server {
  const struct tr_tls_uv_callbacks *cbs;
  uv_loop_t *loop;
  void *data;
};

static tr_tls_uv_conn *live; /* every connection not ended yet, newest first */
static tr_tls_uv_server *last_server;

static tr_tls_uv_conn *conn_new(uv_loop_t *loop, const struct tr_tls_uv_callbacks *cbs,
                                void *data) {
  tr_tls_uv_conn *c = calloc(1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->loop = loop;
  c->cbs = cbs;
  c->data = data;
  c->next = live;
  live = c;
  return c;
}

static fake_tls_uv_write_fn write_hook;
static tr_tls_uv_conn *last_connected;

tr_tls_uv_conn *fake_tls_uv_last_connected(void) { return last_connected; }
static void *write_arg;

void fake_tls_uv_set_write_hook(fake_tls_uv_write_fn fn, void *arg) {
  write_hook = fn;
  write_arg = arg;
}

void fake_tls_uv_open(tr_tls_uv_conn *c) {
  c->connected = true;
  c->cbs->on_connect(c);
}

void fake_tls_uv_read(tr_tls_uv_conn *c, const void *data, size_t len) {
  if (c->closing || c->paused || len == 0)
    return;
  c->bytes_in += len;
  c->cbs->on_read(c, data, len);
}

void fake_tls_uv_drain(tr_tls_uv_conn *c) {
  if (!c->closing && c->cbs->on_drain != NULL)
    c->cbs->on_drain(c);
}

bool fake_tls_uv_closing(const tr_tls_uv_conn *c) { return c->closing; }

void fake_tls_uv_end(tr_tls_uv_conn *c, int reason, const char *why) {
  c->closing = true;
  if (last_connected == c)
    last_connected = NULL;
  for (tr_tls_uv_conn **p = &live; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  c->cbs->on_close(c, reason, why);
  free(c);
}

/* ---- tls_uv.h ---- */

int tr_tls_uv_connect(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                      const struct sockaddr *addr, const struct tr_tls_uv_options *opts,
                      const struct tr_tls_uv_callbacks *cbs, void *data, tr_tls_uv_conn **out) {
  (void)cfg, (void)server_name, (void)addr, (void)opts;
  tr_tls_uv_conn *c = conn_new(loop, cbs, data);
  if (c == NULL)
    return TR_ERR_NOMEM;
  *out = c;
  last_connected = c;
  return 0;
}

int tr_tls_uv_write(tr_tls_uv_conn *c, const void *data, size_t len) {
  if (c->closing)
    return TR_ERR_CLOSED;
  if (!c->connected)
    return TR_ERR_STATE;
  if (write_hook != NULL)
    write_hook(write_arg, data, len);
  return 0;
}

int tr_tls_uv_write_stamped(tr_tls_uv_conn *c, const void *data, size_t len, int64_t *sent_ns) {
  *sent_ns = 0;
  return tr_tls_uv_write(c, data, len);
}

int tr_tls_uv_pause_read(tr_tls_uv_conn *c) {
  if (c->closing)
    return TR_ERR_CLOSED;
  c->paused = true;
  return 0;
}

int tr_tls_uv_resume_read(tr_tls_uv_conn *c) {
  if (c->closing)
    return TR_ERR_CLOSED;
  c->paused = false;
  return 0;
}

void tr_tls_uv_close(tr_tls_uv_conn *c) { c->closing = true; }
size_t tr_tls_uv_queued(const tr_tls_uv_conn *c) { (void)c; return 0; }
uint64_t tr_tls_uv_bytes_in(const tr_tls_uv_conn *c) { return c->bytes_in; }
void tr_tls_uv_mark_order(tr_tls_uv_conn *c) { (void)c; }
/* The agent's link (fuzz_agent_commands) stamps clock probes: a fixed time, and no kernel
 * stamp ever comes. */
int64_t tr_tls_uv_read_time(const tr_tls_uv_conn *c) { (void)c; return 1000000000; }
int64_t tr_tls_uv_read_time_checked(tr_tls_uv_conn *c, bool mark) {
  (void)mark;
  return tr_tls_uv_read_time(c);
}
int64_t tr_tls_uv_sent_time(tr_tls_uv_conn *c, int64_t sent_ns) { (void)c; return sent_ns; }
bool tr_tls_uv_sent_time_pending(tr_tls_uv_conn *c, int64_t sent_ns) {
  (void)c, (void)sent_ns;
  return false;
}
const char *tr_tls_uv_ciphersuite(const tr_tls_uv_conn *c) { (void)c; return "fake"; }
const char *tr_tls_uv_peer_name(const tr_tls_uv_conn *c) { (void)c; return "regional-a"; }
const char *tr_tls_uv_peer_address(const tr_tls_uv_conn *c) { (void)c; return "192.0.2.1:7393"; }
/* No TLS session behind a fake connection: reloads and expiry checks skip it. */
const tr_tls_session *tr_tls_uv_session(const tr_tls_uv_conn *c) {
  (void)c;
  return NULL;
}
void *tr_tls_uv_get_data(const tr_tls_uv_conn *c) { return c->data; }
void tr_tls_uv_set_data(tr_tls_uv_conn *c, void *data) { c->data = data; }
uv_loop_t *tr_tls_uv_loop(const tr_tls_uv_conn *c) { return c->loop; }

/* Listening: connections come when the harness says (fake_tls_uv_accept). */
int tr_tls_uv_listen(uv_loop_t *loop, tr_tls_config *cfg, const struct sockaddr *addr,
                     const struct tr_tls_uv_options *opts, const struct tr_tls_uv_callbacks *cbs,
                     void *data, tr_tls_uv_server **out) {
  (void)cfg, (void)addr, (void)opts;
  tr_tls_uv_server *srv = calloc(1, sizeof *srv);
  if (srv == NULL)
    return TR_ERR_NOMEM;
  *srv = (tr_tls_uv_server){.cbs = cbs, .loop = loop, .data = data};
  *out = last_server = srv;
  return 0;
}
int tr_tls_uv_server_port(const tr_tls_uv_server *srv) { (void)srv; return 7393; }
void tr_tls_uv_server_set_config(tr_tls_uv_server *srv, tr_tls_config *cfg) {
  (void)srv, (void)cfg;
}
void tr_tls_uv_server_stats(const tr_tls_uv_server *srv, struct tr_tls_uv_server_stats *out) {
  (void)srv;
  *out = (struct tr_tls_uv_server_stats){0};
}
void tr_tls_uv_server_close(tr_tls_uv_server *srv) {
  if (last_server == srv)
    last_server = NULL;
  free(srv);
}
tr_tls_uv_server *fake_tls_uv_last_server(void) { return last_server; }

tr_tls_uv_conn *fake_tls_uv_accept(tr_tls_uv_server *srv) {
  tr_tls_uv_conn *c = conn_new(srv->loop, srv->cbs, srv->data);
  if (c == NULL)
    return NULL;
  c->connected = true;
  c->cbs->on_connect(c);
  return c;
}

void fake_tls_uv_end_all(int reason, const char *why) {
  while (live != NULL)
    fake_tls_uv_end(live, reason, why);
}
