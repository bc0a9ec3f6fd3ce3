/* session_fixture.c: see session_fixture.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "session_fixture.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/base/tr_error.h"

uv_loop_t fx_loop;
tr_service fx_svc;
tr_hosts *fx_host_table;
tr_host *fx_hosts[FX_MAX_HOSTS];
struct fx_sent fx_sent[FX_MAX_SENT];
size_t fx_num_sent;
size_t fx_probes;
int64_t fx_ack_arrived_ns;
struct fx_observed fx_observed;

static int fake_link; /* what a connected host's link points at: never dereferenced */

/* ---- the link's down-calls (link_calls.h) ---- */

static int send_command(tr_host *host, const Tracerelay__Command *cmd) {
  struct fx_sent *e;
  if (!host->link)
    return TR_ERR_CLOSED;
  assert_true(fx_num_sent < FX_MAX_SENT);
  e = &fx_sent[fx_num_sent++];
  memset(e, 0, sizeof *e);
  e->host = host;
  e->what = cmd->cmd_case;
  e->producer_id = cmd->producer_id;
  e->request_id = cmd->request_id;
  switch (cmd->cmd_case) {
  case TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE:
    e->instance_id = cmd->setup_data_source->instance_id;
    snprintf(e->ds_name, sizeof e->ds_name, "%s", cmd->setup_data_source->config->name);
    e->target_buffer = cmd->setup_data_source->config->target_buffer;
    break;
  case TRACERELAY__COMMAND__CMD_START_DATA_SOURCE:
    e->instance_id = cmd->start_data_source->instance_id;
    break;
  case TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE:
    e->instance_id = cmd->stop_data_source->instance_id;
    break;
  case TRACERELAY__COMMAND__CMD_FLUSH:
    e->flush_id = cmd->flush->flush_request_id;
    e->num_flushed = cmd->flush->n_instance_ids;
    break;
  default:
    break;
  }
  return 0;
}

static void probe_clock(tr_host *host) {
  (void)host;
  fx_probes++;
}

static const struct tr_link_commands fake_link_commands = {.send_command = send_command,
                                                           .probe_clock = probe_clock};

/* ---- the consumer ---- */

static void on_instance(void *ud, const char *producer, const char *data_source, bool started) {
  (void)ud;
  (void)producer;
  (void)data_source;
  if (started)
    fx_observed.instances_started++;
  else
    fx_observed.instances_set_up++;
}

static void on_all_started(void *ud) {
  (void)ud;
  fx_observed.all_started++;
}

static void on_end(void *ud, const char *error) {
  (void)ud;
  assert_null(error);
  fx_observed.ended++;
}

static void on_clone_trigger_hit(void *ud, const struct tr_session_clone_trigger *t) {
  (void)ud;
  fx_observed.clone_triggers++;
  fx_observed.clone_trigger_session = t->session_id;
}

const tr_session_observer fx_observer = {on_instance, on_all_started, on_end,
                                         on_clone_trigger_hit};

/* ---- service, hosts, config ---- */

void fx_setup(void) {
  memset(fx_hosts, 0, sizeof fx_hosts);
  memset(&fx_observed, 0, sizeof fx_observed);
  fx_num_sent = 0;
  fx_probes = 0;
  fx_ack_arrived_ns = 0;
  assert_int_equal(uv_loop_init(&fx_loop), 0);
  assert_int_equal(tr_hosts_new(&fx_svc, &tr_session_link_events, &fx_host_table), 0);
  assert_int_equal(tr_session_service_init(&fx_svc, &fx_loop, TR_TIMELINE_MACHINES,
                                           fx_host_table, &fake_link_commands), 0);
}

void fx_teardown(void) {
  tr_session_service_free(&fx_svc);
  assert_int_equal(uv_run(&fx_loop, UV_RUN_DEFAULT), 0); /* the sessions' timers close */
  assert_int_equal(uv_loop_close(&fx_loop), 0);
  tr_hosts_free(fx_host_table);
}

/* Producer id `id` of host h, offering the data sources named (up to 2, NULL-ended), as its
 * agent announces it (ProducerUpdate PRODUCER_CONNECTED): the table tells the sessions. */
static void announce_producer(tr_host *h, uint32_t id, const char *const data_sources[3]) {
  Perfetto__Protos__DataSourceDescriptor descs[2], *desc_ptrs[2];
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  size_t n = 0;
  for (; n < 2 && data_sources[n]; n++) {
    perfetto__protos__data_source_descriptor__init(&descs[n]);
    descs[n].name = (char *)data_sources[n];
    desc_ptrs[n] = &descs[n];
  }
  u.has_producer_id = u.has_state = 1;
  u.producer_id = id;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
  u.name = "producer";
  u.n_data_sources = n;
  u.data_sources = desc_ptrs;
  assert_int_equal(tr_hosts_producer_update(fx_host_table, h, &u), 0);
}

void fx_make_host(size_t i, const char *name, size_t num_producers,
                  const char *const data_sources[][3]) {
  assert_true(i < FX_MAX_HOSTS && num_producers <= FX_MAX_PRODUCERS);
  assert_int_equal(tr_hosts_get(fx_host_table, name, &fx_hosts[i]), 0);
  fx_hosts[i]->agent_instance_id = 1000 + i;
  for (size_t p = 0; p < num_producers; p++)
    announce_producer(fx_hosts[i], (uint32_t)p + 1, data_sources[p]);
}

void fx_link_up(size_t i) {
  tr_hosts_link_up(fx_hosts[i], (tr_link_peer *)&fake_link, tr_clock_boottime_ns(), NULL);
}

void fx_connect(size_t i) {
  fx_link_up(i);
  tr_session_link_events.host_connected(&fx_svc, fx_hosts[i]);
}

