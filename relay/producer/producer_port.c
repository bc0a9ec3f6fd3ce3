/* producer_port.c: the producer port's lifecycle, its connections and the 12 ProducerPort
 * methods (reference 2), in the order the .proto declares them, which fixes their ids.
 * Commands towards producers are in producer_commands.c, the commit path in producer_shm.c.
 *
 * A handler decodes its arguments, checks them against this producer's state, answers, and
 * only then runs the caller's callback, so that what the callback sends (a setup right after
 * a registration, say) reaches the producer after the reply, as traced orders it. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/base/log.h"
#include "relay/base/pb_valid.h"
#include "relay/producer/producer_port_priv.h"
#include "relay/base/tr_error.h"

#define LOG_COMP "producer-port"
/* Violations logged per producer; later ones are only counted. */
#define LOGGED_VIOLATIONS 16u

/* ---- helpers shared with producer_commands.c -------------------------------------------- */

pp_producer *pp_find_producer(const tr_producer_port *port, uint32_t producer_id) {
  for (pp_producer *p = port->producers; p; p = p->next)
    if (p->shm.producer_id == producer_id && p->initialized)
      return p;
  return NULL;
}

ssize_t pp_find_data_source(const pp_producer *p, const char *name) {
  for (size_t i = 0; i < p->num_data_sources; i++)
    if (strcmp(p->data_sources[i]->name, name) == 0)
      return (ssize_t)i;
  return -1;
}

ssize_t pp_find_instance(const pp_producer *p, uint64_t id) {
  for (size_t i = 0; i < p->num_instances; i++)
    if (p->instances[i].id == id)
      return (ssize_t)i;
  return -1;
}

tr_producer_info pp_info(const pp_producer *p) {
  return (tr_producer_info){
      .id = p->shm.producer_id,
      .name = p->name ? p->name : "",
      .sdk_version = p->sdk_version ? p->sdk_version : "",
      .uid = p->peer.uid,
      .gid = p->peer.gid,
      .pid = p->peer.pid,
      .data_sources = (const Perfetto__Protos__DataSourceDescriptor *const *)p->data_sources,
      .num_data_sources = p->num_data_sources,
      .guest_id = p->guest_id,
      .abi_violations = p->shm.stats.abi_violations,
      .smb_full = p->shm.stats.smb_full,
      .smb_full_ns = p->shm.stats.smb_full_ns};
}

/* Logs a violation already counted in the stats; disconnects once there were too many. */
static void report(pp_producer *p, const char *what, const char *why) {
  uint64_t n = p->shm.stats.abi_violations;
  if (n <= LOGGED_VIOLATIONS)
    TR_WARN(LOG_COMP, "producer %u (%.64s, pid %d): %s refused: %s%s", p->shm.producer_id,
            p->name ? p->name : "", (int)p->peer.pid, what, why,
            n == LOGGED_VIOLATIONS ? " (further violations are counted, not logged)" : "");
  if (n >= TR_PRODUCER_PORT_MAX_VIOLATIONS)
    tr_ipc_conn_close(p->conn, TR_IPC_CLOSE_VIOLATIONS, "too many ABI violations");
}

void pp_violation(pp_producer *p, const char *what, const char *why) {
  p->shm.stats.abi_violations++;
  report(p, what, why);
}

void pp_lock_queue(const tr_producer_port *port) {
  if (port->cfg.queue_lock)
    uv_mutex_lock(port->cfg.queue_lock);
}

void pp_unlock_queue(const tr_producer_port *port) {
  if (port->cfg.queue_lock)
    uv_mutex_unlock(port->cfg.queue_lock);
}

void pp_queue_changed(tr_producer_port *port, size_t queued) {
  if (queued > 0 && port->cfg.cb.queue_has_data)
    port->cfg.cb.queue_has_data(port);
}

void pp_remove_instance(pp_producer *p, size_t i) {
  free(p->instances[i].start_cmd);
  memmove(&p->instances[i], &p->instances[i + 1],
          (p->num_instances - i - 1) * sizeof(*p->instances));
  p->num_instances--;
}

/* ---- replies ---------------------------------------------------------------------------- */

