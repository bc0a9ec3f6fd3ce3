/* session_fixture.h: the service's sessions (service/session.h) on a test's own loop, without
 * processes or a network, for test_session*.c.
 *
 * The link's down-calls (struct tr_link_commands, link_calls.h) are a table of the fixture's,
 * given to the service state: send_command records each command in fx_sent (refusing, as the
 * real one does, a host whose link is down) and probe_clock counts. The link's up-calls are
 * the test's to make, through tr_session_link_events as the link server would, with the
 * helpers below: hosts with producers connect, and answer the recorded commands
 * (CommandReply, FlushAck) when told to.
 * Nothing is answered on its own, so a test decides which host is slow, silent or gone. */
#ifndef TEST_SESSION_FIXTURE_H
#define TEST_SESSION_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "service/session.h"

#define FX_MAX_HOSTS 12
#define FX_MAX_PRODUCERS 3 /* per host */
#define FX_MAX_SENT 128

/* One command the sessions sent down the link. */
struct fx_sent {
  const tr_host *host;
  Tracerelay__Command__CmdCase what;
  uint32_t producer_id;
  uint64_t request_id;
  uint64_t instance_id;   /* setup, start, stop */
  char ds_name[32];       /* setup */
  uint32_t target_buffer; /* setup: the session buffer's global id */
  uint64_t flush_id;      /* flush */
  size_t num_flushed;     /* flush: how many instances it names */
  bool answered;
};

extern uv_loop_t fx_loop;
extern tr_service fx_svc;
extern tr_hosts *fx_host_table; /* the service's host table, made by fx_setup */
extern tr_host *fx_hosts[FX_MAX_HOSTS]; /* fx_make_host's, in it */
extern struct fx_sent fx_sent[FX_MAX_SENT];
extern size_t fx_num_sent;
extern size_t fx_probes; /* probe_clock calls */
/* The arrival fx_answer gives the FlushAcks it sends (BOOTTIME; 0, not known, after fx_setup). */
extern int64_t fx_ack_arrived_ns;

/* What the session told its consumer. */
struct fx_observed {
  size_t instances_set_up, instances_started, all_started, ended;
  size_t clone_triggers;           /* CLONE_SNAPSHOT hits told */
  uint64_t clone_trigger_session;  /* the session the last one named */
};
extern struct fx_observed fx_observed;
extern const tr_session_observer fx_observer; /* counts into fx_observed */

/* Loop, host table and service state; fx_teardown frees every session and host and checks
 * the loop closes. */
void fx_setup(void);
void fx_teardown(void);

/* Host i named `name` (a machine name) in the host table, with num_producers producers (ids
 * 1, 2, ...) announced as its agent would, producer p offering the data sources named in
 * data_sources[p] (up to 2 names, NULL-ended).
 * fx_link_up brings its link up in the host table; fx_connect does and tells the sessions it
 * connected; fx_disconnect that its link went down. */
void fx_make_host(size_t i, const char *name, size_t num_producers,
                  const char *const data_sources[][3]);
void fx_link_up(size_t i);
void fx_connect(size_t i);
void fx_disconnect(size_t i);
/* Host i's producer 1 sends one chunk of one complete packet (timestamp 7) into the session
 * buffer global_id, through the link's chunk event. */
void fx_send_chunk(size_t i, uint32_t global_id);
/* Adds producer (id = the next one) to host i and tells the sessions. */
void fx_add_producer(size_t i, const char *const data_sources[3]);

/* A config of one 1 MiB buffer and the data sources named (up to 2, NULL-ended); a data
 * source named "x@host" gets machine_name_filter ["host"]. */
struct fx_config {
  Perfetto__Protos__TraceConfig cfg;
  Perfetto__Protos__TraceConfig__BufferConfig buf, *bufs[1];
  Perfetto__Protos__TraceConfig__DataSource ds[2], *dss[2];
  Perfetto__Protos__DataSourceConfig dsc[2];
  char names[2][32], machines[2][32];
  char *machine_ptrs[2];
};
void fx_config(struct fx_config *c, const char *const names[]);
/* tr_session_enable with fx_observer; asserts success. */
tr_session *fx_enable(struct fx_config *c);

/* How many commands of kind `what` went to host i (any host: i = FX_MAX_HOSTS). */
size_t fx_count(size_t i, Tracerelay__Command__CmdCase what);
/* Answers every unanswered command of kind `what` to host i with a CommandReply (setup,
 * start, stop) or a FlushAck (flush). */
void fx_answer(size_t i, Tracerelay__Command__CmdCase what);
/* Runs the loop until *flag != -1 (a flush callback's result); asserts it happens. */
void fx_run_until_set(const int *flag);

/* The session's host entries (one per agent instance) as its TraceStats extension lists them,
 * and the TraceStats; free both with fx_stats_free. */
struct fx_stats {
  Perfetto__Protos__TraceStats *stats;
  Tracerelay__TraceStatsExtension *ext;
};
void fx_stats(tr_session *s, struct fx_stats *out);
void fx_stats_free(struct fx_stats *st);

/* Runs fn(ud) with stderr (the log) going into buf (at most cap - 1 bytes, NUL-ended). */
void fx_capture_log(void (*fn)(void *ud), void *ud, char *buf, size_t cap);

#endif
