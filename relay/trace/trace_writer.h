/* trace_writer.h: the service's own TracePackets (module tr_trace_writer), pure encoding.
 *
 * Every packet made here is one the central service writes itself, so each carries
 * trusted_uid = the service's uid and trusted_packet_sequence_id = 1 (reference 4.8: sequence 1
 * is the service's own), plus machine_id for the SystemInfo of a remote host (reference 7.4).
 * Results are malloc'd TracePacket bytes (tr_trace_writer_buf, free with
 * tr_trace_writer_buf_free) ready to go into a ReadBuffers slice; tr_trace_writer_record_header
 * gives the `0x0A varint(len)` prefix that makes a packet a record of a trace file (reference
 * 5.1). No I/O, no clocks read except by the *_system_info functions (uname, sysconf, hostname). */
#ifndef TR_TRACE_WRITER_H
#define TR_TRACE_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "perfetto/common/trace_stats.pb-c.h"
#include "perfetto/config/trace_config.pb-c.h"
#include "perfetto/trace/system_info.pb-c.h"
#include "relay/clock/clock.h"
#include "relay/clock/clocksync.h"

/* Longest record header: the 0x0A tag and a 64-bit varint. */
#define TR_TRACE_WRITER_RECORD_HEADER_MAX 11u
/* TracePacket.synchronization_marker (reference 5.2). */
extern const uint8_t tr_trace_writer_sync_marker_uuid[16];

typedef struct tr_trace_writer_buf {
  uint8_t *data;
  size_t len;
} tr_trace_writer_buf;

/* TracingServiceEvent kinds (values are the oneof field numbers, reference 5.2). */
enum tr_trace_writer_event {
  TR_TW_ALL_DATA_SOURCES_STARTED = 1,
  TR_TW_TRACING_STARTED = 2,
  TR_TW_ALL_DATA_SOURCES_FLUSHED = 3,
  TR_TW_READ_TRACING_BUFFERS_COMPLETED = 4,
  TR_TW_TRACING_DISABLED = 5,
  TR_TW_FLUSH_STARTED = 9,
  TR_TW_CLONE_STARTED = 10, /* in a clone: when the clone began (its flush was asked) */
  TR_TW_BUFFER_CLONED = 11, /* in a clone: a buffer copied; written by tr_trace_writer_buffer_cloned */
};

void tr_trace_writer_buf_free(tr_trace_writer_buf *b);

/* Writes `0x0A varint(packet_len)` into out (TR_TRACE_WRITER_RECORD_HEADER_MAX bytes) and
 * returns its length. */
size_t tr_trace_writer_record_header(size_t packet_len, uint8_t *out);

/* Each returns 0 or TR_ERR_NOMEM, and fills *out. */
/* ClockSnapshot of the service's clocks, primary_trace_clock BOOTTIME. */
int tr_trace_writer_clock_snapshot(int32_t uid, const struct tr_clock_snapshot *snap,
                                   tr_trace_writer_buf *out);
/* synchronization_marker, timestamped on BOOTTIME. */
int tr_trace_writer_sync_marker(int32_t uid, uint64_t boottime_ns, tr_trace_writer_buf *out);
/* trace_config as the consumer sent it (unknown fields kept). */
int tr_trace_writer_trace_config(int32_t uid, const Perfetto__Protos__TraceConfig *cfg,
                                 tr_trace_writer_buf *out);
int tr_trace_writer_trace_uuid(int32_t uid, int64_t msb, int64_t lsb, tr_trace_writer_buf *out);
/* system_info; machine_id 0 for the service's own machine, tr_machine_id(name) for a host. */
int tr_trace_writer_system_info(int32_t uid, const Perfetto__Protos__SystemInfo *info,
                                uint32_t machine_id, tr_trace_writer_buf *out);
int tr_trace_writer_service_event(int32_t uid, uint64_t boottime_ns,
                                  enum tr_trace_writer_event event, tr_trace_writer_buf *out);
/* A trigger that a session received (TracePacket.trigger, as traced writes it), at the
 * service's BOOTTIME of its arrival. */
struct tr_trace_writer_trigger {
  const char *trigger_name, *producer_name;
  int32_t producer_uid;
  uint64_t stop_delay_ms;
};
int tr_trace_writer_trigger(int32_t uid, uint64_t boottime_ns,
                            const struct tr_trace_writer_trigger *t, tr_trace_writer_buf *out);
/* buffer_cloned = buffer (the index of the buffer in the config), as traced writes it into a
 * clone for each buffer it copied. */
int tr_trace_writer_buffer_cloned(int32_t uid, uint64_t boottime_ns, uint32_t buffer,
                                  tr_trace_writer_buf *out);