static void refuse(pp_producer *p, uint64_t request_id, const char *what, const char *why) {
  tr_ipc_conn_reply(p->conn, request_id, false, false, NULL, 0, -1);
  pp_violation(p, what, why);
}

static void reply(pp_producer *p, uint64_t request_id, const ProtobufCMessage *msg) {
  uint8_t small[64];
  size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
  uint8_t *buf = len <= sizeof(small) ? small : malloc(len);
  if (!buf) {
    tr_ipc_conn_close(p->conn, TR_IPC_CLOSE_RESOURCES, "out of memory");
    return;
  }
  if (len)
    protobuf_c_message_pack(msg, buf);
  tr_ipc_conn_reply(p->conn, request_id, true, false, buf, len, -1);
  if (buf != small)
    free(buf);
}

static ProtobufCMessage *decode(pp_producer *p, uint64_t request_id, const char *what,
                                const ProtobufCMessageDescriptor *d, const uint8_t *args,
                                size_t len) {
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, args);
  if (m && !tr_pb_tags_valid(m)) { /* kept descriptors are forwarded: see pb_valid.h */
    protobuf_c_message_free_unpacked(m, NULL);
    m = NULL;
  }
  if (!m)
    refuse(p, request_id, what, "arguments do not decode");
  return m;
}

/* The prologue of every method but InitializeConnection: the producer behind the call (in *p)
 * and its decoded arguments (of type d, freed by the caller), or NULL when the call was
 * refused: made before InitializeConnection, or with arguments that do not decode. */
static void *begin(tr_ipc_conn *conn, uint64_t request_id, const char *what,
                   const ProtobufCMessageDescriptor *d, const uint8_t *args, size_t len,
                   pp_producer **p) {
  *p = tr_ipc_conn_data(conn);
  if (!(*p)->initialized) {
    refuse(*p, request_id, what, "called before InitializeConnection");
    return NULL;
  }
  return decode(*p, request_id, what, d, args, len);
}

static void notify_data_sources(pp_producer *p) {
  tr_producer_port *port = p->port;
  if (port->cfg.cb.data_sources_changed) {
    tr_producer_info info = pp_info(p);
    port->cfg.cb.data_sources_changed(port, &info);
  }
}

/* ---- 1 InitializeConnection ------------------------------------------------------------- */

/* A producer-provided SMB (reference 1.5) is used if it is a sealed memfd of a valid
 * geometry; otherwise ours is, as traced does. */
static bool adopt_smb(pp_producer *p, int fd) {
  tr_smb smb;
  int rc = tr_smb_adopt(&smb, fd, p->smb_page_hint);
  if (rc < 0) {
    close(fd);
    TR_INFO(LOG_COMP, "producer %u: its own SMB is not usable (%s): using ours",
            p->shm.producer_id, tr_strerror(rc));
    return false;
  }
  if (tr_producer_shm_set_smb(&p->shm, &smb) < 0) {
    tr_smb_close(&smb);
    return false;
  }
  return true;
}

static void m_initialize_connection(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                    size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "InitializeConnection";
  pp_producer *p = tr_ipc_conn_data(conn);
  int fd = tr_ipc_conn_take_fd(conn);
  if (p->initialized) {
    if (fd >= 0)
      close(fd);
    refuse(p, request_id, what, "second InitializeConnection");
    return;
  }
  Perfetto__Protos__InitializeConnectionRequest *req =
      (void *)decode(p, request_id, what, &perfetto__protos__initialize_connection_request__descriptor,
                     args, len);
  if (!req) {
    if (fd >= 0)
      close(fd);
    return;
  }
  p->name = strdup(req->producer_name ? req->producer_name : "");
  p->sdk_version = strdup(req->sdk_version ? req->sdk_version : "");
  p->smb_size_hint = req->shared_memory_size_hint_bytes;
  p->smb_page_hint = req->shared_memory_page_size_hint_bytes;
  p->shm.scraping =
      req->smb_scraping_mode ==
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__PRODUCER_SMBSCRAPING_MODE__SMB_SCRAPING_ENABLED;
  bool provided = req->producer_provided_shmem;
  perfetto__protos__initialize_connection_request__free_unpacked(req, NULL);
  if (!p->name || !p->sdk_version) {
    if (fd >= 0)
      close(fd);
    tr_ipc_conn_close(conn, TR_IPC_CLOSE_RESOURCES, "out of memory");
    return;
  }
  bool using_provided = false;
  if (provided && fd >= 0)
    using_provided = p->smb_provided = adopt_smb(p, fd);
  else if (fd >= 0)
    close(fd); /* an fd nobody asked for */
  p->initialized = true;
  Perfetto__Protos__InitializeConnectionResponse r =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_RESPONSE__INIT;
  r.has_using_shmem_provided_by_producer = r.has_direct_smb_patching_supported =
      r.has_use_shmem_emulation = true;
  r.using_shmem_provided_by_producer = using_provided;
  r.direct_smb_patching_supported = true;
  r.use_shmem_emulation = p->remote; /* no fd reaches a network peer (reference 4.7) */
  reply(p, request_id, &r.base);
  TR_INFO(LOG_COMP, "producer %u connected: %.64s (%.64s), pid %d uid %u", p->shm.producer_id,
          p->name, p->sdk_version, (int)p->peer.pid, (unsigned)p->peer.uid);
  if (p->port->cfg.cb.producer_connected) {
    tr_producer_info info = pp_info(p);
    p->port->cfg.cb.producer_connected(p->port, &info);
  }
}

