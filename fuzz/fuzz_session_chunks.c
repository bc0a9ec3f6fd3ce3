/* fuzz_session_chunks.c: an agent's chunks, patches and flush acks delivered into a running
 * session (service/session.c, its central buffers relay/trace/trace_buffer.c) and read out as
 * the consumer's ReadBuffers reads them (service/trace_output.c, also the `global-clocks`
 * rewrite), past the link: a ChunkBatch's items go to the sessions' up-calls as link_server.c's
 * on_batch sends them.
 *
 * The service state is made per input without a network or processes (the link's down-calls
 * are a table of this file's, as tests/unit/session_fixture.c's): two hosts, each with a
 * producer of "track_event"; a session of two buffers set up and started on both, its
 * commands answered. Then the input's frames, then a flush (answered), a stop and a last read.
 * Checked beyond memory safety: every read pass ends, each packet it yields is non-empty.
 *
 * Input: [config][frames: uint32 LE length + RelayFrame]. config: bit 0 the `global-clocks`
 * timeline (else `machines`), bit 1 buffers of 64 KiB (else 1 MiB: small ones wrap), bit 2
 * DISCARD (else RING_BUFFER). A ChunkBatch goes to host (seq & 1), its items in order; a
 * chunk's target_buffer below 8 is taken as the session's buffer target_buffer % 2 (the input
 * cannot know the global ids the session drew), others as they are (unknown buffers). A
 * Heartbeat frame is a read pass. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "fuzz/fuzz_frames.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "service/hosts.h"
#include "service/session.h"
#include "service/trace_output.h"

static tr_relay_codec codec;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (tr_relay_codec_init(&codec, 1, TR_RELAY_MIN_FRAME * 16) < 0)
    abort();
  tr_log_set_level(TR_LOG_ERROR);
  return 0;
}

/* ---- the link's down-calls: commands recorded, answered by answer_all ---- */

#define MAX_SENT 64
static struct sent {
  tr_host *host;
  Tracerelay__Command__CmdCase what;
  uint64_t request_id, flush_id;
  uint32_t producer_id, target_buffer;
  bool answered;
} sent[MAX_SENT];
static size_t num_sent;
static int fake_link; /* what a connected host's link points at: never dereferenced */

static int send_command(tr_host *host, const Tracerelay__Command *cmd) {
  if (!host->link || num_sent == MAX_SENT)
    return TR_ERR_CLOSED;
  struct sent *e = &sent[num_sent++];
  *e = (struct sent){.host = host, .what = cmd->cmd_case, .request_id = cmd->request_id,
                     .producer_id = cmd->producer_id};
  if (cmd->cmd_case == TRACERELAY__COMMAND__CMD_FLUSH)
    e->flush_id = cmd->flush->flush_request_id;
  if (cmd->cmd_case == TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE)
    e->target_buffer = cmd->setup_data_source->config->target_buffer;
  return 0;
}

static void probe_clock(tr_host *host) { (void)host; }

static const struct tr_link_commands commands = {.send_command = send_command,
                                                 .probe_clock = probe_clock};

static tr_service svc;

static void answer_all(void) {
  size_t n = num_sent; /* answers may send more: those wait for the next call */
  for (size_t k = 0; k < n; k++) {
    struct sent *e = &sent[k];
    if (e->answered)
      continue;
    e->answered = true;
    if (e->what == TRACERELAY__COMMAND__CMD_FLUSH) {
      Tracerelay__FlushAck ack = TRACERELAY__FLUSH_ACK__INIT;
      ack.flush_request_id = e->flush_id;
      ack.producer_id = e->producer_id;
      tr_session_link_events.flush_ack(&svc, e->host, &ack, 0);
    } else {
      Tracerelay__CommandReply reply = TRACERELAY__COMMAND_REPLY__INIT;
      reply.request_id = e->request_id;
      tr_session_link_events.command_reply(&svc, e->host, &reply);
    }
  }
}

/* ---- the consumer ---- */

static void on_instance(void *ud, const char *producer, const char *ds, bool started) {
  (void)ud, (void)producer, (void)ds, (void)started;
}
static void on_all_started(void *ud) { (void)ud; }
static void on_end(void *ud, const char *error) { (void)ud, (void)error; }
static const tr_session_observer observer = {.on_instance = on_instance,
                                             .on_all_started = on_all_started,
                                             .on_end = on_end};

static void read_pass(tr_session *s) {
  tr_trace_output *o = tr_session_output(s);
  if (tr_trace_output_begin(o) != 0)
    return;
  tr_output_packet p;
  int rc;
  while ((rc = tr_trace_output_next(o, &p)) == 1)
    CHECK(p.len > 0);
  tr_trace_output_reset(o);
}

/* ---- frames ---- */

static uint32_t base_buffer; /* the session's first buffer's global id */

