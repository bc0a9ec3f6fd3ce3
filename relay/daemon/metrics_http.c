/* metrics_http.c: libmicrohttpd in a libuv loop, serving /metrics, /healthz, /readyz
 * (metrics_http.h). */
#include "relay/daemon/metrics_http.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/hostport.h"
#include "relay/base/tr_error.h"

/* libmicrohttpd is loaded when an endpoint starts, not linked: a daemon without
 * --metrics-listen maps neither it nor GnuTLS and the libraries GnuTLS pulls in (about 2 MiB
 * of an idle agent's RSS), and a static build uses the system's library the same way. */
#define MHD_SONAME "libmicrohttpd.so.12"
static struct {
  void *lib;
  __typeof__(&MHD_start_daemon) start_daemon;
  __typeof__(&MHD_stop_daemon) stop_daemon;
  __typeof__(&MHD_get_daemon_info) get_daemon_info;
  __typeof__(&MHD_run) run;
  __typeof__(&MHD_get_timeout) get_timeout;
  __typeof__(&MHD_create_response_from_buffer) create_response_from_buffer;
  __typeof__(&MHD_add_response_header) add_response_header;
  __typeof__(&MHD_queue_response) queue_response;
  __typeof__(&MHD_destroy_response) destroy_response;
  __typeof__(&MHD_lookup_connection_value) lookup_connection_value;
} mhd;

/* Loads the library once (the loop's thread only). 0, or TR_ERR_CONFIG with err set. */
static int load_mhd(char *err, size_t errlen) {
  if (mhd.lib)
    return 0;
  void *lib = dlopen(MHD_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(err, errlen, "cannot load %s (apt-get install libmicrohttpd12): %s", MHD_SONAME,
             dlerror());
    return TR_ERR_CONFIG;
  }
#define SYM(f)                                                                                    \
  if (!(*(void **)&mhd.f = dlsym(lib, "MHD_" #f))) {                                               \
    snprintf(err, errlen, "%s has no MHD_" #f, MHD_SONAME);                                       \
    dlclose(lib);                                                                                 \
    return TR_ERR_CONFIG;                                                                         \
  }
  SYM(start_daemon)
  SYM(stop_daemon)
  SYM(get_daemon_info)
  SYM(run)
  SYM(get_timeout)
  SYM(create_response_from_buffer)
  SYM(add_response_header)
  SYM(queue_response)
  SYM(destroy_response)
  SYM(lookup_connection_value)
#undef SYM
  mhd.lib = lib;
  return 0;
}

/* Connections at once, and from one address. 16 in all let 16 slow clients (a stuck scraper,
 * or anyone who reaches the port) keep the kubelet's /healthz out, and the liveness probe then
 * restarted a healthy daemon (issue 39). Now one address holds at most 8, and 256 in all leave
 * room for 30 such addresses besides the probes; MHD's pool is 32 KiB a connection, so 8 MiB
 * at most. */
#define MAX_CONNECTIONS 256
#define MAX_PER_ADDRESS 8
#define IDLE_TIMEOUT_S 10

struct tr_metrics_http {
  struct MHD_Daemon *mhd;
  struct tr_metrics_handlers h;
  uv_poll_t poll;
  uv_timer_t timer;
  int open_handles;
  unsigned port;
  void (*done)(void *data);
  void *done_data;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type,
                             void *body, size_t len, enum MHD_ResponseMemoryMode mode) {
  struct MHD_Response *r = mhd.create_response_from_buffer(len, body, mode);
  if (!r)
    return MHD_NO;
  mhd.add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  enum MHD_Result rc = mhd.queue_response(c, status, r);
  mhd.destroy_response(r);
  return rc;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status, const char *body) {
  return reply(c, status, "text/plain; charset=utf-8", (void *)body, strlen(body),
               MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **state) {
  tr_metrics_http *m = cls;
  (void)version;
  (void)upload;
  if (*upload_len)
    return MHD_NO; /* a body on a GET: not ours */
  (void)state;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
    return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET\n");
  if (strcmp(url, "/metrics") == 0) {
    struct tr_metrics_request req = {.host_series = true};
    const char *hosts = mhd.lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "hosts");
    if (hosts != NULL && strcmp(hosts, "none") == 0)
      req.host_series = false;
    else if (hosts != NULL && strcmp(hosts, "all") != 0)
      return text(c, MHD_HTTP_BAD_REQUEST, "hosts= takes all (the default) or none\n");
    tr_prom_text t = {0};
    m->h.render(m->h.data, &req, &t);
    if (t.failed) {
      tr_prom_text_free(&t);
      return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    }
    /* MHD frees the buffer with the response. */
    return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", t.buf, t.len,
                 MHD_RESPMEM_MUST_FREE);
  }
  if (strcmp(url, "/healthz") == 0)
    return text(c, MHD_HTTP_OK, "ok\n");
  if (strcmp(url, "/readyz") == 0) {
    const char *why = m->h.not_ready ? m->h.not_ready(m->h.data) : NULL;
    return why ? text(c, MHD_HTTP_SERVICE_UNAVAILABLE, why) : text(c, MHD_HTTP_OK, "ready\n");
  }
  return text(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n");
}

static void on_timer(uv_timer_t *t);

/* Runs MHD, then arms the timer for its next timeout (idle connections). */
static void run(tr_metrics_http *m) {
  mhd.run(m->mhd);
  MHD_UNSIGNED_LONG_LONG ms;
  if (mhd.get_timeout(m->mhd, &ms) == MHD_YES)
    uv_timer_start(&m->timer, on_timer, ms, 0);
  else
    uv_timer_stop(&m->timer);
}

static void on_timer(uv_timer_t *t) { run(t->data); }

static void on_readable(uv_poll_t *p, int status, int events) {
  (void)status;
  (void)events;
  run(p->data);
}

static int parse_listen(const char *listen, struct sockaddr_storage *ss, char *err, size_t errlen) {
  struct tr_hostport hp;
  memset(ss, 0, sizeof *ss);
  if (tr_hostport_parse(listen, true, &hp) != 0) {
    snprintf(err, errlen, "'%s' is not ADDR:PORT", listen);
    return TR_ERR_CONFIG;
  }
  struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, hp.host, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)hp.port);
  } else if (inet_pton(AF_INET6, hp.host, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)hp.port);
  } else {
    snprintf(err, errlen, "'%s': give an IP address (e.g. 127.0.0.1:9464), not a name", listen);
    return TR_ERR_CONFIG;
  }
  return 0;
}

