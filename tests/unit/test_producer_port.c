/* test_producer_port.c: the producer port (relay/producer/producer_port.h) over a real socket, in a
 * libuv loop this test drives.
 *
 * 1. Replay: the real SDK producer's frames (tests/vectors/ipc/producer-unix.to-service.bin)
 *    are sent as recorded; our answers are compared with traced's (producer-unix.to-producer.bin):
 *    BindServiceReply, InitializeConnection and RegisterDataSource replies byte for byte,
 *    setup_tracing byte for byte plus an fd, setup/start/stop in the same order and shape.
 *    Before each recorded CommitData the test writes a chunk into the SMB at the page and index
 *    the SDK used, as the SDK would; every chunk must come out in the queue.
 * 2. Every rejection path, each answered by an error reply and counted, while a second
 *    producer keeps working; a producer over the violation limit is disconnected alone.
 * 3. Emulated chunks, patches, flush acks after data, scraping, the stop timeout (the one a
 *    stop names, else the one its config gave at setup). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/log.h"
#include "relay/producer/ipc_host.h"
#include "relay/producer/producer_port.h"
#include "relay/base/tr_error.h"

#define MAX_EVENTS 64

/* ---- the port under test and what its callbacks saw ------------------------------------- */

typedef struct env {
  uv_loop_t loop;
  tr_chunkq queue;
  tr_producer_port *port;
  char dir[64];
  char path[128];
  uint32_t connected[MAX_EVENTS];
  size_t num_connected;
  uint32_t disconnected[MAX_EVENTS];
  size_t num_disconnected;
  size_t ds_changes;
  uint32_t last_ds_producer;
  size_t last_num_ds;
  size_t last_unknown_fields; /* of the first descriptor */
  uint64_t started[MAX_EVENTS];
  size_t num_started;
  uint64_t stopped[MAX_EVENTS];
  bool stopped_timed_out[MAX_EVENTS];
  size_t num_stopped;
  uint64_t flush_acks[MAX_EVENTS];
  size_t num_flush_acks;
  size_t triggers;
  size_t queue_wakeups;
  /* The replay answers a registration with setup + start of this config. */
  const Perfetto__Protos__DataSourceConfig *auto_setup;
  bool closed;
} env;

static void on_connected(tr_producer_port *port, const tr_producer_info *p) {
  env *e = tr_producer_port_data(port);
  e->connected[e->num_connected++] = p->id;
}

static void on_ds_changed(tr_producer_port *port, const tr_producer_info *p) {
  env *e = tr_producer_port_data(port);
  e->ds_changes++;
  e->last_ds_producer = p->id;
  e->last_num_ds = p->num_data_sources;
  e->last_unknown_fields = p->num_data_sources ? p->data_sources[0]->base.n_unknown_fields : 0;
  if (e->auto_setup && p->num_data_sources == 1) {
    assert_int_equal(tr_producer_port_setup_data_source(port, p->id, 1, e->auto_setup), 0);
    assert_int_equal(tr_producer_port_start_data_source(port, p->id, 1), 0);
  }
}

static void on_disconnected(tr_producer_port *port, const tr_producer_info *p) {
  env *e = tr_producer_port_data(port);
  e->disconnected[e->num_disconnected++] = p->id;
}

static void on_started(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id) {
  (void)producer_id;
  env *e = tr_producer_port_data(port);
  e->started[e->num_started++] = instance_id;
}

static void on_stopped(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id,
                       bool timed_out) {
  (void)producer_id;
  env *e = tr_producer_port_data(port);
  e->stopped_timed_out[e->num_stopped] = timed_out;
  e->stopped[e->num_stopped++] = instance_id;
}

static void on_flush_acked(tr_producer_port *port, uint32_t producer_id, uint64_t id) {
  (void)producer_id;
  env *e = tr_producer_port_data(port);
  e->flush_acks[e->num_flush_acks++] = id;
}

static void on_triggers(tr_producer_port *port, uint32_t producer_id, const char *const *names,
                        size_t n) {
  (void)producer_id;
  env *e = tr_producer_port_data(port);
  assert_int_equal(n, 2);
  assert_string_equal(names[0], "t1");
  e->triggers++;
}

static void on_queue(tr_producer_port *port) {
  env *e = tr_producer_port_data(port);
  e->queue_wakeups++;
}

static int setup_env(void **state) {
  env *e = calloc(1, sizeof(*e));
  assert_int_equal(uv_loop_init(&e->loop), 0);
  tr_chunkq_init(&e->queue, 8u << 20);
  strcpy(e->dir, "/tmp/tr-pp-XXXXXX");
  assert_non_null(mkdtemp(e->dir));
  snprintf(e->path, sizeof(e->path), "%s/producer.sock", e->dir);
  tr_producer_port_config cfg = {
      .queue = &e->queue,
      .cb = {.data = e,
             .producer_connected = on_connected,
             .data_sources_changed = on_ds_changed,
             .producer_disconnected = on_disconnected,
             .data_source_started = on_started,
             .data_source_stopped = on_stopped,
             .flush_acked = on_flush_acked,
             .triggers = on_triggers,
             .queue_has_data = on_queue}};
  assert_int_equal(tr_producer_port_new(&e->loop, &cfg, &e->port), 0);
  assert_int_equal(tr_producer_port_start(e->port, e->path, TR_PRODUCER_PORT_DEFAULT_MODE), 0);
  struct stat st;
  assert_int_equal(stat(e->path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0666);
  *state = e;
  return 0;
}

static void on_port_closed(void *data) { ((env *)data)->closed = true; }

static int teardown_env(void **state) {
  env *e = *state;
  tr_producer_port_close(e->port, on_port_closed, e);
  while (!e->closed)
    uv_run(&e->loop, UV_RUN_ONCE);
  assert_int_equal(uv_loop_close(&e->loop), 0);
  tr_chunkq_free(&e->queue);
  rmdir(e->dir);
  free(e);
  return 0;
}

static void pump(env *e, int ms) {
  for (int i = 0; i < ms; i++) {
    uv_run(&e->loop, UV_RUN_NOWAIT);
    usleep(1000);
  }
  uv_run(&e->loop, UV_RUN_NOWAIT);
}

/* ---- a producer client ------------------------------------------------------------------ */

typedef struct client {
  int fd;
  tr_ipc_reader reader;
  uint64_t next_request;
  int rx_fd;
  bool eof;
  uint32_t id; /* agent-local producer id, once connected */
  uint8_t *smb;
  size_t smb_size;
  tr_smb view;
} client;

static void client_connect(env *e, client *c) {
  memset(c, 0, sizeof(*c));
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, e->path);
  assert_int_equal(connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
  tr_ipc_reader_init(&c->reader);
  c->next_request = 1;
  c->rx_fd = -1;
  pump(e, 2);
}

static void client_close(client *c) {
  if (c->smb)
    munmap(c->smb, c->smb_size);
  if (c->rx_fd >= 0)
    close(c->rx_fd);
  close(c->fd);
  tr_frame_reader_free(&c->reader);
}

static void client_send_raw(client *c, const uint8_t *data, size_t len) {
  assert_int_equal(send(c->fd, data, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* Receives whatever is there; keeps the last fd. */
static void client_recv(client *c) {
  uint8_t *dst;
  size_t room;
  assert_int_equal(tr_frame_reader_space(&c->reader, &dst, &room), 0);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctrl;
  struct iovec iov = {.iov_base = dst, .iov_len = room};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
                       .msg_controllen = sizeof(ctrl.buf)};
  ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n == 0)
    c->eof = true;
  if (n <= 0)
    return;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      if (c->rx_fd >= 0)
        close(c->rx_fd);
      memcpy(&c->rx_fd, CMSG_DATA(cm), sizeof(int));
    }
  }
  tr_frame_reader_commit(&c->reader, (size_t)n);
}

