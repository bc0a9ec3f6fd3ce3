/* session.c: tracing sessions (see session.h): config checks, fan-out of data sources to every
 * matching producer of every host, chunks into the per-(buffer, host) central buffers, stop,
 * and the link's upward calls (tr_session_link_events, link_calls.h).
 *
 * Costs: a chunk finds its session buffer by a walk over sessions and their buffers
 * (O(sessions * buffers), both small) and its host entry by a walk over the session's hosts;
 * a hash from global buffer id would be the next step if either grew large. */
#include "service/session_priv.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/producer/chunk_item.h"
#include "relay/base/log.h"
#include "relay/base/pb_valid.h"
#include "relay/base/tr_error.h"
#include "service/config_check.h"
#include "service/hosts.h"

#define COMP "session"
#define FLUSH_FLAGS_PERIODIC 0x11u   /* reason periodic | initiator traced << 4 */
#define FLUSH_FLAGS_TRACE_STOP 0x12u /* reason trace-stop | initiator traced << 4 */

uint64_t tr_session_now(void) { return tr_clock_boottime_ns(); }

/* ---- service state ---- */

/* Upper bounds of the flush duration histogram, in seconds. */
static const double kFlushBounds[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
                                      0.1,   0.2,   0.5,   1,    2,    5};

int tr_session_service_init(tr_service *svc, uv_loop_t *loop, enum tr_timeline timeline,
                            tr_hosts *hosts, const struct tr_link_commands *link) {
  memset(svc, 0, sizeof *svc);
  svc->loop = loop;
  svc->hosts = hosts;
  svc->link = link;
  svc->uid = (int32_t)getuid();
  svc->timeline = timeline;
  svc->next_buffer_id = 1;
  svc->flush_durations = (tr_prom_histogram){
      .le = kFlushBounds, .n = sizeof kFlushBounds / sizeof kFlushBounds[0]};
  svc->flush_service_parts = svc->flush_durations;
  return tr_trace_writer_service_system_info(&svc->system_info);
}

void tr_session_service_set_tls_expiry(tr_service *svc, int64_t cert, int64_t ca) {
  svc->cert_expiry = cert;
  svc->ca_expiry = ca;
}

void tr_session_service_set_max_buffer_memory(tr_service *svc, uint64_t bytes) {
  svc->max_buffer_memory = bytes;
}

void tr_session_service_free(tr_service *svc) {
  while (svc->sessions) {
    tr_session *s = svc->sessions;
    tr_session_free(s);
  }
  tr_session_unstopped_free(svc);
  tr_session_triggers_service_free(svc);
  if (svc->system_info)
    perfetto__protos__system_info__free_unpacked(svc->system_info, NULL);
  svc->system_info = NULL;
}

uint64_t tr_session_next_flush_id(tr_session *s) { return ++s->svc->next_flush_id; }

void tr_session_observe_flush(tr_session *s, double seconds) {
  tr_prom_histogram_observe(&s->svc->flush_durations, seconds);
}

void tr_session_observe_flush_service_part(tr_session *s, double seconds) {
  tr_prom_histogram_observe(&s->svc->flush_service_parts, seconds);
}

/* ---- config ---- */

int tr_session_regex_compile(const char *pattern, regex_t *re) {
  size_t n = strlen(pattern) + 5;
  char *anchored = malloc(n);
  int rc;
  if (!anchored)
    return TR_ERR_NOMEM;
  snprintf(anchored, n, "^(%s)$", pattern);
  rc = regcomp(re, anchored, REG_EXTENDED | REG_NOSUB);
  free(anchored);
  return rc == 0 ? 0 : TR_ERR_CONFIG;
}

#define CONFIG_ERROR(...)                                                                         \
  do {                                                                                            \
    snprintf(err, err_len, __VA_ARGS__);                                                          \
    return TR_ERR_CONFIG;                                                                         \
  } while (0)

int tr_session_validate_config(const Perfetto__Protos__TraceConfig *cfg, char *err,
                               size_t err_len) {
  if (!cfg)
    CONFIG_ERROR("EnableTracing without a trace_config");
  int rc = tr_config_check_fields(cfg, err, err_len); /* every field honoured, or said why */
  if (rc != 0)
    return rc;
  if (!tr_pb_tags_valid(&cfg->base)) /* it could not be copied nor forwarded: pb_valid.h */
    CONFIG_ERROR("trace_config holds a field numbered 0 (an over-long tag): not valid protobuf");
  if (cfg->n_buffers < 1 || cfg->n_buffers > TR_SESSION_MAX_BUFFERS)
    CONFIG_ERROR("trace_config has %zu buffers; give 1 to %u", cfg->n_buffers,
                 TR_SESSION_MAX_BUFFERS);
  for (size_t i = 0; i < cfg->n_buffers; i++) {
    uint64_t bytes = (uint64_t)cfg->buffers[i]->size_kb * 1024u;
    if (bytes < TR_TBUF_MIN_SIZE || bytes > TR_TBUF_MAX_SIZE)
      CONFIG_ERROR("buffers[%zu].size_kb = %u is out of range: give 1 to %u KB per host", i,
                   cfg->buffers[i]->size_kb, TR_TBUF_MAX_SIZE / 1024u);
    if (cfg->buffers[i]->fill_policy > 2)
      CONFIG_ERROR("buffers[%zu].fill_policy %d is unknown: use RING_BUFFER or DISCARD", i,
                   (int)cfg->buffers[i]->fill_policy);
  }
  if (cfg->n_data_sources < 1)
    CONFIG_ERROR("trace_config has no data_sources: add at least one");
  for (size_t i = 0; i < cfg->n_data_sources; i++) {
    const Perfetto__Protos__TraceConfig__DataSource *ds = cfg->data_sources[i];
    if (!ds->config || !ds->config->name || !ds->config->name[0])
      CONFIG_ERROR("data_sources[%zu] has no config.name", i);
    if (ds->config->target_buffer >= cfg->n_buffers)
      CONFIG_ERROR("data_sources[%zu] (%s) targets buffer %u but only %zu buffers exist", i,
                   ds->config->name, ds->config->target_buffer, cfg->n_buffers);
    for (size_t j = 0; j < ds->n_producer_name_regex_filter; j++) {
      regex_t re;
      if (tr_session_regex_compile(ds->producer_name_regex_filter[j], &re) != 0)
        CONFIG_ERROR("data_sources[%zu].producer_name_regex_filter \"%s\" is not a valid POSIX "
                     "extended regex",
                     i, ds->producer_name_regex_filter[j]);
      regfree(&re);
    }
  }
  if (cfg->duration_ms > TR_SESSION_MAX_DURATION_MS)
    CONFIG_ERROR("duration_ms %u is over 7 days", cfg->duration_ms);
  if (cfg->write_into_file && cfg->has_file_write_period_ms && cfg->file_write_period_ms &&
      cfg->file_write_period_ms < TR_SESSION_MIN_FILE_PERIOD_MS)
    CONFIG_ERROR("file_write_period_ms %u is under the minimum of %u", cfg->file_write_period_ms,
                 TR_SESSION_MIN_FILE_PERIOD_MS);
  if (cfg->output_path && cfg->output_path[0] && !cfg->write_into_file)
    CONFIG_ERROR("output_path is set but write_into_file is not");
  rc = tr_session_triggers_validate(cfg, err, err_len);
  return rc ? rc : tr_trace_output_check_filter(cfg, err, err_len); /* as traced: refused */
}

