/* trace_inspect.h: puts every timestamp of a Perfetto trace on the trace clock, as trace_processor
 * would, and sums the trace up per host. The engine of `tracerelay inspect`; tests use its
 * per-timestamp callback to check where each packet of each host lands.
 *
 * Clock of a packet's timestamp (reference 5.2, 5.3): timestamp_clock_id, else the sequence's
 * TracePacketDefaults.timestamp_clock_id, else BOOTTIME; qualified by machine_id (0 when absent)
 * and, for the sequence-scoped ids 64..127, by trusted_packet_sequence_id. A sequence clock marked
 * is_incremental in the sequence's ClockSnapshot carries deltas: each timestamp adds to the
 * clock's last value, which the snapshot sets. SEQ_INCREMENTAL_STATE_CLEARED (or the deprecated
 * incremental_state_cleared) forgets the sequence's defaults and incremental values before the
 * packet's own defaults and snapshot are read. ftrace bundles ignore timestamp_clock_id: event
 * and compact_sched timestamps (the latter deltas within the bundle) are the machine's BOOTTIME,
 * MONOTONIC_RAW for FTRACE_CLOCK_MONO_RAW, and the sequence clock 64 for GLOBAL/LOCAL, tied to
 * BOOTTIME by the bundle's ftrace_timestamp/boot_timestamp; FTRACE_CLOCK_UNKNOWN is unresolvable.
 *
 * Two passes over the trace: the first feeds every ClockSnapshot, ftrace clock pair and
 * remote_clock_sync to the clock graph (relay/reading/clock_graph.h) and learns the trace clock
 * (primary_trace_clock of machine 0's snapshots, else BOOTTIME of machine 0); the second resolves
 * every timestamp in file order. So a packet written before the snapshot that links its clock
 * still resolves, as trace_processor's deferred packets do. With a callback, the second pass
 * also resolves each timestamp with only the clock data read so far, as trace_processor
 * converts it when it reads the packet (tr_inspect_point.read_trace_ts): the two differ where
 * a writer put clock data after data it covers (tests check that they never do).
 *
 * Hosts: a host is a machine_id plus, on machine 0 (the `global-clocks` encoding has no
 * machine_id), a clock domain: the first global clock id (>= 128) a sequence stamps its packets
 * with, or that one of its ClockSnapshots holds without any builtin clock. A domain whose id is
 * tr_global_clock_id(NAME, clock name) for a SystemInfo machine_name NAME is named NAME and
 * stands for NAME's BOOTTIME id. Host names come from SystemInfo.machine_name, else utsname.
 * Host losses: TraceStats written on that host's sequences (buffer overwrites, discards, ABI
 * violations, writer packet loss, failed patches, invalid packets) and the packets flagged
 * previous_packet_dropped other than a sequence's first packet (the SDK flags its first). After
 * such a loss the sequence's packets that need its incremental state are skipped until it is
 * cleared, as trace_processor skips them (skipped_after_loss).
 * tracerelay's per-host extension of TraceStats moves each host's BufferStats entries to that
 * host and adds its link and agent counters; it names the host by machine_id (`machines`) or by
 * machine name, whose global BOOTTIME id is the domain (`global-clocks`). A host found only
 * there (it sent nothing that survived) still gets an entry, without packets.
 * Clock mapping of a host: its BOOTTIME (the domain's id) at the lowest and highest reading seen
 * in ClockSnapshots and remote_clock_sync, converted to trace time: offset at the first, drift
 * between the two; error bound from remote_clock_sync exchanges (half of each pair's intervals,
 * averaged over the pairs trace_processor uses), unknown otherwise.
 *
 * Cost: O(packets) sequence lookups in a hash table plus the clock graph's conversions; memory:
 * the graph, one entry per sequence and per host. The input is only read. */
#ifndef TR_TRACE_INSPECT_H
#define TR_TRACE_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/reading/trace_bounds.h"
#include "relay/reading/trace_reader.h"

#define TR_INSPECT_MAX_EXAMPLES 8  /* unresolved packet offsets kept per host */
#define TR_INSPECT_SERVICE_SEQ 1u  /* the service's own trusted sequence (reference 4.8) */
#define TR_INSPECT_NAME_MAX 96

