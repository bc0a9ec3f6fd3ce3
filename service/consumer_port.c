/* consumer_port.c: the ConsumerPort method table (15 methods in Perfetto's order) and one
 * tr_consumer per connection (see consumer_port.h). */
#include "service/consumer_port.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "relay/link/relay_session.h"
#include "relay/producer/ipc_frame.h"
#include "relay/trace/packet_compress.h"
#include "service/hosts.h"
#include "service/state_reply.h"
#include "service/status.h"
#include "service/trace_output.h"

#define COMP "consumer"
/* traced cuts ReadBuffers replies at about 32 KiB of packet data (vectors README 6.1); the
 * second cap keeps many tiny slices under the 128 KiB frame limit. */
#define READ_DATA_BUDGET (32u * 1024u)
#define READ_REPLY_CAP (64u * 1024u) /* + one slice of READ_DATA_BUDGET: < 128 KiB */
#define READ_HIGH_WATER (512u * 1024u)

typedef struct flush_ctx flush_ctx;
typedef struct clone_ctx clone_ctx;

typedef struct tr_consumer {
  tr_consumer_port *port;
  tr_ipc_conn *conn;
  tr_ipc_peer peer;
  tr_session *session; /* NULL when none or detached */
  bool enable_pending;
  uint64_t enable_req;
  bool observing;
  uint64_t observe_req;
  bool observe_instances, observe_started, observe_clone_trigger;
  /* ReadBuffers stream */
  bool reading;
  uint64_t read_req;
  uint8_t *pkt; /* current packet (data + trusted), copied so it survives a drain wait */
  size_t pkt_len, pkt_cap, pkt_off;
  bool have_pkt;
  tr_packet_compress *compress; /* the config's compression, for the read under way */
  uint8_t *reply;
  flush_ctx *flushes;
  clone_ctx *cloning; /* the CloneSession awaiting its source's flush; NULL for none */
} tr_consumer;

struct flush_ctx {
  tr_consumer *c; /* NULL once the consumer is gone */
  uint64_t req;
  flush_ctx *next;
};

struct clone_ctx {
  tr_consumer *c; /* NULL once the consumer is gone: the clone is freed when it comes */
  uint64_t req;
};

/* ---- encoding helpers ---- */

static void reply_msg(tr_consumer *c, uint64_t req, const ProtobufCMessage *msg, bool has_more) {
  size_t n = msg ? protobuf_c_message_get_packed_size(msg) : 0;
  uint8_t *buf = malloc(n + 1);
  if (!buf) {
    tr_ipc_conn_reply(c->conn, req, false, false, NULL, 0, -1);
    return;
  }
  if (msg)
    protobuf_c_message_pack(msg, buf);
  tr_ipc_conn_reply(c->conn, req, true, has_more, buf, n, -1);
  free(buf);
}

static void reply_empty(tr_consumer *c, uint64_t req) {
  tr_ipc_conn_reply(c->conn, req, true, false, NULL, 0, -1);
}

static void reply_fail(tr_consumer *c, uint64_t req) {
  tr_ipc_conn_reply(c->conn, req, false, false, NULL, 0, -1);
}

static tr_consumer *consumer_of(tr_ipc_conn *conn) {
  return tr_ipc_conn_data(conn);
}

/* ---- session observer ---- */

static void send_enable_reply(tr_consumer *c, const char *error) {
  Perfetto__Protos__EnableTracingResponse r = PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__INIT;
  if (!c->enable_pending)
    return;
  c->enable_pending = false;
  if (error) {
    r.error = (char *)error;
  } else {
    r.state_case = PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__STATE_DISABLED;
    r.disabled = 1;
  }
  reply_msg(c, c->enable_req, &r.base, false);
}

static void send_event(tr_consumer *c, Perfetto__Protos__ObservableEvents *ev) {
  Perfetto__Protos__ObserveEventsResponse r = PERFETTO__PROTOS__OBSERVE_EVENTS_RESPONSE__INIT;
  r.events = ev;
  reply_msg(c, c->observe_req, &r.base, true);
}

static void on_instance(void *ud, const char *producer, const char *ds, bool started) {
  tr_consumer *c = ud;
  Perfetto__Protos__ObservableEvents ev = PERFETTO__PROTOS__OBSERVABLE_EVENTS__INIT;
  Perfetto__Protos__ObservableEvents__DataSourceInstanceStateChange ch =
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__DATA_SOURCE_INSTANCE_STATE_CHANGE__INIT;
  Perfetto__Protos__ObservableEvents__DataSourceInstanceStateChange *chp = &ch;
  if (!c->observing || !c->observe_instances)
    return;
  ch.producer_name = (char *)producer;
  ch.data_source_name = (char *)ds;
  ch.has_state = 1;
  ch.state =
      started
          ? PERFETTO__PROTOS__OBSERVABLE_EVENTS__DATA_SOURCE_INSTANCE_STATE__DATA_SOURCE_INSTANCE_STATE_STARTED
          : PERFETTO__PROTOS__OBSERVABLE_EVENTS__DATA_SOURCE_INSTANCE_STATE__DATA_SOURCE_INSTANCE_STATE_STOPPED;
  ev.n_instance_state_changes = 1;
  ev.instance_state_changes = &chp;
  send_event(c, &ev);
}