/* ---- 2 RegisterDataSource, 3 UnregisterDataSource, 12 UpdateDataSource ------------------ */

/* Why a descriptor cannot be registered, or NULL. */
static const char *check_new_data_source(const pp_producer *p,
                                         const Perfetto__Protos__DataSourceDescriptor *d) {
  if (!d || !d->name || !d->name[0])
    return "data source without a name";
  if (pp_find_data_source(p, d->name) >= 0)
    return "data source already registered";
  if (p->num_data_sources >= TR_PRODUCER_PORT_MAX_DATA_SOURCES)
    return "too many data sources: at most 256 per producer";
  return NULL;
}

static int add_data_source(pp_producer *p, Perfetto__Protos__DataSourceDescriptor *d) {
  if (p->num_data_sources == p->cap_data_sources) {
    size_t cap = p->cap_data_sources ? 2 * p->cap_data_sources : 4;
    void *n = realloc(p->data_sources, cap * sizeof(*p->data_sources));
    if (!n)
      return TR_ERR_NOMEM;
    p->data_sources = n;
    p->cap_data_sources = cap;
  }
  p->data_sources[p->num_data_sources++] = d;
  return 0;
}

static void m_register_data_source(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                   size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "RegisterDataSource";
  pp_producer *p;
  Perfetto__Protos__RegisterDataSourceRequest *req =
      begin(conn, request_id, what, &perfetto__protos__register_data_source_request__descriptor,
            args, len, &p);
  if (!req)
    return;
  Perfetto__Protos__RegisterDataSourceResponse r =
      PERFETTO__PROTOS__REGISTER_DATA_SOURCE_RESPONSE__INIT;
  const char *why = check_new_data_source(p, req->data_source_descriptor);
  if (!why && add_data_source(p, req->data_source_descriptor) < 0)
    why = "out of memory";
  if (!why)
    req->data_source_descriptor = NULL; /* now ours; kept decoded, unknown fields and all */
  perfetto__protos__register_data_source_request__free_unpacked(req, NULL);
  if (why) {
    /* The response has a field for this: the SDK logs it. */
    r.error = (char *)why;
    reply(p, request_id, &r.base);
    pp_violation(p, what, why);
    return;
  }
  reply(p, request_id, &r.base);
  notify_data_sources(p);
}

static void m_unregister_data_source(tr_ipc_conn *conn, uint64_t request_id,
                                     const uint8_t *args, size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "UnregisterDataSource";
  pp_producer *p;
  Perfetto__Protos__UnregisterDataSourceRequest *req =
      begin(conn, request_id, what, &perfetto__protos__unregister_data_source_request__descriptor,
            args, len, &p);
  if (!req)
    return;
  ssize_t i = req->data_source_name ? pp_find_data_source(p, req->data_source_name) : -1;
  perfetto__protos__unregister_data_source_request__free_unpacked(req, NULL);
  if (i < 0) {
    refuse(p, request_id, what, "no such data source");
    return;
  }
  perfetto__protos__data_source_descriptor__free_unpacked(p->data_sources[i], NULL);
  memmove(&p->data_sources[i], &p->data_sources[i + 1],
          (p->num_data_sources - (size_t)i - 1) * sizeof(*p->data_sources));
  p->num_data_sources--;
  reply(p, request_id, NULL);
  notify_data_sources(p);
}

