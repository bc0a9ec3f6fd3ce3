/* ipc_host.h: a Perfetto IPC host (reference sections 1.3-1.5) on a libuv loop.
 *
 * Listens on an AF_UNIX SOCK_STREAM path (or, for a relay endpoint, on TCP or vsock: see
 * tr_ipc_host_start_net), accepts connections, and speaks the IPCFrame
 * protocol: BindService by name, InvokeMethod dispatched to a per-service method table,
 * replies (streamed with has_more), fds passed with SCM_RIGHTS. It knows frames and methods,
 * not tracing: the ProducerPort and ConsumerPort are method tables built on top.
 *
 * Guarantees, per connection: on AF_UNIX the kernel's SO_PEERCRED is the peer's identity
 * (SetPeerIdentity is accepted and ignored); on TCP/vsock there is no kernel identity, so the
 * service hears, through on_identity and before any other frame, the SetPeerIdentity the
 * connection opened with (or that it opened without one), first one only, as traced does; at most one maximal frame is buffered for reading, at most
 * max_out_bytes are queued for writing (over it the connection is dropped), at most one
 * received fd is held; a bounded number of frames is handled per loop turn, so one client
 * cannot starve the others. A misbehaving peer loses only its own connection.
 * Slow and idle peers are timed out: a connection that has bound no service within
 * bind_timeout_ms, or that leaves a frame unfinished for stall_timeout_ms, is closed; at most
 * max_pending requests may await their final reply at once (more closes the connection).
 *
 * Lifecycle, libuv style: tr_ipc_host_init, tr_ipc_host_start, tr_ipc_host_close with a
 * callback after which the caller may free the host. Connections are owned by the host;
 * on_disconnect runs once for every accepted connection, from the loop (never inside the
 * call that closed it), and the connection is freed right after it returns. */
#ifndef TR_IPC_HOST_H
#define TR_IPC_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "perfetto/ipc/wire_protocol.pb-c.h"

#define TR_IPC_DEFAULT_MAX_OUT (8u << 20)
#define TR_IPC_DEFAULT_MAX_CONNS 1024u
#define TR_IPC_DEFAULT_BIND_TIMEOUT_MS 30000u
#define TR_IPC_DEFAULT_STALL_TIMEOUT_MS 30000u
#define TR_IPC_DEFAULT_MAX_PENDING 64u

typedef struct tr_ipc_host tr_ipc_host;
typedef struct tr_ipc_conn tr_ipc_conn;

/* Why a connection ended. The first two are no fault of the peer's; the others are the host's
 * (or, with tr_ipc_conn_close, its service's) decision about a peer that misbehaved or could
 * not keep up. The values are also the agent's stats' (protos/tracerelay/relay.proto,
 * ProducerClose): keep them as they are and add new ones before TR_IPC_CLOSE_REASONS. */
enum tr_ipc_close {
  TR_IPC_CLOSE_PEER = 0,          /* the peer closed it, or the socket failed */
  TR_IPC_CLOSE_HOST = 1,          /* the host is closing, or its service refused the peer */
  TR_IPC_CLOSE_STALLED = 2,       /* a frame left unfinished for stall_timeout_ms */
  TR_IPC_CLOSE_IDLE = 3,          /* no service bound within bind_timeout_ms */
  TR_IPC_CLOSE_NOT_READING = 4,   /* its output queue went over max_out_bytes */
  TR_IPC_CLOSE_TOO_MANY_REQUESTS = 5, /* more than max_pending requests awaiting a reply */
  TR_IPC_CLOSE_PROTOCOL = 6,      /* a frame over the size limit, too many fds */
  TR_IPC_CLOSE_VIOLATIONS = 7,    /* its service's decision: too many ABI violations */
  TR_IPC_CLOSE_RESOURCES = 8,     /* out of memory, a poll that could not start */
  TR_IPC_CLOSE_REASONS            /* how many there are */
};