static void on_all_started(void *ud) {
  tr_consumer *c = ud;
  Perfetto__Protos__ObservableEvents ev = PERFETTO__PROTOS__OBSERVABLE_EVENTS__INIT;
  if (!c->observing || !c->observe_started)
    return;
  ev.has_all_data_sources_started = 1;
  ev.all_data_sources_started = 1;
  send_event(c, &ev);
}

static void on_end(void *ud, const char *error) {
  send_enable_reply(ud, error);
}

/* traced's notification of a CLONE_SNAPSHOT trigger: the CLI then clones the session. */
static void on_clone_trigger_hit(void *ud, const struct tr_session_clone_trigger *t) {
  tr_consumer *c = ud;
  Perfetto__Protos__ObservableEvents ev = PERFETTO__PROTOS__OBSERVABLE_EVENTS__INIT;
  Perfetto__Protos__ObservableEvents__CloneTriggerHit hit =
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__CLONE_TRIGGER_HIT__INIT;
  if (!c->observing || !c->observe_clone_trigger)
    return;
  hit.has_tracing_session_id = 1;
  hit.tracing_session_id = (int64_t)t->session_id;
  hit.trigger_name = (char *)t->trigger_name;
  hit.producer_name = (char *)t->producer_name;
  hit.has_producer_uid = 1;
  hit.producer_uid = t->producer_uid;
  hit.has_boot_time_ns = 1;
  hit.boot_time_ns = t->boot_time_ns;
  hit.has_trigger_delay_ms = 1;
  hit.trigger_delay_ms = t->delay_ms;
  ev.clone_trigger_hit = &hit;
  send_event(c, &ev);
}

static const tr_session_observer observer = {on_instance, on_all_started, on_end,
                                             on_clone_trigger_hit};

/* ---- methods ---- */

static void enable_tracing(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                           bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__EnableTracingRequest *r;
  Perfetto__Protos__EnableTracingResponse resp = PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__INIT;
  char err[256] = "";
  int fd = -1, rc;
  (void)drop;

  r = perfetto__protos__enable_tracing_request__unpack(NULL, len, args);
  if (!r) {
    reply_fail(c, req);
    return;
  }
  if (r->attach_notification_only) {
    if (!c->session) {
      resp.error = "attach_notification_only: this consumer has no attached session";
      reply_msg(c, req, &resp.base, false);
    } else {
      c->enable_pending = true;
      c->enable_req = req;
      if (tr_session_get_state(c->session) == TR_SESSION_STOPPED)
        send_enable_reply(c, NULL);
    }
    goto out;
  }
  if (c->session) {
    resp.error = "this consumer already has a tracing session: free it or open a new connection";
    reply_msg(c, req, &resp.base, false);
    goto out;
  }
  if (r->trace_config && r->trace_config->write_into_file &&
      !(r->trace_config->output_path && r->trace_config->output_path[0]))
    fd = tr_ipc_conn_take_fd(conn);
  c->enable_pending = true;
  c->enable_req = req;
  rc = tr_session_enable(c->port->svc, c->peer.uid, r->trace_config, fd, &observer, c,
                         &c->session, err, sizeof err);
  if (rc != 0) {
    TR_WARN(COMP, "EnableTracing from uid %u pid %d refused: %s", (unsigned)c->peer.uid,
            (int)c->peer.pid, err[0] ? err : tr_strerror(rc));
    send_enable_reply(c, err[0] ? err : tr_strerror(rc));
  }
out:
  perfetto__protos__enable_tracing_request__free_unpacked(r, NULL);
}

static void disable_tracing(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                            bool drop) {
  tr_consumer *c = consumer_of(conn);
  (void)args;
  (void)len;
  (void)drop;
  if (!c->session) {
    reply_fail(c, req);
    return;
  }
  /* Replied first: the consumer sees this reply before the EnableTracing one, as traced does. */
  reply_empty(c, req);
  tr_session_disable(c->session);
}

static void start_tracing(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                          bool drop) {
  tr_consumer *c = consumer_of(conn);
  (void)args;
  (void)len;
  (void)drop;
  if (!c->session || tr_session_start(c->session) != 0) {
    reply_fail(c, req);
    return;
  }
  reply_empty(c, req);
}

static void read_finish(tr_consumer *c) {
  c->reading = false;
  c->have_pkt = false;
  tr_packet_compress_free(c->compress);
  c->compress = NULL;
  tr_ipc_conn_on_drain(c->conn, NULL);
  if (c->session)
    tr_trace_output_reset(tr_session_output(c->session));
}

static int hold_packet(tr_consumer *c, const uint8_t *data, size_t len, const uint8_t *tail,
                       size_t tail_len) {
  size_t n = len + tail_len;
  if (n > c->pkt_cap) {
    uint8_t *np = realloc(c->pkt, n);
    if (!np)
      return TR_ERR_NOMEM;
    c->pkt = np;
    c->pkt_cap = n;
  }
  if (len)
    memcpy(c->pkt, data, len);
  if (tail_len)
    memcpy(c->pkt + len, tail, tail_len);
  c->pkt_len = n;
  c->pkt_off = 0;
  c->have_pkt = true;
  return 1;
}

/* Compressed, the next packet is a group of the pass's packets, as traced compresses each
 * ReadBuffers step's (packet_compress.h). */