static void m_update_data_source(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                 size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "UpdateDataSource";
  pp_producer *p;
  Perfetto__Protos__UpdateDataSourceRequest *req =
      begin(conn, request_id, what, &perfetto__protos__update_data_source_request__descriptor, args,
            len, &p);
  if (!req)
    return;
  Perfetto__Protos__DataSourceDescriptor *d = req->data_source_descriptor;
  ssize_t i = d && d->name ? pp_find_data_source(p, d->name) : -1;
  /* Update matches {id, name} (reference 2.2). */
  if (i < 0 || p->data_sources[i]->id != d->id) {
    perfetto__protos__update_data_source_request__free_unpacked(req, NULL);
    refuse(p, request_id, what, "no registered data source with that name and id");
    return;
  }
  perfetto__protos__data_source_descriptor__free_unpacked(p->data_sources[i], NULL);
  p->data_sources[i] = d;
  req->data_source_descriptor = NULL;
  perfetto__protos__update_data_source_request__free_unpacked(req, NULL);
  reply(p, request_id, NULL);
  notify_data_sources(p);
}

/* ---- 4 CommitData ----------------------------------------------------------------------- */

static void m_commit_data(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                          size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "CommitData";
  pp_producer *p;
  Perfetto__Protos__CommitDataRequest *req = begin(
      conn, request_id, what, &perfetto__protos__commit_data_request__descriptor, args, len, &p);
  if (!req)
    return;
  tr_producer_port *port = p->port;
  tr_producer_commit_result res;
  pp_lock_queue(port);
  tr_producer_shm_commit(&p->shm, port->cfg.queue, req, &res);
  pp_unlock_queue(port);
  perfetto__protos__commit_data_request__free_unpacked(req, NULL);
  uint32_t id = p->shm.producer_id;
  if (res.violations) {
    tr_ipc_conn_reply(conn, request_id, false, false, NULL, 0, -1);
    report(p, what, res.first_violation);
  } else {
    reply(p, request_id, NULL);
  }
  /* p may be closing now, but stays valid until the loop's next turn. */
  pp_queue_changed(port, res.queued);
  if (res.flush_ack && port->cfg.cb.flush_acked)
    port->cfg.cb.flush_acked(port, id, res.flush_request_id);
}

/* ---- 5 GetAsyncCommand ------------------------------------------------------------------ */

static void m_get_async_command(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "GetAsyncCommand";
  pp_producer *p;
  ProtobufCMessage *req =
      begin(conn, request_id, what, &perfetto__protos__get_async_command_request__descriptor, args,
            len, &p);
  if (!req)
    return;
  protobuf_c_message_free_unpacked(req, NULL);
  if (p->has_async) {
    refuse(p, request_id, what, "second GetAsyncCommand stream");
    return;
  }
  /* No reply now: commands are streamed on this request id and it is never closed. */
  p->has_async = true;
  p->async_request_id = request_id;
}

/* ---- 6 RegisterTraceWriter, 7 UnregisterTraceWriter ------------------------------------- */

static void m_register_trace_writer(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                    size_t len, bool drop_reply) {
  (void)drop_reply;
  const char *what = "RegisterTraceWriter";
  pp_producer *p;
  Perfetto__Protos__RegisterTraceWriterRequest *req =
      begin(conn, request_id, what, &perfetto__protos__register_trace_writer_request__descriptor,
            args, len, &p);
  if (!req)
    return;
  int rc = tr_producer_shm_register_writer(&p->shm, req->trace_writer_id, req->target_buffer);
  perfetto__protos__register_trace_writer_request__free_unpacked(req, NULL);
  if (rc == TR_ERR_PROTO)
    refuse(p, request_id, what, "writer id 0 or over 32767");
  else if (rc < 0)
    tr_ipc_conn_close(conn, TR_IPC_CLOSE_RESOURCES, "out of memory");
  else
    reply(p, request_id, NULL);
}

