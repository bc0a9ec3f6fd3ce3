/* tls_uv.c: runs tr_tls sessions over libuv TCP handles (see tls_uv.h for the contract).
 *
 * Each connection owns two handles, the TCP stream and a timer (handshake deadline, then close
 * linger), and is freed when both close callbacks have run. All ways out (errors, deadline,
 * peer close, tr_tls_uv_close, server shutdown) go through close_conn(), which stops reading,
 * ships pending ciphertext (an alert tells the peer why it was refused), and closes the
 * handles once the writes are done or the linger timer fires.
 *
 * Every write request carries one buffer of ciphertext: all records for one tr_tls_uv_write()
 * call, or what a handshake step or a read produced. The session's own output buffer is always
 * emptied into such a request before control returns to libuv, so records leave in order.
 * While libuv holds no write of the connection, what the kernel takes at once is written
 * directly and only the rest becomes a request (hand_to_libuv).
 *
 * Handshakes run off the loop: each step (a tr_tls_handshake call on the input received so
 * far, which may run the public-key operations, 1-5 ms each on a small machine) is a
 * uv_queue_work job on libuv's worker pool. While a step runs, the worker alone touches the
 * session: the loop keeps what it reads in the held input (at most HANDSHAKE_INPUT_MAX
 * bytes), sends nothing, and defers freeing the connection to the step's end (step_done),
 * which sends what the step produced and feeds the held input. A peer that leaves before the
 * first step began has that step cancelled: no public-key work for the departed.
 * Admission (tls_uv.h says why): a server runs at most max_handshakes at once; it accepts every
 * further connection at once into its waiting list (no session, not read, its timer counting
 * admission_wait_ms) and admits the oldest as a handshake ends; one whose wait runs out is
 * closed before any byte is sent (refuse_busy). A client's timer counts start_timeout_ms until
 * the server's first bytes, then handshake_timeout_ms; either side's stops while a step of its
 * own is queued or runs (queue_step, step_done). */
#include "relay/link/tls_uv.h"

#include "relay/clock/clock.h"
#include "relay/base/log.h"
#include "relay/link/sock_stamp.h"
#include "relay/link/source_limit.h"
#include "relay/base/tr_error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEEPALIVE_DELAY_S 30
#define READ_BUFFER (64 * 1024)
/* Connections not yet accepted (we accept as they come; the kernel caps it at
 * net.core.somaxconn, 4096 by default since Linux 5.4). */
#define LISTEN_BACKLOG 4096
/* Input a peer may send while a handshake step runs: a flight of handshake messages is a few
 * KiB (a certificate chain at most); more is not a TLS client. */
#define HANDSHAKE_INPUT_MAX (64 * 1024)

struct tr_tls_uv_server {
  uv_tcp_t tcp;
  uv_loop_t *loop;
  tr_tls_config *cfg;
  struct tr_tls_uv_options opts;
  struct tr_tls_uv_callbacks cbs;
  void *data;
  tr_tls_uv_conn *handshaking; /* list of connections in their handshake */
  unsigned n_handshaking;
  /* Connections waiting for a handshake slot, oldest first (admitted from the head). */
  tr_tls_uv_conn *waiting, *waiting_tail;
  unsigned n_waiting;
  uint64_t storm_refused; /* refused busy since the waiting list was last empty */
  struct tr_source_limit sources; /* what each address holds, waiting or handshaking */
  struct tr_tls_uv_server_stats stats;
  bool closing;
  bool tcp_closed;
};

struct tr_tls_uv_conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_connect_t connect_req;
  tr_tls_session *tls;
  tr_tls_uv_server *server; /* set while a server-side connection waits or handshakes */
  bool waiting;             /* in server->waiting: no session yet, not read */
  struct tr_source_entry *source; /* its address's counts, while on a server list */
  unsigned steps;           /* handshake steps completed */
  unsigned step_delay_ms;   /* opts.test_step_delay_ms */
  uv_thread_t loop_thread;  /* the loop's, to tell where handshake steps run */
  /* A handshake step on a worker (step_work): the session is the worker's until step_done. */
  uv_work_t step_work;
  bool stepping;
  uint64_t deadline_left_ms; /* of the handshake's deadline, while a step runs (stopped then) */
  bool eof_in_handshake; /* the peer's EOF came while a step had input still to read */
  int step_rc;              /* the step's tr_tls_handshake result */
  bool step_on_loop;        /* the last handshake step ran on the loop's thread */
  bool established;         /* the handshake is done (the loop's copy of the session's state) */
  bool handles_closed;      /* both handles closed while stepping: step_done frees it */
  tr_tls_uv_conn *prev, *next;
  struct tr_tls_uv_callbacks cbs;
  void *data;
  unsigned handshake_timeout_ms, start_timeout_ms;
  size_t max_queued;
  size_t queued;
  unsigned writes_pending;
  uint64_t bytes_in;
  int64_t read_ns;       /* BOOTTIME when the bytes now being delivered reached the socket */
  int64_t read_clock_ns; /* BOOTTIME when the read that brought them returned */
  /* Kernel send and receive stamps (relay/link/sock_stamp.h). With stamps.rx, on_alloc reads the
   * socket itself with recvmsg, leaving pre_* for on_tcp_read. */
  tr_sock_stamp stamps;
  int64_t marked_ns;      /* *sent_ns of the last stamped write, whose kernel stamp stamps holds */
  int64_t marked_sent_ns; /* BOOTTIME right before it went to the kernel; 0 while held */
  /* A stamped write held until the writes before it have reached the kernel (only a write of
   * its own can ask for a send stamp), and the writes encrypted after it, which wait behind it
   * in order. Both are counted in queued. */
  struct write_req *stamp_held;
  struct write_req *behind_head, *behind_tail;
  /* A stamped write went to the kernel and did not leave at once (libuv's queue or the kernel's
   * held it): the writes after it wait until its kernel stamp is in. Data appended behind it
   * in the kernel's queue made its stamp wrong: without this wait about one answer in six
   * behind a saturated link came with a send stamp 5-20 ms after its arrival (docs/timeline.md,
   * Probes). */
  bool stamp_hold;
  size_t pre_len;
  int pre_err; /* 0, UV_EOF or a libuv error code */
  int64_t pre_ns, pre_clock_ns;
  int handles_open;
  bool app_owned; /* on_close is owed: client connections, server ones after on_connect */
  bool want_drain;
  bool read_paused;   /* tr_tls_uv_pause_read: no on_read until resumed */
  bool resume_queued; /* the timer will deliver what was held, then read again */
  /* Ciphertext of the last socket read not yet fed to the session when reading paused, kept
   * here (the read buffer is the thread's, shared by all its connections) until resumed. */
  unsigned char *held;
  size_t held_len;
  bool closing;
  bool handles_closing;
  int close_reason;
  char close_why[600];
  char peer_addr[64];
};

