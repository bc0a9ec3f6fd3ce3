/* relay_link.h: one relay link connection, the core both ends share (agent/link_client.c,
 * service/link_server.c) as libuv's tcp.c shares stream.c: RelayFrames over a tr_tls_uv
 * connection, from the handshake to the one close path. The ends keep only the meaning of the
 * frames (Hello and Welcome, batches, commands, clock probes) and their own timers.
 *
 * Guarantees:
 * - Frames in: the plaintext is cut into frames (relay/base/frame_reader.h) and each decoded frame
 *   goes to on_frame, in order. A frame longer than the reader allows, or one that does not
 *   decode to a known message, is a protocol error: the link closes with Goodbye
 *   REASON_PROTOCOL_ERROR saying what was wrong, and no further frame is delivered.
 * - Frames out: tr_relay_link_send* encode (at most the peer's max frame, once
 *   tr_relay_link_established said it) and queue. A full queue means the peer stopped reading:
 *   the link closes with Goodbye REASON_OVERLOADED. After the close began, sends return
 *   TR_ERR_CLOSED.
 * - Heartbeats (docs/relay-protocol.md): any bytes read prove the peer alive; the end's timer
 *   calls tr_relay_link_check_alive, which closes a link silent for the timeout, and
 *   tr_relay_link_keep_alive, which sends a Heartbeat once nothing was sent for the interval
 *   (only after tr_relay_link_established: nothing may precede Hello and Welcome).
 * - Backpressure (opts.pause_read_above, the service's end): once more than that many bytes of
 *   ours wait to be sent, the peer's socket is no longer read (tr_tls_uv_pause_read) and no
 *   frame is delivered; the rest of the read being processed is held (at most
 *   TR_RELAY_LINK_STASH_MAX bytes, else the link closes as overloaded). When the queue drains
 *   the held frames go to on_frame and reading resumes. A paused link silent for the timeout
 *   closes as overloaded: it is we who stopped reading, because the peer did.
 * - One close path: tr_relay_link_close (an optional Goodbye {reason, text}, a log line, then
 *   the TLS close), reached by the end, by a protocol error, a full queue or a silent peer.
 *   on_closing runs once when the close begins (also when the transport ended the link), and
 *   on_closed once at the very end, for every link, also one whose connection never came up;
 *   the link is freed right after it.
 * Everything runs on the loop's thread. Memory per link: the transport's (tls_uv.h), one
 * frame reader (at most one maximal frame), and the stash while paused. */
#ifndef TR_RELAY_LINK_H
#define TR_RELAY_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "relay/link/relay_frame.h"
#include "relay/link/tls_uv.h"

#define TR_RELAY_LINK_STASH_MAX (8u << 20)

typedef struct tr_relay_link tr_relay_link;
typedef struct tr_relay_link_listener tr_relay_link_listener;

/* What a link tells its end. Only on_frame and on_closed are required. */
struct tr_relay_link_events {
  /* The TLS handshake is done: the link may send (Hello), and the peer's name is known. An
   * accepted link starts with the listener's data; the end usually sets its own here. */
  void (*on_open)(tr_relay_link *l);
  /* A socket read arrived, before any of its frames: its stamps (tr_tls_uv_read_time and
   * tr_tls_uv_read_time_checked on tr_relay_link_conn) can be taken now, and only now. */
  void (*on_read)(tr_relay_link *l);
  /* One frame, in order; the end owns it (tr_relay_frame_free). */
  void (*on_frame)(tr_relay_link *l, Tracerelay__RelayFrame *f);
  /* The frames of a read (or of the rest held while paused) were delivered and the link is
   * still up: the place to answer a burst at once (the service's BatchAck). */
  void (*on_read_done)(tr_relay_link *l);
  /* The write queue fell to half its bound: more may be sent. */
  void (*on_drain)(tr_relay_link *l);
  /* The link began to close: nothing more can be sent; stop scheduling work for it. */
  void (*on_closing)(tr_relay_link *l);
  /* The link is gone, as tls_uv's on_close says (reason 0: closed by this side); l is freed
   * when this returns. */
  void (*on_closed)(tr_relay_link *l, int reason, const char *why);
};

struct tr_relay_link_opts {
  struct tr_tls_uv_options tls;
  uint64_t heartbeat_interval_ms, heartbeat_timeout_ms; /* 0: the relay defaults */
  /* Bytes of ours queued above which the peer's socket is not read; 0: always read. */
  size_t pause_read_above;
  /* Who the peer is, in messages: "agent" or "service"; NULL: "peer". */
  const char *peer_role;
  /* How log lines name the link, e.g. "the link to relay.example:7393"; NULL: "the link of
   * NAME (ADDRESS)", from the peer's certificate name and address. Copied. */
  const char *label;
};

