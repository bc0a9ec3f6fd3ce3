/* test_consumer_replay.c: the service's consumer port answering the REAL perfetto CLI's and SDK
 * consumer's requests (tests/vectors/ipc/consumer-{cli,cli-relay,sdk}.to-service.bin), replayed
 * byte for byte over a real UNIX socket, with sessions fed by two in-process fake hosts.
 *
 * The fake hosts ("web-1", "web-2") each have one producer with a track_event data source;
 * the link's send_command (fake_link_commands) answers their commands from the loop
 * (setup/start/stop replies, flush acks) and, on start, commits chunks of small packets into
 * the session's buffer through tr_session_on_chunk, exactly as the link server would. Checked: BindServiceReply bytes equal
 * traced's; EnableTracing's reply is held until the session ends (duration_ms or
 * DisableTracing) and is {disabled: true}; ObserveEvents streams instance changes and
 * all_data_sources_started; ReadBuffers streams has_more replies of <= ~32 KiB of packet data
 * that reassemble into a trace protoc accepts, holding every fake packet with its host's
 * machine_id and sequence ids unique across hosts. Also, with sessions driven directly: a
 * flush that a silent or disconnected host does not answer fails at its timeout and counts
 * that host only; a host that reconnects as the same agent keeps its instances, a restarted
 * agent is set up again; chunks for unknown buffers are counted; config errors are clear.
 * CloneSession: the CLI's `--clone-by-name live` (consumer-clone) of a session enabled with
 * the CLI's bytes (consumer-clone-source) gets traced's reply fields and a trace holding both
 * hosts' packets with traced's uuid rule and clone events, while the source goes on; a second
 * session of the same unique_session_name is refused in traced's words. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "perfetto/trace/trace.pb-c.h"
#include "relay/base/fnv1a.h"
#include "relay/producer/ipc_frame.h"
#include "relay/producer/unix_fds.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "service/consumer_port.h"

#define CHUNKS_PER_HOST 24
#define PACKETS_PER_CHUNK 100
#define MAX_FRAMES 64

typedef Perfetto__Protos__IPCFrame IPCFrame;

/* ---- fake hosts ---- */

static tr_service svc;
static tr_consumer_port port;
static tr_hosts *host_table; /* the service's, holding the two fake hosts */
static tr_host *hosts[2];
static Perfetto__Protos__DataSourceDescriptor desc = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
static Perfetto__Protos__DataSourceDescriptor *descs[1] = {&desc};
static int fake_link;
static uv_idle_t pump;
static uv_async_t done_async;
static char sock_path[108];

typedef struct pending_cmd {
  tr_host *host;
  Tracerelay__Command *cmd; /* a packed-and-unpacked copy */
} pending_cmd;
static pending_cmd queue[256];
static size_t queue_len;

static void on_pump(uv_idle_t *h);

static int send_command(tr_host *host, const Tracerelay__Command *cmd) {
  size_t n = tracerelay__command__get_packed_size(cmd);
  uint8_t *buf = malloc(n + 1);
  assert_non_null(buf);
  tracerelay__command__pack(cmd, buf);
  assert_true(queue_len < 256);
  queue[queue_len].host = host;
  queue[queue_len].cmd = tracerelay__command__unpack(NULL, n, buf);
  queue_len++;
  free(buf);
  uv_idle_start(&pump, on_pump);
  return 0;
}

static void probe_clock(tr_host *host) { (void)host; }

/* The link's down-calls (link_calls.h), answered here. */
static const struct tr_link_commands fake_link_commands = {.send_command = send_command,
                                                           .probe_clock = probe_clock};

/* Chunks of PACKETS_PER_CHUNK packets {8: timestamp, 900 (for_testing) is avoided: a plain
 * timestamp + timestamp_clock_id packet decodes with Perfetto's protos}. */
static void commit_chunks(tr_host *host, uint32_t target_buffer) {
  for (uint32_t c = 0; c < CHUNKS_PER_HOST; c++) {
    uint8_t payload[4096];
    size_t len = 0;
    for (uint32_t p = 0; p < PACKETS_PER_CHUNK; p++) {
      uint8_t pkt[32];
      size_t pl = 0;
      pkt[pl++] = 0x40; /* timestamp */
      pl += tr_varint_put(pkt + pl, 1000000ull * (c * PACKETS_PER_CHUNK + p + 1));
      pkt[pl++] = 0xd0; /* timestamp_clock_id (58) = BOOTTIME */
      pkt[pl++] = 0x03;
      pkt[pl++] = 6;
      payload[len++] = (uint8_t)pl;
      memcpy(payload + len, pkt, pl);
      len += pl;
    }
    Tracerelay__Chunk ch = TRACERELAY__CHUNK__INIT;
    ch.producer_id = 1;
    ch.writer_id = 1;
    ch.chunk_id = c;
    ch.packet_count = PACKETS_PER_CHUNK;
    ch.target_buffer = target_buffer;
    ch.trusted_uid = 1000;
    ch.trusted_pid = 42;
    ch.payload.data = payload;
    ch.payload.len = len;
    tr_session_on_chunk(&svc, host, &ch);
  }
}

static uint32_t target_buffer_of[2];
static bool silent_host[2]; /* never acks flushes */
static size_t setups_seen;

static size_t host_index(const tr_host *host) { return host == hosts[0] ? 0 : 1; }

