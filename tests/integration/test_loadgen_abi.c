/* test_loadgen_abi.c: runs tracerelay-loadgen against a tiny fake Perfetto service written here
 * (no agent involved) and checks what it writes with a minimal chunk reader of our own, so the
 * loadgen is held to the ABI (reference sections 2 and 4), not to relay/producer/smb.c.
 *
 * The fake service speaks just enough ProducerPort: BindServiceReply with the 12 methods, the
 * InitializeConnection reply, setup_tracing with a memfd SMB (SCM_RIGHTS), setup and start of the
 * data source, CommitData (moves the chunks out: Complete -> BeingRead -> Free, then patches),
 * a flush while the writers run and one at the end, then stop_data_source.
 * Checks: chunk states and writer ids, chunk ids consecutive per writer, fragments reassembled
 * across chunks with patches applied, every packet a TracePacket (protobuf-c), the sequence
 * start packets, every (writer, seq) event present exactly once, counts equal to --stats-json. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "perfetto/ipc/producer_port.pb-c.h"
#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/producer/ipc_frame.h"

#define PAGE_SIZE 4096u
#define MAX_CHUNKS 8192
#define MAX_WRITERS 8
#define MAX_EVENTS 4096
#define QUIET_MS 400

typedef struct stored_chunk {
  uint16_t writer;
  uint32_t chunk_id;
  uint16_t count;
  uint8_t flags;
  size_t size; /* payload bytes */
  uint8_t *data;
  int patches_left; /* -1 until a patch entry without has_more_patches arrived */
} stored_chunk;

typedef struct fake {
  int fd;
  tr_ipc_reader reader;
  uint8_t *smb;
  size_t smb_size;
  int memfd;
  uint64_t async_request;
  stored_chunk chunks[MAX_CHUNKS];
  size_t num_chunks;
  size_t patches;
  size_t commit_frames;
  uint64_t flush_acks[4];
  size_t num_flush_acks;
  bool writer_registered[MAX_WRITERS + 1];
  bool started_notified;
  bool stopped_notified;
} fake;

static void send_frame(fake *f, Perfetto__Protos__IPCFrame *frame, int fd) {
  uint8_t *buf;
  size_t len;
  assert_int_equal(tr_ipc_frame_encode(frame, &buf, &len), 0);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control;
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
  }
  assert_int_equal(sendmsg(f->fd, &msg, MSG_NOSIGNAL), (ssize_t)len);
  free(buf);
}

static void reply(fake *f, uint64_t request_id, const ProtobufCMessage *msg, bool more, int fd) {
  uint8_t buf[256];
  Perfetto__Protos__IPCFrame__InvokeMethodReply r =
      PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD_REPLY__INIT;
  r.has_success = r.has_has_more = r.has_reply_proto = 1;
  r.success = 1;
  r.has_more = more;
  r.reply_proto = (ProtobufCBinaryData){protobuf_c_message_pack(msg, buf), buf};
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = 1;
  frame.request_id = request_id;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY;
  frame.msg_invoke_method_reply = &r;
  send_frame(f, &frame, fd);
}

static void command(fake *f, Perfetto__Protos__GetAsyncCommandResponse *cmd, int fd) {
  reply(f, f->async_request, &cmd->base, true, fd);
}

static void bind_reply(fake *f, uint64_t request_id) {
  static const char *const names[12] = {
      "InitializeConnection", "RegisterDataSource", "UnregisterDataSource", "CommitData",
      "GetAsyncCommand", "RegisterTraceWriter", "UnregisterTraceWriter",
      "NotifyDataSourceStarted", "NotifyDataSourceStopped", "ActivateTriggers", "Sync",
      "UpdateDataSource"};
  Perfetto__Protos__IPCFrame__BindServiceReply__MethodInfo infos[12], *ptrs[12];
  for (int i = 0; i < 12; i++) {
    perfetto__protos__ipcframe__bind_service_reply__method_info__init(&infos[i]);
    infos[i].has_id = 1;
    infos[i].id = (uint32_t)i + 1;
    infos[i].name = (char *)names[i];
    ptrs[i] = &infos[i];
  }
  Perfetto__Protos__IPCFrame__BindServiceReply r = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE_REPLY__INIT;
  r.has_success = r.has_service_id = 1;
  r.success = 1;
  r.service_id = 1;
  r.n_methods = 12;
  r.methods = ptrs;
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = 1;
  frame.request_id = request_id;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY;
  frame.msg_bind_service_reply = &r;
  send_frame(f, &frame, -1);
}