/* Connects to addr and runs the handshake against server_name (tr_tls_uv_connect). Every
 * outcome is reported through ev: on_open, or on_closed. Returns 0 (*out is valid until
 * on_closed), or TR_ERR_INVAL / TR_ERR_NOMEM with no callback. */
int tr_relay_link_connect(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                          const struct sockaddr *addr, const struct tr_relay_link_opts *opts,
                          const struct tr_relay_link_events *ev, void *data,
                          tr_relay_link **out);

/* Listens on addr (tr_tls_uv_listen): every connection that passes the handshake becomes a
 * link made with opts and ev, starting with data, and is shown to on_open. Returns as
 * tr_tls_uv_listen. */
int tr_relay_link_listen(uv_loop_t *loop, tr_tls_config *cfg, const struct sockaddr *addr,
                         const struct tr_relay_link_opts *opts,
                         const struct tr_relay_link_events *ev, void *data,
                         tr_relay_link_listener **out);
int tr_relay_link_listener_port(const tr_relay_link_listener *ls);
/* A listen address as the daemons' --listen takes it: "ADDR:PORT", "[V6]:PORT", "ADDR" or a
 * bare IPv6 address (relay/base/hostport.h), numeric. 0, or TR_ERR_CONFIG. */
int tr_relay_link_listen_addr(const char *s, struct sockaddr_storage *out);
/* Uses cfg (referenced) for connections accepted from now on. */
void tr_relay_link_listener_set_config(tr_relay_link_listener *ls, tr_tls_config *cfg);
/* Its TLS server's figures (tr_tls_uv_server_stats). */
void tr_relay_link_listener_stats(const tr_relay_link_listener *ls,
                                  struct tr_tls_uv_server_stats *out);
/* Stops listening and frees ls; links already open stay open. */
void tr_relay_link_listener_close(tr_relay_link_listener *ls);

/* The handshake of the protocol is done (Welcome sent or received): heartbeats may go, and
 * frames may be as long as max_out, the largest the peer accepts. */
void tr_relay_link_established(tr_relay_link *l, size_t max_out);

/* Encodes f and queues it. Returns 0, TR_ERR_CLOSED once closing, TR_ERR_FULL (the link is
 * closing then, as overloaded), or TR_ERR_TOO_BIG / TR_ERR_NOMEM from the encoder. */
int tr_relay_link_send(tr_relay_link *l, const Tracerelay__RelayFrame *f);
/* The same, for a frame whose send time matters: *sent_ns as tr_tls_uv_write_stamped. */
int tr_relay_link_send_stamped(tr_relay_link *l, const Tracerelay__RelayFrame *f,
                               int64_t *sent_ns);
/* Queues a frame already encoded (header included), as tr_relay_link_send. */
int tr_relay_link_send_encoded(tr_relay_link *l, const uint8_t *frame, size_t len);
/* Sends a Heartbeat now; at_once: as a stamped write, straight to the socket if nothing of
 * ours waits (it warms the kernel's path for a clock probe right behind it). */
int tr_relay_link_send_heartbeat(tr_relay_link *l, bool at_once);

/* Closes l if nothing was heard for the heartbeat timeout. False once l is closing. */
bool tr_relay_link_check_alive(tr_relay_link *l, uint64_t now_ns);
/* Sends a Heartbeat if l is established and nothing was sent for the interval. */
void tr_relay_link_keep_alive(tr_relay_link *l, uint64_t now_ns);

/* The one close path. Unless reason is REASON_UNSPECIFIED a Goodbye {reason, text} goes
 * first; unless it is REASON_SHUTDOWN "closing <label>: <text>" is logged as a warning. Then
 * the transport closes (queued bytes still go out). Once only: later calls do nothing. */
void tr_relay_link_close(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *fmt,
                         ...) __attribute__((format(printf, 3, 4)));