static void answer(tr_host *host, const Tracerelay__Command *cmd) {
  Tracerelay__CommandReply reply = TRACERELAY__COMMAND_REPLY__INIT;
  reply.request_id = cmd->request_id;
  switch (cmd->cmd_case) {
  case TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE:
    assert_string_equal(cmd->setup_data_source->config->name, "track_event");
    target_buffer_of[host_index(host)] = cmd->setup_data_source->config->target_buffer;
    setups_seen++;
    break;
  case TRACERELAY__COMMAND__CMD_START_DATA_SOURCE:
    commit_chunks(host, target_buffer_of[host_index(host)]);
    break;
  case TRACERELAY__COMMAND__CMD_FLUSH: {
    if (silent_host[host_index(host)])
      return;
    Tracerelay__FlushAck ack = TRACERELAY__FLUSH_ACK__INIT;
    ack.flush_request_id = cmd->flush->flush_request_id;
    ack.producer_id = cmd->producer_id;
    tr_session_on_flush_ack(&svc, host, &ack, 0);
    return;
  }
  default:
    break;
  }
  tr_session_on_command_reply(&svc, host, &reply);
}

static void on_pump(uv_idle_t *h) {
  size_t n = queue_len;
  pending_cmd batch[256];
  memcpy(batch, queue, n * sizeof *batch);
  queue_len = 0;
  uv_idle_stop(h);
  for (size_t i = 0; i < n; i++) {
    answer(batch[i].host, batch[i].cmd);
    tracerelay__command__free_unpacked(batch[i].cmd, NULL);
  }
}

/* The service state on loop, with its host table. */
static void service_init(uv_loop_t *loop) {
  assert_int_equal(tr_hosts_new(&svc, &tr_session_link_events, &host_table), 0);
  assert_int_equal(tr_session_service_init(&svc, loop, TR_TIMELINE_MACHINES, host_table,
                                           &fake_link_commands),
                   0);
}

/* Fake host i in the table: its agent announces one producer offering desc, and connects. */
static void make_host(size_t i, const char *name) {
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  tr_host *h;
  assert_int_equal(tr_hosts_get(host_table, name, &h), 0);
  hosts[i] = h;
  h->agent_instance_id = 100 + i;
  assert_int_equal(tr_trace_writer_local_system_info(name, &h->system_info), 0);
  u.has_producer_id = u.has_state = 1;
  u.producer_id = 1;
  u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
  u.name = "/opt/perfetto-demo/bin/producer01";
  u.n_data_sources = 1;
  u.data_sources = descs;
  assert_int_equal(tr_hosts_producer_update(host_table, h, &u), 0);
  tr_hosts_link_up(h, (tr_link_peer *)&fake_link, tr_clock_boottime_ns(), NULL);
  tr_session_on_host_connected(&svc, h);
}

/* ---- the replaying client (its own thread; blocking I/O) ---- */

typedef struct frames {
  uint8_t *raw[MAX_FRAMES]; /* header + payload */
  size_t len[MAX_FRAMES];
  IPCFrame *f[MAX_FRAMES];
  size_t n;
} frames;

static void load(const char *capture, const char *dir, frames *out) {
  char path[512];
  snprintf(path, sizeof path, "%s/ipc/%s.%s.bin", TR_VECTORS_DIR, capture, dir);
  FILE *fp = fopen(path, "rb");
  assert_non_null(fp);
  out->n = 0;
  for (;;) {
    uint8_t h[4];
    if (fread(h, 1, 4, fp) != 4)
      break;
    uint32_t n = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24;
    assert_true(out->n < MAX_FRAMES);
    out->raw[out->n] = malloc(n + 4);
    memcpy(out->raw[out->n], h, 4);
    assert_int_equal(fread(out->raw[out->n] + 4, 1, n, fp), n);
    out->len[out->n] = n + 4;
    out->f[out->n] = tr_ipc_frame_decode(out->raw[out->n] + 4, n);
    assert_non_null(out->f[out->n]);
    out->n++;
  }
  fclose(fp);
}

static void free_frames(frames *fr) {
  for (size_t i = 0; i < fr->n; i++) {
    free(fr->raw[i]);
    tr_ipc_frame_free(fr->f[i]);
  }
}

static int read_full(int fd, void *buf, size_t len) {
  for (size_t done = 0; done < len;) {
    ssize_t n = read(fd, (uint8_t *)buf + done, len - done);
    if (n <= 0)
      return -1;
    done += (size_t)n;
  }
  return 0;
}

/* Reads one frame; its raw payload is kept in *raw (malloc'd) when raw is not NULL. */
static IPCFrame *read_frame(int fd, uint8_t **raw, size_t *raw_len) {
  uint8_t h[4];
  if (read_full(fd, h, 4) != 0)
    return NULL;
  uint32_t n = h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24;
  assert_true(n <= TR_IPC_MAX_PAYLOAD);
  uint8_t *buf = malloc(n + 1);
  assert_int_equal(read_full(fd, buf, n), 0);
  IPCFrame *f = tr_ipc_frame_decode(buf, n);
  assert_non_null(f);
  if (raw) {
    *raw = buf;
    *raw_len = n;
  } else {
    free(buf);
  }
  return f;
}

typedef struct client_result {
  int observe_replies;
  bool saw_all_started;
  int read_replies;
  uint8_t *trace; /* reassembled records */
  size_t trace_len, trace_cap;
  size_t packets;
} client_result;

static void trace_append(client_result *r, const uint8_t *p, size_t n) {
  if (r->trace_len + n > r->trace_cap) {
    r->trace_cap = (r->trace_len + n) * 2;
    r->trace = realloc(r->trace, r->trace_cap);
  }
  memcpy(r->trace + r->trace_len, p, n);
  r->trace_len += n;
}

