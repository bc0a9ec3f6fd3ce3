/* trace_output.h: a session read out as trace packets (service/trace_output.c).
 *
 * One read pass yields, in order: the service's packets (on the first pass: clock snapshot,
 * sync marker, trace_config, trace_uuid, SystemInfo of the service machine then of each remote
 * host; on every pass: the service events since the last one, the hosts' link marks, the clock
 * journal and the clock packets since), then for each buffer and each
 * host the packets of that (buffer, host) central buffer with the trusted slice to append, then
 * read_tracing_buffers_completed and TraceStats. A pass is final once the session is stopped:
 * nothing stalls then and the buffers end empty. */
#ifndef TR_TRACE_OUTPUT_H
#define TR_TRACE_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "perfetto/common/trace_stats.pb-c.h"
#include "relay/packet_trusted.h"
#include "service/session.h"

typedef struct tr_output_packet {
  const uint8_t *data; /* valid until the next tr_trace_output_next on this session */
  size_t len;
  uint8_t trusted[TR_TBUF_TRUSTED_MAX]; /* appended after data; empty for service packets */
  size_t trusted_len;
} tr_output_packet;


/* The session's clock journal, run every TR_CLOCK_JOURNAL_MS while it runs: what a read pass
 * would write of the clocks (remote_clock_sync in `machines`, cross-host snapshots in
 * `global-clocks`, host clock snapshots in both) up to each host's present, into
 * s->clock_journal, which the next pass writes first. So the mapping of a session read only at
 * its end comes from the estimators as they were during it, not from what their bounded
 * histories still hold at the end. 0 or TR_ERR_NOMEM. */
#define TR_CLOCK_JOURNAL_MS 1000
/* Its bound: past this many packets per host of the session (about 55 min of a host at 20
 * edges a second, 5.5 min at 200 a second, 6 MB), every other packet of its older half is
 * dropped, and logged once. */
#define TR_CLOCK_JOURNAL_PER_HOST 65536u
int tr_trace_output_journal_clocks(tr_session *s);

/* `machines`: whether the clock anchor of the session's host entry `index` (its machine's) is
 * written, after which trace_processor may see the host's ClockSnapshots and data; until then
 * a non-final pass leaves them for a later one (docs/timeline.md, `machines`). Always true in
 * `global-clocks`. */
bool tr_trace_output_host_anchored(const tr_session *s, size_t index);

/* Starts a read pass (ends any unfinished one). 0, TR_ERR_NOMEM. */
int tr_trace_output_begin(tr_session *s);
/* The next packet of the pass: 1, 0 at its end, TR_ERR_NOMEM. */
int tr_trace_output_next(tr_session *s, tr_output_packet *out);
/* Drops the pass state. */
void tr_trace_output_reset(tr_session *s);

/* TraceStats of the session (free with tr_trace_output_free_stats) and the bytes of our
 * per-host extension to append to its encoding (protos/tracerelay/tracerelay_stats.proto;
 * free with free()). */
int tr_trace_output_stats(tr_session *s, Perfetto__Protos__TraceStats **stats, uint8_t **ext,
                          size_t *ext_len);
void tr_trace_output_free_stats(Perfetto__Protos__TraceStats *stats);

/* write_into_file: one pass (final once the session stopped) into the session's file as
 * `0x0A varint(len) packet` records.
 * Returns 0, TR_ERR_FULL once max_file_size_bytes is reached (the session should stop), or
 * TR_ERR_SYS(errno) if writing failed (logged). */
int tr_trace_output_write_file(tr_session *s);

#endif
