/* main.c: tracerelay-service, the central daemon: its flags, --help, signals and the loop.
 * The work is in service_daemon.c (assembly), session*.c, trace_output.c, consumer_port.c and the
 * link server. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/daemon/config_file.h"
#include "relay/base/byte_size.h"
#include "relay/base/hostport.h"
#include "relay/daemon/daemon_util.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/tls.h"
#include "relay/link/tls_uv.h"
#include "service/service_daemon.h"

#define PROG "tracerelay-service"
#define STRINGIFY_VALUE(x) STRINGIFY(x)
#define STRINGIFY(x) #x
#define MAX_HANDSHAKES STRINGIFY_VALUE(TR_TLS_UV_MAX_HANDSHAKES)
#define MAX_WAITING STRINGIFY_VALUE(TR_TLS_UV_MAX_WAITING)

static const char kHelp[] =
    "Usage: tracerelay-service --ca FILE --cert FILE --key FILE [options]\n"
    "\n"
    "The central service of tracerelay. Agents on every host connect to it over mutually-\n"
    "authenticated TLS and relay their producers' trace data into per-host central buffers.\n"
    "It speaks Perfetto's consumer protocol on a UNIX socket, so the real `perfetto` CLI\n"
    "(PERFETTO_CONSUMER_SOCK_NAME=PATH perfetto -c config -o out) and `tracerelay record` can\n"
    "start, stop and read sessions that span every host; the result is ONE Perfetto trace in\n"
    "which each remote host's packets carry machine_id = FNV-1a(machine name) (of NAME#K when\n"
    "that is another host's, docs/timeline.md) and each host has its own SystemInfo. Per-host\n"
    "losses are in the trace's TraceStats.\n"
    "\n"
    "  --listen ADDR:PORT     relay link address for agents (default " TR_SERVICE_DEFAULT_LISTEN
    ").\n"
    "                         [V6ADDR]:PORT for IPv6; port 0 picks a free one.\n"
    "  --consumer-socket PATH consumer socket (default " TR_SERVICE_DEFAULT_CONSUMER_SOCKET
    ");\n"
    "                         its directory is created if missing.\n"
    "  --consumer-mode MODE   octal permissions of the consumer socket (default 0660): who may\n"
    "                         start and read traces. Each consumer's uid/pid is logged.\n"
    "  --consumer-allow-uid UID\n"
    "  --consumer-allow-gid GID\n"
    "                         repeatable. With either given, a consumer is also checked by its\n"
    "                         peer credentials (SO_PEERCRED), in addition to the socket mode:\n"
    "                         uid 0, the service's own uid, these uids and members (primary or\n"
    "                         supplementary) of these groups are served, anyone else is closed\n"
    "                         at once and logged. Without them the socket mode alone decides.\n"
    "  --ca FILE              PEM CA certificate agents' certificates must chain to. Required.\n"
    "  --cert FILE            PEM certificate of this service. Required.\n"
    "  --key FILE             PEM private key of --cert. Required. certs/make-certs.sh makes\n"
    "                         all three.\n"
    "  --crl FILE             X.509 CRL (PEM or DER) of the CA: an agent or regional whose\n"
    "                         certificate it lists is refused at the handshake, saying so.\n"
    "                         certs/make-certs.sh --revoke NAME writes it. Refused at start\n"
    "                         (and on SIGHUP) if another CA issued it or it is past its next\n"
    "                         update, since then every agent would be refused.\n"
    "  --deny NAME            repeatable: refuse the machine NAME whatever its certificate\n"
    "                         (also a host a regional relays, and a regional itself).\n"
    "                         docs/operations.md#revoking-a-host.\n"
    "  --cipher LIST          the TLS ciphers agents (and a regional's upstream) may use,\n"
    "                         comma-separated, in the order this service prefers them\n"
    "                         (default: all, cheapest CPU per MB first: aes-128-ccm,\n"
    "                         chacha20-poly1305, aes-256-ccm, aes-128-gcm, aes-256-gcm). An\n"
    "                         agent that offers none of them is refused, saying so.\n"
    "                         docs/security.md#ciphers.\n"
    "  --handshake-timeout-ms MS\n"
    "                         an agent connection must finish its TLS handshake within MS of\n"
    "                         its start (at once, or when one of the 32 handshakes running\n"
    "                         ends; one that waits 30 s for that is refused as busy), then send\n"
    "                         Hello within MS; else it is closed and logged with its address\n"
    "                         (default 10000).\n"
    "  --max-handshakes-per-source N\n"
    "                         TLS handshakes one source address may run at once, before any\n"
    "                         of its agents is authenticated (default "
    STRINGIFY_VALUE(TR_TLS_UV_MAX_HANDSHAKES_PER_SOURCE) "; at most " MAX_HANDSHAKES ", every\n"
    "                         handshake slot); its further connections wait while other\n"
    "                         addresses' go first, so that one address cannot take every\n"
    "                         slot. Raise it when many agents share one address (behind one\n"
    "                         NAT or SNAT address, or a load test on loopback): they are let\n"
    "                         in N at a time. Read at start only.\n"
    "  --max-waiting-per-source N\n"
    "                         connections one source address may have waiting for a handshake\n"
    "                         besides those (default "
    STRINGIFY_VALUE(TR_TLS_UV_MAX_WAITING_PER_SOURCE) "; at most " MAX_WAITING
    ", all that may wait);\n"
    "                         one more is refused at once, counted (refused_source) and logged\n"
    "                         once per address, and its agent comes back 5-20 s later. Raise\n"
    "                         it to the number of agents behind one NAT address so that they\n"
    "                         are not refused when they all connect at once (1,000 on one\n"
    "                         address: 23 s to connect at the defaults, 10 s with both raised\n"
    "                         to their most). Read at start only.\n"
    "  --max-agents N         agents connected at once (default 4096); one more is refused\n"
    "                         with a message naming this limit. The open-file limit must\n"
    "                         allow N + 256 descriptors: the service raises its soft limit up\n"
    "                         to the hard one, else refuses to start saying so.\n"
    "  --max-buffer-memory SIZE\n"
    "                         central buffer memory of all sessions together (default: half\n"
    "                         of this machine's memory): each session's buffers count once for\n"
    "                         every host in it. EnableTracing is refused, naming the product\n"
    "                         (buffers x hosts), when a session's buffers on every connected\n"
    "                         host would pass it with what running sessions reserve; a host\n"
    "                         that joins a running session past it gets no buffers there, its\n"
    "                         chunks refused, counted and logged; a clone counts the buffers\n"
    "                         it copies until freed, and is refused past it. SIZE: bytes, or\n"
    "                         with K, M, G or T (binary: 12G = 12 GiB). Read at start only.\n"
    "  --metrics-listen IPADDR:PORT\n"
    "                         serve Prometheus metrics at /metrics and Kubernetes probes at\n"
    "                         /healthz and /readyz over plain HTTP on this address (default:\n"
    "                         off). Keep it on loopback or a private network: it is not\n"
    "                         authenticated. Metrics: docs/operations.md#metrics.\n"
    "  --timeline ENCODING    machines (default): machine_id on every remote packet, one\n"
    "                         SystemInfo per machine, remote_clock_sync exchanges.\n"
    "                         global-clocks: no machine_id; each host's clocks get global ids\n"
    "                         of their own and the service writes ClockSnapshots tying them to\n"
    "                         the trace clock (any Perfetto version). See docs/timeline.md.\n"
    "  --relay-allow REGIONAL=PATTERN[,PATTERN...]\n"
    "                         repeatable. Tiers: the regional service whose certificate\n"
    "                         carries the name REGIONAL may relay the agents of hosts whose\n"
    "                         machine names match a PATTERN (fnmatch glob, e.g. eu-*). Any\n"
    "                         other relayed host is refused and logged (default: none may\n"
    "                         relay). See docs/security.md#tiers.\n"
    "\n"
    "Regional service (tiers, docs/operations.md#tiers-regional-services):\n"
    "  --upstream HOST:PORT   forward every agent's link to this upstream service instead of\n"
    "                         serving sessions here: consumers trace at the upstream, which\n"
    "                         must allow this regional (--relay-allow). Agents below keep\n"
    "                         their data and resume across a restart of the regional. Its\n"
    "                         --consumer-socket (default\n"
    "                         " TR_SERVICE_DEFAULT_REGIONAL_CONSUMER_SOCKET ")\n"
    "                         answers `tracerelay status` only: the agents it forwards.\n"
    "  --upstream-name NAME   the name the upstream's certificate must carry (default: HOST).\n"
    "  --upstream-cert FILE   PEM certificate of this regional for the upstream: an agent\n"
    "                         certificate (make-certs.sh --agent NAME); NAME is the\n"
    "                         regional's machine name there. Required with --upstream.\n"
    "  --upstream-key FILE    PEM private key of --upstream-cert. Required with --upstream.\n"
    "  --upstream-ca FILE     PEM CA the upstream's certificate must chain to (default --ca).\n"
    "  --producer-socket PATH the regional also relays its own machine's producers, as an\n"
    "                         agent would, from this socket (default\n"
    "                         " TR_SERVICE_DEFAULT_REGIONAL_PRODUCER_SOCKET ").\n"
    "                         --metrics-listen serves that agent's metrics and probes.\n"
    "  --fake-clock OFF_NS,DRIFT_PPM\n"
    "                         test feature, with --upstream only: this regional reads a\n"
    "                         simulated clock, as the agent's flag of that name.\n"
    "\n"
    "  --log-level LEVEL      debug, info (default), warn, error or off.\n"
    "  --config FILE          read flags from FILE: `key = value` lines whose keys are the\n"
    "                         long flags above, `#` comments; the command line overrides the\n"
    "                         file. See docs/configuration.md.\n"
    "  --help                 print this text.\n"
    "  --version              print the version.\n"
    "\n"
    "Sessions: each consumer connection may run one session. TraceConfig buffers are per host\n"
    "(a chatty host never overwrites a quiet one); data sources match producers on every host,\n"
    "narrowed by producer_name_filter, producer_name_regex_filter and machine_name_filter.\n"
    "Flush waits for every host up to flush_timeout_ms (default 5000); hosts that did not\n"
    "answer are logged and counted in the trace's stats.\n"
    "\n"
    "Signals: SIGTERM or SIGINT flushes running sessions, ends them with an error telling\n"
    "their consumers the service is shutting down (write_into_file sessions are written\n"
    "out), waits up to 5 s for the consumers to read what was flushed, closes the agents'\n"
    "links and exits.\n"
    "SIGHUP reloads --ca, --cert, --key, --crl and --deny (re-reading --config FILE for them and\n"
    "--log-level) for agent connections accepted from then on; connected agents and running\n"
    "sessions carry on, but for agents (and regionals, and relayed hosts) now revoked or\n"
    "denied: their links are closed (Goodbye NOT_AUTHORIZED, logged). A file that does not\n"
    "load is logged and the current one kept.\n"
    "Certificates: the service's own, the CA's and its agents' are logged 30 days and again 7\n"
    "days before they expire (at start, on SIGHUP and daily); /metrics and `tracerelay status`\n"
    "show when they do.\n"
    "\n"
    "Example:\n"
    "  tracerelay-service --listen 0.0.0.0:7393 \\\n"
    "      --consumer-socket /run/tracerelay/consumer.sock \\\n"
    "      --ca /etc/tracerelay/ca.crt --cert /etc/tracerelay/service.crt \\\n"
    "      --key /etc/tracerelay/service.key\n"
    "  PERFETTO_CONSUMER_SOCK_NAME=/run/tracerelay/consumer.sock perfetto -c cfg.pbtxt --txt \\\n"
    "      -o cluster.pftrace\n"
    "\n"
    "Exit status: 0 after a clean shutdown, 1 on a runtime failure, 2 on bad flags.\n";

enum { OPT_LISTEN = 256, OPT_CONSUMER_SOCKET, OPT_CONSUMER_MODE, OPT_CA, OPT_CERT, OPT_KEY,
       OPT_TIMELINE, OPT_ALLOW_UID, OPT_ALLOW_GID,
       OPT_HANDSHAKE_TIMEOUT, OPT_METRICS_LISTEN, OPT_MAX_AGENTS, OPT_RELAY_ALLOW, OPT_UPSTREAM,
       OPT_UPSTREAM_NAME, OPT_UPSTREAM_CA, OPT_UPSTREAM_CERT, OPT_UPSTREAM_KEY,
       OPT_PRODUCER_SOCKET, OPT_FAKE_CLOCK, OPT_CIPHER, OPT_CRL, OPT_DENY,
       OPT_MAX_BUFFER_MEMORY, OPT_MAX_HANDSHAKES_PER_SOURCE, OPT_MAX_WAITING_PER_SOURCE };

/* A decimal id or count in [0, max]; -1 if s is not one. */
static long long parse_num(const char *s, unsigned long long max) {
  char *end;
  if (*s < '0' || *s > '9')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  return *end != '\0' || v > max ? -1 : (long long)v;
}