/* Takes one reply of the ObserveEvents or ReadBuffers stream. */
static void handle(client_result *r, IPCFrame *f, uint64_t observe_req, uint64_t read_req,
                   uint8_t **packet, size_t *packet_len) {
  assert_int_equal(f->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY);
  Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = f->msg_invoke_method_reply;
  if (f->request_id == observe_req) {
    assert_true(rep->success && rep->has_more);
    Perfetto__Protos__ObserveEventsResponse *o = perfetto__protos__observe_events_response__unpack(
        NULL, rep->reply_proto.len, rep->reply_proto.data);
    assert_non_null(o);
    r->observe_replies++;
    r->saw_all_started |= o->events->all_data_sources_started;
    perfetto__protos__observe_events_response__free_unpacked(o, NULL);
  } else if (f->request_id == read_req) {
    assert_true(rep->success);
    Perfetto__Protos__ReadBuffersResponse *rb = perfetto__protos__read_buffers_response__unpack(
        NULL, rep->reply_proto.len, rep->reply_proto.data);
    assert_non_null(rb);
    size_t data = 0;
    for (size_t i = 0; i < rb->n_slices; i++) {
      Perfetto__Protos__ReadBuffersResponse__Slice *s = rb->slices[i];
      *packet = realloc(*packet, *packet_len + s->data.len + 1);
      memcpy(*packet + *packet_len, s->data.data, s->data.len);
      *packet_len += s->data.len;
      data += s->data.len;
      if (s->last_slice_for_packet) {
        uint8_t head[11];
        head[0] = 0x0A;
        size_t hl = 1 + tr_varint_put(head + 1, *packet_len);
        trace_append(r, head, hl);
        trace_append(r, *packet, *packet_len);
        *packet_len = 0;
        r->packets++;
      }
    }
    assert_true(data <= 33 * 1024);
    r->read_replies++;
    perfetto__protos__read_buffers_response__free_unpacked(rb, NULL);
  }
}

/* Reads frames until the reply closing `want` arrives; returns it (caller frees). */
static IPCFrame *wait_reply(int fd, client_result *r, uint64_t want, uint64_t observe_req,
                            uint64_t read_req, uint8_t **packet, size_t *packet_len) {
  for (;;) {
    IPCFrame *f = read_frame(fd, NULL, NULL);
    assert_non_null(f);
    if (f->request_id == want &&
        !(f->msg_invoke_method_reply && f->msg_invoke_method_reply->has_more))
      {
        if (want == read_req)
          handle(r, f, observe_req, read_req, packet, packet_len);
        return f;
      }
    handle(r, f, observe_req, read_req, packet, packet_len);
    tr_ipc_frame_free(f);
  }
}

static void expect_disabled(IPCFrame *f) {
  Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = f->msg_invoke_method_reply;
  assert_non_null(rep);
  assert_true(rep->success);
  Perfetto__Protos__EnableTracingResponse *e = perfetto__protos__enable_tracing_response__unpack(
      NULL, rep->reply_proto.len, rep->reply_proto.data);
  assert_non_null(e);
  assert_int_equal(e->state_case, PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__STATE_DISABLED);
  assert_true(e->disabled);
  assert_null(e->error);
  perfetto__protos__enable_tracing_response__free_unpacked(e, NULL);
}

static const char *capture_name;
static client_result result;

static void *client_main(void *arg) {
  frames req, rec;
  uint64_t observe_req = 0, read_req = 0, enable_req = 0;
  bool enable_waiting = false;
  uint8_t *packet = NULL;
  size_t packet_len = 0;
  (void)arg;

  load(capture_name, "to-service", &req);
  load(capture_name, "to-consumer", &rec);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);

  for (size_t i = 0; i < req.n; i++) {
    IPCFrame *f = req.f[i];
    /* The SDK's StartBlocking waits for all_data_sources_started before it goes on. */
    while (observe_req && enable_waiting && !result.saw_all_started) {
      IPCFrame *ev = read_frame(fd, NULL, NULL);
      assert_non_null(ev);
      handle(&result, ev, observe_req, read_req, &packet, &packet_len);
      tr_ipc_frame_free(ev);
    }
    assert_int_equal(write(fd, req.raw[i], req.len[i]), (ssize_t)req.len[i]);
    if (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE) {
      uint8_t *raw = NULL;
      size_t raw_len;
      IPCFrame *rep = read_frame(fd, &raw, &raw_len);
      assert_int_equal(raw_len + 4, rec.len[0]);
      assert_memory_equal(raw, rec.raw[0] + 4, raw_len); /* byte-identical to traced's */
      free(raw);
      tr_ipc_frame_free(rep);
      continue;
    }
    switch (f->msg_invoke_method->method_id) {
    case 1: { /* EnableTracing: held until the session ends */
      Perfetto__Protos__EnableTracingRequest *e = perfetto__protos__enable_tracing_request__unpack(
          NULL, f->msg_invoke_method->args_proto.len, f->msg_invoke_method->args_proto.data);
      bool by_duration = e->trace_config->duration_ms != 0;
      perfetto__protos__enable_tracing_request__free_unpacked(e, NULL);
      enable_req = f->request_id;
      enable_waiting = true;
      if (by_duration) {
        IPCFrame *rep = wait_reply(fd, &result, enable_req, observe_req, read_req, &packet,
                                   &packet_len);
        expect_disabled(rep);
        tr_ipc_frame_free(rep);
        enable_waiting = false;
      }
      break;
    }
    case 2: { /* DisableTracing: {} at once, then the held EnableTracing reply */
      IPCFrame *rep =
          wait_reply(fd, &result, f->request_id, observe_req, read_req, &packet, &packet_len);
      assert_true(rep->msg_invoke_method_reply->success);
      tr_ipc_frame_free(rep);
      assert_true(enable_waiting);
      rep = wait_reply(fd, &result, enable_req, observe_req, read_req, &packet, &packet_len);
      expect_disabled(rep);
      tr_ipc_frame_free(rep);
      enable_waiting = false;
      break;
    }
    case 3: { /* ReadBuffers: has_more stream */
      read_req = f->request_id;
      IPCFrame *rep = wait_reply(fd, &result, read_req, observe_req, read_req, &packet,
                                 &packet_len);
      tr_ipc_frame_free(rep);
      break;
    }
    case 11:
      observe_req = f->request_id;
      break;
    default:
      fail_msg("unexpected method %u in the capture", f->msg_invoke_method->method_id);
    }
  }
  assert_int_equal(packet_len, 0);
  free(packet);
  close(fd);
  free_frames(&req);
  free_frames(&rec);
  uv_async_send(&done_async);
  return NULL;
}

