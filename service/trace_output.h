/* trace_output.h: a session's read side (service/trace_output.c): what it turns into trace
 * packets, and all it keeps to do so, behind one opaque tr_trace_output the session holds.
 *
 * One read pass yields, in order: the service's packets (on the first pass: clock snapshot,
 * sync marker, trace_config, trace_uuid, SystemInfo of the service machine then of each remote
 * host; on every pass: the service events since the last one, the hosts' link marks, the clock
 * journal and the clock packets since), then for each buffer and each host the packets of that
 * (buffer, host) central buffer with the trusted slice to append, then
 * read_tracing_buffers_completed and TraceStats. With a trace_filter in the config, every packet
 * but that TraceStats comes out filtered (an empty packet where the filter errs), and TraceStats
 * carries filter_stats. A pass is final once the session stopped
 * (tr_trace_output_stop): nothing stalls then and the buffers end empty.
 *
 * The read side owns: the pass in progress, the service events and link marks not yet written,
 * the clock journal, each host entry's clock bookkeeping (remote_clock_sync written so far, its
 * clock anchor, its error bound track), the timeline state (service/timeline_output.h), the
 * session's sequence ids, uuid and start clocks, the timers of the clock journal and the
 * periodic writes, and write_into_file's file (service/trace_file.h: passes written in steps by
 * a thread of the file's own). It knows the session only through tr_trace_output_params: the
 * session tells it of its host entries (tr_trace_output_add_host), its start and its stop; it
 * asks the session for TraceStats through a callback and tells it when the file is done.
 * Everything runs on the service's loop, but the file's writes. */
#ifndef TR_TRACE_OUTPUT_H
#define TR_TRACE_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "perfetto/config/trace_config.pb-c.h"
#include "relay/trace/trace_buffer.h"
#include "relay/trace/trace_filter.h"
#include "relay/trace/trace_writer.h"
#include "service/packet_list.h"
#include "service/host.h"
#include "service/timeline_output.h"

#define TR_TRACE_OUTPUT_MAX_SEQUENCES (1u << 20)
#define TR_TRACE_OUTPUT_MAX_EVENTS 64u
#define TR_TRACE_OUTPUT_MAX_HOST_MARKS 64u /* pending between two read passes */
#define TR_TRACE_OUTPUT_MAX_TRIGGERS 64u   /* likewise */

/* The session's clock journal, run every TR_CLOCK_JOURNAL_MS while it runs: what a read pass
 * would write of the clocks (remote_clock_sync in `machines`, cross-host snapshots in
 * `global-clocks`, host clock snapshots in both) up to each host's present, kept for the next
 * pass, which writes it first. So the mapping of a session read only at its end comes from the
 * estimators as they were during it, not from what their bounded histories still hold at the
 * end. */
#define TR_CLOCK_JOURNAL_MS 1000
/* Its bound: past this many packets per host of the session (about 55 min of a host at 20
 * packets a second, 30 s of one running 200 ppm fast at 2,000, 6 MB), every other packet of
 * its older half is dropped (bound samples and anchors kept), and logged once. */
#define TR_CLOCK_JOURNAL_PER_HOST 65536u

typedef struct tr_trace_output tr_trace_output;

/* A host's link going down or coming back during the session, written as an instant on the
 * service's track ("host web-2 disconnected") at the next read pass. */
enum tr_host_mark_kind { TR_MARK_DISCONNECTED, TR_MARK_RECONNECTED, TR_MARK_AGENT_RESTARTED };

/* What the read side knows of its session. cfg, system_info and ud outlive the read side. */
typedef struct tr_trace_output_params {
  uv_loop_t *loop;
  uint64_t session_id; /* for the log, and the uuid when the kernel gives no random bytes */
  int32_t uid;         /* trusted_uid of the service's packets */
  enum tr_timeline timeline;
  const Perfetto__Protos__SystemInfo *system_info; /* the service machine's */
  const Perfetto__Protos__TraceConfig *cfg;
  /* The session's TraceStats at service BOOTTIME ts as a packet, for the tail of each pass:
   * 0 or TR_ERR_NOMEM. */
  int (*trace_stats)(void *ud, uint64_t ts, tr_trace_writer_buf *out);
  /* A periodic write reached max_file_size_bytes: the session should stop. */
  void (*on_file_full)(void *ud);
  /* The file's final pass is written and the file closed (after tr_trace_output_stop
   * returned true). */
  void (*on_file_done)(void *ud);
  /* write_flush_mode asks for a flush before each periodic write (config_check.h's flush
   * plan): the write timer calls this instead of writing, and the session calls
   * tr_trace_output_write_now once the flush is done. NULL: writes need no flush. */
  void (*flush_before_write)(void *ud);
  bool sync_after_write; /* fflush_post_write: the file synced to disk after each write */
  void *ud;
} tr_trace_output_params;

/* Makes the read side of a session (its start clocks taken now; its uuid cfg's
 * trace_uuid_msb/lsb when either is set, as traced, else random), with the session's
 * output file when cfg asks for write_into_file: output_path created (never overwritten) if set,
 * else output_fd. output_fd is taken in every case (closed unless it is the file written).
 * TR_ERR_CONFIG (err filled: write_into_file without a file), TR_ERR_SYS(errno) for
 * output_path (err filled), TR_ERR_NOMEM. */
int tr_trace_output_new(const tr_trace_output_params *p, int output_fd, tr_trace_output **out,
                        char *err, size_t err_len);
