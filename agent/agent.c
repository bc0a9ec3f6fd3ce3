/* agent.c: the glue between the producer port and the relay link (see agent.h).
 *
 * The agent keeps its own copy of every live producer's description, because the port offers
 * no way to list producers and the link must re-announce them after each Welcome. Pending
 * start/stop commands wait in a small table until the port says the data source started or
 * stopped. Costs: O(producers) per producer event, O(pending commands) per data source event;
 * both are small per host.
 *
 * The producer port runs on a thread of its own (port_thread.h): the agent gives it commands
 * and hears of producers, started and stopped data sources and each command's result through
 * callbacks on the loop's thread, in the order the port saw them among the chunks.
 *
 * Shutdown stops every data source instance the service set up here first (as traced does
 * when a session ends), so that the producers commit what they hold and write nothing more;
 * once each confirmed, disconnected or timed out (DRAIN_MAX_MS), the producer port closes and
 * the link sends everything queued. Nothing the producers commit is left unread. */
#include "agent/agent.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent/link_client.h"
#include "agent/agent_guests.h"
#include "agent/agent_triggers.h"
#include "agent/agent_metrics.h"
#include "agent/port_thread.h"
#include "relay/daemon/metrics_http.h"
#include "relay/base/log.h"
#include "relay/base/pb_valid.h"
#include "relay/link/tls.h"
#include "relay/daemon/cert_expiry.h"
#include "relay/base/tr_error.h"

#define DRAIN_MAX_MS 2000u /* at most this (or half the shutdown timeout) for the stops */

typedef struct agent_producer {
  uint32_t id;
  char *name;
  char *sdk_version;
  uint32_t uid;
  int32_t pid;
  uint32_t guest_id; /* 0: this host's; else a guest machine's (agent_guests.h) */
  Perfetto__Protos__DataSourceDescriptor **ds; /* copies */
  size_t n_ds;
} agent_producer;

typedef struct pending_cmd {
  uint32_t producer_id;
  uint64_t instance_id;
  uint64_t request_id;
  bool start; /* else stop */
} pending_cmd;

struct tr_agent {
  uv_loop_t *loop;
  struct tr_agent_opts opts;
  tr_chunkq queue;
  tr_tls_config *tls;
  tr_cert_expiry_timer *expiry_timer; /* the daily look at tls's expiry */
  tr_port_thread *port;
  tr_link_client *link;
  tr_metrics_http *metrics;
  agent_producer *producers;
  size_t n_producers;
  pending_cmd *pending;
  size_t n_pending;
  size_t running; /* started data source instances not yet stopped: clock snapshots go on */
  bool shutting_down;
  unsigned shutdown_timeout_ms;
  uint64_t shutdown_started_ms;
  /* The instances stopped at shutdown whose stop has not ended yet (producer, instance). */
  struct draining { uint32_t producer_id; uint64_t instance_id; } *draining;
  size_t n_draining;
  tr_agent_triggers triggers; /* on their way to the service */
  tr_agent_guests guests;     /* behind the relay endpoint */
  bool drain_listed; /* every instance was asked to stop: the port may close once none is left */
  bool port_closing;
  void (*done)(void *data);
  void *done_data;
};

/* ---- producer copies ---- */

static bool same_bytes(const Perfetto__Protos__DataSourceDescriptor *a,
                       const Perfetto__Protos__DataSourceDescriptor *b) {
  size_t la = perfetto__protos__data_source_descriptor__get_packed_size(a);
  size_t lb = perfetto__protos__data_source_descriptor__get_packed_size(b);
  if (la != lb)
    return false;
  uint8_t *pa = malloc(la ? la : 1), *pb = malloc(lb ? lb : 1);
  bool same = pa != NULL && pb != NULL;
  if (same) {
    perfetto__protos__data_source_descriptor__pack(a, pa);
    perfetto__protos__data_source_descriptor__pack(b, pb);
    same = memcmp(pa, pb, la) == 0;
  }
  free(pa);
  free(pb);
  return same;
}