/* ---- matching ---- */

static bool name_in(char **names, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0)
      return true;
  return false;
}

static bool regex_any(char **patterns, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++) {
    regex_t re;
    bool hit;
    if (tr_session_regex_compile(patterns[i], &re) != 0)
      continue;
    hit = regexec(&re, name, 0, NULL, 0) == 0;
    regfree(&re);
    if (hit)
      return true;
  }
  return false;
}

/* traced's rule: with any producer filter, the producer must match one of them (exact names
 * OR regexes); machine_name_filter selects hosts by machine name, none means every host. */
static bool ds_matches(const Perfetto__Protos__TraceConfig__DataSource *ds, const tr_host *host,
                       const tr_remote_producer *p) {
  const char *pname = p->name ? p->name : "";
  if (ds->n_machine_name_filter && !name_in(ds->machine_name_filter, ds->n_machine_name_filter,
                                            host->name))
    return false;
  if (ds->n_producer_name_filter || ds->n_producer_name_regex_filter)
    return name_in(ds->producer_name_filter, ds->n_producer_name_filter, pname) ||
           regex_any(ds->producer_name_regex_filter, ds->n_producer_name_regex_filter, pname);
  return true;
}

/* The first instance of host entry hi, and the one after in (NULL after the last): a walk
 * over one host entry's instances, in the order they were made. */
static tr_ds_instance *entry_first(tr_session *s, size_t hi) {
  size_t k = s->hosts[hi].first_instance;
  s->instances_examined += k != 0;
  return k ? &s->instances[k - 1] : NULL;
}

static tr_ds_instance *entry_next(tr_session *s, const tr_ds_instance *in) {
  size_t k = in->next_of_entry;
  s->instances_examined += k != 0;
  return k ? &s->instances[k - 1] : NULL;
}

/* The only writer of an instance's state: keeps the session's counts of instances yet to
 * start and still stopping. */
static void set_state(tr_session *s, tr_ds_instance *in, enum tr_ds_state state) {
  s->num_starting -= in->state == TR_DS_SETUP || in->state == TR_DS_STARTING;
  s->num_stopping -= in->state == TR_DS_STOPPING;
  in->state = state;
  s->num_starting += state == TR_DS_SETUP || state == TR_DS_STARTING;
  s->num_stopping += state == TR_DS_STOPPING;
}

static bool has_instance(tr_session *s, size_t hi, uint32_t producer_id, size_t cfg_index) {
  for (tr_ds_instance *in = entry_first(s, hi); in; in = entry_next(s, in))
    if (in->producer_id == producer_id && in->cfg_index == cfg_index &&
        in->state != TR_DS_STOPPED)
      return true;
  return false;
}

int tr_session_send(tr_session *s, size_t host_index, Tracerelay__Command *cmd) {
  tr_session_host *sh = &s->hosts[host_index];
  if (sh->gone || sh->retired || !sh->host->link)
    return TR_ERR_CLOSED;
  cmd->has_request_id = 1;
  cmd->request_id = ++s->svc->next_request_id;
  return s->svc->link->send_command(sh->host, cmd);
}

static void notify_instance(tr_session *s, const tr_ds_instance *in, bool started) {
  if (s->obs.on_instance)
    s->obs.on_instance(s->obs_ud, in->producer_name, in->ds_name, started);
}

static void start_instance(tr_session *s, tr_ds_instance *in) {
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__StartDataSource start = TRACERELAY__COMMAND__START_DATA_SOURCE__INIT;
  start.has_instance_id = 1;
  start.instance_id = in->id;
  const Perfetto__Protos__TraceConfig__BuiltinDataSource *b = s->cfg->builtin_data_sources;
  if (b != NULL && b->has_snapshot_interval_ms && b->snapshot_interval_ms > 0) {
    start.has_clock_snapshot_interval_ms = 1;
    start.clock_snapshot_interval_ms = b->snapshot_interval_ms;
  }
  cmd.has_producer_id = 1;
  cmd.producer_id = in->producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_START_DATA_SOURCE;
  cmd.start_data_source = &start;
  s->svc->link->probe_clock(s->hosts[in->host_index].host);
  if (tr_session_send(s, in->host_index, &cmd) != 0) {
    TR_WARN(COMP, "session %llu: cannot start %s on %s (host not connected)",
            (unsigned long long)s->id, in->ds_name, s->hosts[in->host_index].host->name);
    return;
  }
  set_state(s, in, TR_DS_STARTING);
  in->pending_request = cmd.request_id;
}

static void check_all_started(tr_session *s) {
  if (s->all_started || s->state != TR_SESSION_STARTED || s->num_starting > 0)
    return;
  s->all_started = true;
  tr_session_add_event(s, TR_TW_ALL_DATA_SOURCES_STARTED);
  if (s->obs.on_all_started)
    s->obs.on_all_started(s->obs_ud);
}

