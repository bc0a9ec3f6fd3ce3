/* hostile_producer.c: a deliberately malicious Perfetto producer for test_hostile_producer.sh
 * (docs/security.md, "Producers"). It connects to an agent's producer socket and misbehaves in
 * one of these modes until the agent disconnects it:
 *   random-frames  after a valid BindService: honest-length frames of random bytes, random
 *                  InvokeMethod ids and args, BindService of other names, SetPeerIdentity
 *                  claims, frames without a request, empty frames;
 *   huge-sizes     a real session, then CommitData naming pages and chunks far out of range,
 *                  an emulated chunk over 64 KiB, patches at offsets near UINT32_MAX, a writer
 *                  id over 32767, a second InitializeConnection, each of which must be refused
 *                  on its own (the connection lives on), then chunks_to_move.data of 10 MiB
 *                  (declared frame size over 128 KiB); a second connection declares a payload
 *                  one byte over the limit right after BindService;
 *   corrupt-smb    a real session like the SDK's (setup_tracing with the SMB fd, start, writers
 *                  registered with the other producer's writer ids): the main thread fills
 *                  pages with packets and commits chunks it claims are complete while a second
 *                  thread flips chunk states, layout bits, chunk headers and fragment sizes;
 *   steal          a real session, then commits, emulated chunks and patches aimed at buffer
 *                  ids it was not given (it guesses 0..63), and writers registered to another
 *                  buffer than the one committed to; before that, patches on its own buffer
 *                  with the other producer's writer ids (allowed: they can only reach its own
 *                  chunks, so they must not change the other producer's packets);
 *   fd-flood       InitializeConnection offering a 1 GiB sealed memfd as its own SMB (must not
 *                  be adopted), then frames carrying 4 fds each (the most a message may carry),
 *                  then frames carrying 64 fds.
 * Packets written to the SMB carry TestEvent{str "hostile"} (TracePacket.for_testing, 900) and,
 * with --impersonate-pid, a forged trusted_pid (79), which the relay must drop.
 *
 * Prints one line per connection and exits 0 when the agent closed every connection it opened
 * (the expected outcome), 1 when a connection was still open at the deadline or the session
 * never started, 2 on bad usage. Only for tests: it makes no attempt to be a useful producer. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"

#define PAGE_HEADER 8u
#define CHUNK_HEADER 8u
#define LAYOUT_DIV4 3u
#define MAX_GUESSED_BUFFER 64u

static struct {
  const char *socket;
  const char *mode;
  const char *data_source;
  uint64_t seed;
  int timeout_ms;
  int32_t impersonate_pid;
  unsigned other_writers; /* the well-behaved producer's writer ids are 1..N */
} opt = {.data_source = "track_event", .timeout_ms = 15000, .other_writers = 2};

static uint64_t rng_state;
static uint64_t rnd(void) { /* splitmix64: reproducible from --seed */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- one connection ------------------------------------------------------------------------ */

typedef struct conn {
  int fd;
  int rx_fd; /* last fd received */
  bool closed; /* the agent closed it (EOF, reset, or a refused send) */
  tr_ipc_reader reader;
  uint64_t next_id;
  uint32_t service_id;
  uint32_t method_ids[TR_PM_COUNT];
  uint64_t frames_sent;
  uint64_t refusals; /* InvokeMethodReply success=false, RequestError */
  uint64_t async_id;
} conn;

static int conn_open(conn *c) {
  memset(c, 0, sizeof(*c));
  c->rx_fd = -1;
  c->next_id = 1;
  tr_ipc_reader_init(&c->reader);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(opt.socket) >= sizeof(addr.sun_path))
    return TR_ERR_INVAL;
  strcpy(addr.sun_path, opt.socket);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    return TR_ERR_SYS(errno);
  /* A send blocked on a full socket must not outlive the agent's decision to close. */
  struct timeval tv = {.tv_sec = 5};
  setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(c->fd, (struct sockaddr *)&addr, sizeof(addr)) != 0)
    return TR_ERR_SYS(errno);
  return 0;
}

static void conn_close(conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  if (c->rx_fd >= 0)
    close(c->rx_fd);
  c->fd = c->rx_fd = -1;
  tr_frame_reader_free(&c->reader);
}

/* Sends bytes, the fds attached to the first sendmsg. EPIPE or ECONNRESET: the agent closed
 * the connection; other errors (a send timeout, ETOOMANYREFS for fds in flight) are returned. */
static int send_raw(conn *c, const uint8_t *buf, size_t len, const int *fds, size_t nfds) {
  if (c->closed)
    return TR_ERR_CLOSED;
  size_t ctrl_len = nfds ? CMSG_SPACE(nfds * sizeof(int)) : 0;
  uint8_t *ctrl = nfds ? calloc(1, ctrl_len) : NULL;
  for (size_t off = 0; off < len;) {
    struct iovec iov = {.iov_base = (void *)(buf + off), .iov_len = len - off};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (ctrl && off == 0) {
      msg.msg_control = ctrl;
      msg.msg_controllen = ctrl_len;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
      memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int err = errno;
      free(ctrl);
      if (err != EPIPE && err != ECONNRESET)
        return TR_ERR_SYS(err);
      c->closed = true;
      return TR_ERR_CLOSED;
    }
    off += (size_t)n;
  }
  free(ctrl);
  c->frames_sent++;
  return 0;
}

static int send_frame(conn *c, const Perfetto__Protos__IPCFrame *f, const int *fds, size_t nfds) {
  uint8_t *buf;
  size_t len;
  int rc = tr_ipc_frame_encode(f, &buf, &len);
  if (rc < 0)
    return rc;
  rc = send_raw(c, buf, len, fds, nfds);
  free(buf);
  return rc;
}