static bool same_key(const Perfetto__Protos__DataSourceDescriptor *a,
                     const Perfetto__Protos__DataSourceDescriptor *b) {
  uint64_t ia = a->has_id ? a->id : 0, ib = b->has_id ? b->id : 0;
  return ia == ib && strcmp(a->name ? a->name : "", b->name ? b->name : "") == 0;
}

static void free_descriptors(Perfetto__Protos__DataSourceDescriptor **ds, size_t n) {
  for (size_t i = 0; i < n; i++)
    perfetto__protos__data_source_descriptor__free_unpacked(ds[i], NULL);
  free(ds);
}

/* Copies the port's descriptor list. */
static int copy_descriptors(const tr_producer_info *info,
                            Perfetto__Protos__DataSourceDescriptor ***out) {
  *out = NULL;
  if (info->num_data_sources == 0)
    return 0;
  Perfetto__Protos__DataSourceDescriptor **ds = calloc(info->num_data_sources, sizeof *ds);
  if (ds == NULL)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < info->num_data_sources; i++) {
    if ((ds[i] = (void *)tr_pb_copy(&info->data_sources[i]->base)) == NULL) {
      free_descriptors(ds, i);
      return TR_ERR_NOMEM;
    }
  }
  *out = ds;
  return 0;
}

static agent_producer *find_producer(tr_agent *a, uint32_t id) {
  for (size_t i = 0; i < a->n_producers; i++)
    if (a->producers[i].id == id)
      return &a->producers[i];
  return NULL;
}

static void send_connected(tr_agent *a, const agent_producer *p) {
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = u.has_uid = u.has_pid = 1;
  u.producer_id = p->id;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
  u.name = p->name;
  u.uid = p->uid;
  u.pid = p->pid;
  u.sdk_version = p->sdk_version;
  u.n_data_sources = p->n_ds;
  u.data_sources = p->ds;
  u.has_guest_id = p->guest_id != 0;
  u.guest_id = p->guest_id;
  tr_link_client_send_producer_update(a->link, &u);
}

/* ---- producer port callbacks ---- */

static void on_producer_connected(void *data, const tr_producer_info *info) {
  tr_agent *a = data;
  agent_producer p = {.id = info->id, .uid = (uint32_t)info->uid, .pid = (int32_t)info->pid,
                      .guest_id = info->guest_id};
  p.name = strdup(info->name);
  p.sdk_version = strdup(info->sdk_version);
  agent_producer *grown = realloc(a->producers, (a->n_producers + 1) * sizeof *grown);
  if (p.name == NULL || p.sdk_version == NULL || grown == NULL ||
      copy_descriptors(info, &p.ds) < 0) {
    if (grown != NULL)
      a->producers = grown;
    free(p.name);
    free(p.sdk_version);
    TR_ERROR("agent", "out of memory: producer %u (%s) is not announced to the service",
             info->id, info->name);
    return;
  }
  p.n_ds = info->num_data_sources;
  a->producers = grown;
  a->producers[a->n_producers++] = p;
  send_connected(a, &p);
}