/* ---- checks on the reassembled trace ---- */

static void check_trace(const client_result *r) {
  Perfetto__Protos__Trace *t = perfetto__protos__trace__unpack(NULL, r->trace_len, r->trace);
  size_t per_host[2] = {0, 0}, anchors[2] = {0, 0}, sysinfo = 0, stats = 0;
  uint32_t seq_of[2] = {0, 0};
  assert_non_null(t);
  for (size_t i = 0; i < t->n_packet; i++) {
    Perfetto__Protos__TracePacket *p = t->packet[i];
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_SYSTEM_INFO)
      sysinfo++;
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_STATS)
      stats++;
    for (size_t h = 0; h < 2; h++) {
      if (!p->has_machine_id || p->machine_id != hosts[h]->machine_id || !p->has_timestamp)
        continue;
      if (p->trusted_packet_sequence_id == 1) { /* the service's: the host's clock anchor */
        assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA__NOT_SET);
        assert_int_equal(per_host[h], 0); /* before any data of the host */
        anchors[h]++;
        continue;
      }
      per_host[h]++;
      assert_int_equal(p->trusted_uid, 1000);
      assert_int_equal(p->trusted_pid, 42);
      if (!seq_of[h])
        seq_of[h] = p->trusted_packet_sequence_id;
      assert_int_equal(p->trusted_packet_sequence_id, seq_of[h]);
    }
  }
  assert_int_equal(per_host[0], CHUNKS_PER_HOST * PACKETS_PER_CHUNK);
  assert_int_equal(per_host[1], CHUNKS_PER_HOST * PACKETS_PER_CHUNK);
  assert_int_equal(anchors[0], 1);
  assert_int_equal(anchors[1], 1);
  assert_true(seq_of[0] >= 2 && seq_of[1] >= 2 && seq_of[0] != seq_of[1]);
  assert_int_equal(sysinfo, 3); /* service machine + two hosts */
  assert_int_equal(stats, 1);
  perfetto__protos__trace__free_unpacked(t, NULL);

  /* protoc with our Perfetto protos accepts it too. */
  char path[] = "/tmp/tr-consumer-replay-XXXXXX", cmd[1024];
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, r->trace, r->trace_len), (ssize_t)r->trace_len);
  close(fd);
  snprintf(cmd, sizeof cmd,
           "protoc --decode=perfetto.protos.Trace -I %s/protos perfetto/trace/trace.proto "
           "< %s > /dev/null",
           TR_SOURCE_DIR, path);
  assert_int_equal(system(cmd), 0);
  unlink(path);
}

/* ---- test driver ---- */

static void on_done(uv_async_t *a) {
  (void)a;
  uv_close((uv_handle_t *)&done_async, NULL);
  uv_close((uv_handle_t *)&pump, NULL);
  tr_consumer_port_close(&port, NULL);
}

/* The service with the two fake hosts (offering desc) on a loop of its own, client on its own
 * thread until it is done, then the service freed; the host table stays for the checks. */