/* Every socket read lands in its thread's read buffer and is fed to its session at once, so one
 * buffer serves all the connections of a thread's loop and an idle connection holds none. It
 * is allocated at the thread's first read and kept for the thread's life (a pointer, so other
 * threads pay nothing for it). */
static _Thread_local unsigned char *read_buf;

struct write_req {
  uv_write_t req;
  tr_tls_uv_conn *conn;
  struct write_req *next; /* in the behind list */
  size_t len, cap;
  unsigned char data[];
};

static void close_conn(tr_tls_uv_conn *c, int reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void close_handles(tr_tls_uv_conn *c);
static int release_held(tr_tls_uv_conn *c, bool stamped);

static void apply_defaults(struct tr_tls_uv_options *o, const struct tr_tls_uv_options *in) {
  if (in != NULL)
    *o = *in;
  if (o->handshake_timeout_ms == 0)
    o->handshake_timeout_ms = TR_TLS_UV_HANDSHAKE_TIMEOUT_MS;
  if (o->max_queued == 0)
    o->max_queued = TR_TLS_UV_MAX_QUEUED;
  if (o->max_handshakes == 0)
    o->max_handshakes = TR_TLS_UV_MAX_HANDSHAKES;
  if (o->max_handshakes_per_source == 0)
    o->max_handshakes_per_source = TR_TLS_UV_MAX_HANDSHAKES_PER_SOURCE;
  if (o->max_waiting_per_source == 0)
    o->max_waiting_per_source = TR_TLS_UV_MAX_WAITING_PER_SOURCE;
  if (o->start_timeout_ms == 0)
    o->start_timeout_ms = TR_TLS_UV_START_TIMEOUT_MS;
  if (o->admission_wait_ms == 0)
    o->admission_wait_ms = TR_TLS_UV_ADMISSION_WAIT_MS;
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap) {
  char ip[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    uv_ip4_name(in, ip, sizeof ip);
    port = ntohs(in->sin_port);
    snprintf(out, cap, "%s:%d", ip, port);
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    uv_ip6_name(in6, ip, sizeof ip);
    port = ntohs(in6->sin6_port);
    snprintf(out, cap, "[%s]:%d", ip, port);
  } else {
    snprintf(out, cap, "(unknown address family %d)", sa->sa_family);
  }
}

/* ---- writing ---- */

static struct write_req *write_req_new(tr_tls_uv_conn *c, size_t cap) {
  struct write_req *w = malloc(sizeof *w + cap);
  if (w == NULL)
    return NULL;
  w->conn = c;
  w->next = NULL;
  w->len = 0;
  w->cap = cap;
  return w;
}

/* Appends the session's pending ciphertext to *wp, growing it as needed. */
static int take_cipher(tr_tls_uv_conn *c, struct write_req **wp) {
  size_t pending = tr_tls_cipher_pending(c->tls);
  struct write_req *w = *wp;
  if (w->len + pending > w->cap) {
    size_t cap = (w->len + pending) * 2;
    struct write_req *grown = realloc(w, sizeof *w + cap);
    if (grown == NULL)
      return TR_ERR_NOMEM;
    grown->cap = cap;
    *wp = w = grown;
  }
  w->len += tr_tls_take_cipher(c->tls, w->data + w->len, w->cap - w->len);
  return 0;
}

static void on_write(uv_write_t *req, int status) {
  struct write_req *w = (struct write_req *)req;
  tr_tls_uv_conn *c = w->conn;
  c->queued -= w->len;
  c->writes_pending--;
  free(w);
  if (c->handles_closing)
    return;
  if (status < 0 && !c->closing) {
    close_conn(c, status, "sending failed: %s", uv_strerror(status));
    return;
  }
  if (c->closing) {
    if (c->writes_pending == 0)
      close_handles(c);
    return;
  }
  if (c->writes_pending == 0 && c->stamp_held != NULL) {
    int rc = release_held(c, true);
    if (rc < 0) {
      close_conn(c, rc, "sending failed: %s", uv_strerror(rc));
      return;
    }
  }
  if (c->want_drain && c->queued <= c->max_queued / 2) {
    c->want_drain = false;
    if (c->cbs.on_drain != NULL)
      c->cbs.on_drain(c);
  }
}

/* Hands w to the kernel, what it does not take at once to libuv (or frees w if it is empty).
 * A uv_write that completes at once still costs an epoll_ctl (its completion re-arms the
 * socket's watcher): one system call per write, a quarter of the service's in a flushing
 * session at 300 agents (bench/README.md, issue 25). So while libuv holds nothing of this
 * connection, the kernel gets it directly (uv_try_write) and only the rest is queued; not
 * while a drain is wanted, whose on_drain comes from on_write. */
static int hand_to_libuv(tr_tls_uv_conn *c, struct write_req *w) {
  size_t len = w->len, taken = 0;
  if (len > 0 && c->writes_pending == 0 && !c->want_drain) {
    uv_buf_t all = uv_buf_init((char *)w->data, (unsigned)len);
    int n = uv_try_write((uv_stream_t *)&c->tcp, &all, 1);
    if (n < 0 && n != UV_EAGAIN) {
      free(w);
      return n;
    }
    taken = n > 0 ? (size_t)n : 0;
  }
  if (taken == len) {
    free(w);
    tr_sock_stamp_count(&c->stamps, len);
    return 0;
  }
  uv_buf_t rest = uv_buf_init((char *)w->data + taken, (unsigned)(len - taken));
  int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &rest, 1, on_write);
  if (rc < 0) {
    free(w);
    return rc;
  }
  w->len = len - taken; /* what on_write takes off queued */
  c->queued += w->len;
  c->writes_pending++;
  tr_sock_stamp_count(&c->stamps, len); /* all of it reaches the socket, in this order */
  return 0;
}

/* Queues w after everything written before it: behind a held stamped write, or in libuv. */
static int submit(tr_tls_uv_conn *c, struct write_req *w) {
  if ((c->stamp_held == NULL && !c->stamp_hold) || w->len == 0)
    return hand_to_libuv(c, w);
  if (c->behind_tail != NULL)
    c->behind_tail->next = w;
  else
    c->behind_head = w;
  c->behind_tail = w;
  c->queued += w->len;
  return 0;
}

/* Sends whatever ciphertext the session produced (handshake messages, alerts). */
static int flush_cipher(tr_tls_uv_conn *c) {
  size_t pending = tr_tls_cipher_pending(c->tls);
  if (pending == 0)
    return 0;
  struct write_req *w = write_req_new(c, pending);
  if (w == NULL)
    return TR_ERR_NOMEM;
  int rc = take_cipher(c, &w);
  if (rc < 0) {
    free(w);
    return rc;
  }
  return submit(c, w);
}