static int take_group(tr_consumer *c) {
  const uint8_t *out;
  size_t n;
  int rc;
  while (!tr_packet_compress_full(c->compress)) {
    tr_output_packet p;
    if ((rc = tr_trace_output_next(tr_session_output(c->session), &p)) <= 0) {
      if (rc < 0)
        return rc;
      break;
    }
    if ((rc = tr_packet_compress_add(c->compress, p.data, p.len, p.trusted, p.trusted_len)) != 0)
      return rc;
  }
  if (tr_packet_compress_count(c->compress) == 0)
    return 0;
  if ((rc = tr_packet_compress_finish(c->compress, &out, &n)) != 0)
    return rc;
  return hold_packet(c, out, n, NULL, 0);
}

static int take_packet(tr_consumer *c) {
  tr_output_packet p;
  if (c->compress)
    return take_group(c);
  int rc = tr_trace_output_next(tr_session_output(c->session), &p);
  return rc <= 0 ? rc : hold_packet(c, p.data, p.len, p.trusted, p.trusted_len);
}

/* Sends replies until the pass is over or the socket is backed up (then waits for drain). */
static void read_pump(tr_ipc_conn *conn) {
  tr_consumer *c = consumer_of(conn);
  for (;;) {
    size_t used = 0, data = 0;
    bool done = false;
    while (data < READ_DATA_BUDGET && used < READ_REPLY_CAP) {
      size_t n, hl = 0, inner;
      uint8_t tmp[10];
      bool last;
      if (!c->have_pkt) {
        int rc = take_packet(c);
        if (rc < 0) {
          TR_ERROR(COMP, "ReadBuffers failed: %s", tr_strerror(rc));
          reply_fail(c, c->read_req);
          read_finish(c);
          return;
        }
        if (rc == 0) {
          done = true;
          break;
        }
      }
      n = c->pkt_len - c->pkt_off;
      if (n > READ_DATA_BUDGET - data)
        n = READ_DATA_BUDGET - data;
      last = c->pkt_off + n == c->pkt_len;
      /* slices (2) {1: data, 2: last_slice_for_packet} */
      inner = 1 + tr_varint_put(tmp, n) + n + (last ? 2 : 0);
      c->reply[used + hl++] = 0x12;
      hl += tr_varint_put(c->reply + used + hl, inner);
      c->reply[used + hl++] = 0x0A;
      hl += tr_varint_put(c->reply + used + hl, n);
      memcpy(c->reply + used + hl, c->pkt + c->pkt_off, n);
      used += hl + n;
      if (last) {
        c->reply[used++] = 0x10;
        c->reply[used++] = 0x01;
      }
      c->pkt_off += n;
      data += n;
      if (last)
        c->have_pkt = false;
    }
    if (tr_ipc_conn_reply(conn, c->read_req, true, !done, c->reply, used, -1) != 0) {
      read_finish(c);
      return;
    }
    if (done) {
      read_finish(c);
      return;
    }
    if (tr_ipc_conn_out_bytes(conn) > READ_HIGH_WATER) {
      tr_ipc_conn_on_drain(conn, read_pump);
      return;
    }
  }
}

static void read_buffers(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                         bool drop) {
  tr_consumer *c = consumer_of(conn);
  (void)args;
  (void)len;
  (void)drop;
  if (!c->session || c->reading || tr_session_config(c->session)->write_into_file) {
    if (c->session && tr_session_config(c->session)->write_into_file)
      TR_WARN(COMP, "ReadBuffers on a write_into_file session refused (the trace goes to the "
                    "file)");
    reply_fail(c, req);
    return;
  }
  if (!c->reply && !(c->reply = malloc(READ_REPLY_CAP + READ_DATA_BUDGET + 64))) {
    reply_fail(c, req);
    return;
  }
  int level;
  enum tr_packet_codec codec = tr_packet_compress_codec(tr_session_config(c->session), &level);
  if (codec != TR_PACKET_CODEC_NONE &&
      tr_packet_compress_new(codec, level, TR_PACKET_COMPRESS_READ_GROUP, &c->compress) != 0) {
    reply_fail(c, req);
    return;
  }
  if (tr_trace_output_begin(tr_session_output(c->session)) != 0) {
    tr_packet_compress_free(c->compress);
    c->compress = NULL;
    reply_fail(c, req);
    return;
  }
  c->reading = true;
  c->read_req = req;
  c->have_pkt = false;
  read_pump(conn);
}

static void free_session(tr_consumer *c) {
  if (!c->session)
    return;
  if (c->reading)
    read_finish(c);
  tr_session_free(c->session);
  c->session = NULL;
  send_enable_reply(c, NULL);
}

static void free_buffers(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                         bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__FreeBuffersRequest *r =
      perfetto__protos__free_buffers_request__unpack(NULL, len, args);
  (void)drop;
  if (!r) {
    reply_fail(c, req);
    return;
  }
  perfetto__protos__free_buffers_request__free_unpacked(r, NULL);
  free_session(c);
  reply_empty(c, req);
}

static void on_flush_done(void *ud, bool ok) {
  flush_ctx *f = ud;
  tr_consumer *c = f->c;
  if (c) {
    for (flush_ctx **p = &c->flushes; *p; p = &(*p)->next)
      if (*p == f) {
        *p = f->next;
        break;
      }
    if (ok)
      reply_empty(c, f->req);
    else
      reply_fail(c, f->req);
  }
  free(f);
}

