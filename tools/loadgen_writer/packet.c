/* packet.c: encodes the loadgen's TracePackets field by field into a trace writer (see packet.h).
 * Field numbers are Perfetto's (reference sections 5.2, 5.3, protos/perfetto/trace). */
#include "tools/loadgen_writer/packet.h"

#include <stdio.h>
#include <string.h>

#include "relay/base/tr_error.h"

enum {
  /* TracePacket */
  PKT_CLOCK_SNAPSHOT = 6,
  PKT_TIMESTAMP = 8,
  PKT_TRACK_EVENT = 11,
  PKT_INTERNED_DATA = 12,
  PKT_SEQUENCE_FLAGS = 13,
  PKT_PREVIOUS_PACKET_DROPPED = 42,
  PKT_DEFAULTS = 59,
  PKT_TRACK_DESCRIPTOR = 60,
  PKT_FIRST_ON_SEQUENCE = 87,
  SEQ_INCREMENTAL_STATE_CLEARED = 1,
  SEQ_NEEDS_INCREMENTAL_STATE = 2,
  /* ClockSnapshot and its Clock */
  SNAP_CLOCKS = 1,
  CLOCK_ID = 1,
  CLOCK_TIMESTAMP = 2,
  CLOCK_INCREMENTAL = 3,
  CLOCK_UNIT_NS = 4,
  BUILTIN_CLOCK_BOOTTIME = 6,
  SEQUENCE_CLOCK = 64,
  /* TracePacketDefaults, TrackEventDefaults */
  DEFAULTS_TRACK_EVENT = 11,
  DEFAULTS_CLOCK_ID = 58,
  TE_DEFAULTS_TRACK_UUID = 11,
  /* TrackDescriptor, ProcessDescriptor, ThreadDescriptor */
  TD_UUID = 1,
  TD_NAME = 2,
  TD_PROCESS = 3,
  TD_THREAD = 4,
  TD_PARENT_UUID = 5,
  TD_COUNTER = 8,
  PROC_PID = 1,
  PROC_NAME = 6,
  THREAD_PID = 1,
  THREAD_TID = 2,
  THREAD_NAME = 5,
  /* TrackEvent, DebugAnnotation */
  TE_CATEGORY_IIDS = 3,
  TE_DEBUG_ANNOTATIONS = 4,
  TE_TYPE = 9,
  TE_NAME_IID = 10,
  TE_TRACK_UUID = 11,
  TE_COUNTER_VALUE = 30,
  TE_FLOW_IDS = 47,             /* fixed64 */
  TE_TERMINATING_FLOW_IDS = 48, /* fixed64 */
  TYPE_SLICE_BEGIN = 1,
  TYPE_SLICE_END = 2,
  TYPE_COUNTER = 4,
  DA_NAME_IID = 1,
  DA_UINT_VALUE = 3,
  DA_STRING_VALUE = 6,
  /* InternedData: every entry is {1 iid, 2 name} */
  INTERNED_CATEGORIES = 1,
  INTERNED_EVENT_NAMES = 2,
  INTERNED_ANNOTATION_NAMES = 3,
  INTERNED_IID = 1,
  INTERNED_NAME = 2,
};

enum { IID_WRITER = 1, IID_SEQ = 2, IID_PAD = 3 };

static size_t varint_len(uint64_t v) {
  size_t n = 1;
  while (v > 0x7f)
    v >>= 7, n++;
  return n;
}

static void put_varint(lg_trace_writer *tw, uint64_t v) {
  uint8_t buf[10];
  size_t n = 0;
  for (; v > 0x7f; v >>= 7)
    buf[n++] = (uint8_t)(v | 0x80);
  buf[n++] = (uint8_t)v;
  lg_tw_append(tw, buf, n);
}

static void put_uint(lg_trace_writer *tw, uint32_t field, uint64_t v) {
  put_varint(tw, (uint64_t)field << 3);
  put_varint(tw, v);
}

static void put_fixed64(lg_trace_writer *tw, uint32_t field, uint64_t v) {
  uint8_t b[8];
  put_varint(tw, (uint64_t)field << 3 | 1);
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  lg_tw_append(tw, b, sizeof b);
}

static void put_bytes(lg_trace_writer *tw, uint32_t field, const void *data, size_t len) {
  put_varint(tw, (uint64_t)field << 3 | 2);
  put_varint(tw, len);
  lg_tw_append(tw, data, len);
}

static void put_string(lg_trace_writer *tw, uint32_t field, const char *s) {
  put_bytes(tw, field, s, strlen(s));
}

static void put_interned(lg_trace_writer *tw, uint32_t field, uint64_t iid, const char *name) {
  lg_tw_begin_nested(tw, field);
  put_uint(tw, INTERNED_IID, iid);
  put_string(tw, INTERNED_NAME, name);
  lg_tw_end_nested(tw);
}

static void put_clock(lg_trace_writer *tw, uint32_t id, uint64_t ts, bool incremental) {
  lg_tw_begin_nested(tw, SNAP_CLOCKS);
  put_uint(tw, CLOCK_ID, id);
  put_uint(tw, CLOCK_TIMESTAMP, ts);
  if (incremental) {
    put_uint(tw, CLOCK_INCREMENTAL, 1);
    put_uint(tw, CLOCK_UNIT_NS, 1);
  }
  lg_tw_end_nested(tw);
}

