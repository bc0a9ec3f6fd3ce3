/* varint.c: protobuf base-128 varints (see varint.h). */
#include "relay/base/varint.h"

size_t tr_varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

size_t tr_varint_put(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

bool tr_varint_get(const uint8_t *p, size_t len, size_t *pos, uint64_t *v) {
  *v = 0;
  for (unsigned shift = 0; shift < 70; shift += 7) {
    if (*pos >= len)
      return false;
    uint8_t byte = p[(*pos)++];
    *v |= (uint64_t)(byte & 0x7f) << shift;
    if (!(byte & 0x80))
      return true;
  }
  return false;
}