static void on_batch(tr_host *const hosts[2], Tracerelay__ChunkBatch *b) {
  tr_host *host = hosts[b->seq & 1];
  Tracerelay__ChunkItems *owned = NULL;
  Tracerelay__ChunkItem **items = NULL;
  size_t n = 0;
  if (tr_relay_batch_items(&codec, b, &owned, &items, &n) < 0)
    return;
  for (size_t i = 0; i < n; i++) {
    Tracerelay__ChunkItem *it = items[i];
    switch (it->item_case) {
    case TRACERELAY__CHUNK_ITEM__ITEM_CHUNK:
      if (it->chunk->target_buffer < 8)
        it->chunk->target_buffer = base_buffer + it->chunk->target_buffer % 2;
      tr_hosts_chunk_received(host, it->chunk->payload.len);
      tr_session_link_events.chunk(&svc, host, it->chunk);
      break;
    case TRACERELAY__CHUNK_ITEM__ITEM_PATCH:
      if (it->patch->target_buffer < 8)
        it->patch->target_buffer = base_buffer + it->patch->target_buffer % 2;
      tr_session_link_events.patch(&svc, host, it->patch);
      break;
    case TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK:
      tr_session_link_events.flush_ack(&svc, host, it->flush_ack, 0);
      break;
    default:
      break;
    }
  }
  tr_relay_items_free(owned);
}

/* ---- one input ---- */

static void announce(tr_hosts *hs, tr_host *h) {
  Perfetto__Protos__DataSourceDescriptor desc = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  Perfetto__Protos__DataSourceDescriptor *descs[] = {&desc};
  desc.name = "track_event";
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = 1;
  u.producer_id = 1;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
  u.name = "app";
  u.n_data_sources = 1;
  u.data_sources = descs;
  CHECK(tr_hosts_producer_update(hs, h, &u) == 0);
  tr_hosts_link_up(h, (tr_link_peer *)&fake_link, 1, NULL);
  tr_session_link_events.host_connected(&svc, h);
}

static tr_session *enable(uint8_t config) {
  Perfetto__Protos__TraceConfig cfg = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__BufferConfig buf[2], *bufs[2];
  for (int i = 0; i < 2; i++) {
    perfetto__protos__trace_config__buffer_config__init(&buf[i]);
    buf[i].has_size_kb = 1;
    buf[i].size_kb = config & 2 ? 64 : 1024;
    buf[i].has_fill_policy = 1;
    buf[i].fill_policy = config & 4
                             ? PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__DISCARD
                             : PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__RING_BUFFER;
    bufs[i] = &buf[i];
  }
  Perfetto__Protos__TraceConfig__DataSource ds = PERFETTO__PROTOS__TRACE_CONFIG__DATA_SOURCE__INIT;
  Perfetto__Protos__TraceConfig__DataSource *dss[] = {&ds};
  Perfetto__Protos__DataSourceConfig dsc = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  dsc.name = "track_event";
  ds.config = &dsc;
  cfg.n_buffers = 2;
  cfg.buffers = bufs;
  cfg.n_data_sources = 1;
  cfg.data_sources = dss;
  tr_session *s = NULL;
  char err[256];
  CHECK(tr_session_enable(&svc, 0, &cfg, -1, &observer, NULL, &s, err, sizeof err) == 0);
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  uint8_t config = data[0];
  data++;
  size--;
  num_sent = 0;
  uv_loop_t loop;
  tr_hosts *hs;
  CHECK(uv_loop_init(&loop) == 0);
  CHECK(tr_hosts_new(&svc, &tr_session_link_events, &hs) == 0);
  CHECK(tr_session_service_init(&svc, &loop,
                                config & 1 ? TR_TIMELINE_GLOBAL_CLOCKS : TR_TIMELINE_MACHINES, hs,
                                &commands) == 0);
  tr_host *hosts[2];
  CHECK(tr_hosts_get(hs, "web-1", &hosts[0]) == 0 && tr_hosts_get(hs, "db-2", &hosts[1]) == 0);
  for (int i = 0; i < 2; i++) {
    hosts[i]->agent_instance_id = 100 + (uint64_t)i;
    announce(hs, hosts[i]);
  }
  tr_session *s = enable(config);
  base_buffer = UINT32_MAX;
  answer_all(); /* the setups: the start follows */
  for (size_t k = 0; k < num_sent; k++)
    if (sent[k].what == TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE &&
        sent[k].target_buffer < base_buffer)
      base_buffer = sent[k].target_buffer;
  CHECK(base_buffer != UINT32_MAX);
  answer_all();

  const uint8_t *payload;
  size_t len;
  while (fuzz_next_frame(&data, &size, &payload, &len)) {
    Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
    if (f == NULL)
      continue;
    if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH)
      on_batch(hosts, f->chunk_batch);
    else if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT)
      read_pass(s);
    tr_relay_frame_free(f);
  }
  tr_session_flush(s, 1000, 0, NULL, NULL);
  answer_all();
  read_pass(s);
  tr_session_disable(s);
  answer_all();
  read_pass(s);
  tr_session_service_free(&svc);
  uv_run(&loop, UV_RUN_DEFAULT); /* the sessions' timers close */
  CHECK(uv_loop_close(&loop) == 0);
  tr_hosts_free(hs);
  return 0;
}
