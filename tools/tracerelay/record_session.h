/* record_session.h: one consumer session of `tracerelay record`, as the perfetto CLI runs it
 * (reference 3.3): BindService(ConsumerPort), EnableTracing, wait for its reply (sent when the
 * session ends), then ReadBuffers into the output. A stop request (Ctrl-C, SIGTERM) sends
 * Flush(0, perfetto_cmd|trace-stop), then DisableTracing, and the wait goes on; a second one
 * gives up at once. With clone set, CloneSession of a live session replaces EnableTracing and
 * the wait: the clone is read at once, and the session goes on. The service's stats (GetTraceStats, polled) name the data sources no
 * producer matched and the machines not connected: record warns once, or fails (--strict). */
#ifndef TRACERELAY_RECORD_SESSION_H
#define TRACERELAY_RECORD_SESSION_H

#include <signal.h>
#include <stdbool.h>

#include "perfetto/config/trace_config.pb-c.h"

/* Flush flags (reference 2.2): reason 2 = trace stop (bits 0-3), initiator 2 = perfetto_cmd
 * (bits 4-7). */
#define RECORD_FLUSH_FLAGS ((2u << 4) | 2u)
#define RECORD_CONNECT_TIMEOUT_MS 5000
/* How long the service may take to end the session once stopped, beyond its own timeouts. */
#define RECORD_STOP_GRACE_MS 60000
/* How long the read-back waits for the service's next reply, unless --read-timeout says. */
#define RECORD_READ_IDLE_MS_DEFAULT 30000

typedef struct record_session {
  const char *socket_path;
  const Perfetto__Protos__TraceConfig *config;
  const char *out_path;  /* for messages; NULL when the service writes output_path itself */
  /* Opens the output (when out_path is set), once the service has answered, so that a service
   * that is not there leaves no file and an existing one as it was. Returns the fd where
   * packets go, or -1 after printing why not. */
  int (*open_output)(void *ctx);
  void *output_ctx;
  bool pass_fd;          /* write_into_file: hand the output to the service with EnableTracing */
  volatile sig_atomic_t *stop_requests; /* bumped by the signal handler */
  bool progress_lines;   /* --progress: progress as stderr lines even off a terminal */
  bool strict;           /* --strict: what the config asked for and no host has fails the run */
  int64_t read_idle_ms;  /* --read-timeout: the read-back gives up after this long without a
                            reply (0: it waits as long as the connection is open) */
  /* --clone ID / --clone-by-name NAME: CloneSession of a live session (as perfetto --clone),
   * then ReadBuffers of the clone; config is then an empty TraceConfig, never sent. */
  bool clone;
  bool clone_by_id;
  uint64_t clone_id;
  const char *clone_name;
  /* A session with CLONE_SNAPSHOT triggers: record observes them (ObserveEvents) and calls
   * this at each one, as the perfetto CLI clones the session then, while the wait goes on;
   * a non-zero return ends the run. NULL: none followed. */
  int (*on_clone_trigger)(void *ctx, uint64_t session_id, const char *trigger_name);
  void *clone_ctx;
} record_session;

/* Runs the session and prints what went wrong to stderr. Returns the exit status: 0, or 1 for
 * any failure, including an error in the EnableTracing reply. */
int record_session_run(const record_session *s);

#endif
