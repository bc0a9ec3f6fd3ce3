/* record.c: `tracerelay record`: options, the TraceConfig they build, the output file and
 * signal handling; the session itself is record_session.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay/reading/pbtxt.h"
#include "tools/tracerelay/commands.h"
#include "tools/tracerelay/record_config.h"
#include "tools/tracerelay/record_session.h"

#define DEFAULT_SOCKET "/run/tracerelay/consumer.sock"
#define MAX_DATA_SOURCES 64
#define FILL_RING PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__RING_BUFFER
#define FILL_DISCARD PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__DISCARD

static volatile sig_atomic_t stop_requests;

static void on_stop_signal(int sig) {
  (void)sig;
  stop_requests++;
}

void cmd_record_usage(FILE *out) {
  fputs(
      "usage: tracerelay record [--socket PATH] [-c CONFIG] [flags] -o OUT.pftrace\n"
      "       tracerelay record [--socket PATH] --clone ID | --clone-by-name NAME -o OUT.pftrace\n"
      "\n"
      "Starts a tracing session on a tracerelay service (or Perfetto's traced), waits until it\n"
      "ends (its duration, or Ctrl-C), and writes the trace to OUT. Ctrl-C or SIGTERM flushes\n"
      "every data source and stops the session cleanly; a second Ctrl-C gives up at once.\n"
      "\n"
      "  -c, --config FILE     TraceConfig to start from (- reads standard input). Text format\n"
      "                        for *.pbtxt, *.txt and *.textproto, binary for *.pb and *.bin;\n"
      "                        anything else is read as text unless it holds control bytes\n"
      "                        (binary protobuf does).\n"
      "      --txt             the config is text, whatever its name (as perfetto --txt)\n"
      "  -o, --out FILE        the trace file (Perfetto format), truncated first; - writes the\n"
      "                        trace to standard output (and nothing else goes there). Not needed\n"
      "                        when the config sets write_into_file with output_path (the\n"
      "                        service then writes that file itself). With write_into_file\n"
      "                        and no output_path, the service writes into FILE directly.\n"
      "  -t, --time DURATION   session length: 500ms, 10s, 2m, 1h (a bare number is seconds;\n"
      "                        0 = until Ctrl-C). Sets duration_ms.\n"
      "  -b, --buffer SIZE     size of every central buffer: 512kb, 64mb, 1gb (a bare number\n"
      "                        is KB). Without a buffer in the config, one of 32mb is added.\n"
      "      --ring            ring-buffer fill policy on every buffer (oldest data is lost)\n"
      "      --discard         discard fill policy on every buffer (newest data is lost; not\n"
      "                        with --ring)\n"
      "      --data-source NAME  record this data source (repeatable); added unless the\n"
      "                        config already has it\n"
      "      --machines A,B    only these machines: sets machine_name_filter on every data\n"
      "                        source (default: the config's filters, or all machines)\n"
      "      --flush-period MS periodic flush of every data source, in ms (or 5s, 1m...)\n"
      "      --socket PATH     the consumer socket. Default: $TRACERELAY_CONSUMER_SOCK, else\n"
      "                        $PERFETTO_CONSUMER_SOCK_NAME, else " DEFAULT_SOCKET "\n"
      "      --dry-run         print the TraceConfig that would be sent, as text, and exit\n"
      "      --progress        print the progress as a line on stderr every second, even on\n"
      "                        a terminal (off a terminal it is a line every 5 s anyway)\n"
      "      --strict          fail (exit 1) when a data source matches no producer on any\n"
      "                        host or a --machines name is not connected (at once, no trace),\n"
      "                        or, at the end (trace kept), a data source instance never\n"
      "                        started or did not confirm its stop in time on some host, an\n"
      "                        agent was killed or crashed during the session, an agent\n"
      "                        closed a producer's connection (stalled, not reading...), or\n"
      "                        a host's link was down at the end; without it record warns\n"
      "                        and goes on\n"
      "      --read-timeout DURATION  give up reading the trace back when the service sent\n"
      "                        nothing of it for this long (default 30s; 0 = wait as long as\n"
      "                        the connection is open). A root with thousands of hosts on a\n"
      "                        busy machine can take longer between replies\n"
      "      --clone ID        snapshot of the live session ID (as perfetto --clone): the service\n"
      "                        flushes every host, copies the session's buffers and record\n"
      "                        writes the copy to -o at once; the session goes on. Takes no\n"
      "                        config nor session flags. IDs: tracerelay status, perfetto\n"
      "                        --query\n"
      "      --clone-by-name NAME  likewise for the session whose config set\n"
      "                        unique_session_name NAME\n"
      "  -h, --help            this text\n"
      "\n"
      "Triggers (the config's trigger_config, raised on any host: docs/compat.md): with\n"
      "STOP_TRACING or START_TRACING record waits for the session as usual (no trigger within\n"
      "trigger_timeout_ms: no data, and record says so); with CLONE_SNAPSHOT it clones the live\n"
      "session at each trigger into OUT.0, OUT.1, ... (as the perfetto CLI does) until the\n"
      "session ends, and OUT itself is not written.\n"
      "\n"
      "On a terminal, a status line shows the elapsed time, the bytes in the central buffers\n"
      "and, from a tracerelay service, the bytes (and any losses) of each host; off a terminal\n"
      "(logs) the same is a line every 5 s. At the end one line on stderr says what was written:\n"
      "bytes, file, hosts and the chunks they lost. The exit\n"
      "status is 0 when the trace was written, 1 on any failure (including a session that\n"
      "the service ended with an error), 2 for bad usage.\n"
      "\n"
      "examples:\n"
      "  tracerelay record -c config.pbtxt -o cluster.pftrace\n"
      "  tracerelay record --data-source track_event -t 10s -b 64mb -o out.pftrace\n"
      "  tracerelay record -c config.pbtxt --machines web-3,web-4 --discard -o web.pftrace\n"
      "  tracerelay record --clone-by-name live -o snapshot.pftrace\n"
      "  ssh -L /tmp/relay.sock:/run/tracerelay/consumer.sock device &\n"
      "  tracerelay record --socket /tmp/relay.sock -c config.pbtxt -o device.pftrace\n",
      out);
}

enum long_only {
  OPT_RING = 256,
  OPT_DISCARD,
  OPT_DATA_SOURCE,
  OPT_MACHINES,
  OPT_FLUSH_PERIOD,
  OPT_SOCKET,
  OPT_DRY_RUN,
  OPT_PROGRESS,
  OPT_TXT,
  OPT_STRICT,
  OPT_READ_TIMEOUT,
  OPT_CLONE,
  OPT_CLONE_BY_NAME,
};

struct options {
  const char *config_path;
  const char *out_path;
  const char *socket_path;
  bool dry_run;
  bool progress;
  bool txt;
  bool strict;
  int64_t read_timeout_ms;
  bool clone_by_id;
  uint64_t clone_id;
  const char *clone_name;
  bool session_flags; /* a flag that shapes a new session (not for --clone) */
  record_overrides over;
  const char *data_sources[MAX_DATA_SOURCES];
};

