/* session.h: the loadgen's ProducerPort session (reference section 2), in the order the real SDK
 * producer follows (tests/vectors/ipc/producer-unix.frames.txt): BindService "ProducerPort";
 * InitializeConnection and GetAsyncCommand back to back; RegisterDataSource; then the service's
 * commands arrive on the GetAsyncCommand stream and the producer answers with
 * NotifyDataSourceStarted/Stopped, RegisterTraceWriter and CommitData, all with drop_reply.
 *
 * Commits are batched as the SDK's arbiter batches them: writer threads add chunks and patches
 * to one pending CommitDataRequest (lg_session_queue_commit, any thread) and wake the IPC thread,
 * which sends whatever has accumulated, split below the IPC frame limit in the order the items
 * were added (so a patch never travels before its chunk). A flush ack rides on the last frame.
 * Every other call belongs to the IPC thread. */
#ifndef LG_SESSION_H
#define LG_SESSION_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/producer/ipc_frame.h"
#include "tools/loadgen/ipc_conn.h"
#include "tools/loadgen_writer/smb_writer.h"

typedef struct lg_session_config {
  const char *producer_name;
  const char *data_source;
  uint32_t page_size_hint;  /* bytes, 0 = none */
  uint32_t smb_size_hint;   /* bytes, 0 = none */
  bool no_flush;            /* register with no_flush, as the SDK's track_event does */
} lg_session_config;

typedef struct lg_commit_item lg_commit_item;

typedef struct lg_session {
  lg_conn conn;
  uint32_t service_id;
  uint32_t method_ids[TR_PM_COUNT]; /* ProducerPort method -> id in the bind reply, 0: absent */
  uint64_t next_request_id;
  uint64_t async_request_id;
  uint64_t register_request_id;

  pthread_mutex_t lock; /* guards the pending commit below */
  lg_commit_item *items;
  size_t num_items;
  size_t cap_items;
  uint64_t commits_sent; /* CommitData frames */
  struct lg_latency *latency; /* if set, offered every moved chunk (commit_latency.h) */
} lg_session;

/* Connects, binds ProducerPort, sends InitializeConnection + GetAsyncCommand +
 * RegisterDataSource, and waits for the InitializeConnection reply. TR_ERR_UNSUPPORTED if the
 * service asks for shared-memory emulation (the loadgen needs a real SMB). */
int lg_session_open(lg_session *s, const char *socket_path, const lg_session_config *cfg);
void lg_session_close(lg_session *s);

/* Waits up to timeout_ms for the next GetAsyncCommand, sending queued commits whenever a writer
 * wakes the IPC thread. Returns 1 with *cmd (free with
 * perfetto__protos__get_async_command_response__free_unpacked), 0 on timeout, or a negative
 * code (TR_ERR_CLOSED when the service went away, TR_ERR_PROTO when it refused a call). */
int lg_session_next_command(lg_session *s, int timeout_ms,
                            Perfetto__Protos__GetAsyncCommandResponse **cmd);
/* The fd that came with setup_tracing (the caller owns it), or -1. */
int lg_session_take_fd(lg_session *s);

int lg_session_notify_started(lg_session *s, uint64_t instance_id);
int lg_session_notify_stopped(lg_session *s, uint64_t instance_id);
/* ActivateTriggers with one name (no reply asked). */
int lg_session_activate_trigger(lg_session *s, const char *name);
int lg_session_register_writer(lg_session *s, uint32_t writer_id, uint32_t target_buffer);

/* The smb_writer commit callback (ctx = the session): queues and wakes the IPC thread. */
int lg_session_queue_commit(void *ctx, const lg_commit *commit);
/* Sends every queued item now, then the flush ack if flush_request_id != 0. */
int lg_session_send_commits(lg_session *s, uint64_t flush_request_id);

#endif
