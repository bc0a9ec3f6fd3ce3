/* service_daemon.c: tracerelay-service assembled (see service_daemon.h): service state
 * (session.c), the consumer port (consumer_port.c) and the agents' link server (link_server.c)
 * on one loop; or, as a regional (--upstream), the forwarding of agents (regional.c) and an
 * agent of its own (agent/agent.h) for its machine and clock.
 *
 * Shutdown order matters: sessions are flushed first while the agents are still connected,
 * then ended (their consumers get an error saying why), then the consumer socket closes (which
 * frees the sessions), and only then the link server stops. The host table (hosts.h), which
 * the sessions, the status, the metrics and the link server share, must outlive every session
 * that points at its hosts, and it and the service state must outlive the link server, which
 * reports its last disconnects from the loop after tr_link_server_stop: hence
 * tr_service_daemon_free, which frees the table, once the loop has ended. */
#include "service/service_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "relay/base/byte_size.h"
#include "relay/base/log.h"
#include "relay/link/tls.h"
#include "relay/base/tr_error.h"
#include "agent/agent.h"
#include "service/consumer_port.h"
#include "service/hosts.h"
#include "service/link_server.h"
#include "service/regional.h"
#include "service/regional_status.h"
#include "relay/daemon/cert_expiry.h"
#include "relay/daemon/metrics_http.h"
#include "service/metrics.h"

#define SHUTDOWN_READ_MS 5000u /* consumers may read what was flushed for this long */
#define SHUTDOWN_POLL_MS 100

#define COMP "service"
#define SHUTDOWN_FLUSH_FLAGS 0x12u /* reason trace-stop | initiator traced << 4 */

struct tr_service_daemon {
  uv_loop_t *loop;
  tr_hosts *hosts; /* every host that said Hello, for the service's life */
  tr_service svc;
  bool svc_ready;
  tr_consumer_port port;
  bool port_open;
  tr_link_server *link;
  tr_metrics_http *metrics;
  tr_loop_lag *lag; /* the loop's busy time per iteration, for /metrics */
  tr_tls_config *tls;
  const char *cert_path, *ca_path, *crl_path; /* tls's files, for the expiry warnings */
  tr_cert_expiry_timer *expiry_timer; /* the daily look at them */
  tr_regional *regional;        /* a regional: these instead of the port and the link server */
  tr_regional_status *regional_status; /* its consumer socket, for `tracerelay status` */
  tr_agent *agent;
  tr_tls_config *upstream_tls;
  unsigned flushes_pending;
  uv_timer_t read_timer; /* shutdown: waits for consumers to read their ended sessions */
  uint64_t read_deadline_ms;
  bool stopping;
  bool start_failed; /* nobody else holds d: finish frees it */
  void (*done)(void *ud);
  void *done_ud;
};

#define FD_RESERVE 256 /* consumers, the metrics endpoint, files, the loop's own */

/* The kernel grows a process's descriptor table as descriptors are opened, and in a process
 * with threads each growth waits for an RCU grace period: in a storm of 1,000 agents the accept
 * that took descriptor 256, 512 or 1,024 held the loop 10-18 ms (bench/README.md, issue 25
 * item 2). Opening descriptor need - 1 once now grows it to its size for need at start. */
static void presize_fd_table(rlim_t need) {
  int base = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (base < 0)
    return;
  if (need > (rlim_t)base + 1 && need <= INT_MAX) {
    int top = fcntl(base, F_DUPFD_CLOEXEC, (int)(need - 1));
    if (top >= 0)
      close(top);
  }
  close(base);
}

/* This machine's memory (MemTotal of /proc/meminfo) in bytes; 0 if it cannot be read. */
static uint64_t machine_memory(void) {
  char line[256];
  unsigned long long kb = 0;
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
      break;
  fclose(f);
  return kb > UINT64_MAX / 1024 ? 0 : (uint64_t)kb * 1024;
}

/* --max-buffer-memory, or half of this machine's memory: the central buffers share the
 * machine with the service's own queues, the consumers' reads and whatever else runs there. */
