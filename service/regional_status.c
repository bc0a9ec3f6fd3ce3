/* regional_status.c: a regional's consumer socket (regional_status.h).
 *
 * A QueryServiceState answer is cut into replies as the service's are (state_reply.h); its
 * elements here: the service, the forwarding, then one extension element per agent. */
#include "service/regional_status.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "service/state_reply.h"
#include "tracerelay/tracerelay_status.pb-c.h"

#define COMP "regional"

struct tr_regional_status {
  tr_ipc_host ipc;
  tr_regional *regional;
  const char *service_version, *machine;
  tr_regional_status_close_cb close_cb;
  void *close_data;
};

static void add_agent(void *data, const struct tr_regional_agent *a) {
  tr_state_reply *o = data;
  Tracerelay__HostStats stats = TRACERELAY__HOST_STATS__INIT;
  stats.has_bytes_received = 1;
  stats.bytes_received = a->bytes_from_agent;
  Tracerelay__HostStatus h = TRACERELAY__HOST_STATUS__INIT;
  Tracerelay__HostStatus *hp = &h;
  h.machine_name = (char *)a->name;
  h.has_connected = 1;
  h.connected = a->connected;
  h.has_connected_for_ms = 1;
  h.connected_for_ms = a->connected_ms;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  h.has_connected_since_unix_ns = 1;
  h.connected_since_unix_ns =
      (int64_t)now.tv_sec * 1000000000 + now.tv_nsec - (int64_t)a->connected_ms * 1000000;
  h.regional_upstream_state = a->held ? "held" : a->forwarded ? "forwarded" : "connecting";
  h.has_regional_bytes_from_upstream = 1;
  h.regional_bytes_from_upstream = a->bytes_from_upstream;
  h.stats = &stats;
  Tracerelay__TracingServiceStateExtension x = TRACERELAY__TRACING_SERVICE_STATE_EXTENSION__INIT;
  x.n_tracerelay_hosts = 1;
  x.tracerelay_hosts = &hp;
  tr_state_reply_add(o, &x.base);
}

static void query_service_state(tr_ipc_conn *conn, uint64_t req, const uint8_t *args,
                                size_t len, bool drop) {
  tr_regional_status *s = tr_ipc_conn_host(conn)->data;
  (void)args;
  (void)len; /* QueryServiceStateRequest's filters are for producers: a regional has none */
  (void)drop;
  tr_state_reply reply, *o = &reply;
  if (tr_state_reply_begin(o, conn, req) != 0) {
    tr_ipc_conn_reply(conn, req, false, false, NULL, 0, -1);
    return;
  }
  Perfetto__Protos__TracingServiceState st = PERFETTO__PROTOS__TRACING_SERVICE_STATE__INIT;
  st.tracing_service_version = (char *)s->service_version;
  st.has_num_sessions = st.has_num_sessions_started = st.has_supports_tracing_sessions = 1;
  tr_state_reply_add(o, &st.base); /* no sessions, and none possible here */
  struct tr_regional_stats rs;
  tr_regional_stats(s->regional, &rs);
  Tracerelay__RegionalStatus r = TRACERELAY__REGIONAL_STATUS__INIT;
  r.upstream = (char *)tr_regional_upstream(s->regional);
  r.has_agents = r.has_forwarded = r.has_held = 1;
  r.agents = rs.agents;
  r.forwarded = rs.forwarded;
  r.held = rs.held;
  r.has_bytes_from_agents = r.has_bytes_from_upstream = r.has_upstream_lost = 1;
  r.bytes_from_agents = rs.bytes_from_agents;
  r.bytes_from_upstream = rs.bytes_from_upstream;
  r.upstream_lost = rs.upstream_lost;
  Tracerelay__TracingServiceStateExtension x = TRACERELAY__TRACING_SERVICE_STATE_EXTENSION__INIT;
  x.tracerelay_service_machine = (char *)s->machine;
  x.tracerelay_regional = &r;
  tr_state_reply_add(o, &x.base);
  tr_regional_each_agent(s->regional, add_agent, o);
  tr_state_reply_end(o);
}

static void enable_tracing(tr_ipc_conn *conn, uint64_t req, const uint8_t *args, size_t len,
                           bool drop) {
  tr_regional_status *s = tr_ipc_conn_host(conn)->data;
  char why[512];
  (void)args;
  (void)len;
  (void)drop;
  snprintf(why, sizeof why,
           "this is a regional tracerelay-service: it forwards its agents to %s and records "
           "nothing itself; record at that service's consumer socket",
           tr_regional_upstream(s->regional));
  Perfetto__Protos__EnableTracingResponse r = PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__INIT;
  r.error = why;
  size_t n = perfetto__protos__enable_tracing_response__get_packed_size(&r);
  uint8_t *buf = malloc(n);
  if (buf != NULL)
    perfetto__protos__enable_tracing_response__pack(&r, buf);
  tr_ipc_conn_reply(conn, req, buf != NULL, false, buf, buf ? n : 0, -1);
  free(buf);
}

/* ConsumerPort's method ids are positions: the ones a regional does not serve stay NULL. */
static const tr_ipc_method methods[] = {
    {"EnableTracing", enable_tracing},
    {"DisableTracing", NULL},
    {"ReadBuffers", NULL},
    {"FreeBuffers", NULL},
    {"Flush", NULL},
    {"StartTracing", NULL},
    {"ChangeTraceConfig", NULL},
    {"Detach", NULL},
    {"Attach", NULL},
    {"GetTraceStats", NULL},
    {"ObserveEvents", NULL},
    {"QueryServiceState", query_service_state},
};

static const tr_ipc_service consumer_service = {"ConsumerPort", methods,
                                                sizeof methods / sizeof methods[0]};

int tr_regional_status_start(uv_loop_t *loop, tr_regional *r, const char *service_version,
                             const char *machine, const char *path, mode_t mode,
                             tr_regional_status **out) {
  tr_regional_status *s = calloc(1, sizeof *s);
  *out = s;
  if (s == NULL)
    return TR_ERR_NOMEM;
  s->regional = r;
  s->service_version = service_version;
  s->machine = machine;
  tr_ipc_host_config cfg = {.name = "consumer socket (status only)",
                            .services = &consumer_service,
                            .num_services = 1};
  int rc = tr_ipc_host_init(&s->ipc, loop, &cfg);
  if (rc != 0) {
    free(s);
    *out = NULL;
    return rc;
  }
  s->ipc.data = s;
  return tr_ipc_host_start(&s->ipc, path, mode);
}

static void on_closed(tr_ipc_host *host) {
  tr_regional_status *s = host->data;
  tr_regional_status_close_cb cb = s->close_cb;
  void *data = s->close_data;
  free(s);
  if (cb)
    cb(data);
}

void tr_regional_status_close(tr_regional_status *s, tr_regional_status_close_cb cb, void *data) {
  if (s == NULL) {
    if (cb)
      cb(data);
    return;
  }
  s->close_cb = cb;
  s->close_data = data;
  tr_ipc_host_close(&s->ipc, on_closed);
}
