/* session.h: tracing sessions of the central service, and the service state they live in.
 *
 * A session is one EnableTracing: its TraceConfig, its buffers (global ids, unique over the
 * service's life), one central buffer (tr_tbuf) per (buffer, host) made on the host's first
 * chunk so a chatty host only ever overwrites itself, the data source instances it set up on
 * the hosts' producers, and its timers (duration, periodic flush, incremental-state clear,
 * flush and stop timeouts).
 *
 * Lifecycle: tr_session_enable (validates, sets up instances; starts them unless
 * deferred_start) -> tr_session_start -> tr_session_disable (stop_data_source to every
 * instance, waits for the replies up to data_source_stop_timeout_ms) -> stopped: the observer's
 * on_end runs once -> tr_session_free. Reading is the read side's (trace_output.h), which the
 * session holds (tr_session_output), tells of its host entries, start and stop, and answers
 * with the TraceStats (session_stats.c). Flushes are in session_flush.c. Everything runs on the
 * service's loop.
 *
 * tr_session is opaque here: its fields are in session_priv.h, for the session module's own
 * files alone (session.c writes them; session_flush.c, session_stats.c and
 * session_unmatched.c read them). Every other file reads a session through the functions
 * below. */
#ifndef TR_SESSION_H
#define TR_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "perfetto/common/trace_stats.pb-c.h"
#include "perfetto/config/trace_config.pb-c.h"
#include "relay/daemon/prom_text.h"
#include "relay/trace/trace_writer.h"
#include "service/hosts.h"
#include "service/link_calls.h"
#include "service/trace_output.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

#define TR_SESSION_MAX_BUFFERS 128u
#define TR_SESSION_MAX_SESSIONS 32u
#define TR_SESSION_MAX_SESSIONS_PER_UID 5 /* traced's, root included */
#define TR_SESSION_DEFAULT_TIMEOUT_MS 5000u
#define TR_SESSION_MIN_FILE_PERIOD_MS 100u
#define TR_SESSION_MAX_DURATION_MS (7u * 24 * 3600 * 1000)

typedef struct tr_session tr_session; /* opaque: session_priv.h */

/* Written by session.c alone (it makes it: tr_session_service_init); the other files read it. */
struct tr_service {
  uv_loop_t *loop;
  const struct tr_link_commands *link;     /* the calls down to the hosts' agents */
  int32_t uid;                             /* trusted_uid of the service's own packets */
  enum tr_timeline timeline;
  Perfetto__Protos__SystemInfo *system_info; /* this machine; owned */
  tr_hosts *hosts; /* the host table (hosts.h), which new sessions, status and metrics walk */
  tr_session *sessions;
  size_t num_sessions;
  uint64_t next_session_id;
  uint64_t next_instance_id;
  uint64_t next_request_id;
  uint64_t next_flush_id;
  uint32_t next_buffer_id;
  uint64_t chunks_unknown_buffer;
  /* Flushes that waited for at least one producer: seconds from the request to the last ack
   * or the timeout (tr_session_observe_flush; the metrics endpoint's
   * tracerelay_flush_duration_seconds). */
  tr_prom_histogram flush_durations;
  /* Of each flush every producer answered, the service's own part of that time: the round
   * trip less the stretch from the fan-out's end to the arrival of the last ack in the
   * service's socket, which the network and the agents took (tr_session_flush_service_part_ns;
   * tracerelay_flush_service_seconds). */
  tr_prom_histogram flush_service_parts;
  /* The triggers that matched a session in the last 24 hours (session_triggers.c's, for
   * max_per_24_h); made on the first trigger. */
  struct tr_session_trigger_history *trigger_history;
  /* Stops to ask again when their host is back (session_unstopped.c). */
  struct tr_unstopped *unstopped;
  size_t num_unstopped;
  /* When this service's certificate and its CA expire (Unix seconds; 0 unknown), for status:
   * the daemon tells them at start and on SIGHUP (tr_session_service_set_tls_expiry). */
  int64_t cert_expiry, ca_expiry;
  /* The central buffer memory sessions may reserve (--max-buffer-memory; 0: no budget), and
   * what they reserve now: each session's buffers once for every host entry it made them
   * for (session_admit.c decides, session.c counts; clones are not counted). */
  uint64_t max_buffer_memory;
  uint64_t buffer_memory_reserved;
};

