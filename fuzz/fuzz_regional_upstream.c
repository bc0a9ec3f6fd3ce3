/* fuzz_regional_upstream.c: what a regional does with its upstream's frames (service/regional.c
 * and service/upstream_carrier.c): the root's bytes on the carrier, frames for an agent's slot
 * (its Welcome, Commands, BatchAcks, Goodbyes with their reasons, whatever the root sends),
 * for the carrier itself and for slots never opened, passed on to the agent's link or refused.
 * The link code is the daemons' own (relay_link.c, relay_carrier.c) over the fake transport
 * (fake_tls_uv.h) in a real libuv loop; the harness plays both the agent and the root.
 *
 * Per input: the regional starts; one agent connects and says Hello (every feature); the
 * regional connects its carrier, the harness welcomes it (multiplexing) and the agent's slot
 * (slot 1, its Hello forwarded), then hands the carrier the input's frames one read each, the
 * loop turning between; then the regional stops. Checked beyond memory safety: it stops with
 * every handle closed and nothing leaked, whatever the root said.
 *
 * Input: [slot Welcome features: bit 0 ZSTD, 1 AGENT_STATS, 2 HOST_CLOCKS, 3 RELAYED_CLOCKS,
 * 4 TRIGGERS][frames: uint32 LE length + RelayFrame, with their slot, as the root sends]. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "fuzz/fake_tls_uv.h"
#include "fuzz/fuzz_frames.h"
#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_session.h"
#include "service/regional.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  tr_log_set_level(TR_LOG_ERROR + 1); /* protocol errors are expected by the million */
  return 0;
}

static void feed(tr_tls_uv_conn *conn, const Tracerelay__RelayFrame *f) {
  uint8_t *buf;
  size_t len;
  if (tr_relay_frame_encode(f, TR_RELAY_MAX_FRAME_DEFAULT, &buf, &len) == 0) {
    fake_tls_uv_read(conn, buf, len);
    free(buf);
  }
}

static void welcome(tr_tls_uv_conn *conn, uint64_t features, uint64_t slot) {
  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.has_features = w.has_max_frame_bytes = w.has_service_instance_id = 1;
  w.features = features;
  w.max_frame_bytes = TR_RELAY_MAX_FRAME_DEFAULT;
  w.service_instance_id = 7;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  f.has_slot = slot != 0;
  f.slot = slot;
  feed(conn, &f);
}

static void run(uv_loop_t *loop, int turns) {
  for (int i = 0; i < turns; i++)
    uv_run(loop, UV_RUN_NOWAIT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  static const uint64_t slot_features[] = {
      TR_RELAY_FEATURE_ZSTD, TR_RELAY_FEATURE_AGENT_STATS, TR_RELAY_FEATURE_HOST_CLOCKS,
      TR_RELAY_FEATURE_RELAYED_CLOCKS, TR_RELAY_FEATURE_TRIGGERS};
  uint64_t accepted = 0;
  for (size_t i = 0; i < sizeof slot_features / sizeof slot_features[0]; i++)
    if (data[0] & (1u << i))
      accepted |= slot_features[i];
  data++;
  size--;
  uv_loop_t loop;
  CHECK(uv_loop_init(&loop) == 0);
  struct tr_regional_opts opts = {.listen = "127.0.0.1:7393", .upstream = "127.0.0.1:7394",
                                  .upstream_name = "root"};
  tr_regional *r;
  CHECK(tr_regional_start(&loop, &opts, &r) == 0);

  /* The agent: connected, its Hello. */
  tr_tls_uv_conn *agent = fake_tls_uv_accept(fake_tls_uv_last_server());
  CHECK(agent != NULL);
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_features = h.has_max_frame_bytes = h.has_agent_instance_id = 1;
  h.features = TR_RELAY_FEATURES_ALL;
  h.max_frame_bytes = TR_RELAY_MAX_FRAME_DEFAULT;
  h.agent_instance_id = 42;
  Tracerelay__RelayFrame hf = TRACERELAY__RELAY_FRAME__INIT;
  hf.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  hf.hello = &h;
  feed(agent, &hf);

  /* The root: the carrier resolves its numeric address, connects; welcomed, then the slot. */
  tr_tls_uv_conn *root = NULL;
  for (int i = 0; i < 1000 && (root = fake_tls_uv_last_connected()) == NULL; i++)
    uv_run(&loop, UV_RUN_ONCE);
  CHECK(root != NULL);
  fake_tls_uv_open(root);
  welcome(root, TR_RELAY_FEATURE_MULTIPLEX, 0);
  run(&loop, 2); /* the agent's slot opens, its Hello goes */
  welcome(root, accepted, 1);
  run(&loop, 2);

  const uint8_t *frame = data, *payload;
  size_t len;
  while (!fake_tls_uv_closing(root) && fuzz_next_frame(&data, &size, &payload, &len)) {
    fake_tls_uv_read(root, frame, 4 + len); /* the bytes as they came, header and all */
    frame = data;
    run(&loop, 1);
  }
  tr_regional_stop(r);
  run(&loop, 2);
  fake_tls_uv_end_all(0, "closed");
  uv_run(&loop, UV_RUN_DEFAULT);
  CHECK(uv_loop_close(&loop) == 0);
  return 0;
}
