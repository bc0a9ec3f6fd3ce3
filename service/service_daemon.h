/* service_daemon.h: tracerelay-service put together (service_daemon.c): the service state,
 * the consumer port and the link server on one loop, and their orderly shutdown. main.c
 * parses the flags into tr_service_daemon_opts. */
#ifndef TR_SERVICE_DAEMON_H
#define TR_SERVICE_DAEMON_H

#include <sys/types.h>
#include <uv.h>

#include "service/consumer_port.h"
#include "service/relay_allow.h"
#include "service/session.h"

#define TR_SERVICE_DEFAULT_LISTEN "0.0.0.0:7393"
#define TR_SERVICE_DEFAULT_CONSUMER_SOCKET "/run/tracerelay/consumer.sock"
#define TR_SERVICE_DEFAULT_REGIONAL_PRODUCER_SOCKET "/run/tracerelay/regional-producer.sock"
#define TR_SERVICE_DEFAULT_REGIONAL_CONSUMER_SOCKET "/run/tracerelay/regional-consumer.sock"

#define TR_SERVICE_MAX_DENY 1024 /* --deny names, as many as a config file has entries */

typedef struct tr_service_daemon tr_service_daemon;

struct tr_service_daemon_opts {
  const char *listen;          /* ADDR:PORT of the relay link */
  const char *consumer_socket; /* its directory is created (0755) if missing */
  mode_t consumer_mode;
  tr_consumer_access consumer_access; /* --consumer-allow-uid/-gid; empty: file mode only */
  unsigned handshake_timeout_ms;      /* TLS handshake, then Hello; 0: the default */
  /* --max-handshakes-per-source, --max-waiting-per-source: what one source address may hold
   * on the agents' TLS port before it is authenticated (tls_uv.h), root or regional; 0: the
   * defaults. */
  unsigned max_handshakes_per_source, max_waiting_per_source;
  const char *ca_path, *cert_path, *key_path;
  const char *ciphers; /* --cipher (relay/link/tls_ciphers.h), on every link, upstream too; NULL: all */
  /* --crl and --deny (relay/link/tls.h): peers refused at the handshake, and on SIGHUP the
   * connected ones cut. */
  const char *crl_path;
  const char *deny[TR_SERVICE_MAX_DENY];
  size_t num_deny;
  enum tr_timeline timeline;
  const char *metrics_listen; /* IPADDR:PORT of /metrics, /healthz, /readyz; NULL: none */
  unsigned max_agents;        /* 0: TR_LINK_DEFAULT_MAX_AGENTS */
  /* --max-buffer-memory: the sessions' central buffers, over every host, at most this many
   * bytes (session.h); 0: half of this machine's memory (MemTotal). */
  uint64_t max_buffer_memory;
  tr_relay_allow relay_allow; /* --relay-allow: who may relay whom to this service */
  /* Tiers: with upstream set the service is a regional (service/regional.h): it forwards its
   * agents to upstream and runs no consumer socket, sessions or metrics of its own; an agent
   * embedded in it (agent/agent.h, on producer_socket, serving metrics_listen) connects the
   * regional's own machine under upstream_cert's name. */
  const char *upstream, *upstream_name;
  const char *upstream_ca_path, *upstream_cert_path, *upstream_key_path; /* ca: NULL = ca_path */
  const char *producer_socket;
};

/* Starts everything; on failure logs what failed (file, address, socket) and returns a
 * negative code after closing what was started (run the loop once more to finish). */
int tr_service_daemon_start(uv_loop_t *loop, const struct tr_service_daemon_opts *opts,
                            tr_service_daemon **out);
/* Flushes running sessions (up to their flush timeout), ends every session with an error
 * telling its consumer the service is shutting down, closes the consumer socket and the
 * agents' links, frees everything, then calls done(ud). */
void tr_service_daemon_shutdown(tr_service_daemon *d, void (*done)(void *ud), void *ud);
/* SIGHUP: loads a new TLS configuration from o's files (the service's certificate, key, the
 * CA agents must chain to, --crl and --deny; on a regional also its upstream certificate, for
 * links made from now on, and its embedded agent's) for agent connections accepted from now
 * on; connected agents and running sessions carry on, but for those the new --crl or --deny
 * refuses, which are closed (link_server.h, regional.h). Then checks the certificates' expiry
 * (relay/daemon/cert_expiry.h). On failure logs why and keeps the current configuration.
 * Returns 0 or the tr_tls_config_new error. */
int tr_service_daemon_reload_tls(tr_service_daemon *d, const struct tr_service_daemon_opts *o);
/* Frees d once the loop has run out of handles after the shutdown. */
void tr_service_daemon_free(tr_service_daemon *d);

#endif
