/* timeline_output.h: what the trace output adds for the timeline (docs/timeline.md), beside the
 * packets themselves: the hosts' own clock snapshots (both encodings) and, in `global-clocks`,
 * the rewrite of every host packet (relay/packet_rewrite.h) and the cross-host ClockSnapshots
 * from each host's clock estimator (service/timeline_output.c).
 *
 * State lives per session (tr_session.timeline), made on first use and kept across read passes:
 * per (host entry, sequence) rewrite state, per host entry what was exported so far. */
#ifndef TR_TIMELINE_OUTPUT_H
#define TR_TIMELINE_OUTPUT_H

#include <stdint.h>

#include "service/session.h"
#include "service/trace_output.h"

/* Tolerance of the cross-host breakpoints (tr_clocksync_export): the piecewise-offset mapping
 * trace_processor builds from them stays within this of the estimator's mapping. At 200 ppm of
 * drift that is one ClockSnapshot every 10 ms of host time (100/s), at 20 ppm one every 100 ms. */
#define TR_TIMELINE_TOLERANCE_NS 2000

/* Appends to out: the HostClockSnapshots each host sent since the session started and since
 * the last call, and in `global-clocks` the cross-host snapshots covering each host's BOOTTIME
 * from where the last call stopped up to a little past the host's present (final: past the
 * estimator's frontier too). Called for each read pass and for the session's clock journal
 * (tr_trace_output_journal_clocks). 0 or TR_ERR_NOMEM. */
int tr_timeline_head(tr_session *s, tr_packet_list *out, bool final);

/* `global-clocks`: rewrites one host packet with its trusted slice t. Returns 1 with *out set
 * (possibly an ftrace anchor first, the packet then following from tr_timeline_pending), 0 when
 * the packet was malformed (dropped and counted), or TR_ERR_NOMEM. */
int tr_timeline_packet(tr_session *s, size_t host_index, const uint8_t *data, size_t len,
                       const tr_tbuf_trusted *t, tr_output_packet *out);
/* 1 and *out set when a rewritten packet waits behind its anchor, else 0. */
int tr_timeline_pending(tr_session *s, tr_output_packet *out);
/* Host packets dropped as malformed by the rewrite, for TraceStats.invalid_packets. */
uint64_t tr_timeline_invalid(const tr_session *s);
void tr_timeline_free(tr_session *s);

#endif
