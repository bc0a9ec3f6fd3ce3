/* trace_writer.c: encodes the service's own TracePackets (see trace_writer.h).
 *
 * Each packet is a protobuf-c TracePacket with the trusted header (uid, sequence 1, timestamp)
 * packed by protobuf-c, and, for TraceStats, the stats bytes appended as a raw field so that our
 * extension fields can follow Perfetto's inside the same message (protobuf merges repeated
 * occurrences of a message field, so the bytes concatenate). */
#include "relay/trace/trace_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

#define SERVICE_SEQUENCE_ID 1u
#define FIELD_TRACE_STATS 35u
#define TRACERELAY_VERSION "tracerelay " TR_VERSION

const uint8_t tr_trace_writer_sync_marker_uuid[16] = {0x82, 0x47, 0x7a, 0x76, 0xb2, 0x8d,
                                                      0x42, 0xba, 0x81, 0xdc, 0x33, 0x32,
                                                      0x6d, 0x57, 0xa0, 0x79};

void tr_trace_writer_buf_free(tr_trace_writer_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = 0;
}

size_t tr_trace_writer_record_header(size_t packet_len, uint8_t *out) {
  out[0] = 0x0A;
  return 1 + tr_varint_put(out + 1, packet_len);
}

static void init_header(Perfetto__Protos__TracePacket *p, int32_t uid) {
  perfetto__protos__trace_packet__init(p);
  p->has_trusted_uid = 1;
  p->trusted_uid = uid;
  p->has_trusted_packet_sequence_id = 1;
  p->trusted_packet_sequence_id = SERVICE_SEQUENCE_ID;
}

static void set_timestamp(Perfetto__Protos__TracePacket *p, uint64_t ts) {
  p->has_timestamp = 1;
  p->timestamp = ts;
}

/* Packs p, then appends field `field` (length-delimited) holding raw bytes, if raw_len or
 * field is non-zero. */
static int finish(const Perfetto__Protos__TracePacket *p, uint32_t field, const uint8_t *raw,
                  size_t raw_len, tr_trace_writer_buf *out) {
  size_t head = perfetto__protos__trace_packet__get_packed_size(p);
  size_t extra = field ? 20 + raw_len : 0;
  out->data = malloc(head + extra + 1);
  if (!out->data)
    return TR_ERR_NOMEM;
  out->len = perfetto__protos__trace_packet__pack(p, out->data);
  if (field) {
    out->len += tr_varint_put(out->data + out->len, (uint64_t)field << 3 | 2);
    out->len += tr_varint_put(out->data + out->len, raw_len);
    if (raw_len)
      memcpy(out->data + out->len, raw, raw_len);
    out->len += raw_len;
  }
  return 0;
}

