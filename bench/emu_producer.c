/* emu_producer.c: the in-process producer of bench/many_agents (see emu_producer.h).
 *
 * Commits are batched as the SDK's arbiter batches them: the SMB writer's commits (a chunk to
 * move and the patches that became ready) wait in a small fixed array and leave as one
 * CommitData after the event or flush that made them, or earlier when the array is full. */
#include "bench/emu_producer.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "perfetto/ipc/producer_port.pb-c.h"
#include "bench/emu_ipc.h"
#include "relay/clock/clock.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "tools/loadgen_writer/packet.h"
#include "tools/loadgen_writer/smb_writer.h"

#define LOG_COMP "emu_producer"
#define PENDING_COMMITS 8 /* SMB writer commits per CommitData at most */
#define WRITER_ID 1
#define CHUNKS_PER_PAGE 1 /* Div1, as the SDK partitions pages by default */

/* One commit of the SMB writer, its patches copied out of the writer. */
struct pending_commit {
  lg_commit c;
  lg_patch patches[LG_SMB_MAX_PENDING_PATCHES];
};

struct emu_producer {
  struct emu_producer_config cfg;
  emu_ipc *ipc;
  uint32_t service_id;
  uint32_t method_ids[TR_PM_COUNT]; /* method number -> id in the bind reply, 0: absent */
  uint64_t next_request_id, bind_id, init_id, async_id, register_id;
  bool ended;

  lg_smb smb;
  lg_trace_writer tw;
  lg_sequence seq;
  bool writing;          /* an instance runs and events go into the SMB */
  uint64_t instance_id;  /* the instance written for */
  uv_timer_t event_timer;
  uint64_t period_ms;

  struct pending_commit pending[PENDING_COMMITS];
  size_t n_pending;
  struct emu_producer_counts counts;

  int handles_open; /* the timer and the IPC connection */
  void (*done)(void *data);
  void *done_data;
};

/* ---- failures ---- */

static void end(emu_producer *p, int status) {
  if (p->ended)
    return;
  p->ended = true;
  p->writing = false;
  uv_timer_stop(&p->event_timer);
  p->cfg.on_ended(p->cfg.data, status);
}

static void fail(emu_producer *p, int rc, const char *what) {
  if (!p->ended)
    TR_ERROR(LOG_COMP, "producer %s on %s: %s: %s", p->cfg.name, p->cfg.socket_path, what,
             tr_strerror(rc));
  end(p, rc);
}

/* ---- calls ---- */

static int invoke(emu_producer *p, int method, const ProtobufCMessage *args, bool drop_reply,
                  uint64_t *request_id) {
  if (p->ended)
    return TR_ERR_CLOSED;
  if (p->method_ids[method] == 0)
    return TR_ERR_UNSUPPORTED; /* not offered: fail locally, as Perfetto's client does */
  Perfetto__Protos__IPCFrame frame;
  Perfetto__Protos__IPCFrame__InvokeMethod inv;
  uint8_t *args_buf;
  int rc = tr_ipc_frame_invoke(&frame, &inv, p->service_id, p->method_ids[method],
                               p->next_request_id++, args, drop_reply, &args_buf);
  if (rc < 0)
    return rc;
  rc = emu_ipc_send(p->ipc, &frame);
  free(args_buf);
  if (request_id != NULL)
    *request_id = frame.request_id;
  return rc;
}

static int notify(emu_producer *p, bool started, uint64_t instance_id) {
  if (started) {
    Perfetto__Protos__NotifyDataSourceStartedRequest req =
        PERFETTO__PROTOS__NOTIFY_DATA_SOURCE_STARTED_REQUEST__INIT;
    req.has_data_source_id = 1;
    req.data_source_id = instance_id;
    return invoke(p, TR_PM_NOTIFY_STARTED, &req.base, true, NULL);
  }
  Perfetto__Protos__NotifyDataSourceStoppedRequest req =
      PERFETTO__PROTOS__NOTIFY_DATA_SOURCE_STOPPED_REQUEST__INIT;
  req.has_data_source_id = 1;
  req.data_source_id = instance_id;
  return invoke(p, TR_PM_NOTIFY_STOPPED, &req.base, true, NULL);
}

/* ---- commits ---- */

/* The pending commits as one CommitData, with flush_id (0: none); nothing to send is fine
 * unless a flush is acked. Patches arrive in chunk order: one ChunkToPatch per chunk. */