static int usage_error(const char *fmt, const char *arg) {
  fputs("tracerelay record: ", stderr);
  fprintf(stderr, fmt, arg);
  fputs(" (see tracerelay record --help)\n", stderr);
  return 2;
}

static const char *default_socket(void) {
  const char *s = getenv("TRACERELAY_CONSUMER_SOCK");
  if (!s || !*s)
    s = getenv("PERFETTO_CONSUMER_SOCK_NAME");
  return s && *s ? s : DEFAULT_SOCKET;
}

/* Returns -1 when the options are good, else the exit status. */
static int parse_options(int argc, char **argv, struct options *o) {
  static const struct option longopts[] = {
      {"config", required_argument, NULL, 'c'},
      {"out", required_argument, NULL, 'o'},
      {"time", required_argument, NULL, 't'},
      {"buffer", required_argument, NULL, 'b'},
      {"ring", no_argument, NULL, OPT_RING},
      {"discard", no_argument, NULL, OPT_DISCARD},
      {"data-source", required_argument, NULL, OPT_DATA_SOURCE},
      {"machines", required_argument, NULL, OPT_MACHINES},
      {"flush-period", required_argument, NULL, OPT_FLUSH_PERIOD},
      {"socket", required_argument, NULL, OPT_SOCKET},
      {"dry-run", no_argument, NULL, OPT_DRY_RUN},
      {"progress", no_argument, NULL, OPT_PROGRESS},
      {"txt", no_argument, NULL, OPT_TXT},
      {"strict", no_argument, NULL, OPT_STRICT},
      {"read-timeout", required_argument, NULL, OPT_READ_TIMEOUT},
      {"clone", required_argument, NULL, OPT_CLONE},
      {"clone-by-name", required_argument, NULL, OPT_CLONE_BY_NAME},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  record_overrides *ov = &o->over;
  *ov = (record_overrides){.duration_ms = -1, .buffer_kb = -1, .flush_period_ms = -1,
                           .data_sources = o->data_sources};
  o->socket_path = default_socket();
  o->read_timeout_ms = RECORD_READ_IDLE_MS_DEFAULT;
  int opt;
  opterr = 0;
  optind = 1;
  while ((opt = getopt_long(argc, argv, ":c:o:t:b:h", longopts, NULL)) != -1) {
    o->session_flags |= opt == 'c' || opt == 't' || opt == 'b' || opt == OPT_RING ||
                        opt == OPT_DISCARD || opt == OPT_DATA_SOURCE || opt == OPT_MACHINES ||
                        opt == OPT_FLUSH_PERIOD || opt == OPT_DRY_RUN || opt == OPT_TXT ||
                        opt == OPT_STRICT;
    switch (opt) {
    case 'c': o->config_path = optarg; break;
    case 'o': o->out_path = optarg; break;
    case 't':
      if ((ov->duration_ms = record_parse_duration_ms(optarg, 1000)) < 0)
        return usage_error("bad duration '%s' for -t (examples: 500ms, 10s, 2m)", optarg);
      break;
    case 'b':
      if ((ov->buffer_kb = record_parse_size_kb(optarg)) < 4)
        return usage_error("bad buffer size '%s' for -b (examples: 512kb, 64mb; at least 4kb)",
                           optarg);
      break;
    case OPT_RING:
    case OPT_DISCARD:
      if (ov->fill_policy && ov->fill_policy != (opt == OPT_RING ? FILL_RING : FILL_DISCARD))
        return usage_error("%s: --ring and --discard contradict each other", "fill policy");
      ov->fill_policy = opt == OPT_RING ? FILL_RING : FILL_DISCARD;
      break;
    case OPT_DATA_SOURCE:
      if (ov->n_data_sources == MAX_DATA_SOURCES)
        return usage_error("more than %s --data-source flags", "64");
      o->data_sources[ov->n_data_sources++] = optarg;
      break;
    case OPT_MACHINES: ov->machines = optarg; break;
    case OPT_FLUSH_PERIOD:
      if ((ov->flush_period_ms = record_parse_duration_ms(optarg, 1)) < 0)
        return usage_error("bad period '%s' for --flush-period (milliseconds, or 5s, 1m)",
                           optarg);
      break;
    case OPT_SOCKET: o->socket_path = optarg; break;
    case OPT_DRY_RUN: o->dry_run = true; break;
    case OPT_PROGRESS: o->progress = true; break;
    case OPT_TXT: o->txt = true; break;
    case OPT_STRICT: o->strict = true; break;
    case OPT_READ_TIMEOUT:
      if ((o->read_timeout_ms = record_parse_duration_ms(optarg, 1000)) < 0)
        return usage_error("bad duration '%s' for --read-timeout (examples: 30s, 5m; 0: none)",
                           optarg);
      break;
    case OPT_CLONE: {
      char *end;
      errno = 0;
      o->clone_id = strtoull(optarg, &end, 10);
      if (errno || end == optarg || *end || optarg[0] == '-')
        return usage_error("bad session id '%s' for --clone", optarg);
      o->clone_by_id = true;
      break;
    }
    case OPT_CLONE_BY_NAME:
      if (!optarg[0])
        return usage_error("%s--clone-by-name needs a session name", "");
      o->clone_name = optarg;
      break;
    case 'h': cmd_record_usage(stdout); return 0;
    case ':': return usage_error("%s needs a value", argv[optind - 1]);
    default: return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (o->clone_by_id && o->clone_name)
    return usage_error("%s--clone and --clone-by-name: give one", "");
  if ((o->clone_by_id || o->clone_name) && o->session_flags)
    return usage_error("%s--clone reads a live session: no config nor session flags", "");
  if ((o->clone_by_id || o->clone_name) && !o->out_path)
    return usage_error("%s--clone needs -o FILE", "");
  return -1;
}

static void install_signal_handlers(void) {
  struct sigaction sa = {.sa_handler = on_stop_signal}; /* no SA_RESTART: waits wake up */
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN); /* a closed socket is an error to report, not a death */
}

static Perfetto__Protos__TraceConfig *build_config(const struct options *o) {
  Perfetto__Protos__TraceConfig *cfg;
  char err[512];
  if (o->config_path) {
    if (record_config_load(o->config_path, o->txt, &cfg, err, sizeof err) < 0) {
      fprintf(stderr, "tracerelay record: %s\n", err);
      return NULL;
    }
  } else if (!(cfg = record_config_new())) {
    fputs("tracerelay record: out of memory\n", stderr);
    return NULL;
  }
  if (record_config_apply(cfg, &o->over, err, sizeof err) < 0) {
    fprintf(stderr, "tracerelay record: %s\n", err);
    protobuf_c_message_free_unpacked(&cfg->base, NULL);
    return NULL;
  }
  return cfg;
}

/* Where the trace goes: returns 1 when record writes it (-o), 0 when the service writes the
 * config's output_path itself, -1 after a message when neither or both are given. */
/* Whether cfg's session is read through clones, one per CLONE_SNAPSHOT trigger. */
static bool snapshots(const Perfetto__Protos__TraceConfig *cfg) {
  const Perfetto__Protos__TraceConfig__TriggerConfig *tc = cfg->trigger_config;
  return tc && (tc->use_clone_snapshot_if_available ||
                tc->trigger_mode ==
                    PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER_MODE__CLONE_SNAPSHOT);
}

static int check_output(const struct options *o, const Perfetto__Protos__TraceConfig *cfg) {
  bool service_path = cfg->write_into_file && cfg->output_path && cfg->output_path[0];
  if (service_path && o->out_path) {
    fprintf(stderr, "tracerelay record: the config sets output_path (%s), where the service "
                    "writes the trace; drop -o or output_path\n", cfg->output_path);
    return -1;
  }
  if (!service_path && !o->out_path) {
    fputs("tracerelay record: no output: give -o FILE (see tracerelay record --help)\n", stderr);
    return -1;
  }
  if (snapshots(cfg) && strcmp(o->out_path, "-") == 0) {
    fputs("tracerelay record: a CLONE_SNAPSHOT session writes one file per trigger (FILE.0, "
          "FILE.1, ...): give -o FILE, not -o -\n", stderr);
    return -1;
  }
  return !service_path;
}


/* The output named by -o, opened by the session once the service has answered. */
struct output {
  const char *path;
  int fd;
};

static int open_output(void *ctx) {
  struct output *out = ctx;
  out->fd = strcmp(out->path, "-") == 0
                ? fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3)
                : open(out->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out->fd < 0)
    fprintf(stderr, "tracerelay record: cannot create %s: %s\n", out->path, strerror(errno));
  return out->fd;
}

/* After the session: an output file that received nothing is not a trace, so it is removed
 * and the run fails (a service killed mid-session, a session refused) rather than leaving a
 * 0-byte .pftrace behind, unless the session waited for a trigger that never came (traced's
 * and our service's answer then is an empty trace, the run's expected end: exit 0); a
 * partial one left by a failed session is kept, and said to be. Standard output (-o -) is
 * never removed. Returns the exit status. */
static int finish_output(int fd, const char *path, int status,
                         const Perfetto__Protos__TraceConfig *cfg) {
  struct stat st;
  bool is_file = strcmp(path, "-") != 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (close(fd) < 0 && status == 0) {
    fprintf(stderr, "tracerelay record: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  if (!is_file)
    return status;
  if (st.st_size > 0) {
    if (status != 0)
      fprintf(stderr, "tracerelay record: %s holds what was read before the failure (%lld "
                      "bytes): a partial trace\n", path, (long long)st.st_size);
    return status;
  }
  bool untriggered = status == 0 && cfg && cfg->trigger_config && cfg->trigger_config->n_triggers > 0;
  const char *why = untriggered ? "no trigger came within trigger_timeout_ms, so the session "
                                  "ended with no data (as traced ends it)"
                                : "no trace data was received";
  if (unlink(path) == 0)
    fprintf(stderr, "tracerelay record: %s; removed the empty %s\n", why, path);
  else
    fprintf(stderr, "tracerelay record: %s; %s is empty\n", why, path);
  return untriggered ? 0 : status ? status : 1;
}


/* CLONE_SNAPSHOT triggers (as the perfetto CLI follows them): at each, the live session is
 * cloned into OUT.N, as `record --clone ID -o OUT.N` would, on a connection of its own. */
struct snapshots {
  const struct options *o;
  unsigned taken, failed;
};

static int take_snapshot(void *ctx, uint64_t session_id, const char *trigger_name) {
  struct snapshots *sn = ctx;
  char path[PATH_MAX];
  Perfetto__Protos__TraceConfig none = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  snprintf(path, sizeof path, "%s.%u", sn->o->out_path, sn->taken + sn->failed);
  fprintf(stderr, "tracerelay record: trigger \"%s\": snapshot of session %llu into %s\n",
          trigger_name, (unsigned long long)session_id, path);
  struct output out = {.path = path, .fd = -1};
  record_session s = {.socket_path = sn->o->socket_path,
                      .config = &none,
                      .out_path = path,
                      .open_output = open_output,
                      .output_ctx = &out,
                      .stop_requests = &stop_requests,
                      .read_idle_ms = sn->o->read_timeout_ms,
                      .clone = true,
                      .clone_by_id = true,
                      .clone_id = session_id};
  int status = record_session_run(&s);
  if (out.fd >= 0)
    status = finish_output(out.fd, path, status, NULL);
  if (status == 0)
    sn->taken++;
  else
    sn->failed++; /* said why; the session goes on, as the CLI's does */
  return 0;
}

/* After a CLONE_SNAPSHOT session: its own trace is read only through the snapshots, so -o
 * itself stays empty and goes; what was taken is said. */
static int finish_snapshots(struct output *out, const struct snapshots *sn, int status) {
  if (out->fd >= 0) {
    close(out->fd);
    unlink(out->path);
  }
  if (sn->taken + sn->failed == 0)
    fprintf(stderr, "tracerelay record: no CLONE_SNAPSHOT trigger came within "
                    "trigger_timeout_ms: no snapshot was written\n");
  else
    fprintf(stderr, "tracerelay record: %u snapshot(s) written to %s.N%s\n", sn->taken,
            sn->o->out_path, sn->failed ? ", some failed (said above)" : "");
  return status ? status : sn->failed ? 1 : 0;
}

/* --clone, --clone-by-name: CloneSession of a live session into -o. */
static int record_clone(const struct options *o) {
  Perfetto__Protos__TraceConfig none = PERFETTO__PROTOS__TRACE_CONFIG__INIT;
  struct output out = {.path = o->out_path, .fd = -1};
  install_signal_handlers();
  record_session s = {
      .socket_path = o->socket_path,
      .config = &none,
      .out_path = strcmp(o->out_path, "-") == 0 ? "<stdout>" : o->out_path,
      .open_output = open_output,
      .output_ctx = &out,
      .stop_requests = &stop_requests,
      .progress_lines = o->progress,
      .read_idle_ms = o->read_timeout_ms,
      .clone = true,
      .clone_by_id = o->clone_by_id,
      .clone_id = o->clone_id,
      .clone_name = o->clone_name,
  };
  int status = record_session_run(&s);
  if (out.fd >= 0)
    status = finish_output(out.fd, o->out_path, status, NULL);
  return status;
}

int cmd_record(int argc, char **argv) {
  struct options o = {0};
  int status = parse_options(argc, argv, &o);
  if (status >= 0)
    return status;
  if (o.clone_by_id || o.clone_name)
    return record_clone(&o);
  Perfetto__Protos__TraceConfig *cfg = build_config(&o);
  if (!cfg)
    return 1;
  if (o.dry_run) {
    status = tr_pbtxt_print(stdout, &cfg->base) < 0;
    protobuf_c_message_free_unpacked(&cfg->base, NULL);
    return status;
  }
  int we_write = check_output(&o, cfg);
  if (we_write < 0) {
    protobuf_c_message_free_unpacked(&cfg->base, NULL);
    return 1;
  }
  install_signal_handlers();
  struct output out = {.path = o.out_path, .fd = -1};
  struct snapshots sn = {.o = &o};
  record_session s = {
      .on_clone_trigger = snapshots(cfg) ? take_snapshot : NULL,
      .clone_ctx = &sn,
      .socket_path = o.socket_path,
      .config = cfg,
      .out_path = !we_write ? NULL : strcmp(o.out_path, "-") == 0 ? "<stdout>" : o.out_path,
      .open_output = open_output,
      .output_ctx = &out,
      .pass_fd = we_write && cfg->write_into_file,
      .stop_requests = &stop_requests,
      .progress_lines = o.progress,
      .strict = o.strict,
      .read_idle_ms = o.read_timeout_ms,
  };
  status = record_session_run(&s);
  if (snapshots(cfg))
    status = finish_snapshots(&out, &sn, status);
  else if (out.fd >= 0)
    status = finish_output(out.fd, o.out_path, status, cfg);
  protobuf_c_message_free_unpacked(&cfg->base, NULL);
  return status;
}
