/* ipc_host.c: the Perfetto IPC host behind ipc_host.h.
 *
 * libuv pipes cannot pass arbitrary fds, so each connection is a raw non-blocking AF_UNIX
 * socket watched by a uv_poll_t and read with recvmsg / written with sendmsg. Every way a
 * connection ends goes through close_conn(): it marks the connection closing and closes
 * its poll handle; the close callback runs on_disconnect and frees. Until then the memory
 * stays valid, so a handler on the stack may still call into a closing connection (its
 * calls return TR_ERR_CLOSED).
 *
 * Fairness: a poll callback handles at most FRAMES_PER_TURN frames and does at most one
 * recvmsg. Frames left in the reader wait for the idle handle, which keeps the loop from
 * blocking while any connection has a backlog (it scans the connections: O(connections)
 * per turn while that lasts).
 *
 * Deadlines: one timer per host checks every connection (O(connections) per tick, a tick
 * being a quarter of the shorter timeout, at most a second): the bind deadline runs from
 * accept to the first successful BindService, the stall deadline from the moment a frame is
 * partly buffered until it is whole. Pending requests are tracked by id in a fixed array.
 *
 * Network listeners (traced_relay's endpoint) use the same connection code: recvmsg and
 * sendmsg work on TCP and vsock sockets too, and no fd ever arrives there. */
#include "relay/producer/ipc_host.h"

#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "relay/producer/ipc_frame.h"
#include "relay/base/hostport.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/producer/unix_fds.h"

#define FRAMES_PER_TURN 32
#define ACCEPTS_PER_TURN 16
#define LOG_COMP "ipc"

/* One encoded frame waiting for the socket. fd rides on its first sendmsg. */
typedef struct out_buf {
  struct out_buf *next;
  uint8_t *data;
  size_t len;
  size_t off;
  int fd;
} out_buf;

struct tr_ipc_conn {
  tr_ipc_host *host;
  tr_ipc_conn *prev, *next;
  uv_poll_t poll;
  int fd;
  int events;
  tr_ipc_peer peer;
  char peer_addr[64]; /* network peers: their address without the port */
  bool identified;    /* network peers: on_identity was called */
  tr_ipc_reader reader;
  int rx_fd;
  out_buf *out_head, *out_tail;
  size_t out_bytes;
  tr_ipc_conn_cb drain_cb;
  void *data;
  bool connected; /* on_connect accepted it, so on_disconnect is owed */
  bool bound;     /* a BindService succeeded: the bind deadline no longer applies */
  uint64_t accepted_ms;
  /* A frame is partly received since partial_since_ms. A flag of its own, not a time made
   * non-zero with `| 1`: that stamp lay a millisecond ahead of the clock when it was even, and
   * a deadline check in that millisecond wrapped `now - partial_since_ms` around. */
  bool partial;
  uint64_t partial_since_ms;
  enum tr_ipc_close close_why; /* set by close_conn */
  uint64_t *pending;         /* ids of requests awaiting their final reply */
  size_t num_pending;
  bool closing;
  bool backlog;
  /* The call being dispatched: its successful reply is not sent if drop_reply was set. */
  bool in_call;
  bool call_drop_reply;
  uint64_t call_id;
};

static void on_conn_poll(uv_poll_t *handle, int status, int events);

/* The deadlines' clock: the loop's, or the one a test gave. Times taken from it are never
 * later than a `now` read after them, so `now - then` does not wrap. */
static uint64_t now_ms(tr_ipc_host *host) {
  return host->cfg.now_ms ? host->cfg.now_ms(host) : uv_now(host->loop);
}

/* ---- closing ---------------------------------------------------------------------- */

static void maybe_finish_host_close(tr_ipc_host *host) {
  if (!host->closing || host->handles_closing > 0 || host->conns)
    return;
  if (host->listen_fd >= 0 && host->path[0]) {
    struct stat st;
    /* Another instance may have replaced our socket file since; leave theirs alone. */
    if (lstat(host->path, &st) == 0 && st.st_dev == host->path_dev &&
        st.st_ino == host->path_ino)
      unlink(host->path);
  }
  if (host->listen_fd >= 0) {
    close(host->listen_fd);
    host->listen_fd = -1;
  }
  tr_ipc_host_close_cb cb = host->close_cb;
  host->close_cb = NULL;
  if (cb)
    cb(host);
}

static void free_out_queue(tr_ipc_conn *conn) {
  while (conn->out_head) {
    out_buf *ob = conn->out_head;
    conn->out_head = ob->next;
    if (ob->fd >= 0)
      close(ob->fd);
    free(ob->data);
    free(ob);
  }
  conn->out_tail = NULL;
  conn->out_bytes = 0;
}