/* Sends what changed as a PRODUCER_UPDATED delta, then keeps the new list. */
static void on_data_sources_changed(void *data, const tr_producer_info *info) {
  tr_agent *a = data;
  agent_producer *p = find_producer(a, info->id);
  Perfetto__Protos__DataSourceDescriptor **ds;
  if (p == NULL || copy_descriptors(info, &ds) < 0)
    return;
  size_t n = info->num_data_sources;
  Perfetto__Protos__DataSourceDescriptor **changed = calloc(n + 1, sizeof *changed);
  char **gone = calloc(p->n_ds + 1, sizeof *gone);
  size_t n_changed = 0, n_gone = 0;
  if (changed == NULL || gone == NULL)
    goto out;
  for (size_t i = 0; i < n; i++) {
    bool known = false;
    for (size_t j = 0; j < p->n_ds && !known; j++)
      known = same_key(ds[i], p->ds[j]) && same_bytes(ds[i], p->ds[j]);
    if (!known)
      changed[n_changed++] = ds[i];
  }
  for (size_t j = 0; j < p->n_ds; j++) {
    bool kept = false;
    for (size_t i = 0; i < n && !kept; i++)
      kept = strcmp(ds[i]->name ? ds[i]->name : "", p->ds[j]->name ? p->ds[j]->name : "") == 0;
    if (!kept)
      gone[n_gone++] = p->ds[j]->name ? p->ds[j]->name : "";
  }
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = 1;
  u.producer_id = p->id;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_UPDATED;
  u.n_data_sources = n_changed;
  u.data_sources = changed;
  u.n_unregistered_data_sources = n_gone;
  u.unregistered_data_sources = gone;
  u.has_guest_id = p->guest_id != 0;
  u.guest_id = p->guest_id;
  tr_link_client_send_producer_update(a->link, &u);
out:
  free(changed);
  free(gone);
  free_descriptors(p->ds, p->n_ds);
  p->ds = ds;
  p->n_ds = n;
}

static void reply_pending(tr_agent *a, size_t i, const char *error) {
  pending_cmd c = a->pending[i];
  a->pending[i] = a->pending[--a->n_pending];
  tr_link_client_reply(a->link, c.request_id, error);
}

/* ---- shutdown: stop the instances, then close the port ---- */

static void on_port_closed(void *data);

static void close_port_when_drained(tr_agent *a) {
  if (!a->drain_listed || a->n_draining > 0 || a->port_closing)
    return;
  a->port_closing = true;
  tr_port_thread_close(a->port, on_port_closed, a);
}

/* An instance's stop ended (all: every instance of the producer, which is gone). */
static void drained(tr_agent *a, uint32_t producer_id, bool all, uint64_t instance_id) {
  for (size_t i = a->n_draining; i-- > 0;) {
    struct draining *d = &a->draining[i];
    if (d->producer_id == producer_id && (all || d->instance_id == instance_id))
      *d = a->draining[--a->n_draining];
  }
  close_port_when_drained(a);
}

/* Why the agent gave the port a command: what its result is for. */
enum command_why { FOR_SERVICE = 1, FOR_DRAIN, FOR_STALE, FOR_STATS };

static int port_command(tr_agent *a, struct tr_port_command c, enum command_why why) {
  c.why = why;
  return tr_port_thread_command(a->port, &c);
}

static void drain_instance(void *data, uint32_t producer_id, uint64_t instance_id) {
  tr_agent *a = data;
  struct draining *grown = realloc(a->draining, (a->n_draining + 1) * sizeof *grown);
  if (grown == NULL)
    return; /* not waited for: its last commits may come too late */
  a->draining = grown;
  a->draining[a->n_draining++] = (struct draining){producer_id, instance_id};
  unsigned wait_ms = a->shutdown_timeout_ms / 2 < DRAIN_MAX_MS ? a->shutdown_timeout_ms / 2
                                                               : DRAIN_MAX_MS;
  /* Ends with the stopped callback, or with a failed command (command_done) */
  struct tr_port_command c = {.kind = TR_PORT_STOP, .producer_id = producer_id,
                              .instance_id = instance_id, .timeout_ms = wait_ms ? wait_ms : 1};
  if (port_command(a, c, FOR_DRAIN) < 0)
    drained(a, producer_id, false, instance_id);
}

/* ---- producer events ---- */