static void run_client(void *(*client)(void *)) {
  uv_loop_t loop;
  pthread_t th;
  uv_loop_init(&loop);
  service_init(&loop);
  uv_idle_init(&loop, &pump);
  uv_async_init(&loop, &done_async, on_done);
  desc.name = "track_event";
  setups_seen = 0;
  make_host(0, "web-1");
  make_host(1, "web-2");
  snprintf(sock_path, sizeof sock_path, "/tmp/tr-consumer-%d.sock", (int)getpid());
  assert_int_equal(tr_consumer_port_start(&port, &svc, sock_path, 0600), 0);
  assert_int_equal(pthread_create(&th, NULL, client, NULL), 0);
  uv_run(&loop, UV_RUN_DEFAULT);
  pthread_join(th, NULL);
  tr_session_service_free(&svc);
  uv_run(&loop, UV_RUN_DEFAULT); /* session timers close */
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void replay(const char *capture) {
  desc.has_no_flush = 1;
  desc.no_flush = 0;
  memset(&result, 0, sizeof result);
  capture_name = capture;
  run_client(client_main);

  assert_true(result.read_replies >= 2); /* > 32 KiB of data: several has_more replies */
  check_trace(&result); /* reads the hosts' machine ids */
  free(result.trace);
  tr_hosts_free(host_table);
}

static void test_cli(void **state) {
  (void)state;
  replay("consumer-cli");
}

static void test_cli_relay(void **state) {
  (void)state;
  replay("consumer-cli-relay");
}

static void test_sdk(void **state) {
  (void)state;
  replay("consumer-sdk");
  /* STOPPED (setup) and STARTED per host, all_data_sources_started, STOPPED per host. */
  assert_true(result.observe_replies >= 5);
  assert_true(result.saw_all_started);
}

/* ---- other methods over the socket: QueryServiceState, QueryCapabilities, CloneSession ---- */

static void invoke(int fd, uint64_t req, uint32_t method, const ProtobufCMessage *args) {
  IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  Perfetto__Protos__IPCFrame__InvokeMethod inv = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  uint8_t argbuf[512], *out;
  size_t out_len;
  inv.has_service_id = 1;
  inv.service_id = 1;
  inv.has_method_id = 1;
  inv.method_id = method;
  inv.has_args_proto = 1;
  inv.args_proto.data = argbuf;
  inv.args_proto.len = args ? protobuf_c_message_pack(args, argbuf) : 0;
  f.has_request_id = 1;
  f.request_id = req;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  f.msg_invoke_method = &inv;
  assert_int_equal(tr_ipc_frame_encode(&f, &out, &out_len), 0);
  assert_int_equal(write(fd, out, out_len), (ssize_t)out_len);
  free(out);
}

/* ---- CloneSession: the CLI's `--clone-by-name live` (consumer-clone) of a live session
 * enabled with the CLI's own bytes (consumer-clone-source) ---- */

static int connect_port(void) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  return fd;
}

/* Sends frame i of fr, with an fd on the same sendmsg when fd >= 0 (as the CLI sends its -o
 * file with CloneSession). */
static void send_frame(int sock, const frames *fr, size_t i, int fd) {
  assert_int_equal(tr_unix_fds_send(sock, fr->raw[i], fr->len[i], fd, 0), (ssize_t)fr->len[i]);
}

static void bind_port(int sock, const frames *req, const frames *rec) {
  uint8_t *raw = NULL;
  size_t raw_len;
  send_frame(sock, req, 0, -1);
  tr_ipc_frame_free(read_frame(sock, &raw, &raw_len));
  assert_int_equal(raw_len + 4, rec->len[0]);
  assert_memory_equal(raw, rec->raw[0] + 4, raw_len); /* byte-identical to traced's */
  free(raw);
}

/* ReadBuffers on sock (request req) into r. */
static void read_all(int sock, uint64_t req, client_result *r) {
  uint8_t *packet = NULL;
  size_t packet_len = 0;
  invoke(sock, req, 3, NULL);
  tr_ipc_frame_free(wait_reply(sock, r, req, 0, req, &packet, &packet_len));
  assert_int_equal(packet_len, 0);
  free(packet);
}

/* The trace's uuid, and how many of each service event it has (by oneof case). */
static void trace_facts(const client_result *r, int64_t uuid[2], size_t events[16],
                        const char **unique_name) {
  static char name[64];
  Perfetto__Protos__Trace *t = perfetto__protos__trace__unpack(NULL, r->trace_len, r->trace);
  assert_non_null(t);
  memset(events, 0, 16 * sizeof *events);
  for (size_t i = 0; i < t->n_packet; i++) {
    Perfetto__Protos__TracePacket *p = t->packet[i];
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_UUID) {
      uuid[0] = p->trace_uuid->msb;
      uuid[1] = p->trace_uuid->lsb;
    }
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_SERVICE_EVENT) {
      assert_true(p->service_event->event_type_case < 16);
      events[p->service_event->event_type_case]++;
      if (p->service_event->event_type_case ==
          PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_BUFFER_CLONED)
        assert_int_equal(p->service_event->buffer_cloned, 0);
    }
    if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_CONFIG)
      snprintf(name, sizeof name, "%s",
               p->trace_config->unique_session_name ? p->trace_config->unique_session_name : "");
  }
  *unique_name = name;
  perfetto__protos__trace__free_unpacked(t, NULL);
}

static client_result clone_result, source_result;