/* Hands the marked write w to the kernel with a send stamp asked for, marked_sent_ns = the
 * BOOTTIME right before; what the kernel did not take is queued in libuv (no stamp then).
 * Returns 1 when all of it went with a stamp still to come, else 0 or a libuv error. */
static int send_marked(tr_tls_uv_conn *c, struct write_req *w) {
  uv_os_fd_t fd;
  c->marked_sent_ns = (int64_t)tr_clock_boottime_ns();
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
    return hand_to_libuv(c, w);
  ssize_t n = tr_sock_stamp_send(&c->stamps, fd, w->data, w->len);
  if (n == (ssize_t)w->len) {
    free(w);
    return c->stamps.tx_waiting ? 1 : 0;
  }
  if (n < 0 && n != -EAGAIN && n != -EWOULDBLOCK) {
    free(w);
    return uv_translate_sys_error((int)-n);
  }
  if (n > 0) {
    memmove(w->data, w->data + n, w->len - (size_t)n);
    w->len -= (size_t)n;
  }
  return hand_to_libuv(c, w);
}

/* Hands libuv the writes that waited behind a stamped one, in order (frees them after an
 * error rc, which it returns). */
static int release_behind(tr_tls_uv_conn *c, int rc) {
  struct write_req *w;
  c->stamp_hold = false;
  while ((w = c->behind_head) != NULL) {
    c->behind_head = w->next;
    c->queued -= w->len;
    if (rc < 0)
      free(w);
    else
      rc = hand_to_libuv(c, w);
  }
  c->behind_tail = NULL;
  return rc;
}

/* The writes before the held one have reached the kernel: sends it (stamped, or plainly when
 * stamped is false), then hands libuv what waited behind it, or, once the stamped write is in
 * the kernel with its stamp to come, keeps them back until then (stamp_hold). */
static int release_held(tr_tls_uv_conn *c, bool stamped) {
  struct write_req *w = c->stamp_held;
  c->stamp_held = NULL;
  c->queued -= w->len;
  int rc = stamped ? send_marked(c, w) : hand_to_libuv(c, w);
  if (rc == 1) {
    c->stamp_hold = true;
    return 0;
  }
  return release_behind(c, rc);
}

/* Ends a stamp_hold once the stamp is in (collected from the error queue now if need be), or
 * at once with force. */
static void end_stamp_hold(tr_tls_uv_conn *c, bool force) {
  uv_os_fd_t fd;
  if (!c->stamp_hold || c->closing)
    return;
  if (!force && uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 &&
      tr_sock_stamp_sent_time(&c->stamps, fd) == 0 && c->stamps.tx_waiting)
    return;
  int rc = release_behind(c, 0);
  if (rc < 0)
    close_conn(c, rc, "sending failed: %s", uv_strerror(rc));
}

/* A stamped write: sent at once with a send stamp asked for if libuv holds nothing before it,
 * else held until it does (tls_uv.h); *sent_ns names it. While another one is held, it is an
 * ordinary write and *sent_ns = 0. */
static int submit_stamped(tr_tls_uv_conn *c, struct write_req *w, int64_t *sent_ns) {
  *sent_ns = 0;
  if (w->len == 0 || c->stamp_held != NULL || c->stamp_hold)
    return submit(c, w);
  *sent_ns = c->marked_ns = (int64_t)tr_clock_boottime_ns();
  c->marked_sent_ns = 0;
  if (c->writes_pending == 0) {
    int rc = send_marked(c, w);
    c->stamp_hold = rc == 1; /* the kernel's own queue held it */
    return rc < 0 ? rc : 0;
  }
  c->stamp_held = w;
  c->queued += w->len;
  return 0;
}

static int write_impl(tr_tls_uv_conn *c, const void *data, size_t len, int64_t *sent_ns) {
  if (c->closing)
    return TR_ERR_CLOSED;
  if (!c->established)
    return TR_ERR_STATE;
  if (c->queued >= c->max_queued) {
    c->want_drain = true;
    return TR_ERR_FULL;
  }
  if (len == 0)
    return (int)c->queued;
  /* Room for the plaintext plus record overhead (under 0.4% at 16 KiB records). */
  struct write_req *w = write_req_new(c, len + len / 256 + 256);
  if (w == NULL)
    return TR_ERR_NOMEM;
  const unsigned char *p = data;
  size_t off = 0;
  int rc = 0;
  while (off < len) {
    rc = tr_tls_write(c->tls, p + off, len - off);
    if (rc > 0)
      off += (size_t)rc;
    else if (rc != TR_ERR_AGAIN)
      goto fail;
    rc = take_cipher(c, &w);
    if (rc < 0)
      goto fail;
  }
  rc = sent_ns != NULL ? submit_stamped(c, w, sent_ns) : submit(c, w);
  if (rc < 0) {
    close_conn(c, rc, "sending failed: %s", uv_strerror(rc));
    return rc;
  }
  if (c->queued > c->max_queued / 2)
    c->want_drain = true;
  return c->queued > INT32_MAX ? INT32_MAX : (int)c->queued;

fail:
  free(w);
  if (rc == TR_ERR_NOMEM)
    close_conn(c, rc, "out of memory while writing");
  else
    close_conn(c, rc, "TLS failure while writing: %s", tr_tls_last_error(c->tls));
  return rc;
}

int tr_tls_uv_write(tr_tls_uv_conn *c, const void *data, size_t len) {
  return write_impl(c, data, len, NULL);
}

int tr_tls_uv_write_stamped(tr_tls_uv_conn *c, const void *data, size_t len, int64_t *sent_ns) {
  *sent_ns = 0;
  return write_impl(c, data, len, sent_ns);
}

int64_t tr_tls_uv_read_time(const tr_tls_uv_conn *c) { return c->read_ns; }

int64_t tr_tls_uv_read_time_checked(tr_tls_uv_conn *c, bool mark) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
    return c->read_ns;
  if (c->read_ns == c->read_clock_ns) { /* unstamped: nothing to check */
    if (mark)
      tr_sock_stamp_mark_order(&c->stamps, fd);
    return c->read_ns;
  }
  return tr_sock_stamp_reordered(&c->stamps, fd, mark) ? c->read_clock_ns : c->read_ns;
}

void tr_tls_uv_mark_order(tr_tls_uv_conn *c) {
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    tr_sock_stamp_mark_order(&c->stamps, fd);
}

