/* test_link.c: the relay link for real: the agent's link_client against the service's
 * link_server over mutually-authenticated TLS on 127.0.0.1 (port 0), in one libuv loop, with
 * certificates from certs/make-certs.sh. Sessions are replaced by link_stub.c, which records
 * every upward call in order.
 *
 * Covers: Hello/Welcome and the producer re-announcement; chunks, a patch and a flush ack
 * arriving once each and in order; a command reaching the agent and its reply arriving after
 * the data queued before it; clock probes feeding the host's estimator; a cut of the
 * server-side connection in mid-stream, then reconnect and resume with no chunk lost or
 * duplicated; an agent restart keeping its host entry; a second agent with an already connected name refused while the first keeps
 * working; an agent whose certificate comes from another CA refused; BatchAcks riding with the
 * next command, or going alone after the ack delay or a large burst; the walk over the peers
 * every 250 ms; a host relayed on a regional's carrier granted a feature whose frames the
 * regional must pass on (TR_RELAY_FEATURES_CARRIED) only if the carrier offered it. Every test
 * ends with
 * uv_loop_close() succeeding, so no handle outlives its owner. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/link_client.h"
#include "link_stub.h"
#include "relay/clock/clock.h"
#include "relay/clock/clock_probe.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_session.h"
#include "service/link_server.h"
#include "service/relay_allow.h"
#include "tests/unit/test_certs.h"

static char dir[256], other_dir[256];

static int make_certs(void **state) {
  (void)state;
  tr_log_set_level(TR_LOG_ERROR);
  if (test_certs_make(dir, sizeof dir, "test_link",
                      "--service-name relay.test --localhost --agent web-1 --agent web-2") < 0)
    return -1;
  return test_certs_make(other_dir, sizeof other_dir, "test_link_other",
                         "--ca-name 'other CA' --agent web-3");
}

static int remove_certs(void **state) {
  (void)state;
  int rc = test_certs_remove(dir);
  return test_certs_remove(other_dir) < 0 ? -1 : rc;
}

/* A config with the CA of the main directory and the certificate `name` of cert_dir. */
static tr_tls_config *config(enum tr_tls_role role, const char *cert_dir, const char *name) {
  return test_certs_config(dir, cert_dir, role, name);
}

/* ---- running the loop ---- */

static void on_tick(uv_timer_t *t) { (void)t; }

/* How long a wait for what a step checks may take before the test fails: far above what it
 * takes (milliseconds), for a machine busy with other tests. */