static void flush(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len, bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__FlushRequest *r = perfetto__protos__flush_request__unpack(NULL, len, args);
  flush_ctx *f;
  (void)drop;
  if (!r || !c->session || !(f = calloc(1, sizeof *f))) {
    if (r)
      perfetto__protos__flush_request__free_unpacked(r, NULL);
    reply_fail(c, req);
    return;
  }
  f->c = c;
  f->req = req;
  f->next = c->flushes;
  c->flushes = f;
  if (tr_session_flush(c->session, r->timeout_ms, r->flags, on_flush_done, f) != 0)
    on_flush_done(f, false);
  perfetto__protos__flush_request__free_unpacked(r, NULL);
}

static void change_trace_config(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                                bool drop) {
  (void)args;
  (void)len;
  (void)drop;
  TR_INFO(COMP, "ChangeTraceConfig is not supported by tracerelay; refused");
  reply_fail(consumer_of(conn), req);
}

static void detach(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len, bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__DetachRequest *r = perfetto__protos__detach_request__unpack(NULL, len, args);
  (void)drop;
  if (!r || !c->session || !r->key || !r->key[0]) {
    if (r)
      perfetto__protos__detach_request__free_unpacked(r, NULL);
    reply_fail(c, req);
    return;
  }
  int rc = tr_session_set_detach_key(c->session, r->key);
  perfetto__protos__detach_request__free_unpacked(r, NULL);
  if (rc != 0) {
    reply_fail(c, req);
    return;
  }
  if (c->reading)
    read_finish(c);
  tr_session_forget(c->session, c);
  c->session = NULL;
  c->enable_pending = false;
  reply_empty(c, req);
}

static bool detached_under(const tr_session *s, const char *key) {
  const char *k = tr_session_detach_key(s);
  return k && strcmp(k, key) == 0;
}

static void attach(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len, bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__AttachRequest *r = perfetto__protos__attach_request__unpack(NULL, len, args);
  Perfetto__Protos__AttachResponse resp = PERFETTO__PROTOS__ATTACH_RESPONSE__INIT;
  tr_session *s = NULL;
  (void)drop;
  if (r && r->key && !c->session) {
    for (s = c->port->svc->sessions; s; s = tr_session_next(s))
      if (detached_under(s, r->key) && tr_session_consumer_uid(s) == c->peer.uid)
        break;
    for (tr_session *o = c->port->svc->sessions; !s && o; o = tr_session_next(o))
      if (detached_under(o, r->key))
        TR_WARN(COMP, "Attach from uid %u pid %d refused: the session detached under that key "
                "belongs to uid %u", (unsigned)c->peer.uid, (int)c->peer.pid,
                (unsigned)tr_session_consumer_uid(o));
  }
  if (r)
    perfetto__protos__attach_request__free_unpacked(r, NULL);
  if (!s) {
    reply_fail(c, req);
    return;
  }
  tr_session_set_detach_key(s, NULL);
  c->session = s;
  tr_session_set_observer(s, &observer, c);
  /* Only packed into the reply: never written through. */
  resp.trace_config = (Perfetto__Protos__TraceConfig *)tr_session_config(s);
  reply_msg(c, req, &resp.base, false);
}

static void get_trace_stats(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                            bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__TraceStats *st = NULL;
  uint8_t *ext = NULL, *buf = NULL;
  size_t ext_len = 0, n, used = 0;
  (void)args;
  (void)len;
  (void)drop;
  if (!c->session || tr_session_stats(c->session, &st, &ext, &ext_len) != 0) {
    reply_fail(c, req);
    return;
  }
  /* GetTraceStatsResponse {1: TraceStats bytes followed by our extension} */
  n = perfetto__protos__trace_stats__get_packed_size(st) + ext_len;
  buf = malloc(n + 16);
  if (buf) {
    buf[used++] = 0x0A;
    used += tr_varint_put(buf + used, n);
    used += perfetto__protos__trace_stats__pack(st, buf + used);
    memcpy(buf + used, ext, ext_len);
    used += ext_len;
    tr_ipc_conn_reply(conn, req, true, false, buf, used, -1);
  } else {
    reply_fail(c, req);
  }
  free(buf);
  free(ext);
  tr_session_stats_free(st);
}

static void observe_events(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                           bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__ObserveEventsRequest *r =
      perfetto__protos__observe_events_request__unpack(NULL, len, args);
  (void)drop;
  if (!r) {
    reply_fail(c, req);
    return;
  }
  if (c->observing) /* a new request replaces the stream: close the old one */
    reply_empty(c, c->observe_req);
  c->observing = r->n_events_to_observe > 0;
  c->observe_instances = c->observe_started = c->observe_clone_trigger = false;
  for (size_t i = 0; i < r->n_events_to_observe; i++) {
    c->observe_instances |= r->events_to_observe[i] ==
                            PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_DATA_SOURCES_INSTANCES;
    c->observe_started |= r->events_to_observe[i] ==
                          PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_ALL_DATA_SOURCES_STARTED;
    c->observe_clone_trigger |=
        r->events_to_observe[i] == PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_CLONE_TRIGGER_HIT;
  }
  c->observe_req = req;
  if (!c->observing)
    reply_empty(c, req);
  perfetto__protos__observe_events_request__free_unpacked(r, NULL);
}