int64_t tr_tls_uv_sent_time(tr_tls_uv_conn *c, int64_t sent_ns) {
  uv_os_fd_t fd;
  if (sent_ns != 0 && sent_ns == c->marked_ns)
    end_stamp_hold(c, true); /* whoever waited for the stamp is done waiting */
  if (sent_ns == 0 || sent_ns != c->marked_ns || c->marked_sent_ns == 0 || c->closing ||
      uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
    return sent_ns;
  int64_t kernel = tr_sock_stamp_sent_time(&c->stamps, fd);
  return kernel >= c->marked_sent_ns ? kernel : c->marked_sent_ns;
}

bool tr_tls_uv_sent_time_pending(tr_tls_uv_conn *c, int64_t sent_ns) {
  uv_os_fd_t fd;
  if (sent_ns == 0 || sent_ns != c->marked_ns || c->closing)
    return false;
  if (c->marked_sent_ns == 0)
    return true; /* still held */
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
    return false;
  end_stamp_hold(c, false);
  return tr_sock_stamp_sent_time(&c->stamps, fd) == 0 && c->stamps.tx_waiting;
}

size_t tr_tls_uv_queued(const tr_tls_uv_conn *c) { return c->queued; }

uint64_t tr_tls_uv_bytes_in(const tr_tls_uv_conn *c) { return c->bytes_in; }

/* ---- closing ---- */

static void admit_waiting(tr_tls_uv_server *srv);

/* Takes c off the server's waiting or handshaking list, and out of the counts. */
static void list_remove(tr_tls_uv_server *srv, tr_tls_uv_conn *c) {
  tr_tls_uv_conn **head = c->waiting ? &srv->waiting : &srv->handshaking;
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    *head = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  else if (c->waiting)
    srv->waiting_tail = c->prev;
  c->prev = c->next = NULL;
  if (c->waiting) {
    c->waiting = false;
    srv->n_waiting--;
    c->source->waiting--;
  } else {
    srv->n_handshaking--;
    c->source->active--;
  }
}

/* Takes c off its server's list (waiting or handshaking); a handshake slot freed goes to the
 * oldest connection waiting that may have it. */
static void unlink_server_conn(tr_tls_uv_conn *c) {
  tr_tls_uv_server *srv = c->server;
  if (srv == NULL)
    return;
  list_remove(srv, c);
  tr_source_limit_put(&srv->sources, c->source);
  c->source = NULL;
  c->server = NULL;
  admit_waiting(srv);
}

static void maybe_free_server(tr_tls_uv_server *srv) {
  if (srv->tcp_closed && srv->handshaking == NULL && srv->waiting == NULL) {
    tr_tls_config_unref(srv->cfg);
    free(srv);
  }
}

static void free_conn(tr_tls_uv_conn *c) {
  tr_tls_session_free(c->tls);
  free(c->held);
  free(c);
}

static void on_handle_closed(uv_handle_t *h) {
  tr_tls_uv_conn *c = h->data;
  if (--c->handles_open > 0)
    return;
  if (c->app_owned && c->cbs.on_close != NULL)
    c->cbs.on_close(c, c->close_reason, c->close_why);
  tr_tls_uv_server *srv = c->server;
  unlink_server_conn(c);
  if (srv != NULL && srv->closing)
    maybe_free_server(srv);
  if (c->stepping)
    c->handles_closed = true; /* the worker still has the session */
  else
    free_conn(c);
}

static void close_handles(tr_tls_uv_conn *c) {
  c->handles_closing = true;
  uv_close((uv_handle_t *)&c->timer, on_handle_closed);
  uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

static void refuse_busy(tr_tls_uv_conn *c);

static void on_timer(uv_timer_t *t) {
  tr_tls_uv_conn *c = t->data;
  if (c->closing) {
    close_handles(c); /* linger over: drop what could not be sent */
    return;
  }
  if (c->waiting) {
    refuse_busy(c);
    return;
  }
  if (c->server == NULL && c->bytes_in == 0) {
    close_conn(c, TR_ERR_TIMEOUT,
               "the TLS handshake did not begin within %u ms of connecting: the peer is busy "
               "or not a TLS service, or a network problem", c->start_timeout_ms);
    return;
  }
  close_conn(c, TR_ERR_TIMEOUT,
             "TLS handshake not finished after %u ms (%llu bytes received): a slow or non-TLS "
             "peer, or a network problem", c->handshake_timeout_ms,
             (unsigned long long)c->bytes_in);
}

/* A server connection the peer left or let run out after its handshake began here: public-key
 * work for nobody, which admission exists to avoid (tls_uv.h). */
static bool abandoned(const tr_tls_uv_conn *c, int reason) {
  return c->server != NULL && !c->waiting &&
         (reason == TR_ERR_CLOSED || reason == TR_ERR_TIMEOUT || reason == UV_ECONNRESET ||
          reason == UV_EPIPE);
}

/* The one way a connection ends: records the first reason, stops reading, and closes the
 * handles once the queued writes are out (on_write) or the linger timer fires (on_timer). */
static void close_conn(tr_tls_uv_conn *c, int reason, const char *fmt, ...) {
  if (c->closing)
    return;
  c->closing = true;
  c->close_reason = reason;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->close_why, sizeof c->close_why, fmt, ap);
  va_end(ap);
  if (!c->app_owned && c->server != NULL && !c->server->closing) {
    c->server->stats.refused++;
    c->server->stats.abandoned += abandoned(c, reason);
    if (reason != TR_ERR_BUSY) /* those are logged once per storm (refuse_busy) */
      TR_WARN("tls", "refused connection from %s: %s", c->peer_addr, c->close_why);
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  if (c->stepping) /* if the step has not started, it never will (step_done says so) */
    uv_cancel((uv_req_t *)&c->step_work);
  if (c->stamp_held != NULL)
    release_held(c, false); /* in order, before the alert; no stamp matters any more */
  else if (c->stamp_hold)
    release_behind(c, 0);
  /* Ship the alert or close_notify, unless the socket itself failed or a worker has the
   * session (a handshake cut short: nothing to say). */
  if (c->tls != NULL && !c->stepping &&
      (reason == TR_ERR_TLS || reason == TR_ERR_TIMEOUT || reason == 0 || reason == TR_ERR_CLOSED))
    flush_cipher(c);
  if (c->writes_pending > 0)
    uv_timer_start(&c->timer, on_timer, TR_TLS_UV_CLOSE_LINGER_MS, 0);
  else
    close_handles(c);
}

void tr_tls_uv_close(tr_tls_uv_conn *c) {
  if (c->closing)
    return;
  /* close_notify only fails when the session already failed; then there is nothing to say.
   * During the handshake there is no session to close. */
  int rc = c->established ? tr_tls_close_notify(c->tls) : 0;
  while (rc == TR_ERR_AGAIN && flush_cipher(c) == 0)
    rc = tr_tls_close_notify(c->tls);
  close_conn(c, 0, "closed by this side");
}

/* ---- reading and the handshake ---- */

static void handshake_complete(tr_tls_uv_conn *c) {
  uv_timer_stop(&c->timer);
  c->established = true;
  unlink_server_conn(c);
  c->app_owned = true;
  if (c->cbs.on_connect != NULL)
    c->cbs.on_connect(c);
}

/* The peer closed the TCP connection (after the bytes before it were read). */
static void close_on_eof(tr_tls_uv_conn *c) {
  if (c->established)
    close_conn(c, TR_ERR_CLOSED, "the peer closed the TCP connection without close_notify");
  else if (c->server == NULL && c->bytes_in == 0)
    close_conn(c, TR_ERR_BUSY, "closed by the peer before its TLS handshake began: it is busy "
               "(or not a TLS service); try again later");
  else
    close_conn(c, TR_ERR_CLOSED, "the peer closed the TCP connection during the handshake");
}

static void close_on_tls_error(tr_tls_uv_conn *c, int rc) {
  if (rc == TR_ERR_CLOSED)
    close_conn(c, rc, "the peer closed the TLS session");
  else
    close_conn(c, rc, "%s", tr_tls_last_error(c->tls));
}

/* One step of the handshake on the input the session has; notes which thread ran it. */
static int handshake_step(tr_tls_uv_conn *c) {
  int rc = tr_tls_handshake(c->tls);
  uv_thread_t self = uv_thread_self();
  c->step_on_loop = uv_thread_equal(&self, &c->loop_thread);
  return rc;
}

/* Counts the step that just ended in the server's figures (on the loop's thread). */
static void count_step(tr_tls_uv_conn *c) {
  if (c->server == NULL)
    return;
  if (c->step_on_loop)
    c->server->stats.steps_on_loop++;
  else
    c->server->stats.steps_on_workers++;
}

static void run_step(uv_work_t *w) {
  tr_tls_uv_conn *c = w->data;
  if (c->step_delay_ms > 0)
    uv_sleep(c->step_delay_ms);
  c->step_rc = handshake_step(c);
}

static void step_done(uv_work_t *w, int status);

/* Hands the session to a worker for one handshake step. The deadline stops meanwhile: it counts
 * the time we wait for the peer, not for our own workers (tls_uv.h). */
static void queue_step(tr_tls_uv_conn *c) {
  c->step_work.data = c;
  int rc = uv_queue_work(c->tcp.loop, &c->step_work, run_step, step_done);
  if (rc < 0) {
    close_conn(c, rc, "cannot run the TLS handshake: %s", uv_strerror(rc));
    return;
  }
  c->stepping = true;
  c->deadline_left_ms = uv_timer_get_due_in(&c->timer);
  uv_timer_stop(&c->timer);
}

/* Runs the session on the input it has: the handshake (a step on a worker, see the top of the
 * file), then plaintext to on_read until it needs more input or reading is paused. Returns
 * false once the connection is closing. */
static bool drive(tr_tls_uv_conn *c) {
  if (!c->established) {
    if (!c->stepping)
      queue_step(c);
    return !c->closing;
  }
  unsigned char plain[TR_TLS_RECORD_PLAINTEXT]; /* on_read's data lives for the call */
  while (!c->read_paused) {
    int n = tr_tls_read(c->tls, plain, sizeof plain);
    if (n == TR_ERR_AGAIN)
      return true;
    if (n < 0) {
      close_on_tls_error(c, n);
      return false;
    }
    c->cbs.on_read(c, plain, (size_t)n);
    if (c->closing)
      return false;
  }
  return true;
}

/* Keeps data[0, len) (len may be 0) as the held input, in place of the old one, which data may
 * point into. */
static int hold(tr_tls_uv_conn *c, const unsigned char *data, size_t len) {
  unsigned char *copy = NULL;
  if (len > 0 && (copy = malloc(len)) == NULL)
    return TR_ERR_NOMEM;
  if (len > 0)
    memcpy(copy, data, len);
  free(c->held);
  c->held = copy;
  c->held_len = len;
  return 0;
}

/* Appends data[0, len) to the held input while a handshake step has the session. */
static void hold_more(tr_tls_uv_conn *c, const unsigned char *data, size_t len) {
  if (c->held_len + len > HANDSHAKE_INPUT_MAX) {
    close_conn(c, TR_ERR_PROTO, "more than %d bytes sent during the TLS handshake: not a TLS "
               "client", HANDSHAKE_INPUT_MAX);
    return;
  }
  unsigned char *grown = realloc(c->held, c->held_len + len);
  if (grown == NULL) {
    close_conn(c, TR_ERR_NOMEM, "out of memory for %zu bytes of handshake input", len);
    return;
  }
  memcpy(grown + c->held_len, data, len);
  c->held = grown;
  c->held_len += len;
}

/* Feeds data[0, len) to the session and drives it. If reading pauses on the way, what was not
 * fed becomes the held input. Returns false once the connection is closing. */
static bool feed_and_drive(tr_tls_uv_conn *c, const unsigned char *data, size_t len) {
  size_t off = 0;
  /* The session's input buffer is smaller than a read; driving it drains it. */
  while (off < len) {
    off += tr_tls_feed_cipher(c->tls, data + off, len - off);
    if (!drive(c))
      return false;
    if (c->read_paused || c->stepping)
      break;
  }
  int rc = hold(c, data + off, len - off);
  if (rc < 0) {
    close_conn(c, rc, "out of memory for %zu bytes of input held while reading is paused",
               len - off);
    return false;
  }
  if (c->stepping)
    return true; /* the step's end sends what it produces */
  rc = flush_cipher(c);
  if (rc < 0) {
    close_conn(c, rc, "sending failed: %s", tr_strerror(rc));
    return false;
  }
  return true;
}

/* Reads the socket into read_buf with the kernel's receive time of the newest bytes read (TCP
 * reports the last segment's), or the time now if it has none: never earlier than arrival. */
static void own_read(tr_tls_uv_conn *c) {
  c->pre_len = 0;
  c->pre_err = 0;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0) {
    c->pre_err = UV_EBADF;
    return;
  }
  int64_t arrival = 0;
  ssize_t n = tr_sock_stamp_recv(&c->stamps, fd, read_buf, READ_BUFFER, &arrival);
  if (n < 0) {
    c->pre_err = n == -EAGAIN || n == -EWOULDBLOCK ? 0 : uv_translate_sys_error((int)-n);
    return;
  }
  if (n == 0) {
    c->pre_err = UV_EOF;
    return;
  }
  c->pre_len = (size_t)n;
  c->pre_clock_ns = (int64_t)tr_clock_boottime_ns();
  c->pre_ns = arrival != 0 ? arrival : c->pre_clock_ns;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  tr_tls_uv_conn *c = h->data;
  if (read_buf == NULL && (read_buf = malloc(READ_BUFFER)) == NULL) {
    c->pre_err = UV_ENOBUFS; /* with stamps.rx, on_tcp_read takes it from here */
    c->pre_len = 0;
    *buf = uv_buf_init(NULL, 0); /* without, libuv reports UV_ENOBUFS itself */
    return;
  }
  if (!c->stamps.rx) {
    *buf = uv_buf_init((char *)read_buf, READ_BUFFER);
    return;
  }
  /* libuv reads with read(), which drops the timestamp: read here, and hand libuv an empty
   * buffer, which makes it call on_tcp_read with UV_ENOBUFS and keep reading. */
  own_read(c);
  *buf = uv_buf_init(NULL, 0);
}

static void on_tcp_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
  tr_tls_uv_conn *c = stream->data;
  int64_t stamp = 0, clock = 0;
  if (nread == UV_ENOBUFS && c->stamps.rx) {
    nread = c->pre_err != 0 ? c->pre_err : (ssize_t)c->pre_len;
    stamp = c->pre_ns;
    clock = c->pre_clock_ns;
  }
  end_stamp_hold(c, false); /* a wake-up with no data may be the stamp it waits for */
  if (nread == 0 || c->closing)
    return;
  if (nread < 0) {
    if (nread == UV_ECONNRESET && c->server == NULL && !c->established && c->bytes_in == 0)
      close_on_eof(c); /* a server refusing us resets: it closed with our hello unread */
    else if (nread != UV_EOF)
      close_conn(c, (int)nread, "receiving failed: %s", uv_strerror((int)nread));
    else if (c->stepping && c->server != NULL && c->steps == 0) /* its step is cancelled */
      close_conn(c, TR_ERR_CLOSED, "the peer closed the TCP connection before its handshake "
                 "began here: it gave up waiting");
    else if (c->stepping)
      c->eof_in_handshake = true; /* the bytes before it (an alert saying why) come first */
    else
      close_on_eof(c);
    return;
  }
  /* A client's first bytes from the server: it began the handshake, whose own deadline runs
   * from now (tls_uv.h). */
  if (c->server == NULL && !c->established && c->bytes_in == 0)
    uv_timer_start(&c->timer, on_timer, c->handshake_timeout_ms, 0);
  /* First, before any decryption: the arrival time of every message completed by this read. */
  c->read_clock_ns = clock != 0 ? clock : (int64_t)tr_clock_boottime_ns();
  c->read_ns = stamp != 0 ? stamp : c->read_clock_ns;
  c->bytes_in += (uint64_t)nread;
  (void)buf; /* always read_buf (on_alloc) */
  if (c->stepping)
    hold_more(c, read_buf, (size_t)nread);
  else
    feed_and_drive(c, read_buf, (size_t)nread);
}