#define WAIT_MS 30000
#define RUN_UNTIL(loop, cond, ms)                                                                 \
  do {                                                                                            \
    uv_timer_t tick_;                                                                             \
    uv_timer_init((loop), &tick_);                                                                \
    uv_timer_start(&tick_, on_tick, 10, 10);                                                      \
    uv_update_time(loop);                                                                         \
    uint64_t deadline_ = uv_now(loop) + (ms);                                                     \
    while (!(cond) && uv_now(loop) < deadline_)                                                   \
      uv_run((loop), UV_RUN_ONCE);                                                                \
    uv_close((uv_handle_t *)&tick_, NULL);                                                        \
    uv_run((loop), UV_RUN_NOWAIT);                                                                \
    if (!(cond))                                                                                  \
      fail_msg("timed out after %d ms waiting for %s", (int)(ms), #cond);                         \
  } while (0)

static void run_for(uv_loop_t *loop, uint64_t ms) {
  uv_update_time(loop);
  uint64_t end = uv_now(loop) + ms;
  RUN_UNTIL(loop, uv_now(loop) >= end, ms + 1000);
}

/* ---- the agent side: a chunk queue and a link client ---- */

struct agent {
  tr_chunkq q;
  tr_link_client *lc;
  tr_tls_config *tls;
  uint32_t next_chunk_id;
  int welcomes;
  int commands;
  uint32_t chunks_per_command;
  uint64_t acked_at_command[8]; /* the spill queue's acked seq as command i arrived */
  bool done;
};

static uint8_t payload[200];

static void push_chunks(struct agent *a, uint32_t n) {
  for (uint32_t i = 0; i < n; i++) {
    tr_chunkq_chunk c = {.producer_id = 1, .target_buffer = 0, .trusted_uid = 1000,
                         .trusted_pid = 42};
    c.header = (tr_chunk_header){.chunk_id = a->next_chunk_id++, .writer_id = 1, .count = 1};
    assert_int_equal(tr_chunkq_push_chunk(&a->q, &c, payload, sizeof payload, sizeof payload), 0);
  }
  tr_link_client_kick(a->lc);
}

static void agent_on_welcome(tr_link_client *lc) {
  struct agent *a = tr_link_client_data(lc);
  a->welcomes++;
  Perfetto__Protos__DataSourceDescriptor ds = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  ds.name = "test.ds";
  Perfetto__Protos__DataSourceDescriptor *dss[] = {&ds};
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = u.has_uid = u.has_pid = 1;
  u.producer_id = 1;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
  u.name = "test.producer";
  u.uid = 1000;
  u.pid = 42;
  u.n_data_sources = 1;
  u.data_sources = dss;
  assert_int_equal(tr_link_client_send_producer_update(lc, &u), 0);
}

/* Each command first makes data, then replies: the reply must arrive after that data. */
static void agent_on_command(tr_link_client *lc, const Tracerelay__Command *cmd) {
  struct agent *a = tr_link_client_data(lc);
  if (a->commands < 8)
    a->acked_at_command[a->commands] = tr_link_client_spill(lc)->acked_seq;
  a->commands++;
  push_chunks(a, a->chunks_per_command);
  assert_int_equal(tr_link_client_reply(lc, cmd->request_id, NULL), 0);
}

static void agent_done(void *data) { ((struct agent *)data)->done = true; }

static void agent_start(uv_loop_t *loop, struct agent *a, int port, const char *cert_dir,
                        const char *name) {
  memset(a, 0, sizeof *a);
  tr_chunkq_init(&a->q, 64u << 20);
  a->tls = config(TR_TLS_CLIENT, cert_dir, name);
  char service[64];
  snprintf(service, sizeof service, "127.0.0.1:%d", port);
  struct tr_link_client_opts opts = {.service = service, .service_name = "relay.test",
                                     .tls = a->tls, .queue = &a->q, .compress = true,
                                     .backoff_min_ms = 50, .backoff_max_ms = 400};
  struct tr_link_client_callbacks cbs = {.data = a, .on_welcome = agent_on_welcome,
                                         .on_command = agent_on_command};
  assert_int_equal(tr_link_client_start(loop, &opts, &cbs, &a->lc), 0);
}

static void agent_stop(uv_loop_t *loop, struct agent *a, unsigned timeout_ms) {
  tr_link_client_shutdown(a->lc, timeout_ms, agent_done, a);
  RUN_UNTIL(loop, a->done, timeout_ms + 3000);
  tr_chunkq_free(&a->q);
  tr_tls_config_unref(a->tls);
}

/* ---- the service side ---- */

struct service {
  tr_hosts *hosts;
  tr_link_server *ls;
  tr_tls_config *tls;
  int port;
};

static void service_start_acking(uv_loop_t *loop, struct service *s, unsigned ack_delay_ms) {
  link_stub_reset();
  s->tls = config(TR_TLS_SERVER, dir, "service");
  struct tr_link_server_opts opts = {.listen = "127.0.0.1:0", .tls = s->tls,
                                     .ack_delay_ms = ack_delay_ms};
  assert_int_equal(tr_hosts_new(NULL, &link_stub_events, &s->hosts), 0);
  assert_int_equal(tr_link_server_start(loop, s->hosts, &opts, &s->ls), 0);
  s->port = tr_link_server_port(s->ls);
  assert_true(s->port > 0);
}

static void service_start(uv_loop_t *loop, struct service *s) {
  service_start_acking(loop, s, 0);
}

static tr_host *host_of(struct service *s, const char *name) {
  return tr_hosts_find(s->hosts, name);
}

static void service_stop(uv_loop_t *loop, struct service *s) {
  tr_link_server_stop(s->ls);
  tr_tls_config_unref(s->tls);
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(loop), 0);
  tr_hosts_free(s->hosts);
}

static size_t index_of(enum link_event_kind kind, uint64_t id) {
  for (size_t i = 0; i < link_n_events; i++)
    if (link_events[i].kind == kind && link_events[i].id == id)
      return i;
  fail_msg("no event %d with id %llu", (int)kind, (unsigned long long)id);
  return 0;
}

