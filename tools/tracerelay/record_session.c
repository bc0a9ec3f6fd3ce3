/* record_session.c: the consumer-side flow of `tracerelay record` (see record_session.h).
 *
 * Everything happens on one blocking IPC client read with a short timeout, so the loop can
 * redraw progress and notice stop requests (the signal handler only bumps a counter). Replies
 * are matched by request id, since Flush, DisableTracing, GetTraceStats and EnableTracing
 * answers may come in any order. While progress shows, GetTraceStats is sent about once a
 * second (one outstanding at a time) for the bytes per host; a service that does not offer it
 * just gets no more requests. */
#include "tools/tracerelay/record_session.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_client.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"
#include "tools/tracerelay/host_progress.h"
#include "tools/tracerelay/progress.h"
#include "tools/tracerelay/trace_sink.h"

#define POLL_MS 200
#define DEFAULT_FLUSH_TIMEOUT_MS 5000
#define STATS_PERIOD_MS 1000
#define STATS_GIVE_UP_MS 5000 /* an unanswered GetTraceStats no longer blocks the next one */
#define FINAL_STATS_MS 2000   /* the last GetTraceStats, after the session ended */

typedef Perfetto__Protos__IPCFrame IPCFrame;

typedef struct run {
  const record_session *s;
  tr_ipc_client *c;
  int out_fd; /* the output (s->open_output's), or -1 */
  progress prog;
  trace_sink sink;
  uint64_t enable_id, flush_id, read_id, stats_id, observe_id;
  bool observing; /* ObserveEvents(CLONE_TRIGGER_HIT) is open */
  bool stats_pending, stats_off, have_stats;
  bool warned_missing; /* the stats' missing data sources and machines were reported */
  int64_t stats_sent_ms, next_stats_ms;
  struct host_progress_sum stats; /* from the last GetTraceStats: bytes, hosts, losses */
  bool flush_sent, disable_sent;
  bool ended_with_error; /* the service ended the session with an error (e.g. its shutdown) */
  bool salvaging;        /* reading after such an end: a refused ReadBuffers is not news */
  int64_t flush_deadline; /* DisableTracing goes out by then even without a Flush answer */
  int64_t end_deadline;   /* the session must have ended by then (0: no limit yet) */
} run;

static void vsay(run *r, const char *prefix, const char *fmt, va_list ap) {
  progress_clear(&r->prog);
  fprintf(stderr, "tracerelay record: %s", prefix);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
}

/* Reports a failure; returns the exit status 1 so callers can `return errorf(...)`. */
__attribute__((format(printf, 2, 3))) static int errorf(run *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(r, "", fmt, ap);
  va_end(ap);
  return 1;
}

__attribute__((format(printf, 2, 3))) static void warnf(run *r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsay(r, "warning: ", fmt, ap);
  va_end(ap);
}

/* Packs msg (NULL: no arguments) and invokes method, with fd attached if >= 0. */
static int invoke(run *r, const char *method, const ProtobufCMessage *msg, int fd, uint64_t *id) {
  size_t len = msg ? protobuf_c_message_get_packed_size(msg) : 0;
  uint8_t *args = calloc(1, len + 1); /* zeroed: nothing is read uninitialised when len is 0 */
  if (!args)
    return TR_ERR_NOMEM;
  if (msg)
    protobuf_c_message_pack(msg, args);
  int rc = tr_ipc_client_invoke(r->c, method, args, len, false, fd, id);
  free(args);
  return rc;
}

static int invoke_failed(run *r, const char *method, int rc) {
  if (rc == TR_ERR_UNSUPPORTED)
    return errorf(r, "the service at %s does not offer ConsumerPort.%s", r->s->socket_path,
                  method);
  return errorf(r, "cannot send %s to %s: %s", method, r->s->socket_path, tr_strerror(rc));
}

static uint32_t flush_timeout_ms(const run *r) {
  const Perfetto__Protos__TraceConfig *cfg = r->s->config;
  return cfg->has_flush_timeout_ms && cfg->flush_timeout_ms ? cfg->flush_timeout_ms
                                                            : DEFAULT_FLUSH_TIMEOUT_MS;
}