/* The next frame from the port (its payload copied to *out), waiting up to 2 s. */
static bool client_next(env *e, client *c, uint8_t **out, size_t *out_len, int wait_ms) {
  for (int i = 0; i <= wait_ms; i++) {
    const uint8_t *payload;
    size_t len;
    if (tr_frame_reader_next(&c->reader, &payload, &len) == 1) {
      *out = malloc(len ? len : 1);
      memcpy(*out, payload, len);
      *out_len = len;
      return true;
    }
    uv_run(&e->loop, UV_RUN_NOWAIT);
    client_recv(c);
    if (c->eof)
      return false;
    if (i % 4 == 3)
      usleep(1000);
  }
  return false;
}

static Perfetto__Protos__IPCFrame *client_next_frame(env *e, client *c) {
  uint8_t *payload;
  size_t len;
  assert_true(client_next(e, c, &payload, &len, 2000));
  Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(payload, len);
  free(payload);
  assert_non_null(f);
  return f;
}

static void assert_no_frame(env *e, client *c) {
  uint8_t *payload;
  size_t len;
  if (client_next(e, c, &payload, &len, 50)) {
    free(payload);
    fail_msg("unexpected frame of %zu bytes", len);
  }
}

static void send_frame(client *c, Perfetto__Protos__IPCFrame *f) {
  uint8_t *buf;
  size_t len;
  assert_int_equal(tr_ipc_frame_encode(f, &buf, &len), 0);
  client_send_raw(c, buf, len);
  free(buf);
}

static uint64_t invoke_raw(client *c, uint32_t method, const uint8_t *args, size_t len,
                           bool drop_reply) {
  Perfetto__Protos__IPCFrame__InvokeMethod inv = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  inv.has_service_id = inv.has_method_id = inv.has_args_proto = true;
  inv.service_id = 1;
  inv.method_id = method;
  inv.args_proto = (ProtobufCBinaryData){len, (uint8_t *)args};
  inv.has_drop_reply = drop_reply;
  inv.drop_reply = drop_reply;
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = true;
  f.request_id = c->next_request++;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  f.msg_invoke_method = &inv;
  send_frame(c, &f);
  return f.request_id;
}

static uint64_t invoke(client *c, uint32_t method, const ProtobufCMessage *args, bool dr) {
  size_t len = protobuf_c_message_get_packed_size(args);
  uint8_t *buf = malloc(len + 1);
  protobuf_c_message_pack(args, buf);
  uint64_t id = invoke_raw(c, method, buf, len, dr);
  free(buf);
  return id;
}

/* Waits for the reply to request_id and checks its success. */
static void expect_reply(env *e, client *c, uint64_t request_id, bool success) {
  Perfetto__Protos__IPCFrame *f = client_next_frame(e, c);
  assert_int_equal(f->request_id, request_id);
  assert_int_equal(f->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY);
  assert_int_equal(f->msg_invoke_method_reply->success, success);
  assert_int_equal(f->msg_invoke_method_reply->has_reply_proto, success);
  tr_ipc_frame_free(f);
}

enum { M_INIT = 1, M_REGISTER_DS, M_UNREGISTER_DS, M_COMMIT, M_ASYNC, M_REGISTER_WRITER,
       M_UNREGISTER_WRITER, M_NOTIFY_STARTED, M_NOTIFY_STOPPED, M_TRIGGERS, M_SYNC, M_UPDATE_DS };

static void bind_service(env *e, client *c) {
  Perfetto__Protos__IPCFrame__BindService b = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  b.service_name = "ProducerPort";
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = true;
  f.request_id = c->next_request++;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  f.msg_bind_service = &b;
  send_frame(c, &f);
  Perfetto__Protos__IPCFrame *r = client_next_frame(e, c);
  assert_true(r->msg_bind_service_reply->success);
  assert_int_equal(r->msg_bind_service_reply->n_methods, 12);
  tr_ipc_frame_free(r);
}

static void sync_ok(env *e, client *c) {
  Perfetto__Protos__SyncRequest s = PERFETTO__PROTOS__SYNC_REQUEST__INIT;
  expect_reply(e, c, invoke(c, M_SYNC, &s.base, false), true);
}

/* Bind, InitializeConnection (scraping on), GetAsyncCommand, one data source "ds". */
static void handshake(env *e, client *c, const char *name, bool will_notify_stop) {
  client_connect(e, c);
  bind_service(e, c);
  Perfetto__Protos__InitializeConnectionRequest init =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  init.producer_name = (char *)name;
  init.has_smb_scraping_mode = true;
  init.smb_scraping_mode =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__PRODUCER_SMBSCRAPING_MODE__SMB_SCRAPING_ENABLED;
  init.has_shared_memory_size_hint_bytes = true;
  init.shared_memory_size_hint_bytes = 64 * 1024;
  size_t before = e->num_connected;
  uint64_t id = invoke(c, M_INIT, &init.base, false);
  Perfetto__Protos__GetAsyncCommandRequest async = PERFETTO__PROTOS__GET_ASYNC_COMMAND_REQUEST__INIT;
  invoke(c, M_ASYNC, &async.base, false);
  expect_reply(e, c, id, true);
  assert_int_equal(e->num_connected, before + 1);
  c->id = e->connected[before];
  Perfetto__Protos__DataSourceDescriptor d = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  d.name = "ds";
  d.has_will_notify_on_stop = will_notify_stop;
  d.will_notify_on_stop = will_notify_stop;
  Perfetto__Protos__RegisterDataSourceRequest reg = PERFETTO__PROTOS__REGISTER_DATA_SOURCE_REQUEST__INIT;
  reg.data_source_descriptor = &d;
  expect_reply(e, c, invoke(c, M_REGISTER_DS, &reg.base, false), true);
}

