/* session.c: ProducerPort calls and CommitData batching for the loadgen (see session.h). */
#include "tools/loadgen/session.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "tools/loadgen/commit_latency.h"

#define SESSION_TIMEOUT_MS 10000
/* Per CommitData frame: 2048 moves (<= 16 bytes each) and 256 patch entries (<= 20 bytes plus
 * <= 16 patches of <= 14 bytes) stay well under the SDK's limit of 128 KiB - 512. */
#define MAX_MOVES_PER_FRAME 2048
#define MAX_PATCH_ENTRIES_PER_FRAME 256

/* One chunks_to_move entry, or one chunks_to_patch entry. */
struct lg_commit_item {
  bool is_move;
  uint32_t page;
  uint32_t chunk;
  uint32_t target_buffer;
  uint16_t writer_id;
  uint32_t chunk_id;
  bool has_more;
  size_t num_patches;
  lg_patch patches[LG_SMB_MAX_PENDING_PATCHES];
};

static int invoke(lg_session *s, int method, const ProtobufCMessage *args, bool drop_reply,
                  uint64_t *request_id) {
  if (s->method_ids[method] == 0)
    return TR_ERR_UNSUPPORTED; /* not offered: fail locally, as Perfetto's client does */
  Perfetto__Protos__IPCFrame frame;
  Perfetto__Protos__IPCFrame__InvokeMethod inv;
  uint8_t *args_buf;
  int rc = tr_ipc_frame_invoke(&frame, &inv, s->service_id, s->method_ids[method],
                               s->next_request_id++, args, drop_reply, &args_buf);
  if (rc < 0)
    return rc;
  rc = lg_conn_send(&s->conn, &frame);
  free(args_buf);
  if (request_id)
    *request_id = frame.request_id;
  return rc;
}

/* Waits for the frame answering request_id; frames for other requests are dropped, which is
 * safe only before any command can arrive (BindService, InitializeConnection). */
static int await_reply(lg_session *s, uint64_t request_id, Perfetto__Protos__IPCFrame **out) {
  for (;;) {
    Perfetto__Protos__IPCFrame *frame;
    int rc = lg_conn_next(&s->conn, SESSION_TIMEOUT_MS, &frame);
    if (rc == 0)
      return TR_ERR_TIMEOUT;
    if (rc < 0)
      return rc;
    if (frame->request_id == request_id) {
      *out = frame;
      return 0;
    }
    tr_ipc_frame_free(frame);
  }
}

static int bind_service(lg_session *s) {
  Perfetto__Protos__IPCFrame__BindService bind = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  bind.service_name = "ProducerPort";
  Perfetto__Protos__IPCFrame frame = PERFETTO__PROTOS__IPCFRAME__INIT;
  frame.has_request_id = 1;
  frame.request_id = s->next_request_id++;
  frame.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  frame.msg_bind_service = &bind;
  int rc = lg_conn_send(&s->conn, &frame);
  Perfetto__Protos__IPCFrame *reply = NULL;
  if (rc == 0)
    rc = await_reply(s, frame.request_id, &reply);
  if (rc < 0)
    return rc;
  const Perfetto__Protos__IPCFrame__BindServiceReply *r = reply->msg_bind_service_reply;
  if (reply->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY || !r->success) {
    tr_ipc_frame_free(reply);
    return TR_ERR_NOT_FOUND;
  }
  s->service_id = r->service_id;
  tr_ipc_producer_method_ids(r, s->method_ids);
  tr_ipc_frame_free(reply);
  return 0;
}

