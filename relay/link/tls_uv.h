/* tls_uv.h: tr_tls sessions over libuv TCP, the transport of the relay link.
 *
 * A server (tr_tls_uv_listen) accepts TCP connections and runs the TLS handshake under a
 * deadline; a client (tr_tls_uv_connect) connects and does the same. Once the handshake is
 * done the connection is a reliable, ordered, message-agnostic pipe: tr_tls_uv_write() sends
 * bytes, on_read delivers decrypted bytes as they arrive (no framing: the relay protocol does
 * that), on_close says why it ended.
 *
 * Guarantees:
 * - A server connection is shown to the application (on_connect) only after the peer proved a
 *   valid agent certificate; tr_tls_uv_peer_name() is then its machine name. Connections
 *   refused before that (bad certificate, not TLS, handshake deadline) are logged with the peer
 *   address and the reason, and counted; the application never sees them.
 * - A connect storm converges instead of collapsing. A server runs at most max_handshakes
 *   handshakes at once; it accepts every further connection at once and keeps it waiting, in
 *   order of arrival, without reading it and with no TLS session yet (a socket and about 1 KiB
 *   each, at most TR_TLS_UV_MAX_WAITING), and starts its handshake when one ends. A client
 *   counts its deadline in two parts: up to start_timeout_ms from its connect until the
 *   server's first handshake bytes (the server began), then handshake_timeout_ms for the rest.
 *   A connection that waited admission_wait_ms without a slot (less than a client's start
 *   timeout, so the client is still there) is refused cleanly: closed before any byte is
 *   sent, counted (refused_busy), and logged once per storm, not once per peer. A client whose
 *   server closed before its handshake began reports TR_ERR_BUSY: come back later, at a time
 *   of its own choosing (the agent waits 5-20 s, at random). So the server spends its
 *   public-key work only on clients that still wait for it: before, connections waited in the
 *   kernel's listen backlog and every client's 10 s counted from its connect, so in a storm on
 *   a loaded machine the server took most connections after their client had given up
 *   (bench/README.md, bench_tiers: 12,814 abandoned handshakes at one regional, nothing but
 *   the regionals connected after 480 s). A peer that leaves before its handshake's first step
 *   began here has that step cancelled; handshakes the server began and the peer left or let
 *   run out are counted (abandoned). Both deadlines count the time a side waits for its peer:
 *   they stop while a handshake step of its own waits for or runs on a worker, so that a
 *   machine too busy to run this side's steps at once does not make it give up on a peer that
 *   answered in time (at ten regionals on 2 CPUs their own queues took longer than 10 s).
 * - One source address cannot starve the others before anybody is authenticated: it runs at
 *   most max_handshakes_per_source handshakes at once (its further connections wait, passed
 *   over while others' are admitted) and has at most max_waiting_per_source waiting (beyond,
 *   refused at once as busy, counted as refused_source, logged once per address).
 *   Addresses are counted whole (an IPv6 peer's /64 is many sources).
 * - Memory per connection is bounded: about 200 KiB of buffers plus the write queue, which the
 *   caller bounds by honouring TR_ERR_FULL / on_drain.
 * - One close path: every connection the application was given gets exactly one on_close,
 *   after which the pointer is invalid. Callbacks never run after on_close.
 * - TCP_NODELAY and TCP keepalive are on for every connection.
 * - Reading can be paused (tr_tls_uv_pause_read) for backpressure: nothing is lost or
 *   reordered, and a paused connection holds at most one socket read of input.
 *
 * Threads: everything runs on the loop's thread, and every callback is made there, except the
 * steps of the TLS handshake (mbedTLS's public-key operations), which run on libuv's worker
 * pool (uv_queue_work) so that a storm of handshakes never stalls the loop; while a step runs,
 * nothing on the loop touches that connection's session. */
#ifndef TR_TLS_UV_H
#define TR_TLS_UV_H

#include "relay/link/tls.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define TR_TLS_UV_HANDSHAKE_TIMEOUT_MS 10000
/* Client: from its connect to the server's first handshake bytes. */
#define TR_TLS_UV_START_TIMEOUT_MS 60000
/* Server: the longest a connection waits for a handshake slot (half the client's start
 * timeout: the client is still waiting when the server takes it or refuses it). */