static int send_flush(run *r) {
  Perfetto__Protos__FlushRequest req = PERFETTO__PROTOS__FLUSH_REQUEST__INIT;
  req.has_timeout_ms = true;
  req.timeout_ms = 0; /* the session's flush_timeout_ms */
  req.has_flags = true;
  req.flags = RECORD_FLUSH_FLAGS;
  int rc = invoke(r, "Flush", &req.base, -1, &r->flush_id);
  if (rc < 0)
    return invoke_failed(r, "Flush", rc);
  r->flush_sent = true;
  r->flush_deadline = progress_now_ms() + flush_timeout_ms(r) + 5000;
  return 0;
}

static int send_disable(run *r) {
  uint64_t id;
  int rc = invoke(r, "DisableTracing", NULL, -1, &id);
  if (rc < 0)
    return invoke_failed(r, "DisableTracing", rc);
  r->disable_sent = true;
  r->end_deadline = progress_now_ms() + RECORD_STOP_GRACE_MS + 2 * flush_timeout_ms(r);
  return 0;
}

static const Perfetto__Protos__IPCFrame__InvokeMethodReply *reply_to(const IPCFrame *f,
                                                                     uint64_t id) {
  if (f->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY ||
      f->request_id != id)
    return NULL;
  return f->msg_invoke_method_reply;
}

/* Bytes the output holds so far: what the service wrote into our fd, or what we wrote. */
static uint64_t output_bytes(const run *r) {
  struct stat st;
  if (r->s->pass_fd && fstat(r->out_fd, &st) == 0)
    return (uint64_t)st.st_size;
  return r->sink.bytes;
}

/* Returns 0 with a frame, -1 when none came within POLL_MS, 1 after reporting a lost
 * connection. */
static int recv_frame(run *r, IPCFrame **f) {
  int rc = tr_ipc_client_recv(r->c, POLL_MS, f, NULL);
  if (rc == TR_ERR_CLOSED)
    return errorf(r, "%s closed the connection before the session ended", r->s->socket_path);
  if (rc < 0 && rc != TR_ERR_TIMEOUT)
    return errorf(r, "lost the connection to %s: %s", r->s->socket_path, tr_strerror(rc));
  if (rc == 0 && (*f)->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_REQUEST_ERROR) {
    const char *e = (*f)->msg_request_error->error;
    warnf(r, "the service reported: %s", e ? e : "(no message)");
  }
  return rc == TR_ERR_TIMEOUT ? -1 : 0;
}

/* Asks for the trace stats if progress shows and the last answer is in (or long overdue). */
static void poll_stats(run *r) {
  int64_t now = progress_now_ms();
  if (r->stats_off || now < r->next_stats_ms ||
      (r->stats_pending && now - r->stats_sent_ms < STATS_GIVE_UP_MS))
    return;
  Perfetto__Protos__GetTraceStatsRequest req = PERFETTO__PROTOS__GET_TRACE_STATS_REQUEST__INIT;
  /* Not offered (TR_ERR_UNSUPPORTED): progress goes on without it. A broken connection
   * shows in the next read, which reports it. */
  if (invoke(r, "GetTraceStats", &req.base, -1, &r->stats_id) < 0) {
    r->stats_off = true;
    return;
  }
  r->stats_pending = true;
  r->stats_sent_ms = now;
  r->next_stats_ms = now + STATS_PERIOD_MS;
}

/* 1 when --strict fails the run. */
static int on_stats(run *r, const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep) {
  r->stats_pending = false;
  /* A failure (no session yet) or an undecodable reply keeps the last figures. */
  if (rep->success && host_progress_format(rep->reply_proto.data, rep->reply_proto.len,
                                           r->prog.hosts, sizeof r->prog.hosts,
                                           &r->stats) == 0) {
    r->have_stats = true;
    progress_refresh(&r->prog);
    if (r->stats.missing[0] && !r->warned_missing) {
      r->warned_missing = true;
      if (r->s->strict)
        return errorf(r, "%s (--strict: giving up)", r->stats.missing);
      warnf(r, "%s", r->stats.missing);
    }
  }
  return 0;
}

/* One more GetTraceStats once the session has ended: what its end found (instances that
 * never started, stops that timed out) is known only then. Waits up to FINAL_STATS_MS; on
 * any failure the last figures stay. */
