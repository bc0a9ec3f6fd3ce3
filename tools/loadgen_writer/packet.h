/* packet.h: the TracePackets of one loadgen sequence (one trace writer), laid out as the Perfetto
 * SDK's TrackEvent data source writes them (compare tests/vectors/traces/sdk-track-event.txt):
 * - incremental state first: a packet with first_packet_on_sequence (first time only),
 *   sequence_flags INCREMENTAL_STATE_CLEARED, previous_packet_dropped, a ClockSnapshot
 *   {BOOTTIME, 64 incremental} and TracePacketDefaults {timestamp_clock_id 64, the thread track};
 *   then TrackDescriptors for the thread, the process and a counter track;
 * - then TrackEvents on clock 64 (timestamp = delta from the previous event): slice begin/end
 *   pairs and every 8th event a counter, the first one carrying the interned names. Each event
 *   carries debug annotations writer=<writer id> and seq=<event number in this writer>, so a
 *   reader can check that every event arrived exactly once, and is padded to --packet-size.
 * After a dropped packet or a ClearIncrementalState the state is written again (the SDK resets
 * incremental state on data loss), so deltas always start from a snapshot the reader has.
 * Packets are streamed straight into the SMB through smb_writer.h, nested sizes included. */
#ifndef LG_PACKET_H
#define LG_PACKET_H

#include <stdbool.h>
#include <stdint.h>

#include "tools/loadgen_writer/smb_writer.h"

/* Debug annotation names, interned as iids 1..3 on every sequence. */
#define LG_ANNOTATION_WRITER "writer"
#define LG_ANNOTATION_SEQ "seq"
#define LG_ANNOTATION_PAD "pad"

typedef struct lg_sequence {
  lg_trace_writer *tw;
  uint32_t writer;      /* also the chunk writer_id */
  uint32_t packet_size; /* pad events up to this many bytes; 0 = no padding */
  int32_t pid;
  int32_t tid;
  uint64_t process_uuid;
  uint64_t thread_uuid;
  uint64_t counter_uuid;
  bool started;     /* a packet with first_packet_on_sequence reached the buffer */
  bool state_valid; /* snapshot, defaults and descriptors are in the buffer */
  bool interned;    /* the interned names are in the buffer */
  bool slice_open;
  uint64_t last_ts; /* clock 64 value of the last packet */
  uint64_t seq;     /* number of the next event */
  /* Flow ids (tools/loadgen/flows.h) for the next slice begin: flow_out becomes its flow_ids,
   * flow_in its terminating_flow_ids; both are cleared when written, and flow_written then
   * holds the departure's id (0: none). */
  uint64_t flow_out, flow_in, flow_written;
  uint64_t events_written;
  uint64_t events_dropped;
} lg_sequence;

void lg_seq_init(lg_sequence *s, lg_trace_writer *tw, uint32_t writer, uint32_t packet_size,
                 int32_t pid, int32_t tid);
/* Writes the next event at BOOTTIME `now_ns` (non-decreasing), preceded by the incremental
 * state when it is not valid. Returns 0, TR_ERR_FULL if the event was dropped (its seq is used
 * up and counted in events_dropped) or the commit error. */
int lg_seq_write_event(lg_sequence *s, uint64_t now_ns);
/* Ends an open slice so that the sequence closes balanced (an event like the others). */
int lg_seq_finish(lg_sequence *s, uint64_t now_ns);
/* ClearIncrementalState from the service: write the state again before the next event. */
void lg_seq_clear_incremental_state(lg_sequence *s);

#endif
