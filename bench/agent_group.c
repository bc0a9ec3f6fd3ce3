/* agent_group.c: one loop thread of real agents and their emulated producers (see
 * agent_group.h). Every agent and producer of the group lives on the group's loop; other
 * threads reach it only through the uv_async_t and the command bits beside it. */
#include "bench/agent_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "bench/emu_producer.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define LOG_COMP "many_agents"
#define PATH_BYTES 256
#define SHUTDOWN_TIMEOUT_MS 2000u /* per agent, all at once: what is queued gets this long */

struct member {
  struct agent_group *g;
  char name[16], producer_name[24];
  char socket_path[PATH_BYTES], cert_path[PATH_BYTES], key_path[PATH_BYTES];
  tr_agent *agent; /* NULL if it did not start, or once it shut down */
  emu_producer *producer;
  bool registered; /* the producer's data source is registered with the agent */
};

struct agent_group {
  struct agent_group_config cfg;
  char ca_path[PATH_BYTES];
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  atomic_uint cmds; /* enum agent_group_cmd bits not yet done */
  struct member *members;
  unsigned agents_running;
  bool stopping;
};

/* ---- producers ---- */

static void add_producer_counts(struct many_counts *c, const emu_producer *p) {
  struct emu_producer_counts pc;
  emu_producer_counts(p, &pc);
  c->starts += pc.starts;
  c->stops += pc.stops;
  c->flushes += pc.flushes;
  c->events_written += pc.events_written;
  c->events_dropped += pc.events_dropped;
}

static void close_producer(struct member *m) {
  if (m->producer == NULL)
    return;
  add_producer_counts(m->g->cfg.counts, m->producer);
  emu_producer_close(m->producer, NULL, NULL);
  m->producer = NULL;
  if (m->registered)
    m->g->cfg.counts->producers_registered--;
  m->registered = false;
}

static void on_producer_registered(void *data) {
  struct member *m = data;
  struct many_counts *c = m->g->cfg.counts;
  m->registered = true;
  /* Counted against the agents that started, once all of them did (a SIGUSR1 sent before
   * that connects producers to the agents started so far). */
  if (++c->producers_registered == c->agents_started && c->agents_done == c->agents_total) {
    printf("many_agents: all %u producers registered\n", c->agents_started);
    fflush(stdout);
  }
}

static void on_producer_ended(void *data, int status) {
  struct member *m = data;
  if (status == TR_ERR_CLOSED && !m->g->stopping)
    TR_WARN(LOG_COMP, "the producer of %s lost its agent", m->name);
  m->g->cfg.counts->producers_lost++;
  close_producer(m);
}

static void producers_on(struct agent_group *g) {
  for (unsigned i = 0; i < g->cfg.count; i++) {
    struct member *m = &g->members[i];
    if (m->agent == NULL || m->producer != NULL)
      continue;
    struct emu_producer_config pc = {.socket_path = m->socket_path, .name = m->producer_name,
                                     .data_source = "track_event", .rate = g->cfg.rate,
                                     .tid = (int32_t)(g->cfg.first + i + 1), .data = m,
                                     .on_registered = on_producer_registered,
                                     .on_ended = on_producer_ended};
    int rc = emu_producer_start(&g->loop, &pc, &m->producer);
    if (rc < 0) {
      m->producer = NULL;
      g->cfg.counts->producers_lost++;
      TR_ERROR(LOG_COMP, "cannot connect a producer to %s: %s", m->socket_path,
               tr_strerror(rc));
    }
  }
}

static void producers_off(struct agent_group *g) {
  for (unsigned i = 0; i < g->cfg.count; i++)
    close_producer(&g->members[i]);
}

/* ---- agents ---- */

static int member_paths(struct agent_group *g, struct member *m, unsigned index) {
  const char *pki = g->cfg.pki_dir;
  if ((size_t)snprintf(m->name, sizeof m->name, "%s%04u", g->cfg.prefix, index) >= sizeof m->name)
    return TR_ERR_TOO_BIG;
  snprintf(m->producer_name, sizeof m->producer_name, "lg-%s", m->name);
  size_t n = sizeof m->socket_path;
  if ((size_t)snprintf(m->socket_path, n, "%s/%s.sock", g->cfg.socket_dir, m->name) >= n ||
      (size_t)snprintf(m->cert_path, n, "%s/agent-%s.crt", pki, m->name) >= n ||
      (size_t)snprintf(m->key_path, n, "%s/agent-%s.key", pki, m->name) >= n)
    return TR_ERR_TOO_BIG;
  return 0;
}