static void *clone_client(void *arg) {
  frames src_req, src_rec, req, rec;
  (void)arg;
  load("consumer-clone-source", "to-service", &src_req);
  load("consumer-clone-source", "to-consumer", &src_rec);
  load("consumer-clone", "to-service", &req);
  load("consumer-clone", "to-consumer", &rec);

  /* The source: the CLI's EnableTracing of {duration_ms 8000, unique_session_name "live"}. */
  int src = connect_port();
  bind_port(src, &src_req, &src_rec);
  send_frame(src, &src_req, 1, -1);
  while (setups_seen < 2 || queue_len > 0) /* both hosts set up; their chunks committed */
    usleep(1000);

  /* A second session of that name: refused in traced's words. */
  int dup = connect_port();
  bind_port(dup, &src_req, &src_rec);
  send_frame(dup, &src_req, 1, -1);
  IPCFrame *f = read_frame(dup, NULL, NULL);
  Perfetto__Protos__EnableTracingResponse *e = perfetto__protos__enable_tracing_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len,
      f->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(e);
  assert_string_equal(e->error, "A trace with this unique session name (live) already exists");
  perfetto__protos__enable_tracing_response__free_unpacked(e, NULL);
  tr_ipc_frame_free(f);
  close(dup);

  /* The clone: the CLI's bytes, its -o file riding on CloneSession's sendmsg. */
  char path[] = "/tmp/tr-clone-out-XXXXXX";
  int out = mkstemp(path);
  assert_true(out >= 0);
  int sock = connect_port();
  bind_port(sock, &req, &rec);
  assert_int_equal(req.f[1]->msg_invoke_method->method_id, 15);
  send_frame(sock, &req, 1, out);
  f = read_frame(sock, NULL, NULL);
  assert_true(f->msg_invoke_method_reply->success);
  Perfetto__Protos__CloneSessionResponse *cl = perfetto__protos__clone_session_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len,
      f->msg_invoke_method_reply->reply_proto.data);
  Perfetto__Protos__CloneSessionResponse *want = perfetto__protos__clone_session_response__unpack(
      NULL, rec.f[1]->msg_invoke_method_reply->reply_proto.len,
      rec.f[1]->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(cl);
  assert_non_null(want);
  /* traced's fields, all of them: success, error "", uuid, was_write_into_file false */
  assert_true(cl->has_success && cl->success);
  assert_string_equal(cl->error, want->error);
  assert_true(cl->has_uuid_msb && cl->has_uuid_lsb);
  assert_int_equal(cl->has_was_write_into_file, want->has_was_write_into_file);
  assert_int_equal(cl->was_write_into_file, want->was_write_into_file);
  int64_t reply_uuid[2] = {cl->uuid_msb, cl->uuid_lsb};
  perfetto__protos__clone_session_response__free_unpacked(cl, NULL);
  perfetto__protos__clone_session_response__free_unpacked(want, NULL);
  tr_ipc_frame_free(f);
  read_all(sock, req.f[2]->request_id, &clone_result); /* the CLI's ReadBuffers */
  close(sock);
  struct stat st;
  assert_int_equal(fstat(out, &st), 0);
  assert_int_equal(st.st_size, 0); /* read over the socket, never into the file */
  close(out);
  unlink(path);

  /* The source went on: stopped now, it reads whole. */
  invoke(src, 40, 2, NULL); /* DisableTracing */
  uint8_t *packet = NULL;
  size_t packet_len = 0;
  tr_ipc_frame_free(wait_reply(src, &source_result, 40, 0, 0, &packet, &packet_len));
  f = wait_reply(src, &source_result, src_req.f[1]->request_id, 0, 0, &packet, &packet_len);
  expect_disabled(f);
  tr_ipc_frame_free(f);
  free(packet);
  read_all(src, 41, &source_result);
  close(src);

  int64_t clone_uuid[2], source_uuid[2];
  size_t clone_ev[16], source_ev[16];
  const char *name;
  trace_facts(&clone_result, clone_uuid, clone_ev, &name);
  assert_string_equal(name, "live");
  assert_memory_equal(clone_uuid, reply_uuid, sizeof clone_uuid);
  trace_facts(&source_result, source_uuid, source_ev, &name);
  assert_int_equal(clone_uuid[1], source_uuid[1]); /* traced's rule: the source's lsb */
  assert_true(clone_uuid[0] != source_uuid[0]);    /* a new msb */
  enum { STARTED = 2, FLUSHED = 3, DISABLED = 5, FLUSH_STARTED = 9, CLONE = 10, BUF = 11 };
  assert_int_equal(clone_ev[STARTED], 1);
  assert_int_equal(clone_ev[FLUSH_STARTED], 1);
  assert_int_equal(clone_ev[FLUSHED], 1);
  assert_int_equal(clone_ev[CLONE], 1);
  assert_int_equal(clone_ev[BUF], 1);
  assert_int_equal(clone_ev[DISABLED], 1);
  assert_int_equal(source_ev[CLONE] + source_ev[BUF], 0);
  assert_int_equal(source_ev[FLUSH_STARTED], 1); /* the clone's flush is the source's too */
  assert_int_equal(source_ev[FLUSHED], 1);

  free_frames(&src_req);
  free_frames(&src_rec);
  free_frames(&req);
  free_frames(&rec);
  uv_async_send(&done_async);
  return NULL;
}

static void test_clone(void **state) {
  (void)state;
  desc.has_no_flush = 1;
  desc.no_flush = 0;
  memset(&clone_result, 0, sizeof clone_result);
  memset(&source_result, 0, sizeof source_result);
  run_client(clone_client);
  /* Both read as a stopped session does: every packet of both hosts, their anchors, system
   * infos and stats. */
  check_trace(&clone_result);
  check_trace(&source_result);
  free(clone_result.trace);
  free(source_result.trace);
  tr_hosts_free(host_table);
}

