/* byte_size.c: sizes typed in flags and shown in messages (byte_size.h). */
#include "relay/base/byte_size.h"

#include <stdio.h>
#include <string.h>

#include "relay/base/tr_error.h"

static const char kUnits[] = "KMGT";

int tr_byte_size_parse(const char *s, uint64_t *out) {
  uint64_t v = 0;
  const char *p = s;
  if (*p < '0' || *p > '9')
    return TR_ERR_CONFIG;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (UINT64_MAX - 9) / 10)
      return TR_ERR_CONFIG;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (*p != '\0') {
    const char *u = strchr(kUnits, *p);
    if (!u)
      return TR_ERR_CONFIG;
    for (long shift = 10 * (u - kUnits + 1); shift > 0; shift -= 10) {
      if (v > (UINT64_MAX >> 10))
        return TR_ERR_CONFIG;
      v <<= 10;
    }
    p++;
    if (strcmp(p, "iB") != 0 && strcmp(p, "B") != 0 && *p != '\0')
      return TR_ERR_CONFIG;
  }
  if (v == 0 || v > (UINT64_C(1) << 63))
    return TR_ERR_CONFIG;
  *out = v;
  return 0;
}

void tr_byte_size_format(uint64_t v, char out[TR_BYTE_SIZE_TEXT]) {
  static const char *const names[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = -1;
  while (unit + 1 < 6 && v >> (10 * (unit + 2)) > 0)
    unit++;
  if (unit < 0) {
    snprintf(out, TR_BYTE_SIZE_TEXT, "%llu byte%s", (unsigned long long)v, v == 1 ? "" : "s");
    return;
  }
  unsigned shift = 10u * (unsigned)(unit + 1);
  uint64_t whole = v >> shift;
  if ((v & ((UINT64_C(1) << shift) - 1)) == 0)
    snprintf(out, TR_BYTE_SIZE_TEXT, "%llu %s", (unsigned long long)whole, names[unit]);
  else
    snprintf(out, TR_BYTE_SIZE_TEXT, "%.1f %s", (double)v / (double)(UINT64_C(1) << shift),
             names[unit]);
}