enum tr_inspect_source {
  TR_INSPECT_PACKET,         /* TracePacket.timestamp */
  TR_INSPECT_FTRACE_EVENT,   /* FtraceEventBundle.event[i].timestamp */
  TR_INSPECT_COMPACT_SWITCH, /* compact_sched.switch_timestamp[i], made absolute */
  TR_INSPECT_COMPACT_WAKING, /* compact_sched.waking_timestamp[i], made absolute */
};

/* Where one timestamp lands. */
struct tr_inspect_point {
  const Perfetto__Protos__TracePacket *packet;
  uint64_t index;  /* of the packet in the trace, from 0 */
  uint64_t offset; /* of its record in the file (of the compressed packet holding it) */
  uint32_t host;   /* index in tr_inspect_result.hosts */
  uint32_t machine_id, seq_id, clock_id;
  enum tr_inspect_source source;
  uint32_t event;   /* index within the bundle for ftrace sources */
  uint64_t raw_ts;  /* as written: a delta on an incremental clock */
  uint64_t clock_ts;/* on clock_id, after incremental decoding */
  int status;       /* 0, or why it did not resolve: TR_ERR_NOT_FOUND no path or unknown clock,
                       TR_ERR_STATE incremental clock without a base, TR_ERR_UNSUPPORTED ftrace
                       clock UNKNOWN, TR_ERR_INVAL sequence clock without sequence or overflow */
  int64_t trace_ts; /* valid when status is 0 */
  /* The same with only the clock data written before it in the file (and in its own packet),
   * where that links its clock already: trace_processor converts a timestamp when it reads the
   * packet (and defers one it cannot convert yet), so this is where it puts it. The two differ
   * where clock data lands in the file after data it covers. Valid when status is 0. */
  int64_t read_trace_ts;
};

/* Called for every packet that has a timestamp and every ftrace event, in file order. */
typedef void (*tr_inspect_cb)(const struct tr_inspect_point *p, void *arg);

struct tr_inspect_seq {
  uint32_t seq_id;
  uint64_t packets;
};

#define TR_INSPECT_MAX_MARKS 16

struct tr_inspect_losses { /* summed over the trace's TraceStats packets */
  uint64_t trace_stats_packets; /* on this host's sequences */
  /* its buffers' BufferStats, plus the TraceStats totals when written on its sequences */
  uint64_t chunks_overwritten, bytes_overwritten, chunks_discarded, abi_violations;
  uint64_t trace_writer_packet_loss, patches_failed, patches_discarded, invalid_packets;
  uint64_t flushes_failed;
  uint64_t previous_packet_dropped; /* packets flagged, other than first on their sequence */
  /* tracerelay's per-host extension of TraceStats (protos/tracerelay/tracerelay_stats.proto):
   * link and agent counters over the service's life, session_* over this session */
  bool has_host_stats, connected;
  uint64_t link_lost_chunks, link_lost_bytes, agent_queue_dropped_chunks;
  uint64_t agent_spill_dropped_chunks, agent_smb_full, agent_abi_violations, flushes_missed;
  uint64_t session_chunks_refused, session_flushes_missed, session_disconnects;
  uint64_t session_smb_full; /* loss events in producers' shared memory, packet count unknown */
  uint64_t session_smb_full_ms; /* how long the SMB was full then, at most */
  uint64_t session_instances_not_started; /* data source instances that did not start */
  /* its agent replaced without an orderly stop: loss events, packet count unknown */
  uint64_t session_agent_exits_unclean;
  /* instances still stopping when the session's stop timeout ran out: loss events */
  uint64_t session_stops_timed_out;
  /* a departed producer's chunks its agent could not scrape (lost), and the producer
   * connections its agent closed during the session (their later data never written) */
  uint64_t session_exit_unscraped_chunks, session_producers_closed;
  /* packets lost on the way: begun in chunks the agent dropped, and spanning a lost chunk */
  uint64_t agent_queue_dropped_packets, agent_spill_dropped_packets;
  uint64_t session_packets_lost_in_gaps;
  /* HostStats.session_disconnected_at_ns, in the trace clock (the first TR_INSPECT_MAX_MARKS) */
  uint64_t disconnected_at_ns[TR_INSPECT_MAX_MARKS];
  size_t num_disconnected_at;
};