/* ---- QueryServiceState: one small TracingServiceState per element, cut into replies as
 * state_reply.h says (the Perfetto client and UI see every element only that way). ---- */

/* The service as a whole: its version and how many sessions it has, started or not. */
static void state_add_service(tr_state_reply *o, const tr_service *svc) {
  Perfetto__Protos__TracingServiceState st;
  perfetto__protos__tracing_service_state__init(&st);
  st.tracing_service_version = svc->system_info->tracing_service_version;
  st.has_num_sessions = 1;
  st.num_sessions = (int32_t)svc->num_sessions;
  st.has_num_sessions_started = 1;
  st.has_supports_tracing_sessions = 1;
  st.supports_tracing_sessions = 1;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
    st.num_sessions_started += tr_session_get_state(s) == TR_SESSION_STARTED;
  tr_state_reply_add(o, &st.base);
}

/* One producer of host, under the id `id` of this reply, then each of its data sources. */
static void state_add_producer(tr_state_reply *o, const tr_host *host, const tr_remote_producer *rp,
                               int32_t id) {
  Perfetto__Protos__TracingServiceState one;
  Perfetto__Protos__TracingServiceState__Producer pr =
      PERFETTO__PROTOS__TRACING_SERVICE_STATE__PRODUCER__INIT;
  Perfetto__Protos__TracingServiceState__Producer *prp = &pr;
  perfetto__protos__tracing_service_state__init(&one);
  pr.has_id = 1;
  pr.id = id;
  pr.name = rp->name;
  pr.has_uid = 1;
  pr.uid = (int32_t)rp->uid;
  pr.has_pid = 1;
  pr.pid = rp->pid;
  pr.sdk_version = rp->sdk_version;
  pr.has_machine_id = 1;
  pr.machine_id = host->machine_id;
  pr.machine_name = (char *)host->name;
  one.n_producers = 1;
  one.producers = &prp;
  tr_state_reply_add(o, &one.base);
  for (size_t d = 0; d < rp->num_data_sources; d++) {
    Perfetto__Protos__TracingServiceState__DataSource ds =
        PERFETTO__PROTOS__TRACING_SERVICE_STATE__DATA_SOURCE__INIT;
    Perfetto__Protos__TracingServiceState__DataSource *dsp = &ds;
    perfetto__protos__tracing_service_state__init(&one);
    ds.ds_descriptor = rp->data_sources[d];
    ds.has_producer_id = 1;
    ds.producer_id = id;
    one.n_data_sources = 1;
    one.data_sources = &dsp;
    tr_state_reply_add(o, &one.base);
  }
}

/* Every reachable producer of every host, numbered across hosts in this reply (agent ids
 * repeat across hosts). */
static void state_add_producers(tr_state_reply *o, const tr_service *svc) {
  int32_t id = 0;
  for (const tr_host *host = tr_hosts_first(svc->hosts); host; host = host->next)
    for (size_t p = 0; p < host->num_producers; p++)
      if (tr_hosts_producer_reachable(host, p))
        state_add_producer(o, host, &host->producers[p], ++id);
}

/* tracerelay status: the service's machine and one HostStatus per host (service/status.h),
 * skipped by perfetto; a host's sessions as `viewer` may see them. */
static void state_add_status(tr_state_reply *o, tr_service *svc, uid_t viewer) {
  uint8_t *bytes = NULL;
  size_t n;
  if (tr_status_service(svc, &bytes, &n) == 0)
    tr_state_reply_add_raw(o, bytes, n);
  free(bytes);
  for (tr_host *host = tr_hosts_first(svc->hosts); host; host = host->next) {
    if (tr_status_host(svc, host, viewer, &bytes, &n) == 0)
      tr_state_reply_add_raw(o, bytes, n);
    free(bytes);
  }
}

/* One tracing session, as traced describes it. */
static void state_add_session(tr_state_reply *o, const tr_session *s) {
  static char *const states[] = {"CONFIGURED", "STARTED", "DISABLING_WAITING_STOP_ACKS",
                                 "DISABLED"};
  const Perfetto__Protos__TraceConfig *cfg = tr_session_config(s);
  Perfetto__Protos__TracingServiceState one;
  Perfetto__Protos__TracingServiceState__TracingSession ts =
      PERFETTO__PROTOS__TRACING_SERVICE_STATE__TRACING_SESSION__INIT;
  Perfetto__Protos__TracingServiceState__TracingSession *tsp = &ts;
  uint32_t sizes[TR_SESSION_MAX_BUFFERS];
  perfetto__protos__tracing_service_state__init(&one);
  ts.has_id = 1;
  ts.id = tr_session_id(s);
  ts.has_consumer_uid = 1;
  ts.consumer_uid = (int32_t)tr_session_consumer_uid(s);
  ts.state = states[tr_session_get_state(s)];
  ts.unique_session_name = cfg->unique_session_name;
  for (size_t b = 0; b < cfg->n_buffers; b++)
    sizes[b] = cfg->buffers[b]->size_kb;
  ts.n_buffer_size_kb = cfg->n_buffers;
  ts.buffer_size_kb = sizes;
  ts.has_duration_ms = 1;
  ts.duration_ms = cfg->duration_ms;
  ts.has_num_data_sources = 1;
  ts.num_data_sources = (uint32_t)tr_session_num_instances(s);
  ts.has_is_started = 1;
  ts.is_started = tr_session_get_state(s) == TR_SESSION_STARTED;
  one.n_tracing_sessions = 1;
  one.tracing_sessions = &tsp;
  tr_state_reply_add(o, &one.base);
}