/* A frame with an honest length header around `payload`. */
static int send_payload(conn *c, const uint8_t *payload, size_t len) {
  uint8_t *buf = malloc(len + 4);
  if (!buf)
    return TR_ERR_NOMEM;
  uint32_t n = (uint32_t)len;
  memcpy(buf, &n, 4); /* little-endian machines only, as the rest of tracerelay */
  memcpy(buf + 4, payload, len);
  int rc = send_raw(c, buf, len + 4, NULL, 0);
  free(buf);
  return rc;
}

static int invoke_raw(conn *c, uint32_t service_id, uint32_t method_id, const uint8_t *args,
                      size_t len, bool drop_reply, const int *fds, size_t nfds, uint64_t *id) {
  Perfetto__Protos__IPCFrame__InvokeMethod inv = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  inv.has_service_id = inv.has_method_id = inv.has_args_proto = inv.has_drop_reply = 1;
  inv.service_id = service_id;
  inv.method_id = method_id;
  inv.args_proto = (ProtobufCBinaryData){len, (uint8_t *)args};
  inv.drop_reply = drop_reply;
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = 1;
  f.request_id = c->next_id++;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  f.msg_invoke_method = &inv;
  if (id)
    *id = f.request_id;
  return send_frame(c, &f, fds, nfds);
}

static int invoke_fds(conn *c, int method, const ProtobufCMessage *args, bool drop_reply,
                      const int *fds, size_t nfds, uint64_t *id) {
  size_t len = protobuf_c_message_get_packed_size(args);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf)
    return TR_ERR_NOMEM;
  protobuf_c_message_pack(args, buf);
  int rc = invoke_raw(c, c->service_id, c->method_ids[method], buf, len, drop_reply, fds, nfds,
                      id);
  free(buf);
  return rc;
}

static int invoke(conn *c, int method, const ProtobufCMessage *args, uint64_t *id) {
  return invoke_fds(c, method, args, false, NULL, 0, id);
}

/* Receives for up to timeout_ms. 1 with *out (free with tr_ipc_frame_free), 0 on timeout,
 * TR_ERR_CLOSED once the agent closed the connection. */
static int next_frame(conn *c, int timeout_ms, Perfetto__Protos__IPCFrame **out) {
  uint64_t deadline = now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    const uint8_t *payload;
    size_t len;
    int rc = tr_frame_reader_next(&c->reader, &payload, &len);
    if (rc < 0)
      return rc;
    if (rc == 1) {
      *out = tr_ipc_frame_decode(payload, len);
      if (!*out)
        continue;
      if ((*out)->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_REQUEST_ERROR ||
          ((*out)->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY &&
           !(*out)->msg_invoke_method_reply->success))
        c->refusals++;
      return 1;
    }
    if (c->closed)
      return TR_ERR_CLOSED;
    uint64_t now = now_ms();
    int wait = now >= deadline ? 0 : (int)(deadline - now);
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    int n = poll(&pfd, 1, wait);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return 0;
    uint8_t *dst;
    size_t room;
    if (tr_frame_reader_space(&c->reader, &dst, &room) < 0)
      return TR_ERR_NOMEM;
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(sizeof(int))];
    } ctrl;
    struct iovec iov = {.iov_base = dst, .iov_len = room};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctrl.buf,
                         .msg_controllen = sizeof(ctrl.buf)};
    ssize_t got = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      c->closed = true;
      continue; /* frames already buffered go first */
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
          cm->cmsg_len == CMSG_LEN(sizeof(int))) {
        if (c->rx_fd >= 0)
          close(c->rx_fd);
        memcpy(&c->rx_fd, CMSG_DATA(cm), sizeof(int));
      }
    }
    tr_frame_reader_commit(&c->reader, (size_t)got);
  }
}

/* Reads and discards what arrived, without waiting. true if the agent closed. */
static bool drain(conn *c) {
  Perfetto__Protos__IPCFrame *f;
  int rc;
  while ((rc = next_frame(c, 0, &f)) == 1)
    tr_ipc_frame_free(f);
  return rc == TR_ERR_CLOSED || c->closed;
}

/* Waits for the agent to close the connection, discarding frames. */
static bool wait_closed(conn *c, int timeout_ms) {
  uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
  while (now_ms() < deadline) {
    Perfetto__Protos__IPCFrame *f;
    int rc = next_frame(c, 100, &f);
    if (rc == 1)
      tr_ipc_frame_free(f);
    else if (rc < 0)
      return rc == TR_ERR_CLOSED;
  }
  return false;
}

/* Waits for the reply to `id`; other frames are dropped. 1 success, 0 refused, <0 error. */
static int await_reply(conn *c, uint64_t id, Perfetto__Protos__IPCFrame **out) {
  uint64_t deadline = now_ms() + 5000;
  while (now_ms() < deadline) {
    Perfetto__Protos__IPCFrame *f;
    int rc = next_frame(c, 100, &f);
    if (rc < 0)
      return rc;
    if (rc == 0)
      continue;
    if (f->request_id != id) {
      tr_ipc_frame_free(f);
      continue;
    }
    bool ok = (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY &&
               f->msg_invoke_method_reply->success) ||
              (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY &&
               f->msg_bind_service_reply->success);
    if (out)
      *out = f;
    else
      tr_ipc_frame_free(f);
    return ok ? 1 : 0;
  }
  return TR_ERR_TIMEOUT;
}

static int bind_service(conn *c, const char *name, uint64_t *id_out) {
  Perfetto__Protos__IPCFrame__BindService b = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  b.service_name = (char *)name;
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = 1;
  f.request_id = c->next_id++;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  f.msg_bind_service = &b;
  if (id_out)
    *id_out = f.request_id;
  return send_frame(c, &f, NULL, 0);
}

