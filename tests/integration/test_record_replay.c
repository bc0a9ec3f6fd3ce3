/* test_record_replay.c: the built `tracerelay record` against a fake service that answers
 * with the replies traced really sent to the perfetto CLI (tests/vectors/ipc/consumer-cli*).
 *
 * The fake service listens on a temporary socket, reads the CLI's frames and, for each request,
 * sends the recorded replies to the recorded request of the same kind (request ids rewritten).
 * Checked: the requests decode to the recorded methods and trace_config (minus the fields the
 * perfetto CLI adds), and the trace file holds exactly the packets of the recorded ReadBuffers
 * slices (consumer-cli-relay streams them over six has_more replies). Also: Ctrl-C sends
 * Flush(0, perfetto_cmd|trace-stop) then DisableTracing and still writes the trace, an
 * error in the EnableTracing reply makes the exit status 1, and a read-back the service never
 * answers ends after --read-timeout. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "perfetto/config/trace_config.pb-c.h"
#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_frame.h"

typedef Perfetto__Protos__IPCFrame IPCFrame;

enum { ENABLE = 1, DISABLE = 2, READ_BUFFERS = 3, FLUSH = 5, GET_TRACE_STATS = 10 };
enum mode { REPLAY, STOP_WITH_SIGINT, SESSION_ERROR, SILENT_READ };
#define MAX_FRAMES 64

typedef struct frames {
  IPCFrame *f[MAX_FRAMES];
  size_t n;
} frames;

typedef struct fake_service {
  enum mode mode;
  int listen_fd;
  pid_t cli;
  frames to_service; /* recorded */
  frames to_consumer; /* recorded */
  frames got;         /* what the CLI sent, GetTraceStats aside */
  int stats_requests; /* GetTraceStats the CLI sent */
} fake_service;

static char tmpdir[64];

/* ---- helpers ---- */

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static void load_frames(const char *capture, const char *dir, frames *out) {
  char path[512];
  size_t len, off = 0;
  snprintf(path, sizeof path, "%s/ipc/%s.%s.bin", TR_VECTORS_DIR, capture, dir);
  uint8_t *bin = read_file(path, &len);
  out->n = 0;
  while (off + 4 <= len) {
    uint32_t n = bin[off] | bin[off + 1] << 8 | bin[off + 2] << 16 | (uint32_t)bin[off + 3] << 24;
    assert_true(n <= len - off - 4 && out->n < MAX_FRAMES);
    out->f[out->n] = tr_ipc_frame_decode(bin + off + 4, n);
    assert_non_null(out->f[out->n]);
    out->n++;
    off += 4 + n;
  }
  free(bin);
}

static void free_frames(frames *fr) {
  for (size_t i = 0; i < fr->n; i++)
    tr_ipc_frame_free(fr->f[i]);
  fr->n = 0;
}

/* The frames a session's run kept: what the CLI sent, and the recording replayed. */
static void free_session(fake_service *s) {
  free_frames(&s->got);
  free_frames(&s->to_service);
  free_frames(&s->to_consumer);
}