static void on_producer_disconnected(void *data, const tr_producer_info *info) {
  tr_agent *a = data;
  if (a->shutting_down)
    drained(a, info->id, true, 0);
  for (size_t i = a->n_pending; i-- > 0;)
    if (a->pending[i].producer_id == info->id)
      reply_pending(a, i, "the producer disconnected");
  agent_producer *p = find_producer(a, info->id);
  if (p == NULL)
    return;
  /* A producer disconnected for its violations is gone before the next stats collection:
   * its count is kept from here (test_hostile_producer). */
  struct tr_link_producer_counts counts = {info->abi_violations, info->smb_full,
                                           info->smb_full_ns};
  tr_link_client_set_producer_counts(a->link, info->id, &counts);
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = 1;
  u.producer_id = info->id;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED;
  u.has_guest_id = p->guest_id != 0;
  u.guest_id = p->guest_id;
  int rc = tr_link_client_send_producer_update(a->link, &u);
  if (rc < 0 && rc != TR_ERR_CLOSED && rc != TR_ERR_UNSUPPORTED)
    TR_WARN("agent", "cannot tell the service that producer %u is gone: %s", info->id,
            tr_strerror(rc));
  free(p->name);
  free(p->sdk_version);
  free_descriptors(p->ds, p->n_ds);
  *p = a->producers[--a->n_producers];
}

static void finish_pending(tr_agent *a, uint32_t producer_id, uint64_t instance_id, bool start,
                           const char *error) {
  for (size_t i = 0; i < a->n_pending; i++) {
    pending_cmd *c = &a->pending[i];
    if (c->producer_id == producer_id && c->instance_id == instance_id && c->start == start) {
      reply_pending(a, i, error);
      return;
    }
  }
}

static void on_started(void *data, uint32_t producer_id, uint64_t instance_id) {
  finish_pending(data, producer_id, instance_id, true, NULL);
}

static void on_stopped(void *data, uint32_t producer_id, uint64_t instance_id,
                       bool timed_out) {
  tr_agent *a = data;
  finish_pending(a, producer_id, instance_id, true, "the data source stopped before it started");
  finish_pending(a, producer_id, instance_id, false,
                 timed_out ? "the producer did not confirm the stop within the timeout" : NULL);
  if (a->shutting_down)
    drained(a, producer_id, false, instance_id);
}

static void on_guest_changed(void *data, const tr_guest *g, bool gone) {
  tr_agent *a = data;
  tr_agent_guests_changed(&a->guests, a->link, g, gone);
}

static void on_guest_clock(void *data, uint32_t guest_id, const struct tr_guest_exchange *x) {
  tr_agent *a = data;
  tr_agent_guests_clock(&a->guests, a->link, guest_id, x);
}

static void on_trigger(void *data, uint32_t producer_id, const char *name) {
  tr_agent *a = data;
  const agent_producer *p = find_producer(a, producer_id);
  char unknown[32];
  snprintf(unknown, sizeof unknown, "producer %u", producer_id);
  tr_agent_triggers_raise(&a->triggers, a->link, producer_id, p ? p->name : unknown,
                          p ? p->uid : 0, name);
}

static void on_queue_has_data(void *data) {
  tr_agent *a = data;
  tr_link_client_kick(a->link);
}

static void on_flush_acked(void *data, uint32_t producer_id, uint64_t request_id) {
  tr_agent *a = data;
  (void)producer_id;
  (void)request_id;
  tr_link_client_send_queued(a->link);
}

/* ---- commands from the service ---- */

static int add_pending(tr_agent *a, const Tracerelay__Command *cmd, uint64_t instance_id,
                       bool start) {
  pending_cmd *grown = realloc(a->pending, (a->n_pending + 1) * sizeof *grown);
  if (grown == NULL)
    return TR_ERR_NOMEM;
  a->pending = grown;
  a->pending[a->n_pending++] = (pending_cmd){cmd->producer_id, instance_id, cmd->request_id, start};
  return 0;
}

static void remove_pending(tr_agent *a, uint64_t request_id) {
  for (size_t i = 0; i < a->n_pending; i++)
    if (a->pending[i].request_id == request_id) {
      a->pending[i] = a->pending[--a->n_pending];
      return;
    }
}

/* Start and stop end with the started or stopped callback (which may come before the
 * command's result: data sources that do not notify), so the pending entry exists before the
 * command. A stop waits for the producer as long as the session's data_source_stop_timeout_ms
 * (the setup config's stop_timeout_ms: timeout 0). */
