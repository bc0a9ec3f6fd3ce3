/* packet_rewrite.c: the global-clocks rewrite of producer packets and the service's cross-host
 * ClockSnapshots (see packet_rewrite.h for the rules and their reasons).
 *
 * The packet is walked once at the top level and copied field by field into the output; the
 * few fields that change are written anew. A sub-message that changes (59, 6 and its Clocks,
 * 1) is encoded twice by the same function, first into a counting sink for its length prefix,
 * then for real, so nothing is buffered or moved. */
#include "relay/trace/packet_rewrite.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/base/fnv1a.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

/* TracePacket */
#define PACKET_FTRACE_EVENTS 1u
#define PACKET_CLOCK_SNAPSHOT 6u
#define PACKET_TIMESTAMP 8u
#define PACKET_SEQUENCE_ID 10u
#define PACKET_SEQUENCE_FLAGS 13u
#define PACKET_INCREMENTAL_STATE_CLEARED 41u
#define PACKET_CLOCK_ID 58u
#define PACKET_DEFAULTS 59u
#define SEQ_INCREMENTAL_STATE_CLEARED 1u
/* TracePacketDefaults */
#define DEFAULTS_CLOCK_ID 58u
/* ClockSnapshot and ClockSnapshot.Clock */
#define SNAPSHOT_CLOCKS 1u
#define SNAPSHOT_PRIMARY_TRACE_CLOCK 2u
#define CLOCK_ID 1u
#define CLOCK_TIMESTAMP 2u
/* FtraceEventBundle */
#define BUNDLE_FTRACE_CLOCK 5u
#define BUNDLE_FTRACE_TIMESTAMP 6u
#define BUNDLE_BOOT_TIMESTAMP 7u
#define FTRACE_CLOCK_UNSPECIFIED 0u
#define FTRACE_CLOCK_GLOBAL 2u
#define FTRACE_CLOCK_LOCAL 3u
#define FTRACE_CLOCK_MONO_RAW 4u
/* trace_processor's clock for GLOBAL/LOCAL ftrace timestamps, scoped to the bundle's sequence. */
#define FTRACE_SEQUENCE_CLOCK 64u

#define SERVICE_SEQUENCE_ID 1u

struct field {
  uint32_t num, wire;
  uint64_t value;      /* TR_WIRE_VARINT */
  const uint8_t *data; /* TR_WIRE_BYTES payload */
  size_t len;
  const uint8_t *raw; /* the whole field, tag included, as it came */
  size_t raw_len;
};

/* Output that never writes past cap but keeps counting, so the caller learns the size needed;
 * with p NULL it only counts. */
struct sink {
  uint8_t *p;
  size_t cap, n;
};

/* The anchor an ftrace bundle asks for: clock 64 of its sequence reads `ts64` when the host's
 * global clock `clock` reads `ts`. */
struct anchor {
  bool needed;
  uint32_t clock;
  uint64_t ts64, ts;
};

/* What the top-level walk learns about the packet. */
struct packet_facts {
  bool has_timestamp;
  uint32_t clock_id; /* last 58, 0 if none */
  uint64_t sequence_flags;
  bool incremental_state_cleared;
  bool has_defaults;
  uint32_t defaults_clock; /* last 58 of the last 59 */
  struct anchor anchor;
};