enum tr_session_state {
  TR_SESSION_CONFIGURED, /* deferred_start: set up, waiting for StartTracing */
  TR_SESSION_STARTED,
  TR_SESSION_STOPPING,   /* stop_data_source sent, waiting for replies */
  TR_SESSION_STOPPED,
};

/* A CLONE_SNAPSHOT trigger that hit a session: what traced tells the consumer of it, and what
 * the clone then records (clone_snapshot_trigger). */
struct tr_session_clone_trigger {
  uint64_t session_id;
  const char *trigger_name;
  const char *producer_name;
  uint32_t producer_uid;
  uint64_t boot_time_ns; /* when it was raised, service BOOTTIME */
  uint64_t delay_ms;     /* the trigger's stop_delay_ms: informational */
};

/* Told to the session's consumer (EnableTracing's reply and ObserveEvents). */
typedef struct tr_session_observer {
  void (*on_instance)(void *ud, const char *producer, const char *data_source, bool started);
  void (*on_all_started)(void *ud);
  /* The session stopped; error NULL for a normal end. Called once. */
  void (*on_end)(void *ud, const char *error);
  /* A CLONE_SNAPSHOT trigger of the session hit (tr_session_clone_trigger_hit): the consumer
   * clones the session (ObservableEvents.clone_trigger_hit). NULL: not told. */
  void (*on_clone_trigger_hit)(void *ud, const struct tr_session_clone_trigger *t);
} tr_session_observer;

/* Snapshots of a live session (session_clone.c). A clone flushes every host of the source
 * once, then copies (or, for buffers with transfer_on_clone, moves) every host's central
 * buffers into a new read-only session owned by the cloning consumer, which reads it as a
 * stopped session and frees it; the source goes on. */
struct tr_session_clone_args {
  uid_t consumer_uid;     /* the cloning consumer's */
  bool skip_trace_filter; /* the clone's config goes without trace_filter */
  bool for_bugreport;     /* the producers' flush says clone target: bugreport */
  struct tr_session_clone_trigger trigger; /* trigger_name NULL or "": not for a trigger */
};
/* The clone, or NULL and why (traced's words where it has them). */
typedef void (*tr_session_clone_cb)(void *ud, tr_session *clone, const char *error);
/* The session a consumer of uid asks to clone, by id (has_id) or by unique_session_name; NULL
 * with err filled: not found, another uid's (root may clone any), or one that writes into a
 * file. */
tr_session *tr_session_clone_source(tr_service *svc, bool has_id, uint64_t id, const char *name,
                                    uid_t uid, char *err, size_t err_len);
/* Clears the buffers with clear_before_clone, flushes src and then makes the clone: cb runs
 * once (maybe before this returns), with the clone (STOPPED, yours to tr_session_free) or an
 * error. 0, or TR_ERR_NOMEM with err filled (cb does not run). */
int tr_session_clone_start(tr_session *src, const struct tr_session_clone_args *args,
                           tr_session_clone_cb cb, void *ud, char *err, size_t err_len);
/* A CLONE_SNAPSHOT trigger hit s: tells its consumer, if it observes TYPE_CLONE_TRIGGER_HIT
 * (t->session_id is filled in here). */
void tr_session_clone_trigger_hit(tr_session *s, const struct tr_session_clone_trigger *t);

typedef void (*tr_session_flush_cb)(void *ud, bool ok);
struct tr_session_flush_counts {
  uint64_t requested, succeeded, failed;
  int final_outcome; /* of the flush that ended the session: 0 none, 1 ok, 2 failed */
};

/* The sessions' side of the link's upward calls (link_calls.h), for tr_link_server_start. */
extern const struct tr_link_events tr_session_link_events;

/* Those calls, also made directly by tests that stand in for the link. */
void tr_session_on_host_connected(tr_service *svc, tr_host *host);
void tr_session_on_host_disconnected(tr_service *svc, tr_host *host, const char *reason);
void tr_session_on_producers_changed(tr_service *svc, tr_host *host, uint32_t producer_id);
void tr_session_on_chunk(tr_service *svc, tr_host *host, const Tracerelay__Chunk *chunk);
void tr_session_on_patch(tr_service *svc, tr_host *host, const Tracerelay__Patch *patch);
void tr_session_on_flush_ack(tr_service *svc, tr_host *host, const Tracerelay__FlushAck *ack,
                             int64_t arrived_ns);
