/* timeline_output.h: what the trace output adds for the timeline (docs/timeline.md), beside the
 * packets themselves: the hosts' own clock snapshots (both encodings) and, in `global-clocks`,
 * the rewrite of every host packet (relay/trace/packet_rewrite.h) and the cross-host ClockSnapshots
 * from each host's clock estimator (service/timeline_output.c).
 *
 * One tr_timeline_out per session's read side (service/trace_output.c, which alone calls it),
 * kept across read passes: per (host entry, sequence) rewrite state, per host entry what was
 * exported so far. Host entries are the session's, by index: a restarted agent gets a new one. */
#ifndef TR_TIMELINE_OUTPUT_H
#define TR_TIMELINE_OUTPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "relay/trace/sequence_ids.h"
#include "service/packet_list.h"
#include "service/host.h"

/* How a trace puts the hosts on one timeline (docs/timeline.md). */
enum tr_timeline { TR_TIMELINE_MACHINES = 0, TR_TIMELINE_GLOBAL_CLOCKS = 1 };

/* Tolerance of the cross-host breakpoints (tr_clocksync_export): the piecewise-offset mapping
 * trace_processor builds from them stays within this of the estimator's mapping. At 200 ppm of
 * drift that is one ClockSnapshot every 10 ms of host time (100/s), at 20 ppm one every 100 ms. */
#define TR_TIMELINE_TOLERANCE_NS 2000
/* The largest step back of trace_processor's offset from one breakpoint (global-clocks) or
 * remote_clock_sync edge (machines) to the next (tr_clocksync_steps_next): where a host's
 * clock runs fast the offset falls, and two events of one sequence closer than a step, on
 * either side of it, would swap (a slice shorter than that would end before it begins: TP
 * leaves it open, dur = -1). At 200 ppm one packet per 500 us of host time (2,000/s), at 20 ppm
 * 200/s; a host running slow needs only the tolerance. */
#define TR_TIMELINE_STEP_NS 100

typedef struct tr_timeline_out tr_timeline_out;

/* For a session of that encoding, started at service BOOTTIME start_ns, whose packets get
 * trusted_uid uid and sequence ids from seqids (the read side's, which outlives it). NULL when
 * out of memory. */
tr_timeline_out *tr_timeline_output_new(enum tr_timeline timeline, int32_t uid,
                                        tr_tbuf_seqids *seqids, int64_t start_ns);
void tr_timeline_output_free(tr_timeline_out *tl);

/* Appends to out, for host entry index (the first entry of its host), in `global-clocks` the
 * cross-host snapshots covering its BOOTTIME from where the last call stopped up to a little
 * past the host's present (final: past the estimator's frontier too). Called for each read pass
 * and for the clock journal. 0 or TR_ERR_NOMEM. */
int tr_timeline_output_cross_host(tr_timeline_out *tl, size_t index, const tr_host *host,
                                  tr_packet_list *out, bool final);
/* Host BOOTTIME up to which (exclusive) host entry index's mapping has been exported, or -1
 * before its first export. Beyond the estimator's frontier an export is the estimator's plan
 * at the time, which later probes re-plan: only that state's bound describes it. */
int64_t tr_timeline_output_exported_to(const tr_timeline_out *tl, size_t index);
/* The latest trace time at which trace_processor puts any host BOOTTIME of host entry index
 * up to host_ts (at or after the last breakpoint written): by that breakpoint's offset, or
 * further where a range whose breakpoints were left out was converted by an earlier one (it
 * lies above the mapping). -1 before the last breakpoint or before any. */
int64_t tr_timeline_output_reach(const tr_timeline_out *tl, size_t index, int64_t host_ts);
/* How far beyond TR_TIMELINE_TOLERANCE_NS trace_processor's conversion may stray from the
 * mapping over host BOOTTIME [from, to] (0 mostly): where the last call found the mapping
 * re-planned below a breakpoint already written, it left the next ones out (each series must
 * stay monotonic; for a host with little drift the next one may be a second away), and
 * trace_processor applies that breakpoint there. The bound track adds it. */
int64_t tr_timeline_output_held_excess(const tr_timeline_out *tl, size_t index, int64_t from,
                                       int64_t to);
/* The final pass's data can reach past the mapping its head exported (data that arrived while
 * the pass was read, as a reconnecting agent's backlog): trace_processor converts it by the
 * last breakpoint. Makes host entry index's export from there up to host BOOTTIME `to` a held
 * range (tr_timeline_output_held_excess), with no breakpoint written: one after that data
 * would have our resolver place it elsewhere than trace_processor. 0 or TR_ERR_NOMEM. */
int tr_timeline_output_hold_to(tr_timeline_out *tl, size_t index, const tr_host *host,
                               int64_t to);
/* Appends the HostClockSnapshots host sent since the session started and since the last call,
 * as packets of host entry index. 0 or TR_ERR_NOMEM. */
int tr_timeline_output_host_snapshots(tr_timeline_out *tl, size_t index, const tr_host *host,
                                      tr_packet_list *out);

/* `global-clocks`: rewrites one packet of host entry index with its trusted slice t. Returns 1
 * with *out set (possibly an ftrace anchor first, the packet then following from
 * tr_timeline_output_pending), 0 when the packet was malformed (dropped and counted), or
 * TR_ERR_NOMEM. */
int tr_timeline_output_packet(tr_timeline_out *tl, size_t index, const tr_host *host,
                              const uint8_t *data, size_t len, const tr_tbuf_trusted *t,
                              tr_output_packet *out);
/* 1 and *out set when a rewritten packet waits behind its anchor, else 0. */
int tr_timeline_output_pending(tr_timeline_out *tl, tr_output_packet *out);
/* Host packets dropped as malformed by the rewrite, for TraceStats.invalid_packets. */
uint64_t tr_timeline_output_invalid(const tr_timeline_out *tl);

#endif
