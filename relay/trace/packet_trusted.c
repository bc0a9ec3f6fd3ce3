/* packet_trusted.c: the trusted slice and the producer packet check (reference 4.8). */
#include "relay/trace/packet_trusted.h"

#include <stdbool.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/base/varint.h"

static size_t put_field(uint8_t *p, uint32_t field, uint64_t v) {
  size_t n = tr_varint_put(p, (uint64_t)field << 3 | TR_WIRE_VARINT);
  return n + tr_varint_put(p + n, v);
}

int tr_tbuf_append_trusted(uint8_t *out, size_t cap, const tr_tbuf_trusted *t) {
  uint8_t slice[TR_TBUF_TRUSTED_MAX];
  size_t n = 0;
  /* int32 fields: negative values are sign-extended, as protobuf encodes them. */
  n += put_field(slice + n, 3, (uint64_t)(int64_t)t->uid);
  n += put_field(slice + n, 10, t->sequence_id);
  if (t->pid > 0)
    n += put_field(slice + n, 79, (uint64_t)(int64_t)t->pid);
  if (t->machine_id)
    n += put_field(slice + n, 98, t->machine_id);
  if (t->previous_packet_dropped)
    n += put_field(slice + n, 42, t->previous_packet_dropped);
  if (n > cap)
    return TR_ERR_TOO_BIG;
  memcpy(out, slice, n);
  return (int)n;
}

static bool reserved_to_service(uint64_t field) {
  static const uint16_t reserved[] = {3, 10, 33, 35, 36, 50, 69, 79, 98, 124, 125, 133};
  for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
    if (field == reserved[i])
      return true;
  return false;
}

int tr_tbuf_validate_packet(const uint8_t *packet, size_t len) {
  size_t pos = 0;
  while (pos < len) {
    uint64_t tag, v;
    if (!tr_varint_get(packet, len, &pos, &tag))
      return TR_ERR_DECODE;
    uint64_t field = tag >> 3;
    if (field == 0 || field > TR_WIRE_MAX_FIELD)
      return TR_ERR_DECODE;
    if (reserved_to_service(field))
      return TR_ERR_PERM;
    switch (tag & 7) {
    case TR_WIRE_VARINT:
      if (!tr_varint_get(packet, len, &pos, &v))
        return TR_ERR_DECODE;
      break;
    case TR_WIRE_FIXED64:
    case TR_WIRE_FIXED32: {
      size_t width = (tag & 7) == TR_WIRE_FIXED64 ? 8 : 4;
      if (len - pos < width)
        return TR_ERR_DECODE;
      pos += width;
      break;
    }
    case TR_WIRE_BYTES:
      if (!tr_varint_get(packet, len, &pos, &v) || v > len - pos)
        return TR_ERR_DECODE;
      pos += (size_t)v;
      break;
    default: /* groups (3, 4) and 6, 7: Perfetto's decoder refuses them too */
      return TR_ERR_DECODE;
    }
  }
  return 0;
}