static void set_buffer_budget(tr_service *svc, uint64_t max) {
  char text[TR_BYTE_SIZE_TEXT];
  const char *why = "--max-buffer-memory";
  if (max == 0) {
    max = machine_memory() / 2;
    why = "half of this machine's memory; --max-buffer-memory sets it";
  }
  if (max == 0) {
    TR_WARN(COMP, "cannot read MemTotal in /proc/meminfo: no budget of central buffer memory; "
            "give --max-buffer-memory");
    return;
  }
  tr_byte_size_format(max, text);
  TR_INFO(COMP, "central buffers of every session on every host: at most %s (%s)", text, why);
  tr_session_service_set_max_buffer_memory(svc, max);
}

/* Every agent holds a socket: the descriptors for max_agents of them must be there before the
 * first one connects, not missing at agent 1,021. Raises the soft limit up to the hard one if
 * needed, and sizes the descriptor table for them; else says what to change. */
static int check_fd_limit(unsigned max_agents) {
  struct rlimit rl;
  rlim_t need = (rlim_t)max_agents + FD_RESERVE;
  bool enough = getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need;
  if (!enough && (rl.rlim_max >= need || rl.rlim_max == RLIM_INFINITY)) {
    rl.rlim_cur = need;
    enough = setrlimit(RLIMIT_NOFILE, &rl) == 0;
    if (enough)
      TR_INFO(COMP, "raised the open-file limit to %llu for --max-agents %u",
              (unsigned long long)need, max_agents);
  }
  if (enough) {
    presize_fd_table(need);
    return 0;
  }
  TR_ERROR(COMP, "--max-agents %u needs about %llu open files, but the limit is %llu (hard "
           "%llu): raise it (ulimit -n, LimitNOFILE= in the unit) or lower --max-agents",
           max_agents, (unsigned long long)need, (unsigned long long)rl.rlim_cur,
           (unsigned long long)rl.rlim_max);
  return TR_ERR_CONFIG;
}

/* mkdir -p of the socket's directory. */
static int make_parent_dir(const char *path) {
  char dir[4096];
  size_t n = strlen(path);
  if (n >= sizeof dir)
    return TR_ERR_INVAL;
  memcpy(dir, path, n + 1);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      return TR_ERR_SYS(errno);
    *p = '/';
  }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return TR_ERR_SYS(errno);
  return 0;
}

static void close_all(tr_service_daemon *d);

static void daemon_free(tr_service_daemon *d) {
  tr_hosts_free(d->hosts);
  free(d);
}

/* The earliest expiry among the peers connected now (agents, regionals), and whose. */
static int64_t peer_expiry(const tr_service_daemon *d, const char **name) {
  if (d->link != NULL)
    return tr_link_server_peer_expiry(d->link, name);
  return d->regional != NULL ? tr_regional_peer_expiry(d->regional, name) : 0;
}

/* The samples of tracerelay_tls_certificate_expiry_timestamp_seconds this service holds. */
static void write_expiry(const tr_service_daemon *d, tr_prom_text *t) {
  const char *name = NULL;
  int64_t peers = peer_expiry(d, &name);
  if (d->tls == NULL)
    return;
  tr_cert_expiry_metric(t, "service", tr_tls_config_cert_expiry(d->tls));
  if (d->regional == NULL) /* a regional's embedded agent wrote the CA's */
    tr_cert_expiry_metric(t, "ca", tr_tls_config_ca_expiry(d->tls));
  if (peers != 0)
    tr_cert_expiry_metric(t, "peers", peers);
  int64_t crl = tr_tls_config_crl_next_update(d->tls);
  if (crl != 0)
    tr_cert_expiry_metric(t, "crl", crl);
}

/* One certificate (or CRL) named by prefix and path, unless its time is unknown (0). */
static void check_one(const char *prefix, const char *path, int64_t not_after, int64_t now) {
  char what[4200];
  snprintf(what, sizeof what, "%s%s", prefix, path != NULL ? path : "?");
  if (not_after != 0)
    tr_cert_expiry_check(COMP, what, not_after, now);
}

/* Its own certificate, the CA, the earliest of its peers' and the CRL's next update: warned
 * about in the log ahead of their expiry; status shows the first two. */