void tr_session_on_command_reply(tr_service *svc, tr_host *host,
                                 const Tracerelay__CommandReply *reply);
void tr_session_on_trigger(tr_service *svc, tr_host *host, const Tracerelay__Trigger *trigger);
int tr_session_on_host_clock_snapshot(tr_service *svc, tr_host *host,
                                      const Tracerelay__HostClockSnapshot *snap);
bool tr_session_any(const tr_service *svc);
bool tr_session_holds_host(const tr_service *svc, const tr_host *host);

/* Service state: loop, own uid and SystemInfo, the host table (made with this svc and
 * tr_session_link_events, or a test's events) and the link's downward calls (link_calls.h:
 * tr_link_server_commands, or a test's); both must outlive it. tr_session_service_free frees
 * sessions too, not the host table. */
int tr_session_service_init(tr_service *svc, uv_loop_t *loop, enum tr_timeline timeline,
                            tr_hosts *hosts, const struct tr_link_commands *link);
void tr_session_service_free(tr_service *svc);
/* The service's certificate's and CA's expiry (Unix seconds), as status shows them. */
void tr_session_service_set_tls_expiry(tr_service *svc, int64_t cert, int64_t ca);
/* The service-wide budget of central buffer memory (--max-buffer-memory; 0: none): a session
 * whose buffers on every connected host would pass it, with what running sessions reserve,
 * is refused; a host that joins a running session past it gets no central buffers there. */
void tr_session_service_set_max_buffer_memory(tr_service *svc, uint64_t bytes);

/* A trigger raised somewhere in the cluster: by a producer on a host (the link's Trigger
 * frame) or on the service's own host (`tracerelay trigger`, consumer_port.c). */
struct tr_session_trigger {
  const char *name;
  const char *producer_name;
  uint32_t producer_uid;
  const char *host; /* the machine that raised it */
};
/* Matches t against every session's trigger_config and acts on the sessions it matches, on
 * every host (session_triggers.c has the rules). */
void tr_session_triggers_activate(tr_service *svc, const struct tr_session_trigger *t);
/* trigger_config's checks (traced's, with its words), for tr_session_validate_config. */
int tr_session_triggers_validate(const Perfetto__Protos__TraceConfig *cfg, char *err,
                                 size_t err_len);

/* Checks a TraceConfig: 1..128 buffers with sizes the central buffer takes, at least one data
 * source with a name, target_buffer in range, filters that compile, periods in range. On error
 * returns TR_ERR_CONFIG and writes a message for the consumer into err. */
int tr_session_validate_config(const Perfetto__Protos__TraceConfig *cfg, char *err,
                               size_t err_len);
/* Makes a session from cfg (copied), output_fd (taken: closed by its read side; -1 if none),
 * sets up the matching data sources everywhere and starts them unless deferred_start.
 * TR_ERR_CONFIG (err filled), TR_ERR_FULL (too many sessions), TR_ERR_NOMEM,
 * TR_ERR_SYS(errno) for output_path. */
int tr_session_enable(tr_service *svc, uid_t consumer_uid,
                      const Perfetto__Protos__TraceConfig *cfg, int output_fd,
                      const tr_session_observer *obs, void *obs_ud, tr_session **out, char *err,
                      size_t err_len);
/* StartTracing: TR_ERR_STATE unless the session waits for it. */
int tr_session_start(tr_session *s);
/* Stops every instance; on_end follows once they replied or the stop timeout passed. */
void tr_session_disable(tr_session *s);
/* Ends the session at once, without waiting for its instances to stop: the read side's final
 * pass, then on_end(error) if not told yet. The session stays until tr_session_free. */
void tr_session_end(tr_session *s, const char *error);
/* Flush every host's producers; cb(ud, ok) once all acked or at the timeout (0 = the
 * session's flush_timeout_ms). Hosts that did not answer are logged and counted. */
int tr_session_flush(tr_session *s, uint32_t timeout_ms, uint64_t flags, tr_session_flush_cb cb,
                     void *ud);
/* What the session's flushes came to. */
void tr_session_flush_counts(const tr_session *s, struct tr_session_flush_counts *out);
/* Drops the observer if it is ud's: the consumer is gone or detached. Pending flush
 * callbacks still run (with ok = false when the session is freed first). */
