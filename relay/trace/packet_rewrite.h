/* packet_rewrite.h: the `global-clocks` timeline encoding (docs/timeline.md): rewrites one
 * producer packet of a remote host so that every clock it refers to is that host's own,
 * globally-scoped clock, and builds the service's cross-host ClockSnapshots that tie each host's
 * global BOOTTIME to the trace clock. Module tr_packet_rewrite; pure functions over bytes.
 *
 * Clock ids. A host's clock with Perfetto id c gets the global id
 *     tr_global_clock_id(machine, name(c)) = (uint32)FNV-1a-64("<machine>/<name>") | 0x80000000
 * where name(c) is tr_clock_name(c) ("BOOTTIME", "MONOTONIC"...) for the six clocks relay/clock/clock.h
 * names, and the decimal id ("9" for TSC, "2147483691" for a global id) for every other one.
 * Id 0 means "no clock" and is never rewritten; sequence-scoped ids 64..127 stay as they are
 * (sequences are unique across hosts); ids 1..63 and 128 and up are the host's own clocks and
 * are rewritten, except the global ids listed as truly shared in tr_rewrite_host_init (e.g. a
 * PTP domain every host reads). tr_rewrite_clock_id() is that mapping.
 *
 * What a packet gets (only these top-level fields are touched; every other field, payloads and
 * unknown fields included, is copied byte for byte and in order):
 * (a) timestamp_clock_id (58): rewritten in place by the mapping above.
 * (b) a packet with a timestamp (8) whose clock is implicit (no 58, or 58 = 0) on a sequence
 *     whose TracePacketDefaults set no clock: 58 = the host's global BOOTTIME is appended
 *     (last-wins), as trace_processor reads an implicit clock as the trace clock, which on the
 *     host's own traced was its BOOTTIME. Packets relying on a sequence default are left alone:
 *     the default itself is rewritten.
 * (c) trace_packet_defaults (59): re-encoded in place (an appended copy would merge), its 58
 *     mapped, its other sub-fields copied byte for byte.
 * (d) clock_snapshot (6): re-encoded in place, the clock_id of each Clock mapped, the Clocks'
 *     other fields kept, primary_trace_clock (2) removed: only the service's own snapshots name
 *     the trace clock.
 * (e) ftrace_events (1): trace_processor reads ftrace timestamps as the machine's BOOTTIME
 *     (FTRACE_CLOCK_UNSPECIFIED), MONOTONIC_RAW (MONO_RAW) or the sequence's clock 64
 *     (GLOBAL/LOCAL, tied to the machine's BOOTTIME by the bundle's ftrace_timestamp (6) /
 *     boot_timestamp (7) pair), whatever timestamp_clock_id says, and without machine_id "the
 *     machine" is the service's. So the bundle is re-encoded to read its timestamps as the
 *     sequence's clock 64: ftrace_clock (5) becomes GLOBAL (LOCAL stays LOCAL) and the pair is
 *     removed, and clock 64 is tied to the host's clock by an anchor: a separate ClockSnapshot
 *     packet {64, host global clock} that the caller writes on the same sequence just before
 *     the bundle. For BOOTTIME and MONO_RAW bundles the anchor is the identity {64: 0, G: 0},
 *     written once per sequence; for GLOBAL/LOCAL bundles it is the bundle's own pair
 *     {64: ftrace_timestamp, G(BOOTTIME): boot_timestamp}, written whenever the pair changes, as
 *     trace_processor itself would have added it. Event payloads (events, compact_sched) keep
 *     their bytes and timestamps: the mapping to trace time stays in the clock graph, where the
 *     estimator's breakpoints are, instead of being baked into every event. A GLOBAL/LOCAL bundle
 *     without a pair, and bundles with an unknown clock, are copied unchanged.
 *
 * Per-sequence state (tr_rewrite_seq, zeroed at the start of each (host, sequence) and of each
 * output file read on its own) follows trace_processor: a packet that clears incremental state
 * (sequence_flags bit 1 or incremental_state_cleared) drops the sequence's defaults, a packet
 * with trace_packet_defaults replaces them, both before the packet's own timestamp is read. The
 * state is updated only when tr_rewrite_packet succeeds.
 *
 * Bounds: the rewritten packet is at most TR_REWRITE_OUT_MAX(len) bytes (a 1-byte clock id
 * becomes 5 bytes; nothing else grows by more than a few bytes); malformed input (bad varint,
 * field 0, group or unknown wire type, a length past the end, or a field we interpret carrying
 * the wrong wire type, at the top level or inside 59, 6, its Clocks, and 1's own fields) gives
 * TR_ERR_DECODE and writes no state: the caller drops the packet and counts it invalid.
 *
 * Cost per packet: one walk of the top-level fields plus, for 59, 6 and 1 only, walks of their
 * own fields (never of track events, ftrace events or other payloads): one to size the
 * re-encoded field, one to write it, and for 1 one more to decide; then one copy of the bytes:
 * O(len). No allocation. */