static int send_pending(emu_producer *p, uint64_t flush_id) {
  if (p->n_pending == 0 && flush_id == 0)
    return 0;
  size_t moves = 0, patches = 0;
  for (size_t i = 0; i < p->n_pending; i++) {
    moves += p->pending[i].c.has_move;
    patches += p->pending[i].c.num_patches;
  }
  Perfetto__Protos__CommitDataRequest__ChunksToMove *mv = calloc(moves + 1, sizeof *mv);
  Perfetto__Protos__CommitDataRequest__ChunksToMove **mvp = calloc(moves + 1, sizeof *mvp);
  Perfetto__Protos__CommitDataRequest__ChunkToPatch *cp = calloc(patches + 1, sizeof *cp);
  Perfetto__Protos__CommitDataRequest__ChunkToPatch **cpp = calloc(patches + 1, sizeof *cpp);
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *pt = calloc(patches + 1, sizeof *pt);
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch **ptp =
      calloc(patches + 1, sizeof *ptp);
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  int rc = TR_ERR_NOMEM;
  if (!mv || !mvp || !cp || !cpp || !pt || !ptp)
    goto done;
  size_t np = 0;
  for (size_t i = 0; i < p->n_pending; i++) {
    const lg_commit *c = &p->pending[i].c;
    if (c->has_move) {
      Perfetto__Protos__CommitDataRequest__ChunksToMove *m = &mv[req.n_chunks_to_move];
      perfetto__protos__commit_data_request__chunks_to_move__init(m);
      m->has_page = m->has_chunk = m->has_target_buffer = 1;
      m->page = c->page;
      m->chunk = c->chunk;
      m->target_buffer = c->target_buffer;
      mvp[req.n_chunks_to_move++] = m;
    }
    Perfetto__Protos__CommitDataRequest__ChunkToPatch *e = NULL;
    for (size_t j = 0; j < c->num_patches; j++, np++) {
      if (j == 0 || c->patches[j].chunk_id != c->patches[j - 1].chunk_id) {
        e = &cp[req.n_chunks_to_patch];
        perfetto__protos__commit_data_request__chunk_to_patch__init(e);
        e->has_target_buffer = e->has_writer_id = e->has_chunk_id = 1;
        e->target_buffer = c->target_buffer;
        e->writer_id = c->writer_id;
        e->chunk_id = c->patches[j].chunk_id;
        e->patches = &ptp[np];
        cpp[req.n_chunks_to_patch++] = e;
      }
      perfetto__protos__commit_data_request__chunk_to_patch__patch__init(&pt[np]);
      pt[np].has_offset = pt[np].has_data = 1;
      pt[np].offset = c->patches[j].offset;
      pt[np].data = (ProtobufCBinaryData){4, (uint8_t *)c->patches[j].data};
      ptp[np] = &pt[np];
      e->n_patches++;
    }
    if (e != NULL)
      e->has_has_more_patches = e->has_more_patches = c->last_has_more;
  }
  req.chunks_to_move = mvp;
  req.chunks_to_patch = cpp;
  req.has_flush_request_id = flush_id != 0;
  req.flush_request_id = flush_id;
  rc = invoke(p, TR_PM_COMMIT_DATA, &req.base, true, NULL);
  p->n_pending = 0;
done:
  free(mv);
  free(mvp);
  free(cp);
  free(cpp);
  free(pt);
  free(ptp);
  return rc;
}

/* The SMB writer's commit callback: kept for the next CommitData. */
static int queue_commit(void *ctx, const lg_commit *commit) {
  emu_producer *p = ctx;
  if (p->n_pending == PENDING_COMMITS) {
    int rc = send_pending(p, 0);
    if (rc < 0)
      return rc;
  }
  struct pending_commit *pc = &p->pending[p->n_pending++];
  pc->c = *commit;
  memcpy(pc->patches, commit->patches, commit->num_patches * sizeof *commit->patches);
  pc->c.patches = pc->patches;
  return 0;
}

/* ---- the data source ---- */

static void on_event_timer(uv_timer_t *t) {
  emu_producer *p = t->data;
  uint64_t ts;
  int rc = tr_clock_read(TR_CLOCK_BOOTTIME, &ts);
  if (rc == 0)
    rc = lg_seq_write_event(&p->seq, ts);
  if (rc == TR_ERR_FULL)
    rc = 0; /* the SMB is full: the sequence counted the drop, as the SDK does */
  if (rc == 0)
    rc = send_pending(p, 0);
  if (rc < 0)
    fail(p, rc, "writing an event");
}

