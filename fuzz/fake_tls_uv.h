/* fake_tls_uv.h: a stand-in for relay/link/tls_uv.c with no socket and no TLS, linked instead
 * of it into a fuzz target that compiles relay_link.c and relay_carrier.c from source
 * (fuzz_relay_carrier): the link code is the daemons', only the transport under it is this.
 *
 * The harness plays tls_uv's side: it shows the connection (fake_tls_uv_open), hands it
 * decrypted bytes (fake_tls_uv_read), says the queue drained (fake_tls_uv_drain) and ends it
 * (fake_tls_uv_end), as tls_uv would from the loop. Writes are never queued (tr_tls_uv_queued is
 * 0): each goes to the write hook, whole, at once. tr_tls_uv_close only marks the connection
 * closing (writes then fail with TR_ERR_CLOSED, reads are not delivered); its on_close comes
 * when the harness calls fake_tls_uv_end, as tls_uv's comes later from the loop. A server
 * (tr_tls_uv_listen) accepts a connection when the harness calls fake_tls_uv_accept: it is
 * shown to the server's on_connect with its handshake done. */
#ifndef TR_FAKE_TLS_UV_H
#define TR_FAKE_TLS_UV_H

#include <stdbool.h>
#include <stddef.h>

#include "relay/link/tls_uv.h"

typedef void (*fake_tls_uv_write_fn)(void *arg, const void *data, size_t len);

/* Every write of every connection goes to fn(arg, data, len). */
void fake_tls_uv_set_write_hook(fake_tls_uv_write_fn fn, void *arg);
/* The connection tr_tls_uv_connect made last (for a harness whose end connects by itself). */
tr_tls_uv_conn *fake_tls_uv_last_connected(void);
/* The server tr_tls_uv_listen made last, until it is closed. */
tr_tls_uv_server *fake_tls_uv_last_server(void);
/* A connection to server srv, its handshake done (on_connect); NULL when out of memory. */
tr_tls_uv_conn *fake_tls_uv_accept(tr_tls_uv_server *srv);
/* Ends every connection not ended yet (fake_tls_uv_end), newest first. */
void fake_tls_uv_end_all(int reason, const char *why);
/* The handshake is done: on_connect. */
void fake_tls_uv_open(tr_tls_uv_conn *c);
/* Decrypted bytes: on_read, unless the connection is closing or its reading paused. */
void fake_tls_uv_read(tr_tls_uv_conn *c, const void *data, size_t len);
void fake_tls_uv_drain(tr_tls_uv_conn *c);
/* tr_tls_uv_close was called. */
bool fake_tls_uv_closing(const tr_tls_uv_conn *c);
/* The connection is gone: on_close(reason, why), then c is freed. */
void fake_tls_uv_end(tr_tls_uv_conn *c, int reason, const char *why);

#endif