/* ---- pausing ---- */

int tr_tls_uv_pause_read(tr_tls_uv_conn *c) {
  if (c->closing)
    return TR_ERR_CLOSED;
  if (!c->app_owned || !c->established)
    return TR_ERR_STATE;
  if (c->read_paused)
    return 0;
  c->read_paused = true;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    tr_sock_stamp_drain(&c->stamps, fd); /* a stamp left queued would signal the socket */
  if (c->resume_queued) {
    uv_timer_stop(&c->timer);
    c->resume_queued = false;
  }
  uv_read_stop((uv_stream_t *)&c->tcp);
  return 0;
}

/* Delivers what arrived before the pause (plaintext the session holds, then the held
 * ciphertext), then reads the socket again, unless on_read paused or closed meanwhile. */
static void on_resume(uv_timer_t *t) {
  tr_tls_uv_conn *c = t->data;
  c->resume_queued = false;
  if (c->closing || c->read_paused)
    return;
  if (!drive(c) || c->read_paused)
    return;
  if (!feed_and_drive(c, c->held, c->held_len) || c->read_paused)
    return;
  int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_tcp_read);
  if (rc < 0)
    close_conn(c, rc, "cannot read: %s", uv_strerror(rc));
}

int tr_tls_uv_resume_read(tr_tls_uv_conn *c) {
  if (c->closing)
    return TR_ERR_CLOSED;
  if (!c->read_paused)
    return 0;
  c->read_paused = false;
  /* From the loop, not from here: the caller may be inside a callback of this connection. */
  c->resume_queued = true;
  uv_timer_start(&c->timer, on_resume, 0, 0);
  return 0;
}