static int initialize(lg_session *s, const lg_session_config *cfg) {
  Perfetto__Protos__InitializeConnectionRequest req =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__INIT;
  req.has_shared_memory_page_size_hint_bytes = req.has_shared_memory_size_hint_bytes = 1;
  req.shared_memory_page_size_hint_bytes = cfg->page_size_hint;
  req.shared_memory_size_hint_bytes = cfg->smb_size_hint;
  req.producer_name = (char *)cfg->producer_name;
  req.has_smb_scraping_mode = 1;
  req.smb_scraping_mode =
      PERFETTO__PROTOS__INITIALIZE_CONNECTION_REQUEST__PRODUCER_SMBSCRAPING_MODE__SMB_SCRAPING_ENABLED;
  req.sdk_version = "tracerelay-loadgen (Perfetto SDK v58.2 ABI)";
  uint64_t init_id;
  int rc = invoke(s, TR_PM_INITIALIZE_CONNECTION, &req.base, false, &init_id);
  Perfetto__Protos__GetAsyncCommandRequest async = PERFETTO__PROTOS__GET_ASYNC_COMMAND_REQUEST__INIT;
  if (rc == 0)
    rc = invoke(s, TR_PM_GET_ASYNC_COMMAND, &async.base, false, &s->async_request_id);
  Perfetto__Protos__IPCFrame *reply = NULL;
  if (rc == 0)
    rc = await_reply(s, init_id, &reply);
  if (rc < 0)
    return rc;
  rc = TR_ERR_PROTO;
  const Perfetto__Protos__IPCFrame__InvokeMethodReply *r = reply->msg_invoke_method_reply;
  if (reply->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY && r->success) {
    Perfetto__Protos__InitializeConnectionResponse *resp =
        perfetto__protos__initialize_connection_response__unpack(NULL, r->reply_proto.len,
                                                                  r->reply_proto.data);
    if (resp)
      rc = resp->use_shmem_emulation ? TR_ERR_UNSUPPORTED : 0;
    perfetto__protos__initialize_connection_response__free_unpacked(resp, NULL);
  }
  tr_ipc_frame_free(reply);
  return rc;
}

static int register_data_source(lg_session *s, const lg_session_config *cfg) {
  /* TrackEventDescriptor {available_categories {name "loadgen"}}. */
  static uint8_t te_desc[] = {0x0a, 0x09, 0x0a, 0x07, 'l', 'o', 'a', 'd', 'g', 'e', 'n'};
  Perfetto__Protos__DataSourceDescriptor desc = PERFETTO__PROTOS__DATA_SOURCE_DESCRIPTOR__INIT;
  desc.name = (char *)cfg->data_source;
  desc.has_will_notify_on_stop = desc.has_will_notify_on_start = 1;
  desc.will_notify_on_stop = desc.will_notify_on_start = 1;
  desc.has_handles_incremental_state_clear = desc.handles_incremental_state_clear = 1;
  desc.has_track_event_descriptor_raw = 1;
  desc.track_event_descriptor_raw = (ProtobufCBinaryData){sizeof(te_desc), te_desc};
  /* The SDK gives each data source a random 64-bit id. */
  desc.has_id = 1;
  if (getrandom(&desc.id, sizeof(desc.id), 0) != sizeof(desc.id) || desc.id == 0)
    desc.id = 1;
  if (cfg->no_flush)
    desc.has_no_flush = desc.no_flush = 1;
  Perfetto__Protos__RegisterDataSourceRequest req =
      PERFETTO__PROTOS__REGISTER_DATA_SOURCE_REQUEST__INIT;
  req.data_source_descriptor = &desc;
  return invoke(s, TR_PM_REGISTER_DATA_SOURCE, &req.base, false, &s->register_request_id);
}

int lg_session_open(lg_session *s, const char *socket_path, const lg_session_config *cfg) {
  memset(s, 0, sizeof(*s));
  s->next_request_id = 1;
  pthread_mutex_init(&s->lock, NULL);
  int rc = lg_conn_open(&s->conn, socket_path);
  if (rc == 0)
    rc = bind_service(s);
  if (rc == 0)
    rc = initialize(s, cfg);
  if (rc == 0)
    rc = register_data_source(s, cfg);
  if (rc < 0)
    lg_session_close(s);
  return rc;
}

void lg_session_close(lg_session *s) {
  lg_conn_close(&s->conn);
  pthread_mutex_destroy(&s->lock);
  free(s->items);
  s->items = NULL;
  s->num_items = s->cap_items = 0;
}

static int check_register_reply(const Perfetto__Protos__IPCFrame__InvokeMethodReply *r) {
  if (!r->success)
    return TR_ERR_PROTO;
  Perfetto__Protos__RegisterDataSourceResponse *resp =
      perfetto__protos__register_data_source_response__unpack(NULL, r->reply_proto.len,
                                                              r->reply_proto.data);
  int rc = 0;
  if (resp && resp->error && resp->error[0]) {
    TR_ERROR("loadgen", "the service refused the data source: %s", resp->error);
    rc = TR_ERR_PROTO;
  }
  perfetto__protos__register_data_source_response__free_unpacked(resp, NULL);
  return rc;
}