static void *query_client(void *arg) {
  frames req;
  static uint8_t state[4 * TR_IPC_MAX_FRAME];
  size_t state_len = 0, replies = 0;
  (void)arg;
  load("consumer-cli", "to-service", &req);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(write(fd, req.raw[0], req.len[0]), (ssize_t)req.len[0]); /* BindService */
  tr_ipc_frame_free(read_frame(fd, NULL, NULL));

  /* QueryServiceState: replies concatenate into one TracingServiceState. */
  invoke(fd, 2, 12, NULL);
  for (;;) {
    IPCFrame *f = read_frame(fd, NULL, NULL);
    Perfetto__Protos__IPCFrame__InvokeMethodReply *r = f->msg_invoke_method_reply;
    assert_true(r->success);
    replies++;
    assert_true(state_len + r->reply_proto.len <= sizeof state);
    memcpy(state + state_len, r->reply_proto.data, r->reply_proto.len);
    state_len += r->reply_proto.len;
    bool more = r->has_more;
    tr_ipc_frame_free(f);
    if (!more)
      break;
  }
  Perfetto__Protos__QueryServiceStateResponse *q =
      perfetto__protos__query_service_state_response__unpack(NULL, state_len, state);
  assert_non_null(q);
  assert_int_equal(q->service_state->n_producers, 2);
  assert_string_equal(q->service_state->producers[1]->machine_name, "web-2");
  assert_int_equal(q->service_state->producers[1]->machine_id, tr_machine_id("web-2"));
  assert_int_equal(q->service_state->n_data_sources, 2);
  assert_int_equal(q->service_state->data_sources[1]->producer_id, 2);
  perfetto__protos__query_service_state_response__free_unpacked(q, NULL);
  /* Over 64 KiB (two 40 KB descriptors), and yet one reply, as traced cuts its replies only
   * near the 128 KiB frame limit: the Perfetto UI decodes the concatenated replies with
   * protobufjs, for which the last service_state replaces the others. */
  assert_true(state_len > 65536);
  assert_int_equal(replies, 1);

  /* QueryCapabilities */
  invoke(fd, 3, 13, NULL);
  IPCFrame *f = read_frame(fd, NULL, NULL);
  Perfetto__Protos__QueryCapabilitiesResponse *c = perfetto__protos__query_capabilities_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len, f->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(c);
  assert_true(c->capabilities->has_query_capabilities);
  assert_int_equal(c->capabilities->n_observable_events, 3); /* CLONE_TRIGGER_HIT too */
  assert_true(c->capabilities->has_has_clone_session);
  assert_true(c->capabilities->has_clone_session);
  perfetto__protos__query_capabilities_response__free_unpacked(c, NULL);
  tr_ipc_frame_free(f);

  /* CloneSession of no session: a clean failure inside a successful reply, in traced's words. */
  invoke(fd, 4, 15, NULL);
  f = read_frame(fd, NULL, NULL);
  Perfetto__Protos__CloneSessionResponse *cl = perfetto__protos__clone_session_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len, f->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(cl);
  assert_false(cl->success);
  assert_string_equal(cl->error, "Tracing session not found");
  perfetto__protos__clone_session_response__free_unpacked(cl, NULL);
  tr_ipc_frame_free(f);

  /* Without a session, ReadBuffers and GetTraceStats fail. */
  invoke(fd, 5, 3, NULL);
  f = read_frame(fd, NULL, NULL);
  assert_false(f->msg_invoke_method_reply->success);
  tr_ipc_frame_free(f);
  invoke(fd, 6, 10, NULL);
  f = read_frame(fd, NULL, NULL);
  assert_false(f->msg_invoke_method_reply->success);
  tr_ipc_frame_free(f);

  close(fd);
  free_frames(&req);
  uv_async_send(&done_async);
  return NULL;
}

static void test_query_methods(void **state) {
  (void)state;
  static uint8_t big_descriptor[40000]; /* an SDK app's many categories */
  desc.has_track_event_descriptor_raw = 1;
  desc.track_event_descriptor_raw = (ProtobufCBinaryData){sizeof big_descriptor, big_descriptor};
  run_client(query_client);
  desc.has_track_event_descriptor_raw = 0;
  desc.track_event_descriptor_raw = (ProtobufCBinaryData){0, NULL};
  tr_hosts_free(host_table);
}

/* ---- sessions driven directly: flush timeout, host loss and return, unknown buffers ---- */

static int flush_result = -1;
static int ended;

static void on_flush(void *ud, bool ok) {
  (void)ud;
  flush_result = ok;
}

static void on_session_end(void *ud, const char *error) {
  (void)ud;
  assert_null(error);
  ended++;
}

/* The session's host entries (one per agent instance), as its TraceStats extension lists them;
 * free with tracerelay__trace_stats_extension__free_unpacked. */
static Tracerelay__TraceStatsExtension *host_entries(tr_session *s) {
  Perfetto__Protos__TraceStats *st = NULL;
  uint8_t *ext = NULL;
  size_t ext_len = 0;
  assert_int_equal(tr_session_stats(s, &st, &ext, &ext_len), 0);
  Tracerelay__TraceStatsExtension *x =
      tracerelay__trace_stats_extension__unpack(NULL, ext_len, ext);
  assert_non_null(x);
  tr_session_stats_free(st);
  free(ext);
  return x;
}

static void run_until(uv_loop_t *loop, const int *flag, int value) {
  for (int i = 0; i < 10000 && *flag != value; i++)
    uv_run(loop, UV_RUN_ONCE);
  assert_int_equal(*flag, value);
}