/* Starts a packet and, after a loss (or always, for the state packet, as the SDK does), marks
 * it with previous_packet_dropped. Returns 0 or TR_ERR_FULL (the packet is being dropped). */
static int begin(lg_sequence *s, bool mark_loss) {
  int rc = lg_tw_begin_packet(s->tw);
  if (rc == 1 || (rc == 0 && mark_loss))
    put_uint(s->tw, PKT_PREVIOUS_PACKET_DROPPED, 1);
  return rc < 0 ? rc : 0;
}

static int end(lg_sequence *s) {
  int rc = lg_tw_end_packet(s->tw);
  if (rc < 0)
    s->state_valid = false;
  return rc;
}

static int write_state_packet(lg_sequence *s, uint64_t now) {
  lg_trace_writer *tw = s->tw;
  begin(s, true);
  put_uint(tw, PKT_TIMESTAMP, 0);
  lg_tw_begin_nested(tw, PKT_CLOCK_SNAPSHOT);
  put_clock(tw, BUILTIN_CLOCK_BOOTTIME, now, false);
  put_clock(tw, SEQUENCE_CLOCK, now, true);
  lg_tw_end_nested(tw);
  put_uint(tw, PKT_SEQUENCE_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED);
  lg_tw_begin_nested(tw, PKT_DEFAULTS);
  lg_tw_begin_nested(tw, DEFAULTS_TRACK_EVENT);
  put_uint(tw, TE_DEFAULTS_TRACK_UUID, s->thread_uuid);
  lg_tw_end_nested(tw);
  put_uint(tw, DEFAULTS_CLOCK_ID, SEQUENCE_CLOCK);
  lg_tw_end_nested(tw);
  if (!s->started)
    put_uint(tw, PKT_FIRST_ON_SEQUENCE, 1);
  int rc = end(s);
  /* Until a first packet really reaches the buffer, the next one is still the first. */
  if (rc == 0)
    s->started = true;
  return rc;
}