static int add_instance(tr_session *s, size_t hi, const tr_remote_producer *p, size_t cfg_index,
                        const Perfetto__Protos__DataSourceDescriptor *desc) {
  const Perfetto__Protos__TraceConfig__DataSource *ds = s->cfg->data_sources[cfg_index];
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__SetupDataSource setup = TRACERELAY__COMMAND__SETUP_DATA_SOURCE__INIT;
  Perfetto__Protos__DataSourceConfig dsc = *ds->config; /* shallow: unknown fields kept */
  tr_ds_instance *in;

  if (s->num_instances == s->cap_instances) {
    size_t cap = s->cap_instances ? s->cap_instances * 2 : 16;
    tr_ds_instance *n = realloc(s->instances, cap * sizeof *n);
    if (!n)
      return TR_ERR_NOMEM;
    s->instances = n;
    s->cap_instances = cap;
  }
  in = &s->instances[s->num_instances];
  memset(in, 0, sizeof *in);
  in->id = ++s->svc->next_instance_id;
  in->host_index = hi;
  in->cfg_index = cfg_index;
  in->producer_id = p->id;
  in->producer_name = strdup(p->name ? p->name : "");
  in->ds_name = strdup(desc->name);
  in->handles_clear = desc->has_handles_incremental_state_clear &&
                      desc->handles_incremental_state_clear;
  /* A guest's producers emulate shared memory: their chunks reach us only when they flush, so
   * they are flushed whatever their descriptor says, as traced flushes emulated producers. */
  in->no_flush = desc->has_no_flush && desc->no_flush && s->hosts[hi].host->guest_of == NULL;
  in->state = TR_DS_STOPPED; /* counted nowhere until it is made */
  if (!in->producer_name || !in->ds_name) {
    free(in->producer_name);
    free(in->ds_name);
    return TR_ERR_NOMEM;
  }
  set_state(s, in, TR_DS_SETUP);
  s->num_instances++;
  tr_session_host *sh = &s->hosts[hi];
  if (sh->last_instance)
    s->instances[sh->last_instance - 1].next_of_entry = s->num_instances;
  else
    sh->first_instance = s->num_instances;
  sh->last_instance = s->num_instances;

  dsc.has_target_buffer = 1;
  dsc.target_buffer = s->buffers[tr_config_check_target_buffer(s->cfg, ds->config)].global_id;
  dsc.has_tracing_session_id = 1;
  dsc.tracing_session_id = s->id;
  dsc.has_trace_duration_ms = 1;
  dsc.trace_duration_ms = s->cfg->duration_ms;
  dsc.has_stop_timeout_ms = 1;
  dsc.stop_timeout_ms = s->stop_timeout_ms;
  setup.has_instance_id = 1;
  setup.instance_id = in->id;
  setup.config = &dsc;
  cmd.has_producer_id = 1;
  cmd.producer_id = p->id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE;
  cmd.setup_data_source = &setup;
  if (tr_session_send(s, hi, &cmd) != 0) {
    set_state(s, in, TR_DS_STOPPED);
    return 0;
  }
  TR_INFO(COMP, "session %llu: data source %s on %s/%s (instance %llu)",
          (unsigned long long)s->id, in->ds_name, s->hosts[hi].host->name, in->producer_name,
          (unsigned long long)in->id);
  notify_instance(s, in, false);
  if (s->state == TR_SESSION_STARTED)
    start_instance(s, in);
  return 0;
}

/* Sets up every data source of the config on every producer of host entry hi that matches
 * and has none yet. */
static void match_host(tr_session *s, size_t hi) {
  tr_session_host *sh = &s->hosts[hi];
  tr_host *host = sh->host;
  if (sh->gone || sh->retired || s->state >= TR_SESSION_STOPPING)
    return;
  for (size_t p = 0; p < host->num_producers; p++) {
    const tr_remote_producer *prod = &host->producers[p];
    if (!prod->connected)
      continue;
    for (size_t d = 0; d < prod->num_data_sources; d++) {
      const Perfetto__Protos__DataSourceDescriptor *desc = prod->data_sources[d];
      if (!desc->name)
        continue;
      for (size_t c = 0; c < s->cfg->n_data_sources; c++) {
        const Perfetto__Protos__TraceConfig__DataSource *ds = s->cfg->data_sources[c];
        if (strcmp(ds->config->name, desc->name) != 0 || !ds_matches(ds, host, prod) ||
            has_instance(s, hi, prod->id, c))
          continue;
        if (add_instance(s, hi, prod, c, desc) != 0)
          TR_ERROR(COMP, "session %llu: out of memory setting up %s on %s",
                   (unsigned long long)s->id, desc->name, host->name);
      }
    }
  }
}

size_t tr_session_newest_entry(const tr_session *s, const tr_host *host) {
  size_t o = tr_hosts_ordinal(host);
  return o < s->cap_entry_of ? s->entry_of[o] : 0;
}

tr_session_host *tr_session_find_host(tr_session *s, const tr_host *host, size_t *index) {
  /* O(1), per chunk and ack: a walk over the entries was linear in the hosts. */
  size_t e = tr_session_newest_entry(s, host);
  if (e == 0)
    return NULL;
  size_t i = e - 1;
  s->host_entries_examined++;
  if (index)
    *index = i;
  return &s->hosts[i];
}

/* Room in entry_of for the host; a failed call leaves it as it was. */
static int entry_room(tr_session *s, const tr_host *host) {
  size_t o = tr_hosts_ordinal(host);
  if (o < s->cap_entry_of)
    return 0;
  size_t cap = o + 1 > 2 * s->cap_entry_of ? o + 1 : 2 * s->cap_entry_of;
  size_t *n = realloc(s->entry_of, cap * sizeof *n);
  if (!n)
    return TR_ERR_NOMEM;
  memset(n + s->cap_entry_of, 0, (cap - s->cap_entry_of) * sizeof *n);
  s->entry_of = n;
  s->cap_entry_of = cap;
  return 0;
}

/* The entry's central buffers counted in the service's budget, or, past it, marked
 * over_budget: none will be made. A clone's entries are not made here: session_clone.c
 * counts a clone's buffers as a whole. */
static void reserve(tr_session *s, tr_session_host *n) {
  if (!tr_session_admit_host_fits(s, n->host)) {
    n->over_budget = true;
    return;
  }
  s->reserved += s->bytes_per_host;
  s->svc->buffer_memory_reserved += s->bytes_per_host;
}

static int add_host(tr_session *s, tr_host *host, size_t *index) {
  if (entry_room(s, host) != 0)
    return TR_ERR_NOMEM;
  tr_session_host *n = realloc(s->hosts, (s->num_hosts + 1) * sizeof *n);
  if (!n)
    return TR_ERR_NOMEM;
  s->hosts = n;
  n = &s->hosts[s->num_hosts];
  memset(n, 0, sizeof *n);
  n->tbufs = calloc(s->num_buffers, sizeof *n->tbufs);
  n->drops_at_start = calloc(2 * s->num_buffers + 1, sizeof *n->drops_at_start);
  /* The read side last: its entries must stay numbered as the session's. */
  if (!n->tbufs || !n->drops_at_start || tr_session_flush_add_host(s) != 0 ||
      tr_trace_output_add_host(s->output, host, n->tbufs) != 0) {
    free(n->tbufs);
    free(n->drops_at_start);
    return TR_ERR_NOMEM;
  }
  n->drops_at_end = n->drops_at_start + s->num_buffers;
  for (size_t b = 0; b < s->num_buffers; b++)
    n->drops_at_start[b] = tr_hosts_buffer_drops(host, s->buffers[b].global_id);
  n->host = host;
  n->smb_full_at_start = host->stats.agent_smb_full;
  n->smb_full_ns_at_start = host->stats.agent_smb_full_ns;
  n->agent_instance_id = host->agent_instance_id;
  n->gone = host->link == NULL;
  n->older_entry = s->entry_of[tr_hosts_ordinal(host)];
  reserve(s, n);
  *index = s->num_hosts++;
  s->entry_of[tr_hosts_ordinal(host)] = s->num_hosts; /* the newest entry is the live one */
  return 0;
}

