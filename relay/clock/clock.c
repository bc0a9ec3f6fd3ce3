/* clock.c: builtin clock reads by Perfetto id, traced-style snapshots, and the simulated clock.
 * See clock.h for the contract. */
#include "relay/clock/clock.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay/base/tr_error.h"

/* The simulated clock, process-wide: drift in parts per trillion so the product is exact. */
static bool fake_on;
static int64_t fake_offset_ns;
static double fake_drift_ppm;

/* traced's order: BOOTTIME first, so every other clock is read after the trace clock. */
static const uint32_t snapshot_order[TR_CLOCK_SNAPSHOT_MAX] = {
    TR_CLOCK_BOOTTIME, TR_CLOCK_REALTIME_COARSE, TR_CLOCK_MONOTONIC_COARSE,
    TR_CLOCK_REALTIME, TR_CLOCK_MONOTONIC,       TR_CLOCK_MONOTONIC_RAW,
};

static int posix_clock(uint32_t clock_id, clockid_t *out) {
  switch (clock_id) {
  case TR_CLOCK_REALTIME: *out = CLOCK_REALTIME; return 0;
  case TR_CLOCK_REALTIME_COARSE: *out = CLOCK_REALTIME_COARSE; return 0;
  case TR_CLOCK_MONOTONIC: *out = CLOCK_MONOTONIC; return 0;
  case TR_CLOCK_MONOTONIC_COARSE: *out = CLOCK_MONOTONIC_COARSE; return 0;
  case TR_CLOCK_MONOTONIC_RAW: *out = CLOCK_MONOTONIC_RAW; return 0;
  case TR_CLOCK_BOOTTIME: *out = CLOCK_BOOTTIME; return 0;
  }
  return TR_ERR_INVAL;
}

const char *tr_clock_name(uint32_t clock_id) {
  switch (clock_id) {
  case TR_CLOCK_REALTIME: return "REALTIME";
  case TR_CLOCK_REALTIME_COARSE: return "REALTIME_COARSE";
  case TR_CLOCK_MONOTONIC: return "MONOTONIC";
  case TR_CLOCK_MONOTONIC_COARSE: return "MONOTONIC_COARSE";
  case TR_CLOCK_MONOTONIC_RAW: return "MONOTONIC_RAW";
  case TR_CLOCK_BOOTTIME: return "BOOTTIME";
  }
  return NULL;
}

static bool drift_ok(double drift_ppm) {
  return isfinite(drift_ppm) && fabs(drift_ppm) <= TR_CLOCK_FAKE_MAX_PPM;
}

int tr_clock_fake_apply(int64_t offset_ns, double drift_ppm, uint64_t real_ns, uint64_t *fake_ns) {
  if (!drift_ok(drift_ppm) || real_ns > (uint64_t)INT64_MAX)
    return TR_ERR_INVAL;
  __int128 ppt = (__int128)llround(drift_ppm * 1e6);
  __int128 prod = (__int128)real_ns * ppt;
  __int128 q = prod / 1000000000000;
  if (prod % 1000000000000 < 0) /* floor, not truncation, so the definition holds for a < 1 */
    q -= 1;
  __int128 v = (__int128)real_ns + q + offset_ns;
  if (v < 0 || v > INT64_MAX)
    return TR_ERR_INVAL;
  *fake_ns = (uint64_t)v;
  return 0;
}

int tr_clock_read(uint32_t clock_id, uint64_t *ts_ns) {
  clockid_t cid;
  if (posix_clock(clock_id, &cid) < 0)
    return TR_ERR_INVAL;
  struct timespec ts;
  if (clock_gettime(cid, &ts) != 0)
    return TR_ERR_SYS(errno);
  uint64_t real = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  if (!fake_on) {
    *ts_ns = real;
    return 0;
  }
  return tr_clock_fake_apply(fake_offset_ns, fake_drift_ppm, real, ts_ns);
}

int tr_clock_boottime_at(uint64_t real_ns, uint64_t *ts_ns) {
  if (!fake_on) {
    *ts_ns = real_ns;
    return 0;
  }
  return tr_clock_fake_apply(fake_offset_ns, fake_drift_ppm, real_ns, ts_ns);
}

uint64_t tr_clock_boottime_ns(void) {
  uint64_t t = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &t);
  return t;
}

int tr_clock_snapshot(struct tr_clock_snapshot *out) {
  for (uint32_t i = 0; i < TR_CLOCK_SNAPSHOT_MAX; i++) {
    out->clocks[i].clock_id = snapshot_order[i];
    int rc = tr_clock_read(snapshot_order[i], &out->clocks[i].ts_ns);
    if (rc < 0)
      return rc;
  }
  out->n = TR_CLOCK_SNAPSHOT_MAX;
  return 0;
}

int tr_clock_set_fake(int64_t offset_ns, double drift_ppm) {
  if (!drift_ok(drift_ppm))
    return TR_ERR_INVAL;
  fake_offset_ns = offset_ns;
  fake_drift_ppm = drift_ppm;
  fake_on = true;
  return 0;
}

void tr_clock_clear_fake(void) {
  fake_on = false;
}

static bool starts_number(const char *s) {
  if (*s == '-' || *s == '+')
    s++;
  return (*s >= '0' && *s <= '9') || (*s == '.' && s[1] >= '0' && s[1] <= '9');
}

int tr_clock_parse_fake(const char *arg, int64_t *offset_ns, double *drift_ppm) {
  /* strtoll and strtod skip leading blanks and take "inf" or hex: accept plain decimals only. */
  if (!arg || !starts_number(arg))
    return TR_ERR_CONFIG;
  char *end;
  errno = 0;
  long long off = strtoll(arg, &end, 10);
  if (errno || end == arg || *end != ',')
    return TR_ERR_CONFIG;
  const char *d = end + 1;
  if (!starts_number(d) || strpbrk(d, "xX"))
    return TR_ERR_CONFIG;
  errno = 0;
  double drift = strtod(d, &end);
  if (errno || end == d || *end != '\0' || !drift_ok(drift))
    return TR_ERR_CONFIG;
  *offset_ns = off;
  *drift_ppm = drift;
  return 0;
}
