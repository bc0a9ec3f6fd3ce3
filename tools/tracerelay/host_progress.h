/* host_progress.h: the per-host part of `tracerelay record`'s progress line, from a
 * GetTraceStats reply.
 *
 * A tracerelay service appends its per-host extension (protos/tracerelay/tracerelay_stats.proto,
 * field 1000 of TraceStats) to the TraceStats it returns; each HostStats names the
 * TraceStats.buffer_stats entries that are that host's. A host's bytes are the bytes_written
 * of those entries (this session's data of that host in the central buffers); its losses are
 * the chunks dropped on its agent (queue, spill queue), lost on the link, and discarded or
 * overwritten in its buffers, and apart from them the times its producers' shared memory was
 * found full (they dropped data; the ABI gives no count). Perfetto's traced sends no extension: then only the total shows.
 * The reply is untrusted: every index is checked, names are printed only if they are valid
 * machine names. */
#ifndef TRACERELAY_HOST_PROGRESS_H
#define TRACERELAY_HOST_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct host_progress_sum {
  uint64_t bytes;       /* every buffer's bytes_written */
  bool tracerelay;      /* the reply carries our extension: it comes from a tracerelay service */
  unsigned hosts;       /* machines in the extension (0 without it): a host whose agent
                         * restarted has two entries there, counted once */
  uint64_t lost_chunks; /* the hosts' losses as counted in the line, summed (chunks left
                         * unscraped in departed producers' shared memory included) */
  uint64_t smb_full;    /* the hosts' session_smb_full: loss events, packet count unknown */
  uint64_t smb_full_ms; /* their session_smb_full_ms: how long, at most */
  /* "data source 'x' matched no producer on any host; machine 'y' is not connected" (the
   * extension's unmatched data sources and absent machines), "" when there is none */
  char missing[512];
  /* "web-1 (1), web-2 (2)": hosts with data source instances not started (as the stats say;
   * at the end of a session: never started), "" when there is none */
  char not_started[256];
  /* "web-1 (1)": hosts whose agent was replaced without an orderly stop while the session ran
   * (data lost, count unknown), "" when there is none */
  char agent_crashed[256];
  /* "web-1 (1)": hosts with data source instances that had not confirmed their stop when the
   * session's stop timeout ran out (their last data may be missing), "" when there is none */
  char stop_timed_out[256];
  /* "web-1: 1 stalled client; web-2: 2 peer not reading": producer connections of the session
   * the agents closed while it ran, by host and reason (what those producers wrote after is
   * missing, count unknown), "" when there is none */
  char producers_closed[256];
  /* "web-3, web-4": machines whose link was down when the stats were taken (at the end of a
   * session: what they had not relayed by then is missing, count unknown), "" when none */
  char down[256];
};

/* Decodes the reply_proto of a GetTraceStats reply. Writes "web-1 4.1 MB  web-2 0.3 MB
 * (12 chunks lost) (SMB full 3 times)  web-3 1.0 MB (agent killed: 1) (down)" into out (hosts in the service's order; "" without
 * the extension) and the totals into *sum. Returns 0, or -1 if the reply does not decode (out
 * and *sum untouched). */
int host_progress_format(const uint8_t *reply, size_t len, char *out, size_t cap,
                         struct host_progress_sum *sum);

#endif