/* Reads the next command on the GetAsyncCommand stream (request 3 after handshake). */
static Perfetto__Protos__GetAsyncCommandResponse *next_command(env *e, client *c) {
  Perfetto__Protos__IPCFrame *f = client_next_frame(e, c);
  assert_int_equal(f->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY);
  assert_true(f->msg_invoke_method_reply->has_more);
  Perfetto__Protos__GetAsyncCommandResponse *cmd = perfetto__protos__get_async_command_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len, f->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(cmd);
  tr_ipc_frame_free(f);
  return cmd;
}

static void map_smb(client *c) {
  assert_true(c->rx_fd >= 0);
  struct stat st;
  assert_int_equal(fstat(c->rx_fd, &st), 0);
  c->smb_size = (size_t)st.st_size;
  c->smb = mmap(NULL, c->smb_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->rx_fd, 0);
  assert_true(c->smb != MAP_FAILED);
  int seals = fcntl(c->rx_fd, F_GET_SEALS);
  assert_true((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
              (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  assert_int_equal(tr_smb_init_view(&c->view, c->smb, c->smb_size, 4096), 0);
}

/* The agent sets up and starts instance `instance` of "ds" into `buffer`; the client takes
 * the SMB from the first setup_tracing. */
/* Sets up and starts data source "ds" with stop_timeout_ms in its config (0: none given). */
static void start_ds_stop_timeout(env *e, client *c, uint64_t instance, uint32_t buffer,
                                  uint32_t stop_timeout_ms) {
  Perfetto__Protos__DataSourceConfig cfg = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  cfg.name = "ds";
  cfg.has_target_buffer = true;
  cfg.target_buffer = buffer;
  cfg.has_stop_timeout_ms = stop_timeout_ms != 0;
  cfg.stop_timeout_ms = stop_timeout_ms;
  bool first = c->smb == NULL;
  assert_int_equal(tr_producer_port_setup_data_source(e->port, c->id, instance, &cfg), 0);
  assert_int_equal(tr_producer_port_start_data_source(e->port, c->id, instance), 0);
  Perfetto__Protos__GetAsyncCommandResponse *cmd;
  if (first) {
    cmd = next_command(e, c);
    assert_int_equal(cmd->cmd_case, PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING);
    assert_int_equal(cmd->setup_tracing->shared_buffer_page_size_kb, 4);
    perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
    map_smb(c);
    assert_int_equal(c->smb_size, 64 * 1024);
  }
  cmd = next_command(e, c);
  assert_int_equal(cmd->cmd_case, PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_DATA_SOURCE);
  assert_int_equal(cmd->setup_data_source->config->target_buffer, buffer);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
  cmd = next_command(e, c);
  assert_int_equal(cmd->cmd_case, PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE);
  assert_int_equal(cmd->start_data_source->new_instance_id, instance);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
}

static void start_ds(env *e, client *c, uint64_t instance, uint32_t buffer) {
  start_ds_stop_timeout(e, c, instance, buffer, 0);
}

static void register_writer(env *e, client *c, uint32_t writer, uint32_t buffer) {
  Perfetto__Protos__RegisterTraceWriterRequest r = PERFETTO__PROTOS__REGISTER_TRACE_WRITER_REQUEST__INIT;
  r.has_trace_writer_id = r.has_target_buffer = true;
  r.trace_writer_id = writer;
  r.target_buffer = buffer;
  expect_reply(e, c, invoke(c, M_REGISTER_WRITER, &r.base, false), true);
}

/* Writes `packets` packets of `size` bytes into a chunk as a producer does; completes it
 * unless `complete` is false. Returns the used payload size. */
static size_t write_chunk(client *c, size_t page, size_t chunk, unsigned layout, uint16_t writer,
                          uint32_t chunk_id, unsigned packets, size_t size, bool complete) {
  tr_smb_partition_page(&c->view, page, layout); /* already partitioned is fine */
  tr_chunk_header h = {.chunk_id = chunk_id, .writer_id = writer, .count = (uint16_t)packets};
  uint8_t *p;
  size_t csize;
  assert_int_equal(tr_smb_begin_write(&c->view, page, chunk, &h, &p, &csize), 0);
  size_t off = TR_CHUNK_HEADER_SIZE;
  for (unsigned i = 0; i < packets; i++) {
    assert_true(size < 128 && off + 1 + size <= csize);
    p[off++] = (uint8_t)size;
    memset(p + off, (int)(0x40 + i), size);
    off += size;
  }
  memset(p + off, 0xEE, csize - off); /* a stale tail that must not travel */
  if (complete)
    assert_int_equal(tr_smb_complete_chunk(&c->view, page, chunk), 0);
  return off - TR_CHUNK_HEADER_SIZE;
}

static uint64_t commit(client *c, uint32_t page, uint32_t chunk, uint32_t buffer) {
  Perfetto__Protos__CommitDataRequest__ChunksToMove m =
      PERFETTO__PROTOS__COMMIT_DATA_REQUEST__CHUNKS_TO_MOVE__INIT;
  m.has_page = m.has_chunk = m.has_target_buffer = true;
  m.page = page;
  m.chunk = chunk;
  m.target_buffer = buffer;
  Perfetto__Protos__CommitDataRequest__ChunksToMove *mp = &m;
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  req.n_chunks_to_move = 1;
  req.chunks_to_move = &mp;
  return invoke(c, M_COMMIT, &req.base, false);
}

static tr_chunkq_entry *pop(env *e, tr_chunkq_kind kind) {
  tr_chunkq_entry *en = tr_chunkq_pop(&e->queue);
  assert_non_null(en);
  assert_int_equal(en->kind, kind);
  return en;
}

static uint64_t violations(env *e, client *c) {
  tr_producer_stats st;
  assert_int_equal(tr_producer_port_stats(e->port, c->id, &st), 0);
  return st.abi_violations;
}

/* ---- 1. replay of the real SDK producer ------------------------------------------------- */

typedef struct frames {
  uint8_t *data;
  size_t len;
  size_t off[64];
  size_t size[64]; /* header included */
  size_t n;
} frames;

static void load_frames(const char *name, frames *fr) {
  char path[512];
  snprintf(path, sizeof(path), "%s/ipc/%s", TR_VECTORS_DIR, name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fr->data = malloc(1 << 16);
  fr->len = fread(fr->data, 1, 1 << 16, f);
  fclose(f);
  fr->n = 0;
  for (size_t off = 0; off + 4 <= fr->len;) {
    uint32_t len;
    memcpy(&len, fr->data + off, 4);
    fr->off[fr->n] = off;
    fr->size[fr->n++] = 4 + len;
    off += 4 + len;
  }
}

static void send_recorded(client *c, const frames *fr, size_t i) {
  client_send_raw(c, fr->data + fr->off[i], fr->size[i]);
}

/* Our next frame must equal recorded frame i byte for byte. */
static void expect_recorded(env *e, client *c, const frames *fr, size_t i) {
  uint8_t *payload;
  size_t len;
  assert_true(client_next(e, c, &payload, &len, 2000));
  assert_int_equal(len + 4, fr->size[i]);
  assert_memory_equal(payload, fr->data + fr->off[i] + 4, len);
  free(payload);
}

static Perfetto__Protos__GetAsyncCommandResponse *recorded_command(const frames *fr, size_t i) {
  Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(fr->data + fr->off[i] + 4, fr->size[i] - 4);
  assert_non_null(f);
  Perfetto__Protos__GetAsyncCommandResponse *cmd = perfetto__protos__get_async_command_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len, f->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(cmd);
  tr_ipc_frame_free(f);
  return cmd;
}

/* Same request id, has_more and command as recorded frame i, compared as decoded messages
 * (protozero writes DataSourceConfig fields in another order than protobuf-c). */
static void expect_recorded_command(env *e, client *c, const frames *fr, size_t i) {
  Perfetto__Protos__IPCFrame *want = tr_ipc_frame_decode(fr->data + fr->off[i] + 4, fr->size[i] - 4);
  Perfetto__Protos__IPCFrame *got = client_next_frame(e, c);
  assert_int_equal(got->request_id, want->request_id);
  assert_int_equal(got->msg_invoke_method_reply->has_more, want->msg_invoke_method_reply->has_more);
  Perfetto__Protos__GetAsyncCommandResponse *a = recorded_command(fr, i);
  Perfetto__Protos__GetAsyncCommandResponse *b = perfetto__protos__get_async_command_response__unpack(
      NULL, got->msg_invoke_method_reply->reply_proto.len, got->msg_invoke_method_reply->reply_proto.data);
  assert_non_null(b);
  uint8_t pa[256], pb[256];
  size_t la = perfetto__protos__get_async_command_response__pack(a, pa);
  size_t lb = perfetto__protos__get_async_command_response__pack(b, pb);
  assert_int_equal(la, lb);
  assert_memory_equal(pa, pb, la);
  perfetto__protos__get_async_command_response__free_unpacked(a, NULL);
  perfetto__protos__get_async_command_response__free_unpacked(b, NULL);
  tr_ipc_frame_free(want);
  tr_ipc_frame_free(got);
}

static void test_replay_sdk_producer(void **state) {
  env *e = *state;
  frames in, out;
  load_frames("producer-unix.to-service.bin", &in);
  load_frames("producer-unix.to-producer.bin", &out);
  assert_int_equal(in.n, 17);
  assert_int_equal(out.n, 7);
  /* Answer the registration as traced did, with the config traced sent (instance 1). */
  Perfetto__Protos__GetAsyncCommandResponse *rec_setup = recorded_command(&out, 4);
  e->auto_setup = rec_setup->setup_data_source->config;

  client c;
  client_connect(e, &c);
  send_recorded(&c, &in, 0);
  expect_recorded(e, &c, &out, 0); /* BindServiceReply: 12 methods in .proto order */
  send_recorded(&c, &in, 1);       /* InitializeConnection */
  send_recorded(&c, &in, 2);       /* GetAsyncCommand, back to back */
  expect_recorded(e, &c, &out, 1); /* {false, true, false} */
  assert_int_equal(e->num_connected, 1);
  c.id = e->connected[0];
  assert_int_equal(c.id, 1);
  send_recorded(&c, &in, 3);       /* RegisterDataSource track_event */
  expect_recorded(e, &c, &out, 2); /* empty reply */
  assert_int_equal(e->last_num_ds, 1);
  expect_recorded(e, &c, &out, 3); /* setup_tracing {4}, same bytes */
  assert_true(c.rx_fd >= 0);       /* ... and the SMB fd on it */
  expect_recorded_command(e, &c, &out, 4); /* setup_data_source */
  expect_recorded_command(e, &c, &out, 5); /* start_data_source */
  map_smb(&c);
  assert_int_equal(c.smb_size, 256 * 1024); /* hints 0: traced's default */
  e->auto_setup = NULL;

  send_recorded(&c, &in, 4); /* NotifyDataSourceStarted {1}, drop_reply */
  send_recorded(&c, &in, 5); /* RegisterTraceWriter {1, 1}, drop_reply */
  pump(e, 5);
  assert_int_equal(e->num_started, 1);
  assert_int_equal(e->started[0], 1);
  /* The SDK committed page 0 chunk 0 ten times: write it there each time, as it did. */
  for (uint32_t k = 0; k < 10; k++) {
    size_t used = write_chunk(&c, 0, 0, TR_SMB_LAYOUT_DIV1, 1, k, 3 + k, 20, true);
    send_recorded(&c, &in, 6 + k);
    pump(e, 2);
    tr_chunkq_entry *en = pop(e, TR_CHUNKQ_CHUNK);
    assert_int_equal(en->u.chunk.producer_id, c.id);
    assert_int_equal(en->u.chunk.target_buffer, 1);
    assert_int_equal(en->u.chunk.header.chunk_id, k);
    assert_int_equal(en->u.chunk.header.writer_id, 1);
    assert_int_equal(en->u.chunk.header.count, 3 + k);
    assert_int_equal(en->u.chunk.trusted_uid, getuid());
    assert_int_equal(en->u.chunk.trusted_pid, getpid());
    assert_false(en->u.chunk.incomplete);
    assert_int_equal(en->len, used); /* trimmed: the stale tail stayed behind */
    tr_chunkq_entry_free(en);
    uint32_t word;
    assert_int_equal(tr_smb_page_word(&c.view, 0, &word), 0);
    assert_int_equal(word, 0); /* freed at once */
  }
  assert_null(tr_chunkq_peek(&e->queue));

  assert_int_equal(tr_producer_port_stop_data_source(e->port, c.id, 1, 1000), 0);
  expect_recorded(e, &c, &out, 6); /* stop_data_source {1}, same bytes */
  send_recorded(&c, &in, 16);      /* NotifyDataSourceStopped {1} */
  pump(e, 5);
  assert_int_equal(e->num_stopped, 1);
  assert_false(e->stopped_timed_out[0]);
  assert_no_frame(e, &c); /* drop_reply calls got no answer */

  tr_producer_stats st;
  assert_int_equal(tr_producer_port_stats(e->port, c.id, &st), 0);
  assert_int_equal(st.chunks_moved, 10);
  assert_int_equal(st.abi_violations, 0);
  client_close(&c);
  pump(e, 5);
  assert_int_equal(e->num_disconnected, 1);
  perfetto__protos__get_async_command_response__free_unpacked(rec_setup, NULL);
  free(in.data);
  free(out.data);
}

/* ---- 2. rejections ---------------------------------------------------------------------- */

/* Two producers: a (buffer 1, writer 1 -> 1) and b (buffer 2). */
static void two_producers(env *e, client *a, client *b) {
  handshake(e, a, "a", false);
  handshake(e, b, "b", false);
  start_ds(e, a, 10, 1);
  start_ds(e, b, 20, 2);
  register_writer(e, a, 1, 1);
  register_writer(e, b, 1, 2);
}

/* b still works: a chunk of b moves. */
static void b_still_works(env *e, client *b) {
  sync_ok(e, b);
  write_chunk(b, 3, 0, TR_SMB_LAYOUT_DIV1, 1, 77, 2, 10, true);
  expect_reply(e, b, commit(b, 3, 0, 2), true);
  tr_chunkq_entry *en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.producer_id, b->id);
  assert_int_equal(en->u.chunk.header.chunk_id, 77);
  tr_chunkq_entry_free(en);
  assert_null(tr_chunkq_peek(&e->queue));
  assert_int_equal(violations(e, b), 0);
}

static void test_call_before_initialize(void **state) {
  env *e = *state;
  client a, b;
  handshake(e, &b, "b", false);
  client_connect(e, &a);
  bind_service(e, &a);
  Perfetto__Protos__SyncRequest s = PERFETTO__PROTOS__SYNC_REQUEST__INIT;
  expect_reply(e, &a, invoke(&a, M_SYNC, &s.base, false), false);
  Perfetto__Protos__CommitDataRequest cd = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  expect_reply(e, &a, invoke(&a, M_COMMIT, &cd.base, true), false); /* even with drop_reply */
  sync_ok(e, &b);
  client_close(&a);
  client_close(&b);
}

static void test_second_initialize(void **state) {
  env *e = *state;
  client a, b;
  handshake(e, &a, "a", false);
  handshake(e, &b, "b", false);
  Perfetto__Protos__InitializeConnectionRequest init =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  expect_reply(e, &a, invoke(&a, M_INIT, &init.base, false), false);
  assert_int_equal(violations(e, &a), 1);
  Perfetto__Protos__GetAsyncCommandRequest async = PERFETTO__PROTOS__GET_ASYNC_COMMAND_REQUEST__INIT;
  expect_reply(e, &a, invoke(&a, M_ASYNC, &async.base, false), false);
  assert_int_equal(violations(e, &a), 2);
  sync_ok(e, &a); /* refused calls do not end the connection */
  sync_ok(e, &b);
  client_close(&a);
  client_close(&b);
}

static void test_commit_rejections(void **state) {
  env *e = *state;
  client a, b;
  two_producers(e, &a, &b);
  uint64_t v = 0;
  /* page out of range */
  expect_reply(e, &a, commit(&a, 9999, 0, 1), false);
  assert_int_equal(violations(e, &a), ++v);
  /* chunk index not in the page's layout */
  write_chunk(&a, 0, 0, TR_SMB_LAYOUT_DIV2, 1, 0, 1, 10, true);
  expect_reply(e, &a, commit(&a, 0, 2, 1), false);
  assert_int_equal(violations(e, &a), ++v);
  expect_reply(e, &a, commit(&a, 1, 0, 1), false); /* page 1 not partitioned: no chunks */
  assert_int_equal(violations(e, &a), ++v);
  /* chunk not Complete: left alone */
  write_chunk(&a, 0, 1, TR_SMB_LAYOUT_DIV2, 1, 1, 1, 10, false);
  expect_reply(e, &a, commit(&a, 0, 1, 1), false);
  assert_int_equal(violations(e, &a), ++v);
  uint32_t word;
  tr_smb_page_word(&a.view, 0, &word);
  assert_int_equal(tr_smb_word_state(word, 1), TR_SMB_CHUNK_BEING_WRITTEN);
  /* writer 0: taken and freed, but not queued */
  write_chunk(&a, 2, 0, TR_SMB_LAYOUT_DIV1, 0, 0, 1, 10, true);
  expect_reply(e, &a, commit(&a, 2, 0, 1), false);
  assert_int_equal(violations(e, &a), ++v);
  tr_smb_page_word(&a.view, 2, &word);
  assert_int_equal(word, 0);
  /* target buffer not given to this producer (b's buffer, and one nobody has) */
  write_chunk(&a, 2, 0, TR_SMB_LAYOUT_DIV1, 5, 0, 1, 10, true);
  expect_reply(e, &a, commit(&a, 2, 0, 2), false);
  assert_int_equal(violations(e, &a), ++v);
  write_chunk(&a, 2, 0, TR_SMB_LAYOUT_DIV1, 5, 0, 1, 10, true);
  expect_reply(e, &a, commit(&a, 2, 0, 7), false);
  assert_int_equal(violations(e, &a), ++v);
  /* a registered writer into another of the producer's buffers */
  start_ds(e, &a, 11, 3);
  write_chunk(&a, 2, 0, TR_SMB_LAYOUT_DIV1, 1, 0, 1, 10, true);
  expect_reply(e, &a, commit(&a, 2, 0, 3), false);
  assert_int_equal(violations(e, &a), ++v);
  assert_null(tr_chunkq_peek(&e->queue)); /* nothing refused was queued */
  b_still_works(e, &b);
  client_close(&a);
  client_close(&b);
}

static uint64_t send_patches(client *c, uint32_t buffer, size_t n, size_t data_len) {
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *patches = calloc(n, sizeof(*patches));
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch **pp = calloc(n, sizeof(*pp));
  static uint8_t data[8] = {0x92, 0x80, 0x80, 0x00};
  for (size_t i = 0; i < n; i++) {
    perfetto__protos__commit_data_request__chunk_to_patch__patch__init(&patches[i]);
    patches[i].has_offset = patches[i].has_data = true;
    patches[i].offset = (uint32_t)(4 * i);
    patches[i].data = (ProtobufCBinaryData){data_len, data};
    pp[i] = &patches[i];
  }
  Perfetto__Protos__CommitDataRequest__ChunkToPatch e =
      PERFETTO__PROTOS__COMMIT_DATA_REQUEST__CHUNK_TO_PATCH__INIT;
  e.has_target_buffer = e.has_writer_id = e.has_chunk_id = true;
  e.target_buffer = buffer;
  e.writer_id = 1;
  e.chunk_id = 5;
  e.n_patches = n;
  e.patches = pp;
  Perfetto__Protos__CommitDataRequest__ChunkToPatch *ep = &e;
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  req.n_chunks_to_patch = 1;
  req.chunks_to_patch = &ep;
  uint64_t id = invoke(c, M_COMMIT, &req.base, false);
  free(pp);
  free(patches);
  return id;
}

static uint64_t send_emulated(client *c, uint32_t buffer, size_t len, uint16_t writer,
                              bool incomplete) {
  uint8_t *data = calloc(1, len < 16 ? 16 : len); /* len may cut the chunk short */
  tr_chunk_header h = {.chunk_id = 9, .writer_id = writer, .count = 2};
  tr_chunk_header_encode(&h, data);
  data[8] = 3;  /* fragment of 3 bytes */
  data[12] = 2; /* fragment of 2 bytes */
  Perfetto__Protos__CommitDataRequest__ChunksToMove m =
      PERFETTO__PROTOS__COMMIT_DATA_REQUEST__CHUNKS_TO_MOVE__INIT;
  m.has_target_buffer = m.has_data = true;
  m.target_buffer = buffer;
  m.data = (ProtobufCBinaryData){len, data};
  m.has_chunk_incomplete = m.chunk_incomplete = incomplete;
  Perfetto__Protos__CommitDataRequest__ChunksToMove *mp = &m;
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  req.n_chunks_to_move = 1;
  req.chunks_to_move = &mp;
  uint64_t id = invoke(c, M_COMMIT, &req.base, false);
  free(data);
  return id;
}

static void test_patch_and_emulation_rejections(void **state) {
  env *e = *state;
  client a, b;
  two_producers(e, &a, &b);
  expect_reply(e, &a, send_patches(&a, 2, 1, 4), false); /* b's buffer */
  assert_int_equal(violations(e, &a), 1);
  expect_reply(e, &a, send_patches(&a, 1, 1025, 4), false);
  assert_int_equal(violations(e, &a), 2);
  expect_reply(e, &a, send_patches(&a, 1, 1, 3), false);
  assert_int_equal(violations(e, &a), 3);
  expect_reply(e, &a, send_emulated(&a, 1, 65537, 1, false), false);
  assert_int_equal(violations(e, &a), 4);
  expect_reply(e, &a, send_emulated(&a, 1, 7, 1, false), false);
  assert_int_equal(violations(e, &a), 5);
  expect_reply(e, &a, send_emulated(&a, 1, 64, 0, false), false);
  assert_int_equal(violations(e, &a), 6);
  assert_null(tr_chunkq_peek(&e->queue));
  /* bad args for each kind of call that takes some */
  static const uint8_t junk[] = {0xff, 0xff, 0xff};
  for (uint32_t m = M_REGISTER_DS; m <= M_UPDATE_DS; m++)
    if (m != M_ASYNC) /* its stream is open: tested in test_second_initialize */
      expect_reply(e, &a, invoke_raw(&a, m, junk, sizeof(junk), true), false);
  assert_int_equal(violations(e, &a), 6 + 10);
  b_still_works(e, &b);
  client_close(&a);
  client_close(&b);
}

static void test_register_refusals(void **state) {
  env *e = *state;
  client a;
  handshake(e, &a, "a", false);
  Perfetto__Protos__DataSourceDescriptor d = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  d.name = "ds"; /* already registered */
  Perfetto__Protos__RegisterDataSourceRequest reg = PERFETTO__PROTOS__REGISTER_DATA_SOURCE_REQUEST__INIT;
  reg.data_source_descriptor = &d;
  uint64_t id = invoke(&a, M_REGISTER_DS, &reg.base, false);
  Perfetto__Protos__IPCFrame *f = client_next_frame(e, &a);
  assert_int_equal(f->request_id, id);
  Perfetto__Protos__RegisterDataSourceResponse *r = perfetto__protos__register_data_source_response__unpack(
      NULL, f->msg_invoke_method_reply->reply_proto.len, f->msg_invoke_method_reply->reply_proto.data);
  assert_string_equal(r->error, "data source already registered");
  perfetto__protos__register_data_source_response__free_unpacked(r, NULL);
  tr_ipc_frame_free(f);
  Perfetto__Protos__RegisterTraceWriterRequest w = PERFETTO__PROTOS__REGISTER_TRACE_WRITER_REQUEST__INIT;
  w.has_trace_writer_id = true;
  w.trace_writer_id = 40000;
  expect_reply(e, &a, invoke(&a, M_REGISTER_WRITER, &w.base, false), false);
  /* Update keeps unknown fields: field 99 travels with the descriptor. */
  static const uint8_t upd[] = {0x0a, 0x07, 0x0a, 0x02, 'd', 's', 0x98, 0x06, 0x01};
  expect_reply(e, &a, invoke_raw(&a, M_UPDATE_DS, upd, sizeof(upd), false), true);
  assert_int_equal(e->last_num_ds, 1);
  assert_int_equal(e->last_unknown_fields, 1);
  Perfetto__Protos__UnregisterDataSourceRequest un = PERFETTO__PROTOS__UNREGISTER_DATA_SOURCE_REQUEST__INIT;
  un.data_source_name = "nope";
  expect_reply(e, &a, invoke(&a, M_UNREGISTER_DS, &un.base, false), false);
  un.data_source_name = "ds";
  expect_reply(e, &a, invoke(&a, M_UNREGISTER_DS, &un.base, false), true);
  assert_int_equal(e->last_num_ds, 0);
  assert_int_equal(violations(e, &a), 3);
  client_close(&a);
}

static const tr_chunkq_drops *drops_entry(env *e, uint32_t producer_id, uint32_t buffer);

static void test_too_many_violations_disconnects(void **state) {
  env *e = *state;
  client a, b;
  two_producers(e, &a, &b);
  tr_log_set_level(TR_LOG_ERROR);
  for (unsigned i = 0; i < TR_PRODUCER_PORT_MAX_VIOLATIONS; i++)
    commit(&a, 9999, 0, 1);
  pump(e, 20);
  uint8_t *payload;
  size_t len;
  while (client_next(e, &a, &payload, &len, 200))
    free(payload);
  assert_true(a.eof);
  assert_int_equal(e->num_disconnected, 1);
  assert_int_equal(e->disconnected[0], a.id);
  /* Counted against the buffer of its session, with why (issue 38); b's is untouched. */
  assert_non_null(drops_entry(e, a.id, 1));
  assert_int_equal(drops_entry(e, a.id, 1)->closed_why, TR_IPC_CLOSE_VIOLATIONS);
  assert_null(drops_entry(e, b.id, 2));
  tr_log_set_level(TR_LOG_INFO);
  b_still_works(e, &b);
  client_close(&a);
  client_close(&b);
}

/* ---- 3. the rest of the data path ------------------------------------------------------- */

static void test_patches_flush_and_scrape(void **state) {
  env *e = *state;
  client a, b;
  two_producers(e, &a, &b);
  /* emulated chunk: whole, trimmed to its two fragments */
  expect_reply(e, &a, send_emulated(&a, 1, 100, 1, false), true);
  tr_chunkq_entry *en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->len, 4 + 3);
  assert_int_equal(en->u.chunk.header.chunk_id, 9);
  tr_chunkq_entry_free(en);
  expect_reply(e, &a, send_emulated(&a, 1, 100, 1, true), true);
  en = pop(e, TR_CHUNKQ_CHUNK);
  assert_true(en->u.chunk.incomplete);
  assert_int_equal(en->u.chunk.header.count, 2); /* as found */
  assert_int_equal(en->len, 4); /* only the first fragment is readable */
  tr_chunkq_entry_free(en);
  /* patches, in order, has_more on all but the last */
  expect_reply(e, &a, send_patches(&a, 1, 3, 4), true);
  for (int i = 0; i < 3; i++) {
    en = pop(e, TR_CHUNKQ_PATCH);
    assert_int_equal(en->u.patch.producer_id, a.id);
    assert_int_equal(en->u.patch.chunk_id, 5);
    assert_int_equal(en->u.patch.offset, 4 * i);
    assert_int_equal(en->u.patch.has_more, i < 2);
    assert_int_equal(en->u.patch.data[0], 0x92);
    tr_chunkq_entry_free(en);
  }
  /* flush: scrape first (a BeingWritten chunk with 3 fragments, a Complete one not yet
   * committed, a BeingWritten one with 1 fragment that stays), then the command */
  write_chunk(&a, 4, 0, TR_SMB_LAYOUT_DIV4, 1, 30, 3, 10, false);
  write_chunk(&a, 4, 1, TR_SMB_LAYOUT_DIV4, 1, 31, 2, 10, true);
  write_chunk(&a, 4, 2, TR_SMB_LAYOUT_DIV4, 1, 32, 1, 10, false);
  uint64_t ids[1] = {10};
  size_t wakeups = e->queue_wakeups;
  assert_int_equal(tr_producer_port_flush(e->port, a.id, 55, ids, 1, 18), 0);
  assert_true(e->queue_wakeups > wakeups);
  en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.header.chunk_id, 30);
  assert_true(en->u.chunk.incomplete);
  assert_int_equal(en->len, 2 * 11);
  tr_chunkq_entry_free(en);
  en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.header.chunk_id, 31);
  assert_false(en->u.chunk.incomplete);
  tr_chunkq_entry_free(en);
  assert_null(tr_chunkq_peek(&e->queue));
  uint32_t word;
  tr_smb_page_word(&a.view, 4, &word);
  assert_int_equal(tr_smb_word_state(word, 1), TR_SMB_CHUNK_COMPLETE); /* left alone */
  Perfetto__Protos__GetAsyncCommandResponse *cmd = next_command(e, &a);
  assert_int_equal(cmd->cmd_case, PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_FLUSH);
  assert_int_equal(cmd->flush->request_id, 55);
  assert_int_equal(cmd->flush->flags, 18);
  assert_int_equal(cmd->flush->n_data_source_ids, 1);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
  /* the answer: the chunk, then the ack marker after it */
  Perfetto__Protos__CommitDataRequest__ChunksToMove m =
      PERFETTO__PROTOS__COMMIT_DATA_REQUEST__CHUNKS_TO_MOVE__INIT;
  m.has_page = m.has_chunk = m.has_target_buffer = true;
  m.page = 4;
  m.chunk = 1;
  m.target_buffer = 1;
  Perfetto__Protos__CommitDataRequest__ChunksToMove *mp = &m;
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  req.n_chunks_to_move = 1;
  req.chunks_to_move = &mp;
  req.has_flush_request_id = true;
  req.flush_request_id = 55;
  invoke(&a, M_COMMIT, &req.base, true);
  pump(e, 5);
  en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.header.chunk_id, 31);
  tr_chunkq_entry_free(en);
  en = pop(e, TR_CHUNKQ_FLUSH_ACK);
  assert_int_equal(en->u.flush_ack.request_id, 55);
  assert_int_equal(en->u.flush_ack.producer_id, a.id);
  tr_chunkq_entry_free(en);
  assert_int_equal(e->num_flush_acks, 1);
  assert_int_equal(e->flush_acks[0], 55);
  /* clear incremental state and triggers */
  assert_int_equal(tr_producer_port_clear_incremental_state(e->port, a.id, ids, 1), 0);
  cmd = next_command(e, &a);
  assert_int_equal(cmd->cmd_case,
                   PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_CLEAR_INCREMENTAL_STATE);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
  Perfetto__Protos__ActivateTriggersRequest t = PERFETTO__PROTOS__ACTIVATE_TRIGGERS_REQUEST__INIT;
  char *names[2] = {"t1", "t2"};
  t.n_trigger_names = 2;
  t.trigger_names = names;
  expect_reply(e, &a, invoke(&a, M_TRIGGERS, &t.base, false), true);
  assert_int_equal(e->triggers, 1);
  tr_producer_stats st;
  assert_int_equal(tr_producer_port_stats(e->port, a.id, &st), 0);
  assert_int_equal(st.chunks_moved, 3);
  assert_int_equal(st.scraped_chunks, 2);
  assert_int_equal(st.patches, 3);
  assert_int_equal(st.abi_violations, 0);
  b_still_works(e, &b);
  client_close(&a);
  client_close(&b);
}

