/* producer_port.h: the agent's producer socket. A Perfetto ProducerPort (reference 2) on the
 * generic IPC host (ipc_host.h), so that unmodified Perfetto SDK apps and traced_probes connect
 * to it as to traced. It hands producers the commands the agent's caller gives it (setup,
 * start, stop, flush, clear incremental state), and moves every committed chunk out of shared
 * memory at once into the caller's chunk queue (producer_shm.h), tagged with the producer's
 * agent-local id and its SO_PEERCRED uid/pid.
 *
 * Per connection: an agent-local producer id (1, 2, 3... never reused), the producer's name,
 * sdk_version and peer credentials, its SMB (a sealed memfd we create at the first setup, its
 * geometry from the producer's hints clamped as traced does, or one the producer provided if
 * valid), its registered data sources (the decoded descriptors, unknown fields kept), trace
 * writers, data source instances and the target buffers it was given.
 *
 * Behaviour towards producers follows traced: InitializeConnection first and once (every
 * other call before it is refused), the reply {using_shmem_provided_by_producer,
 * direct_smb_patching_supported: true, use_shmem_emulation: false, true on the relay endpoint,
 * where no SMB is made and setup_tracing carries no fd}; the GetAsyncCommand stream
 * is never closed; the first setup of a producer sends setup_tracing with the SMB fd, then
 * setup_data_source, start_data_source... Every refused call or CommitData entry gets an error
 * reply, is logged with its reason (the first few per producer) and counted as an ABI
 * violation of that producer; after TR_PRODUCER_PORT_MAX_VIOLATIONS the producer is
 * disconnected. Other producers never notice.
 *
 * Callbacks run on the loop thread. Those that follow a producer's call run after that call's
 * reply was queued; `started` and `stopped` of a data source that does not notify run from
 * inside the command that caused them. The port never blocks on the queue: a full queue drops
 * and counts. Single-threaded: every function must be called on the loop's thread; only the
 * queue may be shared with another thread, through cfg.queue_lock. */
#ifndef TR_PRODUCER_PORT_H
#define TR_PRODUCER_PORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "perfetto/common/data_source_descriptor.pb-c.h"
#include "perfetto/config/data_source_config.pb-c.h"
#include "relay/producer/chunk_queue.h"
#include "relay/producer/guests.h"
#include "relay/producer/producer_shm.h"

/* traced's producer socket is world-writable so that any app can trace; so is ours. The
 * agent trusts SO_PEERCRED, never the socket mode, for who a producer is. */
#define TR_PRODUCER_PORT_DEFAULT_MODE 0666
#define TR_PRODUCER_PORT_DEFAULT_STOP_TIMEOUT_MS 5000u /* traced's data_source_stop_timeout_ms */
#define TR_PRODUCER_PORT_MAX_VIOLATIONS 64u
#define TR_PRODUCER_PORT_MAX_DATA_SOURCES 256u /* per producer (its refusal names 256) */

typedef struct tr_producer_port tr_producer_port;

/* A producer as the callbacks see it; valid during the callback only. */
typedef struct tr_producer_info {
  uint32_t id;
  const char *name;        /* "" if the producer sent none */
  const char *sdk_version; /* "" if none */
  uid_t uid;               /* SO_PEERCRED */
  gid_t gid;
  pid_t pid;
  /* 0: a producer of this host (uid, gid, pid from SO_PEERCRED). Else it came through the
   * relay endpoint from that guest machine (guests.h), and uid and pid are what its relay
   * claimed in SetPeerIdentity: the guest's word, about the guest. */
  uint32_t guest_id;
  /* The registered data sources, in registration order. */
  const Perfetto__Protos__DataSourceDescriptor *const *data_sources;
  size_t num_data_sources;
  /* Its ABI violations so far: in producer_disconnected, the final count (the producer may
   * be disconnected for them before anyone asked tr_producer_port_stats). */
  uint64_t abi_violations;
  uint64_t smb_full;    /* likewise, tr_producer_stats.smb_full */
  uint64_t smb_full_ns; /* and tr_producer_stats.smb_full_ns */
} tr_producer_info;

typedef struct tr_producer_port_callbacks {
  void *data; /* for the caller; the port does not touch it */
  /* After a successful InitializeConnection. */
  void (*producer_connected)(tr_producer_port *port, const tr_producer_info *p);
  /* After RegisterDataSource, UpdateDataSource or UnregisterDataSource changed the list. */
  void (*data_sources_changed)(tr_producer_port *port, const tr_producer_info *p);
  /* The connection is gone (also when the port closes); every instance of it is gone too,
   * without a stopped callback. Only for producers that were connected. Before it, the
   * producer's shared memory was scraped into the queue for the buffers of its instances
   * (tr_producer_shm_scrape_exit), and what could not be, and why the agent closed the
   * connection if it did, counted in the queue (tr_chunkq_count_exit). */
  void (*producer_disconnected)(tr_producer_port *port, const tr_producer_info *p);
  /* NotifyDataSourceStarted, or right after start_data_source if the descriptor does not
   * ask will_notify_on_start. */
  void (*data_source_started)(tr_producer_port *port, uint32_t producer_id,
                              uint64_t instance_id);
  /* NotifyDataSourceStopped, right after stop_data_source if the descriptor does not ask
   * will_notify_on_stop, or when the stop timeout passed (timed_out). The instance is gone. */
  void (*data_source_stopped)(tr_producer_port *port, uint32_t producer_id,
                              uint64_t instance_id, bool timed_out);
  /* CommitData carried flush_request_id; its queue marker follows the flushed data. */
  void (*flush_acked)(tr_producer_port *port, uint32_t producer_id, uint64_t flush_request_id);
  void (*triggers)(tr_producer_port *port, uint32_t producer_id, const char *const *names,
                   size_t num_names);
  /* Relay endpoint: a guest machine appeared or sent its SystemInfo (gone false; g->system_info
   * may still be NULL), or its last connection closed (gone true, after its producers'
   * producer_disconnected). g is valid during the call only. */
  void (*guest_changed)(tr_producer_port *port, const tr_guest *g, bool gone);
  /* Relay endpoint: the guest's SyncClock completed an exchange (guests.h). */
  void (*guest_clock)(tr_producer_port *port, uint32_t guest_id,
                      const struct tr_guest_exchange *x);
  /* Entries were added to the queue: wake the relay link. */
  void (*queue_has_data)(tr_producer_port *port);
} tr_producer_port_callbacks;