static void check_expiry(void *data) {
  tr_service_daemon *d = data;
  int64_t now = time(NULL), cert = tr_tls_config_cert_expiry(d->tls);
  int64_t ca = tr_tls_config_ca_expiry(d->tls);
  const char *name = NULL;
  int64_t peers = peer_expiry(d, &name);
  tr_session_service_set_tls_expiry(&d->svc, cert, ca);
  check_one("the service's certificate ", d->cert_path, cert, now);
  check_one("the CA certificate ", d->ca_path, ca, now);
  check_one("the first to expire of the connected agents' certificates: ", name, peers, now);
  check_one("the next update of the CRL (past it every agent is refused) ", d->crl_path,
            tr_tls_config_crl_next_update(d->tls), now);
}

static void render_regional_metrics(void *data, tr_prom_text *t) {
  tr_service_daemon *d = data;
  struct tr_regional_stats st = {0};
  write_expiry(d, t); /* goes on with the agent's last family (agent.h) */
  if (d->regional != NULL)
    tr_regional_stats(d->regional, &st);
  tr_metrics_write_regional(&st, t);
}

static void render_metrics(void *data, const struct tr_metrics_request *req, tr_prom_text *t) {
  tr_service_daemon *d = data;
  struct tr_tls_uv_server_stats tls = {0};
  if (d->link != NULL)
    tr_link_server_tls_stats(d->link, &tls);
  tr_metrics_write(&d->svc, req->host_series, t);
  tr_metrics_write_loop(d->lag, &tls, t);
  tr_cert_expiry_metric_family(t);
  write_expiry(d, t);
}

/* After a start that succeeded: the expiry now, then once a day. */
static void watch_expiry(tr_service_daemon *d) {
  check_expiry(d);
  if (tr_cert_expiry_timer_start(d->loop, check_expiry, d, &d->expiry_timer) < 0)
    TR_WARN(COMP, "out of memory for the daily check of the certificates' expiry");
}

/* Ready once both listeners are open (start succeeded), until the shutdown. */
static const char *not_ready(void *data) {
  return ((tr_service_daemon *)data)->stopping ? "shutting down\n" : NULL;
}

static void finish(tr_service_daemon *d) {
  if (d->svc_ready) {
    tr_session_service_free(&d->svc);
    d->svc_ready = false;
  }
  if (d->link) {
    tr_link_server_stop(d->link);
    d->link = NULL;
  }
  if (d->regional) {
    tr_regional_stop(d->regional);
    d->regional = NULL;
  }
  tr_loop_lag_stop(d->lag);
  d->lag = NULL;
  tr_cert_expiry_timer_stop(d->expiry_timer);
  d->expiry_timer = NULL;
  tr_tls_config_unref(d->tls);
  d->tls = NULL;
  tr_tls_config_unref(d->upstream_tls);
  d->upstream_tls = NULL;
  if (d->done)
    d->done(d->done_ud);
  if (d->start_failed)
    daemon_free(d);
}

static void on_port_closed(tr_consumer_port *port) {
  tr_service_daemon *d = (tr_service_daemon *)((char *)port - offsetof(tr_service_daemon, port));
  finish(d);
}

static void on_metrics_closed(void *d) { close_all(d); }

static void on_regional_status_closed(void *d) { close_all(d); }

static void close_all(tr_service_daemon *d) {
  if (d->metrics) {
    tr_metrics_http *m = d->metrics;
    d->metrics = NULL;
    tr_metrics_http_close(m, on_metrics_closed, d);
    return;
  }
  if (d->port_open) {
    d->port_open = false;
    tr_consumer_port_close(&d->port, on_port_closed);
    return;
  }
  if (d->regional_status) {
    tr_regional_status *s = d->regional_status;
    d->regional_status = NULL;
    tr_regional_status_close(s, on_regional_status_closed, d);
    return;
  }
  finish(d);
}

/* The service's certificate for its agents' links; err says why it failed. */
static int load_server_tls(const struct tr_service_daemon_opts *o, tr_tls_config **out,
                           char *err, size_t err_len) {
  struct tr_tls_config_opts tls_opts = {.role = TR_TLS_SERVER,
                                        .ca_path = o->ca_path,
                                        .cert_path = o->cert_path,
                                        .key_path = o->key_path,
                                        .ciphers = o->ciphers,
                                        .crl_path = o->crl_path,
                                        .deny = o->deny,
                                        .num_deny = o->num_deny};
  return tr_tls_config_new(&tls_opts, out, err, err_len);
}