static void final_stats(run *r) {
  Perfetto__Protos__GetTraceStatsRequest req = PERFETTO__PROTOS__GET_TRACE_STATS_REQUEST__INIT;
  uint64_t id;
  if (r->stats_off || invoke(r, "GetTraceStats", &req.base, -1, &id) < 0)
    return;
  int64_t deadline = progress_now_ms() + FINAL_STATS_MS;
  while (progress_now_ms() < deadline) {
    IPCFrame *f = NULL;
    int rc = recv_frame(r, &f);
    if (rc > 0)
      return;
    if (rc < 0)
      continue;
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = reply_to(f, id);
    if (rep)
      on_stats(r, rep); /* a --strict failure on missing hosts was decided at the start */
    tr_ipc_frame_free(f);
    if (rep)
      return;
  }
}

/* Stop requests, watchdogs and the Flush -> DisableTracing step; 1 = give up. */
static int tick(run *r) {
  int64_t now = progress_now_ms();
  if (*r->s->stop_requests >= 2)
    return errorf(r, "interrupted again: giving up without the rest of the trace");
  if (*r->s->stop_requests && !r->flush_sent && send_flush(r))
    return 1;
  if (r->flush_sent && !r->disable_sent && now >= r->flush_deadline && send_disable(r))
    return 1;
  if (r->end_deadline && now >= r->end_deadline)
    return errorf(r, "the service at %s did not end the session in time; giving up",
                  r->s->socket_path);
  return 0;
}

/* Asks for the session's CLONE_SNAPSHOT triggers (the perfetto CLI's ObserveEvents). */
static int observe_clone_triggers(run *r) {
  Perfetto__Protos__ObserveEventsRequest req = PERFETTO__PROTOS__OBSERVE_EVENTS_REQUEST__INIT;
  Perfetto__Protos__ObservableEvents__Type type =
      PERFETTO__PROTOS__OBSERVABLE_EVENTS__TYPE__TYPE_CLONE_TRIGGER_HIT;
  req.n_events_to_observe = 1;
  req.events_to_observe = &type;
  int rc = invoke(r, "ObserveEvents", &req.base, -1, &r->observe_id);
  if (rc < 0)
    return invoke_failed(r, "ObserveEvents", rc);
  r->observing = true;
  return 0;
}

/* An ObserveEvents reply: each clone_trigger_hit goes to on_clone_trigger. */
static int on_events(run *r, const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep) {
  Perfetto__Protos__ObserveEventsResponse *resp =
      rep->success ? perfetto__protos__observe_events_response__unpack(
                         NULL, rep->reply_proto.len, rep->reply_proto.data)
                   : NULL;
  int status = 0;
  r->observing = rep->has_more;
  if (!resp)
    warnf(r, "the service stopped telling of CLONE_SNAPSHOT triggers");
  else if (resp->events && resp->events->clone_trigger_hit) {
    const Perfetto__Protos__ObservableEvents__CloneTriggerHit *hit =
        resp->events->clone_trigger_hit;
    progress_clear(&r->prog);
    status = r->s->on_clone_trigger(r->s->clone_ctx, (uint64_t)hit->tracing_session_id,
                                    hit->trigger_name ? hit->trigger_name : "");
  }
  if (resp)
    perfetto__protos__observe_events_response__free_unpacked(resp, NULL);
  return status;
}