/* Handles one InvokeMethod. args are the serialised request (valid only during the call;
 * the handler decodes them and answers with tr_ipc_conn_reply, now or later; undecodable
 * args deserve a failure reply). A successful reply to a drop_reply call made during the
 * call is not sent; a handler that answers drop_reply calls later must skip successes
 * itself. */
typedef void (*tr_ipc_method_fn)(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                 size_t args_len, bool drop_reply);

/* Method ids are 1-based positions in the table. A NULL fn keeps its id but is left out of
 * BindServiceReply, so Perfetto clients fail that call locally (reference 1.4). */
typedef struct tr_ipc_method {
  const char *name;
  tr_ipc_method_fn fn;
} tr_ipc_method;

typedef struct tr_ipc_service {
  const char *name; /* bare proto name: "ProducerPort" */
  const tr_ipc_method *methods;
  size_t num_methods;
} tr_ipc_service;

typedef struct tr_ipc_peer {
  uid_t uid;
  gid_t gid;
  pid_t pid;
} tr_ipc_peer;

typedef void (*tr_ipc_conn_cb)(tr_ipc_conn *conn);
typedef void (*tr_ipc_host_close_cb)(tr_ipc_host *host);

typedef struct tr_ipc_host_config {
  const char *name;                /* for log lines: "producer socket" */
  const tr_ipc_service *services;  /* service id = index + 1; must outlive the host */
  size_t num_services;
  /* Optional. A negative return refuses the connection (then no on_disconnect). */
  int (*on_connect)(tr_ipc_conn *conn);
  tr_ipc_conn_cb on_disconnect;    /* optional */
  /* Network listeners only (tr_ipc_host_start_net), required there: called once per
   * connection before its first frame is handled, with the SetPeerIdentity that frame was, or
   * NULL if it was something else (then handled as usual). Valid during the call only; the
   * claims in it are the peer's word, untrusted. */
  void (*on_identity)(tr_ipc_conn *conn, const Perfetto__Protos__IPCFrame__SetPeerIdentity *id);
  size_t max_out_bytes;            /* 0: TR_IPC_DEFAULT_MAX_OUT */
  size_t max_conns;                /* 0: TR_IPC_DEFAULT_MAX_CONNS; more are refused */
  const char *max_conns_flag;      /* optional: the option that sets it, for the refusal's log */
  /* 0: the TR_IPC_DEFAULT_* values. A request awaits its final reply (has_more false) unless
   * it was sent with drop_reply. */
  unsigned bind_timeout_ms;        /* no BindService by then: closed */
  unsigned stall_timeout_ms;       /* a partly received frame not completed by then: closed */
  size_t max_pending;              /* requests awaiting their final reply, per connection */
  /* Optional: the clock of both deadlines, in ms, never going back; NULL: uv_now(). Tests give
   * their own, to put a frame's arrival and a deadline check in the same millisecond. */
  uint64_t (*now_ms)(tr_ipc_host *host);
} tr_ipc_host_config;

/* Caller-allocated like a uv handle; fields other than `data` are private. */
struct tr_ipc_host {
  void *data;
  uv_loop_t *loop;
  tr_ipc_host_config cfg;
  uv_poll_t listen_poll;
  uv_idle_t backlog_idle;
  uv_timer_t timeout_timer; /* bind and stall deadlines of every connection */
  int listen_fd;
  char path[108];
  dev_t path_dev;
  ino_t path_ino;
  tr_ipc_conn *conns;
  size_t num_conns;
  unsigned handles_closing;
  bool listening;
  bool net; /* a TCP or vsock listener: peers have no SO_PEERCRED */
  bool closing;
  tr_ipc_host_close_cb close_cb;
};

/* Prepares the host; no socket yet. Returns 0 or TR_ERR_INVAL / a libuv failure. Once it
 * succeeded, tr_ipc_host_close must be called, whether tr_ipc_host_start succeeds or not. */
int tr_ipc_host_init(tr_ipc_host *host, uv_loop_t *loop, const tr_ipc_host_config *cfg);
/* Binds `path`, chmods it to `mode` and listens (in that order, so no client can connect
 * while the default mode is on it). A stale socket file is replaced; a live one (someone
 * accepts) gives TR_ERR_SYS(EADDRINUSE), a non-socket file TR_ERR_SYS(EEXIST). */