/* The regional's certificate for its upstream links. */
static int load_upstream_tls(const struct tr_service_daemon_opts *o, tr_tls_config **out) {
  struct tr_tls_config_opts tls_opts = {.role = TR_TLS_CLIENT,
                                        .ca_path = o->upstream_ca_path ? o->upstream_ca_path
                                                                       : o->ca_path,
                                        .cert_path = o->upstream_cert_path,
                                        .key_path = o->upstream_key_path,
                                        .ciphers = o->ciphers};
  char err[512] = "";
  int rc = tr_tls_config_new(&tls_opts, out, err, sizeof err);
  if (rc != 0)
    TR_ERROR(COMP, "upstream TLS setup failed (--upstream-cert/--upstream-key/--upstream-ca): %s",
             err[0] ? err : tr_strerror(rc));
  return rc;
}

/* A regional's consumer socket answers `tracerelay status` only; without it the regional
 * still forwards, so a socket that cannot be opened is a warning, not a failure. */
static void start_regional_status(tr_service_daemon *d, const struct tr_service_daemon_opts *o) {
  int rc = make_parent_dir(o->consumer_socket);
  if (rc == 0)
    rc = tr_regional_status_start(d->loop, d->regional,
                                  d->svc.system_info->tracing_service_version,
                                  d->svc.system_info->machine_name, o->consumer_socket,
                                  o->consumer_mode, &d->regional_status);
  if (rc != 0) {
    TR_WARN(COMP, "regional: no status socket at %s (%s): `tracerelay status` cannot read this "
            "regional; the forwarding goes on", o->consumer_socket, tr_strerror(rc));
    tr_regional_status_close(d->regional_status, NULL, NULL);
    d->regional_status = NULL;
  }
}

/* A regional: the agents' forwarding, then the agent of its own machine. */
static int start_regional(tr_service_daemon *d, const struct tr_service_daemon_opts *o) {
  int rc = load_upstream_tls(o, &d->upstream_tls);
  if (rc != 0)
    return rc;
  struct tr_regional_opts ro = {.listen = o->listen,
                                .tls = d->tls,
                                .upstream = o->upstream,
                                .upstream_name = o->upstream_name,
                                .upstream_tls = d->upstream_tls,
                                .handshake_timeout_ms = o->handshake_timeout_ms,
                                .max_handshakes_per_source = o->max_handshakes_per_source,
                                .max_waiting_per_source = o->max_waiting_per_source,
                                .max_agents = o->max_agents};
  if ((rc = tr_regional_start(d->loop, &ro, &d->regional)) != 0)
    return rc;
  start_regional_status(d, o);
  struct tr_agent_opts ao = {.producer_socket = o->producer_socket,
                             .service = o->upstream,
                             .service_name = o->upstream_name,
                             .ca_path = o->upstream_ca_path ? o->upstream_ca_path : o->ca_path,
                             .cert_path = o->upstream_cert_path,
                             .key_path = o->upstream_key_path,
                             .ciphers = o->ciphers,
                             .metrics_listen = o->metrics_listen,
                             .metrics_more = render_regional_metrics,
                             .metrics_more_data = d,
                             .compress = true};
  if ((rc = make_parent_dir(o->producer_socket)) != 0 ||
      (rc = tr_agent_start(d->loop, &ao, &d->agent)) != 0) {
    TR_ERROR(COMP, "cannot start the regional's own agent (producer socket %s): %s",
             o->producer_socket, tr_strerror(rc));
    return rc;
  }
  return 0;
}