static int bind_producer_port(conn *c) {
  uint64_t id;
  int rc = bind_service(c, "ProducerPort", &id);
  Perfetto__Protos__IPCFrame *f = NULL;
  if (rc == 0)
    rc = await_reply(c, id, &f);
  if (rc <= 0) {
    tr_ipc_frame_free(f);
    return rc < 0 ? rc : TR_ERR_PROTO;
  }
  const Perfetto__Protos__IPCFrame__BindServiceReply *r = f->msg_bind_service_reply;
  c->service_id = r->service_id;
  tr_ipc_producer_method_ids(r, c->method_ids);
  tr_ipc_frame_free(f);
  return 0;
}

/* The SDK's opening: InitializeConnection and GetAsyncCommand back to back, then
 * RegisterDataSource. `shm_fd` >= 0 offers it as the producer's own SMB. */
static int initialize(conn *c, const char *name, int shm_fd, uint32_t smb_hint,
                      bool *using_provided) {
  Perfetto__Protos__InitializeConnectionRequest req =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  req.producer_name = (char *)name;
  req.sdk_version = "hostile_producer";
  req.has_smb_scraping_mode = 1;
  req.smb_scraping_mode =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__PRODUCER_SMBSCRAPING_MODE__SMB_SCRAPING_ENABLED;
  if (shm_fd >= 0) {
    req.has_producer_provided_shmem = req.producer_provided_shmem = 1;
    req.has_shared_memory_size_hint_bytes = 1;
    req.shared_memory_size_hint_bytes = smb_hint;
    req.has_shared_memory_page_size_hint_bytes = 1;
    req.shared_memory_page_size_hint_bytes = 4096;
  }
  uint64_t init_id;
  int rc = invoke_fds(c, TR_PM_INITIALIZE_CONNECTION, &req.base, false,
                      shm_fd >= 0 ? &shm_fd : NULL, shm_fd >= 0 ? 1 : 0, &init_id);
  Perfetto__Protos__GetAsyncCommandRequest async = PERFETTO__PROTOS__GET_ASYNC_COMMAND_REQUEST__INIT;
  if (rc == 0)
    rc = invoke(c, TR_PM_GET_ASYNC_COMMAND, &async.base, &c->async_id);
  Perfetto__Protos__DataSourceDescriptor desc = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  desc.name = (char *)opt.data_source;
  desc.has_id = 1;
  desc.id = 0x4057113;
  Perfetto__Protos__RegisterDataSourceRequest reg =
      PERFETTO__PROTOS__REGISTER_DATA_SOURCE_REQUEST__INIT;
  reg.data_source_descriptor = &desc;
  if (rc == 0)
    rc = invoke(c, TR_PM_REGISTER_DATA_SOURCE, &reg.base, NULL);
  Perfetto__Protos__IPCFrame *f = NULL;
  if (rc == 0)
    rc = await_reply(c, init_id, &f);
  if (rc <= 0) {
    tr_ipc_frame_free(f);
    return rc < 0 ? rc : TR_ERR_PROTO;
  }
  const ProtobufCBinaryData *d = &f->msg_invoke_method_reply->reply_proto;
  Perfetto__Protos__InitializeConnectionResponse *r =
      perfetto__protos__initialize_connection_response__unpack(NULL, d->len, d->data);
  if (using_provided)
    *using_provided = r && r->using_shmem_provided_by_producer;
  perfetto__protos__initialize_connection_response__free_unpacked(r, NULL);
  tr_ipc_frame_free(f);
  return 0;
}

typedef struct session {
  int smb_fd;
  uint8_t *smb;
  size_t smb_size, page_size, num_pages;
  uint32_t target_buffer;
} session;

/* Waits for setup_tracing (with the SMB fd), setup_data_source and start_data_source. */
static int wait_started(conn *c, session *s, int timeout_ms) {
  memset(s, 0, sizeof(*s));
  s->smb_fd = -1;
  bool have_buffer = false;
  uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
  while (now_ms() < deadline) {
    Perfetto__Protos__IPCFrame *f;
    int rc = next_frame(c, 100, &f);
    if (rc < 0)
      return rc;
    if (rc == 0)
      continue;
    Perfetto__Protos__GetAsyncCommandResponse *cmd = NULL;
    if (f->request_id == c->async_id &&
        f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY &&
        f->msg_invoke_method_reply->success) {
      const ProtobufCBinaryData *d = &f->msg_invoke_method_reply->reply_proto;
      cmd = perfetto__protos__get_async_command_response__unpack(NULL, d->len, d->data);
    }
    tr_ipc_frame_free(f);
    if (!cmd)
      continue;
    bool started = false;
    switch (cmd->cmd_case) {
    case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING:
      s->page_size = (size_t)cmd->setup_tracing->shared_buffer_page_size_kb * 1024u;
      s->smb_fd = c->rx_fd;
      c->rx_fd = -1;
      break;
    case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_DATA_SOURCE:
      if (cmd->setup_data_source->config) {
        s->target_buffer = cmd->setup_data_source->config->target_buffer;
        have_buffer = true;
      }
      break;
    case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE:
      started = true;
      break;
    default:
      break;
    }
    perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
    if (!started)
      continue;
    struct stat st;
    if (s->smb_fd < 0 || !have_buffer || s->page_size == 0 || fstat(s->smb_fd, &st) < 0)
      return TR_ERR_PROTO;
    s->smb_size = (size_t)st.st_size;
    s->num_pages = s->smb_size / s->page_size;
    s->smb = mmap(NULL, s->smb_size, PROT_READ | PROT_WRITE, MAP_SHARED, s->smb_fd, 0);
    if (s->smb == MAP_FAILED || s->num_pages == 0) {
      s->smb = NULL;
      return TR_ERR_PROTO;
    }
    return 0;
  }
  return TR_ERR_TIMEOUT;
}