/* The service, then (unless sessions_only) its producers and the status, then the sessions
 * the consumer may see. */
static void query_service_state(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                                bool drop) {
  tr_consumer *c = consumer_of(conn);
  tr_service *svc = c->port->svc;
  Perfetto__Protos__QueryServiceStateRequest *r =
      perfetto__protos__query_service_state_request__unpack(NULL, len, args);
  tr_state_reply o;
  (void)drop;
  if (!r || tr_state_reply_begin(&o, conn, req) != 0) {
    if (r)
      perfetto__protos__query_service_state_request__free_unpacked(r, NULL);
    reply_fail(c, req);
    return;
  }
  bool sessions_only = r->sessions_only;
  perfetto__protos__query_service_state_request__free_unpacked(r, NULL);
  state_add_service(&o, svc);
  if (!sessions_only) {
    state_add_producers(&o, svc);
    state_add_status(&o, svc, c->peer.uid);
  }
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
    if (tr_session_visible_to(s, c->peer.uid))
      state_add_session(&o, s);
  tr_state_reply_end(&o);
}

static void query_capabilities(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                               bool drop) {
  Perfetto__Protos__QueryCapabilitiesResponse r =
      PERFETTO__PROTOS__QUERY_CAPABILITIES_RESPONSE__INIT;
  Perfetto__Protos__TracingServiceCapabilities caps =
      PERFETTO__PROTOS__TRACING_SERVICE_CAPABILITIES__INIT;
  Perfetto__Protos__ObservableEvents__Type events[] = {
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_DATA_SOURCES_INSTANCES,
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_ALL_DATA_SOURCES_STARTED,
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_CLONE_TRIGGER_HIT};
  (void)args;
  (void)len;
  (void)drop;
  caps.has_has_query_capabilities = 1;
  caps.has_query_capabilities = 1;
  caps.n_observable_events = sizeof events / sizeof events[0];
  caps.observable_events = events;
  caps.has_has_trace_config_output_path = 1;
  caps.has_trace_config_output_path = 1;
  caps.has_has_clone_session = 1;
  caps.has_clone_session = 1;
  r.capabilities = &caps;
  reply_msg(consumer_of(conn), req, &r.base, false);
}

static void save_trace_for_bugreport(tr_ipc_conn *conn, uint64_t req, const uint8_t *args,
                                     size_t len, bool drop) {
  Perfetto__Protos__SaveTraceForBugreportResponse r =
      PERFETTO__PROTOS__SAVE_TRACE_FOR_BUGREPORT_RESPONSE__INIT;
  (void)args;
  (void)len;
  (void)drop;
  r.has_success = 1;
  r.success = 0;
  r.msg = "SaveTraceForBugreport is not supported by tracerelay (deprecated in Perfetto too)";
  reply_msg(consumer_of(conn), req, &r.base, false);
}

static void reply_clone(tr_consumer *c, uint64_t req, tr_session *clone, const char *error) {
  Perfetto__Protos__CloneSessionResponse r = PERFETTO__PROTOS__CLONE_SESSION_RESPONSE__INIT;
  r.has_success = 1;
  r.success = clone != NULL;
  if (clone) {
    r.has_uuid_msb = r.has_uuid_lsb = 1;
    tr_trace_output_uuid(tr_session_output(clone), &r.uuid_msb, &r.uuid_lsb);
    r.has_was_write_into_file = 1; /* read with ReadBuffers, never into the consumer's file */
    r.error = "";                  /* as traced's reply has it */
  } else {
    r.error = (char *)error;
    TR_WARN(COMP, "CloneSession from uid %u pid %d refused: %s", (unsigned)c->peer.uid,
            (int)c->peer.pid, error);
  }
  reply_msg(c, req, &r.base, false);
}

static void on_cloned(void *ud, tr_session *clone, const char *error) {
  clone_ctx *x = ud;
  tr_consumer *c = x->c;
  if (!c) {
    if (clone)
      tr_session_free(clone);
  } else {
    c->cloning = NULL;
    if (clone) {
      c->session = clone;
      tr_session_set_observer(clone, &observer, c);
    }
    reply_clone(c, x->req, clone, error);
  }
  free(x);
}

/* CloneSession: the consumer gets a read-only copy of a live session (session.h, "Snapshots"),
 * which it reads with ReadBuffers and frees. The file descriptor the CLI always sends is not
 * written: the clone is read over the socket, as traced does for a session not writing into a
 * file. */