/* Waits for the EnableTracing reply (the end of the session). */
static int wait_for_end(run *r) {
  const Perfetto__Protos__TraceConfig *cfg = r->s->config;
  if (cfg->has_duration_ms && cfg->duration_ms)
    r->end_deadline = progress_now_ms() + cfg->duration_ms + RECORD_STOP_GRACE_MS +
                      2 * flush_timeout_ms(r);
  for (;;) {
    IPCFrame *f = NULL;
    if (tick(r))
      return 1;
    poll_stats(r);
    progress_update(&r->prog, r->flush_sent ? "stopping" : "recording",
                    r->have_stats ? r->stats.bytes : output_bytes(r));
    int rc = recv_frame(r, &f);
    if (rc > 0)
      return 1;
    if (rc < 0)
      continue;
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep;
    if (r->stats_pending && (rep = reply_to(f, r->stats_id))) {
      if (on_stats(r, rep)) {
        tr_ipc_frame_free(f);
        return 1;
      }
    } else if (r->observing && (rep = reply_to(f, r->observe_id))) {
      if (on_events(r, rep)) {
        tr_ipc_frame_free(f);
        return 1;
      }
    } else if (r->flush_sent && (rep = reply_to(f, r->flush_id))) {
      if (!rep->success)
        warnf(r, "flush did not complete (some data sources did not answer); stopping anyway");
      if (!r->disable_sent && send_disable(r)) {
        tr_ipc_frame_free(f);
        return 1;
      }
    } else if ((rep = reply_to(f, r->enable_id))) {
      int status = 0;
      Perfetto__Protos__EnableTracingResponse *resp =
          rep->success ? perfetto__protos__enable_tracing_response__unpack(
                             NULL, rep->reply_proto.len, rep->reply_proto.data)
                       : NULL;
      if (!resp)
        status = errorf(r, "the service at %s refused the session (EnableTracing failed)",
                        r->s->socket_path);
      else if (resp->error && resp->error[0]) {
        status = errorf(r, "the tracing session failed: %s", resp->error);
        r->ended_with_error = true;
      }
      if (resp)
        perfetto__protos__enable_tracing_response__free_unpacked(resp, NULL);
      tr_ipc_frame_free(f);
      return status;
    }
    tr_ipc_frame_free(f);
  }
}

static int add_slices(run *r, const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep) {
  Perfetto__Protos__ReadBuffersResponse *resp = perfetto__protos__read_buffers_response__unpack(
      NULL, rep->reply_proto.len, rep->reply_proto.data);
  if (!resp)
    return errorf(r, "undecodable ReadBuffers reply from %s", r->s->socket_path);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < resp->n_slices; i++) {
    const Perfetto__Protos__ReadBuffersResponse__Slice *sl = resp->slices[i];
    rc = trace_sink_add(&r->sink, sl->data.data, sl->data.len, sl->last_slice_for_packet);
  }
  perfetto__protos__read_buffers_response__free_unpacked(resp, NULL);
  if (rc < 0)
    return errorf(r, "cannot write %s: %s", r->s->out_path, tr_strerror(rc));
  return 0;
}

/* ReadBuffers, streaming every reply into the output until has_more is false. */
static int read_buffers(run *r) {
  int rc = invoke(r, "ReadBuffers", NULL, -1, &r->read_id);
  if (rc == TR_ERR_UNSUPPORTED && r->salvaging)
    return 1; /* nothing to read back (a regional): the session's failure said why */
  if (rc < 0)
    return invoke_failed(r, "ReadBuffers", rc);
  int64_t idle_ms = r->s->read_idle_ms;
  int64_t idle_deadline = progress_now_ms() + idle_ms;
  for (;;) {
    IPCFrame *f = NULL;
    if (*r->s->stop_requests >= 2)
      return errorf(r, "interrupted again: the trace in %s is incomplete", r->s->out_path);
    if (idle_ms > 0 && progress_now_ms() >= idle_deadline)
      return errorf(r, "%s sent nothing of the trace for %.1f s: giving up (--read-timeout "
                    "waits longer, 0 for as long as the connection is open)",
                    r->s->socket_path, (double)idle_ms / 1000);
    progress_update(&r->prog, "reading", r->sink.bytes);
    if ((rc = recv_frame(r, &f)) > 0)
      return 1;
    if (rc < 0)
      continue;
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = reply_to(f, r->read_id);
    if (rep) {
      idle_deadline = progress_now_ms() + idle_ms;
      bool more = rep->has_more;
      rc = rep->success ? add_slices(r, rep)
           : r->salvaging ? 1
                          : errorf(r, "the service at %s refused ReadBuffers", r->s->socket_path);
      tr_ipc_frame_free(f);
      if (rc || !more)
        return rc;
      continue;
    }
    tr_ipc_frame_free(f);
  }
}