#define TR_TLS_UV_ADMISSION_WAIT_MS 30000
/* Server: connections waiting for a handshake slot at most; beyond, refused at once. */
#define TR_TLS_UV_MAX_WAITING 4096
#define TR_TLS_UV_MAX_QUEUED (4u << 20)
/* Handshakes a server runs at once: their steps share libuv's 4 worker threads, so more at once
 * raise no throughput, only the time each of its steps waits, which the peer's deadline counts.
 * At 128, ten regionals and a root at a load of 90 on 2 CPUs ran out the 10 s of thousands of
 * handshakes they had begun (bench/README.md, bench_tiers); 32, eight per worker, keep the
 * workers busy while most of them wait for their client's answer. */
#define TR_TLS_UV_MAX_HANDSHAKES 32
/* Server: handshakes one source address runs at once; its further connections wait while other
 * addresses' are admitted first. One address holding every slot with connections that say
 * nothing kept every agent out until its handshake deadlines ran out (issue 39). 4: a regional
 * needs one (its hosts share its carrier link); agents behind one NAT still pass 4 at a time. */
#define TR_TLS_UV_MAX_HANDSHAKES_PER_SOURCE 4
/* Server: connections one source address may have waiting for a slot; beyond, refused at once
 * (TR_ERR_BUSY, counted as refused_source), so one address cannot fill the waiting list.
 * Agents behind one NAT address need more in a storm (tracerelay-service
 * --max-waiting-per-source): 1,000 of them at once on one address saw 868 refused. */
#define TR_TLS_UV_MAX_WAITING_PER_SOURCE 128
/* How long a closing connection may take to send what is queued and its close_notify. */
#define TR_TLS_UV_CLOSE_LINGER_MS 2000

typedef struct tr_tls_uv_conn tr_tls_uv_conn;
typedef struct tr_tls_uv_server tr_tls_uv_server;

struct tr_tls_uv_callbacks {
  /* The handshake is done: the connection may write, and the peer's name is known. */
  void (*on_connect)(tr_tls_uv_conn *conn);
  /* Decrypted bytes, valid during the call only. */
  void (*on_read)(tr_tls_uv_conn *conn, const void *data, size_t len);
  /* The write queue fell to half of max_queued after having been above it (optional). */
  void (*on_drain)(tr_tls_uv_conn *conn);
  /* The connection is gone. reason: 0 after tr_tls_uv_close, TR_ERR_CLOSED when the peer
   * closed, TR_ERR_TLS, TR_ERR_TIMEOUT or a TR_ERR_SYS code; why says it in words
   * (the peer address is in tr_tls_uv_peer_address). */
  void (*on_close)(tr_tls_uv_conn *conn, int reason, const char *why);
};

struct tr_tls_uv_options {
  /* The handshake itself: a server's from when it starts it, a client's from the server's
   * first handshake bytes. 0: TR_TLS_UV_HANDSHAKE_TIMEOUT_MS */
  unsigned handshake_timeout_ms;
  unsigned start_timeout_ms;  /* client: connect to the server's first bytes; 0: the default */
  unsigned admission_wait_ms; /* server: longest wait for a handshake slot; 0: the default */
  size_t max_queued;          /* bytes of ciphertext queued per connection; 0: default */
  unsigned max_handshakes;    /* server: handshakes in progress at once, more wait; 0: default */
  /* server: ... of them from one source address; 0: TR_TLS_UV_MAX_HANDSHAKES_PER_SOURCE */
  unsigned max_handshakes_per_source;
  /* server: connections one source address may have waiting for a slot, besides its
   * handshakes; one more is refused (refused_source). 0: TR_TLS_UV_MAX_WAITING_PER_SOURCE;
   * more than max_waiting changes nothing (that bound comes first). */
  unsigned max_waiting_per_source;
  /* Tests only: each handshake step sleeps this long on its worker first, as on a machine
   * too busy to run it (test_tls_uv's storm). 0 in every daemon. */
  unsigned test_step_delay_ms;
};

/* Listens on addr (port 0 picks one, see tr_tls_uv_server_port) with a server config, which
 * it references. data is the initial user pointer of every accepted connection. Returns 0,
 * TR_ERR_INVAL, TR_ERR_NOMEM or the libuv error as TR_ERR_SYS (e.g. address in use); after a
 * libuv error the loop frees the half-made server on its next run. */