static void on_conn_closed(uv_handle_t *handle) {
  tr_ipc_conn *conn = handle->data;
  tr_ipc_host *host = conn->host;
  if (conn->connected && host->cfg.on_disconnect)
    host->cfg.on_disconnect(conn);
  close(conn->fd);
  if (conn->rx_fd >= 0)
    close(conn->rx_fd);
  free_out_queue(conn);
  tr_frame_reader_free(&conn->reader);
  free(conn->pending);
  if (conn->prev)
    conn->prev->next = conn->next;
  else
    host->conns = conn->next;
  if (conn->next)
    conn->next->prev = conn->prev;
  host->num_conns--;
  free(conn);
  maybe_finish_host_close(host);
}

static void close_conn(tr_ipc_conn *conn, enum tr_ipc_close why, enum tr_log_level level,
                       const char *reason) {
  if (conn->closing)
    return;
  conn->closing = true;
  conn->close_why = why;
  if (conn->host->net)
    tr_log(level, LOG_COMP, "%s: closing connection of %s: %s", conn->host->cfg.name,
           conn->peer_addr, reason);
  else
    tr_log(level, LOG_COMP, "%s: closing connection of pid %d uid %u: %s", conn->host->cfg.name,
           (int)conn->peer.pid, (unsigned)conn->peer.uid, reason);
  uv_close((uv_handle_t *)&conn->poll, on_conn_closed);
}

void tr_ipc_conn_close(tr_ipc_conn *conn, enum tr_ipc_close why, const char *reason) {
  close_conn(conn, why, TR_LOG_INFO, reason);
}

const char *tr_ipc_close_name(enum tr_ipc_close why) {
  switch (why) {
  case TR_IPC_CLOSE_PEER: return "closed by the peer";
  case TR_IPC_CLOSE_HOST: return "host closing";
  case TR_IPC_CLOSE_STALLED: return "stalled client";
  case TR_IPC_CLOSE_IDLE: return "idle client";
  case TR_IPC_CLOSE_NOT_READING: return "peer not reading";
  case TR_IPC_CLOSE_TOO_MANY_REQUESTS: return "too many requests";
  case TR_IPC_CLOSE_PROTOCOL: return "protocol error";
  case TR_IPC_CLOSE_VIOLATIONS: return "too many ABI violations";
  case TR_IPC_CLOSE_RESOURCES: return "out of resources";
  default: return "unknown reason";
  }
}

/* ---- writing ---------------------------------------------------------------------- */

static void update_events(tr_ipc_conn *conn) {
  int want = UV_READABLE;
  if (conn->out_head || conn->drain_cb)
    want |= UV_WRITABLE;
  if (want == conn->events)
    return;
  int rc = uv_poll_start(&conn->poll, want, on_conn_poll);
  if (rc < 0) {
    close_conn(conn, TR_IPC_CLOSE_RESOURCES, TR_LOG_WARN, uv_strerror(rc));
    return;
  }
  conn->events = want;
}

/* Writes queued frames until the socket is full. Closes the connection on a send error. */
static void flush_out(tr_ipc_conn *conn) {
  while (conn->out_head) {
    out_buf *ob = conn->out_head;
    ssize_t n = tr_unix_fds_send(conn->fd, ob->data + ob->off, ob->len - ob->off, ob->fd,
                                 MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return;
      close_conn(conn, TR_IPC_CLOSE_PEER, TR_LOG_INFO, strerror(errno));
      return;
    }
    if (ob->fd >= 0) {
      close(ob->fd);
      ob->fd = -1;
    }
    ob->off += (size_t)n;
    conn->out_bytes -= (size_t)n;
    if (ob->off < ob->len)
      continue;
    conn->out_head = ob->next;
    if (!conn->out_head)
      conn->out_tail = NULL;
    free(ob->data);
    free(ob);
  }
}