static void test_flush_timeout_and_host_loss(void **state) {
  uv_loop_t loop;
  tr_session *s;
  Tracerelay__TraceStatsExtension *x;
  char err[256] = "";
  (void)state;
  uv_loop_init(&loop);
  service_init(&loop);
  uv_idle_init(&loop, &pump);
  desc.name = "track_event";
  make_host(0, "web-1");
  make_host(1, "web-2");
  silent_host[1] = true;
  setups_seen = 0;

  Perfetto__Protos__TraceConfig cfg = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__BufferConfig buf = PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__BufferConfig *bufs[1] = {&buf};
  Perfetto__Protos__TraceConfig__DataSource ds = PERFETTO__PROTOS__TRACE_CONFIG__DATA_SOURCE__INIT;
  Perfetto__Protos__TraceConfig__DataSource *dss[1] = {&ds};
  Perfetto__Protos__DataSourceConfig dsc = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  buf.has_size_kb = 1;
  buf.size_kb = 1024;
  dsc.name = "track_event";
  ds.config = &dsc;
  cfg.n_buffers = 1;
  cfg.buffers = bufs;
  cfg.n_data_sources = 1;
  cfg.data_sources = dss;
  tr_session_observer obs = {NULL, NULL, on_session_end, NULL};
  assert_int_equal(tr_session_enable(&svc, 0, &cfg, -1, &obs, NULL, &s, err, sizeof err), 0);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(setups_seen, 2);

  /* web-2 never answers: the flush fails at its timeout and names (counts) web-2 only. */
  flush_result = -1;
  assert_int_equal(tr_session_flush(s, 50, 0, on_flush, NULL), 0);
  run_until(&loop, &flush_result, 0);
  assert_int_equal(hosts[1]->stats.flushes_missed, 1);
  assert_int_equal(hosts[0]->stats.flushes_missed, 0);
  struct tr_session_flush_counts flushes;
  tr_session_flush_counts(s, &flushes);
  assert_int_equal(flushes.failed, 1);

  /* A chunk for a buffer no session owns is counted and dropped. */
  Tracerelay__Chunk ch = TRACERELAY__CHUNK__INIT;
  ch.target_buffer = 999999;
  tr_session_on_chunk(&svc, hosts[0], &ch);
  assert_int_equal(svc.chunks_unknown_buffer, 1);

  /* web-1 drops and comes back as the same agent: its instances are kept. */
  tr_hosts_link_down(hosts[0]);
  tr_session_on_host_disconnected(&svc, hosts[0], "test");
  x = host_entries(s);
  assert_false(x->tracerelay_hosts[0]->connected);
  assert_int_equal(x->tracerelay_hosts[0]->session_disconnects, 1);
  tracerelay__trace_stats_extension__free_unpacked(x, NULL);
  tr_hosts_link_up(hosts[0], (tr_link_peer *)&fake_link, tr_clock_boottime_ns(), NULL);
  tr_session_on_host_connected(&svc, hosts[0]);
  x = host_entries(s);
  assert_int_equal(x->n_tracerelay_hosts, 2);
  assert_true(x->tracerelay_hosts[0]->connected);
  tracerelay__trace_stats_extension__free_unpacked(x, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(setups_seen, 2);

  /* A restarted agent (new instance id) is set up again, on a fresh host entry. */
  hosts[0]->agent_instance_id = 999;
  tr_session_on_host_connected(&svc, hosts[0]);
  x = host_entries(s);
  assert_int_equal(x->n_tracerelay_hosts, 3);
  assert_false(x->tracerelay_hosts[0]->connected); /* retired: the new entry took over */
  assert_true(x->tracerelay_hosts[2]->connected);
  tracerelay__trace_stats_extension__free_unpacked(x, NULL);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(setups_seen, 3);

  /* A flush while web-2 is disconnected fails at once, naming it. */
  tr_hosts_link_down(hosts[1]);
  tr_session_on_host_disconnected(&svc, hosts[1], "test");
  flush_result = -1;
  assert_int_equal(tr_session_flush(s, 5000, 0, on_flush, NULL), 0);
  uv_run(&loop, UV_RUN_NOWAIT);
  run_until(&loop, &flush_result, 0);
  assert_int_equal(hosts[1]->stats.flushes_missed, 2);

  /* Disable: the stop replies end the session. */
  ended = 0;
  tr_session_disable(s);
  run_until(&loop, &ended, 1);
  assert_int_equal(tr_session_get_state(s), TR_SESSION_STOPPED);

  silent_host[1] = false;
  tr_session_service_free(&svc);
  uv_close((uv_handle_t *)&pump, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  tr_hosts_free(host_table);
}

static void test_config_errors(void **state) {
  Perfetto__Protos__TraceConfig cfg = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__BufferConfig buf = PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__INIT;
  Perfetto__Protos__TraceConfig__BufferConfig *bufs[1] = {&buf};
  Perfetto__Protos__TraceConfig__DataSource ds = PERFETTO__PROTOS__TRACE_CONFIG__DATA_SOURCE__INIT;
  Perfetto__Protos__TraceConfig__DataSource *dss[1] = {&ds};
  Perfetto__Protos__DataSourceConfig dsc = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  char *bad_regex[1] = {"("};
  char err[256];
  (void)state;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "buffers"));
  cfg.n_buffers = 1;
  cfg.buffers = bufs;
  buf.size_kb = 0;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "size_kb"));
  buf.size_kb = 1024;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "no data_sources"));
  cfg.n_data_sources = 1;
  cfg.data_sources = dss;
  ds.config = &dsc;
  dsc.name = "track_event";
  dsc.target_buffer = 1;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "targets buffer 1"));
  dsc.target_buffer = 0;
  ds.n_producer_name_regex_filter = 1;
  ds.producer_name_regex_filter = bad_regex;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "regex"));
  ds.n_producer_name_regex_filter = 0;
  assert_int_equal(tr_session_validate_config(&cfg, err, sizeof err), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cli),
      cmocka_unit_test(test_cli_relay),
      cmocka_unit_test(test_sdk),
      cmocka_unit_test(test_query_methods),
      cmocka_unit_test(test_clone),
      cmocka_unit_test(test_flush_timeout_and_host_loss),
      cmocka_unit_test(test_config_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