/* 1 and the next field in *f, 0 at the end, TR_ERR_DECODE for anything Perfetto would refuse. */
static int next_field(const uint8_t *buf, size_t len, size_t *pos, struct field *f) {
  if (*pos >= len)
    return 0;
  size_t start = *pos;
  uint64_t tag;
  if (!tr_varint_get(buf, len, pos, &tag) || (tag >> 3) == 0 || (tag >> 3) > TR_WIRE_MAX_FIELD)
    return TR_ERR_DECODE;
  f->num = (uint32_t)(tag >> 3);
  f->wire = (uint32_t)(tag & 7);
  f->value = 0;
  f->data = NULL;
  f->len = 0;
  switch (f->wire) {
  case TR_WIRE_VARINT:
    if (!tr_varint_get(buf, len, pos, &f->value))
      return TR_ERR_DECODE;
    break;
  case TR_WIRE_FIXED64:
  case TR_WIRE_FIXED32: {
    size_t width = f->wire == TR_WIRE_FIXED64 ? 8 : 4;
    if (len - *pos < width)
      return TR_ERR_DECODE;
    *pos += width;
    break;
  }
  case TR_WIRE_BYTES: {
    uint64_t n;
    if (!tr_varint_get(buf, len, pos, &n) || n > len - *pos)
      return TR_ERR_DECODE;
    f->data = buf + *pos;
    f->len = (size_t)n;
    *pos += (size_t)n;
    break;
  }
  default: /* groups and wire types 6, 7 */
    return TR_ERR_DECODE;
  }
  f->raw = buf + start;
  f->raw_len = *pos - start;
  return 1;
}

static void put(struct sink *s, const void *bytes, size_t n) {
  if (s->p && s->n <= s->cap && n <= s->cap - s->n)
    memcpy(s->p + s->n, bytes, n);
  s->n += n;
}

static void put_varint(struct sink *s, uint64_t v) {
  uint8_t b[TR_VARINT_MAX];
  put(s, b, tr_varint_put(b, v));
}

static void put_tag(struct sink *s, uint32_t num, uint32_t wire) {
  put_varint(s, (uint64_t)num << 3 | wire);
}

static void put_varint_field(struct sink *s, uint32_t num, uint64_t v) {
  put_tag(s, num, TR_WIRE_VARINT);
  put_varint(s, v);
}

static void put_raw(struct sink *s, const struct field *f) {
  put(s, f->raw, f->raw_len);
}

/* Encodes a message body from `in` (which may be NULL for bodies built from ctx alone). */
typedef int (*encode_fn)(void *ctx, const uint8_t *in, size_t len, struct sink *s);

/* Writes field `num` as the message `encode` produces: once to size it, once for real. */
static int put_message(struct sink *s, uint32_t num, encode_fn encode, void *ctx,
                       const uint8_t *in, size_t len) {
  struct sink size = {0};
  int rc = encode(ctx, in, len, &size);
  if (rc < 0)
    return rc;
  put_tag(s, num, TR_WIRE_BYTES);
  put_varint(s, size.n);
  return encode(ctx, in, len, s);
}

static uint32_t hashed_clock_id(const char *machine, uint32_t clock_id) {
  char decimal[11];
  const char *name = tr_clock_name(clock_id);
  if (!name) {
    snprintf(decimal, sizeof decimal, "%" PRIu32, clock_id);
    name = decimal;
  }
  return tr_global_clock_id(machine, name);
}

int tr_rewrite_host_init(tr_rewrite_host *host, const char *machine, const uint32_t *shared,
                         size_t n_shared) {
  size_t n = strnlen(machine, TR_REWRITE_MACHINE_MAX + 1);
  if (n == 0 || n > TR_REWRITE_MACHINE_MAX)
    return TR_ERR_INVAL;
  if (n_shared > TR_REWRITE_SHARED_MAX)
    return TR_ERR_TOO_BIG;
  for (size_t i = 0; i < n_shared; i++)
    if (shared[i] < 128)
      return TR_ERR_INVAL;
  memset(host, 0, sizeof *host);
  memcpy(host->machine, machine, n);
  for (uint32_t c = 1; c < 64; c++)
    host->builtin[c] = hashed_clock_id(host->machine, c);
  if (n_shared)
    memcpy(host->shared, shared, n_shared * sizeof *shared);
  host->n_shared = n_shared;
  return 0;
}

uint32_t tr_rewrite_clock_id(const tr_rewrite_host *host, uint32_t clock_id) {
  if (clock_id == 0 || (clock_id >= 64 && clock_id < 128))
    return clock_id;
  if (clock_id < 64)
    return host->builtin[clock_id];
  for (size_t i = 0; i < host->n_shared; i++)
    if (host->shared[i] == clock_id)
      return clock_id;
  return hashed_clock_id(host->machine, clock_id);
}