int tr_metrics_http_start(uv_loop_t *loop, const char *listen, const struct tr_metrics_handlers *h,
                          tr_metrics_http **out, char *err, size_t errlen) {
  struct sockaddr_storage ss;
  int rc = parse_listen(listen, &ss, err, errlen);
  if (rc == 0)
    rc = load_mhd(err, errlen);
  if (rc < 0)
    return rc;
  tr_metrics_http *m = calloc(1, sizeof *m);
  if (!m)
    return TR_ERR_NOMEM;
  m->h = *h;
  unsigned flags = MHD_USE_EPOLL | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  m->mhd = mhd.start_daemon(flags, 0, NULL, NULL, on_request, m, MHD_OPTION_SOCK_ADDR, &ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MAX_PER_ADDRESS,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                            MHD_OPTION_END);
  const union MHD_DaemonInfo *fd_info =
      m->mhd ? mhd.get_daemon_info(m->mhd, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
  const union MHD_DaemonInfo *port_info =
      m->mhd ? mhd.get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT) : NULL;
  if (!fd_info || !port_info) {
    snprintf(err, errlen, "cannot serve metrics on %s (address in use, or not this host's?)",
             listen);
    if (m->mhd)
      mhd.stop_daemon(m->mhd);
    free(m);
    return TR_ERR_CONFIG;
  }
  m->port = port_info->port;
  uv_timer_init(loop, &m->timer);
  m->timer.data = m;
  uv_poll_init(loop, &m->poll, fd_info->epoll_fd);
  m->poll.data = m;
  m->open_handles = 2;
  uv_poll_start(&m->poll, UV_READABLE, on_readable);
  *out = m;
  return 0;
}

unsigned tr_metrics_http_port(const tr_metrics_http *m) { return m->port; }

static void on_closed(uv_handle_t *h) {
  tr_metrics_http *m = h->data;
  if (--m->open_handles > 0)
    return;
  mhd.stop_daemon(m->mhd); /* after the poll handle let go of its epoll fd */
  void (*done)(void *) = m->done;
  void *data = m->done_data;
  free(m);
  if (done)
    done(data);
}

void tr_metrics_http_close(tr_metrics_http *m, void (*done)(void *data), void *data) {
  m->done = done;
  m->done_data = data;
  uv_close((uv_handle_t *)&m->poll, on_closed);
  uv_close((uv_handle_t *)&m->timer, on_closed);
}