/* ---- lifecycle ---- */

static void on_timer_closed(uv_handle_t *h) {
  tr_session *s = h->data;
  if (--s->timers_open > 0)
    return;
  free(s);
}

static void duration_flush_done(void *ud, bool ok) {
  tr_session *s = ud;
  (void)ok;
  tr_session_disable(s);
}

void tr_session_stop_after_flush(tr_session *s) {
  if (s->state >= TR_SESSION_STOPPING || s->duration_flushing)
    return;
  s->duration_flushing = true;
  if (tr_session_flush(s, 0, FLUSH_FLAGS_TRACE_STOP, duration_flush_done, s) != 0)
    tr_session_disable(s);
}

static void on_duration(uv_timer_t *t) {
  tr_session *s = t->data;
  if (!tr_session_triggers_stop_pending(s)) /* else the trigger's stop is under way */
    tr_session_stop_after_flush(s);
}

static void on_flush_period(uv_timer_t *t) {
  tr_session *s = t->data;
  tr_session_flush(s, 0, FLUSH_FLAGS_PERIODIC, NULL, NULL);
}

static bool clears(const tr_ds_instance *in) {
  return in->state == TR_DS_STARTED && in->handles_clear;
}

/* One ClearIncrementalState to first's producer on host entry hi, for its instances from first
 * on that handle it (ids: room for them). */
static void clear_producer(tr_session *s, size_t hi, tr_ds_instance *first, uint64_t *ids) {
  size_t n = 0;
  for (tr_ds_instance *in = first; in; in = entry_next(s, in))
    if (in->producer_id == first->producer_id && clears(in))
      ids[n++] = in->id;
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__ClearIncrementalState clr =
      TRACERELAY__COMMAND__CLEAR_INCREMENTAL_STATE__INIT;
  clr.n_instance_ids = n;
  clr.instance_ids = ids;
  cmd.has_producer_id = 1;
  cmd.producer_id = first->producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_CLEAR_INCREMENTAL_STATE;
  cmd.clear_incremental_state = &clr;
  tr_session_send(s, hi, &cmd);
}

/* ClearIncrementalState, one command per producer, to the instances that handle it. */
static void on_clear_period(uv_timer_t *t) {
  tr_session *s = t->data;
  uint64_t *ids = malloc(s->num_instances * sizeof *ids + 1);
  if (!ids)
    return;
  for (size_t hi = 0; hi < s->num_hosts; hi++)
    for (tr_ds_instance *first = entry_first(s, hi); first; first = entry_next(s, first)) {
      if (!clears(first))
        continue;
      bool done_before = false; /* the producer's command went with an earlier instance */
      for (tr_ds_instance *in = entry_first(s, hi); in != first && !done_before;
           in = entry_next(s, in))
        done_before = in->producer_id == first->producer_id && clears(in);
      if (!done_before)
        clear_producer(s, hi, first, ids);
    }
  free(ids);
}

/* The agent never confirmed in's stop: asked again now or when it is back, unless a new agent
 * instance took over its host entry (the instance went with the old one). */
static void ask_again_to_stop(tr_session *s, const tr_ds_instance *in) {
  const tr_session_host *sh = &s->hosts[in->host_index];
  if (!sh->retired)
    tr_session_unstopped_add(s->svc, sh->host, sh->agent_instance_id, in->producer_id, in->id);
}

static void on_stop_timeout(uv_timer_t *t) {
  tr_session *s = t->data;
  for (size_t i = 0; i < s->num_instances; i++) {
    tr_ds_instance *in = &s->instances[i];
    if (in->state != TR_DS_STOPPING)
      continue;
    TR_WARN(COMP, "session %llu: %s on %s/%s did not stop within the timeout",
            (unsigned long long)s->id, in->ds_name, s->hosts[in->host_index].host->name,
            in->producer_name);
    set_state(s, in, TR_DS_STOPPED);
    in->pending_request = 0;
    s->hosts[in->host_index].stops_timed_out++;
    ask_again_to_stop(s, in);
  }
  tr_session_end(s, NULL);
}

static uint32_t or_default_timeout(uint32_t timeout_ms) {
  return timeout_ms ? timeout_ms : TR_SESSION_DEFAULT_TIMEOUT_MS;
}

static int copy_config(const Perfetto__Protos__TraceConfig *cfg,
                       Perfetto__Protos__TraceConfig **out) {
  size_t n = perfetto__protos__trace_config__get_packed_size(cfg);
  uint8_t *buf = malloc(n + 1);
  if (!buf)
    return TR_ERR_NOMEM;
  perfetto__protos__trace_config__pack(cfg, buf);
  *out = perfetto__protos__trace_config__unpack(NULL, n, buf);
  free(buf);
  return *out ? 0 : TR_ERR_NOMEM;
}

static void init_timer(tr_session *s, uv_timer_t *t) {
  uv_timer_init(s->svc->loop, t);
  t->data = s;
  s->timers_open++;
}

/* write_flush_mode: the flush before a periodic write; the write follows it, done or not (as
 * traced writes after a timed-out flush). */
static void write_flush_done(void *ud, bool ok) {
  tr_session *s = ud;
  (void)ok; /* a flush that timed out is counted and logged by session_flush.c */
  if (!s->freeing && s->state == TR_SESSION_STARTED)
    tr_trace_output_write_now(s->output);
}

static void output_flush_before_write(void *ud) {
  tr_session *s = ud;
  if (tr_session_flush(s, 0, FLUSH_FLAGS_PERIODIC, write_flush_done, s) != 0)
    tr_trace_output_write_now(s->output);
}

/* Told by the read side: the tail of each pass and a full file. */
static int output_trace_stats(void *ud, uint64_t ts, tr_trace_writer_buf *out) {
  return tr_session_stats_packet(ud, ts, out);
}

static void output_file_full(void *ud) {
  tr_session_disable(ud);
}

static void announce_end(tr_session *s) {
  void (*on_end)(void *, const char *) = s->obs.on_end;
  TR_INFO(COMP, "session %llu: stopped%s%s", (unsigned long long)s->id, s->end_error ? ": " : "",
          s->end_error ? s->end_error : "");
  s->obs.on_end = NULL;
  if (on_end)
    on_end(s->obs_ud, s->end_error);
  free(s->end_error);
  s->end_error = NULL;
}

/* The final pass is in the file: the consumer may read it now. */
static void output_file_done(void *ud) {
  tr_session *s = ud;
  s->file_pending = false;
  announce_end(s);
}