/* A uint32 clock id field: copied as it came when the mapping keeps it, else re-encoded.
 * Protobuf readers truncate a wider varint to the field's 32 bits; so do we. */
static int put_clock_id_field(struct sink *s, const tr_rewrite_host *host,
                              const struct field *f) {
  if (f->wire != TR_WIRE_VARINT)
    return TR_ERR_DECODE;
  uint32_t id = (uint32_t)f->value;
  uint32_t mapped = tr_rewrite_clock_id(host, id);
  if (mapped == id)
    put_raw(s, f);
  else
    put_varint_field(s, f->num, mapped);
  return 0;
}

struct defaults_ctx {
  const tr_rewrite_host *host;
  uint32_t clock; /* the last timestamp_clock_id seen, 0 if none */
};

static int encode_defaults(void *ctx, const uint8_t *in, size_t len, struct sink *s) {
  struct defaults_ctx *d = ctx;
  struct field f;
  size_t pos = 0;
  int rc;
  d->clock = 0;
  while ((rc = next_field(in, len, &pos, &f)) > 0) {
    if (f.num != DEFAULTS_CLOCK_ID) {
      put_raw(s, &f);
      continue;
    }
    if ((rc = put_clock_id_field(s, d->host, &f)) < 0)
      return rc;
    d->clock = (uint32_t)f.value;
  }
  return rc;
}

static int encode_clock(void *ctx, const uint8_t *in, size_t len, struct sink *s) {
  const tr_rewrite_host *host = ctx;
  struct field f;
  size_t pos = 0;
  int rc;
  while ((rc = next_field(in, len, &pos, &f)) > 0) {
    if (f.num != CLOCK_ID)
      put_raw(s, &f);
    else if ((rc = put_clock_id_field(s, host, &f)) < 0)
      return rc;
  }
  return rc;
}

static int encode_snapshot(void *ctx, const uint8_t *in, size_t len, struct sink *s) {
  struct field f;
  size_t pos = 0;
  int rc;
  while ((rc = next_field(in, len, &pos, &f)) > 0) {
    if (f.num == SNAPSHOT_PRIMARY_TRACE_CLOCK)
      continue;
    if (f.num != SNAPSHOT_CLOCKS) {
      put_raw(s, &f);
      continue;
    }
    if (f.wire != TR_WIRE_BYTES)
      return TR_ERR_DECODE;
    if ((rc = put_message(s, SNAPSHOT_CLOCKS, encode_clock, ctx, f.data, f.len)) < 0)
      return rc;
  }
  return rc;
}

/* How one ftrace bundle is rewritten; see (e) in packet_rewrite.h. */
struct bundle_plan {
  bool drop_clock; /* drop ftrace_clock and append GLOBAL */
  bool drop_pair;  /* drop ftrace_timestamp and boot_timestamp */
};

static int encode_bundle(void *ctx, const uint8_t *in, size_t len, struct sink *s) {
  const struct bundle_plan *plan = ctx;
  struct field f;
  size_t pos = 0;
  int rc;
  while ((rc = next_field(in, len, &pos, &f)) > 0) {
    if (f.num == BUNDLE_FTRACE_CLOCK && plan->drop_clock)
      continue;
    if ((f.num == BUNDLE_FTRACE_TIMESTAMP || f.num == BUNDLE_BOOT_TIMESTAMP) && plan->drop_pair)
      continue;
    put_raw(s, &f);
  }
  if (rc == 0 && plan->drop_clock)
    put_varint_field(s, BUNDLE_FTRACE_CLOCK, FTRACE_CLOCK_GLOBAL);
  return rc;
}