/* The read side of a clone of src's session (service/session_clone.c), with p (p->cfg the
 * clone's; no file, every pass final): src's start clocks and session start for the timeline,
 * traced's uuid rule (a new msb, src's lsb), and src's service events and host link marks not
 * yet written. Its host entries are added as a session's are. 0 or TR_ERR_NOMEM.
 * Its clock packets come from the hosts' estimators as they are now (src's clock journal is not
 * copied), as for a session read only at its end. */
int tr_trace_output_clone(const tr_trace_output *src, const tr_trace_output_params *p,
                          tr_trace_output **out);
/* A packet for the first pass's head, after trace_uuid (a clone's clone_snapshot_trigger);
 * taken (freed with the read side if never written). */
void tr_trace_output_set_head_packet(tr_trace_output *o, tr_trace_writer_buf pkt);
/* The trace_uuid its head writes (CloneSession's reply). */
void tr_trace_output_uuid(const tr_trace_output *o, int64_t *msb, int64_t *lsb);
/* Drops every state and closes the file and the timers; the memory goes once they closed. */
void tr_trace_output_free(tr_trace_output *o);

/* The session's host entry `index` (entries are numbered in the order given, from 0): its
 * host and its central buffers by buffer index, an array the session keeps (NULL entries:
 * not made yet). 0 or TR_ERR_NOMEM. */
int tr_trace_output_add_host(tr_trace_output *o, const tr_host *host, tr_tbuf *const *tbufs);

/* The session started: the clock journal runs every TR_CLOCK_JOURNAL_MS. */
void tr_trace_output_start_journal(tr_trace_output *o);
/* Likewise the periodic writes into the file every file_write_period_ms (5 s if unset), when
 * there is one. A write that reaches max_file_size_bytes calls on_file_full. */
void tr_trace_output_start_writes(tr_trace_output *o);
/* The flush flush_before_write asked for is done (or failed): the periodic write it held back
 * now, unless the session stopped meanwhile. */
void tr_trace_output_write_now(tr_trace_output *o);
/* The session stopped: timers stopped, and the file's final pass begun (after the pass under
 * way, if any). Returns true when that pass runs on: on_file_done follows once it is written
 * and the file closed; false when there is no file to wait for. Passes read afterwards are
 * final. */
bool tr_trace_output_stop(tr_trace_output *o);
/* Writes the rest of the file now, blocking (the final pass if it had not begun), and closes
 * it: for a session freed before its final pass was written. on_file_done does not run. */
void tr_trace_output_finish_file(tr_trace_output *o);

/* A service event (tracing started, flush...) at the current time, written at the next pass.
 * Periodic flushes get half the room between two passes, so the lifecycle events always fit. */
void tr_trace_output_add_event(tr_trace_output *o, enum tr_trace_writer_event ev);
/* Likewise at service BOOTTIME ts, in time order among the events not yet written (a clone's
 * clone_started precedes its flush's events); value: the buffer index of TR_TW_BUFFER_CLONED. */
void tr_trace_output_add_event_at(tr_trace_output *o, uint64_t ts, enum tr_trace_writer_event ev,
                                  uint32_t value);
/* A host's link change at the current time, written at the next pass. host outlives it. */
/* A trigger the session received (copied), for the next pass's head, where traced puts it:
 * after the trace config. 0, TR_ERR_FULL (TR_TRACE_OUTPUT_MAX_TRIGGERS pending: logged), or
 * TR_ERR_NOMEM. */
int tr_trace_output_add_trigger(tr_trace_output *o, uint64_t boottime_ns,
                                const struct tr_trace_writer_trigger *t);
/* While withheld (a session waiting for its trigger, or one read only through clones, as
 * traced's IsWaitingForTrigger), a pass yields no packet at all, as traced returns none. */
void tr_trace_output_withhold(tr_trace_output *o, bool withheld);
void tr_trace_output_add_host_mark(tr_trace_output *o, const tr_host *host,
                                   enum tr_host_mark_kind kind);

/* The clock journal's run (normally from its timer): what a non-final pass would write of the
 * clocks now. 0 or TR_ERR_NOMEM. */
int tr_trace_output_journal_clocks(tr_trace_output *o);

/* `machines`: whether the clock anchor of host entry `index` (its machine's) is written, after
 * which trace_processor may see the host's ClockSnapshots and data; until then a non-final pass
 * leaves them for a later one (docs/timeline.md, `machines`). Always true in `global-clocks`. */
bool tr_trace_output_host_anchored(const tr_trace_output *o, size_t index);

/* Starts a read pass (ends any unfinished one). 0, TR_ERR_NOMEM. */
int tr_trace_output_begin(tr_trace_output *o);
/* The next packet of the pass: 1, 0 at its end, TR_ERR_NOMEM. */
int tr_trace_output_next(tr_trace_output *o, tr_output_packet *out);
/* Drops the pass state. */
void tr_trace_output_reset(tr_trace_output *o);

/* TraceConfig.trace_filter builds as the read side will build it (relay/trace/trace_filter.h):
 * 0 (also without one), TR_ERR_CONFIG with traced's reason in err, TR_ERR_NOMEM. */
int tr_trace_output_check_filter(const Perfetto__Protos__TraceConfig *cfg, char *err,
                                 size_t err_len);
/* TraceStats.filter_stats of a session with a trace_filter (false: none): the filter's counts
 * with the TraceStats packets that bypassed it, and the bytes it took out of each buffer's
 * packets, for buffers [0, *n_buffers) (valid until the next read pass). */
bool tr_trace_output_filter_stats(const tr_trace_output *o, tr_trace_filter_stats *st,
                                  const uint64_t **discarded_per_buffer, size_t *n_buffers);

/* Host packets the `global-clocks` rewrite dropped as malformed (TraceStats.invalid_packets). */
uint64_t tr_trace_output_invalid_packets(const tr_trace_output *o);

#endif