static int bad(const char *flag, const char *value, const char *why) {
  return tr_daemon_bad_value(PROG, flag, value, why);
}

/* --max-handshakes-per-source or --max-waiting-per-source (opt) = value: 1 up to the server's
 * bound for every address together, past which a per-source limit would change nothing (and
 * nothing is accepted and ignored). 0, or the exit status 2. */
static int per_source_flag(int opt, const char *value, struct tr_service_daemon_opts *o) {
  bool handshakes = opt == OPT_MAX_HANDSHAKES_PER_SOURCE;
  long long v = parse_num(value, handshakes ? TR_TLS_UV_MAX_HANDSHAKES : TR_TLS_UV_MAX_WAITING);
  if (v < 1)
    return handshakes ? bad("--max-handshakes-per-source", value,
                            "give a number of handshakes from 1 to " MAX_HANDSHAKES
                            " (the service runs " MAX_HANDSHAKES " at once in all)")
                      : bad("--max-waiting-per-source", value,
                            "give a number of connections from 1 to " MAX_WAITING
                            " (at most " MAX_WAITING " wait in all)");
  if (handshakes)
    o->max_handshakes_per_source = (unsigned)v;
  else
    o->max_waiting_per_source = (unsigned)v;
  return 0;
}

/* --config FILE: its flags go before the command line's (relay/daemon/config_file.h). SIGHUP
 * re-reads it; every argv built stays allocated until exit, since opts point into them. */