static uint32_t method_of(const IPCFrame *f) {
  return f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD
             ? f->msg_invoke_method->method_id
             : 0; /* BindService */
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

/* Sends f with another request id (f itself is left as it was: recordings are reused). */
static void send_frame(int fd, IPCFrame *f, uint64_t request_id) {
  uint8_t *buf;
  size_t len;
  uint64_t recorded_id = f->request_id;
  f->has_request_id = 1;
  f->request_id = request_id;
  assert_int_equal(tr_ipc_frame_encode(f, &buf, &len), 0);
  f->request_id = recorded_id;
  assert_int_equal(write(fd, buf, len), (ssize_t)len);
  free(buf);
}

/* Sends the recorded replies to the recorded request of the same kind as `req`. */
static void send_recorded_replies(fake_service *s, int fd, const IPCFrame *req) {
  uint64_t recorded_id = 0;
  for (size_t i = 0; i < s->to_service.n && !recorded_id; i++)
    if (s->to_service.f[i]->msg_case == req->msg_case && method_of(s->to_service.f[i]) == method_of(req))
      recorded_id = s->to_service.f[i]->request_id;
  assert_true(recorded_id != 0);
  for (size_t i = 0; i < s->to_consumer.n; i++)
    if (s->to_consumer.f[i]->request_id == recorded_id)
      send_frame(fd, s->to_consumer.f[i], req->request_id);
}

/* A reply of our own: success with reply_proto bytes. */
static void send_reply(int fd, uint64_t request_id, const ProtobufCMessage *reply) {
  Perfetto__Protos__IPCFrame__InvokeMethodReply r =
      PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD_REPLY__INIT;
  uint8_t buf[256];
  r.has_success = r.has_has_more = r.has_reply_proto = 1;
  r.success = 1;
  r.reply_proto.len = reply ? protobuf_c_message_pack(reply, buf) : 0;
  r.reply_proto.data = buf;
  IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY;
  f.msg_invoke_method_reply = &r;
  send_frame(fd, &f, request_id);
}

static void *serve(void *arg) {
  fake_service *s = arg;
  int fd = accept(s->listen_fd, NULL, NULL);
  assert_true(fd >= 0);
  uint64_t enable_id = 0;
  for (;;) {
    uint8_t hdr[4];
    if (read_full(fd, hdr, 4) < 0)
      break; /* the CLI closed the connection */
    uint32_t n = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (uint32_t)hdr[3] << 24;
    assert_true(n <= TR_IPC_MAX_PAYLOAD);
    uint8_t *payload = malloc(n + 1);
    assert_int_equal(read_full(fd, payload, n), 0);
    IPCFrame *req = tr_ipc_frame_decode(payload, n);
    free(payload);
    assert_non_null(req);
    uint32_t method = method_of(req);
    if (method == GET_TRACE_STATS) {
      /* The CLI's progress asks for stats (the perfetto CLI does not): answered empty, and
       * kept out of the requests compared with the perfetto CLI's. */
      Perfetto__Protos__GetTraceStatsResponse resp = PERFETTO__PROTOS__GET_TRACE_STATS_RESPONSE__INIT;
      send_reply(fd, req->request_id, &resp.base);
      s->stats_requests++;
      tr_ipc_frame_free(req);
      continue;
    }
    assert_true(s->got.n < MAX_FRAMES);
    s->got.f[s->got.n++] = req;
    if (method == ENABLE && s->mode == STOP_WITH_SIGINT) {
      enable_id = req->request_id; /* answered when the session is disabled */
      kill(s->cli, SIGINT);
    } else if (method == ENABLE && s->mode == SESSION_ERROR) {
      Perfetto__Protos__EnableTracingResponse resp =
          PERFETTO__PROTOS__ENABLE_TRACING_RESPONSE__INIT;
      resp.error = "buffer size over the limit";
      send_reply(fd, req->request_id, &resp.base);
    } else if (method == READ_BUFFERS && s->mode == SILENT_READ) {
      /* a service too busy to answer: no reply, the connection open */
    } else if (method == FLUSH) {
      send_reply(fd, req->request_id, NULL);
    } else if (method == DISABLE) {
      send_reply(fd, req->request_id, NULL);
      IPCFrame fake_enable = {.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD};
      Perfetto__Protos__IPCFrame__InvokeMethod im = {.method_id = ENABLE};
      fake_enable.msg_invoke_method = &im;
      fake_enable.request_id = enable_id;
      send_recorded_replies(s, fd, &fake_enable);
    } else {
      send_recorded_replies(s, fd, req);
    }
  }
  close(fd);
  return NULL;
}

/* ---- expectations from the recordings ---- */

static void clear_scalar(ProtobufCMessage *m, const char *name) {
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
  assert_non_null(f);
  *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 0;
}

/* The packed trace_config of an EnableTracing request frame, without the perfetto CLI's own
 * fields (guardrails flag, statsd metadata and logging, uuid). */
static uint8_t *packed_config(const IPCFrame *f, size_t *len) {
  assert_int_equal(method_of(f), ENABLE);
  Perfetto__Protos__EnableTracingRequest *req = perfetto__protos__enable_tracing_request__unpack(
      NULL, f->msg_invoke_method->args_proto.len, f->msg_invoke_method->args_proto.data);
  assert_non_null(req);
  assert_non_null(req->trace_config);
  ProtobufCMessage *cfg = &req->trace_config->base;
  clear_scalar(cfg, "enable_extra_guardrails");
  clear_scalar(cfg, "trace_uuid_msb");
  clear_scalar(cfg, "trace_uuid_lsb");
  clear_scalar(cfg, "statsd_logging");
  if (req->trace_config->statsd_metadata) {
    protobuf_c_message_free_unpacked(&req->trace_config->statsd_metadata->base, NULL);
    req->trace_config->statsd_metadata = NULL;
  }
  *len = protobuf_c_message_get_packed_size(cfg);
  uint8_t *out = malloc(*len + 1);
  protobuf_c_message_pack(cfg, out);
  perfetto__protos__enable_tracing_request__free_unpacked(req, NULL);
  return out;
}

/* The trace file the recorded ReadBuffers replies make: every packet of the slices as a
 * `0x0A varint(len) packet` record. */
static uint8_t *expected_trace(const frames *to_service, const frames *to_consumer, size_t *len) {
  uint64_t read_id = 0;
  for (size_t i = 0; i < to_service->n; i++)
    if (method_of(to_service->f[i]) == READ_BUFFERS)
      read_id = to_service->f[i]->request_id;
  size_t cap = 1 << 20, n = 0, pkt_start = 0;
  uint8_t *out = malloc(cap), *pkt = malloc(cap);
  size_t replies = 0;
  for (size_t i = 0; i < to_consumer->n; i++) {
    const IPCFrame *f = to_consumer->f[i];
    if (f->request_id != read_id)
      continue;
    replies++;
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *r = f->msg_invoke_method_reply;
    Perfetto__Protos__ReadBuffersResponse *resp = perfetto__protos__read_buffers_response__unpack(
        NULL, r->reply_proto.len, r->reply_proto.data);
    assert_non_null(resp);
    for (size_t k = 0; k < resp->n_slices; k++) {
      const Perfetto__Protos__ReadBuffersResponse__Slice *sl = resp->slices[k];
      assert_true(pkt_start + sl->data.len <= cap);
      memcpy(pkt + pkt_start, sl->data.data, sl->data.len);
      pkt_start += sl->data.len;
      if (!sl->last_slice_for_packet)
        continue;
      assert_true(n + pkt_start + 11 <= cap);
      out[n++] = 0x0a;
      for (uint64_t v = pkt_start;; v >>= 7) {
        out[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        if (v <= 0x7f)
          break;
      }
      memcpy(out + n, pkt, pkt_start);
      n += pkt_start;
      pkt_start = 0;
    }
    perfetto__protos__read_buffers_response__free_unpacked(resp, NULL);
  }
  assert_true(replies >= 1);
  free(pkt);
  *len = n;
  return out;
}

/* ---- running the CLI ---- */

static pid_t spawn_cli(const char *sock, const char *config, const char *out, const char *log,
                       const char *extra) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execl(TR_BIN_DIR "/tracerelay", "tracerelay", "record", "--socket", sock, "-c", config, "-o",
          out, extra, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Runs one session against the fake service; returns the CLI's exit status. */
static int run_session(fake_service *s, const char *capture, char *log, size_t loglen) {
  char sock[128], config[512], out[128], logpath[128];
  snprintf(sock, sizeof sock, "%s/consumer.sock", tmpdir);
  snprintf(config, sizeof config, "%s/ipc/%s.config.pbtxt", TR_VECTORS_DIR, capture);
  snprintf(out, sizeof out, "%s/out.pftrace", tmpdir);
  snprintf(logpath, sizeof logpath, "%s/cli.log", tmpdir);
  unlink(sock);
  load_frames(capture, "to-service", &s->to_service);
  load_frames(capture, "to-consumer", &s->to_consumer);

  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  strcpy(addr.sun_path, sock);
  s->listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
  assert_int_equal(bind(s->listen_fd, (struct sockaddr *)&addr, sizeof addr), 0);
  assert_int_equal(listen(s->listen_fd, 1), 0);
  s->cli = spawn_cli(sock, config, out, logpath,
                     s->mode == SILENT_READ ? "--read-timeout=300ms" : NULL);
  pthread_t thread;
  assert_int_equal(pthread_create(&thread, NULL, serve, s), 0);
  int wstatus;
  assert_int_equal(waitpid(s->cli, &wstatus, 0), s->cli);
  pthread_join(thread, NULL);
  close(s->listen_fd);

  size_t n;
  char *text = (char *)read_file(logpath, &n);
  snprintf(log, loglen, "%.*s", (int)n, text);
  free(text);
  assert_true(WIFEXITED(wstatus));
  return WEXITSTATUS(wstatus);
}

static void check_enable_request(const fake_service *s, const IPCFrame *got) {
  const IPCFrame *recorded = NULL;
  for (size_t i = 0; i < s->to_service.n && !recorded; i++)
    if (method_of(s->to_service.f[i]) == ENABLE)
      recorded = s->to_service.f[i];
  size_t got_len, want_len;
  uint8_t *got_cfg = packed_config(got, &got_len);
  uint8_t *want_cfg = packed_config(recorded, &want_len);
  assert_int_equal(got_len, want_len);
  assert_memory_equal(got_cfg, want_cfg, got_len);
  assert_int_equal(got->msg_invoke_method->args_proto.len > 0, 1);
  free(got_cfg);
  free(want_cfg);
}

static void check_trace_file(const fake_service *s) {
  char out[128];
  size_t got_len, want_len;
  snprintf(out, sizeof out, "%s/out.pftrace", tmpdir);
  uint8_t *got = read_file(out, &got_len);
  uint8_t *want = expected_trace(&s->to_service, &s->to_consumer, &want_len);
  assert_true(want_len > 1000);
  assert_int_equal(got_len, want_len);
  assert_memory_equal(got, want, want_len);
  free(got);
  free(want);
}

static void replay(const char *capture) {
  fake_service s = {.mode = REPLAY};
  char log[4096];
  int status = run_session(&s, capture, log, sizeof log);
  if (status != 0)
    fail_msg("tracerelay record exited %d:\n%s", status, log);
  /* The same requests as the perfetto CLI: BindService, EnableTracing, ReadBuffers. */
  assert_int_equal(s.got.n, 3);
  assert_int_equal(s.got.f[0]->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE);
  assert_string_equal(s.got.f[0]->msg_bind_service->service_name, "ConsumerPort");
  assert_int_equal(method_of(s.got.f[1]), ENABLE);
  check_enable_request(&s, s.got.f[1]);
  assert_int_equal(method_of(s.got.f[2]), READ_BUFFERS);
  assert_int_equal(s.got.f[2]->msg_invoke_method->args_proto.len, 0);
  check_trace_file(&s);
  free_session(&s);
}

static void test_replay_consumer_cli(void **state) {
  (void)state;
  replay("consumer-cli");
}

/* Six ReadBuffers replies with has_more, packets split across slices. */
static void test_replay_consumer_cli_relay(void **state) {
  (void)state;
  replay("consumer-cli-relay");
}

static void test_ctrl_c_flushes_then_disables(void **state) {
  (void)state;
  fake_service s = {.mode = STOP_WITH_SIGINT};
  char log[4096];
  int status = run_session(&s, "consumer-cli", log, sizeof log);
  if (status != 0)
    fail_msg("tracerelay record exited %d:\n%s", status, log);
  assert_int_equal(s.got.n, 5);
  assert_int_equal(method_of(s.got.f[1]), ENABLE);
  assert_int_equal(method_of(s.got.f[2]), FLUSH);
  Perfetto__Protos__FlushRequest *flush = perfetto__protos__flush_request__unpack(
      NULL, s.got.f[2]->msg_invoke_method->args_proto.len,
      s.got.f[2]->msg_invoke_method->args_proto.data);
  assert_non_null(flush);
  assert_int_equal(flush->timeout_ms, 0);
  assert_int_equal(flush->flags, 0x22); /* reason trace-stop (2), initiator perfetto_cmd (2) */
  perfetto__protos__flush_request__free_unpacked(flush, NULL);
  assert_int_equal(method_of(s.got.f[3]), DISABLE);
  assert_int_equal(method_of(s.got.f[4]), READ_BUFFERS);
  check_trace_file(&s);
  free_session(&s);
}

/* Runs the CLI against a fake service in mode: it exits 1 saying message, after asking for
 * ReadBuffers (its third request). */
static void expect_exit_1_after_read_buffers(enum mode mode, const char *message) {
  fake_service s = {.mode = mode};
  char log[4096];
  int status = run_session(&s, "consumer-cli", log, sizeof log);
  assert_int_equal(status, 1);
  if (!strstr(log, message))
    fail_msg("unexpected output:\n%s", log);
  assert_int_equal(s.got.n, 3);
  assert_int_equal(method_of(s.got.f[2]), READ_BUFFERS);
  free_session(&s);
}

/* ReadBuffers is still asked for: a session the service ended with an error (its shutdown) may
 * hold what was flushed before; the run fails all the same. */
static void test_session_error_exits_1(void **state) {
  (void)state;
  expect_exit_1_after_read_buffers(SESSION_ERROR,
                                   "the tracing session failed: buffer size over the limit");
}

/* A service that never answers ReadBuffers (busy, the connection open): record gives up after
 * --read-timeout with a message that names the flag, exit 1, and leaves no empty output. */
static void test_silent_read_back_gives_up_after_read_timeout(void **state) {
  (void)state;
  expect_exit_1_after_read_buffers(
      SILENT_READ, "sent nothing of the trace for 0.3 s: giving up (--read-timeout");
  char out[128];
  snprintf(out, sizeof out, "%s/out.pftrace", tmpdir);
  assert_int_equal(access(out, F_OK), -1);
}

/* No service at the socket: one message that names it, and the output is neither created nor
 * touched (an existing file keeps its bytes), so nothing more needs saying about it. */
static void test_no_service_names_the_socket(void **state) {
  (void)state;
  char out[128], sock[128], logpath[128], log[1024];
  snprintf(out, sizeof out, "%s/none.pftrace", tmpdir);
  snprintf(sock, sizeof sock, "%s/absent.sock", tmpdir);
  snprintf(logpath, sizeof logpath, "%s/none.log", tmpdir);
  FILE *f = fopen(out, "w");
  assert_non_null(f);
  fputs("an earlier trace", f);
  fclose(f);
  pid_t pid =
      spawn_cli(sock, TR_VECTORS_DIR "/ipc/consumer-cli.config.pbtxt", out, logpath, NULL);
  int wstatus;
  assert_int_equal(waitpid(pid, &wstatus, 0), pid);
  assert_int_equal(WEXITSTATUS(wstatus), 1);
  size_t n;
  char *text = (char *)read_file(logpath, &n);
  snprintf(log, sizeof log, "%.*s", (int)n, text);
  free(text);
  char want[256];
  snprintf(want, sizeof want, "tracerelay record: cannot connect to %s: No such file or "
                              "directory — is tracerelay-service running? set --socket\n", sock);
  if (strcmp(log, want) != 0)
    fail_msg("not the one line '%s' but:\n%s", want, log);
  text = (char *)read_file(out, &n);
  assert_int_equal(n, strlen("an earlier trace"));
  assert_memory_equal(text, "an earlier trace", n);
  free(text);
}

static int setup(void **state) {
  (void)state;
  strcpy(tmpdir, "/tmp/tr-record-XXXXXX");
  return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_replay_consumer_cli),
      cmocka_unit_test(test_replay_consumer_cli_relay),
      cmocka_unit_test(test_ctrl_c_flushes_then_disables),
      cmocka_unit_test(test_session_error_exits_1),
      cmocka_unit_test(test_no_service_names_the_socket),
      cmocka_unit_test(test_silent_read_back_gives_up_after_read_timeout),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