#ifndef TR_PACKET_REWRITE_H
#define TR_PACKET_REWRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest machine name: a certificate's (64 bytes), a guest machine's "HOST/NAME" (105), or
 * the service's "NAME#K" for a host whose name's ids collide with another's (docs/timeline.md,
 * Machine ids). */
#define TR_REWRITE_MACHINE_MAX 116u
#define TR_REWRITE_SHARED_MAX 32u  /* truly shared global clock ids per host */
/* Room tr_rewrite_packet needs for a packet of len bytes. */
#define TR_REWRITE_OUT_MAX(len) (3u * (size_t)(len) + 16u)
/* Room for an ftrace anchor packet and for a cross-host snapshot packet. */
#define TR_REWRITE_ANCHOR_MAX 48u
#define TR_REWRITE_SNAPSHOT_MAX 48u
/* Longest packet tr_rewrite_packet accepts, so that the result fits in an int. */
#define TR_REWRITE_PACKET_MAX (64u << 20)

/* One host's clock ids, computed once per host. */
typedef struct tr_rewrite_host {
  char machine[TR_REWRITE_MACHINE_MAX + 1];
  uint32_t builtin[64]; /* global id of builtin clock c at [c]; [0] is 0 */
  uint32_t shared[TR_REWRITE_SHARED_MAX];
  size_t n_shared;
} tr_rewrite_host;

/* What the rewrite remembers per (host, sequence). Zero it to start. */
typedef struct tr_rewrite_seq {
  bool default_clock;           /* the sequence's TracePacketDefaults set a clock */
  bool anchored;                /* an ftrace anchor was returned for this sequence */
  uint32_t anchor_clock;        /* the host global id clock 64 was last anchored to */
  uint64_t anchor_ts;           /* the clock-64 value of that anchor */
} tr_rewrite_seq;

/* Sets up a host: machine is its name (1..TR_REWRITE_MACHINE_MAX bytes), shared the global ids
 * (>= 128) its packets may use that are not its own and keep their id. TR_ERR_INVAL for an empty
 * or too long name or a shared id below 128, TR_ERR_TOO_BIG for more than
 * TR_REWRITE_SHARED_MAX shared ids. O(64) hashes. */
int tr_rewrite_host_init(tr_rewrite_host *host, const char *machine, const uint32_t *shared,
                         size_t n_shared);

/* The id the host's clock `clock_id` has in the global-clocks encoding (see the top). O(1) for
 * builtin and sequence ids, one hash for a global id. */
uint32_t tr_rewrite_clock_id(const tr_rewrite_host *host, uint32_t clock_id);

/* Rewrites one producer packet of `host` (its bytes without the trusted slice, see
 * relay/trace/packet_trusted.h: append that after) into out[0..cap). seq is the state of the packet's
 * sequence. Returns the rewritten length; *anchor_len is 0, or the length of an anchor packet
 * written into anchor[0..TR_REWRITE_ANCHOR_MAX) that must be written before this packet on the
 * same sequence (give it the sequence's trusted fields; previous_packet_dropped stays with the
 * packet itself). TR_ERR_DECODE for a malformed packet, TR_ERR_TOO_BIG when cap is under
 * TR_REWRITE_OUT_MAX(len) and the result does not fit, or len is over TR_REWRITE_PACKET_MAX.
 * On error seq is unchanged and *anchor_len is 0. */
int tr_rewrite_packet(const tr_rewrite_host *host, tr_rewrite_seq *seq, const uint8_t *packet,
                      size_t len, uint8_t *out, size_t cap, uint8_t *anchor, size_t *anchor_len);

/* The service's cross-host ClockSnapshot for one breakpoint of the host's clock mapping
 * (relay/clock/clocksync.h, tr_clocksync_export): a packet
 *     clock_snapshot { clocks {BOOTTIME, service_ts}, clocks {host's global BOOTTIME, host_ts},
 *                      primary_trace_clock: BOOTTIME }  trusted_packet_sequence_id: 1
 * written into out[0..cap). Write one per breakpoint, before the host data they cover.
 * Returns its length; TR_ERR_INVAL for a negative time, TR_ERR_TOO_BIG if cap is too small
 * (TR_REWRITE_SNAPSHOT_MAX always suffices). */
int tr_rewrite_cross_host_snapshot(const tr_rewrite_host *host, int64_t service_ts,
                                   int64_t host_ts, uint8_t *out, size_t cap);

#endif