static void session_free(session *s) {
  if (s->smb)
    munmap(s->smb, s->smb_size);
  if (s->smb_fd >= 0)
    close(s->smb_fd);
}

static int register_writer(conn *c, uint32_t writer, uint32_t buffer) {
  Perfetto__Protos__RegisterTraceWriterRequest r =
      PERFETTO__PROTOS__REGISTER_TRACE_WRITER_REQUEST__INIT;
  r.has_trace_writer_id = r.has_target_buffer = 1;
  r.trace_writer_id = writer;
  r.target_buffer = buffer;
  return invoke(c, TR_PM_REGISTER_TRACE_WRITER, &r.base, NULL);
}

/* ---- packets and chunks -------------------------------------------------------------------- */

static size_t put_varint(uint8_t *p, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7)
    p[n++] = (uint8_t)(v | 0x80);
  p[n++] = (uint8_t)v;
  return n;
}

/* TracePacket {timestamp 8: ts, for_testing 900: TestEvent{str 1: "hostile"}} and, with
 * --impersonate-pid, trusted_pid 79 (a producer may not set it: the packet must be dropped). */
static size_t hostile_packet(uint8_t *p, uint64_t ts, bool forge) {
  size_t n = 0;
  n += put_varint(p + n, 8u << 3);
  n += put_varint(p + n, ts);
  if (forge && opt.impersonate_pid > 0) {
    n += put_varint(p + n, 79u << 3);
    n += put_varint(p + n, (uint64_t)opt.impersonate_pid);
  }
  static const uint8_t test_event[] = {0x0a, 7, 'h', 'o', 's', 't', 'i', 'l', 'e'};
  n += put_varint(p + n, 900u << 3 | 2u);
  n += put_varint(p + n, sizeof(test_event));
  memcpy(p + n, test_event, sizeof(test_event));
  return n + sizeof(test_event);
}

/* Fills `chunk` (size bytes, header included) with whole packets; returns the packet count. */
static uint16_t fill_chunk(uint8_t *chunk, size_t size, uint32_t chunk_id, uint16_t writer,
                           uint64_t *ts) {
  uint8_t pkt[64];
  size_t off = CHUNK_HEADER;
  uint16_t count = 0;
  for (;;) {
    size_t n = hostile_packet(pkt, (*ts)++, rnd() % 8 == 0);
    if (off + 1 + n > size || count == 1023)
      break;
    chunk[off++] = (uint8_t)n; /* n < 128: a one-byte size */
    memcpy(chunk + off, pkt, n);
    off += n;
    count++;
  }
  memcpy(chunk, &chunk_id, 4);
  memcpy(chunk + 4, &writer, 2);
  memcpy(chunk + 6, &count, 2);
  return count;
}

static size_t chunk_size_div4(size_t page_size) { return ((page_size - PAGE_HEADER) / 4u) & ~3ul; }

static uint32_t *page_word(session *s, size_t page) {
  return (uint32_t *)(s->smb + page * s->page_size);
}

/* ---- CommitData builders ------------------------------------------------------------------- */

typedef struct commit {
  Perfetto__Protos__CommitDataRequest req;
  Perfetto__Protos__CommitDataRequest__ChunksToMove moves[16], *move_ptrs[16];
  Perfetto__Protos__CommitDataRequest__ChunkToPatch patches[16], *patch_ptrs[16];
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch p[16][4], *p_ptrs[16][4];
} commit;

static void commit_init(commit *cm) {
  cm->req = (Perfetto__Protos__CommitDataRequest)PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  cm->req.chunks_to_move = cm->move_ptrs;
  cm->req.chunks_to_patch = cm->patch_ptrs;
}

static Perfetto__Protos__CommitDataRequest__ChunksToMove *add_move(commit *cm, uint32_t page,
                                                                   uint32_t chunk,
                                                                   uint32_t buffer) {
  size_t i = cm->req.n_chunks_to_move++;
  Perfetto__Protos__CommitDataRequest__ChunksToMove *m = &cm->moves[i];
  perfetto__protos__commit_data_request__chunks_to_move__init(m);
  m->has_page = m->has_chunk = m->has_target_buffer = 1;
  m->page = page;
  m->chunk = chunk;
  m->target_buffer = buffer;
  cm->move_ptrs[i] = m;
  return m;
}

/* A patch entry with n patches at `offset` (+4 each) of 4 bytes `data`. */
static Perfetto__Protos__CommitDataRequest__ChunkToPatch *
add_patch(commit *cm, uint32_t buffer, uint32_t writer, uint32_t chunk_id, uint32_t offset,
          size_t n, const uint8_t *data, size_t data_len) {
  size_t i = cm->req.n_chunks_to_patch++;
  Perfetto__Protos__CommitDataRequest__ChunkToPatch *e = &cm->patches[i];
  perfetto__protos__commit_data_request__chunk_to_patch__init(e);
  e->has_target_buffer = e->has_writer_id = e->has_chunk_id = 1;
  e->target_buffer = buffer;
  e->writer_id = writer;
  e->chunk_id = chunk_id;
  for (size_t k = 0; k < n && k < 4; k++) {
    Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *p = &cm->p[i][k];
    perfetto__protos__commit_data_request__chunk_to_patch__patch__init(p);
    p->has_offset = p->has_data = 1;
    p->offset = offset + 4u * (uint32_t)k;
    p->data = (ProtobufCBinaryData){data_len, (uint8_t *)data};
    cm->p_ptrs[i][k] = p;
  }
  e->n_patches = n < 4 ? n : 4;
  e->patches = cm->p_ptrs[i];
  cm->patch_ptrs[i] = e;
  return e;
}

