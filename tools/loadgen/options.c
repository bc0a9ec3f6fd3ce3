/* options.c: tracerelay-loadgen's flags and --help. */
#include "tools/loadgen/options.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"

#define MAX_WRITERS 1024
#define MAX_PACKET_SIZE (16u << 20)

static const char kHelp[] =
    "Usage: tracerelay-loadgen --socket PATH [options]\n"
    "\n"
    "A Perfetto producer that loads a producer socket (tracerelay-agent or Perfetto's traced)\n"
    "exactly as an app built on the Perfetto SDK does: it binds ProducerPort, registers a data\n"
    "source and, once the service starts it, writes TrackEvent packets into the shared memory\n"
    "buffer from several writer threads (chunks, fragments, packets spanning chunks, patches),\n"
    "committing them with CommitData. It answers flushes (commit, then ack), stops when the\n"
    "service stops the data source, then prints its counts.\n"
    "\n"
    "  --socket PATH          the producer socket to connect to (AF_UNIX). Required.\n"
    "  --name NAME            producer name sent in InitializeConnection\n"
    "                         (default tracerelay-loadgen).\n"
    "  --data-source NAME     data source to register (default track_event).\n"
    "  --writers N            writer threads, each its own trace writer and sequence, writer ids\n"
    "                         1..N (default 1, at most 1024).\n"
    "  --rate N               events per second per writer; 0 = as fast as possible\n"
    "                         (default 1000).\n"
    "  --packet-size BYTES    pad each event packet to about BYTES with a string annotation;\n"
    "                         0 = natural size, about 40 bytes (default 0, at most 16 MiB).\n"
    "  --duration S           stop writing after S seconds (decimals allowed).\n"
    "  --packets N            stop writing after N events per writer.\n"
    "                         Without --duration or --packets, writers run until the service\n"
    "                         stops the data source; with them, the loadgen still waits for it.\n"
    "  --fake-clock OFF_NS,DRIFT_PPM\n"
    "                         test feature: every timestamp is read from a simulated clock\n"
    "                         t + t*DRIFT_PPM/1e6 + OFF_NS of the real one (relay/clock/clock.h).\n"
    "  --page-size KB         SMB page size hint for the service (multiple of 4; default none).\n"
    "  --smb-size KB          SMB size hint for the service (default none).\n"
    "                         The service decides both; the SMB it sends is what is used.\n"
    "  --chunks-per-page N    layout used for free pages: 1, 2, 4, 7 or 14 chunks (default 1,\n"
    "                         as the SDK).\n"
    "  --no-flush             register the data source with no_flush, as the SDK's track_event\n"
    "                         does (the service then sends it no flushes).\n"
    "  --stats-json FILE      also write the counts to FILE as JSON.\n"
    "  --commit-latency       measure how long committed chunks wait in the shared memory\n"
    "                         before the service frees them (p50/p99/max, one sample a ms at\n"
    "                         most, ~20 us resolution; tools/loadgen/commit_latency.h), split\n"
    "                         where the IPC thread took the commit to send it.\n"
    "  --flow-send FIFO       test feature: writer 1 starts a flow (TrackEvent.flow_ids) on each\n"
    "                         slice and, once it is written, writes its id into FIFO.\n"
    "  --flow-recv FIFO       test feature: writer 1 ends each flow whose id it read from FIFO\n"
    "                         (terminating_flow_ids) on its next slice, stamped after the read;\n"
    "                         with a --flow-send loadgen on another host, every flow truly goes\n"
    "                         forward in time (`tracerelay inspect --check-order` checks it).\n"
    "  --stop-delay S         test feature: confirm a stop (NotifyDataSourceStopped) S seconds\n"
    "                         after the service asked for it, writing on meanwhile, as a data\n"
    "                         source whose teardown takes that long (default 0: at once).\n"
    "  --trigger NAME         activate trigger NAME (ActivateTriggers, as the SDK's\n"
    "                         perfetto::Tracing::ActivateTriggers) once the data source has\n"
    "                         run --trigger-after MS, writing on meanwhile and after.\n"
    "  --trigger-after MS     when to activate --trigger (default 0: as it starts).\n"
    "  --trigger-from WHEN    what --trigger-after counts from: `start` (the data source's,\n"
    "                         default) or `connect` (for START_TRACING sessions, whose data\n"
    "                         sources start only once triggered).\n"
    "  --hang-after N         test feature: after N events per writer, each writer begins one\n"
    "                         more packet, writes part of it and stops there, its chunk left\n"
    "                         being written, as in a process killed mid-write; once all have,\n"
    "                         the whole chunks are committed, the counts written (stdout,\n"
    "                         --stats-json: packets up to the last complete one) and the\n"
    "                         loadgen waits to be killed (SIGKILL: a crash). Implies\n"
    "                         --packets N.\n"
    "  --help                 print this text.\n"
    "  --version              print the version.\n"
    "\n"
    "Counts (stdout, and --stats-json), per writer and in total: packets written and dropped\n"
    "(SMB full, the packet is lost as with the SDK's BUFFER_EXHAUSTED_DROP), events written and\n"
    "dropped (events carry debug annotations writer=<id> and seq=<n>), bytes, chunks committed,\n"
    "patches sent, and CommitData frames.\n"
    "\n"
    "Exit status: 0 after the service stopped the data source, 1 on a session error or signal,\n"
    "2 on bad flags.\n";