/* Every chunk id 0..n-1 arrived exactly once, in order. */
static void assert_chunks_once_in_order(const char *host, uint32_t n) {
  uint64_t expect = 0;
  for (size_t i = 0; i < link_n_events; i++) {
    const struct link_event *e = &link_events[i];
    if (e->kind != EV_CHUNK || strcmp(e->host, host) != 0)
      continue;
    if (e->id != expect)
      fail_msg("chunk %llu arrived where %llu was expected", (unsigned long long)e->id,
               (unsigned long long)expect);
    assert_int_equal(e->payload_len, sizeof payload);
    expect++;
  }
  assert_int_equal(expect, n);
}

/* ---- tests ---- */

static void test_handshake_data_commands_clock(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");

  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1 &&
                       host_of(&s, "web-1")->num_producers == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");
  assert_non_null(h->link);
  assert_string_equal(h->producers[0].name, "test.producer");
  assert_int_equal(h->producers[0].num_data_sources, 1);
  assert_string_equal(h->producers[0].data_sources[0]->name, "test.ds");
  assert_string_equal(h->system_info->machine_name, "web-1");
  assert_true(h->system_info->num_cpus > 0);
  assert_int_equal(a.welcomes, 1);

  /* Chunks, a patch between two of them, then a flush ack behind everything; the ack comes
   * with the time its bytes reached the service's socket (the service's part of a flush ends
   * there), after they were queued and before it was seen. */
  int64_t queued_ns = (int64_t)tr_clock_boottime_ns();
  push_chunks(&a, 1000);
  tr_chunkq_patch patch = {.producer_id = 1, .chunk_id = 999, .writer_id = 1, .offset = 4,
                           .data = {1, 2, 3, 4}};
  assert_int_equal(tr_chunkq_push_patch(&a.q, &patch), 0);
  push_chunks(&a, 1000);
  assert_int_equal(tr_chunkq_push_flush_ack(&a.q, 1, 99), 0);
  tr_link_client_kick(a.lc);
  RUN_UNTIL(&loop, link_stub_count(EV_FLUSH_ACK, "web-1") == 1, WAIT_MS);
  int64_t seen_ns = (int64_t)tr_clock_boottime_ns();
  int64_t arrived_ns = link_events[index_of(EV_FLUSH_ACK, 99)].arrived_ns;
  assert_true(queued_ns < arrived_ns && arrived_ns <= seen_ns);
  assert_chunks_once_in_order("web-1", 2000);
  size_t ipatch = index_of(EV_PATCH, 999);
  assert_true(index_of(EV_CHUNK, 999) < ipatch && ipatch < index_of(EV_CHUNK, 1000));
  assert_int_equal(link_events[ipatch].patch_offset, 4);
  assert_int_equal(link_events[ipatch].patch_data, 0x04030201u);
  assert_true(index_of(EV_FLUSH_ACK, 99) > index_of(EV_CHUNK, 1999));
  assert_int_equal(h->stats.chunks_received, 2000);
  assert_int_equal(h->stats.bytes_received, 2000 * sizeof payload);

  /* A command: the agent queues 500 chunks, then replies; the reply comes after them. */
  a.chunks_per_command = 500;
  Tracerelay__Command__SetupDataSource setup = TRACERELAY__COMMAND__SETUP_DATA_SOURCE__INIT;
  setup.has_instance_id = 1;
  setup.instance_id = 1;
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  cmd.has_request_id = cmd.has_producer_id = 1;
  cmd.request_id = 7;
  cmd.producer_id = 1;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE;
  cmd.setup_data_source = &setup;
  assert_int_equal(tr_link_server_commands.send_command(h, &cmd), 0);
  RUN_UNTIL(&loop, link_stub_count(EV_REPLY, "web-1") == 1, WAIT_MS);
  assert_int_equal(a.commands, 1);
  assert_chunks_once_in_order("web-1", 2500);
  assert_true(index_of(EV_REPLY, 7) > index_of(EV_CHUNK, 2499));

  /* Clock probes: ten fast ones after Welcome, on one machine, so the offset is ~0. */
  struct tr_clocksync_stats cs;
  RUN_UNTIL(&loop, (tr_clocksync_get_stats(h->clock, &cs), cs.probes >= 8), WAIT_MS);
  tr_link_server_commands.probe_clock(h);
  int64_t off = tr_clocksync_offset_ns(h->clock);
  assert_true(off > -2000000 && off < 2000000);
  assert_true(tr_clocksync_rtt_ns(h->clock) > 0);

  agent_stop(&loop, &a, 3000);
  RUN_UNTIL(&loop, link_stub_count(EV_DISCONNECTED, "web-1") == 1, WAIT_MS);
  assert_null(h->link);
  assert_int_equal(h->stats.disconnects, 1);
  assert_int_equal(tr_hosts_peer(h)->lost_batches, 0);
  service_stop(&loop, &s);
}