/* setup_tracing + SMB fd, setup_data_source, start_data_source, as traced sends them. */
static void start_tracing(fake *f) {
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  Perfetto__Protos__GetAsyncCommandResponse__SetupTracing st =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__SETUP_TRACING__INIT;
  st.has_shared_buffer_page_size_kb = 1;
  st.shared_buffer_page_size_kb = PAGE_SIZE / 1024;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING;
  cmd.setup_tracing = &st;
  command(f, &cmd, f->memfd);

  Perfetto__Protos__DataSourceConfig config = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  config.name = "track_event";
  config.has_target_buffer = 1;
  config.target_buffer = 1;
  Perfetto__Protos__GetAsyncCommandResponse__SetupDataSource setup =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__SETUP_DATA_SOURCE__INIT;
  setup.has_new_instance_id = 1;
  setup.new_instance_id = 1;
  setup.config = &config;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_DATA_SOURCE;
  cmd.setup_data_source = &setup;
  command(f, &cmd, -1);
  Perfetto__Protos__GetAsyncCommandResponse__StartDataSource start =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__START_DATA_SOURCE__INIT;
  start.has_new_instance_id = 1;
  start.new_instance_id = 1;
  start.config = &config;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE;
  cmd.start_data_source = &start;
  command(f, &cmd, -1);
}

static void send_flush(fake *f, uint64_t id) {
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  Perfetto__Protos__GetAsyncCommandResponse__Flush flush =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__FLUSH__INIT;
  flush.has_request_id = 1;
  flush.request_id = id;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_FLUSH;
  cmd.flush = &flush;
  command(f, &cmd, -1);
}

static void send_stop(fake *f) {
  Perfetto__Protos__GetAsyncCommandResponse cmd = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__INIT;
  Perfetto__Protos__GetAsyncCommandResponse__StopDataSource stop =
      PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__STOP_DATA_SOURCE__INIT;
  stop.has_instance_id = 1;
  stop.instance_id = 1;
  cmd.cmd_case = PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_STOP_DATA_SOURCE;
  cmd.stop_data_source = &stop;
  command(f, &cmd, -1);
}

/* --- the service side of the SMB, written from the reference alone --- */

static const unsigned kChunksPerLayout[8] = {0, 1, 2, 4, 7, 14, 0, 0};