/* The one line record always ends with, terminal or not (as the perfetto CLI does). */
static void print_summary(const run *r, bool service_wrote) {
  const char *where = r->s->out_path ? r->s->out_path : r->s->config->output_path;
  fprintf(stderr, "tracerelay record: wrote %.1f MB to %s%s",
          (double)output_bytes(r) / (1024.0 * 1024.0), where ? where : "?",
          service_wrote ? " (written by the service)" : "");
  if (r->have_stats && r->stats.hosts) {
    fprintf(stderr, "; %u hosts, %" PRIu64 " chunks lost", r->stats.hosts, r->stats.lost_chunks);
    if (r->stats.smb_full)
      fprintf(stderr,
              ", producers' shared memory full %" PRIu64
              " times, for at most %" PRIu64 " ms (they dropped data, packet count unknown)",
              r->stats.smb_full, r->stats.smb_full_ms);
    fputs(" (as of the service's last stats)", stderr);
    if (r->stats.not_started[0])
      fprintf(stderr, "\ntracerelay record: warning: data source instances that never started, "
                      "whose data is missing from the trace, on: %s",
              r->stats.not_started);
    if (r->stats.agent_crashed[0])
      fprintf(stderr, "\ntracerelay record: warning: agents that were killed or crashed while "
                      "the session ran (what their producers had not yet relayed is lost, "
                      "packet count unknown): %s",
              r->stats.agent_crashed);
    if (r->stats.stop_timed_out[0])
      fprintf(stderr, "\ntracerelay record: warning: data sources that had not confirmed their "
                      "stop when the stop timeout ran out (their last data, and what their "
                      "agent still had queued, may be missing; raise "
                      "data_source_stop_timeout_ms for a slow link): %s",
              r->stats.stop_timed_out);
    if (r->stats.producers_closed[0])
      fprintf(stderr, "\ntracerelay record: warning: producer connections the agents closed "
                      "while the session ran (what those producers wrote after is missing, "
                      "packet count unknown): %s",
              r->stats.producers_closed);
    if (r->stats.down[0])
      fprintf(stderr, "\ntracerelay record: warning: hosts whose link was down at the end (what "
                      "they had not relayed by then is missing, packet count unknown): %s",
              r->stats.down);
  } else if (r->have_stats && r->stats.tracerelay)
    fputs("; no host was connected during the session", stderr);
  else if (r->have_stats)
    fputs("; per-host figures: none (not a tracerelay service)", stderr);
  fputs("\n", stderr);
}

/* CloneSession, with the output attached as the perfetto CLI does; 0 once the service made
 * the clone, else 1 after saying why. */
static int clone_session(run *r) {
  const record_session *s = r->s;
  Perfetto__Protos__CloneSessionRequest req = PERFETTO__PROTOS__CLONE_SESSION_REQUEST__INIT;
  char what[96];
  uint64_t id;
  if (s->clone_by_id) {
    req.selector_case = PERFETTO__PROTOS__CLONE_SESSION_REQUEST__SELECTOR_SESSION_ID;
    req.session_id = s->clone_id;
    snprintf(what, sizeof what, "%llu", (unsigned long long)s->clone_id);
  } else {
    req.selector_case = PERFETTO__PROTOS__CLONE_SESSION_REQUEST__SELECTOR_UNIQUE_SESSION_NAME;
    req.unique_session_name = (char *)s->clone_name;
    snprintf(what, sizeof what, "\"%.80s\"", s->clone_name);
  }
  req.has_skip_trace_filter = req.has_for_bugreport = 1;
  int rc = invoke(r, "CloneSession", &req.base, r->out_fd, &id);
  if (rc < 0)
    return invoke_failed(r, "CloneSession", rc);
  for (;;) {
    IPCFrame *f = NULL;
    if (*s->stop_requests)
      return errorf(r, "interrupted while the session was being cloned");
    if ((rc = recv_frame(r, &f)) > 0)
      return 1;
    if (rc < 0)
      continue;
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = reply_to(f, id);
    if (!rep) {
      tr_ipc_frame_free(f);
      continue;
    }
    Perfetto__Protos__CloneSessionResponse *resp =
        rep->success ? perfetto__protos__clone_session_response__unpack(
                           NULL, rep->reply_proto.len, rep->reply_proto.data)
                     : NULL;
    rc = !resp ? errorf(r, "the service at %s refused CloneSession", s->socket_path)
         : !resp->success
             ? errorf(r, "failed to clone tracing session %s: %s", what,
                      resp->error ? resp->error : "no reason given")
         : resp->was_write_into_file
             ? errorf(r, "the service wrote the clone of session %s into %s itself", what,
                      s->out_path)
             : 0;
    if (resp)
      perfetto__protos__clone_session_response__free_unpacked(resp, NULL);
    tr_ipc_frame_free(f);
    return rc;
  }
}