bool tr_tls_uv_read_is_paused(const tr_tls_uv_conn *c) { return c->read_paused; }

/* The loop's side of a handshake step: sends what it produced; once the handshake is done,
 * shows the connection to the application and delivers what followed it; then feeds the input
 * held meanwhile (which may take the next step) or reads again. */
static void step_done(uv_work_t *w, int status) {
  tr_tls_uv_conn *c = w->data;
  c->stepping = false;
  if (status != UV_ECANCELED) { /* cancelled: the connection closed before the step began */
    c->steps++;
    count_step(c);
  }
  if (c->handles_closed) {
    free_conn(c);
    return;
  }
  if (c->closing)
    return;
  uv_timer_start(&c->timer, on_timer, c->deadline_left_ms > 0 ? c->deadline_left_ms : 1, 0);
  int rc = c->step_rc;
  if (rc < 0 && rc != TR_ERR_AGAIN) {
    close_on_tls_error(c, rc);
    return;
  }
  int sent = flush_cipher(c);
  if (sent < 0) {
    close_conn(c, sent, "sending failed: %s", tr_strerror(sent));
    return;
  }
  if (rc == 0) {
    handshake_complete(c);
    if (c->closing || !drive(c) || c->read_paused)
      return;
  }
  if (feed_and_drive(c, c->held, c->held_len) && c->eof_in_handshake && !c->stepping)
    close_on_eof(c);
}

/* Common setup of both sides once the TCP connection exists. */
static void start_session(tr_tls_uv_conn *c) {
  uv_tcp_nodelay(&c->tcp, 1);
  /* Kernel send and receive times: the time userspace reads is late by the reader's wake-up,
   * which on a VM differs between two hosts by tens of microseconds, and a write's time is
   * early by the kernel's path to the wire (docs/timeline.md). Before the first byte goes out,
   * as the send stamps' byte count requires. */
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    tr_sock_stamp_enable(&c->stamps, fd);
  uv_tcp_keepalive(&c->tcp, 1, KEEPALIVE_DELAY_S);
  int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_tcp_read);
  if (rc < 0) {
    close_conn(c, rc, "cannot read: %s", uv_strerror(rc));
    return;
  }
  drive(c); /* the first step (a client's hello) */
}