static tr_trace_output_params output_params(tr_session *s) {
  return (tr_trace_output_params){
      .loop = s->svc->loop,
      .session_id = s->id,
      .uid = s->svc->uid,
      .timeline = s->svc->timeline,
      .system_info = s->svc->system_info,
      .cfg = s->cfg,
      .trace_stats = output_trace_stats,
      .on_file_full = output_file_full,
      .on_file_done = output_file_done,
      .flush_before_write = s->flush_on_write ? output_flush_before_write : NULL,
      .ud = s,
  };
}

static int new_output(tr_session *s, int output_fd, bool sync_after_write, char *err,
                      size_t err_len) {
  tr_trace_output_params p = output_params(s);
  p.sync_after_write = sync_after_write;
  return tr_trace_output_new(&p, output_fd, &s->output, err, err_len);
}

/* In this order, so that timers due at the same time fire as they always did: the clock
 * journal first, the file writes last. */
static void start_timers(tr_session *s) {
  const Perfetto__Protos__TraceConfig *c = s->cfg;
  tr_trace_output_start_journal(s->output);
  if (c->duration_ms)
    uv_timer_start(&s->duration_timer, on_duration, c->duration_ms, 0);
  if (s->flush_period_ms)
    uv_timer_start(&s->flush_timer, on_flush_period, s->flush_period_ms, s->flush_period_ms);
  if (c->incremental_state_config && c->incremental_state_config->clear_period_ms) {
    uint64_t p = c->incremental_state_config->clear_period_ms;
    uv_timer_start(&s->clear_timer, on_clear_period, p, p);
  }
  tr_trace_output_start_writes(s->output);
}

/* Frees what session_alloc (and new_output) made, for a session never linked. */
static void session_unalloc(tr_session *s) {
  if (!s)
    return;
  if (s->output)
    tr_trace_output_free(s->output);
  tr_session_flush_free(s->flushes);
  tr_session_triggers_free(s->triggers);
  free(s->buffers);
  if (s->cfg)
    perfetto__protos__trace_config__free_unpacked(s->cfg, NULL);
  free(s);
}

/* A session of cfg (copied) with its buffers (new global ids) and flush bookkeeping, not yet
 * in the service's list, without a read side. TR_ERR_FULL (err filled), TR_ERR_NOMEM. */
static int session_alloc(tr_service *svc, uid_t consumer_uid,
                         const Perfetto__Protos__TraceConfig *cfg, tr_session **out, char *err,
                         size_t err_len) {
  tr_session *s;
  int rc;
  *out = NULL;
  if (svc->num_sessions >= TR_SESSION_MAX_SESSIONS) {
    snprintf(err, err_len, "too many tracing sessions (%u): stop one first",
             TR_SESSION_MAX_SESSIONS);
    return TR_ERR_FULL;
  }
  if (!(s = calloc(1, sizeof *s)))
    return TR_ERR_NOMEM;
  s->svc = svc;
  s->id = ++svc->next_session_id;
  s->consumer_uid = consumer_uid;
  if ((rc = copy_config(cfg, &s->cfg)) != 0 || (rc = tr_session_flush_new(&s->flushes)) != 0)
    goto fail;
  s->cfg->duration_ms = tr_session_triggers_duration_ms(cfg);
  s->stop_timeout_ms = or_default_timeout(cfg->data_source_stop_timeout_ms);
  s->flush_timeout_ms = or_default_timeout(cfg->flush_timeout_ms);
  s->num_buffers = cfg->n_buffers;
  s->buffers = calloc(s->num_buffers, sizeof *s->buffers);
  if (!s->buffers) {
    rc = TR_ERR_NOMEM;
    goto fail;
  }
  for (size_t i = 0; i < s->num_buffers; i++) {
    s->buffers[i].global_id = svc->next_buffer_id++;
    s->buffers[i].size = (size_t)cfg->buffers[i]->size_kb * 1024u;
    s->bytes_per_host += s->buffers[i].size;
    s->buffers[i].policy = cfg->buffers[i]->fill_policy ==
                                   PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__DISCARD
                               ? TR_TBUF_DISCARD
                               : TR_TBUF_RING_BUFFER;
  }
  *out = s;
  return 0;
fail:
  session_unalloc(s);
  return rc;
}

/* Its timers made and the session put into the service's list. */
static void session_link(tr_session *s) {
  init_timer(s, &s->duration_timer);
  init_timer(s, &s->trigger_timer);
  init_timer(s, &s->flush_timer);
  init_timer(s, &s->clear_timer);
  init_timer(s, &s->stop_timer);
  s->next = s->svc->sessions;
  s->svc->sessions = s;
  s->svc->num_sessions++;
}

int tr_session_new_read_only(tr_session *src, uid_t consumer_uid,
                             const Perfetto__Protos__TraceConfig *cfg, tr_session **out) {
  char err[128];
  tr_session *s;
  int rc = session_alloc(src->svc, consumer_uid, cfg, &s, err, sizeof err);
  if (rc != 0)
    return rc;
  tr_trace_output_params p = output_params(s);
  if ((rc = tr_trace_output_clone(src->output, &p, &s->output)) != 0) {
    session_unalloc(s);
    return rc;
  }
  s->read_only = true;
  s->state = TR_SESSION_STARTED; /* until tr_session_end, which its maker calls */
  session_link(s);
  *out = s;
  return 0;
}

int tr_session_enable(tr_service *svc, uid_t consumer_uid,
                      const Perfetto__Protos__TraceConfig *cfg, int output_fd,
                      const tr_session_observer *obs, void *obs_ud, tr_session **out, char *err,
                      size_t err_len) {
  tr_session *s = NULL;
  int rc;

  *out = NULL;
  if ((rc = tr_session_validate_config(cfg, err, err_len)) != 0 ||
      (rc = tr_session_admit_check(svc, consumer_uid, cfg, err, err_len)) != 0 ||
      (rc = tr_session_admit_budget(svc, cfg, err, err_len)) != 0)
    goto fail_fd;
  if (cfg->unique_session_name && cfg->unique_session_name[0] &&
      tr_session_named(svc, cfg->unique_session_name)) {
    /* traced's words, which the CLI prints */
    snprintf(err, err_len, "A trace with this unique session name (%s) already exists",
             cfg->unique_session_name);
    rc = TR_ERR_CONFIG;
    goto fail_fd;
  }
  if ((rc = session_alloc(svc, consumer_uid, cfg, &s, err, err_len)) != 0)
    goto fail_fd;
  tr_session_admit_preempt(svc, cfg);
  struct tr_config_flush_plan plan;
  tr_config_check_flush_plan(cfg, s->id, &plan);
  s->flush_period_ms = plan.period_ms;
  s->flush_on_write = plan.on_write;
  rc = new_output(s, output_fd, plan.fflush, err, err_len);
  output_fd = -1; /* taken */
  if (rc != 0 || (rc = tr_session_triggers_new(cfg, &s->triggers)) != 0)
    goto fail;
  if (obs)
    s->obs = *obs;
  s->obs_ud = obs_ud;
  s->state = cfg->deferred_start || tr_session_triggers_wait_to_start(cfg) ? TR_SESSION_CONFIGURED
                                                                          : TR_SESSION_STARTED;
  session_link(s);
  TR_INFO(COMP, "session %llu: enabled by uid %u, %zu buffers, %zu data sources%s",
          (unsigned long long)s->id, (unsigned)consumer_uid, s->num_buffers, cfg->n_data_sources,
          cfg->deferred_start ? ", deferred start" : "");

  for (tr_host *host = tr_hosts_first(svc->hosts); host; host = host->next) {
    size_t hi;
    if (!host->link)
      continue;
    if (add_host(s, host, &hi) != 0) {
      TR_ERROR(COMP, "session %llu: out of memory adding host %s", (unsigned long long)s->id,
               host->name);
      continue;
    }
    match_host(s, hi);
  }
  tr_session_unmatched_log(s);
  tr_session_triggers_enabled(s);
  if (s->state == TR_SESSION_STARTED) {
    tr_session_add_event(s, TR_TW_TRACING_STARTED);
    start_timers(s);
    check_all_started(s);
  }
  *out = s;
  return 0;
fail:
  session_unalloc(s);
fail_fd:
  if (output_fd >= 0)
    close(output_fd);
  return rc;
}