int tr_tls_uv_listen(uv_loop_t *loop, tr_tls_config *cfg, const struct sockaddr *addr,
                     const struct tr_tls_uv_options *opts, const struct tr_tls_uv_callbacks *cbs,
                     void *data, tr_tls_uv_server **out);
/* The port the server listens on, or a negative code. */
int tr_tls_uv_server_port(const tr_tls_uv_server *srv);
/* Uses cfg (referenced) for connections accepted from now on, e.g. after SIGHUP reloaded the
 * certificates; connections already accepted keep their config. */
void tr_tls_uv_server_set_config(tr_tls_uv_server *srv, tr_tls_config *cfg);
/* What a server's handshakes cost and how they ended, for metrics and tests. */
struct tr_tls_uv_server_stats {
  uint64_t refused;          /* connections dropped before their handshake finished */
  uint64_t refused_busy;     /* ... of them: no handshake slot within admission_wait_ms */
  uint64_t refused_source;   /* ... of them: its address had max_waiting_per_source waiting */
  uint64_t abandoned;        /* handshakes begun here that the peer left or let time out */
  uint64_t steps_on_loop;    /* handshake steps (mbedTLS handshake calls) run on the loop's thread */
  uint64_t steps_on_workers; /* ... run on worker threads */
};
void tr_tls_uv_server_stats(const tr_tls_uv_server *srv, struct tr_tls_uv_server_stats *out);
/* Stops listening and drops connections still in their handshake; the server is freed once
 * its handles are closed. Connections given to the application stay open. */
void tr_tls_uv_server_close(tr_tls_uv_server *srv);

/* Connects to addr and runs the handshake against server_name (the name the service
 * certificate must carry); the start timeout covers the TCP connect and the wait for the
 * server to begin, the handshake timeout the rest. Every outcome is reported through cbs:
 * on_connect, or on_close with the reason (connection refused, certificate refused, a
 * deadline, TR_ERR_BUSY: the server closed before its handshake began). Returns 0 (conn is
 * valid until on_close), TR_ERR_INVAL or TR_ERR_NOMEM (no callback then). */
int tr_tls_uv_connect(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                      const struct sockaddr *addr, const struct tr_tls_uv_options *opts,
                      const struct tr_tls_uv_callbacks *cbs, void *data, tr_tls_uv_conn **out);

/* Sends len bytes, encrypted in records of up to TR_TLS_RECORD_PLAINTEXT bytes (write in
 * batches of that size for the least overhead): what the kernel does not take at once is
 * queued. The whole buffer is taken or none of it.
 * Returns the ciphertext bytes now queued (>= 0), TR_ERR_FULL if the queue is already at
 * max_queued (wait for on_drain), TR_ERR_STATE before on_connect, TR_ERR_CLOSED once closing. */
int tr_tls_uv_write(tr_tls_uv_conn *conn, const void *data, size_t len);
/* Stops reading: no on_read until tr_tls_uv_resume_read, and nothing more is read from the
 * socket, so TCP flow control holds the peer back instead of our memory. Safe inside on_read:
 * the rest of what was already read (at most one socket read of ciphertext, and records the
 * session decrypted but did not deliver) is held in the connection's own buffers, in order.
 * A paused connection notices neither data nor the peer closing until it resumes. Returns 0,
 * TR_ERR_STATE before on_connect, TR_ERR_CLOSED once closing. */
int tr_tls_uv_pause_read(tr_tls_uv_conn *conn);
/* Reads again: what was held is delivered first, from the loop (never from inside this call),
 * then the socket is read. on_read may pause again on the way. Returns 0 (also when not
 * paused) or TR_ERR_CLOSED once closing. */
int tr_tls_uv_resume_read(tr_tls_uv_conn *conn);
bool tr_tls_uv_read_is_paused(const tr_tls_uv_conn *conn);
/* Bytes received from the peer (ciphertext, the handshake included). */
uint64_t tr_tls_uv_bytes_in(const tr_tls_uv_conn *conn);
/* Ciphertext bytes handed to libuv and not yet written to the socket. */
size_t tr_tls_uv_queued(const tr_tls_uv_conn *conn);