static int send_commit(conn *c, commit *cm, uint64_t *id) {
  return invoke(c, TR_PM_COMMIT_DATA, &cm->req.base, id);
}

/* Sends `cm` and waits for its reply: 1 accepted, 0 refused, < 0 closed or error. */
static int commit_expect(conn *c, commit *cm) {
  uint64_t id;
  int rc = send_commit(c, cm, &id);
  return rc < 0 ? rc : await_reply(c, id, NULL);
}

/* ---- modes --------------------------------------------------------------------------------- */

static bool report(const char *what, conn *c, bool closed, uint64_t t0) {
  printf("hostile %s pid %d: %s after %llu frames sent, %llu refusals, %llu ms\n", what,
         (int)getpid(), closed ? "disconnected by the agent" : "STILL CONNECTED",
         (unsigned long long)c->frames_sent, (unsigned long long)c->refusals,
         (unsigned long long)(now_ms() - t0));
  fflush(stdout);
  return closed;
}

static int mode_random_frames(void) {
  conn c;
  uint64_t t0 = now_ms();
  if (conn_open(&c) < 0 || bind_producer_port(&c) < 0) {
    fprintf(stderr, "hostile_producer: cannot bind ProducerPort\n");
    return 1;
  }
  uint8_t buf[2048];
  uint64_t deadline = now_ms() + (uint64_t)opt.timeout_ms;
  while (!c.closed && now_ms() < deadline && c.frames_sent < 100000) {
    size_t len = (size_t)(rnd() % sizeof(buf));
    for (size_t i = 0; i < len; i++)
      buf[i] = (uint8_t)rnd();
    switch (rnd() % 8) {
    case 0: /* random bytes as the payload */
    case 1:
      send_payload(&c, buf, len);
      break;
    case 2:
    case 3:
    case 4: { /* a real InvokeMethod frame with any ids and random args */
      uint32_t svc = rnd() % 4 ? c.service_id : (uint32_t)rnd();
      uint32_t method = (uint32_t)(rnd() % 16);
      invoke_raw(&c, svc, method, buf, len % 512, rnd() % 2, NULL, 0, NULL);
      break;
    }
    case 5: { /* BindService of another name, or of garbage */
      char name[17];
      for (size_t i = 0; i < sizeof(name) - 1; i++)
        name[i] = (char)('A' + rnd() % 26);
      name[sizeof(name) - 1] = 0;
      static const char *const names[] = {"ConsumerPort", "RelayPort", "ProducerPort"};
      bind_service(&c, rnd() % 2 ? names[rnd() % 3] : name, NULL);
      break;
    }
    case 6: { /* an identity claim: root, pid 1 (must be ignored) */
      Perfetto__Protos__IPCFrame__SetPeerIdentity id =
          PERFETTO__PROTOS__IPCFRAME__SET_PEER_IDENTITY__INIT;
      id.has_pid = id.has_uid = 1;
      id.pid = 1;
      id.uid = 0;
      id.machine_name = "root-machine";
      Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
      f.has_request_id = 1;
      f.request_id = rnd();
      f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_SET_PEER_IDENTITY;
      f.set_peer_identity = &id;
      send_frame(&c, &f, NULL, 0);
      break;
    }
    default: { /* no request at all, or an empty frame */
      ProtobufCBinaryData t = {len % 64, buf};
      Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
      f.has_request_id = 1;
      f.request_id = rnd();
      f.n_data_for_testing = rnd() % 2;
      f.data_for_testing = &t;
      if (rnd() % 2)
        send_frame(&c, &f, NULL, 0);
      else
        send_payload(&c, buf, 0);
      break;
    }
    }
    if (c.frames_sent % 16 == 0)
      drain(&c);
  }
  bool closed = c.closed || wait_closed(&c, 5000);
  report("random-frames", &c, closed, t0);
  conn_close(&c);
  return closed ? 0 : 1;
}

/* Connects as a well-behaved producer named `name` and waits until the agent has set up and
 * started its data source, so the mode's attack meets a producer with a buffer. */
static int start_as_producer(conn *c, session *s, const char *name) {
  if (conn_open(c) < 0 || bind_producer_port(c) < 0 || initialize(c, name, -1, 0, NULL) < 0 ||
      wait_started(c, s, opt.timeout_ms) < 0) {
    fprintf(stderr, "hostile_producer: no session started\n");
    return -1;
  }
  return 0;
}

