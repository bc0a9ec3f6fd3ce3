/* producer_commands.c: the commands the agent's caller sends to producers on their
 * GetAsyncCommand stream (reference 2.2, 2.3), in traced's order: setup_tracing with the SMB fd
 * before a producer's first setup_data_source, then start_data_source, stop_data_source, flush
 * and clear_incremental_state; plus the stop timeouts of data sources that promised
 * NotifyDataSourceStopped. One timer serves every stopping instance of the port: O(instances)
 * per expiry, which is cheap next to the stop itself. */
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/base/log.h"
#include "relay/producer/producer_port_priv.h"
#include "relay/base/tr_error.h"

#define LOG_COMP "producer-port"

static int send_packed(pp_producer *p, const uint8_t *cmd, size_t len, int fd) {
  return tr_ipc_conn_reply(p->conn, p->async_request_id, true, true, cmd, len, fd);
}

static int send_command(pp_producer *p, const Perfetto__Protos__GetAsyncCommandResponse *cmd,
                        int fd) {
  size_t len = perfetto__protos__get_async_command_response__get_packed_size(cmd);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf)
    return TR_ERR_NOMEM;
  perfetto__protos__get_async_command_response__pack(cmd, buf);
  int rc = send_packed(p, buf, len, fd);
  free(buf);
  return rc;
}

/* The producer a command goes to: connected and listening for commands. */
static int commandable(tr_producer_port *port, uint32_t producer_id, pp_producer **out) {
  pp_producer *p = pp_find_producer(port, producer_id);
  if (!p)
    return TR_ERR_NOT_FOUND;
  if (!p->has_async)
    return TR_ERR_STATE;
  *out = p;
  return 0;
}

/* First setup of this producer: its SMB (ours unless it brought a valid one) and
 * setup_tracing, the fd riding on that frame. */
static int set_up_tracing(pp_producer *p) {
  uint32_t size = p->smb_size_hint ? p->smb_size_hint : p->port->cfg.smb_size;
  tr_smb_geometry g = tr_smb_choose_geometry(0, 0, size, p->smb_page_hint);
  /* Emulated (remote): the producer keeps its chunks in memory of its own, pages of this size,
   * and sends them whole in CommitData (reference 4.7); there is no SMB to give it. */
  if (!p->remote && !p->shm.has_smb) {
    tr_smb smb;
    int rc = tr_smb_create(&smb, g);
    if (rc < 0)
      return rc;
    rc = tr_producer_shm_set_smb(&p->shm, &smb);
    if (rc < 0) {
      tr_smb_close(&smb);
      return rc;
    }
  }
  uint32_t page_size = p->remote ? g.page_size : (uint32_t)p->shm.smb.page_size;
  Perfetto__Protos__GetAsyncCommandResponse__SetupTracing st =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__SETUP_TRACING__INIT;
  st.has_shared_buffer_page_size_kb = true;
  st.shared_buffer_page_size_kb = page_size / 1024;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING;
  cmd.setup_tracing = &st;
  int rc = send_command(p, &cmd, p->smb_provided || p->remote ? -1 : p->shm.smb.fd);
  if (rc == 0)
    p->tracing_set_up = true;
  return rc;
}

static int reserve_instance(pp_producer *p) {
  if (p->num_instances < p->cap_instances)
    return 0;
  size_t cap = p->cap_instances ? 2 * p->cap_instances : 4;
  pp_instance *n = realloc(p->instances, cap * sizeof(*n));
  if (!n)
    return TR_ERR_NOMEM;
  p->instances = n;
  p->cap_instances = cap;
  return 0;
}

/* Packs GetAsyncCommandResponse{start_data_source} now, so start sends the setup's config. */
static int pack_start(uint64_t instance_id, const Perfetto__Protos__DataSourceConfig *config,
                      uint8_t **out, size_t *out_len) {
  Perfetto__Protos__GetAsyncCommandResponse__StartDataSource start =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__START_DATA_SOURCE__INIT;
  start.has_new_instance_id = true;
  start.new_instance_id = instance_id;
  start.config = (Perfetto__Protos__DataSourceConfig *)config;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE;
  cmd.start_data_source = &start;
  size_t len = perfetto__protos__get_async_command_response__get_packed_size(&cmd);
  uint8_t *buf = malloc(len);
  if (!buf)
    return TR_ERR_NOMEM;
  perfetto__protos__get_async_command_response__pack(&cmd, buf);
  *out = buf;
  *out_len = len;
  return 0;
}