/* Pushes chunks on a timer while the test cuts the link. */
struct feeder {
  uv_timer_t timer;
  struct agent *a;
  uint32_t left;
};

static void on_feed(uv_timer_t *t) {
  struct feeder *f = t->data;
  uint32_t n = f->left < 20 ? f->left : 20;
  push_chunks(f->a, n);
  f->left -= n;
  if (f->left == 0)
    uv_timer_stop(t);
}

static void test_link_cut_resumes_without_loss(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");

  struct feeder f = {.a = &a, .left = 4000};
  uv_timer_init(&loop, &f.timer);
  f.timer.data = &f;
  uv_timer_start(&f.timer, on_feed, 2, 2);
  RUN_UNTIL(&loop, link_stub_count(EV_CHUNK, "web-1") >= 600, WAIT_MS);
  tr_link_server_disconnect(h, "test: cutting the link");
  RUN_UNTIL(&loop, link_stub_count(EV_DISCONNECTED, "web-1") == 1, WAIT_MS);
  /* The feeder keeps going while the link is down: those chunks wait in the spill queue. */
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 2, WAIT_MS);
  RUN_UNTIL(&loop, f.left == 0 && link_stub_count(EV_CHUNK, "web-1") >= 4000, WAIT_MS);
  run_for(&loop, 100); /* a duplicate would show up now */
  assert_chunks_once_in_order("web-1", 4000);
  assert_int_equal(a.welcomes, 2);
  assert_int_equal(h->stats.disconnects, 1);
  assert_int_equal(h->stats.link_lost_batches, 0);
  assert_int_equal(tr_link_client_spill(a.lc)->lost_batches, 0);
  assert_int_equal(h->num_producers, 1);

  uv_close((uv_handle_t *)&f.timer, NULL);
  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

/* A new agent instance on the same machine: the host entry and its counts carry on, the old
 * instance's producers are ended and the new one's announced, the sequence starts afresh. */
static void test_agent_restart_keeps_host(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");
  uint64_t first_instance = h->agent_instance_id;
  push_chunks(&a, 100);
  RUN_UNTIL(&loop, link_stub_count(EV_CHUNK, "web-1") == 100, WAIT_MS);
  agent_stop(&loop, &a, 3000);

  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 2 && h->num_producers == 1, WAIT_MS);
  assert_ptr_equal(host_of(&s, "web-1"), h);
  assert_int_not_equal(h->agent_instance_id, first_instance);
  assert_int_equal(tr_hosts_peer(h)->agent_restarts, 1);
  push_chunks(&a, 50);
  RUN_UNTIL(&loop, h->stats.chunks_received == 150, WAIT_MS);
  assert_int_equal(h->stats.disconnects, 1);
  assert_int_equal(h->stats.link_lost_batches, 0);
  assert_int_equal(h->stats.batches_duplicate, 0);

  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

