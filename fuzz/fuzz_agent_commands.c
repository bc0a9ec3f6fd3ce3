/* fuzz_agent_commands.c: what the service (or a regional speaking for it) sends an agent, at
 * the agent's end of the link (agent/link_client.c and its parts: the instances it tracks from
 * Commands, BatchAcks against what it sent, ClockProbes it answers, UpstreamLost, Goodbye),
 * with the Commands then turned into the producer port's commands as agent.c's to_port turns
 * them (tr_port_msgs_from_relay, and the copy of their arguments for the port's thread). The
 * link code is the agent's own, compiled from source over the fake transport (fake_tls_uv.h)
 * in a real libuv loop: the harness plays the service, reading the agent's Hello and giving it
 * a Welcome.
 *
 * Checked beyond memory safety: the instances the agent remembers are at most
 * TR_LINK_INSTANCES_MAX; a command's copy for the port holds
 * what the command said (producer, instance, flush ids); the agent shuts down cleanly (every
 * handle closed, nothing leaked) after any input.
 *
 * Input: [Welcome features byte][frames: uint32 LE length + RelayFrame, as the service sends
 * them]. The Welcome accepts the agent's offer masked by the first byte's bits (ZSTD and the
 * rest as relay/link/relay_session.h numbers them). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "agent/link_client.h"
#include "agent/link_instances.h"
#include "agent/port_msgs.h"
#include "fuzz/fake_tls_uv.h"
#include "fuzz/fuzz_frames.h"
#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_session.h"
#include "relay/producer/chunk_queue.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  tr_log_set_level(TR_LOG_ERROR + 1); /* protocol errors are expected by the million */
  return 0;
}

/* The port's side of a command, as agent.c's to_port makes it: its copy made and dropped. */
static void to_port(const Tracerelay__Command *cmd) {
  struct tr_port_command c;
  if (tr_port_msgs_from_relay(cmd, &c) < 0)
    return;
  struct port_command *m = tr_port_msgs_command_new(&c);
  if (m == NULL)
    return;
  const struct tr_port_command *copy = &m->c;
  CHECK(copy->kind == c.kind && copy->producer_id == c.producer_id &&
        copy->instance_id == c.instance_id && copy->flush_request_id == c.flush_request_id &&
        copy->num_instance_ids == c.num_instance_ids);
  for (size_t i = 0; i < c.num_instance_ids; i++)
    CHECK(copy->instance_ids[i] == c.instance_ids[i]);
  tr_port_msgs_command_free(m);
}

static void on_command(tr_link_client *lc, const Tracerelay__Command *cmd) {
  to_port(cmd);
  if (cmd->cmd_case != TRACERELAY__COMMAND__CMD_FLUSH)
    tr_link_client_reply(lc, cmd->request_id, NULL);
}

static size_t stale_seen;
static void on_stale(tr_link_client *lc, uint32_t producer_id, uint64_t instance_id) {
  (void)lc, (void)producer_id, (void)instance_id;
  stale_seen++;
}

static const struct tr_link_client_callbacks cbs = {.on_command = on_command,
                                                    .on_stale_instance = on_stale};

/* ---- the service's side ---- */

static uint8_t out[1 << 16];
static size_t out_len;
static void on_write(void *arg, const void *data, size_t len) {
  (void)arg;
  if (len > sizeof out - out_len)
    len = sizeof out - out_len; /* what the agent says is not checked past its Hello */
  memcpy(out + out_len, data, len);
  out_len += len;
}

static size_t count_instance(const tr_link_client *lc) {
  return tr_link_client_instances(lc, NULL, NULL);
}

static bool done;
static void on_done(void *data) {
  (void)data;
  done = true;
}

static void feed(tr_tls_uv_conn *conn, const Tracerelay__RelayFrame *f) {
  uint8_t *buf;
  size_t len;
  if (tr_relay_frame_encode(f, TR_RELAY_MAX_FRAME_DEFAULT, &buf, &len) == 0) {
    fake_tls_uv_read(conn, buf, len);
    free(buf);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t accept = data[0];
  data++;
  size--;
  uv_loop_t loop;
  CHECK(uv_loop_init(&loop) == 0);
  tr_chunkq queue;
  tr_chunkq_init(&queue, 1 << 20);
  fake_tls_uv_set_write_hook(on_write, NULL);
  out_len = 0;
  done = false;
  stale_seen = 0;
  struct tr_link_client_opts opts = {.service = "127.0.0.1:7393", .service_name = "service",
                                     .queue = &queue, .compress = true};
  tr_link_client *lc;
  CHECK(tr_link_client_start(&loop, &opts, &cbs, &lc) == 0);
  /* Resolving the numeric address, then the connection: the handshake is ours to end. */
  tr_tls_uv_conn *conn = NULL;
  for (int i = 0; i < 1000 && (conn = fake_tls_uv_last_connected()) == NULL; i++)
    uv_run(&loop, UV_RUN_ONCE);
  CHECK(conn != NULL);
  fake_tls_uv_open(conn);
  CHECK(out_len > 0); /* its Hello */

  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.has_features = w.has_max_frame_bytes = w.has_service_instance_id = 1;
  w.features = TR_RELAY_FEATURES_ALL & ((uint64_t)accept | ~(uint64_t)0xff);
  w.max_frame_bytes = TR_RELAY_MAX_FRAME_DEFAULT;
  w.service_instance_id = 7;
  w.machine_name = "web-1";
  Tracerelay__RelayFrame wf = TRACERELAY__RELAY_FRAME__INIT;
  wf.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  wf.welcome = &w;
  feed(conn, &wf);

  /* The input as the service's bytes, whole frames at a time, the loop turning between. */
  const uint8_t *frame = data, *payload;
  size_t len;
  while (!fake_tls_uv_closing(conn) && fuzz_next_frame(&data, &size, &payload, &len)) {
    fake_tls_uv_read(conn, frame, 4 + len); /* the bytes as they came, header and all */
    frame = data;
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(count_instance(lc) <= TR_LINK_INSTANCES_MAX);
  }
  tr_link_client_shutdown(lc, 0, on_done, NULL);
  if (fake_tls_uv_last_connected() == conn)
    fake_tls_uv_end(conn, 0, "closed");
  for (int i = 0; i < 1000 && !done; i++)
    uv_run(&loop, UV_RUN_ONCE);
  CHECK(done);
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
  tr_chunkq_free(&queue);
  return 0;
}
