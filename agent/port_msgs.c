/* port_msgs.c: making and freeing the port thread's commands and events (see port_msgs.h). */
#include "agent/port_msgs.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/pb_valid.h"
#include "relay/base/tr_error.h"

int tr_port_msgs_from_relay(const Tracerelay__Command *cmd, struct tr_port_command *out) {
  struct tr_port_command c = {.producer_id = cmd->producer_id, .tag = cmd->request_id};
  switch (cmd->cmd_case) {
  case TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE:
    if (cmd->setup_data_source->config == NULL)
      return TR_ERR_INVAL;
    c.kind = TR_PORT_SETUP;
    c.instance_id = cmd->setup_data_source->instance_id;
    c.config = cmd->setup_data_source->config;
    break;
  case TRACERELAY__COMMAND__CMD_START_DATA_SOURCE:
    c.kind = TR_PORT_START;
    c.instance_id = cmd->start_data_source->instance_id;
    break;
  case TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE:
    c.kind = TR_PORT_STOP;
    c.instance_id = cmd->stop_data_source->instance_id;
    break;
  case TRACERELAY__COMMAND__CMD_FLUSH:
    c.kind = TR_PORT_FLUSH;
    c.flush_request_id = cmd->flush->flush_request_id;
    c.instance_ids = cmd->flush->instance_ids;
    c.num_instance_ids = cmd->flush->n_instance_ids;
    c.flags = cmd->flush->flags;
    break;
  case TRACERELAY__COMMAND__CMD_CLEAR_INCREMENTAL_STATE:
    c.kind = TR_PORT_CLEAR;
    c.instance_ids = cmd->clear_incremental_state->instance_ids;
    c.num_instance_ids = cmd->clear_incremental_state->n_instance_ids;
    break;
  default:
    return TR_ERR_UNSUPPORTED;
  }
  *out = c;
  return 0;
}

struct port_command *tr_port_msgs_command_new(const struct tr_port_command *c) {
  struct port_command *m = calloc(1, sizeof(*m));
  if (m == NULL)
    return NULL;
  m->c = *c;
  m->c.config = NULL;
  m->c.instance_ids = NULL;
  if (c->config != NULL &&
      (m->c.config = (void *)tr_pb_copy(&c->config->base)) == NULL)
    goto fail;
  if (c->num_instance_ids > 0) {
    uint64_t *ids = malloc(c->num_instance_ids * sizeof(*ids));
    if (ids == NULL)
      goto fail;
    memcpy(ids, c->instance_ids, c->num_instance_ids * sizeof(*ids));
    m->c.instance_ids = ids;
  }
  return m;
fail:
  tr_port_msgs_command_free(m);
  return NULL;
}

void tr_port_msgs_command_free(struct port_command *m) {
  if (m == NULL)
    return;
  if (m->c.config != NULL)
    protobuf_c_message_free_unpacked((ProtobufCMessage *)m->c.config, NULL);
  free((void *)m->c.instance_ids);
  free(m);
}

struct port_event *tr_port_msgs_event_new(enum port_event_kind kind, uint32_t producer_id) {
  struct port_event *e = calloc(1, sizeof(*e));
  if (e != NULL) {
    e->kind = kind;
    e->info.id = producer_id;
  }
  return e;
}

struct port_event *tr_port_msgs_event_with_info(enum port_event_kind kind,
                                                const tr_producer_info *info) {
  struct port_event *e = tr_port_msgs_event_new(kind, info->id);
  if (e == NULL)
    return NULL;
  e->info = *info;
  e->info.name = strdup(info->name);
  e->info.sdk_version = strdup(info->sdk_version);
  e->info.num_data_sources = 0;
  Perfetto__Protos__DataSourceDescriptor **ds =
      calloc(info->num_data_sources + 1, sizeof(*ds));
  e->info.data_sources = (const Perfetto__Protos__DataSourceDescriptor *const *)ds;
  if (e->info.name == NULL || e->info.sdk_version == NULL || ds == NULL)
    goto fail;
  for (size_t i = 0; i < info->num_data_sources; i++) {
    if ((ds[i] = (void *)tr_pb_copy(&info->data_sources[i]->base)) == NULL)
      goto fail;
    e->info.num_data_sources++;
  }
  return e;
fail:
  tr_port_msgs_event_free(e);
  return NULL;
}

struct port_event *tr_port_msgs_event_trigger(uint32_t producer_id, const char *name) {
  struct port_event *e = tr_port_msgs_event_new(PORT_EV_TRIGGER, producer_id);
  if (e != NULL && (e->trigger_name = strdup(name)) == NULL) {
    tr_port_msgs_event_free(e);
    return NULL;
  }
  return e;
}

struct port_event *tr_port_msgs_event_guest(const tr_guest *g, bool gone) {
  struct port_event *e = tr_port_msgs_event_new(PORT_EV_GUEST, 0);
  if (e == NULL)
    return NULL;
  e->guest = *g;
  e->guest_gone = gone;
  e->guest.system_info = NULL;
  if (g->system_info != NULL) {
    e->guest.system_info = malloc(g->system_info_len ? g->system_info_len : 1);
    if (e->guest.system_info == NULL) {
      tr_port_msgs_event_free(e);
      return NULL;
    }
    memcpy(e->guest.system_info, g->system_info, g->system_info_len);
  }
  return e;
}

void tr_port_msgs_event_free(struct port_event *e) {
  if (e == NULL)
    return;
  free(e->trigger_name);
  free(e->guest.system_info);
  free((void *)e->info.name);
  free((void *)e->info.sdk_version);
  for (size_t i = 0; i < e->info.num_data_sources; i++)
    perfetto__protos__data_source_descriptor__free_unpacked(
        (Perfetto__Protos__DataSourceDescriptor *)e->info.data_sources[i], NULL);
  free((void *)e->info.data_sources);
  tr_port_msgs_command_free(e->cmd);
  free(e);
}