/* The (producer, buffer) entry of the queue's drop table, or NULL. */
static const tr_chunkq_drops *drops_entry(env *e, uint32_t producer_id, uint32_t buffer) {
  for (size_t i = 0; i < e->queue.num_drops; i++)
    if (e->queue.drops[i].producer_id == producer_id && e->queue.drops[i].target_buffer == buffer)
      return &e->queue.drops[i];
  return NULL;
}

/* A producer that goes (its socket closed, as when it crashes) leaves its last chunks: scraped
 * for its session's buffer as traced does, what cannot be counted. */
static void test_departure_scraped_and_counted(void **state) {
  env *e = *state;
  client a, b;
  two_producers(e, &a, &b);
  register_writer(e, &a, 3, 7); /* a buffer of no session of a's */
  write_chunk(&a, 4, 0, TR_SMB_LAYOUT_DIV4, 1, 40, 3, 10, false); /* scraped, incomplete */
  write_chunk(&a, 4, 1, TR_SMB_LAYOUT_DIV4, 1, 41, 2, 10, true);  /* scraped whole */
  write_chunk(&a, 4, 2, TR_SMB_LAYOUT_DIV4, 1, 42, 1, 10, false); /* one packet begun: lost */
  write_chunk(&a, 4, 3, TR_SMB_LAYOUT_DIV4, 5, 43, 2, 10, true);  /* unknown writer: lost */
  write_chunk(&a, 5, 0, TR_SMB_LAYOUT_DIV1, 1, 44, 0, 10, false); /* nothing begun: nothing */
  write_chunk(&a, 6, 0, TR_SMB_LAYOUT_DIV1, 3, 45, 2, 10, true);  /* buffer 7: left alone */
  uint32_t id = a.id;
  client_close(&a);
  for (int i = 0; i < 2000 && e->num_disconnected == 0; i++)
    pump(e, 1);
  assert_int_equal(e->num_disconnected, 1);
  tr_chunkq_entry *en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.header.chunk_id, 40);
  assert_int_equal(en->u.chunk.target_buffer, 1);
  assert_true(en->u.chunk.incomplete);
  tr_chunkq_entry_free(en);
  en = pop(e, TR_CHUNKQ_CHUNK);
  assert_int_equal(en->u.chunk.header.chunk_id, 41);
  assert_false(en->u.chunk.incomplete);
  tr_chunkq_entry_free(en);
  assert_null(tr_chunkq_peek(&e->queue));
  const tr_chunkq_drops *d1 = drops_entry(e, id, 1), *d0 = drops_entry(e, id, 0);
  assert_non_null(d1);
  assert_non_null(d0);
  assert_int_equal(d1->unscraped_chunks, 1);
  assert_int_equal(d0->unscraped_chunks, 1);
  assert_null(drops_entry(e, id, 7));
  assert_int_equal(d1->closed_why, 0); /* it left: the port closed nothing */
  assert_int_equal(d1->chunks, 0);     /* and the queue dropped nothing */
  b_still_works(e, &b);
  client_close(&b);
}