static int mode_huge_sizes(void) {
  conn c;
  session s;
  uint64_t t0 = now_ms();
  if (start_as_producer(&c, &s, "hostile-huge-sizes") < 0)
    return 1;
  const uint32_t B = s.target_buffer;
  static const uint8_t four[4] = {0xff, 0xff, 0xff, 0x7f};
  static const uint8_t five[5] = {1, 2, 3, 4, 5};
  struct {
    const char *what;
    commit cm;
  } *t = calloc(8, sizeof(*t));
  if (!t)
    return 1;
  size_t n = 0;
  commit_init(&t[n].cm), t[n].what = "page UINT32_MAX";
  add_move(&t[n++].cm, UINT32_MAX, 0, B);
  commit_init(&t[n].cm), t[n].what = "page 1<<20, chunk 200";
  add_move(&t[n++].cm, 1u << 20, 200, B);
  commit_init(&t[n].cm), t[n].what = "chunk UINT32_MAX";
  add_move(&t[n++].cm, 0, UINT32_MAX, B);
  static uint8_t big[100 * 1024];
  uint16_t w = 1;
  memcpy(big + 4, &w, 2);
  commit_init(&t[n].cm), t[n].what = "emulated chunk of 100 KiB";
  add_move(&t[n].cm, 0, 0, B)->has_data = 1;
  t[n++].cm.moves[0].data = (ProtobufCBinaryData){sizeof(big), big};
  commit_init(&t[n].cm), t[n].what = "patch offsets near UINT32_MAX";
  add_patch(&t[n++].cm, B, 1, UINT32_MAX, UINT32_MAX - 11u, 3, four, 4);
  commit_init(&t[n].cm), t[n].what = "patch data of 5 bytes";
  add_patch(&t[n++].cm, B, 1, 0, 0, 1, five, 5);
  commit_init(&t[n].cm), t[n].what = "writer id 70000";
  add_patch(&t[n++].cm, B, 70000, 0, 0, 1, four, 4);
  bool ok = true;
  for (size_t i = 0; i < n; i++) {
    int rc = commit_expect(&c, &t[i].cm);
    if (rc != 0) {
      printf("hostile huge-sizes: CommitData with %s: %s\n", t[i].what,
             rc == 1 ? "ACCEPTED" : "no answer (connection closed)");
      ok = false;
    }
  }
  free(t);
  uint64_t id;
  Perfetto__Protos__InitializeConnectionRequest again =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  again.has_shared_memory_size_hint_bytes = 1;
  again.shared_memory_size_hint_bytes = UINT32_MAX;
  if (invoke(&c, TR_PM_INITIALIZE_CONNECTION, &again.base, &id) < 0 ||
      await_reply(&c, id, NULL) != 0) {
    printf("hostile huge-sizes: a second InitializeConnection was not refused\n");
    ok = false;
  }
  printf("hostile huge-sizes: %llu refusals so far, connection %s\n",
         (unsigned long long)c.refusals, c.closed ? "closed" : "open");

  /* CommitData{chunks_to_move {data: 10 MiB}}: packed by hand, the encoder refuses it. */
  const size_t big_len = 10u << 20;
  uint8_t *huge = calloc(1, big_len);
  if (!huge)
    return 1;
  commit cm;
  commit_init(&cm);
  Perfetto__Protos__CommitDataRequest__ChunksToMove *m = add_move(&cm, 0, 0, B);
  m->has_data = 1;
  m->data = (ProtobufCBinaryData){big_len, huge};
  size_t args_len = protobuf_c_message_get_packed_size(&cm.req.base);
  uint8_t *args = malloc(args_len);
  if (!args)
    return 1;
  protobuf_c_message_pack(&cm.req.base, args);
  Perfetto__Protos__IPCFrame__InvokeMethod inv = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  inv.has_service_id = inv.has_method_id = inv.has_args_proto = 1;
  inv.service_id = c.service_id;
  inv.method_id = c.method_ids[TR_PM_COMMIT_DATA];
  inv.args_proto = (ProtobufCBinaryData){args_len, args};
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = 1;
  f.request_id = c.next_id++;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  f.msg_invoke_method = &inv;
  size_t flen = perfetto__protos__ipcframe__get_packed_size(&f);
  uint8_t *frame = malloc(flen + 4);
  if (!frame)
    return 1;
  uint32_t hdr = (uint32_t)flen;
  memcpy(frame, &hdr, 4);
  perfetto__protos__ipcframe__pack(&f, frame + 4);
  send_raw(&c, frame, flen + 4, NULL, 0); /* fails part-way once the agent closes */
  free(frame);
  free(args);
  free(huge);
  bool closed = wait_closed(&c, 5000);
  ok = report("huge-sizes (10 MiB chunk data)", &c, closed, t0) && ok;
  session_free(&s);
  conn_close(&c);

  /* A second connection: a payload one byte over the limit, right after BindService. */
  t0 = now_ms();
  if (conn_open(&c) < 0 || bind_producer_port(&c) < 0)
    return 1;
  uint8_t hdr2[4 + 64] = {0};
  hdr = TR_IPC_MAX_PAYLOAD + 1;
  memcpy(hdr2, &hdr, 4);
  send_raw(&c, hdr2, sizeof(hdr2), NULL, 0);
  closed = wait_closed(&c, 5000);
  ok = report("huge-sizes (declared 131069-byte payload)", &c, closed, t0) && ok;
  conn_close(&c);
  return ok ? 0 : 1;
}

/* corrupt-smb: the corrupter thread. */
static atomic_bool stop_corrupting;
static session *corrupt_target;

static void *corrupter(void *arg) {
  (void)arg;
  session *s = corrupt_target;
  size_t csize = chunk_size_div4(s->page_size);
  uint64_t x = rnd();
  while (!atomic_load(&stop_corrupting)) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    size_t page = (size_t)(x >> 33) % s->num_pages;
    uint32_t *word = page_word(s, page);
    uint8_t *chunk = s->smb + page * s->page_size + PAGE_HEADER + ((x >> 20) % 4) * csize;
    switch ((x >> 12) % 6) {
    case 0: /* a chunk's state bits */
      __atomic_xor_fetch(word, (uint32_t)((x >> 40) & 3u) << (2u * ((x >> 45) % 14)),
                         __ATOMIC_SEQ_CST);
      break;
    case 1: /* layout bits, including the reserved layouts 6 and 7 */
      __atomic_xor_fetch(word, (uint32_t)((x >> 40) & 7u) << 28, __ATOMIC_SEQ_CST);
      break;
    case 2: /* chunk header: id, writer id, count and flags */
      __atomic_store_n((uint32_t *)(chunk + 4 * ((x >> 50) % 2)), (uint32_t)(x >> 16),
                       __ATOMIC_RELAXED);
      break;
    case 3: /* a fragment size byte */
      __atomic_store_n(chunk + CHUNK_HEADER + (x >> 40) % 32, (uint8_t)(x >> 24), __ATOMIC_RELAXED);
      break;
    case 4: /* the whole page word */
      __atomic_store_n(word, (uint32_t)(x >> 24), __ATOMIC_SEQ_CST);
      break;
    default: /* the reserved word */
      __atomic_store_n(word + 1, (uint32_t)(x >> 8), __ATOMIC_RELAXED);
      break;
    }
    if ((x & 0xff) == 0)
      usleep(50);
  }
  return NULL;
}