static int start_or_stop(tr_agent *a, const Tracerelay__Command *cmd,
                         const struct tr_port_command *c) {
  int rc = add_pending(a, cmd, c->instance_id, c->kind == TR_PORT_START);
  if (rc < 0)
    return rc;
  rc = port_command(a, *c, FOR_SERVICE);
  if (rc < 0)
    remove_pending(a, cmd->request_id);
  return rc;
}

/* Posts the command; a reply (where one is due) goes with its result (command_done). */
static int to_port(tr_agent *a, const Tracerelay__Command *cmd) {
  struct tr_port_command c;
  int rc = tr_port_msgs_from_relay(cmd, &c);
  if (rc < 0)
    return rc;
  switch (c.kind) {
  case TR_PORT_START:
    a->running++;
    /* trace start, as traced snapshots its clocks, at the session's interval if it gave one */
    tr_link_client_clock_snapshots(a->link, true,
                                   cmd->start_data_source->clock_snapshot_interval_ms);
    return start_or_stop(a, cmd, &c);
  case TR_PORT_STOP:
    a->running -= a->running > 0;
    tr_link_client_clock_snapshots(a->link, a->running > 0, 0); /* and at stop */
    return start_or_stop(a, cmd, &c);
  default:
    return port_command(a, c, FOR_SERVICE);
  }
}

static void warn_flush_failed(uint64_t flush_request_id, uint32_t producer_id, int rc) {
  TR_WARN("agent", "flush %llu of producer %u failed: %s; the service will time it out",
          (unsigned long long)flush_request_id, producer_id, tr_strerror(rc));
}

static void on_command(tr_link_client *lc, const Tracerelay__Command *cmd) {
  tr_agent *a = tr_link_client_data(lc);
  bool flush = cmd->cmd_case == TRACERELAY__COMMAND__CMD_FLUSH;
  if (a->port == NULL || (a->shutting_down && !flush)) { /* the producers are going or gone */
    if (!flush)
      tr_link_client_reply(lc, cmd->request_id, "the agent is shutting down");
    return;
  }
  int rc = to_port(a, cmd);
  if (rc >= 0)
    return;
  if (flush) /* answered by the producer's FlushAck in the batch stream, or timed out */
    warn_flush_failed(cmd->flush->flush_request_id, cmd->producer_id, rc);
  else
    tr_link_client_reply(lc, cmd->request_id, tr_strerror(rc));
}

/* A command's result: the reply to the service's command (start and stop: on failure only,
 * else their callback replies), the end of a drain, a stale instance's stop, the stats. */
static void on_command_done(void *data, const struct tr_port_result *r) {
  tr_agent *a = data;
  const struct tr_port_command *c = r->cmd;
  switch ((enum command_why)c->why) {
  case FOR_SERVICE:
    if (c->kind == TR_PORT_FLUSH) {
      if (r->rc < 0)
        warn_flush_failed(c->flush_request_id, c->producer_id, r->rc);
    } else if (c->kind == TR_PORT_SETUP || c->kind == TR_PORT_CLEAR) {
      tr_link_client_reply(a->link, c->tag, r->rc < 0 ? tr_strerror(r->rc) : NULL);
    } else if (r->rc < 0) {
      for (size_t i = 0; i < a->n_pending; i++)
        if (a->pending[i].request_id == c->tag) {
          reply_pending(a, i, tr_strerror(r->rc));
          break;
        }
    }
    break;
  case FOR_DRAIN:
    if (r->rc < 0)
      drained(a, c->producer_id, false, c->instance_id);
    break;
  case FOR_STALE:
    if (r->rc < 0 && r->rc != TR_ERR_NOT_FOUND)
      TR_WARN("agent", "cannot stop instance %llu of producer %u: %s",
              (unsigned long long)c->instance_id, c->producer_id, tr_strerror(r->rc));
    break;
  case FOR_STATS:
    if (r->rc == 0) {
      struct tr_link_producer_counts counts = {r->stats.abi_violations, r->stats.smb_full,
                                               r->stats.smb_full_ns};
      tr_link_client_set_producer_counts(a->link, c->producer_id, &counts);
    }
    break;
  }
}