static void clone_session(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                          bool drop) {
  tr_consumer *c = consumer_of(conn);
  Perfetto__Protos__CloneSessionRequest *r;
  struct tr_session_clone_args a = {.consumer_uid = c->peer.uid};
  tr_session *src;
  clone_ctx *x;
  char err[256];
  int fd = tr_ipc_conn_take_fd(conn);
  (void)drop;
  if (fd >= 0)
    close(fd);
  r = perfetto__protos__clone_session_request__unpack(NULL, len, args);
  if (!r) {
    reply_fail(c, req);
    return;
  }
  if (c->session || c->cloning) {
    reply_clone(c, req, NULL, "The consumer is already attached to another tracing session");
    goto out;
  }
  src = tr_session_clone_source(
      c->port->svc, r->selector_case == PERFETTO__PROTOS__CLONE_SESSION_REQUEST__SELECTOR_SESSION_ID,
      r->session_id,
      r->selector_case == PERFETTO__PROTOS__CLONE_SESSION_REQUEST__SELECTOR_UNIQUE_SESSION_NAME
          ? r->unique_session_name
          : NULL,
      c->peer.uid, err, sizeof err);
  if (!src) {
    reply_clone(c, req, NULL, err);
    goto out;
  }
  if (!(x = calloc(1, sizeof *x))) {
    reply_clone(c, req, NULL, "out of memory for the clone");
    goto out;
  }
  a.skip_trace_filter = r->skip_trace_filter;
  a.for_bugreport = r->for_bugreport;
  a.trigger.trigger_name = r->clone_trigger_name;
  a.trigger.producer_name = r->clone_trigger_producer_name;
  a.trigger.producer_uid = (uint32_t)r->clone_trigger_trusted_producer_uid;
  a.trigger.boot_time_ns = r->clone_trigger_boot_time_ns;
  a.trigger.delay_ms = r->clone_trigger_delay_ms;
  x->c = c;
  x->req = req;
  c->cloning = x; /* before the call: the clone may come before it returns */
  if (tr_session_clone_start(src, &a, on_cloned, x, err, sizeof err) != 0) {
    c->cloning = NULL;
    free(x);
    reply_clone(c, req, NULL, err);
  }
out:
  perfetto__protos__clone_session_request__free_unpacked(r, NULL);
}

/* TracerelayPort.ActivateTriggers, a service of our own beside Perfetto's ConsumerPort (which
 * stays byte for byte traced's, BindServiceReply included): `tracerelay trigger`, a trigger
 * raised on the service's own host with no agent there. It takes the producer port's
 * ActivateTriggersRequest; the caller is named by its peer credentials. */
static void activate_triggers(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                              bool drop) {
  tr_consumer *c = consumer_of(conn);
  const Perfetto__Protos__SystemInfo *si = c->port->svc->system_info;
  Perfetto__Protos__ActivateTriggersRequest *r =
      perfetto__protos__activate_triggers_request__unpack(NULL, len, args);
  char producer[64];
  (void)drop;
  if (!r) {
    reply_fail(c, req);
    return;
  }
  snprintf(producer, sizeof producer, "tracerelay trigger (pid %d)", (int)c->peer.pid);
  for (size_t i = 0; i < r->n_trigger_names; i++) {
    if (strlen(r->trigger_names[i]) > TR_RELAY_TRIGGER_NAME_MAX) {
      TR_WARN(COMP, "trigger from uid %u pid %d refused: a name over %u bytes",
              (unsigned)c->peer.uid, (int)c->peer.pid, TR_RELAY_TRIGGER_NAME_MAX);
      continue;
    }
    struct tr_session_trigger t = {.name = r->trigger_names[i],
                                   .producer_name = producer,
                                   .producer_uid = c->peer.uid,
                                   .host = si && si->machine_name ? si->machine_name : "service"};
    tr_session_triggers_activate(c->port->svc, &t);
  }
  perfetto__protos__activate_triggers_request__free_unpacked(r, NULL);
  Perfetto__Protos__ActivateTriggersResponse ok = PERFETTO__PROTOS__ACTIVATE_TRIGGERS_RESPONSE__INIT;
  reply_msg(c, req, &ok.base, false);
}

static const tr_ipc_method methods[] = {
    {"EnableTracing", enable_tracing},
    {"DisableTracing", disable_tracing},
    {"ReadBuffers", read_buffers},
    {"FreeBuffers", free_buffers},
    {"Flush", flush},
    {"StartTracing", start_tracing},
    {"ChangeTraceConfig", change_trace_config},
    {"Detach", detach},
    {"Attach", attach},
    {"GetTraceStats", get_trace_stats},
    {"ObserveEvents", observe_events},
    {"QueryServiceState", query_service_state},
    {"QueryCapabilities", query_capabilities},
    {"SaveTraceForBugreport", save_trace_for_bugreport},
    {"CloneSession", clone_session},
};

static const tr_ipc_method our_methods[] = {
    {"ActivateTriggers", activate_triggers},
};

static const tr_ipc_service consumer_services[] = {
    {"ConsumerPort", methods, sizeof methods / sizeof methods[0]},
    {"TracerelayPort", our_methods, sizeof our_methods / sizeof our_methods[0]},
};

/* ---- connections ---- */

/* The peer-credential check of consumer_port.h. */
static bool peer_allowed(const tr_consumer_port *port, tr_ipc_conn *conn) {
  const tr_consumer_access *a = &port->access;
  tr_ipc_peer peer = tr_ipc_conn_peer(conn);
  if (a->num_uids == 0 && a->num_gids == 0)
    return true;
  if (peer.uid == 0 || peer.uid == geteuid())
    return true;
  for (size_t i = 0; i < a->num_uids; i++)
    if (a->uids[i] == peer.uid)
      return true;
  gid_t groups[256];
  int n = a->num_gids > 0 ? tr_ipc_conn_peer_groups(conn, groups, 256) : 0;
  for (size_t i = 0; i < a->num_gids; i++) {
    if (a->gids[i] == peer.gid)
      return true;
    for (int g = 0; g < n; g++)
      if (groups[g] == a->gids[i])
        return true;
  }
  return false;
}