static int bad(const char *flag, const char *value) {
  fprintf(stderr, "tracerelay-loadgen: invalid value '%s' for %s (see --help)\n", value, flag);
  return TR_ERR_CONFIG;
}

static int parse_u64(const char *flag, const char *s, uint64_t min, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
    return bad(flag, s);
  *out = v;
  return 0;
}

static int parse_double(const char *flag, const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < 0)
    return bad(flag, s);
  *out = v;
  return 0;
}

int lg_options_parse(int argc, char **argv, lg_options *o) {
  enum { SOCKET = 256, NAME, DATA_SOURCE, WRITERS, RATE, PACKET_SIZE, DURATION, PACKETS,
         FAKE_CLOCK, PAGE_SIZE, SMB_SIZE, CHUNKS_PER_PAGE, NO_FLUSH, STATS_JSON, FLOW_SEND,
         FLOW_RECV, COMMIT_LATENCY, STOP_DELAY, TRIGGER, TRIGGER_AFTER, TRIGGER_FROM, HANG_AFTER,
         HELP, VERSION };
  static const struct option longopts[] = {
      {"socket", required_argument, NULL, SOCKET},
      {"name", required_argument, NULL, NAME},
      {"data-source", required_argument, NULL, DATA_SOURCE},
      {"writers", required_argument, NULL, WRITERS},
      {"rate", required_argument, NULL, RATE},
      {"packet-size", required_argument, NULL, PACKET_SIZE},
      {"duration", required_argument, NULL, DURATION},
      {"packets", required_argument, NULL, PACKETS},
      {"fake-clock", required_argument, NULL, FAKE_CLOCK},
      {"page-size", required_argument, NULL, PAGE_SIZE},
      {"smb-size", required_argument, NULL, SMB_SIZE},
      {"chunks-per-page", required_argument, NULL, CHUNKS_PER_PAGE},
      {"no-flush", no_argument, NULL, NO_FLUSH},
      {"stats-json", required_argument, NULL, STATS_JSON},
      {"flow-send", required_argument, NULL, FLOW_SEND},
      {"flow-recv", required_argument, NULL, FLOW_RECV},
      {"commit-latency", no_argument, NULL, COMMIT_LATENCY},
      {"stop-delay", required_argument, NULL, STOP_DELAY},
      {"trigger", required_argument, NULL, TRIGGER},
      {"trigger-after", required_argument, NULL, TRIGGER_AFTER},
      {"trigger-from", required_argument, NULL, TRIGGER_FROM},
      {"hang-after", required_argument, NULL, HANG_AFTER},
      {"help", no_argument, NULL, HELP},
      {"version", no_argument, NULL, VERSION},
      {NULL, 0, NULL, 0},
  };
  *o = (lg_options){.producer_name = "tracerelay-loadgen", .data_source = "track_event",
                    .writers = 1, .rate = 1000, .chunks_per_page = 1};
  int opt, rc = 0;
  uint64_t v = 0;
  opterr = 0;
  optind = 1;
  while (rc == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (opt) {
    case SOCKET: o->socket_path = optarg; break;
    case NAME: o->producer_name = optarg; break;
    case DATA_SOURCE: o->data_source = optarg; break;
    case WRITERS:
      rc = parse_u64("--writers", optarg, 1, MAX_WRITERS, &v);
      o->writers = (unsigned)v;
      break;
    case RATE: rc = parse_double("--rate", optarg, &o->rate); break;
    case PACKET_SIZE:
      rc = parse_u64("--packet-size", optarg, 0, MAX_PACKET_SIZE, &v);
      o->packet_size = (uint32_t)v;
      break;
    case DURATION: rc = parse_double("--duration", optarg, &o->duration_s); break;
    case PACKETS: rc = parse_u64("--packets", optarg, 1, UINT64_MAX, &o->packets); break;
    case FAKE_CLOCK:
      o->fake_clock = true;
      if (tr_clock_parse_fake(optarg, &o->fake_offset_ns, &o->fake_drift_ppm) < 0)
        rc = bad("--fake-clock", optarg);
      break;
    case PAGE_SIZE:
      rc = parse_u64("--page-size", optarg, 4, 64, &v);
      if (rc == 0 && v % 4 != 0)
        rc = bad("--page-size", optarg);
      o->page_size_hint = (uint32_t)v * 1024;
      break;
    case SMB_SIZE:
      rc = parse_u64("--smb-size", optarg, 4, 1u << 20, &v);
      o->smb_size_hint = (uint32_t)v * 1024;
      break;
    case CHUNKS_PER_PAGE:
      rc = parse_u64("--chunks-per-page", optarg, 1, 14, &v);
      if (rc == 0 && v != 1 && v != 2 && v != 4 && v != 7 && v != 14)
        rc = bad("--chunks-per-page", optarg);
      o->chunks_per_page = (unsigned)v;
      break;
    case NO_FLUSH: o->no_flush = true; break;
    case STATS_JSON: o->stats_json = optarg; break;
    case FLOW_SEND: o->flow_send = optarg; break;
    case FLOW_RECV: o->flow_recv = optarg; break;
    case COMMIT_LATENCY: o->commit_latency = true; break;
    case STOP_DELAY: rc = parse_double("--stop-delay", optarg, &o->stop_delay_s); break;
    case TRIGGER: o->trigger = optarg; break;
    case TRIGGER_AFTER:
      rc = parse_u64("--trigger-after", optarg, 0, 7ull * 24 * 3600 * 1000, &v);
      o->trigger_after_s = (double)v / 1e3;
      break;
    case TRIGGER_FROM:
      if (strcmp(optarg, "start") != 0 && strcmp(optarg, "connect") != 0)
        rc = bad("--trigger-from", optarg);
      o->trigger_from_connect = strcmp(optarg, "connect") == 0;
      break;
    case HANG_AFTER: rc = parse_u64("--hang-after", optarg, 1, UINT64_MAX, &o->hang_after); break;
    case HELP: fputs(kHelp, stdout); return 1;
    case VERSION: printf("tracerelay-loadgen %s\n", TR_VERSION); return 1;
    default:
      fprintf(stderr, "tracerelay-loadgen: unknown or incomplete option '%s' (see --help)\n",
              argv[optind - 1]);
      rc = TR_ERR_CONFIG;
    }
  }
  if (rc == 0 && optind < argc) {
    fprintf(stderr, "tracerelay-loadgen: unexpected argument '%s' (see --help)\n", argv[optind]);
    rc = TR_ERR_CONFIG;
  }
  if (rc == 0 && o->hang_after)
    o->packets = o->hang_after;
  if (rc == 0 && !o->socket_path) {
    fprintf(stderr, "tracerelay-loadgen: --socket PATH is required (see --help)\n");
    rc = TR_ERR_CONFIG;
  }
  return rc;
}