void tr_session_start_triggered(tr_session *s, uint32_t duration_ms) {
  s->cfg->duration_ms = duration_ms;
  tr_session_start(s);
}

int tr_session_start(tr_session *s) {
  if (s->state != TR_SESSION_CONFIGURED)
    return TR_ERR_STATE;
  s->state = TR_SESSION_STARTED;
  tr_session_add_event(s, TR_TW_TRACING_STARTED);
  for (size_t i = 0; i < s->num_instances; i++)
    if (s->instances[i].state == TR_DS_SETUP)
      start_instance(s, &s->instances[i]);
  start_timers(s);
  check_all_started(s);
  return 0;
}

static bool stop_pending(const tr_session *s) { return s->num_stopping > 0; }

static void stop_instance(tr_session *s, tr_ds_instance *in) {
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__StopDataSource stop = TRACERELAY__COMMAND__STOP_DATA_SOURCE__INIT;
  if (in->state == TR_DS_STOPPED || in->state == TR_DS_STOPPING)
    return;
  stop.has_instance_id = 1;
  stop.instance_id = in->id;
  cmd.has_producer_id = 1;
  cmd.producer_id = in->producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE;
  cmd.stop_data_source = &stop;
  if (tr_session_send(s, in->host_index, &cmd) != 0) {
    set_state(s, in, TR_DS_STOPPED);
    in->pending_request = 0;
    ask_again_to_stop(s, in);
    notify_instance(s, in, false);
    return;
  }
  set_state(s, in, TR_DS_STOPPING);
  in->pending_request = cmd.request_id;
}

void tr_session_disable(tr_session *s) {
  if (s->state >= TR_SESSION_STOPPING)
    return;
  s->state = TR_SESSION_STOPPING;
  uv_timer_stop(&s->duration_timer);
  uv_timer_stop(&s->flush_timer);
  uv_timer_stop(&s->clear_timer);
  for (size_t i = 0; i < s->num_instances; i++)
    stop_instance(s, &s->instances[i]);
  if (!stop_pending(s)) {
    tr_session_end(s, NULL);
    return;
  }
  uv_timer_start(&s->stop_timer, on_stop_timeout, s->stop_timeout_ms, 0);
}

void tr_session_end(tr_session *s, const char *error) {
  if (s->state == TR_SESSION_STOPPED)
    return;
  s->state = TR_SESSION_STOPPED;
  uv_timer_stop(&s->duration_timer);
  uv_timer_stop(&s->flush_timer);
  uv_timer_stop(&s->clear_timer);
  uv_timer_stop(&s->stop_timer);
  uv_timer_stop(&s->trigger_timer);
  tr_session_add_event(s, TR_TW_TRACING_DISABLED);
  s->end_error = error ? strdup(error) : NULL; /* without memory: announced without it */
  if (tr_trace_output_stop(s->output)) { /* the file's final pass: output_file_done follows */
    s->file_pending = true;
    return;
  }
  announce_end(s);
}

void tr_session_add_event(tr_session *s, enum tr_trace_writer_event ev) {
  tr_trace_output_add_event(s->output, ev);
}

void tr_session_set_observer(tr_session *s, const tr_session_observer *obs, void *ud) {
  s->obs = *obs;
  s->obs_ud = ud;
}

int tr_session_set_detach_key(tr_session *s, const char *key) {
  char *copy = NULL;
  if (key && !(copy = strdup(key)))
    return TR_ERR_NOMEM;
  free(s->detach_key);
  s->detach_key = copy;
  return 0;
}

void tr_session_forget(tr_session *s, void *ud) {
  if (s->obs_ud == ud) {
    memset(&s->obs, 0, sizeof s->obs);
    s->obs_ud = NULL;
  }
}