/* Clock-probe timestamps, on BOOTTIME as relay/clock/clock.h reads it (the simulated clock included),
 * taken as close to the socket as the event loop allows and with the encryption outside:
 *
 * tr_tls_uv_write_stamped: tr_tls_uv_write for a small message whose send time matters; the
 * kernel stamps the moment its last byte leaves for the device driver, after any queueing
 * discipline (relay/link/sock_stamp.h), which only a write of its own can ask for. It encrypts
 * first; then, if libuv holds no earlier write, it hands the ciphertext to the kernel at once,
 * else it holds it until libuv's earlier writes have reached the kernel, and the writes that
 * follow wait behind it (so a saturated link delays the message but not its stamp); a message
 * that did not leave at once (held, or queued in the kernel) keeps them back until its stamp is
 * in (or tr_tls_uv_sent_time is asked for it): with data appended behind it in the kernel's
 * queue, its stamp came up to 20 ms late. *sent_ns
 * names the message (the clock when it was written). While another stamped write is held, or
 * for an empty one, it is an ordinary write and *sent_ns = 0. Returns as tr_tls_uv_write.
 *
 * tr_tls_uv_sent_time: for the sent_ns of the last write_stamped call, the kernel's own send
 * stamp of those bytes once it has arrived; until then, or without one (the kernel took the
 * bytes in parts), the clock read right before they went to the kernel; sent_ns itself while
 * they are held, and for any other value.
 * tr_tls_uv_sent_time_pending: true while the message named sent_ns is held or its kernel stamp
 * may still come (ask again later for the exact time).
 *
 * tr_tls_uv_read_time: inside on_read, the time the newest bytes of the socket read that
 * completed the bytes being delivered reached the socket, before they were decrypted (for bytes
 * held over a pause, that of the read that brought them): the kernel's receive stamp
 * (SO_TIMESTAMPNS, converted from REALTIME to BOOTTIME at the read) when it has one, else the
 * clock read when the read returned. Either way never earlier than the bytes reached this host's
 * socket, and free of this process's wake-up latency when stamped.
 * tr_tls_uv_read_time_checked: the same, unless TCP received segments out of order since the
 * last tr_tls_uv_mark_order (relay/link/sock_stamp.h, tr_sock_stamp_reordered): then the clock when
 * that read returned, since the stamp may be early. Mark when the message awaited is sent for
 * (a probe leaves), so that bytes held in TCP's out-of-order queue over many reads are caught;
 * with mark, the check also marks (where every read may carry a probe: one call for both).
 * One getsockopt per call: for reads that may carry a probe, not for every read of a busy link. */
int tr_tls_uv_write_stamped(tr_tls_uv_conn *conn, const void *data, size_t len, int64_t *sent_ns);
int64_t tr_tls_uv_sent_time(tr_tls_uv_conn *conn, int64_t sent_ns);
bool tr_tls_uv_sent_time_pending(tr_tls_uv_conn *conn, int64_t sent_ns);
int64_t tr_tls_uv_read_time(const tr_tls_uv_conn *conn);
int64_t tr_tls_uv_read_time_checked(tr_tls_uv_conn *conn, bool mark);
void tr_tls_uv_mark_order(tr_tls_uv_conn *conn);
/* Closes gracefully: queued bytes and a close_notify are sent (for at most
 * TR_TLS_UV_CLOSE_LINGER_MS), then on_close(conn, 0, ...) runs. Safe to call from any
 * callback and more than once. */
void tr_tls_uv_close(tr_tls_uv_conn *conn);

/* The peer's machine name (server side) or the service's certificate name (client side);
 * NULL before on_connect. */
const char *tr_tls_uv_peer_name(const tr_tls_uv_conn *conn);
/* The TLS session once established (its peer's certificate: tr_tls_peer_refusal,
 * tr_tls_peer_expiry), else NULL; the loop's thread only. */
const tr_tls_session *tr_tls_uv_session(const tr_tls_uv_conn *conn);
/* "address:port" of the peer, for log lines. */
const char *tr_tls_uv_peer_address(const tr_tls_uv_conn *conn);
/* The negotiated ciphersuite, or NULL before on_connect. */
const char *tr_tls_uv_ciphersuite(const tr_tls_uv_conn *conn);
void *tr_tls_uv_get_data(const tr_tls_uv_conn *conn);
/* The loop conn runs on. */
uv_loop_t *tr_tls_uv_loop(const tr_tls_uv_conn *conn);
void tr_tls_uv_set_data(tr_tls_uv_conn *conn, void *data);

#endif