int tr_service_daemon_start(uv_loop_t *loop, const struct tr_service_daemon_opts *o,
                            tr_service_daemon **out) {
  tr_service_daemon *d = calloc(1, sizeof *d);
  struct tr_link_server_opts link_opts = {0};
  char err[512] = "";
  int rc;

  *out = NULL;
  if (!d)
    return TR_ERR_NOMEM;
  d->loop = loop;
  if ((rc = tr_hosts_new(&d->svc, &tr_session_link_events, &d->hosts)) != 0) {
    free(d);
    return rc;
  }
  rc = tr_session_service_init(&d->svc, loop, o->timeline, d->hosts, &tr_link_server_commands);
  if (rc != 0) {
    TR_ERROR(COMP, "cannot read this machine's system info: %s", tr_strerror(rc));
    daemon_free(d);
    return rc;
  }
  d->svc_ready = true;
  if (o->upstream == NULL) /* a regional runs no sessions */
    set_buffer_budget(&d->svc, o->max_buffer_memory);
  if ((rc = check_fd_limit(o->max_agents ? o->max_agents : TR_LINK_DEFAULT_MAX_AGENTS)) != 0)
    goto fail;
  if ((rc = load_server_tls(o, &d->tls, err, sizeof err)) != 0) {
    TR_ERROR(COMP, "TLS setup failed: %s", err[0] ? err : tr_strerror(rc));
    goto fail;
  }
  d->cert_path = o->cert_path;
  d->ca_path = o->ca_path;
  d->crl_path = o->crl_path;
  if (o->upstream != NULL) {
    if ((rc = start_regional(d, o)) != 0)
      goto fail;
    TR_INFO(COMP, "regional: agents on %s are forwarded to %s; trace from the upstream "
            "service (the consumer socket %s here answers `tracerelay status` only)", o->listen,
            o->upstream, d->regional_status ? o->consumer_socket : "(none)");
    watch_expiry(d);
    *out = d;
    return 0;
  }
  if ((rc = make_parent_dir(o->consumer_socket)) != 0) {
    TR_ERROR(COMP, "cannot create the directory of the consumer socket %s: %s",
             o->consumer_socket, tr_strerror(rc));
    goto fail;
  }
  if ((rc = tr_consumer_port_start(&d->port, &d->svc, o->consumer_socket, o->consumer_mode)) !=
      0) {
    TR_ERROR(COMP, "cannot listen on the consumer socket %s: %s%s", o->consumer_socket,
             tr_strerror(rc),
             rc == TR_ERR_SYS(EADDRINUSE) ? " (another service or traced is serving it)" : "");
    d->port_open = true; /* tr_consumer_port_close after any start */
    goto fail;
  }
  d->port_open = true;
  tr_consumer_port_allow(&d->port, &o->consumer_access);
  if (o->metrics_listen) {
    if ((rc = tr_loop_lag_start(loop, &d->lag)) != 0) {
      TR_ERROR(COMP, "cannot measure the loop's lag for --metrics-listen: %s", tr_strerror(rc));
      goto fail;
    }
    struct tr_metrics_handlers h = {.data = d, .render = render_metrics, .not_ready = not_ready};
    if ((rc = tr_metrics_http_start(loop, o->metrics_listen, &h, &d->metrics, err, sizeof err)) !=
        0) {
      TR_ERROR(COMP, "--metrics-listen: %s", err);
      goto fail;
    }
    TR_INFO(COMP, "metrics on http://%s/metrics (port %u)", o->metrics_listen,
            tr_metrics_http_port(d->metrics));
  }
  link_opts.listen = o->listen;
  link_opts.tls = d->tls;
  link_opts.handshake_timeout_ms = o->handshake_timeout_ms;
  link_opts.max_handshakes_per_source = o->max_handshakes_per_source;
  link_opts.max_waiting_per_source = o->max_waiting_per_source;
  link_opts.max_agents = o->max_agents;
  link_opts.relay_allow = &o->relay_allow;
  if ((rc = tr_link_server_start(loop, d->hosts, &link_opts, &d->link)) != 0)
    goto fail; /* the link server logged the address and the reason */
  TR_INFO(COMP, "listening for agents on %s, consumers on %s (mode %04o)", o->listen,
          o->consumer_socket, (unsigned)o->consumer_mode);
  watch_expiry(d);
  *out = d;
  return 0;
fail:
  d->link = NULL;
  d->start_failed = true;
  close_all(d);
  return rc;
}

static void on_read_timer_closed(uv_handle_t *h) { close_all(h->data); }

/* Shutdown: until every ended session is freed (read and released by its consumer) or the
 * deadline, the consumer socket stays open. */
static void on_read_timer(uv_timer_t *t) {
  tr_service_daemon *d = t->data;
  size_t unread = d->svc.num_sessions;
  if (unread && uv_now(d->loop) < d->read_deadline_ms)
    return;
  if (unread)
    TR_WARN(COMP, "%zu session(s) not read by their consumer within %u ms of the shutdown: "
            "what they held is lost", unread, SHUTDOWN_READ_MS);
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, on_read_timer_closed);
}