static void test_duplicate_host_refused(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a, b;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");

  agent_start(&loop, &b, s.port, dir, "agent-web-1");
  run_for(&loop, 800); /* several attempts, each refused */
  assert_int_equal(b.welcomes, 0);
  assert_false(tr_link_client_connected(b.lc));
  assert_int_equal(link_stub_count(EV_CONNECTED, "web-1"), 1);
  assert_int_equal(link_stub_count(EV_DISCONNECTED, "web-1"), 0);
  assert_int_equal(h->stats.disconnects, 0);

  /* The first agent is unaffected. */
  push_chunks(&a, 300);
  RUN_UNTIL(&loop, link_stub_count(EV_CHUNK, "web-1") == 300, WAIT_MS);
  assert_chunks_once_in_order("web-1", 300);
  assert_true(tr_link_client_connected(a.lc));

  agent_stop(&loop, &b, 0);
  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

static void test_other_ca_refused(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent stranger, good;
  service_start(&loop, &s);
  agent_start(&loop, &stranger, s.port, other_dir, "agent-web-3");
  agent_start(&loop, &good, s.port, dir, "agent-web-2");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-2") == 1, WAIT_MS);
  run_for(&loop, 600);
  assert_null(host_of(&s, "web-3"));
  assert_int_equal(link_stub_count(EV_CONNECTED, "web-3"), 0);
  assert_int_equal(stranger.welcomes, 0);
  assert_false(tr_link_client_connected(stranger.lc));
  assert_true(tr_link_client_connected(good.lc));

  agent_stop(&loop, &stranger, 0);
  agent_stop(&loop, &good, 3000);
  service_stop(&loop, &s);
}

/* Issue 25 item 1: a BatchAck rides in the record of the next command to its agent (one TLS
 * record and one system call instead of two per host and flush), and goes alone only after the
 * ack delay or once a burst of chunks is too large to wait. */
static void send_setup(tr_host *h, uint64_t request_id) {
  Tracerelay__Command__SetupDataSource setup = TRACERELAY__COMMAND__SETUP_DATA_SOURCE__INIT;
  setup.has_instance_id = 1;
  setup.instance_id = request_id;
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  cmd.has_request_id = cmd.has_producer_id = 1;
  cmd.request_id = request_id;
  cmd.producer_id = 1;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE;
  cmd.setup_data_source = &setup;
  assert_int_equal(tr_link_server_commands.send_command(h, &cmd), 0);
}

static uint64_t acks(struct service *s, bool alone) {
  struct tr_link_server_counts c;
  tr_link_server_counts(s->ls, &c);
  return alone ? c.acks_alone : c.acks_sent;
}

static void test_acks_ride_with_commands(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start_acking(&loop, &s, 60000); /* longer than the test: no ack goes for its age */
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1 &&
                       host_of(&s, "web-1")->num_producers == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");
  const tr_relay_agent *spill = tr_link_client_spill(a.lc);

  /* Each command makes data and a reply behind it: when the reply is in, the data is stored. */
  a.chunks_per_command = 10;
  uint64_t stored[6] = {0};
  for (uint64_t k = 1; k <= 5; k++) {
    send_setup(h, k);
    RUN_UNTIL(&loop, link_stub_count(EV_REPLY, "web-1") == k, WAIT_MS);
    stored[k] = tr_hosts_peer(h)->stored_seq;
  }
  /* Every command after the first brought the ack of what the one before made... */
  for (int k = 1; k < 5; k++)
    assert_true(a.acked_at_command[k] >= stored[k]);
  assert_int_equal(acks(&s, false), 4);
  assert_int_equal(acks(&s, true), 0); /* ...and no ack went in a record of its own */
  run_for(&loop, 200);
  assert_int_equal(acks(&s, true), 0);
  assert_true(spill->acked_seq < stored[5]); /* the last one waits for a command */

  /* A burst beyond TR_LINK_ACK_AT_ONCE_BYTES is acked at once: 400 chunks of 200 bytes. */
  push_chunks(&a, 400);
  RUN_UNTIL(&loop, h->stats.chunks_received == 50 + 400 &&
                       spill->acked_seq == tr_hosts_peer(h)->stored_seq, WAIT_MS);
  assert_int_equal(acks(&s, true), 1);

  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

static void test_ack_goes_alone_after_its_delay(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start_acking(&loop, &s, 100);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");
  const tr_relay_agent *spill = tr_link_client_spill(a.lc);
  push_chunks(&a, 10);
  RUN_UNTIL(&loop, h->stats.chunks_received == 10, WAIT_MS);
  RUN_UNTIL(&loop, spill->acked_seq == tr_hosts_peer(h)->stored_seq, WAIT_MS);
  assert_int_equal(acks(&s, true), 1);
  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

/* Issue 25 item 1: the walk over every peer (heartbeats, deadlines, acks due) goes every 250 ms,
 * not at every 50 ms tick: at most one per 250 ms of loop time, however late the ticks come. */
static void test_peers_walked_every_250_ms(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  struct tr_link_server_counts c0, c1;
  tr_link_server_counts(s.ls, &c0);
  uv_update_time(&loop);
  uint64_t t0 = uv_now(&loop);
  RUN_UNTIL(&loop, uv_now(&loop) - t0 >= 1000, 3000);
  tr_link_server_counts(s.ls, &c1);
  uint64_t walks = c1.walks - c0.walks;
  assert_true(walks >= 1);
  assert_true(walks <= (uv_now(&loop) - t0) / 250 + 1);
  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

static uint32_t probes_of(tr_host *h) {
  struct tr_clocksync_stats cs;
  tr_clocksync_get_stats(h->clock, &cs);
  return cs.probes;
}

/* Issue 25 item 3: in a session the tick wakes when a probe is due or the walk is, not every 5
 * ms (200 times a second before, whatever was due): over two seconds of loop time, no more
 * ticks than walks and probes, and the agent is still probed. */
static void test_session_tick_wakes_when_due(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  struct service s;
  struct agent a;
  service_start(&loop, &s);
  agent_start(&loop, &a, s.port, dir, "agent-web-1");
  RUN_UNTIL(&loop, link_stub_count(EV_CONNECTED, "web-1") == 1, WAIT_MS);
  tr_host *h = host_of(&s, "web-1");
  RUN_UNTIL(&loop, probes_of(h) >= TR_CLOCK_PROBE_DENSE, 10000); /* past the dense ones */
  link_stub_session = true;
  struct tr_link_server_counts c0, c1;
  tr_link_server_counts(s.ls, &c0);
  uint32_t probes = probes_of(h);
  uv_update_time(&loop);
  uint64_t t0 = uv_now(&loop);
  RUN_UNTIL(&loop, uv_now(&loop) - t0 >= 2000 && probes_of(h) > probes, 10000);
  tr_link_server_counts(s.ls, &c1);
  link_stub_session = false;
  uint64_t elapsed = uv_now(&loop) - t0, ticks = c1.ticks - c0.ticks;
  /* Each tick walks or sends a probe due (one in flight at the end), but the one that saw the
   * session begin. */
  assert_true(ticks >= elapsed / 250);
  assert_true(ticks <= elapsed / 250 + 1 + (probes_of(h) - probes) + 1 + 1);
  agent_stop(&loop, &a, 3000);
  service_stop(&loop, &s);
}

/* ---- a regional's carrier, by hand (service/upstream_carrier.c is the real one) ---- */

struct regional {
  uint64_t offer; /* the carrier Hello's features */
  tr_relay_link *slot;
  uint64_t carrier_features, host_features; /* as the Welcomes accepted them */
  bool carrier_welcomed, host_welcomed, closed;
};

static void send_hello(tr_relay_link *l, uint64_t features, const char *relayed_host) {
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_features = h.has_agent_instance_id = 1;
  h.features = features;
  h.agent_instance_id = 0x1234;
  h.relayed_host = (char *)relayed_host;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  f.hello = &h;
  assert_int_equal(tr_relay_link_send(l, &f), 0);
}

/* The relayed host's Hello offers what a 0.3.0 agent behind a regional does. */
static void slot_open(tr_relay_link *l) {
  send_hello(l, TR_RELAY_FEATURES_ALL | TR_RELAY_FEATURE_RELAYED_CLOCKS, "web-2");
}

static void slot_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  struct regional *r = tr_relay_link_data(l);
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_WELCOME) {
    r->host_features = f->welcome->features;
    r->host_welcomed = true;
  }
  tr_relay_frame_free(f);
}

static void slot_closed(tr_relay_link *l, int reason, const char *why) {
  (void)l, (void)reason, (void)why;
}

static const struct tr_relay_link_events slot_events = {
    .on_open = slot_open, .on_frame = slot_frame, .on_closed = slot_closed};

static void carrier_open(tr_relay_link *l) {
  send_hello(l, ((struct regional *)tr_relay_link_data(l))->offer, NULL);
}

static void carrier_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  struct regional *r = tr_relay_link_data(l);
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_WELCOME) {
    r->carrier_features = f->welcome->features;
    r->carrier_welcomed = true;
    tr_relay_link_established(l, TR_RELAY_MAX_FRAME_DEFAULT);
    assert_int_equal(tr_relay_link_carry(l, NULL, NULL, 4), 0);
    assert_int_equal(tr_relay_link_open_slot(l, &slot_events, r, &r->slot), 0);
  }
  tr_relay_frame_free(f);
}