static int put_bundle(struct sink *s, const tr_rewrite_host *host, const struct field *bundle,
                      struct anchor *anchor) {
  uint64_t clock = FTRACE_CLOCK_UNSPECIFIED, ftrace_ts = 0, boot_ts = 0;
  bool has_ftrace_ts = false, has_boot_ts = false;
  struct field f;
  size_t pos = 0;
  int rc;
  while ((rc = next_field(bundle->data, bundle->len, &pos, &f)) > 0) {
    if (f.num != BUNDLE_FTRACE_CLOCK && f.num != BUNDLE_FTRACE_TIMESTAMP &&
        f.num != BUNDLE_BOOT_TIMESTAMP)
      continue;
    if (f.wire != TR_WIRE_VARINT)
      return TR_ERR_DECODE;
    if (f.num == BUNDLE_FTRACE_CLOCK) {
      clock = f.value;
    } else if (f.num == BUNDLE_FTRACE_TIMESTAMP) {
      has_ftrace_ts = true;
      ftrace_ts = f.value;
    } else {
      has_boot_ts = true;
      boot_ts = f.value;
    }
  }
  if (rc < 0)
    return rc;

  struct bundle_plan plan = {false, false};
  *anchor = (struct anchor){false, 0, 0, 0};
  if (clock == FTRACE_CLOCK_UNSPECIFIED || clock == FTRACE_CLOCK_MONO_RAW) {
    uint32_t builtin = clock == FTRACE_CLOCK_UNSPECIFIED ? TR_CLOCK_BOOTTIME
                                                         : TR_CLOCK_MONOTONIC_RAW;
    plan = (struct bundle_plan){true, true};
    *anchor = (struct anchor){true, host->builtin[builtin], 0, 0};
  } else if ((clock == FTRACE_CLOCK_GLOBAL || clock == FTRACE_CLOCK_LOCAL) && has_ftrace_ts &&
             has_boot_ts) {
    /* int64 on the wire; a ClockSnapshot timestamp is the same 64 bits as uint64. */
    plan = (struct bundle_plan){false, true};
    *anchor = (struct anchor){true, host->builtin[TR_CLOCK_BOOTTIME], ftrace_ts, boot_ts};
  } else {
    /* GLOBAL/LOCAL without a pair reads clock 64 as anchored before; unknown clocks are
     * refused by trace_processor whatever we do. */
    put_raw(s, bundle);
    return 0;
  }
  return put_message(s, PACKET_FTRACE_EVENTS, encode_bundle, &plan, bundle->data, bundle->len);
}

static int put_top_field(struct sink *s, const tr_rewrite_host *host, const struct field *f,
                         struct packet_facts *pf) {
  switch (f->num) {
  case PACKET_TIMESTAMP:
  case PACKET_SEQUENCE_FLAGS:
  case PACKET_INCREMENTAL_STATE_CLEARED:
    if (f->wire != TR_WIRE_VARINT)
      return TR_ERR_DECODE;
    if (f->num == PACKET_TIMESTAMP)
      pf->has_timestamp = true;
    else if (f->num == PACKET_SEQUENCE_FLAGS)
      pf->sequence_flags = f->value;
    else
      pf->incremental_state_cleared = f->value != 0;
    put_raw(s, f);
    return 0;
  case PACKET_CLOCK_ID:
    pf->clock_id = (uint32_t)f->value;
    return put_clock_id_field(s, host, f);
  case PACKET_DEFAULTS: {
    if (f->wire != TR_WIRE_BYTES)
      return TR_ERR_DECODE;
    struct defaults_ctx d = {host, 0};
    int rc = put_message(s, PACKET_DEFAULTS, encode_defaults, &d, f->data, f->len);
    pf->has_defaults = true;
    pf->defaults_clock = d.clock;
    return rc;
  }
  case PACKET_CLOCK_SNAPSHOT:
    if (f->wire != TR_WIRE_BYTES)
      return TR_ERR_DECODE;
    return put_message(s, PACKET_CLOCK_SNAPSHOT, encode_snapshot, (void *)host, f->data,
                       f->len);
  case PACKET_FTRACE_EVENTS:
    if (f->wire != TR_WIRE_BYTES)
      return TR_ERR_DECODE;
    return put_bundle(s, host, f, &pf->anchor);
  default:
    put_raw(s, f);
    return 0;
  }
}

/* A ClockSnapshot of two clocks, optionally naming the trace clock. */
struct two_clocks {
  uint32_t id[2];
  uint64_t ts[2];
  bool primary_boottime;
};