/* tr_relay_link_close with REASON_PROTOCOL_ERROR and "protocol error: <text>". */
void tr_relay_link_protocol_error(tr_relay_link *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Closes without a word: the peer said Goodbye. */
void tr_relay_link_hang_up(tr_relay_link *l);

bool tr_relay_link_closing(const tr_relay_link *l);
/* Nothing of ours waits to be sent and reading is not held back: a frame sent now leaves at
 * once (what a clock probe needs). */
bool tr_relay_link_idle(const tr_relay_link *l);
/* The end holds the peer's frames back, as the backpressure above does for our own queue
 * (a regional whose upstream link is backed up): the socket is not read, the rest of the read
 * being processed is stashed, until tr_relay_link_release_input delivers it and reads again
 * (frames may reach on_frame from inside that call). A held link silent for the heartbeat
 * timeout closes as overloaded. */
void tr_relay_link_hold_input(tr_relay_link *l);
void tr_relay_link_release_input(tr_relay_link *l);
bool tr_relay_link_input_held(const tr_relay_link *l);
/* Sends a ClockProbe {probe_id, t1} the way a probe must go (relay/clock/clock_probe.h): only when
 * l is idle (else TR_ERR_AGAIN: one queued behind other frames would measure the queue),
 * right behind a heartbeat that warms the kernel's path, with the reordering mark for its
 * answer's receive stamp (tr_tls_uv_mark_order). *t1: the kernel's send stamp when there is
 * one, else the reading taken just before the write (a valid bound either way). 0, TR_ERR_AGAIN,
 * TR_ERR_CLOSED or a send error. */
int tr_relay_link_send_clock_probe(tr_relay_link *l, uint64_t probe_id, int64_t *t1);
/* ---- carriers (tiers: docs/relay-protocol.md#multiplexing) ----
 * A carrier is a link that also carries other links, one per slot: their frames ride on it
 * marked with their slot (RelayFrame.slot), and everything written to the carrier in one turn
 * of the loop (or, with a linger, in several) goes out as one write. A carried link is used
 * through this same API, except:
 * - its connection (tr_relay_link_conn) is its carrier's, and so are its queue
 *   (tr_relay_link_queued, _idle) and its backpressure: hold_input does nothing, and the end
 *   hears on_drain when the carrier's queue drains;
 * - it has no heartbeats of its own (check_alive is true while it is open, keep_alive sends
 *   nothing: the carrier's prove both ends alive), no on_read and no send stamps (clock
 *   probes and send_encoded return TR_ERR_UNSUPPORTED);
 * - closing it ends its slot for the peer: a Goodbye on the slot, without a reason unless one
 *   was given; the peer's Goodbye ends it likewise (one with a reason reaches on_frame first);
 *   on_closed comes in the loop's next turn (reason 0: ended here; TR_ERR_CLOSED: by the peer);
 * - when the carrier ends, every link it carries hears on_closed first, with its reason.
 * A frame for a slot that ended, or for one this side does not know, is dropped and counted. */

/* Makes l a carrier. accept_ev: the events of the links the peer opens (its first frame on a
 * slot numbered above every slot before), shown to accept_ev->on_open with data as accepted
 * links are; NULL: the peer opens none. At most max_slots carried at once (more from the peer
 * is a protocol error). 0, TR_ERR_STATE (already one, or carried) or TR_ERR_NOMEM. */
int tr_relay_link_carry(tr_relay_link *l, const struct tr_relay_link_events *accept_ev,
                        void *data, unsigned max_slots);
/* Opens a link in carrier l's next slot: it is open and established (its frames may be as long
 * as the carrier's less a slot's room, until tr_relay_link_established says); *out is set, then
 * ev->on_open runs, before this returns. 0, TR_ERR_STATE (l carries nothing), TR_ERR_CLOSED,
 * TR_ERR_FULL (max_slots open, or the highest slot number taken) or TR_ERR_NOMEM. */
int tr_relay_link_open_slot(tr_relay_link *l, const struct tr_relay_link_events *ev, void *data,
                            tr_relay_link **out);
/* What carrier l gathers may wait up to ms after its first byte for later turns' (0, the
 * default: it goes at the end of the loop's turn); 256 KiB gathered, a stamped send, a Goodbye
 * or a close send it at once. For a regional's carrier: its upstream wakes once for many of
 * its turns. Does nothing if l carries nothing. */
void tr_relay_carrier_set_linger(tr_relay_link *l, unsigned ms);
bool tr_relay_link_carried(const tr_relay_link *l);
struct tr_relay_carrier_stats {
  unsigned carried;        /* links open on it now */
  uint64_t dropped_frames; /* for slots that ended or were never opened */
  uint64_t frames_out;     /* frames written, its own and its links' */
  uint64_t writes;         /* writes to the connection they went out in */
};
/* Of l as a carrier (all 0 if it never carried), also from its on_closed (carried 0 then). */
void tr_relay_link_carrier_stats(const tr_relay_link *l, struct tr_relay_carrier_stats *out);
/* Bytes received: a carried link's frames; any other link's connection (tls_uv). */
uint64_t tr_relay_link_bytes_in(const tr_relay_link *l);

/* Ciphertext bytes of ours not yet written to the socket. */
size_t tr_relay_link_queued(const tr_relay_link *l);
/* The largest frame we accept, for Hello and Welcome's max_frame_bytes. */
size_t tr_relay_link_max_in(const tr_relay_link *l);
/* The transport, for its names and clock-probe stamps (tls_uv.h). */
tr_tls_uv_conn *tr_relay_link_conn(const tr_relay_link *l);
void *tr_relay_link_data(const tr_relay_link *l);
void tr_relay_link_set_data(tr_relay_link *l, void *data);

#endif