static void end_and_close(tr_service_daemon *d) {
  tr_consumer_port_end_sessions(&d->port,
                                "tracerelay-service is shutting down (SIGTERM or SIGINT): the "
                                "session was flushed and stopped early");
  if (d->svc.num_sessions == 0 || uv_timer_init(d->loop, &d->read_timer) != 0) {
    close_all(d);
    return;
  }
  TR_INFO(COMP, "waiting up to %u ms for consumers to read the %zu ended session(s)",
          SHUTDOWN_READ_MS, d->svc.num_sessions);
  d->read_timer.data = d;
  d->read_deadline_ms = uv_now(d->loop) + SHUTDOWN_READ_MS;
  uv_timer_start(&d->read_timer, on_read_timer, SHUTDOWN_POLL_MS, SHUTDOWN_POLL_MS);
}

static void on_shutdown_flush(void *ud, bool ok) {
  tr_service_daemon *d = ud;
  (void)ok;
  if (--d->flushes_pending == 0)
    end_and_close(d);
}

/* A regional's agent sent what it held (or timed out) and closed: the rest closes now. */
static void on_regional_agent_done(void *data) {
  tr_service_daemon *d = data;
  d->agent = NULL;
  close_all(d);
}

void tr_service_daemon_shutdown(tr_service_daemon *d, void (*done)(void *ud), void *ud) {
  if (d->stopping)
    return;
  d->stopping = true;
  d->done = done;
  d->done_ud = ud;
  if (d->regional != NULL) {
    tr_regional_stop(d->regional);
    d->regional = NULL;
    if (d->agent != NULL)
      tr_agent_shutdown(d->agent, SHUTDOWN_READ_MS, on_regional_agent_done, d);
    else
      close_all(d);
    return;
  }
  /* Counted before any flush starts: one may complete at once. */
  for (tr_session *s = d->svc.sessions; s; s = tr_session_next(s))
    d->flushes_pending += tr_session_get_state(s) == TR_SESSION_STARTED;
  if (d->flushes_pending == 0) {
    end_and_close(d);
    return;
  }
  d->flushes_pending++;
  for (tr_session *s = d->svc.sessions; s; s = tr_session_next(s))
    if (tr_session_get_state(s) == TR_SESSION_STARTED &&
        tr_session_flush(s, 0, SHUTDOWN_FLUSH_FLAGS, on_shutdown_flush, d) != 0)
      on_shutdown_flush(d, false);
  on_shutdown_flush(d, true);
}

int tr_service_daemon_reload_tls(tr_service_daemon *d, const struct tr_service_daemon_opts *o) {
  tr_tls_config *cfg, *upstream = NULL;
  char err[512] = "";
  int rc;
  if (d->stopping || (!d->link && !d->regional))
    return TR_ERR_STATE;
  if ((rc = load_server_tls(o, &cfg, err, sizeof err)) != 0) {
    TR_ERROR(COMP, "certificates NOT reloaded, the current ones stay in use: %s",
             err[0] ? err : tr_strerror(rc));
    return rc;
  }
  if (d->regional && (rc = load_upstream_tls(o, &upstream)) != 0) {
    TR_ERROR(COMP, "certificates NOT reloaded, the current ones stay in use");
    tr_tls_config_unref(cfg);
    return rc;
  }
  if (d->regional) {
    tr_regional_reload_tls(d->regional, cfg, upstream);
    tr_tls_config_unref(d->upstream_tls);
    d->upstream_tls = upstream;
    if (d->agent)
      tr_agent_reload_tls(d->agent);
  } else {
    tr_link_server_reload_tls(d->link, cfg);
  }
  tr_tls_config_unref(d->tls);
  d->tls = cfg;
  d->cert_path = o->cert_path;
  d->ca_path = o->ca_path;
  d->crl_path = o->crl_path;
  TR_INFO(COMP, "certificates reloaded (ca %s, cert %s, key %s%s%s, crl %s, %zu denied); "
          "connected agents and running sessions carry on unless revoked or denied",
          o->ca_path, o->cert_path, o->key_path, d->regional ? ", upstream cert " : "",
          d->regional ? o->upstream_cert_path : "", o->crl_path ? o->crl_path : "(none)",
          o->num_deny);
  check_expiry(d);
  return 0;
}

void tr_service_daemon_free(tr_service_daemon *d) { daemon_free(d); }