static void m_unregister_trace_writer(tr_ipc_conn *conn, uint64_t request_id,
                                      const uint8_t *args, size_t len, bool drop_reply) {
  (void)drop_reply;
  pp_producer *p;
  Perfetto__Protos__UnregisterTraceWriterRequest *req =
      begin(conn, request_id, "UnregisterTraceWriter",
            &perfetto__protos__unregister_trace_writer_request__descriptor, args, len, &p);
  if (!req)
    return;
  /* The SDK may unregister a writer it never bound to a buffer: not an error. */
  tr_producer_shm_unregister_writer(&p->shm, req->trace_writer_id);
  perfetto__protos__unregister_trace_writer_request__free_unpacked(req, NULL);
  reply(p, request_id, NULL);
}

/* ---- 8 NotifyDataSourceStarted, 9 NotifyDataSourceStopped ------------------------------- */

/* Decodes and answers either Notify request (the one uint64 both carry: field 1, same layout).
 * Returns the index of the instance it names, or -1: for a refused call, and for an instance
 * not `waiting` for it, which is ignored as traced does (it can race with a stop timeout). */
static ssize_t notified_instance(tr_ipc_conn *conn, uint64_t request_id, const char *what,
                                 const uint8_t *args, size_t len, pp_instance_state waiting,
                                 pp_producer **p, uint64_t *id) {
  Perfetto__Protos__NotifyDataSourceStartedRequest *req =
      begin(conn, request_id, what,
            &perfetto__protos__notify_data_source_started_request__descriptor, args, len, p);
  if (!req)
    return -1;
  *id = req->data_source_id;
  perfetto__protos__notify_data_source_started_request__free_unpacked(req, NULL);
  reply(*p, request_id, NULL);
  ssize_t i = pp_find_instance(*p, *id);
  return i >= 0 && (*p)->instances[i].state == waiting ? i : -1;
}

static void m_notify_started(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                             size_t len, bool drop_reply) {
  (void)drop_reply;
  pp_producer *p;
  uint64_t id;
  ssize_t i = notified_instance(conn, request_id, "NotifyDataSourceStarted", args, len,
                                PP_STARTING, &p, &id);
  if (i < 0)
    return;
  p->instances[i].state = PP_STARTED;
  tr_producer_port *port = p->port;
  if (port->cfg.cb.data_source_started)
    port->cfg.cb.data_source_started(port, p->shm.producer_id, id);
}

static void m_notify_stopped(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                             size_t len, bool drop_reply) {
  (void)drop_reply;
  pp_producer *p;
  uint64_t id;
  ssize_t i = notified_instance(conn, request_id, "NotifyDataSourceStopped", args, len,
                                PP_STOPPING, &p, &id);
  if (i < 0)
    return;
  pp_remove_instance(p, (size_t)i);
  tr_producer_port *port = p->port;
  if (port->cfg.cb.data_source_stopped)
    port->cfg.cb.data_source_stopped(port, p->shm.producer_id, id, false);
}

/* ---- 10 ActivateTriggers, 11 Sync ------------------------------------------------------- */

static void m_activate_triggers(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                                size_t len, bool drop_reply) {
  (void)drop_reply;
  pp_producer *p;
  Perfetto__Protos__ActivateTriggersRequest *req =
      begin(conn, request_id, "ActivateTriggers",
            &perfetto__protos__activate_triggers_request__descriptor, args, len, &p);
  if (!req)
    return;
  reply(p, request_id, NULL);
  tr_producer_port *port = p->port;
  if (port->cfg.cb.triggers && req->n_trigger_names > 0)
    port->cfg.cb.triggers(port, p->shm.producer_id, (const char *const *)req->trigger_names,
                          req->n_trigger_names);
  perfetto__protos__activate_triggers_request__free_unpacked(req, NULL);
}

/* One loop thread handles a connection's calls in order, so every earlier call is done. */
static void m_sync(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args, size_t len,
                   bool drop_reply) {
  (void)drop_reply;
  pp_producer *p;
  ProtobufCMessage *req =
      begin(conn, request_id, "Sync", &perfetto__protos__sync_request__descriptor, args, len, &p);
  if (!req)
    return;
  protobuf_c_message_free_unpacked(req, NULL);
  reply(p, request_id, NULL);
}

