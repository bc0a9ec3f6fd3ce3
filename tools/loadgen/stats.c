/* stats.c: totals and output of the loadgen's counts (see stats.h). */
#include "tools/loadgen/stats.h"

#include <errno.h>
#include <stdbool.h>
#include <unistd.h>

#include "relay/base/tr_error.h"

void lg_stats_add(lg_stats *st, const lg_writer_stats *w) {
  st->writers[st->num_writers++] = *w;
  lg_writer_stats *t = &st->total;
  t->tw.packets_written += w->tw.packets_written;
  t->tw.packets_dropped += w->tw.packets_dropped;
  t->tw.bytes_written += w->tw.bytes_written;
  t->tw.chunks_committed += w->tw.chunks_committed;
  t->tw.patches_sent += w->tw.patches_sent;
  t->events_written += w->events_written;
  t->events_dropped += w->events_dropped;
}

/* As `key=value` pairs for people, or as JSON members. */
static void print_counts(FILE *out, const lg_writer_stats *w, bool json) {
  const struct { const char *name; uint64_t value; } counts[] = {
      {"packets_written", w->tw.packets_written}, {"packets_dropped", w->tw.packets_dropped},
      {"events_written", w->events_written},      {"events_dropped", w->events_dropped},
      {"bytes_written", w->tw.bytes_written},     {"chunks_committed", w->tw.chunks_committed},
      {"patches_sent", w->tw.patches_sent},
  };
  for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
    fprintf(out, json ? "%s\"%s\":%llu" : "%s%s=%llu", i == 0 ? "" : json ? "," : " ",
            counts[i].name, (unsigned long long)counts[i].value);
}

void lg_stats_print(const lg_stats *st, FILE *out) {
  fprintf(out, "loadgen: %.3f s, %llu CommitData frames\n", st->elapsed_s,
          (unsigned long long)st->commit_data_frames);
  for (unsigned i = 0; i < st->num_writers; i++) {
    fprintf(out, "writer %u: ", st->writers[i].writer_id);
    print_counts(out, &st->writers[i], false);
    fputc('\n', out);
  }
  fputs("total: ", out);
  print_counts(out, &st->total, false);
  fputc('\n', out);
  if (st->latency)
    fprintf(out, "commit to free: %llu samples, p50 %.1f us, p99 %.1f us, max %.1f us, %llu "
                 "unfinished; until the IPC thread took it p50 %.1f us, p99 %.1f us; from "
                 "there to free p50 %.1f us, p99 %.1f us\n",
            (unsigned long long)st->latency->samples, st->latency->p50_us, st->latency->p99_us,
            st->latency->max_us, (unsigned long long)st->latency->unfinished,
            st->latency->to_send_p50_us, st->latency->to_send_p99_us,
            st->latency->after_send_p50_us, st->latency->after_send_p99_us);
}

int lg_stats_write_json(const lg_stats *st, const char *path) {
  char tmp[4096];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
    return TR_ERR_SYS(ENAMETOOLONG);
  FILE *f = fopen(tmp, "w");
  if (!f)
    return TR_ERR_SYS(errno);
  fputs("{\"writers\":[", f);
  for (unsigned i = 0; i < st->num_writers; i++) {
    fprintf(f, "%s{\"writer_id\":%u,", i ? "," : "", st->writers[i].writer_id);
    print_counts(f, &st->writers[i], true);
    fputc('}', f);
  }
  fputs("],\"total\":{", f);
  print_counts(f, &st->total, true);
  fprintf(f, "},\"commit_data_frames\":%llu,\"elapsed_s\":%.6f",
          (unsigned long long)st->commit_data_frames, st->elapsed_s);
  if (st->latency) {
    fputc(',', f);
    lg_latency_write_json(st->latency, f);
  }
  fputs("}\n", f);
  /* Renamed into place, so that a reader waiting for the file (a test of --hang-after) never
   * finds half of it. */
  if (fclose(f) != 0 || rename(tmp, path) != 0) {
    int err = errno;
    unlink(tmp);
    return TR_ERR_SYS(err);
  }
  return 0;
}