int tr_trace_writer_clock_snapshot(int32_t uid, const struct tr_clock_snapshot *snap,
                                   tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__ClockSnapshot cs = PERFETTO__PROTOS__CLOCK_SNAPSHOT__INIT;
  Perfetto__Protos__ClockSnapshot__Clock clocks[TR_CLOCK_SNAPSHOT_MAX];
  Perfetto__Protos__ClockSnapshot__Clock *ptrs[TR_CLOCK_SNAPSHOT_MAX];
  uint32_t n = snap->n < TR_CLOCK_SNAPSHOT_MAX ? snap->n : TR_CLOCK_SNAPSHOT_MAX;

  for (uint32_t i = 0; i < n; i++) {
    perfetto__protos__clock_snapshot__clock__init(&clocks[i]);
    clocks[i].has_clock_id = 1;
    clocks[i].clock_id = snap->clocks[i].clock_id;
    clocks[i].has_timestamp = 1;
    clocks[i].timestamp = snap->clocks[i].ts_ns;
    ptrs[i] = &clocks[i];
  }
  cs.n_clocks = n;
  cs.clocks = ptrs;
  cs.has_primary_trace_clock = 1;
  cs.primary_trace_clock = PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME;
  init_header(&p, uid);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_CLOCK_SNAPSHOT;
  p.clock_snapshot = &cs;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_sync_marker(int32_t uid, uint64_t boottime_ns, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_SYNCHRONIZATION_MARKER;
  p.synchronization_marker.data = (uint8_t *)tr_trace_writer_sync_marker_uuid;
  p.synchronization_marker.len = sizeof tr_trace_writer_sync_marker_uuid;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_trace_config(int32_t uid, const Perfetto__Protos__TraceConfig *cfg,
                                 tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  init_header(&p, uid);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_CONFIG;
  p.trace_config = (Perfetto__Protos__TraceConfig *)cfg;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_trace_uuid(int32_t uid, int64_t msb, int64_t lsb, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__TraceUuid u = PERFETTO__PROTOS__TRACE_UUID__INIT;
  u.has_msb = 1;
  u.msb = msb;
  u.has_lsb = 1;
  u.lsb = lsb;
  init_header(&p, uid);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACE_UUID;
  p.trace_uuid = &u;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_system_info(int32_t uid, const Perfetto__Protos__SystemInfo *info,
                                uint32_t machine_id, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  init_header(&p, uid);
  if (machine_id) {
    p.has_machine_id = 1;
    p.machine_id = machine_id;
  }
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_SYSTEM_INFO;
  p.system_info = (Perfetto__Protos__SystemInfo *)info;
  return finish(&p, 0, NULL, 0, out);
}

static int service_event(int32_t uid, uint64_t boottime_ns,
                         const Perfetto__Protos__TracingServiceEvent *ev, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_SERVICE_EVENT;
  p.service_event = (Perfetto__Protos__TracingServiceEvent *)ev;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_service_event(int32_t uid, uint64_t boottime_ns,
                                  enum tr_trace_writer_event event, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracingServiceEvent ev = PERFETTO__PROTOS__TRACING_SERVICE_EVENT__INIT;
  /* Every kind written here is a `bool x = true` member of the oneof, and protobuf-c lays the
   * oneof's bools over one another, so setting one member by case is enough. */
  ev.event_type_case = (Perfetto__Protos__TracingServiceEvent__EventTypeCase)event;
  ev.tracing_started = 1;
  return service_event(uid, boottime_ns, &ev, out);
}

int tr_trace_writer_buffer_cloned(int32_t uid, uint64_t boottime_ns, uint32_t buffer,
                                  tr_trace_writer_buf *out) {
  Perfetto__Protos__TracingServiceEvent ev = PERFETTO__PROTOS__TRACING_SERVICE_EVENT__INIT;
  ev.event_type_case = PERFETTO__PROTOS__TRACING_SERVICE_EVENT__EVENT_TYPE_BUFFER_CLONED;
  ev.buffer_cloned = buffer;
  return service_event(uid, boottime_ns, &ev, out);
}

int tr_trace_writer_clone_trigger(int32_t uid, uint64_t boottime_ns, const char *trigger_name,
                                  const char *producer_name, int32_t producer_uid,
                                  uint64_t delay_ms, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__Trigger t = PERFETTO__PROTOS__TRIGGER__INIT;
  t.trigger_name = (char *)trigger_name;
  t.producer_name = (char *)producer_name;
  t.has_trusted_producer_uid = 1;
  t.trusted_producer_uid = producer_uid;
  t.has_stop_delay_ms = 1;
  t.stop_delay_ms = delay_ms;
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_CLONE_SNAPSHOT_TRIGGER;
  p.clone_snapshot_trigger = &t;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_trigger(int32_t uid, uint64_t boottime_ns,
                            const struct tr_trace_writer_trigger *t, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__Trigger tg = PERFETTO__PROTOS__TRIGGER__INIT;
  tg.trigger_name = (char *)t->trigger_name;
  tg.producer_name = (char *)t->producer_name;
  tg.has_trusted_producer_uid = tg.has_stop_delay_ms = 1;
  tg.trusted_producer_uid = t->producer_uid;
  tg.stop_delay_ms = t->stop_delay_ms;
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRIGGER;
  p.trigger = &tg;
  return finish(&p, 0, NULL, 0, out);
}

/* A track descriptor; parent 0: none. counter_unit NULL: not a counter track. */
static int track_descriptor(int32_t uid, uint64_t uuid, uint64_t parent, const char *name,
                            const char *counter_unit, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__TrackDescriptor td = PERFETTO__PROTOS__TRACK_DESCRIPTOR__INIT;
  Perfetto__Protos__CounterDescriptor cd = PERFETTO__PROTOS__COUNTER_DESCRIPTOR__INIT;
  td.has_uuid = 1;
  td.uuid = uuid;
  if (parent) {
    td.has_parent_uuid = 1;
    td.parent_uuid = parent;
  }
  td.static_or_dynamic_name_case = PERFETTO__PROTOS__TRACK_DESCRIPTOR__STATIC_OR_DYNAMIC_NAME_NAME;
  td.name = (char *)name;
  if (counter_unit) {
    cd.unit_name = (char *)counter_unit;
    td.counter = &cd;
  }
  init_header(&p, uid);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_DESCRIPTOR;
  p.track_descriptor = &td;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_service_track(int32_t uid, tr_trace_writer_buf *out) {
  return track_descriptor(uid, TR_TRACE_WRITER_SERVICE_TRACK_UUID, 0, "tracerelay service", NULL,
                          out);
}

/* uuids of a host's tracks: FNV-1a-64 of a name of their own, so no host's can be another's. */
static uint64_t host_uuid(const char *kind, const char *host) {
  char key[320];
  int n = snprintf(key, sizeof key, "tracerelay/%s/%s", kind, host);
  return tr_fnv1a64(key, n < 0 ? 0 : (size_t)n < sizeof key ? (size_t)n : sizeof key - 1);
}

uint64_t tr_trace_writer_host_track_uuid(const char *host) { return host_uuid("host", host); }

uint64_t tr_trace_writer_bound_track_uuid(const char *host) {
  return host_uuid("clock-error-bound", host);
}

int tr_trace_writer_host_tracks(int32_t uid, const char *host, tr_trace_writer_buf *host_track,
                                tr_trace_writer_buf *bound_track) {
  char name[TR_TRACE_WRITER_TRACK_NAME_MAX];
  uint64_t parent = tr_trace_writer_host_track_uuid(host);
  int rc;
  snprintf(name, sizeof name, "host %s", host);
  if ((rc = track_descriptor(uid, parent, 0, name, NULL, host_track)) != 0)
    return rc;
  snprintf(name, sizeof name, "%s%s", host, TR_TRACE_WRITER_BOUND_TRACK_SUFFIX);
  rc = track_descriptor(uid, tr_trace_writer_bound_track_uuid(host), parent, name, "us",
                        bound_track);
  if (rc != 0)
    tr_trace_writer_buf_free(host_track);
  return rc;
}

/* A track event of the service's sequence on track_uuid at boottime_ns. */
static int track_event(int32_t uid, uint64_t boottime_ns, Perfetto__Protos__TrackEvent *te,
                       uint64_t track_uuid, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  te->has_track_uuid = 1;
  te->track_uuid = track_uuid;
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_TRACK_EVENT;
  p.track_event = te;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_instant(int32_t uid, uint64_t boottime_ns, uint64_t track_uuid,
                            const char *name, tr_trace_writer_buf *out) {
  Perfetto__Protos__TrackEvent te = PERFETTO__PROTOS__TRACK_EVENT__INIT;
  te.has_type = 1;
  te.type = PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_INSTANT;
  te.name_field_case = PERFETTO__PROTOS__TRACK_EVENT__NAME_FIELD_NAME;
  te.name = (char *)name;
  return track_event(uid, boottime_ns, &te, track_uuid, out);
}

int tr_trace_writer_counter(int32_t uid, uint64_t boottime_ns, uint64_t track_uuid, double value,
                            tr_trace_writer_buf *out) {
  Perfetto__Protos__TrackEvent te = PERFETTO__PROTOS__TRACK_EVENT__INIT;
  te.has_type = 1;
  te.type = PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_COUNTER;
  te.counter_value_field_case = PERFETTO__PROTOS__TRACK_EVENT__COUNTER_VALUE_FIELD_DOUBLE_COUNTER_VALUE;
  te.double_counter_value = value;
  return track_event(uid, boottime_ns, &te, track_uuid, out);
}

static void boottime_snapshot(Perfetto__Protos__ClockSnapshot *cs,
                              Perfetto__Protos__ClockSnapshot__Clock *clock,
                              Perfetto__Protos__ClockSnapshot__Clock **ptr, int64_t ts) {
  perfetto__protos__clock_snapshot__init(cs);
  perfetto__protos__clock_snapshot__clock__init(clock);
  clock->has_clock_id = 1;
  clock->clock_id = TR_CLOCK_BOOTTIME;
  clock->has_timestamp = 1;
  clock->timestamp = (uint64_t)ts;
  *ptr = clock;
  cs->n_clocks = 1;
  cs->clocks = ptr;
}

int tr_trace_writer_remote_clock_sync(int32_t uid, uint32_t machine_id,
                                      const struct tr_clocksync_sync_pair *pair,
                                      tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  Perfetto__Protos__RemoteClockSync rcs = PERFETTO__PROTOS__REMOTE_CLOCK_SYNC__INIT;
  Perfetto__Protos__RemoteClockSync__SyncedClocks sc[2];
  Perfetto__Protos__RemoteClockSync__SyncedClocks *scp[2] = {&sc[0], &sc[1]};
  Perfetto__Protos__ClockSnapshot snaps[4];
  Perfetto__Protos__ClockSnapshot__Clock clocks[4];
  Perfetto__Protos__ClockSnapshot__Clock *ptrs[4];
  const int64_t values[4] = {pair->ping_remote, pair->ping_service, pair->update_remote,
                             pair->update_service};

  for (int i = 0; i < 4; i++)
    boottime_snapshot(&snaps[i], &clocks[i], &ptrs[i], values[i]);
  for (int i = 0; i < 2; i++) {
    perfetto__protos__remote_clock_sync__synced_clocks__init(&sc[i]);
    sc[i].client_clocks = &snaps[2 * i];
    sc[i].host_clocks = &snaps[2 * i + 1];
  }
  rcs.n_synced_clocks = 2;
  rcs.synced_clocks = scp;
  perfetto__protos__trace_packet__init(&p);
  p.has_trusted_uid = 1;
  p.trusted_uid = uid;
  p.has_machine_id = 1;
  p.machine_id = machine_id;
  p.data_case = PERFETTO__PROTOS__TRACE_PACKET__DATA_REMOTE_CLOCK_SYNC;
  p.remote_clock_sync = &rcs;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_clock_anchor(int32_t uid, uint32_t machine_id, uint64_t host_boottime_ns,
                                 tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  init_header(&p, uid);
  set_timestamp(&p, host_boottime_ns);
  p.has_machine_id = 1;
  p.machine_id = machine_id;
  return finish(&p, 0, NULL, 0, out);
}

int tr_trace_writer_trace_stats(int32_t uid, uint64_t boottime_ns,
                                const Perfetto__Protos__TraceStats *stats, const uint8_t *extra,
                                size_t extra_len, tr_trace_writer_buf *out) {
  Perfetto__Protos__TracePacket p;
  size_t n = perfetto__protos__trace_stats__get_packed_size(stats);
  uint8_t *raw = malloc(n + extra_len + 1);
  int rc;

  if (!raw)
    return TR_ERR_NOMEM;
  perfetto__protos__trace_stats__pack(stats, raw);
  if (extra_len)
    memcpy(raw + n, extra, extra_len);
  init_header(&p, uid);
  set_timestamp(&p, boottime_ns);
  rc = finish(&p, FIELD_TRACE_STATS, raw, n + extra_len, out);
  free(raw);
  return rc;
}

static int timezone_offset_mins(void) {
  time_t now = time(NULL);
  struct tm tm;
  if (!localtime_r(&now, &tm))
    return 0;
  return (int)(tm.tm_gmtoff / 60);
}

int tr_trace_writer_local_system_info(const char *machine_name,
                                      Perfetto__Protos__SystemInfo **out) {
  Perfetto__Protos__SystemInfo *si = malloc(sizeof *si);
  Perfetto__Protos__Utsname *u = malloc(sizeof *u);
  struct utsname uts;
  struct sysinfo sys;

  *out = NULL;
  if (!si || !u)
    goto fail;
  perfetto__protos__system_info__init(si);
  perfetto__protos__utsname__init(u);
  si->utsname = u;
  u = NULL;
  if (uname(&uts) == 0) {
    si->utsname->sysname = strdup(uts.sysname);
    si->utsname->version = strdup(uts.version);
    si->utsname->release = strdup(uts.release);
    si->utsname->machine = strdup(uts.machine);
    if (!si->utsname->sysname || !si->utsname->version || !si->utsname->release ||
        !si->utsname->machine)
      goto fail;
  }
  si->tracing_service_version = strdup(TRACERELAY_VERSION);
  if (!si->tracing_service_version)
    goto fail;
  if (machine_name && !(si->machine_name = strdup(machine_name)))
    goto fail;
  si->has_hz = 1;
  si->hz = sysconf(_SC_CLK_TCK);
  si->has_page_size = 1;
  si->page_size = (uint32_t)sysconf(_SC_PAGESIZE);
  si->has_num_cpus = 1;
  si->num_cpus = (uint32_t)sysconf(_SC_NPROCESSORS_CONF);
  si->has_timezone_off_mins = 1;
  si->timezone_off_mins = timezone_offset_mins();
  if (sysinfo(&sys) == 0) {
    si->has_system_ram_bytes = 1;
    si->system_ram_bytes = (uint64_t)sys.totalram * sys.mem_unit;
  }
  *out = si;
  return 0;
fail:
  free(u);
  if (si)
    perfetto__protos__system_info__free_unpacked(si, NULL);
  return TR_ERR_NOMEM;
}

int tr_trace_writer_service_system_info(Perfetto__Protos__SystemInfo **out) {
  char host[256] = "", name[sizeof host + sizeof TR_TRACE_WRITER_SERVICE_MACHINE_MARK];
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0')
    snprintf(host, sizeof host, "unknown host");
  snprintf(name, sizeof name, "%s" TR_TRACE_WRITER_SERVICE_MACHINE_MARK, host);
  return tr_trace_writer_local_system_info(name, out);
}