static int send_frame(tr_ipc_conn *conn, const Perfetto__Protos__IPCFrame *frame, int fd) {
  if (conn->closing)
    return TR_ERR_CLOSED;
  uint8_t *data;
  size_t len;
  int rc = tr_ipc_frame_encode(frame, &data, &len);
  if (rc < 0)
    return rc;
  size_t cap = conn->host->cfg.max_out_bytes;
  if (conn->out_bytes + len > cap) {
    char reason[96];
    snprintf(reason, sizeof reason, "output queue over %zu bytes (peer not reading)", cap);
    free(data);
    close_conn(conn, TR_IPC_CLOSE_NOT_READING, TR_LOG_WARN, reason);
    return TR_ERR_FULL;
  }
  out_buf *ob = malloc(sizeof *ob);
  if (!ob) {
    rc = TR_ERR_NOMEM;
    goto fail_data;
  }
  *ob = (out_buf){.data = data, .len = len, .fd = -1};
  if (fd >= 0) {
    ob->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (ob->fd < 0) {
      rc = TR_ERR_SYS(errno);
      goto fail_ob;
    }
  }
  if (conn->out_tail)
    conn->out_tail->next = ob;
  else
    conn->out_head = ob;
  conn->out_tail = ob;
  conn->out_bytes += len;
  flush_out(conn);
  if (conn->closing)
    return TR_ERR_CLOSED;
  update_events(conn);
  return 0;

fail_ob:
  free(ob);
fail_data:
  free(data);
  return rc;
}

int tr_ipc_conn_reply(tr_ipc_conn *conn, uint64_t request_id, bool success, bool has_more,
                      const uint8_t *reply, size_t reply_len, int fd) {
  if (success && conn->in_call && conn->call_drop_reply && conn->call_id == request_id)
    return 0;
  if (!has_more) {
    for (size_t i = 0; i < conn->num_pending; i++) {
      if (conn->pending[i] == request_id) {
        conn->pending[i] = conn->pending[--conn->num_pending];
        break;
      }
    }
  }
  Perfetto__Protos__IPCFrame__InvokeMethodReply r =
      PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD_REPLY__INIT;
  r.has_has_more = true;
  r.has_more = has_more;
  if (success) {
    r.has_success = true;
    r.success = true;
    r.has_reply_proto = true;
    r.reply_proto.data = (uint8_t *)reply;
    r.reply_proto.len = reply_len;
  }
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = true;
  frame.request_id = request_id;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY;
  frame.msg_invoke_method_reply = &r;
  return send_frame(conn, &frame, fd);
}

/* ---- requests --------------------------------------------------------------------- */

static void send_request_error(tr_ipc_conn *conn, uint64_t request_id, const char *error) {
  Perfetto__Protos__IPCFrame__RequestError e = PERFETTO__PROTOS__IPCFRAME__REQUEST_ERROR__INIT;
  e.error = (char *)error;
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = true;
  frame.request_id = request_id;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_REQUEST_ERROR;
  frame.msg_request_error = &e;
  send_frame(conn, &frame, -1);
}

static void on_bind(tr_ipc_conn *conn, uint64_t request_id,
                    const Perfetto__Protos__IPCFrame__BindService *req) {
  const tr_ipc_host_config *cfg = &conn->host->cfg;
  const tr_ipc_service *svc = NULL;
  size_t id = 0;
  for (size_t i = 0; req->service_name && i < cfg->num_services; i++) {
    if (strcmp(cfg->services[i].name, req->service_name) == 0) {
      svc = &cfg->services[i];
      id = i + 1;
      break;
    }
  }
  Perfetto__Protos__IPCFrame__BindServiceReply r =
      PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE_REPLY__INIT;
  Perfetto__Protos__IPCFrame__BindServiceReply__MethodInfo *infos = NULL;
  Perfetto__Protos__IPCFrame__BindServiceReply__MethodInfo **ptrs = NULL;
  r.has_success = true;
  r.success = svc != NULL;
  if (svc) {
    conn->bound = true;
    r.has_service_id = true;
    r.service_id = (uint32_t)id;
    infos = calloc(svc->num_methods + 1, sizeof *infos);
    ptrs = calloc(svc->num_methods + 1, sizeof *ptrs);
    if (!infos || !ptrs) {
      close_conn(conn, TR_IPC_CLOSE_RESOURCES, TR_LOG_ERROR, "out of memory");
      goto done;
    }
    for (size_t i = 0; i < svc->num_methods; i++) {
      if (!svc->methods[i].fn)
        continue;
      Perfetto__Protos__IPCFrame__BindServiceReply__MethodInfo *m = &infos[r.n_methods];
      perfetto__protos__ipcframe__bind_service_reply__method_info__init(m);
      m->has_id = true;
      m->id = (uint32_t)(i + 1);
      m->name = (char *)svc->methods[i].name;
      ptrs[r.n_methods++] = m;
    }
    r.methods = ptrs;
  }
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = true;
  frame.request_id = request_id;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY;
  frame.msg_bind_service_reply = &r;
  send_frame(conn, &frame, -1);
done:
  free(ptrs);
  free(infos);
}

