/* main.c: tracerelay-agent, the per-host daemon: its flags, --help, signals and the loop.
 * The work is in agent.c (producers <-> link) and link_client.c (the relay link). */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "relay/clock/clock.h"
#include "relay/daemon/config_file.h"
#include "relay/base/hostport.h"
#include "relay/daemon/daemon_util.h"
#include "relay/base/log.h"
#include "relay/link/tls.h"
#include "relay/base/tr_error.h"

#define PROG "tracerelay-agent"
#define SHUTDOWN_TIMEOUT_MS 5000u
#define STRINGIFY_VALUE(x) STRINGIFY(x)
#define STRINGIFY(x) #x
#define SMB_DEFAULT_TEXT STRINGIFY_VALUE(TR_AGENT_DEFAULT_SMB_KB)
#define MAX_PRODUCERS_DEFAULT_TEXT STRINGIFY_VALUE(TR_AGENT_DEFAULT_MAX_PRODUCERS)
#define MAX_PRODUCERS_TEXT STRINGIFY_VALUE(TR_AGENT_MAX_PRODUCERS)

static const char kHelp[] =
    "Usage: tracerelay-agent --service HOST:PORT --ca FILE --cert FILE --key FILE [options]\n"
    "\n"
    "The per-host agent of tracerelay. Perfetto producers on this host (apps built on the\n"
    "Perfetto SDK, traced_probes, tracerelay-loadgen) connect to its producer socket exactly as\n"
    "they would to traced. The agent copies their trace data out of shared memory and relays\n"
    "it over mutually-authenticated TLS to the central tracerelay-service, which drives the\n"
    "producers' data sources. While the service is unreachable the agent keeps taking data\n"
    "into a bounded spill queue and reconnects with backoff; nothing is lost silently: what\n"
    "does not fit is dropped oldest-first and counted in the trace's stats.\n"
    "\n"
    "The agent's machine name is the name in its certificate (--cert); it never claims one.\n"
    "The service names each agent after its certificate only (first subjectAltName DNS name,\n"
    "else the CN), whatever the agent says.\n"
    "\n"
    "  --service HOST:PORT    the service's relay address (port 7393 if omitted). Required.\n"
    "  --service-name NAME    the name the service's certificate must carry (default: HOST).\n"
    "  --ca FILE              PEM CA certificate the service's certificate must chain to.\n"
    "  --cert FILE            PEM certificate of this agent (its machine name). Required.\n"
    "  --key FILE             PEM private key of --cert. Required. All three are made by\n"
    "                         certs/make-certs.sh.\n"
    "  --machine-name NAME    the machine name this agent is meant to have: refuse to start\n"
    "                         (exit 1, saying why) if --cert is for another name. A check\n"
    "                         against installing the wrong certificate; it claims nothing.\n"
    "  --producer-socket PATH the producer socket to create (default $PERFETTO_PRODUCER_SOCK_NAME,\n"
    "                         else " TR_AGENT_DEFAULT_PRODUCER_SOCKET ").\n"
    "                         traced must not be running on the same path.\n"
    "  --queue-mb N           bound of the queue between producers and the link, in MiB\n"
    "                         (default 32); a chunk that does not fit is dropped and counted.\n"
    "  --spill-mb N           bound of the spill queue of batches not yet acknowledged by the\n"
    "                         service, in MiB (default 64): how much a link outage can absorb.\n"
    "  --smb-kb N             shared memory of each producer that does not ask for a size, in\n"
    "                         KiB (default " SMB_DEFAULT_TEXT "; a multiple of 32, at most 32768): what a\n"
    "                         producer can write while its chunks wait to be copied out. A\n"
    "                         producer's own size hint wins (up to 32 MiB).\n"
    "  --max-producers N      producers connected at once (default " MAX_PRODUCERS_DEFAULT_TEXT ", at most\n"
    "                         " MAX_PRODUCERS_TEXT "); one more is refused and logged, naming this flag.\n"
    "  --cipher LIST          the TLS ciphers to offer, comma-separated, preferred first\n"
    "                         (default: all, cheapest CPU per MB first: aes-128-ccm,\n"
    "                         chacha20-poly1305, aes-256-ccm, aes-128-gcm, aes-256-gcm); the\n"
    "                         service's --cipher order picks one they share, else both refuse\n"
    "                         the link saying so. docs/security.md#ciphers.\n"
    "  --compress             compress batches with zstd when the service agrees (default).\n"
    "  --no-compress          send batches uncompressed (incompressible data, or scarce CPU).\n"
    "  --relay-listen ADDR:PORT | vsock://CID:PORT\n"
    "                         also serve Perfetto's relay endpoint here, for the traced_relay\n"
    "                         of VM guests (PERFETTO_RELAY_SOCK_NAME=this address): each guest\n"
    "                         becomes a machine of its own, <this host>/<its name>, in the\n"
    "                         trace (default: off). Plaintext and unauthenticated, as\n"
    "                         traced's: listen only on a vsock or a host-only network that\n"
    "                         reaches nothing but the guests. docs/security.md#relay-endpoint.\n"
    "  --metrics-listen IPADDR:PORT\n"
    "                         serve Prometheus metrics at /metrics and Kubernetes probes at\n"
    "                         /healthz and /readyz (ready: the link is up) over plain HTTP on\n"
    "                         this address (default: off). Keep it on loopback or a private\n"
    "                         network: it is not authenticated. See docs/operations.md#metrics.\n"
    "  --fake-clock OFF_NS,DRIFT_PPM\n"
    "                         TEST FEATURE: read every clock (trace timestamps and clock-sync\n"
    "                         answers) from a simulated clock t + t*DRIFT_PPM/1e6 + OFF_NS of\n"
    "                         the real one, to test cross-host clock sync on one machine.\n"
    "  --log-level LEVEL      debug, info (default), warn, error or off.\n"
    "  --config FILE          read flags from FILE: `key = value` lines whose keys are the\n"
    "                         long flags above (`no-compress` alone for a flag without a\n"
    "                         value), `#` comments; the command line overrides the file.\n"
    "                         See docs/configuration.md.\n"
    "  --help                 print this text.\n"
    "  --version              print the version.\n"
    "\n"
    "Signals: SIGTERM or SIGINT disconnects the producers, sends what the agent holds to the\n"
    "service (waiting up to 5 s for it to be acknowledged) and exits; SIGHUP reloads --ca,\n"
    "--cert and --key for the next connection (the current one carries on).\n"
    "\n"
    "Example:\n"
    "  tracerelay-agent --service relay.example:7393 \\\n"
    "      --producer-socket /run/perfetto/traced-producer.sock \\\n"
    "      --ca /etc/tracerelay/ca.crt --cert /etc/tracerelay/agent-web-3.crt \\\n"
    "      --key /etc/tracerelay/agent-web-3.key\n"
    "\n"
    "Exit status: 0 after a clean shutdown, 1 on a runtime failure, 2 on bad flags.\n";

