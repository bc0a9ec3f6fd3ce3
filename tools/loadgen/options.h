/* options.h: the command line of tracerelay-loadgen, parsed and checked (see --help). */
#ifndef LG_OPTIONS_H
#define LG_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct lg_options {
  const char *socket_path;
  const char *producer_name;
  const char *data_source;
  unsigned writers;
  double rate;          /* events per second per writer, 0 = as fast as possible */
  uint32_t packet_size; /* bytes, 0 = natural size */
  double duration_s;    /* 0 = no limit */
  uint64_t packets;     /* events per writer, 0 = no limit */
  bool fake_clock;
  int64_t fake_offset_ns;
  double fake_drift_ppm;
  uint32_t page_size_hint; /* bytes, 0 = none */
  uint32_t smb_size_hint;  /* bytes, 0 = none */
  unsigned chunks_per_page;
  bool no_flush;
  const char *stats_json;
  bool commit_latency; /* sample commit-to-free latency (commit_latency.h) */
  const char *flow_send, *flow_recv; /* FIFO paths, or NULL (tools/loadgen/flows.h) */
  double stop_delay_s; /* confirm a stop this long after it came (0: at once) */
  const char *trigger;    /* --trigger: a trigger to activate, or NULL */
  double trigger_after_s; /* that long after the data source started */
  bool trigger_from_connect; /* --trigger-from connect: after the connection instead */
  uint64_t hang_after; /* leave a packet unfinished after this many events, then wait (0: no) */
} lg_options;

/* Returns 0 with *o filled, 1 if --help or --version was printed, or TR_ERR_CONFIG after
 * printing what is wrong to stderr. */
int lg_options_parse(int argc, char **argv, lg_options *o);

#endif