static void on_invoke(tr_ipc_conn *conn, uint64_t request_id,
                      const Perfetto__Protos__IPCFrame__InvokeMethod *req) {
  static const uint8_t no_args[1];
  const tr_ipc_host_config *cfg = &conn->host->cfg;
  const tr_ipc_method *method = NULL;
  if (req->service_id >= 1 && req->service_id <= cfg->num_services) {
    const tr_ipc_service *svc = &cfg->services[req->service_id - 1];
    if (req->method_id >= 1 && req->method_id <= svc->num_methods)
      method = &svc->methods[req->method_id - 1];
  }
  if (!method || !method->fn) {
    tr_ipc_conn_reply(conn, request_id, false, false, NULL, 0, -1);
    return;
  }
  const uint8_t *args = req->has_args_proto && req->args_proto.data ? req->args_proto.data
                                                                      : no_args;
  size_t args_len = req->has_args_proto ? req->args_proto.len : 0;
  bool drop_reply = req->has_drop_reply && req->drop_reply;
  if (!drop_reply) {
    if (conn->num_pending >= cfg->max_pending) {
      char reason[96];
      snprintf(reason, sizeof reason, "more than %zu requests awaiting their reply",
               cfg->max_pending);
      close_conn(conn, TR_IPC_CLOSE_TOO_MANY_REQUESTS, TR_LOG_WARN, reason);
      return;
    }
    conn->pending[conn->num_pending++] = request_id;
  }
  conn->in_call = true;
  conn->call_id = request_id;
  conn->call_drop_reply = req->has_drop_reply && req->drop_reply;
  method->fn(conn, request_id, args, args_len, conn->call_drop_reply);
  conn->in_call = false;
}

static void handle_frame(tr_ipc_conn *conn, const uint8_t *payload, size_t len) {
  Perfetto__Protos__IPCFrame *frame = tr_ipc_frame_decode(payload, len);
  if (!frame) {
    TR_DEBUG(LOG_COMP, "%s: dropped an undecodable frame of %zu bytes from pid %d",
             conn->host->cfg.name, len, (int)conn->peer.pid);
    return;
  }
  if (conn->host->net && !conn->identified) {
    conn->identified = true;
    bool is_id = frame->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_SET_PEER_IDENTITY;
    conn->host->cfg.on_identity(conn, is_id ? frame->set_peer_identity : NULL);
    if (is_id || conn->closing) {
      tr_ipc_frame_free(frame);
      return;
    }
  }
  switch (frame->msg_case) {
  case PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE:
    on_bind(conn, frame->request_id, frame->msg_bind_service);
    break;
  case PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD:
    on_invoke(conn, frame->request_id, frame->msg_invoke_method);
    break;
  case PERFETTO__PROTOS__IPCFRAME__MSG_SET_PEER_IDENTITY:
    /* On a UNIX socket the kernel's SO_PEERCRED is the identity: a claim cannot change it. On
     * the network only the first frame counts, as in traced. */
    TR_DEBUG(LOG_COMP, "%s: ignored SetPeerIdentity from pid %d%s", conn->host->cfg.name,
             (int)conn->peer.pid, conn->host->net ? " (not its first frame)" : "");
    break;
  default:
    send_request_error(conn, frame->request_id, "unknown request");
    break;
  }
  tr_ipc_frame_free(frame);
}

/* ---- reading ---------------------------------------------------------------------- */

static void keep_fd(tr_ipc_conn *conn, int fd) {
  if (conn->rx_fd >= 0)
    close(conn->rx_fd);
  conn->rx_fd = fd;
}

/* One recvmsg into the reader; received fds replace the connection's last fd. Returns the
 * byte count, 0 at EOF, TR_ERR_SYS(errno), or TR_ERR_PROTO for truncated control data. */
static ssize_t recv_some(tr_ipc_conn *conn, uint8_t *dst, size_t room) {
  struct tr_unix_fds fds;
  ssize_t n = tr_unix_fds_recv(conn->fd, dst, room, MSG_DONTWAIT, &fds);
  for (size_t i = 0; i < fds.n; i++)
    keep_fd(conn, fds.fd[i]);
  return n;
}

/* Handles buffered whole frames while *budget lasts. */
static void process_frames(tr_ipc_conn *conn, int *budget) {
  while (*budget > 0 && !conn->closing) {
    const uint8_t *payload;
    size_t len;
    int rc = tr_frame_reader_next(&conn->reader, &payload, &len);
    if (rc == 0)
      return;
    if (rc < 0) {
      close_conn(conn, TR_IPC_CLOSE_PROTOCOL, TR_LOG_WARN,
                 "declared frame size over the 131072-byte IPC limit");
      return;
    }
    (*budget)--;
    conn->partial = false;
    handle_frame(conn, payload, len);
  }
}