typedef struct tr_producer_port_config {
  tr_chunkq *queue; /* owned by the caller; must outlive the port */
  /* If set, held while the port writes or reads the queue: another thread takes the queue's
   * entries from under the same lock (agent/port_handoff.h). NULL: the queue is this loop's. */
  uv_mutex_t *queue_lock;
  tr_producer_port_callbacks cb;
  size_t max_producers; /* 0: TR_IPC_DEFAULT_MAX_CONNS */
  const char *max_producers_flag; /* named when one more is refused (e.g. "--max-producers") */
  /* The SMB of a producer that gives no size hint (a producer's hint wins, within
   * tr_smb_choose_geometry's bounds); 0: TR_SMB_DEFAULT_SIZE, traced's. */
  uint32_t smb_size;
} tr_producer_port_config;

/* Allocates a port on `loop`; nothing listens yet. 0, TR_ERR_INVAL (no queue), TR_ERR_NOMEM,
 * or a libuv failure. Once it succeeded, tr_producer_port_close must be called. */
int tr_producer_port_new(uv_loop_t *loop, const tr_producer_port_config *cfg,
                         tr_producer_port **out);
/* Listens on `path` with `mode` (TR_PRODUCER_PORT_DEFAULT_MODE as traced). Errors as
 * tr_ipc_host_start: TR_ERR_SYS(EADDRINUSE) if a live socket is there. */
int tr_producer_port_start(tr_producer_port *port, const char *path, mode_t mode);
/* Also listens on a network address (tr_ipc_host_start_net: "ADDR:PORT" or "vsock://CID:PORT")
 * for Perfetto's traced_relay: ProducerPort (service 1, shared memory emulated) and RelayPort
 * (service 2: InitRelay, SyncClock) as traced serves them on its relay endpoint. Every
 * producer there belongs to a guest machine (guests.h), never to this host. Errors as
 * tr_ipc_host_start_net; at most once. */
int tr_producer_port_start_relay(tr_producer_port *port, const char *addr);
/* The relay endpoint's port (for an address that gave port 0), or TR_ERR_STATE. */
int tr_producer_port_relay_port(const tr_producer_port *port);
/* Disconnects every producer (producer_disconnected runs for each), stops listening, unlinks
 * the socket, and frees the port; cb(data) runs from the loop once it is all done. */
void tr_producer_port_close(tr_producer_port *port, void (*cb)(void *data), void *data);
void *tr_producer_port_data(const tr_producer_port *port); /* cfg.cb.data */

/* Commands. Each returns 0, TR_ERR_NOT_FOUND (no such producer or instance, or no data
 * source of that name), TR_ERR_STATE (the producer has not opened GetAsyncCommand yet, or the
 * instance is not in the right state), TR_ERR_INVAL, TR_ERR_NOMEM, or an IPC error
 * (TR_ERR_TOO_BIG, TR_ERR_CLOSED, TR_ERR_FULL: the producer is then being disconnected). */

/* Creates the instance (its id is the caller's, unique per producer), gives the producer
 * config->target_buffer (a global buffer id, required) and sends setup_data_source with a
 * copy of config. The first setup of a producer creates its SMB and sends setup_tracing with
 * the fd before it. config->name must be a data source the producer registered. */
int tr_producer_port_setup_data_source(tr_producer_port *port, uint32_t producer_id,
                                       uint64_t instance_id,
                                       const Perfetto__Protos__DataSourceConfig *config);
/* Sends start_data_source with the config given at setup. */
int tr_producer_port_start_data_source(tr_producer_port *port, uint32_t producer_id,
                                       uint64_t instance_id);
/* Scrapes the SMB (if the producer asked for scraping), sends stop_data_source and waits up to
 * timeout_ms for NotifyDataSourceStopped if the descriptor promised it. timeout_ms 0: the
 * stop_timeout_ms of the config given at setup (the session's data_source_stop_timeout_ms),
 * or TR_PRODUCER_PORT_DEFAULT_STOP_TIMEOUT_MS if that config had none. */
int tr_producer_port_stop_data_source(tr_producer_port *port, uint32_t producer_id,
                                      uint64_t instance_id, uint32_t timeout_ms);
/* Scrapes the SMB (if the producer asked for scraping), then sends flush {instance_ids,
 * flush_request_id, flags}. The producer answers with CommitData{flush_request_id}: a
 * TR_CHUNKQ_FLUSH_ACK entry after its data, and flush_acked. Timeouts are the caller's. */
int tr_producer_port_flush(tr_producer_port *port, uint32_t producer_id,
                           uint64_t flush_request_id, const uint64_t *instance_ids,
                           size_t num_ids, uint64_t flags);
int tr_producer_port_clear_incremental_state(tr_producer_port *port, uint32_t producer_id,
                                             const uint64_t *instance_ids, size_t num_ids);

/* Counters of a connected producer; chunks_dropped comes from the queue. 0 or
 * TR_ERR_NOT_FOUND. */
int tr_producer_port_stats(const tr_producer_port *port, uint32_t producer_id,
                           tr_producer_stats *out);

#endif