static int on_connect(tr_ipc_conn *conn) {
  tr_consumer_port *port = tr_ipc_conn_host(conn)->data;
  if (!peer_allowed(port, conn)) {
    tr_ipc_peer peer = tr_ipc_conn_peer(conn);
    TR_WARN(COMP, "consumer refused: uid %u gid %u pid %d is not allowed (uid 0, the service's "
            "uid, --consumer-allow-uid and --consumer-allow-gid are)", (unsigned)peer.uid,
            (unsigned)peer.gid, (int)peer.pid);
    return TR_ERR_PERM;
  }
  tr_consumer *c = calloc(1, sizeof *c);
  if (!c)
    return TR_ERR_NOMEM;
  c->port = port;
  c->conn = conn;
  c->peer = tr_ipc_conn_peer(conn);
  tr_ipc_conn_set_data(conn, c);
  TR_INFO(COMP, "consumer connected: uid %u gid %u pid %d", (unsigned)c->peer.uid,
          (unsigned)c->peer.gid, (int)c->peer.pid);
  return 0;
}

static void on_disconnect(tr_ipc_conn *conn) {
  tr_consumer *c = consumer_of(conn);
  if (!c)
    return;
  TR_INFO(COMP, "consumer pid %d disconnected%s", (int)c->peer.pid,
          c->session ? ", freeing its session" : "");
  for (flush_ctx *f = c->flushes; f; f = f->next)
    f->c = NULL;
  c->flushes = NULL;
  if (c->cloning)
    c->cloning->c = NULL;
  c->enable_pending = false;
  c->observing = false;
  if (c->session) {
    tr_session_forget(c->session, c);
    free_session(c);
  }
  free(c->pkt);
  free(c->reply);
  free(c);
  tr_ipc_conn_set_data(conn, NULL);
}

int tr_consumer_port_start(tr_consumer_port *port, tr_service *svc, const char *path,
                           mode_t mode) {
  tr_ipc_host_config cfg;
  int rc;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "consumer socket";
  cfg.services = consumer_services;
  cfg.num_services = sizeof consumer_services / sizeof consumer_services[0];
  cfg.on_connect = on_connect;
  cfg.on_disconnect = on_disconnect;
  port->svc = svc;
  port->close_cb = NULL;
  port->ipc_ready = false;
  memset(&port->access, 0, sizeof port->access);
  if ((rc = tr_ipc_host_init(&port->ipc, svc->loop, &cfg)) != 0)
    return rc;
  port->ipc_ready = true;
  port->ipc.data = port;
  return tr_ipc_host_start(&port->ipc, path, mode);
}

void tr_consumer_port_allow(tr_consumer_port *port, const tr_consumer_access *access) {
  port->access = *access;
}

void tr_consumer_port_end_sessions(tr_consumer_port *port, const char *error) {
  for (tr_session *s = port->svc->sessions; s; s = tr_session_next(s))
    tr_session_end(s, error);
}

static void on_ipc_closed(tr_ipc_host *host) {
  tr_consumer_port *port = host->data;
  if (port->close_cb)
    port->close_cb(port);
}

void tr_consumer_port_close(tr_consumer_port *port, tr_consumer_port_close_cb cb) {
  port->close_cb = cb;
  if (!port->ipc_ready) {
    if (cb)
      cb(port);
    return;
  }
  port->ipc_ready = false;
  tr_ipc_host_close(&port->ipc, on_ipc_closed);
}

/* ---- request checks for the fuzz target ---- */

int tr_consumer_port_check_request(unsigned method_id, const uint8_t *args, size_t len) {
  static const ProtobufCMessageDescriptor *const descs[] = {
      &perfetto__protos__enable_tracing_request__descriptor,
      &perfetto__protos__disable_tracing_request__descriptor,
      &perfetto__protos__read_buffers_request__descriptor,
      &perfetto__protos__free_buffers_request__descriptor,
      &perfetto__protos__flush_request__descriptor,
      &perfetto__protos__start_tracing_request__descriptor,
      &perfetto__protos__change_trace_config_request__descriptor,
      &perfetto__protos__detach_request__descriptor,
      &perfetto__protos__attach_request__descriptor,
      &perfetto__protos__get_trace_stats_request__descriptor,
      &perfetto__protos__observe_events_request__descriptor,
      &perfetto__protos__query_service_state_request__descriptor,
      &perfetto__protos__query_capabilities_request__descriptor,
      &perfetto__protos__save_trace_for_bugreport_request__descriptor,
      &perfetto__protos__clone_session_request__descriptor,
  };
  ProtobufCMessage *m;
  int rc = 0;
  if (method_id < 1 || method_id > sizeof descs / sizeof descs[0])
    return TR_ERR_INVAL;
  m = protobuf_c_message_unpack(descs[method_id - 1], NULL, len, args);
  if (!m)
    return TR_ERR_DECODE;
  if (method_id == 1) {
    char err[256];
    rc = tr_session_validate_config(((Perfetto__Protos__EnableTracingRequest *)m)->trace_config,
                                    err, sizeof err);
  }
  protobuf_c_message_free_unpacked(m, NULL);
  return rc;
}