static void on_backlog_idle(uv_idle_t *idle);

static void set_backlog(tr_ipc_conn *conn) {
  conn->backlog = true;
  if (!conn->host->closing)
    uv_idle_start(&conn->host->backlog_idle, on_backlog_idle);
}

/* Frames already buffered go first: a recvmsg happens only when none is whole, so an fd
 * always arrives before the handler of its frame runs. */
static void read_some(tr_ipc_conn *conn) {
  int budget = FRAMES_PER_TURN;
  process_frames(conn, &budget);
  if (conn->closing)
    return;
  if (budget == 0) {
    set_backlog(conn);
    return;
  }
  uint8_t *dst;
  size_t room;
  int rc = tr_frame_reader_space(&conn->reader, &dst, &room);
  if (rc < 0) {
    close_conn(conn, rc == TR_ERR_NOMEM ? TR_IPC_CLOSE_RESOURCES : TR_IPC_CLOSE_PROTOCOL,
               TR_LOG_WARN, tr_strerror(rc));
    return;
  }
  ssize_t n = recv_some(conn, dst, room);
  if (n == TR_ERR_SYS(EAGAIN) || n == TR_ERR_SYS(EWOULDBLOCK))
    return;
  if (n == 0) {
    close_conn(conn, TR_IPC_CLOSE_PEER, TR_LOG_DEBUG, "peer closed the connection");
    return;
  }
  if (n < 0) {
    if (n == TR_ERR_PROTO)
      close_conn(conn, TR_IPC_CLOSE_PROTOCOL, TR_LOG_WARN, "too many fds in one message");
    else
      close_conn(conn, TR_IPC_CLOSE_PEER, TR_LOG_WARN, tr_strerror((int)n));
    return;
  }
  tr_frame_reader_commit(&conn->reader, (size_t)n);
  process_frames(conn, &budget);
  if (!conn->closing && budget == 0)
    set_backlog(conn);
  else if (conn->reader.len > conn->reader.start && !conn->partial) {
    conn->partial = true;
    conn->partial_since_ms = now_ms(conn->host);
  }
}

/* After any I/O: run a due drain callback, then poll for what is now wanted. */
static void after_io(tr_ipc_conn *conn) {
  if (!conn->closing && !conn->out_head && conn->drain_cb) {
    tr_ipc_conn_cb cb = conn->drain_cb;
    conn->drain_cb = NULL;
    cb(conn);
  }
  if (!conn->closing)
    update_events(conn);
}

static void on_conn_poll(uv_poll_t *handle, int status, int events) {
  tr_ipc_conn *conn = handle->data;
  if (status < 0) {
    close_conn(conn, TR_IPC_CLOSE_PEER, TR_LOG_INFO, uv_strerror(status));
    return;
  }
  if (events & UV_WRITABLE)
    flush_out(conn);
  if (!conn->closing && (events & UV_READABLE))
    read_some(conn);
  after_io(conn);
}

static void on_backlog_idle(uv_idle_t *idle) {
  tr_ipc_host *host = idle->data;
  bool more = false;
  for (tr_ipc_conn *conn = host->conns; conn; conn = conn->next) {
    if (!conn->backlog || conn->closing)
      continue;
    conn->backlog = false;
    read_some(conn);
    after_io(conn);
    more |= conn->backlog;
  }
  if (!more)
    uv_idle_stop(idle);
}

/* ---- accepting -------------------------------------------------------------------- */

/* A network peer's address, without the port: what names a guest that claims no identity. */
static void peer_address(int fd, char *out, size_t cap) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  snprintf(out, cap, "unknown");
  if (getpeername(fd, (struct sockaddr *)&ss, &len) < 0)
    return;
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, out, (socklen_t)cap);
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, out, (socklen_t)cap);
  else if (ss.ss_family == AF_VSOCK)
    snprintf(out, cap, "vsock:%u", ((struct sockaddr_vm *)&ss)->svm_cid);
}