static int mode_corrupt_smb(void) {
  conn c;
  session s;
  uint64_t t0 = now_ms();
  if (start_as_producer(&c, &s, "hostile-corrupt-smb") < 0)
    return 1;
  printf("hostile corrupt-smb: SMB %zu bytes, %zu pages of %zu, buffer %u\n", s.smb_size,
         s.num_pages, s.page_size, s.target_buffer);
  /* The other producer's writer ids: ours are a separate sequence, whatever the ids. */
  for (uint32_t w = 1; w <= opt.other_writers; w++)
    register_writer(&c, w, s.target_buffer);
  corrupt_target = &s;
  pthread_t th;
  pthread_create(&th, NULL, corrupter, NULL);
  size_t csize = chunk_size_div4(s.page_size);
  uint32_t chunk_ids[3] = {0, 0, 0};
  uint64_t ts = 1, commits = 0;
  uint64_t deadline = now_ms() + (uint64_t)opt.timeout_ms;
  for (size_t it = 0; !c.closed && now_ms() < deadline; it++) {
    size_t page = it % s.num_pages;
    uint32_t *word = page_word(&s, page);
    /* Take the page whatever its state, as if we owned it: Div4, all BeingWritten. */
    __atomic_store_n(word, LAYOUT_DIV4 << 28 | 0x55u, __ATOMIC_SEQ_CST);
    commit cm;
    commit_init(&cm);
    for (uint32_t k = 0; k < 4; k++) {
      uint8_t *chunk = s.smb + page * s.page_size + PAGE_HEADER + k * csize;
      uint16_t writer = (uint16_t)(1 + (it + k) % 2);
      fill_chunk(chunk, csize, chunk_ids[writer]++, writer, &ts);
      add_move(&cm, (uint32_t)page, k, s.target_buffer);
    }
    /* "Complete", all four, in one store: the corrupter may already have changed the page. */
    __atomic_store_n(word, LAYOUT_DIV4 << 28 | 0xffu, __ATOMIC_SEQ_CST);
    if (send_commit(&c, &cm, NULL) < 0)
      break;
    commits++;
    drain(&c);
    usleep(500); /* keeps our data a small part of the shared buffer */
  }
  atomic_store(&stop_corrupting, true);
  pthread_join(th, NULL);
  bool closed = c.closed || wait_closed(&c, 5000);
  printf("hostile corrupt-smb: %llu CommitData frames of 4 chunks\n", (unsigned long long)commits);
  report("corrupt-smb", &c, closed, t0);
  session_free(&s);
  conn_close(&c);
  return closed ? 0 : 1;
}

static int mode_steal(void) {
  conn c;
  session s;
  uint64_t t0 = now_ms();
  if (start_as_producer(&c, &s, "hostile-steal") < 0)
    return 1;
  const uint32_t B = s.target_buffer;
  printf("hostile steal: given buffer %u\n", B);
  bool ok = true;
  static const uint8_t drop_size[4] = {0xff, 0xff, 0xff, 0x7f};
  /* 1. Patches on our own buffer with the other producer's writer ids: accepted, but keyed by
   *    our producer, so the other producer's chunks 0..15 stay as they are. */
  for (uint32_t w = 1; w <= opt.other_writers; w++) {
    for (uint32_t id = 0; id < 16; id += 4) {
      commit cm;
      commit_init(&cm);
      for (uint32_t k = 0; k < 4; k++)
        add_patch(&cm, B, w, id + k, 0, 1, drop_size, 4)->has_more_patches = 0;
      send_commit(&c, &cm, NULL);
    }
  }
  /* 2. An emulated chunk that looks like the other producer's writer 1, chunk 0, into our own
   *    buffer: ours too. */
  uint8_t fake[256] = {0};
  uint64_t ts = 1;
  fill_chunk(fake, sizeof(fake), 0, 1, &ts);
  commit cm;
  commit_init(&cm);
  add_move(&cm, 0, 0, B)->has_data = 1;
  cm.moves[0].data = (ProtobufCBinaryData){sizeof(fake), fake};
  send_commit(&c, &cm, NULL);
  /* 3. Writer 3 registered to another buffer, committed to ours: refused. */
  register_writer(&c, 3, B + 1);
  uint8_t fake3[256] = {0};
  fill_chunk(fake3, sizeof(fake3), 0, 3, &ts);
  commit_init(&cm);
  add_move(&cm, 0, 0, B)->has_data = 1;
  cm.moves[0].data = (ProtobufCBinaryData){sizeof(fake3), fake3};
  if (commit_expect(&c, &cm) != 0) {
    printf("hostile steal: writer registered to buffer %u committed to %u: ACCEPTED\n", B + 1, B);
    ok = false;
  }
  /* 4. Guessed buffers: an SMB chunk, an emulated chunk and a patch aimed at each one. */
  size_t csize = chunk_size_div4(s.page_size);
  uint32_t chunk_id = 1;
  for (uint32_t g = 0; g < MAX_GUESSED_BUFFER && !c.closed; g++) {
    if (g == B)
      continue;
    uint32_t *word = page_word(&s, 0);
    __atomic_store_n(word, LAYOUT_DIV4 << 28 | 0x1u, __ATOMIC_SEQ_CST);
    fill_chunk(s.smb + PAGE_HEADER, csize, chunk_id++, 1, &ts);
    __atomic_store_n(word, LAYOUT_DIV4 << 28 | 0x3u, __ATOMIC_SEQ_CST);
    commit_init(&cm);
    add_move(&cm, 0, 0, g);
    int rc = commit_expect(&c, &cm);
    commit_init(&cm);
    add_move(&cm, 0, 0, g)->has_data = 1;
    cm.moves[0].data = (ProtobufCBinaryData){sizeof(fake), fake};
    int rc2 = rc < 0 ? rc : commit_expect(&c, &cm);
    commit_init(&cm);
    add_patch(&cm, g, 1 + g % opt.other_writers, g % 8, 0, 1, drop_size, 4);
    int rc3 = rc2 < 0 ? rc2 : commit_expect(&c, &cm);
    if (rc == 1 || rc2 == 1 || rc3 == 1) {
      printf("hostile steal: buffer %u (not given) ACCEPTED a commit (%d %d %d)\n", g, rc, rc2,
             rc3);
      ok = false;
    }
  }
  bool closed = c.closed || wait_closed(&c, 5000);
  ok = report("steal", &c, closed, t0) && ok;
  session_free(&s);
  conn_close(&c);
  return ok ? 0 : 1;
}

