/* clock.h: the builtin clocks of this host, read by Perfetto BuiltinClock id, and the simulated
 * clock used by the accuracy tests.
 *
 * Offers: one clock read in ns (tr_clock_read), a snapshot of all six builtin clocks read as
 * traced reads them (BOOTTIME first, then REALTIME_COARSE, MONOTONIC_COARSE, REALTIME, MONOTONIC,
 * MONOTONIC_RAW), and the clock names ("BOOTTIME"...) that global clock ids are hashed from.
 *
 * Simulated clock (a test feature, `--fake-clock offset_ns,drift_ppm` of the agent and loadgen):
 * once tr_clock_set_fake() is called, every read returns
 *     fake(t) = t + floor(t * drift_ppm / 1e6) + offset_ns
 * of the real reading t, i.e. a*t + b with a = 1 + drift_ppm*1e-6 and b = offset_ns. The origin of
 * t is each clock's own zero, fixed for all processes, so every process given the same flag
 * agrees on the simulated clock and a test can compute the true instant of any simulated
 * timestamp. drift_ppm is applied in units of 1e-12 (parts per trillion) and the product is
 * computed exactly in 128-bit integers, so fake() is monotonic in t (strictly where a >= 1; with
 * a < 1 two readings 1 ns apart may collide) because a > 0 (|drift_ppm| <= TR_CLOCK_FAKE_MAX_PPM).
 * The setting is process-wide and not synchronised: set it before starting threads.
 *
 * Cost: one clock_gettime() per clock read. */
#ifndef TR_CLOCK_H
#define TR_CLOCK_H

#include <stdint.h>

/* Perfetto BuiltinClock ids (reference 5.3). */
enum tr_builtin_clock {
  TR_CLOCK_REALTIME = 1,
  TR_CLOCK_REALTIME_COARSE = 2,
  TR_CLOCK_MONOTONIC = 3,
  TR_CLOCK_MONOTONIC_COARSE = 4,
  TR_CLOCK_MONOTONIC_RAW = 5,
  TR_CLOCK_BOOTTIME = 6,
};

#define TR_CLOCK_SNAPSHOT_MAX 6
#define TR_CLOCK_FAKE_MAX_PPM 100000.0

struct tr_clock_reading {
  uint32_t clock_id; /* enum tr_builtin_clock */
  uint64_t ts_ns;
};

struct tr_clock_snapshot {
  uint32_t n; /* always TR_CLOCK_SNAPSHOT_MAX after a successful tr_clock_snapshot() */
  struct tr_clock_reading clocks[TR_CLOCK_SNAPSHOT_MAX];
};

/* Reads one builtin clock. TR_ERR_INVAL for an id that is not one of the six above, or when a
 * negative fake offset would make the reading negative; TR_ERR_SYS(errno) if the kernel refuses. */
int tr_clock_read(uint32_t clock_id, uint64_t *ts_ns);
/* BOOTTIME now in ns (through tr_clock_read, so the fake clock applies); 0 if it cannot be read. */
uint64_t tr_clock_boottime_ns(void);
/* BOOTTIME as tr_clock_read gives it (the simulated clock included) at the instant the real
 * BOOTTIME read real_ns: for kernel stamps converted on the real clock (relay/link/sock_stamp.c), so
 * that a stamp's age does not run at the simulated drift. Errors as tr_clock_read. */
int tr_clock_boottime_at(uint64_t real_ns, uint64_t *ts_ns);
/* Reads all six, BOOTTIME first, in traced's order. 0 or the first tr_clock_read() error. */
int tr_clock_snapshot(struct tr_clock_snapshot *out);
/* "BOOTTIME", "REALTIME"...: the names global clock ids are hashed from; NULL for other ids. */
const char *tr_clock_name(uint32_t clock_id);

/* Turns the simulated clock on for the whole process. TR_ERR_INVAL if |drift_ppm| is over
 * TR_CLOCK_FAKE_MAX_PPM or not a number. */
int tr_clock_set_fake(int64_t offset_ns, double drift_ppm);
/* Back to the real clocks. */
void tr_clock_clear_fake(void);
/* fake(t) for a real reading t, as defined above; what tr_clock_read() returns when the fake is
 * on. Tests and the loadgen use it to know the truth. TR_ERR_INVAL if the result is negative or
 * does not fit in int64. */
int tr_clock_fake_apply(int64_t offset_ns, double drift_ppm, uint64_t real_ns, uint64_t *fake_ns);
/* Parses the --fake-clock value "offset_ns,drift_ppm" (e.g. "3600000000000,-150.5"): a decimal
 * integer, a comma, a decimal number, nothing else. TR_ERR_CONFIG on any other text or on a drift
 * over TR_CLOCK_FAKE_MAX_PPM. */
int tr_clock_parse_fake(const char *arg, int64_t *offset_ns, double *drift_ppm);

#endif