static void add_conn(tr_ipc_host *host, int fd) {
  struct ucred cred = {0};
  socklen_t cred_len = sizeof cred;
  if (!host->net && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) < 0) {
    TR_WARN(LOG_COMP, "%s: refused a connection: SO_PEERCRED: %s", host->cfg.name,
            strerror(errno));
    goto fail_fd;
  }
  if (host->num_conns >= host->cfg.max_conns) {
    TR_WARN(LOG_COMP, "%s: refused a connection from pid %d (uid %u): it serves at most %zu "
            "connections at once%s%s%s", host->cfg.name, (int)cred.pid, (unsigned)cred.uid,
            host->cfg.max_conns, host->cfg.max_conns_flag ? " (" : "",
            host->cfg.max_conns_flag ? host->cfg.max_conns_flag : "",
            host->cfg.max_conns_flag ? ")" : "");
    goto fail_fd;
  }
  tr_ipc_conn *conn = calloc(1, sizeof *conn);
  if (!conn)
    goto fail_fd;
  conn->host = host;
  conn->fd = fd;
  conn->rx_fd = -1;
  conn->peer = (tr_ipc_peer){.uid = cred.uid, .gid = cred.gid, .pid = cred.pid};
  if (host->net)
    peer_address(fd, conn->peer_addr, sizeof conn->peer_addr);
  conn->accepted_ms = now_ms(host);
  conn->pending = calloc(host->cfg.max_pending, sizeof *conn->pending);
  if (!conn->pending)
    goto fail_conn;
  tr_ipc_reader_init(&conn->reader);
  if (uv_poll_init(host->loop, &conn->poll, fd) < 0)
    goto fail_conn;
  conn->poll.data = conn;
  conn->next = host->conns;
  if (host->conns)
    host->conns->prev = conn;
  host->conns = conn;
  host->num_conns++;
  update_events(conn);
  if (conn->closing)
    return;
  if (host->cfg.on_connect && host->cfg.on_connect(conn) < 0) {
    close_conn(conn, TR_IPC_CLOSE_HOST, TR_LOG_INFO, "refused by the service");
    return;
  }
  conn->connected = true;
  return;

fail_conn:
  free(conn->pending);
  free(conn);
fail_fd:
  close(fd);
}

static void on_listen_readable(uv_poll_t *handle, int status, int events) {
  tr_ipc_host *host = handle->data;
  (void)events;
  if (status < 0) {
    TR_WARN(LOG_COMP, "%s: listening socket: %s", host->cfg.name, uv_strerror(status));
    return;
  }
  for (int i = 0; i < ACCEPTS_PER_TURN && !host->closing; i++) {
    int fd = accept4(host->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        TR_WARN(LOG_COMP, "%s: accept: %s", host->cfg.name, strerror(errno));
      return;
    }
    add_conn(host, fd);
  }
}

/* ---- deadlines ------------------------------------------------------------------- */

static void on_timeout_tick(uv_timer_t *timer) {
  tr_ipc_host *host = timer->data;
  uint64_t now = now_ms(host);
  char reason[128];
  /* Closing only marks a connection; it is unlinked later, so the list stays walkable. */
  for (tr_ipc_conn *conn = host->conns; conn; conn = conn->next) {
    if (conn->closing)
      continue;
    if (!conn->bound && now - conn->accepted_ms >= host->cfg.bind_timeout_ms) {
      snprintf(reason, sizeof reason, "no service bound within %u ms (idle client)",
               host->cfg.bind_timeout_ms);
      close_conn(conn, TR_IPC_CLOSE_IDLE, TR_LOG_WARN, reason);
    } else if (conn->partial && !conn->backlog &&
               now - conn->partial_since_ms >= host->cfg.stall_timeout_ms) {
      snprintf(reason, sizeof reason,
               "a frame left unfinished for %u ms (%zu bytes received; stalled client)",
               host->cfg.stall_timeout_ms, conn->reader.len - conn->reader.start);
      close_conn(conn, TR_IPC_CLOSE_STALLED, TR_LOG_WARN, reason);
    }
  }
}

/* ---- host lifecycle --------------------------------------------------------------- */

int tr_ipc_host_init(tr_ipc_host *host, uv_loop_t *loop, const tr_ipc_host_config *cfg) {
  if (!cfg->name || (cfg->num_services > 0 && !cfg->services))
    return TR_ERR_INVAL;
  memset(host, 0, sizeof *host);
  host->loop = loop;
  host->cfg = *cfg;
  if (!host->cfg.max_out_bytes)
    host->cfg.max_out_bytes = TR_IPC_DEFAULT_MAX_OUT;
  if (!host->cfg.max_conns)
    host->cfg.max_conns = TR_IPC_DEFAULT_MAX_CONNS;
  if (!host->cfg.bind_timeout_ms)
    host->cfg.bind_timeout_ms = TR_IPC_DEFAULT_BIND_TIMEOUT_MS;
  if (!host->cfg.stall_timeout_ms)
    host->cfg.stall_timeout_ms = TR_IPC_DEFAULT_STALL_TIMEOUT_MS;
  if (!host->cfg.max_pending)
    host->cfg.max_pending = TR_IPC_DEFAULT_MAX_PENDING;
  host->listen_fd = -1;
  int rc = uv_idle_init(loop, &host->backlog_idle);
  if (rc < 0)
    return rc;
  host->backlog_idle.data = host;
  uv_timer_init(loop, &host->timeout_timer); /* cannot fail */
  host->timeout_timer.data = host;
  uv_unref((uv_handle_t *)&host->timeout_timer); /* the listener keeps the loop alive */
  return 0;
}