static void on_welcome(tr_link_client *lc) {
  tr_agent *a = tr_link_client_data(lc);
  tr_agent_guests_welcome(&a->guests, lc); /* before their producers */
  for (size_t i = 0; i < a->n_producers; i++)
    send_connected(a, &a->producers[i]);
  tr_agent_triggers_welcome(&a->triggers, lc);
}

/* The service restarted without this instance's session: stop it so the next session can
 * start the data source (the producer ignores a start while it still runs an instance). */
static void on_stale_instance(tr_link_client *lc, uint32_t producer_id, uint64_t instance_id) {
  tr_agent *a = tr_link_client_data(lc);
  if (a->port == NULL)
    return;
  struct tr_port_command c = {.kind = TR_PORT_STOP, .producer_id = producer_id,
                              .instance_id = instance_id};
  int rc = port_command(a, c, FOR_STALE);
  if (rc < 0)
    TR_WARN("agent", "cannot stop instance %llu of producer %u: %s",
            (unsigned long long)instance_id, producer_id, tr_strerror(rc));
  a->running = 0;
  tr_link_client_clock_snapshots(lc, false, 0);
}

/* Asks the port for each producer's counters; they reach the link as the answers come back,
 * for the next AgentStats (within a second: link_stats.h). */
static void collect_stats(tr_link_client *lc) {
  tr_agent *a = tr_link_client_data(lc);
  if (a->port == NULL)
    return;
  for (size_t i = 0; i < a->n_producers; i++) {
    struct tr_port_command c = {.kind = TR_PORT_STATS, .producer_id = a->producers[i].id};
    if (port_command(a, c, FOR_STATS) < 0)
      return;
  }
}

/* ---- lifecycle ---- */

static int load_tls(const struct tr_agent_opts *o, tr_tls_config **out) {
  char err[512];
  struct tr_tls_config_opts t = {.role = TR_TLS_CLIENT, .ca_path = o->ca_path,
                                 .cert_path = o->cert_path, .key_path = o->key_path,
                                 .ciphers = o->ciphers};
  int rc = tr_tls_config_new(&t, out, err, sizeof err);
  if (rc < 0) {
    TR_ERROR("agent", "cannot load the TLS certificates: %s", err);
    return rc;
  }
  if (o->machine_name == NULL)
    return 0;
  char name[TR_TLS_MAX_NAME + 1];
  rc = tr_tls_config_own_name(*out, name, sizeof name);
  if (rc < 0)
    TR_ERROR("agent", "certificate %s carries no valid machine name ('%s'), so the service "
             "would refuse it: reissue it with certs/make-certs.sh --agent %s", o->cert_path,
             name, o->machine_name);
  else if (strcmp(name, o->machine_name) != 0) {
    TR_ERROR("agent", "certificate %s is for machine '%s', not '%s' (--machine-name): the "
             "service names an agent after its certificate only, so this agent would speak as "
             "'%s'; install the certificate of '%s' or correct --machine-name", o->cert_path,
             name, o->machine_name, name, o->machine_name);
    rc = TR_ERR_CONFIG;
  }
  if (rc < 0) {
    tr_tls_config_unref(*out);
    *out = NULL;
  }
  return rc;
}

/* Its own certificate and the CA: warned about in the log ahead of their expiry. */
static void check_expiry(void *data) {
  tr_agent *a = data;
  char what[4200];
  int64_t now = time(NULL);
  snprintf(what, sizeof what, "the agent's certificate %s", a->opts.cert_path);
  tr_cert_expiry_check("agent", what, tr_tls_config_cert_expiry(a->tls), now);
  snprintf(what, sizeof what, "the CA certificate %s", a->opts.ca_path);
  tr_cert_expiry_check("agent", what, tr_tls_config_ca_expiry(a->tls), now);
}