struct tr_inspect_host {
  uint32_t machine_id;
  uint32_t domain; /* 0, or the global BOOTTIME id of a `global-clocks` host */
  char name[TR_INSPECT_NAME_MAX]; /* "" when the trace names it nowhere */
  uint64_t packets, ftrace_events;
  struct tr_inspect_seq *seqs; /* by seq_id */
  size_t n_seqs;
  uint64_t timestamps;         /* packet and ftrace timestamps, resolved or not */
  bool has_range;
  int64_t first_ts, last_ts;   /* trace time, over resolved timestamps */
  struct tr_inspect_losses losses;
  bool has_mapping;            /* offset/drift of its BOOTTIME vs the trace clock */
  int64_t offset_ns;           /* trace time minus host BOOTTIME at the first reading */
  double drift_ppm;            /* 0 with a single reading */
  uint64_t mapping_span_ns;    /* host BOOTTIME between the two readings */
  bool on_trace_clock;         /* the service's own machine, whose clock is the trace clock */
  bool has_sync_offset;        /* from the last remote_clock_sync packet of the machine: */
  int64_t sync_offset_ns;      /*   its BOOTTIME offset, remote minus host */
  int64_t sync_round_trip_ns;  /*   its exchange's round trip; -1: unknown. Not an error bound:
                                *   the host's clock error bound track has those */
  uint64_t unresolved;
  /* packets skipped as trace_processor skips them: they need the sequence's incremental state
   * (SEQ_NEEDS_INCREMENTAL_STATE) after a loss (previous_packet_dropped) and before the next
   * SEQ_INCREMENTAL_STATE_CLEARED; their timestamps reach no callback */
  uint64_t skipped_after_loss;
  uint64_t unresolved_offsets[TR_INSPECT_MAX_EXAMPLES];
  size_t n_unresolved_offsets;
};

#define TR_INSPECT_MAX_SERVICE_MARKS 64
#define TR_INSPECT_MARK_NAME_MAX 128

/* An instant on tracerelay-service's own track (TR_TRACE_WRITER_SERVICE_TRACK_UUID), e.g.
 * "host web-2 disconnected", at its timestamp on the service's BOOTTIME (the trace clock of the
 * service's traces). */
struct tr_inspect_mark {
  uint64_t ts;
  char name[TR_INSPECT_MARK_NAME_MAX];
};

struct tr_inspect_result {
  uint64_t bytes, packets;
  struct tr_inspect_mark service_marks[TR_INSPECT_MAX_SERVICE_MARKS]; /* the first ones */
  size_t n_service_marks;
  uint64_t service_marks_total;
  struct tr_trace_bounds bounds; /* the hosts' clock error bound tracks (service packets) */
  uint32_t trace_clock;
  struct tr_inspect_host *hosts; /* ordered by machine_id, then domain */
  size_t n_hosts;
  uint64_t clock_snapshots, snapshots_rejected, remote_clock_syncs, sync_edges;
  uint64_t zlib_packets, zstd_packets;
  uint64_t undecodable_packets, first_undecodable_offset; /* skipped by the reader */
  /* From the last TraceStats of a tracerelay service: what the config asked for and no host
   * had, "data source 'x' matched no producer on any host; machine 'y' is not connected"
   * (names as written, untrusted), "" if nothing */
  char missing[512];
  struct tr_trace_reader_error error; /* why tr_inspect_trace failed on malformed input */
};

/* Inspects len bytes of trace at data. cb (may be NULL) sees every timestamp in the second pass.
 * Returns 0 and fills *out (free with tr_inspect_result_free, also after a failure), or a
 * negative TR_ERR_* with out->error saying where for malformed input (TR_ERR_DECODE,
 * TR_ERR_TOO_BIG), TR_ERR_NOMEM. */
int tr_inspect_trace(const void *data, size_t len, tr_inspect_cb cb, void *arg,
                     struct tr_inspect_result *out);
void tr_inspect_result_free(struct tr_inspect_result *r);

#endif