enum { OPT_SERVICE = 256, OPT_SERVICE_NAME, OPT_CA, OPT_CERT, OPT_KEY, OPT_PRODUCER_SOCKET,
       OPT_QUEUE_MB, OPT_SPILL_MB, OPT_COMPRESS, OPT_NO_COMPRESS, OPT_FAKE_CLOCK,
       OPT_MACHINE_NAME, OPT_SMB_KB, OPT_METRICS_LISTEN, OPT_MAX_PRODUCERS, OPT_CIPHER,
       OPT_RELAY_LISTEN };

static int bad(const char *flag, const char *value) {
  return tr_daemon_bad_value(PROG, flag, value, NULL);
}

/* A size in MiB, 1..65536. */
static int parse_mb(const char *s, size_t *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v == 0 || v > 65536)
    return -1;
  *out = (size_t)v << 20;
  return 0;
}

/* --config FILE: its flags go before the command line's (relay/daemon/config_file.h). */
static tr_config_file config;
static char **config_argv;

static void free_config(void) {
  tr_config_file_free(&config);
  free(config_argv);
}

static int parse_flags(int argc, char **argv, struct tr_agent_opts *o) {
  static const struct option longopts[] = {
      {"service", required_argument, NULL, OPT_SERVICE},
      {"service-name", required_argument, NULL, OPT_SERVICE_NAME},
      {"ca", required_argument, NULL, OPT_CA},
      {"cert", required_argument, NULL, OPT_CERT},
      {"key", required_argument, NULL, OPT_KEY},
      {"machine-name", required_argument, NULL, OPT_MACHINE_NAME},
      {"producer-socket", required_argument, NULL, OPT_PRODUCER_SOCKET},
      {"queue-mb", required_argument, NULL, OPT_QUEUE_MB},
      {"spill-mb", required_argument, NULL, OPT_SPILL_MB},
      {"smb-kb", required_argument, NULL, OPT_SMB_KB},
      {"max-producers", required_argument, NULL, OPT_MAX_PRODUCERS},
      {"metrics-listen", required_argument, NULL, OPT_METRICS_LISTEN},
      {"relay-listen", required_argument, NULL, OPT_RELAY_LISTEN},
      {"cipher", required_argument, NULL, OPT_CIPHER},
      {"compress", no_argument, NULL, OPT_COMPRESS},
      {"no-compress", no_argument, NULL, OPT_NO_COMPRESS},
      {"fake-clock", required_argument, NULL, OPT_FAKE_CLOCK},
      {"log-level", required_argument, NULL, TR_DAEMON_OPT_LOG_LEVEL},
      {"help", no_argument, NULL, TR_DAEMON_OPT_HELP},
      {"version", no_argument, NULL, TR_DAEMON_OPT_VERSION},
      {"config", required_argument, NULL, TR_DAEMON_OPT_CONFIG},
      {NULL, 0, NULL, 0}};
  if (tr_daemon_check_config(PROG, &config, argc, argv, longopts) != 0)
    return 2;
  const char *env = getenv("PERFETTO_PRODUCER_SOCK_NAME");
  o->producer_socket = env != NULL && env[0] != '\0' ? env : TR_AGENT_DEFAULT_PRODUCER_SOCKET;
  o->compress = true;
  int opt, rc;
  while ((opt = getopt_long(argc, argv, TR_DAEMON_OPTSTRING, longopts, NULL)) != -1) {
    switch (opt) {
    case OPT_SERVICE: {
      struct tr_hostport hp;
      if (tr_hostport_parse(optarg, false, &hp) < 0)
        return tr_daemon_bad_value(PROG, "--service", optarg,
                                   "give HOST:PORT (port 1-65535), e.g. relay.example:7393");
      o->service = optarg;
      break;
    }
    case OPT_SERVICE_NAME: o->service_name = optarg; break;
    case OPT_CA: o->ca_path = optarg; break;
    case OPT_CERT: o->cert_path = optarg; break;
    case OPT_KEY: o->key_path = optarg; break;
    case OPT_MACHINE_NAME:
      if (!tr_tls_valid_machine_name(optarg, strlen(optarg)))
        return bad("--machine-name", optarg);
      o->machine_name = optarg;
      break;
    case OPT_PRODUCER_SOCKET: o->producer_socket = optarg; break;
    case OPT_QUEUE_MB:
      if (parse_mb(optarg, &o->queue_bytes) < 0)
        return bad("--queue-mb", optarg);
      break;
    case OPT_SPILL_MB:
      if (parse_mb(optarg, &o->spill_bytes) < 0)
        return bad("--spill-mb", optarg);
      break;
    case OPT_METRICS_LISTEN: o->metrics_listen = optarg; break;
    case OPT_RELAY_LISTEN: {
      struct tr_hostport hp;
      if (strncmp(optarg, "vsock://", 8) != 0 &&
          (tr_hostport_parse(optarg, true, &hp) < 0 || strchr(optarg, ':') == NULL))
        return tr_daemon_bad_value(PROG, "--relay-listen", optarg,
                                   "give ADDR:PORT (an IP address) or vsock://CID:PORT");
      o->relay_listen = optarg;
      break;
    }
    case OPT_SMB_KB: {
      char *end;
      unsigned long kb = strtoul(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || kb == 0 || kb % 32 != 0 || kb > 32768)
        return tr_daemon_bad_value(PROG, "--smb-kb", optarg,
                                   "give KiB, a multiple of 32 up to 32768, e.g. 1024");
      o->smb_bytes = (uint32_t)kb << 10;
      break;
    }
    case OPT_MAX_PRODUCERS: {
      char *end;
      unsigned long n = strtoul(optarg, &end, 10);
      if (*optarg == '\0' || *end != '\0' || n == 0 || n > TR_AGENT_MAX_PRODUCERS)
        return tr_daemon_bad_value(PROG, "--max-producers", optarg,
                                   "give a count from 1 to " MAX_PRODUCERS_TEXT);
      o->max_producers = n;
      break;
    }
    case OPT_CIPHER:
      if ((rc = tr_daemon_cipher_flag(PROG, optarg)) != 0)
        return rc;
      o->ciphers = optarg;
      break;
    case OPT_COMPRESS: o->compress = true; break;
    case OPT_NO_COMPRESS: o->compress = false; break;
    case OPT_FAKE_CLOCK: {
      int64_t off;
      double ppm;
      if (tr_clock_parse_fake(optarg, &off, &ppm) < 0 || tr_clock_set_fake(off, ppm) < 0)
        return bad("--fake-clock", optarg);
      break;
    }
    default:
      if ((rc = tr_daemon_common_flag(PROG, opt, kHelp, argv)) != 0)
        return rc;
    }
  }
  const char *missing = o->service == NULL
                            ? "--service HOST:PORT"
                            : tr_daemon_missing_tls(o->ca_path, o->cert_path, o->key_path);
  return tr_daemon_flags_done(PROG, argc, argv, missing);
}