/* clone_snapshot_trigger: the CLONE_SNAPSHOT trigger a clone was taken for (CloneSession's
 * clone_trigger_* fields), at the trigger's time. */
int tr_trace_writer_clone_trigger(int32_t uid, uint64_t boottime_ns, const char *trigger_name,
                                  const char *producer_name, int32_t producer_uid,
                                  uint64_t delay_ms, tr_trace_writer_buf *out);
/* The service's own track (a TrackDescriptor named "tracerelay service", uuid
 * TR_TRACE_WRITER_SERVICE_TRACK_UUID). Write a track before its events. */
#define TR_TRACE_WRITER_SERVICE_TRACK_UUID 0x7472616365726c79ull /* "tracerly" */
int tr_trace_writer_service_track(int32_t uid, tr_trace_writer_buf *out);
/* A host's tracks, both on the service's sequence and clock (docs/querying.md): "host NAME"
 * (uuid tr_trace_writer_host_track_uuid(NAME)) for marks such as its link going down, and under
 * it the counter track "NAME clock error bound (us)" (uuid tr_trace_writer_bound_track_uuid):
 * how far, at most, the trace may place that host's events from their true instants. */
#define TR_TRACE_WRITER_BOUND_TRACK_SUFFIX " clock error bound (us)"
#define TR_TRACE_WRITER_TRACK_NAME_MAX 320
uint64_t tr_trace_writer_host_track_uuid(const char *host);
uint64_t tr_trace_writer_bound_track_uuid(const char *host);
int tr_trace_writer_host_tracks(int32_t uid, const char *host, tr_trace_writer_buf *host_track,
                                tr_trace_writer_buf *bound_track);
/* An instant event named `name` (e.g. "host web-2 disconnected") on track_uuid at boottime_ns. */
int tr_trace_writer_instant(int32_t uid, uint64_t boottime_ns, uint64_t track_uuid,
                            const char *name, tr_trace_writer_buf *out);
/* A counter value (double_counter_value) on the counter track track_uuid at boottime_ns. */
int tr_trace_writer_counter(int32_t uid, uint64_t boottime_ns, uint64_t track_uuid, double value,
                            tr_trace_writer_buf *out);
/* remote_clock_sync for a remote host (machine_id), one exchange as a PING/UPDATE pair of
 * BOOTTIME readings (client = the host, host = the service), with trusted_uid and machine_id but
 * no sequence id, as traced writes it (vectors README section 5). */
int tr_trace_writer_remote_clock_sync(int32_t uid, uint32_t machine_id,
                                      const struct tr_clocksync_sync_pair *pair,
                                      tr_trace_writer_buf *out);
/* A packet with nothing but a timestamp on a remote host's BOOTTIME (machine_id), on the
 * service's sequence: the `machines` encoding's clock anchor (docs/timeline.md). Written right
 * after the host's first remote_clock_sync, it makes trace_processor convert a timestamp of
 * that machine before the machine's first ClockSnapshot, which would otherwise make that
 * machine's BOOTTIME the whole trace's clock (v58: a ClockSnapshot without
 * primary_trace_clock names BOOTTIME the trace clock while its machine has converted nothing). */
int tr_trace_writer_clock_anchor(int32_t uid, uint32_t machine_id, uint64_t host_boottime_ns,
                                 tr_trace_writer_buf *out);
/* trace_stats, followed by `extra` bytes (already-encoded TraceStats fields, e.g. our
 * per-host extension, see service/trace_output.c); extra may be NULL. */
int tr_trace_writer_trace_stats(int32_t uid, uint64_t boottime_ns,
                                const Perfetto__Protos__TraceStats *stats, const uint8_t *extra,
                                size_t extra_len, tr_trace_writer_buf *out);

/* This machine's SystemInfo: utsname, page size, cpus, RAM, hz, timezone, version and
 * machine_name (may be NULL). Free with protobuf_c_message_free_unpacked(info, NULL). */
int tr_trace_writer_local_system_info(const char *machine_name,
                                      Perfetto__Protos__SystemInfo **out);
/* What marks the service's own machine (machine_id 0) in its name: "HOSTNAME (tracerelay-service)",
 * which no host's certificate name can be, so readers (trace_processor's machine table,
 * `tracerelay inspect`, `tracerelay status`) tell it from the hosts. */
#define TR_TRACE_WRITER_SERVICE_MACHINE_MARK " (tracerelay-service)"
/* The service's own SystemInfo: tr_trace_writer_local_system_info named as above. */
int tr_trace_writer_service_system_info(Perfetto__Protos__SystemInfo **out);

#endif