/* kind: TD_THREAD, TD_PROCESS or TD_COUNTER. */
static int write_descriptor(lg_sequence *s, uint32_t kind) {
  lg_trace_writer *tw = s->tw;
  char name[48];
  begin(s, false);
  put_uint(tw, PKT_TIMESTAMP, 0);
  put_uint(tw, PKT_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
  lg_tw_begin_nested(tw, PKT_TRACK_DESCRIPTOR);
  switch (kind) {
  case TD_THREAD:
    put_uint(tw, TD_UUID, s->thread_uuid);
    put_uint(tw, TD_PARENT_UUID, s->process_uuid);
    snprintf(name, sizeof(name), "loadgen-w%u", s->writer);
    lg_tw_begin_nested(tw, TD_THREAD);
    put_uint(tw, THREAD_PID, (uint32_t)s->pid);
    put_uint(tw, THREAD_TID, (uint32_t)s->tid);
    put_string(tw, THREAD_NAME, name);
    lg_tw_end_nested(tw);
    break;
  case TD_PROCESS:
    put_uint(tw, TD_UUID, s->process_uuid);
    lg_tw_begin_nested(tw, TD_PROCESS);
    put_uint(tw, PROC_PID, (uint32_t)s->pid);
    put_string(tw, PROC_NAME, "tracerelay-loadgen");
    lg_tw_end_nested(tw);
    break;
  default:
    put_uint(tw, TD_UUID, s->counter_uuid);
    put_uint(tw, TD_PARENT_UUID, s->process_uuid);
    snprintf(name, sizeof(name), "loadgen.counter.w%u", s->writer);
    put_string(tw, TD_NAME, name);
    lg_tw_begin_nested(tw, TD_COUNTER);
    lg_tw_end_nested(tw);
    break;
  }
  lg_tw_end_nested(tw);
  return end(s);
}

static int write_state(lg_sequence *s, uint64_t now) {
  static const uint32_t kinds[] = {TD_THREAD, TD_PROCESS, TD_COUNTER};
  int rc = write_state_packet(s, now);
  for (size_t i = 0; rc == 0 && i < sizeof(kinds) / sizeof(kinds[0]); i++)
    rc = write_descriptor(s, kinds[i]);
  if (rc < 0)
    return rc;
  s->state_valid = true;
  s->interned = false;
  s->last_ts = now;
  return 0;
}

static void put_interned_data(lg_trace_writer *tw) {
  lg_tw_begin_nested(tw, PKT_INTERNED_DATA);
  put_interned(tw, INTERNED_CATEGORIES, 1, "loadgen");
  put_interned(tw, INTERNED_EVENT_NAMES, 1, "slice");
  put_interned(tw, INTERNED_ANNOTATION_NAMES, IID_WRITER, LG_ANNOTATION_WRITER);
  put_interned(tw, INTERNED_ANNOTATION_NAMES, IID_SEQ, LG_ANNOTATION_SEQ);
  put_interned(tw, INTERNED_ANNOTATION_NAMES, IID_PAD, LG_ANNOTATION_PAD);
  lg_tw_end_nested(tw);
}

static void put_annotation(lg_trace_writer *tw, uint64_t iid, uint64_t value) {
  lg_tw_begin_nested(tw, TE_DEBUG_ANNOTATIONS);
  put_uint(tw, DA_NAME_IID, iid);
  put_uint(tw, DA_UINT_VALUE, value);
  lg_tw_end_nested(tw);
}

/* The last field of the event: a string annotation that brings the packet to packet_size
 * (one byte short where the string's length varint grows). It costs tag 1 + size 4 +
 * name_iid 2 + string tag 1 + length varint + the string. */
static void put_padding(lg_sequence *s) {
  static const char zeros[256];
  uint64_t used = lg_tw_packet_bytes(s->tw);
  if (s->packet_size < used + 9)
    return;
  uint64_t len = s->packet_size - used - 9;
  len -= varint_len(len) - 1;
  lg_tw_begin_nested(s->tw, TE_DEBUG_ANNOTATIONS);
  put_uint(s->tw, DA_NAME_IID, IID_PAD);
  put_varint(s->tw, DA_STRING_VALUE << 3 | 2);
  put_varint(s->tw, len);
  for (uint64_t left = len; left > 0;) {
    size_t n = left < sizeof(zeros) ? (size_t)left : sizeof(zeros);
    lg_tw_append(s->tw, zeros, n);
    left -= n;
  }
  lg_tw_end_nested(s->tw);
}

static int write_track_event(lg_sequence *s, uint64_t now) {
  lg_trace_writer *tw = s->tw;
  /* Every 8th event is a counter, on its own track, so it may fall inside an open slice. */
  int type = s->seq % 8 == 7 ? TYPE_COUNTER : s->slice_open ? TYPE_SLICE_END : TYPE_SLICE_BEGIN;
  int rc = begin(s, false);
  put_uint(tw, PKT_TIMESTAMP, now - s->last_ts);
  put_uint(tw, PKT_SEQUENCE_FLAGS, SEQ_NEEDS_INCREMENTAL_STATE);
  bool interning = !s->interned;
  if (interning)
    put_interned_data(tw);
  lg_tw_begin_nested(tw, PKT_TRACK_EVENT);
  put_uint(tw, TE_TYPE, (uint64_t)type);
  uint64_t flow_out = 0, flow_in = 0;
  if (type == TYPE_SLICE_BEGIN) {
    put_uint(tw, TE_CATEGORY_IIDS, 1);
    put_uint(tw, TE_NAME_IID, 1);
    if ((flow_out = s->flow_out) != 0)
      put_fixed64(tw, TE_FLOW_IDS, flow_out);
    if ((flow_in = s->flow_in) != 0)
      put_fixed64(tw, TE_TERMINATING_FLOW_IDS, flow_in);
  } else if (type == TYPE_COUNTER) {
    put_uint(tw, TE_TRACK_UUID, s->counter_uuid);
    put_uint(tw, TE_COUNTER_VALUE, s->seq);
  }
  put_annotation(tw, IID_WRITER, s->writer);
  put_annotation(tw, IID_SEQ, s->seq);
  put_padding(s);
  lg_tw_end_nested(tw);
  s->seq++;
  int end_rc = end(s);
  if (rc == 0)
    rc = end_rc;
  if (rc < 0) {
    s->events_dropped++;
    s->flow_in = 0; /* an arrival lost with its event: that flow has none */
    return rc;
  }
  s->events_written++;
  s->last_ts = now;
  if (flow_out)
    s->flow_written = flow_out;
  if (flow_out || flow_in)
    s->flow_out = s->flow_in = 0;
  s->interned = true;
  if (type != TYPE_COUNTER)
    s->slice_open = type == TYPE_SLICE_BEGIN;
  return 0;
}

void lg_seq_init(lg_sequence *s, lg_trace_writer *tw, uint32_t writer, uint32_t packet_size,
                 int32_t pid, int32_t tid) {
  memset(s, 0, sizeof(*s));
  s->tw = tw;
  s->writer = writer;
  s->packet_size = packet_size;
  s->pid = pid;
  s->tid = tid;
  /* Distinct per process and writer, never 0. */
  s->process_uuid = (uint64_t)(uint32_t)pid << 32 | 0x4c470000u;
  s->thread_uuid = s->process_uuid | (uint64_t)writer << 1;
  s->counter_uuid = s->thread_uuid | 1;
}

int lg_seq_write_event(lg_sequence *s, uint64_t now_ns) {
  if (!s->state_valid) {
    int rc = write_state(s, now_ns);
    if (rc < 0) {
      /* Without the state the event's delta means nothing: drop it as well. */
      s->seq++;
      s->events_dropped++;
      return rc;
    }
  }
  return write_track_event(s, now_ns);
}

int lg_seq_finish(lg_sequence *s, uint64_t now_ns) {
  return s->slice_open ? lg_seq_write_event(s, now_ns) : 0;
}

void lg_seq_clear_incremental_state(lg_sequence *s) { s->state_valid = false; }