/* Removes a socket file nobody accepts on any more; refuses to touch anything else. */
static int remove_stale(const struct sockaddr_un *addr) {
  struct stat st;
  if (lstat(addr->sun_path, &st) < 0)
    return errno == ENOENT ? 0 : TR_ERR_SYS(errno);
  if (!S_ISSOCK(st.st_mode))
    return TR_ERR_SYS(EEXIST);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return TR_ERR_SYS(errno);
  int live = connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0;
  close(fd);
  if (live)
    return TR_ERR_SYS(EADDRINUSE);
  if (unlink(addr->sun_path) < 0 && errno != ENOENT)
    return TR_ERR_SYS(errno);
  return 0;
}

static void start_timer(tr_ipc_host *host) {
  unsigned shorter = host->cfg.bind_timeout_ms < host->cfg.stall_timeout_ms
                         ? host->cfg.bind_timeout_ms
                         : host->cfg.stall_timeout_ms;
  unsigned tick = shorter / 4 < 10 ? 10 : shorter / 4 > 1000 ? 1000 : shorter / 4;
  uv_timer_start(&host->timeout_timer, on_timeout_tick, tick, tick);
}

int tr_ipc_host_start(tr_ipc_host *host, const char *path, mode_t mode) {
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (host->listening || host->closing)
    return TR_ERR_STATE;
  if (strlen(path) >= sizeof addr.sun_path || strlen(path) >= sizeof host->path)
    return TR_ERR_INVAL;
  strcpy(addr.sun_path, path);
  int rc = remove_stale(&addr);
  if (rc < 0)
    return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return TR_ERR_SYS(errno);
  struct stat st;
  if (bind(fd, (const struct sockaddr *)&addr, sizeof addr) < 0) {
    rc = TR_ERR_SYS(errno);
    goto fail_fd;
  }
  if (chmod(path, mode) < 0 || lstat(path, &st) < 0 || listen(fd, SOMAXCONN) < 0) {
    rc = TR_ERR_SYS(errno);
    goto fail_bound;
  }
  rc = uv_poll_init(host->loop, &host->listen_poll, fd);
  if (rc < 0)
    goto fail_bound;
  /* From here on tr_ipc_host_close releases the socket, the handle and the path. */
  host->listen_poll.data = host;
  host->listen_fd = fd;
  host->listening = true;
  strcpy(host->path, path);
  host->path_dev = st.st_dev;
  host->path_ino = st.st_ino;
  start_timer(host);
  return uv_poll_start(&host->listen_poll, UV_READABLE, on_listen_readable);

fail_bound:
  unlink(path);
fail_fd:
  close(fd);
  return rc;
}

/* The bound, listening socket of a network address, or a negative code. */
static int net_socket(const char *addr) {
  union {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    struct sockaddr_vm vm;
  } sa = {0};
  socklen_t len;
  const char *vs = "vsock://";
  if (strncmp(addr, vs, strlen(vs)) == 0) {
    char *end;
    long cid = strtol(addr + strlen(vs), &end, 10);
    char *pend;
    unsigned long port = *end == ':' ? strtoul(end + 1, &pend, 10) : 0;
    if (*end != ':' || *pend || port == 0 || port > 0xffffffffu || cid < -1 || cid > 0xffffffffl)
      return TR_ERR_CONFIG;
    sa.vm = (struct sockaddr_vm){.svm_family = AF_VSOCK,
                                 .svm_cid = cid < 0 ? VMADDR_CID_ANY : (unsigned)cid,
                                 .svm_port = (unsigned)port};
    len = sizeof sa.vm;
  } else {
    struct tr_hostport hp;
    if (tr_hostport_parse(addr, true, &hp) < 0 || !strchr(addr, ':'))
      return TR_ERR_CONFIG;
    if (inet_pton(AF_INET, hp.host, &sa.in4.sin_addr) == 1) {
      sa.in4.sin_family = AF_INET;
      sa.in4.sin_port = htons((uint16_t)hp.port);
      len = sizeof sa.in4;
    } else if (inet_pton(AF_INET6, hp.host, &sa.in6.sin6_addr) == 1) {
      sa.in6.sin6_family = AF_INET6;
      sa.in6.sin6_port = htons((uint16_t)hp.port);
      len = sizeof sa.in6;
    } else {
      return TR_ERR_CONFIG; /* an address, not a name: the operator says where exactly */
    }
  }
  int fd = socket(sa.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return TR_ERR_SYS(errno);
  int one = 1;
  if (sa.sa.sa_family != AF_VSOCK)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, &sa.sa, len) < 0 || listen(fd, SOMAXCONN) < 0) {
    int rc = TR_ERR_SYS(errno);
    close(fd);
    return rc;
  }
  return fd;
}