void fx_disconnect(size_t i) {
  tr_hosts_link_down(fx_hosts[i]);
  tr_session_link_events.host_disconnected(&fx_svc, fx_hosts[i], "test");
}

void fx_send_chunk(size_t i, uint32_t global_id) {
  uint8_t payload[] = {2, 0x40, 7}; /* one fragment: timestamp = 7 */
  Tracerelay__Chunk ch = TRACERELAY__CHUNK__INIT;
  ch.producer_id = 1;
  ch.writer_id = 1;
  ch.chunk_id = 1;
  ch.packet_count = 1;
  ch.target_buffer = global_id;
  ch.trusted_uid = 1000;
  ch.payload.data = payload;
  ch.payload.len = sizeof payload;
  tr_session_link_events.chunk(&fx_svc, fx_hosts[i], &ch);
}

void fx_add_producer(size_t i, const char *const data_sources[3]) {
  tr_host *h = fx_hosts[i];
  assert_true(h->num_producers < FX_MAX_PRODUCERS);
  announce_producer(h, (uint32_t)h->num_producers + 1, data_sources);
}

void fx_config(struct fx_config *c, const char *const names[]) {
  memset(c, 0, sizeof *c);
  perfetto__protos__trace_config__init(&c->cfg);
  perfetto__protos__trace_config__buffer_config__init(&c->buf);
  c->buf.has_size_kb = 1;
  c->buf.size_kb = 1024;
  c->bufs[0] = &c->buf;
  c->cfg.n_buffers = 1;
  c->cfg.buffers = c->bufs;
  for (size_t d = 0; d < 2 && names[d]; d++) {
    const char *at = strchr(names[d], '@');
    perfetto__protos__trace_config__data_source__init(&c->ds[d]);
    perfetto__protos__data_source_config__init(&c->dsc[d]);
    snprintf(c->names[d], sizeof c->names[d], "%.*s",
             (int)(at ? (size_t)(at - names[d]) : strlen(names[d])), names[d]);
    c->dsc[d].name = c->names[d];
    c->ds[d].config = &c->dsc[d];
    if (at) {
      snprintf(c->machines[d], sizeof c->machines[d], "%s", at + 1);
      c->machine_ptrs[d] = c->machines[d];
      c->ds[d].n_machine_name_filter = 1;
      c->ds[d].machine_name_filter = &c->machine_ptrs[d];
    }
    c->dss[d] = &c->ds[d];
    c->cfg.n_data_sources++;
  }
  c->cfg.data_sources = c->dss;
}

tr_session *fx_enable(struct fx_config *c) {
  tr_session *s = NULL;
  char err[256] = "";
  int rc = tr_session_enable(&fx_svc, 0, &c->cfg, -1, &fx_observer, NULL, &s, err, sizeof err);
  if (rc != 0)
    fail_msg("tr_session_enable: %d: %s", rc, err);
  assert_non_null(s);
  return s;
}

/* ---- commands and answers ---- */

size_t fx_count(size_t i, Tracerelay__Command__CmdCase what) {
  size_t n = 0;
  for (size_t k = 0; k < fx_num_sent; k++)
    n += fx_sent[k].what == what && (i == FX_MAX_HOSTS || fx_sent[k].host == fx_hosts[i]);
  return n;
}

void fx_answer(size_t i, Tracerelay__Command__CmdCase what) {
  /* Answers may make the sessions send more: only those sent before are answered. */
  size_t n = fx_num_sent;
  for (size_t k = 0; k < n; k++) {
    struct fx_sent *e = &fx_sent[k];
    if (e->answered || e->what != what || e->host != fx_hosts[i])
      continue;
    e->answered = true;
    if (what == TRACERELAY__COMMAND__CMD_FLUSH) {
      Tracerelay__FlushAck ack = TRACERELAY__FLUSH_ACK__INIT;
      ack.flush_request_id = e->flush_id;
      ack.producer_id = e->producer_id;
      tr_session_link_events.flush_ack(&fx_svc, fx_hosts[i], &ack, fx_ack_arrived_ns);
    } else {
      Tracerelay__CommandReply reply = TRACERELAY__COMMAND_REPLY__INIT;
      reply.request_id = e->request_id;
      tr_session_link_events.command_reply(&fx_svc, fx_hosts[i], &reply);
    }
  }
}

void fx_run_until_set(const int *flag) {
  for (int i = 0; i < 1000 && *flag == -1; i++)
    uv_run(&fx_loop, UV_RUN_ONCE);
  assert_int_not_equal(*flag, -1);
}

/* ---- what the session reports ---- */

void fx_stats(tr_session *s, struct fx_stats *out) {
  uint8_t *ext = NULL;
  size_t ext_len = 0;
  assert_int_equal(tr_session_stats(s, &out->stats, &ext, &ext_len), 0);
  out->ext = tracerelay__trace_stats_extension__unpack(NULL, ext_len, ext);
  assert_non_null(out->ext);
  free(ext);
}

void fx_stats_free(struct fx_stats *st) {
  tr_session_stats_free(st->stats);
  tracerelay__trace_stats_extension__free_unpacked(st->ext, NULL);
}

void fx_capture_log(void (*fn)(void *ud), void *ud, char *buf, size_t cap) {
  FILE *tmp = tmpfile();
  int saved = dup(STDERR_FILENO);
  size_t n;
  assert_non_null(tmp);
  assert_true(saved >= 0);
  assert_true(dup2(fileno(tmp), STDERR_FILENO) >= 0);
  fn(ud);
  assert_true(dup2(saved, STDERR_FILENO) >= 0);
  close(saved);
  rewind(tmp);
  n = fread(buf, 1, cap - 1, tmp);
  buf[n] = '\0';
  fclose(tmp);
}