static void free_agent(tr_agent *a) {
  tr_cert_expiry_timer_stop(a->expiry_timer);
  for (size_t i = 0; i < a->n_producers; i++) {
    free(a->producers[i].name);
    free(a->producers[i].sdk_version);
    free_descriptors(a->producers[i].ds, a->producers[i].n_ds);
  }
  free(a->producers);
  free(a->pending);
  free(a->draining);
  tr_agent_triggers_free(&a->triggers);
  tr_agent_guests_free(&a->guests);
  tr_chunkq_free(&a->queue);
  tr_tls_config_unref(a->tls);
  free(a);
}

static void render_metrics(void *data, const struct tr_metrics_request *req, tr_prom_text *t) {
  tr_agent *a = data;
  (void)req; /* an agent has no per-host series */
  size_t outbox = a->port ? tr_port_thread_outbox_bytes(a->port) : 0;
  tr_agent_metrics_write(t, a->link, &a->queue, outbox, a->n_producers, &a->triggers, a->tls);
  if (a->opts.metrics_more != NULL)
    a->opts.metrics_more(a->opts.metrics_more_data, t);
}

/* Ready while the link is up (Welcomed): the producers' data flows. */
static const char *not_ready(void *data) {
  tr_agent *a = data;
  if (a->shutting_down)
    return "shutting down\n";
  return tr_link_client_connected(a->link) ? NULL : "the link to the service is not up\n";
}

static void on_link_closed(void *data);

int tr_agent_start(uv_loop_t *loop, const struct tr_agent_opts *opts, tr_agent **out) {
  tr_agent *a = calloc(1, sizeof *a);
  if (a == NULL)
    return TR_ERR_NOMEM;
  a->loop = loop;
  a->opts = *opts;
  tr_chunkq_init(&a->queue, opts->queue_bytes ? opts->queue_bytes : TR_AGENT_DEFAULT_QUEUE_BYTES);
  int rc = load_tls(opts, &a->tls);
  if (rc < 0)
    goto fail;
  if (opts->metrics_listen) { /* first: a failure here leaves nothing open */
    char err[256];
    struct tr_metrics_handlers h = {.data = a, .render = render_metrics, .not_ready = not_ready};
    rc = tr_metrics_http_start(loop, opts->metrics_listen, &h, &a->metrics, err, sizeof err);
    if (rc < 0) {
      TR_ERROR("agent", "--metrics-listen: %s", err);
      goto fail;
    }
  }
  /* The link before the port: it only connects once the loop runs, and its callbacks wait for
   * the port (a->port); the port's events need the link. */
  struct tr_link_client_opts lo = {.service = opts->service,
                                   .service_name = opts->service_name,
                                   .tls = a->tls,
                                   .queue = &a->queue,
                                   .spill_bytes = opts->spill_bytes,
                                   .compress = opts->compress};
  struct tr_link_client_callbacks lcb = {.data = a, .on_welcome = on_welcome,
                                         .on_stale_instance = on_stale_instance,
                                         .on_command = on_command,
                                         .collect_stats = collect_stats};
  rc = tr_link_client_start(loop, &lo, &lcb, &a->link);
  if (rc < 0)
    goto fail_metrics;
  size_t queue_bytes = a->queue.max_bytes;
  struct tr_port_thread_config pc = {
      .socket_path = opts->producer_socket,
      .mode = TR_PRODUCER_PORT_DEFAULT_MODE,
      .relay_listen = opts->relay_listen,
      .smb_size = opts->smb_bytes ? opts->smb_bytes : TR_AGENT_DEFAULT_SMB_BYTES,
      .max_producers = opts->max_producers ? opts->max_producers : TR_AGENT_DEFAULT_MAX_PRODUCERS,
      .max_producers_flag = "--max-producers",
      .queue = &a->queue,
      .outbox_bytes = queue_bytes / TR_AGENT_OUTBOX_FRACTION,
      .own_thread = !opts->port_on_loop,
      .cb = {.data = a,
             .producer_connected = on_producer_connected,
             .data_sources_changed = on_data_sources_changed,
             .producer_disconnected = on_producer_disconnected,
             .data_source_started = on_started,
             .data_source_stopped = on_stopped,
             .flush_acked = on_flush_acked,
             .trigger = on_trigger,
             .guest_changed = on_guest_changed,
             .guest_clock = on_guest_clock,
             .queue_has_data = on_queue_has_data,
             .command_done = on_command_done}};
  rc = tr_port_thread_start(loop, &pc, &a->port);
  if (rc < 0) {
    if (opts->relay_listen)
      TR_ERROR("agent", "cannot listen on the producer socket %s or the relay endpoint %s: %s "
               "(see the lines above, --producer-socket and --relay-listen)",
               opts->producer_socket, opts->relay_listen, tr_strerror(rc));
    else
      TR_ERROR("agent", "cannot listen on the producer socket %s: %s (is traced running there? "
               "does the directory exist? see --producer-socket)", opts->producer_socket,
               tr_strerror(rc));
    a->port = NULL;
    /* The link closes on the loop; the agent goes with it (on_link_closed). */
    tr_link_client_shutdown(a->link, 0, on_link_closed, a);
    return rc;
  }
  TR_INFO("agent", "producers connect to %s%s%s; relaying to %s", opts->producer_socket,
          opts->relay_listen ? ", Perfetto relays to " : "",
          opts->relay_listen ? opts->relay_listen : "", opts->service);
  check_expiry(a);
  if (tr_cert_expiry_timer_start(loop, check_expiry, a, &a->expiry_timer) < 0)
    TR_WARN("agent", "out of memory for the daily check of the certificate's expiry");
  *out = a;
  return 0;

fail_metrics:
  if (a->metrics) /* frees itself once the loop closed its handles */
    tr_metrics_http_close(a->metrics, NULL, NULL);
fail:
  free_agent(a);
  return rc;
}