int tr_ipc_host_start_net(tr_ipc_host *host, const char *addr) {
  if (host->listening || host->closing || !host->cfg.on_identity)
    return TR_ERR_STATE;
  int fd = net_socket(addr);
  if (fd < 0)
    return fd;
  int rc = uv_poll_init(host->loop, &host->listen_poll, fd);
  if (rc < 0) {
    close(fd);
    return rc;
  }
  host->listen_poll.data = host;
  host->listen_fd = fd;
  host->listening = true;
  host->net = true;
  host->path[0] = '\0';
  TR_INFO(LOG_COMP, "%s: listening on %s (port %d)", host->cfg.name, addr,
          tr_ipc_host_net_port(host));
  start_timer(host);
  return uv_poll_start(&host->listen_poll, UV_READABLE, on_listen_readable);
}

static void on_host_handle_closed(uv_handle_t *handle) {
  tr_ipc_host *host = handle->data;
  host->handles_closing--;
  maybe_finish_host_close(host);
}

void tr_ipc_host_close(tr_ipc_host *host, tr_ipc_host_close_cb cb) {
  if (host->closing)
    return;
  host->closing = true;
  host->close_cb = cb;
  for (tr_ipc_conn *conn = host->conns; conn; conn = conn->next)
    close_conn(conn, TR_IPC_CLOSE_HOST, TR_LOG_DEBUG, "host closing");
  if (host->listening) {
    host->handles_closing++;
    uv_close((uv_handle_t *)&host->listen_poll, on_host_handle_closed);
  }
  host->handles_closing++;
  uv_close((uv_handle_t *)&host->backlog_idle, on_host_handle_closed);
  host->handles_closing++;
  uv_close((uv_handle_t *)&host->timeout_timer, on_host_handle_closed);
}

/* ---- accessors -------------------------------------------------------------------- */

int tr_ipc_conn_take_fd(tr_ipc_conn *conn) {
  int fd = conn->rx_fd;
  conn->rx_fd = -1;
  return fd;
}

size_t tr_ipc_conn_out_bytes(const tr_ipc_conn *conn) { return conn->out_bytes; }

void tr_ipc_conn_on_drain(tr_ipc_conn *conn, tr_ipc_conn_cb cb) {
  conn->drain_cb = cb;
  if (!conn->closing)
    update_events(conn);
}

tr_ipc_peer tr_ipc_conn_peer(const tr_ipc_conn *conn) { return conn->peer; }
const char *tr_ipc_conn_peer_addr(const tr_ipc_conn *conn) { return conn->peer_addr; }

int tr_ipc_host_net_port(const tr_ipc_host *host) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (!host->net || getsockname(host->listen_fd, (struct sockaddr *)&ss, &len) < 0)
    return TR_ERR_STATE;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return (int)((struct sockaddr_vm *)&ss)->svm_port;
}
enum tr_ipc_close tr_ipc_conn_close_why(const tr_ipc_conn *conn) { return conn->close_why; }

int tr_ipc_conn_peer_groups(const tr_ipc_conn *conn, gid_t *groups, size_t cap) {
#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13 */
#endif
  socklen_t len = (socklen_t)(cap * sizeof *groups);
  if (getsockopt(conn->fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0)
    return TR_ERR_SYS(errno); /* ERANGE: more than cap groups */
  return (int)(len / sizeof *groups);
}
tr_ipc_host *tr_ipc_conn_host(const tr_ipc_conn *conn) { return conn->host; }
void tr_ipc_conn_set_data(tr_ipc_conn *conn, void *data) { conn->data = data; }
void *tr_ipc_conn_data(const tr_ipc_conn *conn) { return conn->data; }