static int start_writing(emu_producer *p, uint64_t instance_id, uint32_t target_buffer) {
  Perfetto__Protos__RegisterTraceWriterRequest req =
      PERFETTO__PROTOS__REGISTER_TRACE_WRITER_REQUEST__INIT;
  req.has_trace_writer_id = req.has_target_buffer = 1;
  req.trace_writer_id = WRITER_ID;
  req.target_buffer = target_buffer;
  int rc = invoke(p, TR_PM_REGISTER_TRACE_WRITER, &req.base, true, NULL);
  if (rc < 0)
    return rc;
  lg_tw_init(&p->tw, &p->smb, WRITER_ID, target_buffer, queue_commit, p);
  lg_seq_init(&p->seq, &p->tw, WRITER_ID, 0, (int32_t)getpid(), p->cfg.tid);
  p->writing = true;
  p->instance_id = instance_id;
  /* A random phase, so that a thousand producers started together do not write in step. */
  uint32_t phase = 0;
  if (getrandom(&phase, sizeof phase, 0) != sizeof phase)
    phase = (uint32_t)p->cfg.tid;
  return uv_timer_start(&p->event_timer, on_event_timer, phase % p->period_ms, p->period_ms);
}

/* Ends the sequence and commits what it holds, as an SDK TraceWriter does when it goes. */
static int stop_writing(emu_producer *p) {
  uint64_t ts;
  p->writing = false;
  uv_timer_stop(&p->event_timer);
  p->counts.events_written += p->seq.events_written;
  p->counts.events_dropped += p->seq.events_dropped;
  int rc = tr_clock_read(TR_CLOCK_BOOTTIME, &ts);
  if (rc == 0)
    rc = lg_seq_finish(&p->seq, ts);
  if (rc == 0 || rc == TR_ERR_FULL)
    rc = lg_tw_flush(&p->tw);
  return rc < 0 ? rc : send_pending(p, 0);
}

static int setup_tracing(emu_producer *p,
                         const Perfetto__Protos__GetAsyncCommandResponse__SetupTracing *st) {
  int fd = emu_ipc_take_fd(p->ipc);
  if (fd < 0)
    return TR_ERR_PROTO; /* setup_tracing came without the shared memory */
  if (p->smb.base != NULL) { /* the SMB lives as long as the connection */
    close(fd);
    return 0;
  }
  uint32_t page_kb = st->shared_buffer_page_size_kb ? st->shared_buffer_page_size_kb : 4;
  int rc = lg_smb_map(&p->smb, fd, (size_t)page_kb << 10, CHUNKS_PER_PAGE);
  close(fd);
  return rc;
}

static int start_data_source(emu_producer *p,
                             const Perfetto__Protos__GetAsyncCommandResponse__StartDataSource *sd) {
  p->counts.starts++;
  int rc = notify(p, true, sd->new_instance_id);
  if (rc < 0 || p->writing || p->period_ms == 0 || sd->config == NULL)
    return rc;
  if (p->smb.base == NULL)
    return TR_ERR_PROTO; /* start_data_source before setup_tracing */
  return start_writing(p, sd->new_instance_id, sd->config->target_buffer);
}

static int stop_data_source(emu_producer *p, uint64_t instance_id) {
  p->counts.stops++;
  int rc = p->writing && instance_id == p->instance_id ? stop_writing(p) : 0;
  return rc < 0 ? rc : notify(p, false, instance_id);
}

/* The SDK commits what its writers hold, then acks: moves and patches go first. */
static int flush(emu_producer *p, uint64_t request_id) {
  p->counts.flushes++;
  int rc = p->writing ? lg_tw_flush(&p->tw) : 0;
  return rc < 0 ? rc : send_pending(p, request_id);
}

static int handle_command(emu_producer *p, const Perfetto__Protos__GetAsyncCommandResponse *cmd) {
  switch (cmd->cmd_case) {
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING:
    return setup_tracing(p, cmd->setup_tracing);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE:
    return start_data_source(p, cmd->start_data_source);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_STOP_DATA_SOURCE:
    return stop_data_source(p, cmd->stop_data_source->instance_id);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_FLUSH:
    return flush(p, cmd->flush->request_id);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_CLEAR_INCREMENTAL_STATE:
    if (p->writing)
      lg_seq_clear_incremental_state(&p->seq);
    return 0;
  default: /* setup_data_source needs nothing before start; others come from newer peers */
    return 0;
  }
}