/* A connection with both handles initialised and its timer counting timeout_ms; its session is
 * made now for a client (cfg), at admission for a server (cfg NULL). */
static int conn_new(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                    const struct tr_tls_uv_options *opts, const struct tr_tls_uv_callbacks *cbs,
                    void *data, unsigned timeout_ms, tr_tls_uv_conn **out) {
  tr_tls_uv_conn *c = calloc(1, sizeof *c);
  if (c == NULL)
    return TR_ERR_NOMEM;
  int rc = cfg != NULL ? tr_tls_session_new(cfg, server_name, &c->tls) : 0;
  if (rc < 0) {
    free(c);
    return rc;
  }
  c->cbs = *cbs;
  c->data = data;
  c->loop_thread = uv_thread_self();
  c->handshake_timeout_ms = opts->handshake_timeout_ms;
  c->start_timeout_ms = opts->start_timeout_ms;
  c->step_delay_ms = opts->test_step_delay_ms;
  c->max_queued = opts->max_queued;
  snprintf(c->peer_addr, sizeof c->peer_addr, "(unknown peer)");
  /* Neither init can fail for an AF_UNSPEC TCP handle or a timer. */
  uv_tcp_init(loop, &c->tcp);
  uv_timer_init(loop, &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles_open = 2;
  uv_timer_start(&c->timer, on_timer, timeout_ms, 0);
  *out = c;
  return 0;
}

/* ---- client ---- */

static void on_connected(uv_connect_t *req, int status) {
  tr_tls_uv_conn *c = req->data;
  if (c->closing)
    return;
  if (status < 0) {
    close_conn(c, status, "%s", uv_strerror(status)); /* the caller names the peer */
    return;
  }
  start_session(c);
}

int tr_tls_uv_connect(uv_loop_t *loop, tr_tls_config *cfg, const char *server_name,
                      const struct sockaddr *addr, const struct tr_tls_uv_options *opts,
                      const struct tr_tls_uv_callbacks *cbs, void *data, tr_tls_uv_conn **out) {
  if (tr_tls_config_role(cfg) != TR_TLS_CLIENT || cbs == NULL || cbs->on_read == NULL ||
      cbs->on_close == NULL || addr == NULL)
    return TR_ERR_INVAL;
  struct tr_tls_uv_options o = {0};
  apply_defaults(&o, opts);
  tr_tls_uv_conn *c;
  int rc = conn_new(loop, cfg, server_name, &o, cbs, data, o.start_timeout_ms, &c);
  if (rc < 0)
    return rc;
  c->app_owned = true;
  format_addr(addr, c->peer_addr, sizeof c->peer_addr);
  c->connect_req.data = c;
  rc = uv_tcp_connect(&c->connect_req, &c->tcp, addr, on_connected);
  if (rc < 0) /* reported through on_close like any other failure; the caller names the peer */
    close_conn(c, rc, "%s", uv_strerror(rc));
  *out = c;
  return 0;
}

/* ---- server ---- */

static void free_handle(uv_handle_t *h) { free(h); }

/* Takes the pending connection off the listener and closes it: libuv stops accepting until the
 * pending one is taken. */
static void reject(uv_stream_t *listener) {
  uv_tcp_t *t = malloc(sizeof *t);
  if (t == NULL)
    return;
  uv_tcp_init(listener->loop, t);
  uv_accept(listener, (uv_stream_t *)t);
  uv_close((uv_handle_t *)t, free_handle);
}

static void link_first(tr_tls_uv_conn **head, tr_tls_uv_conn *c) {
  c->prev = NULL;
  c->next = *head;
  if (c->next != NULL)
    c->next->prev = c;
  *head = c;
}

/* Starts the handshake of c, which waited (or arrives while a slot is free): its session, its
 * deadline, its first read. */
static void admit(tr_tls_uv_server *srv, tr_tls_uv_conn *c) {
  list_remove(srv, c);
  link_first(&srv->handshaking, c);
  srv->n_handshaking++;
  c->source->active++;
  int rc = tr_tls_session_new(srv->cfg, NULL, &c->tls);
  if (rc < 0) {
    close_conn(c, rc, "cannot start a TLS session: %s", tr_strerror(rc));
    return;
  }
  uv_timer_start(&c->timer, on_timer, c->handshake_timeout_ms, 0);
  start_session(c);
}

/* Admits the oldest waiting connections while handshake slots are free, passing over those
 * whose address already runs max_handshakes_per_source (so one address cannot take every slot:
 * the others' connections go first); says once when a storm that refused connections is over.
 * The walk passes at most the waiting connections of addresses at their limit
 * (max_waiting_per_source each). */
static void admit_waiting(tr_tls_uv_server *srv) {
  tr_tls_uv_conn *next;
  for (tr_tls_uv_conn *c = srv->waiting;
       c != NULL && !srv->closing && srv->n_handshaking < srv->opts.max_handshakes; c = next) {
    next = c->next; /* admit moves c to the handshaking list; closing it frees nothing now */
    if (!c->closing && c->source->active < srv->opts.max_handshakes_per_source)
      admit(srv, c);
  }
  if (srv->waiting == NULL && srv->storm_refused > 0) {
    TR_INFO("tls", "no connection waits for a handshake any more: %llu refused while they did",
            (unsigned long long)srv->storm_refused);
    srv->storm_refused = 0;
  }
}

/* Closes c, which found no handshake slot in time, before anything was sent: its client
 * reports TR_ERR_BUSY and comes back later. Logged once per storm. */
static void refuse_busy(tr_tls_uv_conn *c) {
  tr_tls_uv_server *srv = c->server;
  srv->stats.refused_busy++;
  if (srv->storm_refused++ == 0)
    TR_WARN("tls", "%u TLS handshakes running and %u connections waiting: refusing those that "
            "waited %u ms (or beyond %u waiting), %s the first; they come back later (counted "
            "as refused_busy; the end of the wait is logged)", srv->n_handshaking,
            srv->n_waiting, srv->opts.admission_wait_ms, TR_TLS_UV_MAX_WAITING, c->peer_addr);
  close_conn(c, TR_ERR_BUSY, "no TLS handshake slot within %u ms", srv->opts.admission_wait_ms);
}

/* Closes c, whose address already holds max_waiting_per_source connections waiting
 * besides its handshakes, before anything was sent: its client reports TR_ERR_BUSY. Logged once
 * per address while it holds connections here, with the flags to raise when it is agents
 * behind one NAT address rather than a hog (the counts leave c out: it is not kept). */
static void refuse_source(tr_tls_uv_server *srv, tr_tls_uv_conn *c) {
  srv->stats.refused_source++;
  if (!c->source->warned) {
    c->source->warned = true;
    TR_WARN("tls", "%s holds %u TLS handshakes and %u connections waiting, the most one address "
            "may: refusing its further connections until they end (counted as refused_source; "
            "if many agents share this address, raise --max-waiting-per-source and "
            "--max-handshakes-per-source)",
            c->peer_addr, c->source->active, c->source->waiting - 1);
  }
  close_conn(c, TR_ERR_BUSY, "%u connections from this address already wait for a TLS handshake",
             c->source->waiting - 1);
}

/* Takes the connection libuv accepted: starts its handshake if a slot is free (and its
 * address has fewer than max_handshakes_per_source running), else keeps it waiting
 * (tls_uv.h). */
static void accept_one(tr_tls_uv_server *srv) {
  uv_stream_t *listener = (uv_stream_t *)&srv->tcp;
  tr_tls_uv_conn *c;
  int rc = conn_new(srv->loop, NULL, NULL, &srv->opts, &srv->cbs, srv->data,
                    srv->opts.admission_wait_ms, &c);
  if (rc < 0) {
    TR_WARN("tls", "cannot take a new connection: %s", tr_strerror(rc));
    srv->stats.refused++;
    reject(listener);
    return;
  }
  rc = uv_accept(listener, (uv_stream_t *)&c->tcp);
  if (rc < 0) {
    srv->stats.refused++;
    close_conn(c, rc, "accept failed: %s", uv_strerror(rc));
    return;
  }
  struct sockaddr_storage ss;
  int len = sizeof ss;
  bool named = uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0;
  if (named)
    format_addr((struct sockaddr *)&ss, c->peer_addr, sizeof c->peer_addr);
  c->source = tr_source_limit_get(&srv->sources, named ? (struct sockaddr *)&ss : NULL);
  if (c->source == NULL) {
    srv->stats.refused++;
    close_conn(c, TR_ERR_NOMEM, "out of memory for its address's count");
    return;
  }
  c->server = srv;
  c->waiting = true; /* at the tail of the waiting list */
  c->prev = srv->waiting_tail;
  if (c->prev != NULL)
    c->prev->next = c;
  else
    srv->waiting = c;
  srv->waiting_tail = c;
  srv->n_waiting++;
  c->source->waiting++;
  admit_waiting(srv);
  if (!c->waiting)
    return;
  if (c->source->waiting > srv->opts.max_waiting_per_source)
    refuse_source(srv, c);
  else if (srv->n_waiting > TR_TLS_UV_MAX_WAITING)
    refuse_busy(c);
}

static void on_connection(uv_stream_t *listener, int status) {
  tr_tls_uv_server *srv = listener->data;
  if (status < 0) {
    TR_WARN("tls", "accepting a connection failed: %s", uv_strerror(status));
    return;
  }
  accept_one(srv);
}

int tr_tls_uv_listen(uv_loop_t *loop, tr_tls_config *cfg, const struct sockaddr *addr,
                     const struct tr_tls_uv_options *opts, const struct tr_tls_uv_callbacks *cbs,
                     void *data, tr_tls_uv_server **out) {
  if (tr_tls_config_role(cfg) != TR_TLS_SERVER || cbs == NULL || cbs->on_read == NULL ||
      cbs->on_close == NULL || addr == NULL)
    return TR_ERR_INVAL;
  tr_tls_uv_server *srv = calloc(1, sizeof *srv);
  if (srv == NULL)
    return TR_ERR_NOMEM;
  srv->loop = loop;
  tr_source_limit_init(&srv->sources);
  srv->cfg = tr_tls_config_ref(cfg);
  apply_defaults(&srv->opts, opts);
  srv->cbs = *cbs;
  srv->data = data;
  uv_tcp_init(loop, &srv->tcp);
  srv->tcp.data = srv;
  int rc = uv_tcp_bind(&srv->tcp, addr, 0);
  if (rc == 0)
    rc = uv_listen((uv_stream_t *)&srv->tcp, LISTEN_BACKLOG, on_connection);
  if (rc < 0)
    goto fail;
  *out = srv;
  return 0;

fail:
  /* The handle is initialised: it must be closed, and the server freed in the callback. */
  tr_tls_uv_server_close(srv);
  return rc;
}

int tr_tls_uv_server_port(const tr_tls_uv_server *srv) {
  struct sockaddr_storage ss;
  int len = sizeof ss;
  int rc = uv_tcp_getsockname(&srv->tcp, (struct sockaddr *)&ss, &len);
  if (rc < 0)
    return rc;
  if (ss.ss_family == AF_INET)
    return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return TR_ERR_UNSUPPORTED;
}

void tr_tls_uv_server_set_config(tr_tls_uv_server *srv, tr_tls_config *cfg) {
  tr_tls_config *old = srv->cfg;
  srv->cfg = tr_tls_config_ref(cfg);
  tr_tls_config_unref(old);
}

void tr_tls_uv_server_stats(const tr_tls_uv_server *srv, struct tr_tls_uv_server_stats *out) {
  *out = srv->stats;
}

static void on_server_closed(uv_handle_t *h) {
  tr_tls_uv_server *srv = h->data;
  srv->tcp_closed = true;
  maybe_free_server(srv);
}

void tr_tls_uv_server_close(tr_tls_uv_server *srv) {
  if (srv->closing)
    return;
  srv->closing = true;
  uv_close((uv_handle_t *)&srv->tcp, on_server_closed);
  for (tr_tls_uv_conn *c = srv->handshaking; c != NULL; c = c->next)
    close_conn(c, TR_ERR_CLOSED, "the server is shutting down");
  for (tr_tls_uv_conn *c = srv->waiting; c != NULL; c = c->next)
    close_conn(c, TR_ERR_CLOSED, "the server is shutting down");
}

/* ---- accessors ---- */

const char *tr_tls_uv_peer_name(const tr_tls_uv_conn *c) {
  return c->established ? tr_tls_peer_name(c->tls) : NULL;
}
const tr_tls_session *tr_tls_uv_session(const tr_tls_uv_conn *c) {
  return c->established ? c->tls : NULL;
}
const char *tr_tls_uv_peer_address(const tr_tls_uv_conn *c) { return c->peer_addr; }
const char *tr_tls_uv_ciphersuite(const tr_tls_uv_conn *c) {
  return c->established ? tr_tls_ciphersuite(c->tls) : NULL;
}
void *tr_tls_uv_get_data(const tr_tls_uv_conn *c) { return c->data; }

uv_loop_t *tr_tls_uv_loop(const tr_tls_uv_conn *c) { return c->tcp.loop; }
void tr_tls_uv_set_data(tr_tls_uv_conn *c, void *data) { c->data = data; }