static void carrier_closed(tr_relay_link *l, int reason, const char *why) {
  (void)reason, (void)why;
  ((struct regional *)tr_relay_link_data(l))->closed = true;
}

static const struct tr_relay_link_events carrier_events = {
    .on_open = carrier_open, .on_frame = carrier_frame, .on_closed = carrier_closed};

/* A carrier offering `offer`; returns the features the host it relays was granted. */
static uint64_t relayed_host_features(uint64_t offer, uint64_t *carrier_features) {
  uv_loop_t loop;
  uv_loop_init(&loop);
  tr_relay_allow allow = {0};
  const char *why;
  assert_int_equal(tr_relay_allow_add(&allow, "web-1=web-2", &why), 0);
  struct service s;
  link_stub_reset();
  s.tls = config(TR_TLS_SERVER, dir, "service");
  struct tr_link_server_opts opts = {.listen = "127.0.0.1:0", .tls = s.tls,
                                     .relay_allow = &allow};
  assert_int_equal(tr_hosts_new(NULL, &link_stub_events, &s.hosts), 0);
  assert_int_equal(tr_link_server_start(&loop, s.hosts, &opts, &s.ls), 0);
  tr_tls_config *ctls = config(TR_TLS_CLIENT, dir, "agent-web-1");
  struct sockaddr_in addr;
  uv_ip4_addr("127.0.0.1", tr_link_server_port(s.ls), &addr);
  struct regional r = {.offer = offer};
  struct tr_relay_link_opts lopts = {0};
  tr_relay_link *carrier;
  assert_int_equal(tr_relay_link_connect(&loop, ctls, "relay.test", (struct sockaddr *)&addr,
                                         &lopts, &carrier_events, &r, &carrier), 0);
  RUN_UNTIL(&loop, r.host_welcomed || r.closed, WAIT_MS);
  assert_true(r.host_welcomed);
  tr_relay_link_close(carrier, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "done");
  RUN_UNTIL(&loop, r.closed, WAIT_MS);
  tr_tls_config_unref(ctls);
  service_stop(&loop, &s);
  *carrier_features = r.carrier_features;
  return r.host_features;
}