void tr_session_forget(tr_session *s, void *ud);
void tr_session_set_observer(tr_session *s, const tr_session_observer *obs, void *ud);
/* DetachRequest's key (copied), under which an Attach finds the session; NULL clears it.
 * 0 or TR_ERR_NOMEM (the key is then unchanged). */
int tr_session_set_detach_key(tr_session *s, const char *key);
/* Stops what still runs (without waiting) and frees the session once its timers closed. */
void tr_session_free(tr_session *s);

/* What the other files read of a session. The service's sessions are a list:
 * for (tr_session *s = svc->sessions; s; s = tr_session_next(s)). */
tr_session *tr_session_next(const tr_session *s);
uint64_t tr_session_id(const tr_session *s);
uid_t tr_session_consumer_uid(const tr_session *s);
enum tr_session_state tr_session_get_state(const tr_session *s);
/* The session's copy of its TraceConfig, as enabled. */
const Perfetto__Protos__TraceConfig *tr_session_config(const tr_session *s);
/* Its read side (trace_output.h): ReadBuffers reads the session through it. */
tr_trace_output *tr_session_output(tr_session *s);
/* Data source instances set up so far, on every host (stopped ones included). */
size_t tr_session_num_instances(const tr_session *s);
/* The key it was detached under (tr_session_set_detach_key); NULL when attached. */
const char *tr_session_detach_key(const tr_session *s);
/* Whether a consumer of uid `viewer` may see session s listed (QueryServiceState, status): its
 * own uid's sessions, root all, as traced lists them. */
bool tr_session_visible_to(const tr_session *s, uid_t viewer);
/* The session whose config has this unique_session_name, clones aside (traced's rule: a name
 * is unique among the sessions that are not clones); NULL for none. */
tr_session *tr_session_named(const tr_service *svc, const char *name);
/* Whether s is a clone (session_clone.c): read-only, stopped from the start. */
bool tr_session_read_only(const tr_session *s);
/* Whether host ever joined the session (it has an entry, live or not). */
bool tr_session_has_host(const tr_session *s, const tr_host *host);

/* What the config asked for and found nowhere (session_unmatched.c), at most cap names each,
 * pointing into the config: data sources no producer has matched so far, and names of
 * machine_name_filter that no host of the session has. */
#define TR_SESSION_MAX_UNMATCHED 64
size_t tr_session_unmatched_data_sources(const tr_session *s, const char **out, size_t cap);
size_t tr_session_unmatched_machines(const tr_session *s, const char **out, size_t cap);
/* Logs both as warnings (at the session's start). */
void tr_session_unmatched_log(const tr_session *s);

/* The session's TraceStats (session_stats.c; free with tr_session_stats_free) and the bytes of
 * our per-host extension to append to its encoding (protos/tracerelay/tracerelay_stats.proto;
 * free with free()). 0 or TR_ERR_NOMEM. */
int tr_session_stats(tr_session *s, Perfetto__Protos__TraceStats **stats, uint8_t **ext,
                     size_t *ext_len);
void tr_session_stats_free(Perfetto__Protos__TraceStats *stats);
/* Both as one TracePacket at service BOOTTIME ts, for the tail of a read pass. */
int tr_session_stats_packet(tr_session *s, uint64_t ts, tr_trace_writer_buf *out);
/* Fills h with what the status and the trace's stats say alike of a host: its name, machine
 * id, `connected`, and its link and agent counters over the service's life (HostStats fields
 * 1-3 and 10-24). */
void tr_session_stats_fill_host(Tracerelay__HostStats *h, const tr_host *host, bool connected);
/* What session s holds of host, summed over the host's entries (one per agent instance):
 * the status's HostSessionStatus and the metrics' per-host losses (session_stats.c). */
struct tr_host_buffer_losses {
  uint64_t chunks_overwritten, bytes_overwritten, chunks_discarded, packets_lost_in_gaps;
  uint64_t trace_writer_packet_loss, patches_failed, invalid_packets, abi_violations;
};
/* Adds the losses of host's central buffers in s to *out. */
void tr_session_stats_add_host_losses(const tr_session *s, const tr_host *host,
                                      struct tr_host_buffer_losses *out);
struct tr_session_host_summary {
  uint32_t instances, instances_started;
  bool gone; /* it joined, and none of its entries is live (connected, current agent) */
};
void tr_session_stats_host_summary(const tr_session *s, const tr_host *host,
                                   struct tr_session_host_summary *out);

#endif