static tr_config_file config;
static char **config_argvs[64];
static size_t num_config_argvs;
static int cmdline_argc;
static char **cmdline_argv;

static void free_config(void) {
  tr_config_file_free(&config);
  while (num_config_argvs > 0)
    free(config_argvs[--num_config_argvs]);
}

static int parse_flags(int argc, char **argv, struct tr_service_daemon_opts *o);

/* Loads --config (if any) and parses the flags into *o; on SIGHUP again, with the same
 * command line. Messages go to stderr. 0, or the exit status 2. */
static int load_flags(struct tr_service_daemon_opts *o) {
  tr_config_file old = config;
  int argc;
  char **argv;
  if (num_config_argvs == sizeof config_argvs / sizeof config_argvs[0]) {
    fprintf(stderr, PROG ": config file reloaded too many times: restart\n");
    return 2;
  }
  if (tr_config_file_args(PROG, cmdline_argc, cmdline_argv, &config, &argc,
                          &argv) < 0) {
    config = old;
    return 2;
  }
  tr_config_file_free(&old);
  if (argv)
    config_argvs[num_config_argvs++] = argv;
  optind = 0; /* getopt starts over (GNU) */
  return parse_flags(argc, argv ? argv : cmdline_argv, o);
}

static int parse_flags(int argc, char **argv, struct tr_service_daemon_opts *o) {
  static const struct option longopts[] = {
      {"listen", required_argument, NULL, OPT_LISTEN},
      {"consumer-socket", required_argument, NULL, OPT_CONSUMER_SOCKET},
      {"consumer-mode", required_argument, NULL, OPT_CONSUMER_MODE},
      {"ca", required_argument, NULL, OPT_CA},
      {"cipher", required_argument, NULL, OPT_CIPHER},
      {"cert", required_argument, NULL, OPT_CERT},
      {"key", required_argument, NULL, OPT_KEY},
      {"crl", required_argument, NULL, OPT_CRL},
      {"deny", required_argument, NULL, OPT_DENY},
      {"timeline", required_argument, NULL, OPT_TIMELINE},
      {"log-level", required_argument, NULL, TR_DAEMON_OPT_LOG_LEVEL},
      {"help", no_argument, NULL, TR_DAEMON_OPT_HELP},
      {"version", no_argument, NULL, TR_DAEMON_OPT_VERSION},
      {"consumer-allow-uid", required_argument, NULL, OPT_ALLOW_UID},
      {"consumer-allow-gid", required_argument, NULL, OPT_ALLOW_GID},
      {"handshake-timeout-ms", required_argument, NULL, OPT_HANDSHAKE_TIMEOUT},
      {"metrics-listen", required_argument, NULL, OPT_METRICS_LISTEN},
      {"max-agents", required_argument, NULL, OPT_MAX_AGENTS},
      {"max-handshakes-per-source", required_argument, NULL, OPT_MAX_HANDSHAKES_PER_SOURCE},
      {"max-waiting-per-source", required_argument, NULL, OPT_MAX_WAITING_PER_SOURCE},
      {"max-buffer-memory", required_argument, NULL, OPT_MAX_BUFFER_MEMORY},
      {"relay-allow", required_argument, NULL, OPT_RELAY_ALLOW},
      {"upstream", required_argument, NULL, OPT_UPSTREAM},
      {"upstream-name", required_argument, NULL, OPT_UPSTREAM_NAME},
      {"upstream-ca", required_argument, NULL, OPT_UPSTREAM_CA},
      {"upstream-cert", required_argument, NULL, OPT_UPSTREAM_CERT},
      {"upstream-key", required_argument, NULL, OPT_UPSTREAM_KEY},
      {"producer-socket", required_argument, NULL, OPT_PRODUCER_SOCKET},
      {"fake-clock", required_argument, NULL, OPT_FAKE_CLOCK},
      {"config", required_argument, NULL, TR_DAEMON_OPT_CONFIG},
      {NULL, 0, NULL, 0}};
  int opt, rc;
  if (tr_daemon_check_config(PROG, &config, argc, argv, longopts) != 0)
    return 2;
  o->listen = TR_SERVICE_DEFAULT_LISTEN;
  o->consumer_socket = TR_SERVICE_DEFAULT_CONSUMER_SOCKET;
  o->consumer_mode = 0660;
  o->timeline = TR_TIMELINE_MACHINES;
  memset(&o->consumer_access, 0, sizeof o->consumer_access);
  o->handshake_timeout_ms = 0;
  o->max_handshakes_per_source = o->max_waiting_per_source = 0;
  o->metrics_listen = NULL;
  o->max_agents = 0;
  o->max_buffer_memory = 0;
  memset(&o->relay_allow, 0, sizeof o->relay_allow);
  o->upstream = o->upstream_name = NULL;
  o->upstream_ca_path = o->upstream_cert_path = o->upstream_key_path = NULL;
  o->producer_socket = TR_SERVICE_DEFAULT_REGIONAL_PRODUCER_SOCKET;
  o->crl_path = NULL;
  o->num_deny = 0;
  bool producer_socket_set = false, consumer_socket_set = false, fake_clock = false;
  while ((opt = getopt_long(argc, argv, TR_DAEMON_OPTSTRING, longopts, NULL)) != -1) {
    switch (opt) {
    case OPT_LISTEN: {
      struct tr_hostport hp;
      if (tr_hostport_parse(optarg, true, &hp) < 0)
        return tr_daemon_bad_value(PROG, "--listen", optarg,
                                   "give ADDR:PORT (port 0-65535), e.g. 0.0.0.0:7393 or [::]:7393");
      o->listen = optarg;
      break;
    }
    case OPT_CONSUMER_SOCKET:
      o->consumer_socket = optarg;
      consumer_socket_set = true;
      break;
    case OPT_CONSUMER_MODE: {
      char *end;
      unsigned long m = strtoul(optarg, &end, 8);
      if (*optarg == '\0' || *end != '\0' || m > 0777)
        return bad("--consumer-mode", optarg, "give octal permissions such as 0660");
      o->consumer_mode = (mode_t)m;
      break;
    }
    case OPT_ALLOW_UID: {
      long long v = parse_num(optarg, 0xfffffffeull);
      if (v < 0)
        return bad("--consumer-allow-uid", optarg, "give a numeric uid");
      if (o->consumer_access.num_uids == TR_CONSUMER_MAX_ALLOW)
        return bad("--consumer-allow-uid", optarg, "too many (32 at most); use a group");
      o->consumer_access.uids[o->consumer_access.num_uids++] = (uid_t)v;
      break;
    }
    case OPT_ALLOW_GID: {
      long long v = parse_num(optarg, 0xfffffffeull);
      if (v < 0)
        return bad("--consumer-allow-gid", optarg, "give a numeric gid");
      if (o->consumer_access.num_gids == TR_CONSUMER_MAX_ALLOW)
        return bad("--consumer-allow-gid", optarg, "too many (32 at most)");
      o->consumer_access.gids[o->consumer_access.num_gids++] = (gid_t)v;
      break;
    }
    case OPT_METRICS_LISTEN: o->metrics_listen = optarg; break;
    case OPT_MAX_AGENTS: {
      long long v = parse_num(optarg, 1000000);
      if (v < 1)
        return bad("--max-agents", optarg, "give a number of agents from 1 to 1000000");
      o->max_agents = (unsigned)v;
      break;
    }
    case OPT_MAX_BUFFER_MEMORY:
      if (tr_byte_size_parse(optarg, &o->max_buffer_memory) != 0)
        return bad("--max-buffer-memory", optarg, "give a size such as 12G, 512M or 1073741824");
      break;
    case OPT_HANDSHAKE_TIMEOUT: {
      long long v = parse_num(optarg, 600000);
      if (v < 100)
        return bad("--handshake-timeout-ms", optarg, "give milliseconds from 100 to 600000");
      o->handshake_timeout_ms = (unsigned)v;
      break;
    }
    case OPT_MAX_HANDSHAKES_PER_SOURCE:
    case OPT_MAX_WAITING_PER_SOURCE:
      if ((rc = per_source_flag(opt, optarg, o)) != 0)
        return rc;
      break;
    case OPT_RELAY_ALLOW: {
      const char *why;
      if (tr_relay_allow_add(&o->relay_allow, optarg, &why) < 0)
        return bad("--relay-allow", optarg, why);
      break;
    }
    case OPT_UPSTREAM: {
      struct tr_hostport hp;
      if (tr_hostport_parse(optarg, false, &hp) < 0)
        return bad("--upstream", optarg, "give HOST:PORT of the upstream service");
      o->upstream = optarg;
      break;
    }
    case OPT_UPSTREAM_NAME: o->upstream_name = optarg; break;
    case OPT_UPSTREAM_CA: o->upstream_ca_path = optarg; break;
    case OPT_UPSTREAM_CERT: o->upstream_cert_path = optarg; break;
    case OPT_UPSTREAM_KEY: o->upstream_key_path = optarg; break;
    case OPT_PRODUCER_SOCKET:
      o->producer_socket = optarg;
      producer_socket_set = true;
      break;
    case OPT_FAKE_CLOCK: {
      int64_t off;
      double ppm;
      if (tr_clock_parse_fake(optarg, &off, &ppm) < 0 || tr_clock_set_fake(off, ppm) < 0)
        return bad("--fake-clock", optarg, "give OFFSET_NS,DRIFT_PPM");
      fake_clock = true;
      break;
    }
    case OPT_CIPHER:
      if ((rc = tr_daemon_cipher_flag(PROG, optarg)) != 0)
        return rc;
      o->ciphers = optarg;
      break;
    case OPT_CA: o->ca_path = optarg; break;
    case OPT_CERT: o->cert_path = optarg; break;
    case OPT_KEY: o->key_path = optarg; break;
    case OPT_CRL: o->crl_path = optarg; break;
    case OPT_DENY:
      if (!tr_tls_valid_machine_name(optarg, strlen(optarg)))
        return bad("--deny", optarg, "give a machine name: 1-64 characters of [A-Za-z0-9._-]");
      if (o->num_deny == TR_SERVICE_MAX_DENY)
        return bad("--deny", optarg, "too many (1024 at most): revoke with --crl instead");
      o->deny[o->num_deny++] = optarg;
      break;
    case OPT_TIMELINE:
      if (strcmp(optarg, "machines") == 0) {
        o->timeline = TR_TIMELINE_MACHINES;
      } else if (strcmp(optarg, "global-clocks") == 0) {
        o->timeline = TR_TIMELINE_GLOBAL_CLOCKS;
      } else {
        return bad("--timeline", optarg, "use machines or global-clocks");
      }
      break;
    default:
      if ((rc = tr_daemon_common_flag(PROG, opt, kHelp, argv)) != 0)
        return rc;
    }
  }
  if (o->upstream == NULL && (o->upstream_name || o->upstream_ca_path || o->upstream_cert_path ||
                              o->upstream_key_path || producer_socket_set || fake_clock)) {
    fprintf(stderr, PROG ": --upstream-name, --upstream-ca, --upstream-cert, --upstream-key, "
            "--producer-socket and --fake-clock are for a regional service: give --upstream "
            "HOST:PORT too\n");
    return 2;
  }
  if (o->upstream != NULL && !consumer_socket_set)
    o->consumer_socket = TR_SERVICE_DEFAULT_REGIONAL_CONSUMER_SOCKET;
  if (o->upstream != NULL && (o->upstream_cert_path == NULL || o->upstream_key_path == NULL)) {
    fprintf(stderr, PROG ": --upstream needs --upstream-cert and --upstream-key: the regional's "
            "own certificate for the upstream (certs/make-certs.sh --agent NAME)\n");
    return 2;
  }
  return tr_daemon_flags_done(PROG, argc, argv,
                              tr_daemon_missing_tls(o->ca_path, o->cert_path, o->key_path));
}