int tr_agent_reload_tls(tr_agent *a) {
  tr_tls_config *cfg;
  int rc = load_tls(&a->opts, &cfg);
  if (rc < 0)
    return rc;
  tr_link_client_reload_tls(a->link, cfg);
  tr_tls_config_unref(a->tls);
  a->tls = cfg;
  TR_INFO("agent", "certificates reloaded from %s; the next connection uses them",
          a->opts.cert_path);
  check_expiry(a);
  return 0;
}

static void on_metrics_closed(void *data) {
  tr_agent *a = data;
  void (*done)(void *) = a->done;
  void *done_data = a->done_data;
  free_agent(a);
  if (done != NULL)
    done(done_data);
}

static void on_link_closed(void *data) {
  tr_agent *a = data;
  if (a->metrics == NULL) {
    on_metrics_closed(a);
    return;
  }
  tr_metrics_http *m = a->metrics;
  a->metrics = NULL;
  tr_metrics_http_close(m, on_metrics_closed, a);
}

/* The producers are gone and their data is in the queue: now the link sends it, in what is
 * left of the timeout (at least half of it). */
static void on_port_closed(void *data) {
  tr_agent *a = data;
  a->port = NULL;
  uint64_t spent = uv_now(a->loop) - a->shutdown_started_ms;
  unsigned left = spent < a->shutdown_timeout_ms / 2 ? a->shutdown_timeout_ms - (unsigned)spent
                                                     : a->shutdown_timeout_ms / 2;
  tr_link_client_shutdown(a->link, left, on_link_closed, a);
}

void tr_agent_shutdown(tr_agent *a, unsigned timeout_ms, void (*done)(void *data), void *data) {
  if (a->shutting_down)
    return;
  a->shutting_down = true;
  a->shutdown_timeout_ms = timeout_ms;
  a->done = done;
  a->done_data = data;
  a->shutdown_started_ms = uv_now(a->loop);
  TR_INFO("agent", "shutting down: stopping %zu data source instance(s), then sending what is "
          "queued (%zu bytes) and held (%zu bytes), waiting up to %u ms",
          tr_link_client_instances(a->link, NULL, NULL), a->queue.bytes,
          tr_link_client_spill(a->link)->held_bytes, timeout_ms);
  tr_link_client_instances(a->link, drain_instance, a);
  a->drain_listed = true;
  close_port_when_drained(a);
}