int tr_ipc_host_start(tr_ipc_host *host, const char *path, mode_t mode);
/* Listens on "HOST:PORT" / "[V6]:PORT" (TCP) or "vsock://CID:PORT" (CID -1: any) instead of a
 * path, for Perfetto's traced_relay, which speaks the same frames over the network with no
 * fds (reference 4.7). Peers are anonymous: tr_ipc_conn_peer gives uid, gid and pid 0 and
 * tr_ipc_conn_peer_addr the address. TR_ERR_CONFIG for an address that does not parse, else
 * as tr_ipc_host_start. */
int tr_ipc_host_start_net(tr_ipc_host *host, const char *addr);
/* The port a network listener is bound to (port 0 in addr picks one), or TR_ERR_STATE. */
int tr_ipc_host_net_port(const tr_ipc_host *host);
/* Closes every connection and the listener, unlinks the socket path if it is still ours,
 * and calls cb (may be NULL) from the loop once nothing refers to the host any more. */
void tr_ipc_host_close(tr_ipc_host *host, tr_ipc_host_close_cb cb);

/* Sends an InvokeMethodReply. success=true carries reply (may be empty); a failure carries
 * neither success nor reply, as traced does. fd >= 0 is duplicated and passed with the
 * frame (the caller keeps its own). Returns 0, TR_ERR_TOO_BIG if the frame would exceed
 * the IPC limit (nothing sent), TR_ERR_CLOSED once the connection is closing, or
 * TR_ERR_FULL when the output cap was hit (the connection is then being closed). */
int tr_ipc_conn_reply(tr_ipc_conn *conn, uint64_t request_id, bool success, bool has_more,
                      const uint8_t *reply, size_t reply_len, int fd);
/* The last fd received on this connection, now owned by the caller; -1 if none. */
int tr_ipc_conn_take_fd(tr_ipc_conn *conn);
/* Logs the reason and closes this connection only; on_disconnect follows from the loop, and
 * tr_ipc_conn_close_why then gives `why` (the first close of a connection decides it). Safe to
 * call more than once and from inside a method handler. */
void tr_ipc_conn_close(tr_ipc_conn *conn, enum tr_ipc_close why, const char *reason);
/* Why the connection was closed; meaningful once it is closing (in on_disconnect). */
enum tr_ipc_close tr_ipc_conn_close_why(const tr_ipc_conn *conn);
/* A short phrase for a reason ("stalled client"), for logs and stats; "unknown reason" for a
 * value out of range (stats from a newer agent). */
const char *tr_ipc_close_name(enum tr_ipc_close why);
/* Bytes queued for this connection and not yet accepted by the kernel. */
size_t tr_ipc_conn_out_bytes(const tr_ipc_conn *conn);
/* Calls cb once, from the loop, when the output queue is empty and the socket writable:
 * a streaming reply (ReadBuffers) waits here instead of queueing without bound. A second
 * call replaces the callback; NULL cancels it. */
void tr_ipc_conn_on_drain(tr_ipc_conn *conn, tr_ipc_conn_cb cb);
tr_ipc_peer tr_ipc_conn_peer(const tr_ipc_conn *conn);
/* A network peer's address without its port ("10.0.0.2", "vsock:3"); "" on AF_UNIX. */
const char *tr_ipc_conn_peer_addr(const tr_ipc_conn *conn);
/* The peer's supplementary groups as the kernel recorded them at connect (SO_PEERGROUPS):
 * the count, or a negative code (TR_ERR_SYS(ERANGE) when there are more than cap). */
int tr_ipc_conn_peer_groups(const tr_ipc_conn *conn, gid_t *groups, size_t cap);
tr_ipc_host *tr_ipc_conn_host(const tr_ipc_conn *conn);
void tr_ipc_conn_set_data(tr_ipc_conn *conn, void *data);
void *tr_ipc_conn_data(const tr_ipc_conn *conn);

#endif