void tr_session_free(tr_session *s) {
  tr_service *svc = s->svc;
  if (s->freeing)
    return;
  s->freeing = true;
  memset(&s->obs, 0, sizeof s->obs);
  for (size_t i = 0; i < s->num_instances; i++)
    stop_instance(s, &s->instances[i]);
  tr_session_end(s, NULL);
  if (s->file_pending) { /* no loop iteration follows: the rest of the file now */
    tr_trace_output_finish_file(s->output);
    output_file_done(s);
  }
  tr_session_flush_free(s->flushes);
  s->flushes = NULL;
  tr_trace_output_free(s->output);
  for (tr_session **p = &svc->sessions; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  svc->num_sessions--;
  svc->buffer_memory_reserved -= s->reserved;
  for (size_t h = 0; h < s->num_hosts; h++) {
    for (size_t b = 0; b < s->num_buffers; b++)
      tr_tbuf_free(s->hosts[h].tbufs[b]);
    free(s->hosts[h].tbufs);
    free(s->hosts[h].drops_at_start); /* drops_at_end with it */
  }
  free(s->hosts);
  free(s->entry_of);
  for (size_t i = 0; i < s->num_instances; i++) {
    free(s->instances[i].producer_name);
    free(s->instances[i].ds_name);
  }
  free(s->instances);
  free(s->buffers);
  free(s->detach_key);
  tr_session_triggers_free(s->triggers);
  perfetto__protos__trace_config__free_unpacked(s->cfg, NULL);
  TR_INFO(COMP, "session %llu: freed", (unsigned long long)s->id);
  uv_close((uv_handle_t *)&s->duration_timer, on_timer_closed);
  uv_close((uv_handle_t *)&s->flush_timer, on_timer_closed);
  uv_close((uv_handle_t *)&s->clear_timer, on_timer_closed);
  uv_close((uv_handle_t *)&s->stop_timer, on_timer_closed);
  uv_close((uv_handle_t *)&s->trigger_timer, on_timer_closed);
}

/* ---- what other files read (session.h) ---- */

tr_session *tr_session_next(const tr_session *s) { return s->next; }

uint64_t tr_session_id(const tr_session *s) { return s->id; }

uid_t tr_session_consumer_uid(const tr_session *s) { return s->consumer_uid; }

enum tr_session_state tr_session_get_state(const tr_session *s) { return s->state; }

const Perfetto__Protos__TraceConfig *tr_session_config(const tr_session *s) { return s->cfg; }

tr_trace_output *tr_session_output(tr_session *s) { return s->output; }

size_t tr_session_num_instances(const tr_session *s) { return s->num_instances; }

const char *tr_session_detach_key(const tr_session *s) { return s->detach_key; }

bool tr_session_visible_to(const tr_session *s, uid_t viewer) {
  return viewer == 0 || s->consumer_uid == viewer;
}

tr_session *tr_session_named(const tr_service *svc, const char *name) {
  for (tr_session *s = svc->sessions; s; s = s->next)
    if (!s->read_only && s->cfg->unique_session_name &&
        strcmp(s->cfg->unique_session_name, name) == 0)
      return s;
  return NULL;
}

bool tr_session_read_only(const tr_session *s) { return s->read_only; }

bool tr_session_has_host(const tr_session *s, const tr_host *host) {
  return tr_session_newest_entry(s, host) != 0;
}

/* ---- calls from the link server (link_calls.h) ---- */

/* A session still recording: one that stopped, its trace waiting to be read (a 10,000-host
 * trace took minutes), needs no clock probes at the session rate (10,000 fits a second then). */
bool tr_session_holds_host(const tr_service *svc, const tr_host *host) {
  /* O(sessions + stops waiting): asked only of gone hosts, as a new one is made. */
  for (const tr_session *s = svc->sessions; s; s = s->next)
    if (tr_session_has_host(s, host))
      return true;
  return tr_session_unstopped_holds(svc, host);
}

bool tr_session_any(const tr_service *svc) {
  for (const tr_session *s = svc->sessions; s; s = s->next)
    if (s->state != TR_SESSION_STOPPED)
      return true;
  return false;
}

void tr_session_on_host_connected(tr_service *svc, tr_host *host) {
  tr_session_unstopped_reconnected(svc, host);
  for (tr_session *s = svc->sessions; s; s = s->next) {
    size_t hi;
    tr_session_host *sh = tr_session_find_host(s, host, &hi);
    if (sh && sh->agent_instance_id != host->agent_instance_id && host->restarted_unclean)
      sh->agent_exits_unclean++;
    if (s->state >= TR_SESSION_STOPPING)
      continue;
    if (sh && sh->agent_instance_id == host->agent_instance_id) {
      if (sh->gone)
        tr_trace_output_add_host_mark(s->output, host, TR_MARK_RECONNECTED);
      sh->gone = false; /* same agent: its instances still run there */
    } else {
      if (sh) {
        tr_trace_output_add_host_mark(s->output, host, TR_MARK_AGENT_RESTARTED);
        /* The agent restarted: what ran there is gone; set the host up again. */
        TR_WARN(COMP, "session %llu: agent on %s restarted, setting its data sources up again",
                (unsigned long long)s->id, host->name);
        sh->retired = true;
        sh->gone = true;
        for (size_t b = 0; b < s->num_buffers; b++)
          sh->drops_at_end[b] = tr_hosts_buffer_drops(host, s->buffers[b].global_id);
        sh->smb_full_at_end = host->stats.agent_smb_full;
        sh->smb_full_ns_at_end = host->stats.agent_smb_full_ns;
        for (tr_ds_instance *in = entry_first(s, hi); in; in = entry_next(s, in))
          set_state(s, in, TR_DS_STOPPED);
      }
      if (add_host(s, host, &hi) != 0) {
        TR_ERROR(COMP, "session %llu: out of memory adding host %s", (unsigned long long)s->id,
                 host->name);
        continue;
      }
    }
    match_host(s, hi);
  }
}

void tr_session_on_host_disconnected(tr_service *svc, tr_host *host, const char *reason) {
  for (tr_session *s = svc->sessions; s; s = s->next) {
    size_t hi;
    tr_session_host *sh = tr_session_find_host(s, host, &hi);
    if (!sh || sh->gone || s->read_only) /* a clone keeps the links as they were */
      continue;
    sh->gone = true;
    sh->disconnects++;
    if (sh->num_disconnected_at < TR_SESSION_MAX_DISCONNECT_MARKS)
      sh->disconnected_at[sh->num_disconnected_at++] = tr_session_now();
    tr_trace_output_add_host_mark(s->output, host, TR_MARK_DISCONNECTED);
    TR_WARN(COMP, "session %llu: host %s disconnected (%s); its data so far is kept",
            (unsigned long long)s->id, host->name, reason ? reason : "no reason given");
    tr_session_flush_on_host_gone(s, hi);
    if (s->state == TR_SESSION_STOPPING) {
      for (tr_ds_instance *in = entry_first(s, hi); in; in = entry_next(s, in))
        if (in->state == TR_DS_STOPPING) {
          set_state(s, in, TR_DS_STOPPED);
          ask_again_to_stop(s, in); /* the stop may not have reached it */
        }
      if (!stop_pending(s))
        tr_session_end(s, NULL);
    }
  }
}

static const tr_remote_producer *find_producer(const tr_host *host, uint32_t id) {
  for (size_t i = 0; i < host->num_producers; i++)
    if (host->producers[i].id == id)
      return &host->producers[i];
  return NULL;
}

void tr_session_on_producers_changed(tr_service *svc, tr_host *host, uint32_t producer_id) {
  const tr_remote_producer *p = find_producer(host, producer_id);
  for (tr_session *s = svc->sessions; s; s = s->next) {
    size_t hi;
    if (!tr_session_find_host(s, host, &hi))
      continue;
    if (!p || !p->connected) {
      for (tr_ds_instance *in = entry_first(s, hi); in; in = entry_next(s, in)) {
        if (in->producer_id != producer_id || in->state == TR_DS_STOPPED)
          continue;
        set_state(s, in, TR_DS_STOPPED);
        in->pending_request = 0;
        notify_instance(s, in, false);
      }
      if (s->state == TR_SESSION_STOPPING && !stop_pending(s))
        tr_session_end(s, NULL);
      continue;
    }
    match_host(s, hi);
    check_all_started(s);
  }
}

int tr_session_on_host_clock_snapshot(tr_service *svc, tr_host *host,
                                      const Tracerelay__HostClockSnapshot *m) {
  (void)svc;
  return tr_hosts_add_clock_snapshot(host, m, (int64_t)tr_session_now());
}

/* The session buffer with this global id, and its index. */
static tr_session *find_buffer(tr_service *svc, uint32_t global_id, size_t *index) {
  for (tr_session *s = svc->sessions; s; s = s->next) {
    if (s->num_buffers == 0 || global_id < s->buffers[0].global_id ||
        global_id > s->buffers[s->num_buffers - 1].global_id)
      continue;
    *index = global_id - s->buffers[0].global_id;
    return s;
  }
  return NULL;
}

static tr_tbuf *host_buffer(tr_service *svc, tr_host *host, uint32_t target_buffer,
                            tr_session **session) {
  size_t b, hi;
  tr_session *s = find_buffer(svc, target_buffer, &b);
  tr_session_host *sh;
  if (!s) {
    svc->chunks_unknown_buffer++;
    TR_DEBUG(COMP, "chunk from %s for unknown buffer %u dropped", host->name, target_buffer);
    return NULL;
  }
  *session = s;
  sh = tr_session_find_host(s, host, &hi);
  if (!sh || sh->retired || sh->over_budget) {
    if (sh)
      sh->chunks_refused++;
    return NULL;
  }
  if (!sh->tbufs[b]) {
    int rc = tr_tbuf_new(s->buffers[b].size, s->buffers[b].policy, &sh->tbufs[b]);
    if (rc != 0) {
      TR_ERROR(COMP, "session %llu: cannot allocate %zu bytes of buffer %zu for %s: %s",
               (unsigned long long)s->id, s->buffers[b].size, b, host->name, tr_strerror(rc));
      sh->chunks_refused++;
      return NULL;
    }
  }
  return sh->tbufs[b];
}

void tr_session_on_chunk(tr_service *svc, tr_host *host, const Tracerelay__Chunk *chunk) {
  tr_session *s = NULL;
  tr_tbuf *b = host_buffer(svc, host, chunk->target_buffer, &s);
  tr_tbuf_chunk c;
  if (!b)
    return;
  tr_chunk_item_to_tbuf(chunk, &c);
  /* Refusals (ABI violations, DISCARD full, oversize) are counted in the buffer's stats. */
  tr_tbuf_write_chunk(b, &c);
}

void tr_session_on_patch(tr_service *svc, tr_host *host, const Tracerelay__Patch *patch) {
  tr_session *s = NULL;
  tr_tbuf *b = host_buffer(svc, host, patch->target_buffer, &s);
  tr_tbuf_patch *p;
  if (!b || patch->writer_id > 0xffff)
    return;
  p = malloc((patch->n_entries + 1) * sizeof *p);
  if (!p)
    return;
  for (size_t i = 0; i < patch->n_entries; i++) {
    p[i].offset = patch->entries[i]->offset;
    tr_chunk_item_patch_bytes(patch->entries[i]->data, p[i].data);
  }
  tr_tbuf_patch_chunk(b, patch->producer_id, (uint16_t)patch->writer_id, patch->chunk_id, p,
                      patch->n_entries, patch->has_more);
  free(p);
}

void tr_session_on_flush_ack(tr_service *svc, tr_host *host, const Tracerelay__FlushAck *ack,
                             int64_t arrived_ns) {
  for (tr_session *s = svc->sessions; s; s = s->next) {
    size_t hi;
    if (tr_session_find_host(s, host, &hi))
      tr_session_flush_on_ack(s, hi, ack, arrived_ns);
  }
}

/* The instance of host awaiting the reply to request_id, in any of its entries (request ids
 * are the service's, unique: at most one matches); NULL for none. */
static tr_ds_instance *find_pending(tr_session *s, const tr_host *host, uint64_t request_id) {
  size_t hi;
  if (!tr_session_find_host(s, host, &hi))
    return NULL;
  for (size_t e = hi + 1; e != 0; e = s->hosts[e - 1].older_entry)
    for (tr_ds_instance *in = entry_first(s, e - 1); in; in = entry_next(s, in))
      if (in->pending_request == request_id)
        return in;
  return NULL;
}

void tr_session_on_command_reply(tr_service *svc, tr_host *host,
                                 const Tracerelay__CommandReply *reply) {
  for (tr_session *s = svc->sessions; s; s = s->next) {
    tr_ds_instance *in = find_pending(s, host, reply->request_id);
    if (!in)
      continue;
    in->pending_request = 0;
    if (reply->error && reply->error[0])
      TR_WARN(COMP, "session %llu: %s on %s/%s: %s", (unsigned long long)s->id, in->ds_name,
              host->name, in->producer_name, reply->error);
    /* A stop the producer did not confirm (the agent's stop timeout ran out, or the
     * producer went away while stopping): its last data may never come. A loss event, as
     * when the session's own stop timeout runs out (on_stop_timeout). */
    if (in->state == TR_DS_STOPPING && reply->error && reply->error[0])
      s->hosts[in->host_index].stops_timed_out++;
    if (in->state == TR_DS_STARTING && !(reply->error && reply->error[0])) {
      set_state(s, in, TR_DS_STARTED);
      in->was_started = true;
      notify_instance(s, in, true);
      check_all_started(s);
    } else if (in->state == TR_DS_STARTING || in->state == TR_DS_STOPPING) {
      set_state(s, in, TR_DS_STOPPED);
      notify_instance(s, in, false);
      check_all_started(s);
      if (s->state == TR_SESSION_STOPPING && !stop_pending(s))
        tr_session_end(s, NULL);
    }
    return;
  }
}

void tr_session_on_trigger(tr_service *svc, tr_host *host, const Tracerelay__Trigger *trigger) {
  struct tr_session_trigger t = {.name = trigger->name,
                                 .producer_name = trigger->producer_name ? trigger->producer_name
                                                                         : "?",
                                 .producer_uid = trigger->producer_uid,
                                 .host = host->name};
  if (t.name)
    tr_session_triggers_activate(svc, &t);
}

const struct tr_link_events tr_session_link_events = {
    .host_connected = tr_session_on_host_connected,
    .host_disconnected = tr_session_on_host_disconnected,
    .producers_changed = tr_session_on_producers_changed,
    .chunk = tr_session_on_chunk,
    .patch = tr_session_on_patch,
    .flush_ack = tr_session_on_flush_ack,
    .command_reply = tr_session_on_command_reply,
    .trigger = tr_session_on_trigger,
    .host_clock_snapshot = tr_session_on_host_clock_snapshot,
    .any_session = tr_session_any,
    .holds_host = tr_session_holds_host,
};
