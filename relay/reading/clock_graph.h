/* clock_graph.h: the clock resolver of `tracerelay inspect`: the seed algorithm trace_processor
 * uses to put every timestamp of a trace on the trace clock, so tests can check where each packet
 * of each host lands in either encoding (`machines` or `global-clocks`).
 *
 * Model (reference 5.3, 7.5), as trace_processor v58 does it:
 * - Clocks are nodes keyed by (machine_id, clock_id), and also by sequence id for the
 *   sequence-scoped ids 64..127. The same global id (>= 128) under two machine ids is two nodes.
 * - A ClockSnapshot links all its clocks. Snapshots with the same clocks in the same order form a
 *   series (TP hashes the ids in the order written); an edge joins every two clocks of a series.
 * - A timestamp converts along the shortest path to the trace clock (BFS, at most 4 hops as TP);
 *   on each hop, the snapshot of that series whose source value is the latest at or below the
 *   value (the first snapshot if none) gives a pure offset. Ties between equally short paths are
 *   broken by the order series were first seen (TP breaks them by clock id).
 * - A clock whose value goes backwards within a series becomes target-only: never again a source.
 *   If that clock is the trace clock, the snapshot is rejected instead.
 * - unit_multiplier_ns scales a clock's values to ns (0 means 1); the trace clock must be in ns.
 *   Incremental clocks (only sequence-scoped ones may be) are deltas from the clock's last value:
 *   a snapshot sets that value, each conversion adds to it, so convert them in packet order.
 * - The trace clock is (machine 0, primary_trace_clock), BOOTTIME by default.
 * - remote_clock_sync (the `machines` encoding): each SyncedClocks' client clocks are added as a
 *   snapshot of the remote machine; for every two consecutive entries whose client BOOTTIMEs are
 *   less than 30 s apart (compared as uint64, so a later one going backwards is skipped, as TP
 *   does), per clock o1 = (t1c+t2c)/2 - t1h and o2 = t2c - (t1h+t2h)/2 in int64 with truncating
 *   division; the offset is the truncated mean of all o1/o2; then one edge per clock: machine 0's
 *   clock at its last host reading h <-> the remote clock at h + offset. One edge per packet, so
 *   the conversion follows the latest packet at or below a value.
 * A rejected snapshot changes nothing (TP may keep part of one).
 *
 * Cost: add_snapshot O(clocks + series of its least-linked clock); convert O(log snapshots) per
 * hop with the path cached per source clock, a BFS O(nodes + edges) when the graph changed.
 * Memory grows with what is added: one int64 per clock per snapshot. */
#ifndef TR_CLOCK_GRAPH_H
#define TR_CLOCK_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR_CLOCKGRAPH_MAX_CLOCKS 64 /* per snapshot */

struct tr_clockgraph;

struct tr_clockgraph_clock { /* one ClockSnapshot.Clock */
  uint32_t clock_id;
  uint64_t timestamp;
  uint64_t unit_multiplier_ns; /* 0 means 1 */
  bool is_incremental;
};

struct tr_clockgraph_sync { /* one RemoteClockSync.SyncedClocks */
  const struct tr_clockgraph_clock *client; /* the remote machine's readings */
  size_t n_client;
  const struct tr_clockgraph_clock *host; /* the trace machine's */
  size_t n_host;
};

int tr_clockgraph_init(struct tr_clockgraph **out);
void tr_clockgraph_free(struct tr_clockgraph *g);

/* A ClockSnapshot of machine_id's packet on sequence seq_id. TR_ERR_INVAL for a sequence clock
 * with seq_id 0, an incremental non-sequence clock, a clock twice, a unit or incremental flag that
 * differs from the clock's earlier snapshots, a value that overflows in ns, a trace clock not in
 * ns or going backwards; TR_ERR_TOO_BIG over TR_CLOCKGRAPH_MAX_CLOCKS or for none; TR_ERR_NOMEM. */
int tr_clockgraph_add_snapshot(struct tr_clockgraph *g, uint32_t machine_id, uint32_t seq_id,
                               const struct tr_clockgraph_clock *clocks, size_t n);

/* A remote_clock_sync packet of machine_id (not 0). Units and incremental flags in it are ignored,
 * as TP ignores them. Returns the number of cross-machine edges added; *boottime_offset (when not
 * NULL) gets the BOOTTIME offset (remote minus host) if one was computed. TR_ERR_INVAL for
 * machine 0, TR_ERR_TOO_BIG for more than TR_CLOCKGRAPH_MAX_CLOCKS distinct clocks, TR_ERR_NOMEM. */
int tr_clockgraph_add_remote_sync(struct tr_clockgraph *g, uint32_t machine_id,
                                  const struct tr_clockgraph_sync *syncs, size_t n,
                                  int64_t *boottime_offset);

/* primary_trace_clock of machine 0's snapshot. TR_ERR_STATE once a conversion used another one,
 * TR_ERR_INVAL for a sequence clock or 0. */
int tr_clockgraph_set_trace_clock(struct tr_clockgraph *g, uint32_t clock_id);

/* ts of (machine_id, clock_id[, seq_id]) on the trace clock. TR_ERR_NOT_FOUND: unresolvable (an
 * unknown clock, or no path from it to the trace clock); TR_ERR_INVAL for a sequence clock with
 * seq_id 0 or a value that overflows. */
int tr_clockgraph_convert(struct tr_clockgraph *g, uint32_t machine_id, uint32_t clock_id,
                          uint32_t seq_id, uint64_t ts, int64_t *trace_ts);

#endif