static void move_chunk(fake *f, uint32_t page, uint32_t chunk) {
  assert_true(page < f->smb_size / PAGE_SIZE);
  uint32_t *word = (uint32_t *)(f->smb + (size_t)page * PAGE_SIZE);
  uint32_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  unsigned layout = w >> 28 & 7;
  assert_true(chunk < kChunksPerLayout[layout]);
  /* Complete -> BeingRead; the producer may change other chunks' bits meanwhile. */
  for (;;) {
    assert_int_equal(w >> (2 * chunk) & 3, 3);
    uint32_t reading = (w & ~(3u << (2 * chunk))) | 2u << (2 * chunk);
    if (__atomic_compare_exchange_n(word, &w, reading, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      break;
  }
  size_t size = ((PAGE_SIZE - 8) / kChunksPerLayout[layout]) & ~(size_t)3;
  const uint8_t *c = (const uint8_t *)word + 8 + chunk * size;
  assert_true(f->num_chunks < MAX_CHUNKS);
  stored_chunk *s = &f->chunks[f->num_chunks++];
  memcpy(&s->chunk_id, c, 4);
  memcpy(&s->writer, c + 4, 2);
  uint16_t packets;
  memcpy(&packets, c + 6, 2);
  s->count = packets & 0x3ff;
  s->flags = (uint8_t)(packets >> 10);
  s->size = size - 8;
  s->data = malloc(s->size);
  memcpy(s->data, c + 8, s->size);
  s->patches_left = (s->flags & 4) ? 1 : 0;
  assert_true(s->writer >= 1 && s->writer <= MAX_WRITERS);
  assert_true(f->writer_registered[s->writer]);
  /* BeingRead -> Free; a page with every chunk free goes back to unpartitioned. */
  w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
  for (;;) {
    uint32_t freed = w & ~(3u << (2 * chunk));
    if ((freed & 0x0fffffffu) == 0)
      freed = 0;
    if (__atomic_compare_exchange_n(word, &w, freed, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      break;
  }
}

static stored_chunk *find_chunk(fake *f, uint32_t writer, uint32_t chunk_id) {
  for (size_t i = 0; i < f->num_chunks; i++)
    if (f->chunks[i].writer == writer && f->chunks[i].chunk_id == chunk_id)
      return &f->chunks[i];
  return NULL;
}

static void commit_data(fake *f, const ProtobufCBinaryData *args) {
  Perfetto__Protos__CommitDataRequest *req =
      perfetto__protos__commit_data_request__unpack(NULL, args->len, args->data);
  assert_non_null(req);
  f->commit_frames++;
  for (size_t i = 0; i < req->n_chunks_to_move; i++) {
    assert_int_equal(req->chunks_to_move[i]->target_buffer, 1);
    move_chunk(f, req->chunks_to_move[i]->page, req->chunks_to_move[i]->chunk);
  }
  for (size_t i = 0; i < req->n_chunks_to_patch; i++) {
    const Perfetto__Protos__CommitDataRequest__ChunkToPatch *e = req->chunks_to_patch[i];
    stored_chunk *s = find_chunk(f, e->writer_id, e->chunk_id);
    assert_non_null(s); /* a patch never comes before its chunk */
    assert_true(s->flags & 4);
    for (size_t j = 0; j < e->n_patches; j++) {
      assert_int_equal(e->patches[j]->data.len, 4);
      assert_true(e->patches[j]->offset + 4 <= s->size);
      memcpy(s->data + e->patches[j]->offset, e->patches[j]->data.data, 4);
      f->patches++;
    }
    if (!e->has_more_patches)
      s->patches_left = 0;
  }
  if (req->has_flush_request_id && f->num_flush_acks < 4)
    f->flush_acks[f->num_flush_acks++] = req->flush_request_id;
  perfetto__protos__commit_data_request__free_unpacked(req, NULL);
}

/* Handles one frame from the loadgen. */
static void on_frame(fake *f, const Perfetto__Protos__IPCFrame *frame) {
  if (frame->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE) {
    assert_string_equal(frame->msg_bind_service->service_name, "ProducerPort");
    bind_reply(f, frame->request_id);
    return;
  }
  assert_int_equal(frame->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD);
  const Perfetto__Protos__IPCFrame__InvokeMethod *inv = frame->msg_invoke_method;
  assert_int_equal(inv->service_id, 1);
  switch (inv->method_id) {
  case 1: { /* InitializeConnection */
    Perfetto__Protos__InitializeConnectionResponse r =
        PERFETTO__PROTOS__INITIALIZE_CONNECTION_RESPONSE__INIT;
    r.has_direct_smb_patching_supported = r.direct_smb_patching_supported = 1;
    reply(f, frame->request_id, &r.base, false, -1);
    break;
  }
  case 2: { /* RegisterDataSource */
    Perfetto__Protos__RegisterDataSourceRequest *req =
        perfetto__protos__register_data_source_request__unpack(NULL, inv->args_proto.len,
                                                               inv->args_proto.data);
    assert_non_null(req);
    assert_string_equal(req->data_source_descriptor->name, "track_event");
    assert_true(req->data_source_descriptor->will_notify_on_start);
    assert_true(req->data_source_descriptor->will_notify_on_stop);
    perfetto__protos__register_data_source_request__free_unpacked(req, NULL);
    Perfetto__Protos__RegisterDataSourceResponse r =
        PERFETTO__PROTOS__REGISTER_DATA_SOURCE_RESPONSE__INIT;
    reply(f, frame->request_id, &r.base, false, -1);
    start_tracing(f);
    break;
  }
  case 4:
    assert_true(inv->drop_reply);
    commit_data(f, &inv->args_proto);
    break;
  case 5:
    f->async_request = frame->request_id;
    break;
  case 6: { /* RegisterTraceWriter */
    Perfetto__Protos__RegisterTraceWriterRequest *req =
        perfetto__protos__register_trace_writer_request__unpack(NULL, inv->args_proto.len,
                                                                inv->args_proto.data);
    assert_non_null(req);
    assert_true(req->trace_writer_id >= 1 && req->trace_writer_id <= MAX_WRITERS);
    assert_int_equal(req->target_buffer, 1);
    f->writer_registered[req->trace_writer_id] = true;
    perfetto__protos__register_trace_writer_request__free_unpacked(req, NULL);
    break;
  }
  case 8:
    assert_true(f->async_request != 0);
    f->started_notified = true;
    break;
  case 9:
    f->stopped_notified = true;
    break;
  default:
    fail_msg("unexpected method %u", inv->method_id);
  }
}

/* Reads frames until `timeout_ms` pass without one. Returns false when the loadgen hung up. */
static bool pump(fake *f, int timeout_ms) {
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int rc;
    while ((rc = tr_frame_reader_next(&f->reader, &payload, &len)) == 1) {
      Perfetto__Protos__IPCFrame *frame = tr_ipc_frame_decode(payload, len);
      assert_non_null(frame);
      on_frame(f, frame);
      tr_ipc_frame_free(frame);
    }
    assert_int_equal(rc, 0);
    struct pollfd pfd = {.fd = f->fd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) <= 0)
      return true;
    uint8_t *dst;
    size_t room;
    assert_int_equal(tr_frame_reader_space(&f->reader, &dst, &room), 0);
    ssize_t n = recv(f->fd, dst, room, 0);
    if (n <= 0)
      return false;
    tr_frame_reader_commit(&f->reader, (size_t)n);
  }
}

/* --- reading the chunks back --- */

typedef struct check {
  size_t packets;
  size_t events;
  size_t dropped_markers;
  uint8_t seen[MAX_WRITERS + 1][MAX_EVENTS];
} check;

static int cmp_chunk(const void *a, const void *b) {
  const stored_chunk *x = a, *y = b;
  if (x->writer != y->writer)
    return x->writer - y->writer;
  return x->chunk_id < y->chunk_id ? -1 : x->chunk_id > y->chunk_id;
}

static void check_packet(check *c, uint16_t writer, const uint8_t *data, size_t len,
                         bool first) {
  Perfetto__Protos__TracePacket *p = perfetto__protos__trace_packet__unpack(NULL, len, data);
  assert_non_null(p);
  c->packets++;
  if (first) {
    assert_true(p->has_first_packet_on_sequence && p->first_packet_on_sequence);
    assert_int_equal(p->sequence_flags, 1);
    assert_int_equal(p->data_case, PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT);
    assert_int_equal(p->clock_snapshot->n_clocks, 2);
    assert_int_equal(p->clock_snapshot->clocks[0]->clock_id, 6);
    assert_int_equal(p->clock_snapshot->clocks[1]->clock_id, 64);
    assert_true(p->clock_snapshot->clocks[1]->is_incremental);
    assert_non_null(p->trace_packet_defaults);
    assert_int_equal(p->trace_packet_defaults->timestamp_clock_id, 64);
  }
  if (p->data_case == PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT) {
    const Perfetto__Protos__TrackEvent *te = p->track_event;
    int64_t w = -1, seq = -1;
    for (size_t i = 0; i < te->n_debug_annotations; i++) {
      const Perfetto__Protos__DebugAnnotation *a = te->debug_annotations[i];
      if (a->name_iid == 1)
        w = (int64_t)a->uint_value;
      if (a->name_iid == 2)
        seq = (int64_t)a->uint_value;
    }
    assert_int_equal(w, writer);
    assert_true(seq >= 0 && seq < MAX_EVENTS);
    assert_int_equal(c->seen[writer][seq], 0);
    c->seen[writer][seq] = 1;
    c->events++;
  }
  perfetto__protos__trace_packet__free_unpacked(p, NULL);
}

/* Reassembles every writer's packets in chunk-id order (reference 4.3). */
static void read_back(fake *f, check *c) {
  qsort(f->chunks, f->num_chunks, sizeof(stored_chunk), cmp_chunk);
  uint8_t *pending = NULL;
  size_t pending_len = 0;
  bool first = true;
  for (size_t i = 0; i < f->num_chunks; i++) {
    stored_chunk *s = &f->chunks[i];
    if (i == 0 || s->writer != f->chunks[i - 1].writer) {
      assert_int_equal(s->chunk_id, 0);
      assert_false(s->flags & 1);
      first = true;
    } else {
      assert_int_equal(s->chunk_id, f->chunks[i - 1].chunk_id + 1);
      assert_int_equal(!!(s->flags & 1), !!(f->chunks[i - 1].flags & 2));
    }
    assert_int_equal(s->patches_left, 0);
    size_t off = 0;
    for (unsigned k = 0; k < s->count; k++) {
      uint32_t size = 0;
      unsigned n = 0;
      do {
        assert_true(n < 4 && off < s->size);
        size |= (uint32_t)(s->data[off] & 0x7f) << (7 * n);
      } while (s->data[off++] & 0x80 && ++n);
      if (size == 0x0FFFFFFF) {
        c->dropped_markers++;
        free(pending);
        pending = NULL;
        pending_len = 0;
        break;
      }
      assert_true(off + size <= s->size);
      bool continues = k == 0 && (s->flags & 1);
      assert_true(continues == (pending != NULL));
      pending = realloc(pending, pending_len + size + 1);
      memcpy(pending + pending_len, s->data + off, size);
      pending_len += size;
      off += size;
      if (k + 1 == s->count && (s->flags & 2))
        break; /* continues in the next chunk */
      if (pending_len > 0) {
        check_packet(c, s->writer, pending, pending_len, first);
        first = false;
      }
      free(pending);
      pending = NULL;
      pending_len = 0;
    }
  }
  assert_null(pending);
}

/* --- the run --- */

static long json_count(const char *json, const char *key) {
  const char *p = strstr(json, key);
  assert_non_null(p);
  return strtol(p + strlen(key) + 1, NULL, 10);
}

typedef struct scenario {
  unsigned writers;
  unsigned events; /* per writer */
  unsigned packet_size;
  unsigned chunks_per_page;
  const char *rate;
  size_t smb_size;
  bool may_drop; /* SMB too small to hold the burst: drops are expected and must be counted */
} scenario;

static void run_loadgen(const scenario *sc) {
  char dir[] = "/tmp/tr-loadgen-XXXXXX";
  assert_non_null(mkdtemp(dir));
  char sock_path[128], json_path[128];
  snprintf(sock_path, sizeof(sock_path), "%s/producer.sock", dir);
  snprintf(json_path, sizeof(json_path), "%s/stats.json", dir);
  int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, sock_path);
  assert_int_equal(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
  assert_int_equal(listen(lfd, 1), 0);

  char w[16], n[16], ps[16], cpp[16];
  snprintf(w, sizeof(w), "%u", sc->writers);
  snprintf(n, sizeof(n), "%u", sc->events);
  snprintf(ps, sizeof(ps), "%u", sc->packet_size);
  snprintf(cpp, sizeof(cpp), "%u", sc->chunks_per_page);
  pid_t pid = fork();
  if (pid == 0) {
    execl(TR_BIN_DIR "/tracerelay-loadgen", "tracerelay-loadgen", "--socket", sock_path,
          "--writers", w, "--packets", n, "--rate", sc->rate, "--packet-size", ps,
          "--chunks-per-page", cpp, "--stats-json", json_path, (char *)NULL);
    _exit(127);
  }
  fake *f = calloc(1, sizeof(fake));
  tr_ipc_reader_init(&f->reader);
  f->memfd = memfd_create("perfetto_shmem", MFD_CLOEXEC);
  f->smb_size = sc->smb_size;
  assert_int_equal(ftruncate(f->memfd, (off_t)f->smb_size), 0);
  f->smb = mmap(NULL, f->smb_size, PROT_READ | PROT_WRITE, MAP_SHARED, f->memfd, 0);
  assert_true(f->smb != MAP_FAILED);
  f->fd = accept(lfd, NULL, NULL);
  assert_true(f->fd >= 0);

  /* Until the first commit, then a flush while the writers run, then the end. */
  for (int i = 0; i < 100 && f->commit_frames == 0; i++)
    assert_true(pump(f, 50));
  assert_true(f->started_notified);
  send_flush(f, 7);
  assert_true(pump(f, QUIET_MS));
  send_flush(f, 8);
  assert_true(pump(f, QUIET_MS));
  send_stop(f);
  pump(f, 2000);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  assert_true(f->stopped_notified);
  assert_int_equal(f->num_flush_acks, 2);
  assert_int_equal(f->flush_acks[0], 7);
  assert_int_equal(f->flush_acks[1], 8);

  check *c = calloc(1, sizeof(check));
  read_back(f, c);

  FILE *jf = fopen(json_path, "r");
  assert_non_null(jf);
  char json[65536];
  size_t jl = fread(json, 1, sizeof(json) - 1, jf);
  json[jl] = 0;
  fclose(jf);
  const char *total = strstr(json, "\"total\"");
  assert_non_null(total);
  long dropped = json_count(total, "\"packets_dropped\"");
  long events_dropped = json_count(total, "\"events_dropped\"");
  assert_int_equal(json_count(total, "\"packets_written\""), (long)c->packets);
  assert_int_equal(json_count(total, "\"events_written\""), (long)c->events);
  assert_int_equal(json_count(total, "\"chunks_committed\""), (long)f->num_chunks);
  assert_int_equal(json_count(total, "\"patches_sent\""), (long)f->patches);
  /* A packet abandoned mid-way leaves a drop marker; one dropped before it started does not. */
  assert_true((long)c->dropped_markers <= dropped);
  if (!sc->may_drop)
    assert_int_equal(dropped, 0);
  /* Every event of every writer exactly once, or counted as dropped (the seq checks above
   * already refused duplicates); the slice end written at finish may add one per writer. */
  size_t missing = 0;
  for (unsigned wr = 1; wr <= sc->writers; wr++)
    for (unsigned s = 0; s < sc->events; s++)
      missing += c->seen[wr][s] == 0;
  assert_true((long)missing <= events_dropped);
  assert_int_equal(c->events + (size_t)events_dropped,
                   (size_t)json_count(total, "\"events_written\"") + (size_t)events_dropped);
  assert_true(c->events + (size_t)events_dropped >= (size_t)sc->writers * sc->events);
  assert_true(c->events + (size_t)events_dropped <= (size_t)sc->writers * (sc->events + 1));
  if (sc->may_drop)
    print_message("SMB full: %ld packets and %ld events dropped, %zu drop markers\n", dropped,
                  events_dropped, c->dropped_markers);

  for (size_t i = 0; i < f->num_chunks; i++)
    free(f->chunks[i].data);
  free(c);
  munmap(f->smb, f->smb_size);
  close(f->memfd);
  close(f->fd);
  tr_frame_reader_free(&f->reader);
  free(f);
  close(lfd);
  unlink(sock_path);
  unlink(json_path);
  rmdir(dir);
}

/* Small packets, one chunk per page as the SDK: fragments end mid-chunk and continue. */
static void test_small_packets(void **state) {
  (void)state;
  run_loadgen(&(scenario){3, 1500, 0, 1, "20000", 2u << 20, false});
}

/* Packets larger than a chunk on 2-chunk pages: every packet spans chunks and its nested
 * sizes travel as patches. */
static void test_packets_spanning_chunks(void **state) {
  (void)state;
  run_loadgen(&(scenario){2, 300, 5000, 2, "2000", 4u << 20, false});
}

/* 14 chunks per page shared by four writers: page-word CAS races with the reader. */
static void test_shared_pages(void **state) {
  (void)state;
  run_loadgen(&(scenario){4, 800, 200, 14, "20000", 2u << 20, false});
}

/* A 32 KiB SMB and unpaced writers: packets are dropped, marked and counted, and what arrives
 * still parses and is accounted for. */
static void test_smb_full(void **state) {
  (void)state;
  run_loadgen(&(scenario){3, 1000, 1500, 1, "0", 32u << 10, true});
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_packets),
      cmocka_unit_test(test_packets_spanning_chunks),
      cmocka_unit_test(test_shared_pages),
      cmocka_unit_test(test_smb_full),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