static void on_agent_done(void *data) {
  tr_daemon_signals_close(data);
  TR_INFO("agent", "stopped");
}

static void on_stop(tr_daemon_signals *sig) {
  tr_agent_shutdown(sig->data, SHUTDOWN_TIMEOUT_MS, on_agent_done, sig);
}

static void on_hup(tr_daemon_signals *sig) { tr_agent_reload_tls(sig->data); }

int main(int argc, char **argv) {
  struct tr_agent_opts opts = {0};
  if (tr_config_file_args(PROG, argc, argv, &config, &argc, &config_argv) < 0)
    return 2;
  atexit(free_config); /* opts point into config_argv until the end */
  if (config_argv)
    argv = config_argv;
  int rc = parse_flags(argc, argv, &opts);
  if (rc != 0)
    return rc;
  signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error code, not a death */

  uv_loop_t loop;
  uv_loop_init(&loop);
  tr_agent *agent;
  if (tr_agent_start(&loop, &opts, &agent) < 0)
    return tr_daemon_start_failed(&loop);
  char again[64];
  snprintf(again, sizeof again, "already shutting down (at most %u ms)", SHUTDOWN_TIMEOUT_MS);
  tr_daemon_signals sig = {.data = agent,
                           .comp = "agent",
                           .stop_note = "shutting down",
                           .again_note = again,
                           .on_stop = on_stop,
                           .on_hup = on_hup};
  return tr_daemon_run(&loop, &sig);
}