int lg_session_next_command(lg_session *s, int timeout_ms,
                            Perfetto__Protos__GetAsyncCommandResponse **cmd) {
  for (;;) {
    Perfetto__Protos__IPCFrame *frame;
    int rc = lg_conn_next(&s->conn, timeout_ms, &frame);
    if (rc <= 0) {
      int sent = lg_session_send_commits(s, 0);
      return rc < 0 ? rc : sent;
    }
    if (frame->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_REQUEST_ERROR) {
      TR_WARN("loadgen", "the service answered request %llu with an error: %s",
              (unsigned long long)frame->request_id,
              frame->msg_request_error->error ? frame->msg_request_error->error : "");
    } else if (frame->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY) {
      const Perfetto__Protos__IPCFrame__InvokeMethodReply *r = frame->msg_invoke_method_reply;
      if (frame->request_id == s->register_request_id)
        rc = check_register_reply(r);
      else if (frame->request_id == s->async_request_id && !r->success)
        rc = TR_ERR_PROTO;
      else if (frame->request_id == s->async_request_id)
        *cmd = perfetto__protos__get_async_command_response__unpack(NULL, r->reply_proto.len,
                                                                      r->reply_proto.data);
      if (rc == 0 && frame->request_id == s->async_request_id)
        rc = *cmd ? 1 : TR_ERR_DECODE;
    }
    tr_ipc_frame_free(frame);
    if (rc != 0)
      return rc;
  }
}

int lg_session_take_fd(lg_session *s) { return lg_conn_take_fd(&s->conn); }

int lg_session_notify_started(lg_session *s, uint64_t instance_id) {
  Perfetto__Protos__NotifyDataSourceStartedRequest req =
      PERFETTO__PROTOS__NOTIFY_DATA_SOURCE_STARTED_REQUEST__INIT;
  req.has_data_source_id = 1;
  req.data_source_id = instance_id;
  return invoke(s, TR_PM_NOTIFY_STARTED, &req.base, true, NULL);
}

int lg_session_notify_stopped(lg_session *s, uint64_t instance_id) {
  Perfetto__Protos__NotifyDataSourceStoppedRequest req =
      PERFETTO__PROTOS__NOTIFY_DATA_SOURCE_STOPPED_REQUEST__INIT;
  req.has_data_source_id = 1;
  req.data_source_id = instance_id;
  return invoke(s, TR_PM_NOTIFY_STOPPED, &req.base, true, NULL);
}

int lg_session_activate_trigger(lg_session *s, const char *name) {
  Perfetto__Protos__ActivateTriggersRequest req = PERFETTO__PROTOS__ACTIVATE_TRIGGERS_REQUEST__INIT;
  char *names[] = {(char *)name};
  req.n_trigger_names = 1;
  req.trigger_names = names;
  return invoke(s, TR_PM_ACTIVATE_TRIGGERS, &req.base, true, NULL);
}

int lg_session_register_writer(lg_session *s, uint32_t writer_id, uint32_t target_buffer) {
  Perfetto__Protos__RegisterTraceWriterRequest req =
      PERFETTO__PROTOS__REGISTER_TRACE_WRITER_REQUEST__INIT;
  req.has_trace_writer_id = req.has_target_buffer = 1;
  req.trace_writer_id = writer_id;
  req.target_buffer = target_buffer;
  return invoke(s, TR_PM_REGISTER_TRACE_WRITER, &req.base, true, NULL);
}

static lg_commit_item *add_item(lg_session *s) {
  if (s->num_items == s->cap_items) {
    size_t cap = s->cap_items ? s->cap_items * 2 : 64;
    lg_commit_item *items = realloc(s->items, cap * sizeof(*items));
    if (!items)
      return NULL;
    s->items = items;
    s->cap_items = cap;
  }
  lg_commit_item *it = &s->items[s->num_items++];
  memset(it, 0, sizeof(*it));
  return it;
}

int lg_session_queue_commit(void *ctx, const lg_commit *c) {
  lg_session *s = ctx;
  int rc = 0;
  pthread_mutex_lock(&s->lock);
  lg_commit_item *it = NULL;
  if (c->has_move && (it = add_item(s)) != NULL) {
    it->is_move = true;
    it->page = c->page;
    it->chunk = c->chunk;
    it->target_buffer = c->target_buffer;
  }
  if (c->has_move && !it)
    rc = TR_ERR_NOMEM;
  if (c->has_move && s->latency)
    lg_latency_offer(s->latency, c->page, c->chunk);
  /* Patches arrive in chunk order: one entry per chunk. */
  for (size_t i = 0; rc == 0 && i < c->num_patches; i++) {
    if (i == 0 || c->patches[i].chunk_id != c->patches[i - 1].chunk_id) {
      it = add_item(s);
      if (!it) {
        rc = TR_ERR_NOMEM;
        break;
      }
      it->target_buffer = c->target_buffer;
      it->writer_id = c->writer_id;
      it->chunk_id = c->patches[i].chunk_id;
    }
    it->patches[it->num_patches++] = c->patches[i];
  }
  if (rc == 0 && c->num_patches > 0)
    it->has_more = c->last_has_more;
  pthread_mutex_unlock(&s->lock);
  lg_conn_wake(&s->conn);
  return rc;
}