int tr_producer_port_setup_data_source(tr_producer_port *port, uint32_t producer_id,
                                       uint64_t instance_id,
                                       const Perfetto__Protos__DataSourceConfig *config) {
  pp_producer *p;
  int rc = commandable(port, producer_id, &p);
  if (rc < 0)
    return rc;
  if (!config || !config->name || !config->has_target_buffer)
    return TR_ERR_INVAL;
  if (pp_find_instance(p, instance_id) >= 0)
    return TR_ERR_STATE;
  ssize_t ds = pp_find_data_source(p, config->name);
  if (ds < 0)
    return TR_ERR_NOT_FOUND;
  pp_instance inst = {.id = instance_id,
                      .state = PP_SETUP,
                      .target_buffer = config->target_buffer,
                      .notify_on_start = p->data_sources[ds]->will_notify_on_start,
                      .notify_on_stop = p->data_sources[ds]->will_notify_on_stop,
                      .stop_timeout_ms = config->stop_timeout_ms
                                             ? config->stop_timeout_ms
                                             : TR_PRODUCER_PORT_DEFAULT_STOP_TIMEOUT_MS};
  rc = reserve_instance(p);
  if (rc == 0)
    rc = tr_producer_shm_add_buffer(&p->shm, config->target_buffer);
  if (rc == 0 && !p->tracing_set_up)
    rc = set_up_tracing(p);
  if (rc == 0)
    rc = pack_start(instance_id, config, &inst.start_cmd, &inst.start_cmd_len);
  if (rc < 0)
    return rc;
  Perfetto__Protos__GetAsyncCommandResponse__SetupDataSource setup =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__SETUP_DATA_SOURCE__INIT;
  setup.has_new_instance_id = true;
  setup.new_instance_id = instance_id;
  setup.config = (Perfetto__Protos__DataSourceConfig *)config;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_DATA_SOURCE;
  cmd.setup_data_source = &setup;
  rc = send_command(p, &cmd, -1);
  if (rc < 0) {
    free(inst.start_cmd);
    return rc;
  }
  p->instances[p->num_instances++] = inst;
  return 0;
}

int tr_producer_port_start_data_source(tr_producer_port *port, uint32_t producer_id,
                                       uint64_t instance_id) {
  pp_producer *p;
  int rc = commandable(port, producer_id, &p);
  if (rc < 0)
    return rc;
  ssize_t i = pp_find_instance(p, instance_id);
  if (i < 0)
    return TR_ERR_NOT_FOUND;
  pp_instance *inst = &p->instances[i];
  if (inst->state != PP_SETUP)
    return TR_ERR_STATE;
  rc = send_packed(p, inst->start_cmd, inst->start_cmd_len, -1);
  if (rc < 0)
    return rc;
  if (inst->notify_on_start) {
    inst->state = PP_STARTING;
    return 0;
  }
  inst->state = PP_STARTED;
  if (port->cfg.cb.data_source_started)
    port->cfg.cb.data_source_started(port, producer_id, instance_id);
  return 0;
}

static void scrape(pp_producer *p) {
  pp_lock_queue(p->port);
  size_t queued = tr_producer_shm_scrape(&p->shm, p->port->cfg.queue);
  pp_unlock_queue(p->port);
  pp_queue_changed(p->port, queued);
}

int tr_producer_port_stop_data_source(tr_producer_port *port, uint32_t producer_id,
                                      uint64_t instance_id, uint32_t timeout_ms) {
  pp_producer *p;
  int rc = commandable(port, producer_id, &p);
  if (rc < 0)
    return rc;
  ssize_t i = pp_find_instance(p, instance_id);
  if (i < 0)
    return TR_ERR_NOT_FOUND;
  if (p->instances[i].state == PP_STOPPING)
    return TR_ERR_STATE;
  /* What is still in the SMB goes before the stop, as traced scrapes at session end. */
  scrape(p);
  Perfetto__Protos__GetAsyncCommandResponse__StopDataSource stop =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__STOP_DATA_SOURCE__INIT;
  stop.has_instance_id = true;
  stop.instance_id = instance_id;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_STOP_DATA_SOURCE;
  cmd.stop_data_source = &stop;
  rc = send_command(p, &cmd, -1);
  if (rc < 0)
    return rc;
  if (p->instances[i].notify_on_stop) {
    p->instances[i].state = PP_STOPPING;
    p->instances[i].stop_deadline_ms =
        uv_now(port->loop) + (timeout_ms ? timeout_ms : p->instances[i].stop_timeout_ms);
    pp_arm_stop_timer(port);
    return 0;
  }
  pp_remove_instance(p, (size_t)i);
  if (port->cfg.cb.data_source_stopped)
    port->cfg.cb.data_source_stopped(port, producer_id, instance_id, false);
  return 0;
}