static const tr_ipc_method kMethods[] = {
    {"InitializeConnection", m_initialize_connection},
    {"RegisterDataSource", m_register_data_source},
    {"UnregisterDataSource", m_unregister_data_source},
    {"CommitData", m_commit_data},
    {"GetAsyncCommand", m_get_async_command},
    {"RegisterTraceWriter", m_register_trace_writer},
    {"UnregisterTraceWriter", m_unregister_trace_writer},
    {"NotifyDataSourceStarted", m_notify_started},
    {"NotifyDataSourceStopped", m_notify_stopped},
    {"ActivateTriggers", m_activate_triggers},
    {"Sync", m_sync},
    {"UpdateDataSource", m_update_data_source},
};

const tr_ipc_service pp_producer_service = {"ProducerPort", kMethods,
                                            sizeof(kMethods) / sizeof(kMethods[0])};

/* ---- connections ------------------------------------------------------------------------ */

int pp_on_connect(tr_ipc_conn *conn) {
  tr_producer_port *port = tr_ipc_conn_host(conn)->data;
  if (port->next_id == 0) {
    TR_ERROR(LOG_COMP, "producer ids exhausted: restart the agent");
    return TR_ERR_FULL;
  }
  pp_producer *p = calloc(1, sizeof(*p));
  if (!p)
    return TR_ERR_NOMEM;
  p->port = port;
  p->conn = conn;
  p->peer = tr_ipc_conn_peer(conn);
  p->remote = tr_ipc_conn_host(conn) == &port->relay_host;
  tr_producer_shm_init(&p->shm, port->next_id++, (uint32_t)p->peer.uid, (int32_t)p->peer.pid);
  p->next = port->producers;
  if (port->producers)
    port->producers->prev = p;
  port->producers = p;
  tr_ipc_conn_set_data(conn, p);
  return 0;
}

static void free_producer(pp_producer *p) {
  for (size_t i = 0; i < p->num_data_sources; i++)
    perfetto__protos__data_source_descriptor__free_unpacked(p->data_sources[i], NULL);
  free(p->data_sources);
  for (size_t i = 0; i < p->num_instances; i++)
    free(p->instances[i].start_cmd);
  free(p->instances);
  tr_producer_shm_free(&p->shm);
  free(p->name);
  free(p->sdk_version);
  free(p);
}

/* The buffers of the sessions p is in (those of its instances, each once): O(instances^2), a
 * producer has a handful. NULL when it has none or memory ran out (then nothing is scraped). */
static uint32_t *session_buffers(const pp_producer *p, size_t *n) {
  *n = 0;
  uint32_t *set = p->num_instances ? malloc(p->num_instances * sizeof *set) : NULL;
  for (size_t i = 0; set && i < p->num_instances; i++) {
    size_t k = 0;
    while (k < *n && set[k] != p->instances[i].target_buffer)
      k++;
    if (k == *n)
      set[(*n)++] = p->instances[i].target_buffer;
  }
  return set;
}

/* What the producer leaves behind, before anyone hears it is gone: its last chunks scraped for
 * the sessions it is in (traced does so on every disconnect), what could not be counted, and,
 * if the agent closed the connection, why, once per session buffer (buffer 0 if in none). The
 * agent's shutdown closes every producer but is no loss of theirs: the agent stops in order. */
static void leave(pp_producer *p, enum tr_ipc_close why) {
  tr_producer_port *port = p->port;
  size_t n;
  uint32_t *buffers = session_buffers(p, &n);
  bool counted = why != TR_IPC_CLOSE_PEER && why != TR_IPC_CLOSE_HOST;
  pp_lock_queue(port);
  size_t queued = tr_producer_shm_scrape_exit(&p->shm, port->cfg.queue, buffers, n);
  for (size_t i = 0; counted && i < (n ? n : 1); i++)
    tr_chunkq_count_exit(port->cfg.queue, p->shm.producer_id, n ? buffers[i] : 0, 0,
                         (uint8_t)why);
  pp_unlock_queue(port);
  free(buffers);
  if (queued > 0 || p->shm.stats.exit_unscraped_chunks > 0)
    TR_INFO(LOG_COMP, "producer %u (%.64s): %zu chunks scraped from its shared memory at its "
            "departure, %llu could not be", p->shm.producer_id, p->name, queued,
            (unsigned long long)p->shm.stats.exit_unscraped_chunks);
  pp_queue_changed(port, queued);
}