static void expect_stop_command(env *e, client *c) {
  Perfetto__Protos__GetAsyncCommandResponse *cmd = next_command(e, c);
  assert_int_equal(cmd->cmd_case, PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_STOP_DATA_SOURCE);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
}

static void notify_stopped(env *e, client *c, uint64_t instance_id) {
  Perfetto__Protos__NotifyDataSourceStoppedRequest n =
      PERFETTO__PROTOS__NOTIFY_DATA_SOURCE_STOPPED_REQUEST__INIT;
  n.has_data_source_id = true;
  n.data_source_id = instance_id;
  expect_reply(e, c, invoke(c, M_NOTIFY_STOPPED, &n.base, false), true);
}

static void test_stop_timeout_and_commands(void **state) {
  env *e = *state;
  client a;
  handshake(e, &a, "a", true);
  Perfetto__Protos__DataSourceConfig cfg = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  cfg.name = "nope";
  cfg.has_target_buffer = true;
  cfg.target_buffer = 1;
  assert_int_equal(tr_producer_port_setup_data_source(e->port, a.id, 1, &cfg), TR_ERR_NOT_FOUND);
  assert_int_equal(tr_producer_port_setup_data_source(e->port, 999, 1, &cfg), TR_ERR_NOT_FOUND);
  assert_int_equal(tr_producer_port_start_data_source(e->port, a.id, 5), TR_ERR_NOT_FOUND);
  start_ds(e, &a, 7, 1);
  assert_int_equal(e->num_started, 1); /* no will_notify_on_start: at once */
  assert_int_equal(tr_producer_port_stop_data_source(e->port, a.id, 7, 30), 0);
  expect_stop_command(e, &a);
  assert_int_equal(e->num_stopped, 0);
  pump(e, 80);
  assert_int_equal(e->num_stopped, 1);
  assert_true(e->stopped_timed_out[0]);
  /* a late notification is ignored */
  notify_stopped(e, &a, 7);
  assert_int_equal(e->num_stopped, 1);
  client_close(&a);
}