static void start_agents(struct agent_group *g) {
  struct many_counts *c = g->cfg.counts;
  for (unsigned i = 0; i < g->cfg.count; i++) {
    struct member *m = &g->members[i];
    m->g = g;
    int rc = member_paths(g, m, g->cfg.first + i);
    struct tr_agent_opts o = {.producer_socket = m->socket_path, .service = g->cfg.service,
                              .service_name = g->cfg.service_name, .ca_path = g->ca_path,
                              .cert_path = m->cert_path, .key_path = m->key_path,
                              .compress = true, .port_on_loop = true};
    if (rc == 0)
      rc = tr_agent_start(&g->loop, &o, &m->agent);
    if (rc < 0) {
      m->agent = NULL;
      TR_ERROR(LOG_COMP, "agent %s did not start: %s", m->name, tr_strerror(rc));
      c->agents_failed++;
    } else {
      g->agents_running++;
      c->agents_started++;
    }
    if (atomic_fetch_add(&c->agents_done, 1) + 1 == c->agents_total) {
      printf("many_agents: %u agents started, %u failed\n", c->agents_started,
             c->agents_failed);
      fflush(stdout);
    }
  }
}

static void on_agent_done(void *data) {
  struct member *m = data;
  m->agent = NULL;
  if (--m->g->agents_running == 0)
    uv_close((uv_handle_t *)&m->g->wake, NULL);
}

static void stop(struct agent_group *g) {
  g->stopping = true;
  producers_off(g);
  if (g->agents_running == 0) {
    uv_close((uv_handle_t *)&g->wake, NULL);
    return;
  }
  for (unsigned i = 0; i < g->cfg.count; i++)
    if (g->members[i].agent != NULL)
      tr_agent_shutdown(g->members[i].agent, SHUTDOWN_TIMEOUT_MS, on_agent_done, &g->members[i]);
}

/* ---- the thread ---- */

static void on_wake(uv_async_t *a) {
  struct agent_group *g = a->data;
  unsigned cmds = atomic_exchange(&g->cmds, 0);
  if (g->stopping)
    return;
  if ((cmds & AGENT_GROUP_PRODUCERS_ON) && !(cmds & AGENT_GROUP_STOP))
    producers_on(g);
  if (cmds & AGENT_GROUP_PRODUCERS_OFF)
    producers_off(g);
  if (cmds & AGENT_GROUP_STOP)
    stop(g);
}

static void *group_main(void *arg) {
  struct agent_group *g = arg;
  start_agents(g);
  uv_run(&g->loop, UV_RUN_DEFAULT);
  return NULL;
}

int agent_group_start(const struct agent_group_config *cfg, struct agent_group **out) {
  struct agent_group *g = calloc(1, sizeof *g);
  if (g == NULL)
    return TR_ERR_NOMEM;
  g->cfg = *cfg;
  g->members = calloc(cfg->count ? cfg->count : 1, sizeof *g->members);
  int rc = g->members ? 0 : TR_ERR_NOMEM;
  if (rc == 0 && (size_t)snprintf(g->ca_path, sizeof g->ca_path, "%s/ca.crt", cfg->pki_dir) >=
                     sizeof g->ca_path)
    rc = TR_ERR_TOO_BIG;
  if (rc == 0)
    rc = uv_loop_init(&g->loop);
  if (rc < 0) {
    free(g->members);
    free(g);
    return rc;
  }
  uv_async_init(&g->loop, &g->wake, on_wake);
  g->wake.data = g;
  int err = pthread_create(&g->thread, NULL, group_main, g);
  if (err != 0) {
    uv_close((uv_handle_t *)&g->wake, NULL);
    uv_run(&g->loop, UV_RUN_DEFAULT);
    uv_loop_close(&g->loop);
    free(g->members);
    free(g);
    return TR_ERR_SYS(err);
  }
  *out = g;
  return 0;
}

void agent_group_command(struct agent_group *g, enum agent_group_cmd cmd) {
  atomic_fetch_or(&g->cmds, (unsigned)cmd);
  uv_async_send(&g->wake);
}

void agent_group_join(struct agent_group *g) {
  pthread_join(g->thread, NULL);
  uv_loop_close(&g->loop);
  free(g->members);
  free(g);
}