int tr_producer_port_flush(tr_producer_port *port, uint32_t producer_id,
                           uint64_t flush_request_id, const uint64_t *instance_ids,
                           size_t num_ids, uint64_t flags) {
  pp_producer *p;
  int rc = commandable(port, producer_id, &p);
  if (rc < 0)
    return rc;
  scrape(p);
  Perfetto__Protos__GetAsyncCommandResponse__Flush flush =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__FLUSH__INIT;
  flush.n_data_source_ids = num_ids;
  flush.data_source_ids = (uint64_t *)instance_ids;
  flush.has_request_id = true;
  flush.request_id = flush_request_id;
  flush.has_flags = flags != 0;
  flush.flags = flags;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_FLUSH;
  cmd.flush = &flush;
  return send_command(p, &cmd, -1);
}

int tr_producer_port_clear_incremental_state(tr_producer_port *port, uint32_t producer_id,
                                             const uint64_t *instance_ids, size_t num_ids) {
  pp_producer *p;
  int rc = commandable(port, producer_id, &p);
  if (rc < 0)
    return rc;
  Perfetto__Protos__GetAsyncCommandResponse__ClearIncrementalState clear =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CLEAR_INCREMENTAL_STATE__INIT;
  clear.n_data_source_ids = num_ids;
  clear.data_source_ids = (uint64_t *)instance_ids;
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_CLEAR_INCREMENTAL_STATE;
  cmd.clear_incremental_state = &clear;
  return send_command(p, &cmd, -1);
}

/* ---- stop timeouts ---------------------------------------------------------------------- */

/* The first instance whose stop deadline passed, or false. */
static bool find_expired(tr_producer_port *port, uint64_t now, pp_producer **pp, size_t *pi) {
  for (pp_producer *p = port->producers; p; p = p->next)
    for (size_t i = 0; i < p->num_instances; i++)
      if (p->instances[i].state == PP_STOPPING && p->instances[i].stop_deadline_ms <= now) {
        *pp = p;
        *pi = i;
        return true;
      }
  return false;
}

/* One instance per scan, because the callback may add or remove instances. */
static void on_stop_timer(uv_timer_t *timer) {
  tr_producer_port *port = timer->data;
  uint64_t now = uv_now(port->loop);
  pp_producer *p;
  size_t i;
  while (find_expired(port, now, &p, &i)) {
    uint32_t producer_id = p->shm.producer_id;
    uint64_t instance_id = p->instances[i].id;
    TR_WARN(LOG_COMP, "producer %u (%.64s): data source instance %llu did not confirm its stop "
            "in time; considered stopped", producer_id, p->name, (unsigned long long)instance_id);
    pp_remove_instance(p, i);
    if (port->cfg.cb.data_source_stopped)
      port->cfg.cb.data_source_stopped(port, producer_id, instance_id, true);
  }
  pp_arm_stop_timer(port);
}

void pp_arm_stop_timer(tr_producer_port *port) {
  uint64_t earliest = UINT64_MAX;
  for (pp_producer *p = port->producers; p; p = p->next)
    for (size_t i = 0; i < p->num_instances; i++)
      if (p->instances[i].state == PP_STOPPING && p->instances[i].stop_deadline_ms < earliest)
        earliest = p->instances[i].stop_deadline_ms;
  if (earliest == UINT64_MAX || uv_is_closing((uv_handle_t *)&port->stop_timer)) {
    uv_timer_stop(&port->stop_timer);
    return;
  }
  uint64_t now = uv_now(port->loop);
  uv_timer_start(&port->stop_timer, on_stop_timer, earliest > now ? earliest - now : 0, 0);
}