void pp_on_disconnect(tr_ipc_conn *conn) {
  pp_producer *p = tr_ipc_conn_data(conn);
  tr_producer_port *port = p->port;
  if (p->prev)
    p->prev->next = p->next;
  else
    port->producers = p->next;
  if (p->next)
    p->next->prev = p->prev;
  if (p->initialized) {
    leave(p, tr_ipc_conn_close_why(conn));
    TR_INFO(LOG_COMP, "producer %u disconnected: %.64s, pid %d", p->shm.producer_id, p->name,
            (int)p->peer.pid);
    if (port->cfg.cb.producer_disconnected) {
      tr_producer_info info = pp_info(p);
      port->cfg.cb.producer_disconnected(port, &info);
    }
  }
  pp_relay_leave(p);
  free_producer(p);
}

/* ---- the port --------------------------------------------------------------------------- */

void pp_handle_closed(tr_producer_port *port) {
  if (--port->handles_open > 0)
    return;
  tr_guests_free(&port->guests);
  void (*cb)(void *) = port->close_cb;
  void *data = port->close_data;
  free(port);
  if (cb)
    cb(data);
}

static void on_timer_closed(uv_handle_t *h) { pp_handle_closed(h->data); }
static void on_host_closed(tr_ipc_host *host) { pp_handle_closed(host->data); }

int tr_producer_port_new(uv_loop_t *loop, const tr_producer_port_config *cfg,
                         tr_producer_port **out) {
  if (!cfg->queue)
    return TR_ERR_INVAL;
  tr_producer_port *port = calloc(1, sizeof(*port));
  if (!port)
    return TR_ERR_NOMEM;
  port->loop = loop;
  port->cfg = *cfg;
  port->next_id = 1;
  tr_guests_init(&port->guests);
  int rc = uv_timer_init(loop, &port->stop_timer);
  if (rc < 0) {
    free(port);
    return rc;
  }
  port->stop_timer.data = port;
  port->handles_open = 1;
  tr_ipc_host_config hc = {.name = "producer socket",
                           .services = &pp_producer_service,
                           .num_services = 1,
                           .on_connect = pp_on_connect,
                           .on_disconnect = pp_on_disconnect,
                           .max_conns = cfg->max_producers,
                           .max_conns_flag = cfg->max_producers_flag};
  rc = tr_ipc_host_init(&port->host, loop, &hc);
  if (rc < 0)
    goto fail_timer;
  port->host.data = port;
  port->handles_open = 2;
  *out = port;
  return 0;

fail_timer:
  /* The timer is a loop handle: the port is freed from its close callback. */
  uv_close((uv_handle_t *)&port->stop_timer, on_timer_closed);
  return rc;
}

int tr_producer_port_start(tr_producer_port *port, const char *path, mode_t mode) {
  return tr_ipc_host_start(&port->host, path, mode);
}

void tr_producer_port_close(tr_producer_port *port, void (*cb)(void *data), void *data) {
  port->close_cb = cb;
  port->close_data = data;
  uv_timer_stop(&port->stop_timer);
  uv_close((uv_handle_t *)&port->stop_timer, on_timer_closed);
  tr_ipc_host_close(&port->host, on_host_closed);
  if (port->relay_inited)
    tr_ipc_host_close(&port->relay_host, on_host_closed);
}

void *tr_producer_port_data(const tr_producer_port *port) { return port->cfg.cb.data; }

int tr_producer_port_stats(const tr_producer_port *port, uint32_t producer_id,
                           tr_producer_stats *out) {
  const pp_producer *p = pp_find_producer(port, producer_id);
  if (!p)
    return TR_ERR_NOT_FOUND;
  *out = p->shm.stats;
  pp_lock_queue(port);
  out->chunks_dropped = tr_chunkq_drops_of(port->cfg.queue, producer_id).chunks;
  pp_unlock_queue(port);
  return 0;
}
