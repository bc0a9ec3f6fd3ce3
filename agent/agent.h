/* agent.h: the tracerelay agent: the producer port (what Perfetto producers on this host
 * connect to) glued to the relay link (what carries their data to the service).
 *
 * - Producers: each connect, data source change and disconnect becomes a ProducerUpdate
 *   (PRODUCER_CONNECTED, a PRODUCER_UPDATED delta, PRODUCER_DISCONNECTED); after every Welcome
 *   the full state of each live producer is sent again.
 * - Commands from the service become tr_producer_port_* calls, with the service's instance ids
 *   as they are. Setup and clear are replied to once the producer was told; start once the
 *   data source started, stop once it stopped (or its stop timed out, with an error); a
 *   producer that disconnects fails its pending start/stop. Flush has no reply: the producer's
 *   answer travels as a FlushAck in the chunk queue, behind the flushed data.
 * - Data: the port, on a thread of its own (agent/port_thread.h), copies committed chunks out
 *   of the producers' shared memory and frees them at once; they reach the chunk queue on the
 *   loop's thread, which the link drains.
 * The agent never blocks a producer: a full queue drops and counts (sent in AgentStats). */
#ifndef TR_AGENT_H
#define TR_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "relay/daemon/prom_text.h"

#define TR_AGENT_DEFAULT_PRODUCER_SOCKET "/run/perfetto/traced-producer.sock"
#define TR_AGENT_DEFAULT_QUEUE_BYTES (32u << 20)
/* The producer-port thread's outbox (agent/port_thread.h) holds up to this fraction of the
 * chunk queue's bound on top of it, what producers commit while the link's loop is busy. */
#define TR_AGENT_OUTBOX_FRACTION 4
/* The shared memory of a producer that gives no size hint: see docs/operations.md#shared-memory
 * for the measurements behind it. */
#define TR_AGENT_DEFAULT_SMB_KB 1024
#define TR_AGENT_DEFAULT_SMB_BYTES ((uint32_t)TR_AGENT_DEFAULT_SMB_KB << 10)
/* Producers connected at once, and the most --max-producers may set: what the service keeps
 * per host (TR_HOSTS_MAX_PRODUCERS). */
#define TR_AGENT_DEFAULT_MAX_PRODUCERS 1024
#define TR_AGENT_MAX_PRODUCERS 4096

typedef struct tr_agent tr_agent;

/* Strings must stay valid while the agent runs. */
struct tr_agent_opts {
  const char *producer_socket;
  const char *service;      /* HOST:PORT */
  const char *service_name; /* NULL: the HOST of service */
  const char *ca_path, *cert_path, *key_path;
  const char *ciphers; /* --cipher: the AEAD ciphers to offer (relay/link/tls_ciphers.h); NULL: all */
  /* If set, the certificate must carry this name: the agent refuses to start (or to reload)
   * a certificate under another. The service only ever uses the certificate's name. */
  const char *machine_name;
  size_t queue_bytes; /* chunk queue bound; 0: TR_AGENT_DEFAULT_QUEUE_BYTES */
  size_t spill_bytes; /* spill queue bound; 0: TR_RELAY_SPILL_DEFAULT */
  uint32_t smb_bytes; /* SMB of a producer without a size hint; 0: TR_AGENT_DEFAULT_SMB_BYTES */
  size_t max_producers; /* producers connected at once; 0: TR_AGENT_DEFAULT_MAX_PRODUCERS */
  /* ADDR:PORT or vsock://CID:PORT where Perfetto's traced_relay of guest machines may
   * connect (plaintext: docs/security.md#relay-endpoint); NULL: none. */
  const char *relay_listen;
  const char *metrics_listen; /* IPADDR:PORT of /metrics, /healthz, /readyz; NULL: none */
  /* More metrics for that endpoint, written after the agent's (a regional's forwarding); the
   * agent's end with the family tracerelay_tls_certificate_expiry_timestamp_seconds, which
   * these may go on with (samples first, no # HELP of their own). */
  void (*metrics_more)(void *data, tr_prom_text *t);
  void *metrics_more_data;
  bool compress;
  /* Run the producer port on `loop`, not on a thread of its own: for many agents in one
   * process (bench/many_agents), where a thread each would cost more than it gains. */
  bool port_on_loop;
};

/* Loads the certificates, listens on the producer socket and starts connecting to the
 * service. TR_ERR_CONFIG (certificates, --service; logged with the fix), the producer socket
 * error (logged), TR_ERR_NOMEM. */
int tr_agent_start(uv_loop_t *loop, const struct tr_agent_opts *opts, tr_agent **out);
/* Reads the certificate files again; new connections use them, the current one carries on.
 * On failure (logged) the old ones stay in use. */
int tr_agent_reload_tls(tr_agent *a);
/* Disconnects the producers and stops listening, sends what the queue and the spill queue
 * hold and waits up to timeout_ms for the service to acknowledge it, then closes the link.
 * done(data) runs when everything is closed; a is freed then. */
void tr_agent_shutdown(tr_agent *a, unsigned timeout_ms, void (*done)(void *data), void *data);

#endif
