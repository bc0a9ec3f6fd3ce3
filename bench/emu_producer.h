/* emu_producer.h: an in-process Perfetto producer on a libuv loop, the stand-in for one
 * tracerelay-loadgen in bench/many_agents (many of them share a loop thread).
 *
 * It speaks the ProducerPort over the real IPC (emu_ipc.h) in the SDK's order, as
 * tools/loadgen/session.c does: BindService "ProducerPort"; InitializeConnection and
 * GetAsyncCommand back to back; RegisterDataSource (will_notify_on_start/stop, incremental
 * state clears, a TrackEventDescriptor); then it follows the commands on the GetAsyncCommand
 * stream:
 * - setup_tracing: maps the shared memory the agent sent (the fd that came with it);
 * - setup_data_source: nothing to do;
 * - start_data_source: NotifyDataSourceStarted; with a rate, RegisterTraceWriter and events
 *   written into the shared memory at that rate by the loadgen's own SMB writer
 *   (tools/loadgen_writer/smb_writer.h, packet.h: real TrackEvent packets, chunks, fragments and
 *   patches), committed with CommitData when a chunk fills, as the SDK does;
 * - flush: commits the chunk being written, then CommitData{flush_request_id} (one frame);
 * - stop_data_source: ends the sequence, commits, NotifyDataSourceStopped;
 * - clear_incremental_state: the sequence writes its state again.
 * Unlike the loadgen it outlives a session: the next start begins a new sequence on writer 1.
 * It writes for one instance at a time; another started meanwhile is confirmed, not written.
 * No writer threads: events are written on the loop, so the SMB sees one writer at a time. */
#ifndef EMU_PRODUCER_H
#define EMU_PRODUCER_H

#include <stdint.h>
#include <uv.h>

typedef struct emu_producer emu_producer;

/* Strings must stay valid while the producer runs. */
struct emu_producer_config {
  const char *socket_path; /* the agent's producer socket */
  const char *name;        /* the producer's name */
  const char *data_source; /* the data source it registers */
  double rate;             /* events per second while an instance runs; 0: no data */
  int32_t tid;             /* the thread id its packets name */
  void *data;
  /* The agent accepted the data source. */
  void (*on_registered)(void *data);
  /* The agent closed the connection (TR_ERR_CLOSED) or the producer failed (another code,
   * logged here); it does nothing more until emu_producer_close. Called at most once. */
  void (*on_ended)(void *data, int status);
};

struct emu_producer_counts {
  uint64_t starts, stops, flushes, events_written, events_dropped;
};

/* Connects and starts the handshake. TR_ERR_NOMEM or the connect error. */
int emu_producer_start(uv_loop_t *loop, const struct emu_producer_config *cfg,
                       emu_producer **out);
void emu_producer_counts(const emu_producer *p, struct emu_producer_counts *out);
/* Disconnects (as a producer process that exits: nothing more is committed) and frees p once
 * its handles are closed; done(data) (if not NULL) runs then. */
void emu_producer_close(emu_producer *p, void (*done)(void *data), void *data);

#endif
