/* stats.h: the loadgen's final counts, per writer and in total, printed as text and written as
 * JSON for tests and benchmarks:
 *   {"writers": [{"writer_id": 1, "packets_written": ..., ...}, ...],
 *    "total": {"packets_written": ..., ...}, "commit_data_frames": N, "elapsed_s": S
 *    [, "commit_to_free_us": {"samples", "unfinished", "p50", "p99", "max"}]}
 * The JSON file appears whole (written aside, then renamed). Every drop is counted:
 * packets_dropped (SMB full) and events_dropped (event numbers used up without reaching the
 * SMB, a subset of the dropped packets' events). */
#ifndef LG_STATS_H
#define LG_STATS_H

#include <stdint.h>
#include <stdio.h>

#include "tools/loadgen/commit_latency.h"
#include "tools/loadgen_writer/smb_writer.h"

typedef struct lg_writer_stats {
  uint32_t writer_id;
  lg_writer_counters tw;
  uint64_t events_written;
  uint64_t events_dropped;
} lg_writer_stats;

typedef struct lg_stats {
  lg_writer_stats *writers;
  unsigned num_writers;
  lg_writer_stats total; /* writer_id 0 */
  uint64_t commit_data_frames;
  double elapsed_s;
  const struct lg_latency_result *latency; /* --commit-latency, else NULL */
} lg_stats;

/* Adds one writer's counts (and to the total). writers must have room (caller allocates). */
void lg_stats_add(lg_stats *st, const lg_writer_stats *w);
void lg_stats_print(const lg_stats *st, FILE *out);
/* Writes the JSON above to path. 0 or TR_ERR_SYS(errno). */
int lg_stats_write_json(const lg_stats *st, const char *path);

#endif