/* ---- the handshake ---- */

static int register_data_source(emu_producer *p) {
  /* TrackEventDescriptor {available_categories {name "loadgen"}}, as the loadgen's. */
  static uint8_t te_desc[] = {0x0a, 0x09, 0x0a, 0x07, 'l', 'o', 'a', 'd', 'g', 'e', 'n'};
  Perfetto__Protos__DataSourceDescriptor desc = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  desc.name = (char *)p->cfg.data_source;
  desc.has_will_notify_on_stop = desc.has_will_notify_on_start = 1;
  desc.will_notify_on_stop = desc.will_notify_on_start = 1;
  desc.has_handles_incremental_state_clear = desc.handles_incremental_state_clear = 1;
  desc.has_track_event_descriptor_raw = 1;
  desc.track_event_descriptor_raw = (ProtobufCBinaryData){sizeof te_desc, te_desc};
  desc.has_id = 1; /* the SDK gives each data source a random 64-bit id */
  if (getrandom(&desc.id, sizeof desc.id, 0) != sizeof desc.id || desc.id == 0)
    desc.id = 1;
  Perfetto__Protos__RegisterDataSourceRequest req =
      PERFETTO__PROTOS__REGISTER_DATA_SOURCE_REQUEST__INIT;
  req.data_source_descriptor = &desc;
  return invoke(p, TR_PM_REGISTER_DATA_SOURCE, &req.base, false, &p->register_id);
}

/* InitializeConnection, GetAsyncCommand and RegisterDataSource back to back, as the SDK. */
static int on_bound(emu_producer *p, const Perfetto__Protos__IPCFrame__BindServiceReply *r) {
  if (!r->success)
    return TR_ERR_NOT_FOUND;
  p->service_id = r->service_id;
  tr_ipc_producer_method_ids(r, p->method_ids);
  Perfetto__Protos__InitializeConnectionRequest init =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  init.producer_name = (char *)p->cfg.name;
  init.has_smb_scraping_mode = 1;
  init.smb_scraping_mode =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__PRODUCER_SMBSCRAPING_MODE__SMB_SCRAPING_ENABLED;
  init.sdk_version = "tracerelay many_agents (Perfetto SDK v58.2 ABI)";
  Perfetto__Protos__GetAsyncCommandRequest async = PERFETTO__PROTOS__GET_ASYNC_COMMAND_REQUEST__INIT;
  int rc = invoke(p, TR_PM_INITIALIZE_CONNECTION, &init.base, false, &p->init_id);
  if (rc == 0)
    rc = invoke(p, TR_PM_GET_ASYNC_COMMAND, &async.base, false, &p->async_id);
  if (rc == 0)
    rc = register_data_source(p);
  return rc;
}

static int on_initialized(const Perfetto__Protos__IPCFrame__InvokeMethodReply *r) {
  if (!r->success)
    return TR_ERR_PROTO;
  Perfetto__Protos__InitializeConnectionResponse *resp =
      perfetto__protos__initialize_connection_response__unpack(NULL, r->reply_proto.len,
                                                                r->reply_proto.data);
  if (resp == NULL)
    return TR_ERR_DECODE;
  int rc = resp->use_shmem_emulation ? TR_ERR_UNSUPPORTED : 0; /* we need a real SMB */
  perfetto__protos__initialize_connection_response__free_unpacked(resp, NULL);
  return rc;
}

static int on_registered(emu_producer *p, const Perfetto__Protos__IPCFrame__InvokeMethodReply *r) {
  if (!r->success)
    return TR_ERR_PROTO;
  Perfetto__Protos__RegisterDataSourceResponse *resp =
      perfetto__protos__register_data_source_response__unpack(NULL, r->reply_proto.len,
                                                              r->reply_proto.data);
  int rc = resp != NULL && resp->error != NULL && resp->error[0] ? TR_ERR_PROTO : 0;
  perfetto__protos__register_data_source_response__free_unpacked(resp, NULL);
  if (rc == 0)
    p->cfg.on_registered(p->cfg.data);
  return rc;
}