/* A 0.2.0 regional's carrier offers FEATURE_MULTIPLEX alone, yet passes its agents' feature
 * bits on: its hosts must not get triggers, whose frames it cannot pass on. */
static void test_carried_features_need_the_carrier(void **state) {
  (void)state;
  uint64_t carrier;
  uint64_t host = relayed_host_features(TR_RELAY_FEATURE_MULTIPLEX, &carrier);
  assert_int_equal(carrier, TR_RELAY_FEATURE_MULTIPLEX);
  assert_false(host & TR_RELAY_FEATURE_TRIGGERS);
  assert_true(host & TR_RELAY_FEATURE_AGENT_STATS); /* the rest as before */
  assert_true(host & TR_RELAY_FEATURE_RELAYED_CLOCKS);

  host = relayed_host_features(TR_RELAY_FEATURE_MULTIPLEX | TR_RELAY_FEATURES_CARRIED, &carrier);
  assert_int_equal(carrier, TR_RELAY_FEATURE_MULTIPLEX | TR_RELAY_FEATURES_CARRIED);
  assert_true(host & TR_RELAY_FEATURE_TRIGGERS);
  assert_true(host & TR_RELAY_FEATURE_AGENT_STATS);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN); /* as the daemons do: a peer gone mid-write is an error code */
  for (size_t i = 0; i < sizeof payload; i++)
    payload[i] = (uint8_t)(i % 7);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_handshake_data_commands_clock),
      cmocka_unit_test(test_link_cut_resumes_without_loss),
      cmocka_unit_test(test_agent_restart_keeps_host),
      cmocka_unit_test(test_duplicate_host_refused),
      cmocka_unit_test(test_other_ca_refused),
      cmocka_unit_test(test_acks_ride_with_commands),
      cmocka_unit_test(test_ack_goes_alone_after_its_delay),
      cmocka_unit_test(test_peers_walked_every_250_ms),
      cmocka_unit_test(test_session_tick_wakes_when_due),
      cmocka_unit_test(test_carried_features_need_the_carrier),
  };
  return cmocka_run_group_tests(tests, make_certs, remove_certs);
}