static int mode_fd_flood(void) {
  conn c;
  uint64_t t0 = now_ms();
  if (conn_open(&c) < 0 || bind_producer_port(&c) < 0) {
    fprintf(stderr, "hostile_producer: cannot bind ProducerPort\n");
    return 1;
  }
  /* Our "own SMB": a sealed memfd of 1 GiB (sparse), far over any valid size. */
  int mfd = memfd_create("hostile-smb", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (mfd < 0 || ftruncate(mfd, 1l << 30) < 0 ||
      fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
    perror("hostile_producer: memfd");
    return 1;
  }
  bool adopted = true;
  int rc = initialize(&c, "hostile-fd-flood", mfd, UINT32_MAX, &adopted);
  close(mfd);
  if (rc < 0) {
    fprintf(stderr, "hostile_producer: InitializeConnection failed\n");
    return 1;
  }
  bool ok = !adopted;
  printf("hostile fd-flood: a 1 GiB SMB of its own was %s\n", adopted ? "ADOPTED" : "refused");
  int fds[64];
  for (size_t i = 0; i < 64; i++)
    fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  Perfetto__Protos__SyncRequest sync = PERFETTO__PROTOS__SYNC_REQUEST__INIT;
  /* 4 fds on every frame: allowed one frame at a time, each replaces the last one held. */
  for (int i = 0; i < 500 && !c.closed; i++) {
    invoke_fds(&c, TR_PM_SYNC, &sync.base, true, fds, 4, NULL);
    if (i % 16 == 0)
      drain(&c);
  }
  bool closed_early = c.closed || drain(&c);
  printf("hostile fd-flood: 500 frames with 4 fds each: connection %s\n",
         closed_early ? "closed" : "open");
  /* Then 64 on every frame. */
  for (int i = 0; i < 100 && !c.closed; i++)
    invoke_fds(&c, TR_PM_SYNC, &sync.base, true, fds, 64, NULL);
  bool closed = c.closed || wait_closed(&c, 5000);
  for (size_t i = 0; i < 64; i++)
    close(fds[i]);
  ok = report("fd-flood", &c, closed, t0) && ok;
  conn_close(&c);
  return ok ? 0 : 1;
}

static const char kUsage[] =
    "usage: hostile_producer --socket PATH --mode MODE [--seed N] [--timeout-ms MS]\n"
    "         [--data-source NAME] [--other-writers N] [--impersonate-pid PID]\n"
    "MODE: random-frames, huge-sizes, corrupt-smb, steal, fd-flood (see the source)\n";

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, 's'},      {"mode", required_argument, NULL, 'm'},
      {"seed", required_argument, NULL, 'r'},        {"timeout-ms", required_argument, NULL, 't'},
      {"data-source", required_argument, NULL, 'd'}, {"other-writers", required_argument, NULL, 'w'},
      {"impersonate-pid", required_argument, NULL, 'p'}, {NULL, 0, NULL, 0}};
  int ch;
  opt.seed = (uint64_t)time(NULL) ^ (uint64_t)getpid();
  while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (ch) {
    case 's': opt.socket = optarg; break;
    case 'm': opt.mode = optarg; break;
    case 'r': opt.seed = strtoull(optarg, NULL, 0); break;
    case 't': opt.timeout_ms = atoi(optarg); break;
    case 'd': opt.data_source = optarg; break;
    case 'w': opt.other_writers = (unsigned)atoi(optarg); break;
    case 'p': opt.impersonate_pid = atoi(optarg); break;
    default: fputs(kUsage, stderr); return 2;
    }
  }
  if (!opt.socket || !opt.mode || opt.timeout_ms <= 0 || opt.other_writers == 0) {
    fputs(kUsage, stderr);
    return 2;
  }
  rng_state = opt.seed;
  printf("hostile %s pid %d: seed %llu\n", opt.mode, (int)getpid(), (unsigned long long)opt.seed);
  fflush(stdout);
  static const struct {
    const char *name;
    int (*fn)(void);
  } modes[] = {{"random-frames", mode_random_frames}, {"huge-sizes", mode_huge_sizes},
               {"corrupt-smb", mode_corrupt_smb},     {"steal", mode_steal},
               {"fd-flood", mode_fd_flood}};
  for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
    if (strcmp(opt.mode, modes[i].name) == 0)
      return modes[i].fn();
  fputs(kUsage, stderr);
  return 2;
}