/* Sends items [0, n) as one CommitData (n may be 0 for a bare flush ack). */
static int send_frame(lg_session *s, const lg_commit_item *items, size_t n, uint64_t flush_id) {
  size_t moves = 0, entries = 0, patches = 0;
  for (size_t i = 0; i < n; i++) {
    moves += items[i].is_move;
    entries += !items[i].is_move;
    patches += items[i].num_patches;
  }
  Perfetto__Protos__CommitDataRequest__ChunksToMove *mv = calloc(moves + 1, sizeof(*mv));
  Perfetto__Protos__CommitDataRequest__ChunksToMove **mvp = calloc(moves + 1, sizeof(*mvp));
  Perfetto__Protos__CommitDataRequest__ChunkToPatch *cp = calloc(entries + 1, sizeof(*cp));
  Perfetto__Protos__CommitDataRequest__ChunkToPatch **cpp = calloc(entries + 1, sizeof(*cpp));
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *pt = calloc(patches + 1, sizeof(*pt));
  Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch **ptp =
      calloc(patches + 1, sizeof(*ptp));
  Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
  int rc = TR_ERR_NOMEM;
  if (!mv || !mvp || !cp || !cpp || !pt || !ptp)
    goto done;
  size_t np = 0;
  for (size_t i = 0; i < n; i++) {
    const lg_commit_item *it = &items[i];
    if (it->is_move) {
      Perfetto__Protos__CommitDataRequest__ChunksToMove *m = &mv[req.n_chunks_to_move];
      perfetto__protos__commit_data_request__chunks_to_move__init(m);
      m->has_page = m->has_chunk = m->has_target_buffer = 1;
      m->page = it->page;
      m->chunk = it->chunk;
      m->target_buffer = it->target_buffer;
      mvp[req.n_chunks_to_move++] = m;
      continue;
    }
    Perfetto__Protos__CommitDataRequest__ChunkToPatch *e = &cp[req.n_chunks_to_patch];
    perfetto__protos__commit_data_request__chunk_to_patch__init(e);
    e->has_target_buffer = e->has_writer_id = e->has_chunk_id = 1;
    e->target_buffer = it->target_buffer;
    e->writer_id = it->writer_id;
    e->chunk_id = it->chunk_id;
    e->has_has_more_patches = e->has_more_patches = it->has_more;
    e->patches = &ptp[np];
    for (size_t j = 0; j < it->num_patches; j++, np++) {
      perfetto__protos__commit_data_request__chunk_to_patch__patch__init(&pt[np]);
      pt[np].has_offset = pt[np].has_data = 1;
      pt[np].offset = it->patches[j].offset;
      pt[np].data = (ProtobufCBinaryData){4, (uint8_t *)it->patches[j].data};
      ptp[np] = &pt[np];
    }
    e->n_patches = it->num_patches;
    cpp[req.n_chunks_to_patch++] = e;
  }
  req.chunks_to_move = mvp;
  req.chunks_to_patch = cpp;
  req.has_flush_request_id = flush_id != 0;
  req.flush_request_id = flush_id;
  rc = invoke(s, TR_PM_COMMIT_DATA, &req.base, true, NULL);
  s->commits_sent++;
done:
  free(mv);
  free(mvp);
  free(cp);
  free(cpp);
  free(pt);
  free(ptp);
  return rc;
}

int lg_session_send_commits(lg_session *s, uint64_t flush_request_id) {
  pthread_mutex_lock(&s->lock);
  lg_commit_item *items = s->items;
  size_t n = s->num_items;
  s->items = NULL;
  s->num_items = s->cap_items = 0;
  if (n && s->latency)
    lg_latency_taken(s->latency);
  pthread_mutex_unlock(&s->lock);

  int rc = 0;
  size_t start = 0;
  while (rc == 0 && start < n) {
    size_t end = start, moves = 0, entries = 0;
    while (end < n && moves < MAX_MOVES_PER_FRAME && entries < MAX_PATCH_ENTRIES_PER_FRAME) {
      moves += items[end].is_move;
      entries += !items[end].is_move;
      end++;
    }
    rc = send_frame(s, items + start, end - start, end == n ? flush_request_id : 0);
    start = end;
  }
  if (rc == 0 && n == 0 && flush_request_id != 0)
    rc = send_frame(s, NULL, 0, flush_request_id);
  free(items);
  return rc;
}