/* Issue 24: a stop without a timeout of its own (the agent's, for the service's
 * stop_data_source) waits as long as the instance's config says: the session's
 * data_source_stop_timeout_ms. The port used to give every producer 5 s, so a producer that
 * confirmed after 6 s of a 20 s stop timeout was reported as timed out. */
static void test_stop_waits_the_configs_timeout(void **state) {
  env *e = *state;
  client a;
  handshake(e, &a, "a", true);
  start_ds_stop_timeout(e, &a, 7, 1, 20000);
  assert_int_equal(tr_producer_port_stop_data_source(e->port, a.id, 7, 0), 0);
  expect_stop_command(e, &a);
  /* past the port's 5 s default, well inside the config's 20 s: by the loop's own clock, since
   * 6000 pumps of 1 ms can take over 20 s on a busy machine */
  uint64_t start = uv_now(&e->loop);
  while (uv_now(&e->loop) - start < 6000)
    pump(e, 10);
  assert_int_equal(e->num_stopped, 0);
  notify_stopped(e, &a, 7);
  assert_int_equal(e->num_stopped, 1);
  assert_false(e->stopped_timed_out[0]);
  client_close(&a);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_replay_sdk_producer, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_call_before_initialize, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_second_initialize, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_commit_rejections, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_patch_and_emulation_rejections, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_register_refusals, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_too_many_violations_disconnects, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_patches_flush_and_scrape, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_departure_scraped_and_counted, setup_env,
                                      teardown_env),
      cmocka_unit_test_setup_teardown(test_stop_timeout_and_commands, setup_env, teardown_env),
      cmocka_unit_test_setup_teardown(test_stop_waits_the_configs_timeout, setup_env,
                                      teardown_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