static void on_done(void *ud) {
  tr_daemon_signals_close(ud);
  TR_INFO("service", "stopped");
}

static void on_stop(tr_daemon_signals *sig) { tr_service_daemon_shutdown(sig->data, on_done, sig); }

static void on_hup(tr_daemon_signals *sig) {
  struct tr_service_daemon_opts o = {0};
  TR_INFO("service", "SIGHUP: reloading the certificates");
  if (load_flags(&o) != 0) {
    TR_ERROR("service", "SIGHUP: the flags or config file are invalid (see above): nothing "
             "reloaded");
    return;
  }
  tr_service_daemon_reload_tls(sig->data, &o);
}

int main(int argc, char **argv) {
  struct tr_service_daemon_opts opts = {0};
  tr_service_daemon *svc;
  uv_loop_t loop;
  cmdline_argc = argc;
  cmdline_argv = argv;
  atexit(free_config);
  int rc = load_flags(&opts);
  if (rc != 0)
    return rc;
  signal(SIGPIPE, SIG_IGN); /* a consumer or agent that went away is an error code */

  uv_loop_init(&loop);
  if (tr_service_daemon_start(&loop, &opts, &svc) < 0)
    return tr_daemon_start_failed(&loop);
  tr_daemon_signals sig = {.data = svc,
                           .comp = "service",
                           .stop_note = "flushing and stopping sessions, then exiting",
                           .again_note = "already shutting down (flushes time out within 5 s)",
                           .on_stop = on_stop,
                           .on_hup = on_hup};
  rc = tr_daemon_run(&loop, &sig);
  tr_service_daemon_free(svc);
  return rc;
}