static int encode_clock_pair(void *ctx, const uint8_t *in, size_t len, struct sink *s) {
  (void)in;
  (void)len;
  const struct two_clocks *c = ctx;
  for (int i = 0; i < 2; i++) {
    put_tag(s, SNAPSHOT_CLOCKS, TR_WIRE_BYTES);
    put_varint(s, 2 + tr_varint_len(c->id[i]) + tr_varint_len(c->ts[i]));
    put_varint_field(s, CLOCK_ID, c->id[i]);
    put_varint_field(s, CLOCK_TIMESTAMP, c->ts[i]);
  }
  if (c->primary_boottime)
    put_varint_field(s, SNAPSHOT_PRIMARY_TRACE_CLOCK, TR_CLOCK_BOOTTIME);
  return 0;
}

/* At most 36 bytes: two Clocks of a 1- or 5-byte id and a 10-byte timestamp, in field 6. */
static size_t put_anchor(const struct anchor *a, uint8_t *out) {
  struct two_clocks c = {{FTRACE_SEQUENCE_CLOCK, a->clock}, {a->ts64, a->ts}, false};
  struct sink s = {out, TR_REWRITE_ANCHOR_MAX, 0};
  put_message(&s, PACKET_CLOCK_SNAPSHOT, encode_clock_pair, &c, NULL, 0);
  return s.n;
}

int tr_rewrite_packet(const tr_rewrite_host *host, tr_rewrite_seq *seq, const uint8_t *packet,
                      size_t len, uint8_t *out, size_t cap, uint8_t *anchor, size_t *anchor_len) {
  *anchor_len = 0;
  if (len > TR_REWRITE_PACKET_MAX)
    return TR_ERR_TOO_BIG;
  struct sink s = {out, cap, 0};
  struct packet_facts pf = {0};
  struct field f;
  size_t pos = 0;
  int rc;
  while ((rc = next_field(packet, len, &pos, &f)) > 0)
    if ((rc = put_top_field(&s, host, &f, &pf)) < 0)
      return rc;
  if (rc < 0)
    return rc;

  /* trace_processor's order: a clear drops the defaults, then this packet's defaults apply,
   * then its timestamp is read. */
  tr_rewrite_seq next = *seq;
  if ((pf.sequence_flags & SEQ_INCREMENTAL_STATE_CLEARED) || pf.incremental_state_cleared)
    next.default_clock = false;
  if (pf.has_defaults)
    next.default_clock = pf.defaults_clock != 0;
  if (pf.has_timestamp && pf.clock_id == 0 && !next.default_clock)
    put_varint_field(&s, PACKET_CLOCK_ID, host->builtin[TR_CLOCK_BOOTTIME]);
  if (s.n > cap)
    return TR_ERR_TOO_BIG;

  const struct anchor *a = &pf.anchor;
  if (a->needed && (!next.anchored || next.anchor_clock != a->clock || next.anchor_ts != a->ts64)) {
    *anchor_len = put_anchor(a, anchor);
    next.anchored = true;
    next.anchor_clock = a->clock;
    next.anchor_ts = a->ts64;
  }
  *seq = next;
  return (int)s.n;
}

int tr_rewrite_cross_host_snapshot(const tr_rewrite_host *host, int64_t service_ts,
                                   int64_t host_ts, uint8_t *out, size_t cap) {
  if (service_ts < 0 || host_ts < 0)
    return TR_ERR_INVAL;
  struct two_clocks c = {{TR_CLOCK_BOOTTIME, host->builtin[TR_CLOCK_BOOTTIME]},
                         {(uint64_t)service_ts, (uint64_t)host_ts},
                         true};
  struct sink s = {out, cap, 0};
  put_message(&s, PACKET_CLOCK_SNAPSHOT, encode_clock_pair, &c, NULL, 0);
  put_varint_field(&s, PACKET_SEQUENCE_ID, SERVICE_SEQUENCE_ID);
  if (s.n > cap)
    return TR_ERR_TOO_BIG;
  return (int)s.n;
}