static int connect_and_bind(run *r) {
  const char *path = r->s->socket_path;
  int rc = tr_ipc_client_connect(path, RECORD_CONNECT_TIMEOUT_MS, &r->c);
  if (rc < 0)
    return errorf(r, "cannot connect to %s: %s — is tracerelay-service running? set --socket",
                  path, tr_strerror(rc));
  rc = tr_ipc_client_bind(r->c, "ConsumerPort", RECORD_CONNECT_TIMEOUT_MS);
  if (rc == TR_ERR_NOT_FOUND)
    return errorf(r, "%s does not offer ConsumerPort: is it a producer socket?", path);
  if (rc < 0)
    return errorf(r, "cannot bind ConsumerPort on %s: %s", path, tr_strerror(rc));
  return 0;
}

int record_session_run(const record_session *s) {
  run r = {.s = s, .out_fd = -1};
  int status;
  progress_start(&r.prog, s->progress_lines);
  if ((status = connect_and_bind(&r)))
    goto out;
  if (s->out_path && (r.out_fd = s->open_output(s->output_ctx)) < 0) {
    status = 1;
    goto out;
  }
  trace_sink_init(&r.sink, r.out_fd); /* r's zeroed sink is freed safely before this */
  if (s->clone) {
    if ((status = clone_session(&r)) || (status = read_buffers(&r)))
      goto out;
    final_stats(&r);
    progress_clear(&r.prog);
    print_summary(&r, false);
    goto out;
  }
  Perfetto__Protos__EnableTracingRequest req = PERFETTO__PROTOS__ENABLE_TRACING_REQUEST__INIT;
  req.trace_config = (Perfetto__Protos__TraceConfig *)s->config;
  int rc = invoke(&r, "EnableTracing", &req.base, s->pass_fd ? r.out_fd : -1, &r.enable_id);
  if (rc < 0) {
    status = invoke_failed(&r, "EnableTracing", rc);
    goto out;
  }
  bool service_wrote = s->config->write_into_file;
  if (s->on_clone_trigger && (status = observe_clone_triggers(&r)))
    goto out;
  if ((status = wait_for_end(&r))) {
    /* What the service flushed before it ended the session is still worth having; the run
     * fails all the same. */
    r.salvaging = true;
    if (r.ended_with_error && !service_wrote && read_buffers(&r) == 0 && r.sink.packets)
      fprintf(stderr, "tracerelay record: %s holds the %" PRIu64 " packets read before the "
                      "session ended\n", s->out_path, r.sink.packets);
    goto out;
  }
  if (!service_wrote && (status = read_buffers(&r)))
    goto out;
  final_stats(&r);
  progress_clear(&r.prog);
  if (r.sink.pending_len)
    fprintf(stderr, "tracerelay record: warning: the last packet was incomplete (%zu bytes "
                    "dropped)\n", r.sink.pending_len);
  print_summary(&r, service_wrote);
  if (s->strict && r.stats.not_started[0])
    status = errorf(&r, "--strict: some data source instances never started");
  else if (s->strict && r.stats.agent_crashed[0])
    status = errorf(&r, "--strict: an agent was killed or crashed during the session");
  else if (s->strict && r.stats.stop_timed_out[0])
    status = errorf(&r, "--strict: some data sources did not confirm their stop in time");
  else if (s->strict && r.stats.producers_closed[0])
    status = errorf(&r, "--strict: an agent closed some producers' connections");
  else if (s->strict && r.stats.down[0])
    status = errorf(&r, "--strict: some hosts' links were down at the end");
out:
  progress_clear(&r.prog);
  trace_sink_free(&r.sink);
  tr_ipc_client_close(r.c);
  return status;
}