static int on_async_command(emu_producer *p, const Perfetto__Protos__IPCFrame__InvokeMethodReply *r) {
  if (!r->success)
    return TR_ERR_PROTO;
  Perfetto__Protos__GetAsyncCommandResponse *cmd =
      perfetto__protos__get_async_command_response__unpack(NULL, r->reply_proto.len,
                                                            r->reply_proto.data);
  if (cmd == NULL)
    return TR_ERR_DECODE;
  int rc = handle_command(p, cmd);
  perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
  return rc;
}

static void on_frame(emu_ipc *c, const Perfetto__Protos__IPCFrame *f) {
  emu_producer *p = emu_ipc_data(c);
  int rc = 0;
  const char *what = "the agent's reply";
  if (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY &&
      f->request_id == p->bind_id) {
    what = "BindService";
    rc = on_bound(p, f->msg_bind_service_reply);
  } else if (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_REQUEST_ERROR) {
    what = f->msg_request_error->error ? f->msg_request_error->error : "a request error";
    rc = TR_ERR_PROTO; /* our calls are valid: the agent refusing one is a finding */
  } else if (f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY) {
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *r = f->msg_invoke_method_reply;
    if (f->request_id == p->init_id) {
      what = "InitializeConnection";
      rc = on_initialized(r);
    } else if (f->request_id == p->register_id) {
      what = "RegisterDataSource";
      rc = on_registered(p, r);
    } else if (f->request_id == p->async_id) {
      what = "a command";
      rc = on_async_command(p, r);
    }
  }
  if (rc < 0)
    fail(p, rc, what);
}

/* The agent closing the connection is the owner's to report; anything else is a failure. */
static void on_ipc_ended(emu_ipc *c, int status) {
  if (status == TR_ERR_CLOSED)
    end(emu_ipc_data(c), status);
  else
    fail(emu_ipc_data(c), status, "the connection");
}

int emu_producer_start(uv_loop_t *loop, const struct emu_producer_config *cfg,
                       emu_producer **out) {
  emu_producer *p = calloc(1, sizeof *p);
  if (p == NULL)
    return TR_ERR_NOMEM;
  p->cfg = *cfg;
  p->next_request_id = 1;
  p->period_ms = cfg->rate > 0 ? (uint64_t)(1000.0 / cfg->rate + 0.5) : 0;
  if (cfg->rate > 0 && p->period_ms == 0)
    p->period_ms = 1; /* at most one event per millisecond: a producer per loop turn */
  struct emu_ipc_callbacks cbs = {.data = p, .on_frame = on_frame, .on_ended = on_ipc_ended};
  int rc = emu_ipc_open(loop, cfg->socket_path, &cbs, &p->ipc);
  if (rc < 0) {
    free(p);
    return rc;
  }
  uv_timer_init(loop, &p->event_timer);
  p->event_timer.data = p;
  p->handles_open = 2;
  Perfetto__Protos__IPCFrame__BindService bind = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  bind.service_name = "ProducerPort";
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = 1;
  frame.request_id = p->bind_id = p->next_request_id++;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  frame.msg_bind_service = &bind;
  p->ended = true; /* a failure here is this call's error, not an on_ended */
  rc = emu_ipc_send(p->ipc, &frame);
  p->ended = false;
  if (rc < 0) {
    emu_producer_close(p, NULL, NULL);
    return rc;
  }
  *out = p;
  return 0;
}

void emu_producer_counts(const emu_producer *p, struct emu_producer_counts *out) {
  *out = p->counts;
  if (p->writing) {
    out->events_written += p->seq.events_written;
    out->events_dropped += p->seq.events_dropped;
  }
}

static void on_handle_closed(void *data) {
  emu_producer *p = data;
  if (--p->handles_open > 0)
    return;
  lg_smb_unmap(&p->smb);
  void (*done)(void *) = p->done;
  void *done_data = p->done_data;
  free(p);
  if (done != NULL)
    done(done_data);
}

static void on_timer_closed(uv_handle_t *h) { on_handle_closed(h->data); }

void emu_producer_close(emu_producer *p, void (*done)(void *data), void *data) {
  p->ended = true; /* no callback from here on */
  p->writing = false;
  p->done = done;
  p->done_data = data;
  uv_close((uv_handle_t *)&p->event_timer, on_timer_closed);
  emu_ipc_close(p->ipc, on_handle_closed, p);
}
