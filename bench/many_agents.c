/* many_agents.c: N real agents in one process, for bench/bench_agents --many-links (issue 14):
 * its flags, the loop threads (agent_group.h) and the signals that drive them.
 *
 * Each agent is the real one (agent/agent.h) with its own certificate, TLS connection and
 * producer socket; the agents share their loop thread(s), libuv's worker pool (batch building)
 * and the process. SIGUSR1 connects an emulated producer (emu_producer.h) to every agent,
 * SIGUSR2 disconnects them, SIGTERM or SIGINT shuts everything down. Progress lines go to
 * stdout ("many_agents: N agents started, F failed", "many_agents: all N producers
 * registered"), a summary at exit. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench/agent_group.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define MAX_AGENTS 100000u
#define MAX_LOOPS 64u
#define FDS_PER_AGENT 6u /* TLS socket, producer socket and its connection, the producer's end,
                          * the shared memory while it is handed over, and a spare */
#define FDS_SPARE 256u
#define PREFIX_MAX 8u /* with up to 5 digits, a name fits agent_group's 16 bytes */

static const char kUsage[] =
    "Usage: many_agents --service HOST:PORT --pki DIR --sockets DIR --agents N [options]\n"
    "N real tracerelay agents in one process (bench/bench_agents --many-links).\n"
    "  --service HOST:PORT     the tracerelay-service to connect to\n"
    "  --service-name NAME     the name on the service's certificate (default: HOST)\n"
    "  --pki DIR               ca.crt and agent-aNNNN.crt/.key (certs/make-certs.sh --agent)\n"
    "  --sockets DIR           where agent aNNNN listens for producers: DIR/aNNNN.sock\n"
    "  --agents N              agents a0000 .. a<N-1>\n"
    "  --prefix P              name the agents P0000 .. P<N-1> instead (1-8 characters of\n"
    "                          [A-Za-z0-9._-]; e.g. one prefix per regional of a tier)\n"
    "  --loops T               loop threads the agents are spread over (default 1)\n"
    "  --rate R                events per second of each emulated producer (default 10; 0: no\n"
    "                          data, only the control calls and flush acks)\n"
    "  --log-level LEVEL       debug, info, warn (default), error, off\n"
    "Signals: SIGUSR1 connects a producer to every agent, SIGUSR2 disconnects them, SIGTERM or\n"
    "SIGINT shuts the agents down (each sends what it holds, up to 2 s) and exits.\n";

struct options {
  struct agent_group_config group;
  unsigned agents, loops;
};

static int parse_unsigned(const char *flag, const char *s, unsigned max, unsigned *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v == 0 || v > max) {
    fprintf(stderr, "many_agents: %s %s: expected 1 .. %u\n", flag, s, max);
    return -1;
  }
  *out = (unsigned)v;
  return 0;
}

/* A name prefix that keeps every agent's name a machine name (certs/make-certs.sh --agent). */
static int check_prefix(const char *s) {
  size_t n = strlen(s);
  if (n == 0 || n > PREFIX_MAX || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                           "0123456789._-") != n)
    return -1;
  return 0;
}

static int parse_options(int argc, char **argv, struct options *o) {
  enum { SERVICE = 256, SERVICE_NAME, PKI, SOCKETS, AGENTS, PREFIX, LOOPS, RATE, LOG_LEVEL, HELP };
  static const struct option longopts[] = {
      {"service", required_argument, NULL, SERVICE}, {"service-name", required_argument, NULL, SERVICE_NAME},
      {"pki", required_argument, NULL, PKI},         {"sockets", required_argument, NULL, SOCKETS},
      {"agents", required_argument, NULL, AGENTS},   {"prefix", required_argument, NULL, PREFIX},
      {"loops", required_argument, NULL, LOOPS},
      {"rate", required_argument, NULL, RATE},       {"log-level", required_argument, NULL, LOG_LEVEL},
      {"help", no_argument, NULL, HELP},             {NULL, 0, NULL, 0}};
  *o = (struct options){.loops = 1, .group.rate = 10, .group.prefix = "a"};
  enum tr_log_level level = TR_LOG_WARN;
  int opt, rc = 0;
  char *end;
  while (rc == 0 && (opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (opt) {
    case SERVICE: o->group.service = optarg; break;
    case SERVICE_NAME: o->group.service_name = optarg; break;
    case PKI: o->group.pki_dir = optarg; break;
    case SOCKETS: o->group.socket_dir = optarg; break;
    case AGENTS: rc = parse_unsigned("--agents", optarg, MAX_AGENTS, &o->agents); break;
    case PREFIX:
      o->group.prefix = optarg;
      if ((rc = check_prefix(optarg)) < 0)
        fprintf(stderr, "many_agents: --prefix %s: expected 1 .. %u characters of "
                "[A-Za-z0-9._-]\n", optarg, PREFIX_MAX);
      break;
    case LOOPS: rc = parse_unsigned("--loops", optarg, MAX_LOOPS, &o->loops); break;
    case RATE:
      o->group.rate = strtod(optarg, &end);
      if (*optarg == '\0' || *end != '\0' || !(o->group.rate >= 0 && o->group.rate <= 1000)) {
        fprintf(stderr, "many_agents: --rate %s: expected 0 .. 1000 events per second\n", optarg);
        rc = -1;
      }
      break;
    case LOG_LEVEL:
      if ((rc = tr_log_parse_level(optarg, &level)) < 0)
        fprintf(stderr, "many_agents: --log-level %s: expected debug, info, warn, error or off\n",
                optarg);
      break;
    case HELP: fputs(kUsage, stdout); exit(0);
    default: rc = -1; break;
    }
  }
  if (rc == 0 && (optind != argc || !o->group.service || !o->group.pki_dir ||
                  !o->group.socket_dir || !o->agents)) {
    fputs("many_agents: --service, --pki, --sockets and --agents are required\n", stderr);
    rc = -1;
  }
  if (rc < 0) {
    fputs(kUsage, stderr);
    return rc;
  }
  if (o->loops > o->agents)
    o->loops = o->agents;
  tr_log_set_level(level);
  return 0;
}

/* Every agent holds a few descriptors; the default soft limit of 1024 ends near 200 agents. */
static int raise_fd_limit(unsigned agents) {
  struct rlimit rl;
  rlim_t need = (rlim_t)agents * FDS_PER_AGENT + FDS_SPARE;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return -1;
  if (rl.rlim_cur >= need)
    return 0;
  if (rl.rlim_max < need) {
    fprintf(stderr, "many_agents: %u agents need %llu file descriptors, and the hard limit is "
            "%llu: raise it (ulimit -Hn) or run fewer agents\n", agents,
            (unsigned long long)need, (unsigned long long)rl.rlim_max);
    return -1;
  }
  rl.rlim_cur = need;
  return setrlimit(RLIMIT_NOFILE, &rl);
}

struct run {
  struct agent_group **groups;
  unsigned n_groups;
  uv_signal_t term, intr, usr1, usr2;
  bool stopping;
};

static void command_all(struct run *r, enum agent_group_cmd cmd) {
  for (unsigned i = 0; i < r->n_groups; i++)
    agent_group_command(r->groups[i], cmd);
}

static void on_signal(uv_signal_t *s, int signum) {
  struct run *r = s->data;
  if (r->stopping)
    return;
  if (signum == SIGUSR1 || signum == SIGUSR2) {
    command_all(r, signum == SIGUSR1 ? AGENT_GROUP_PRODUCERS_ON : AGENT_GROUP_PRODUCERS_OFF);
    return;
  }
  r->stopping = true;
  command_all(r, AGENT_GROUP_STOP);
  uv_close((uv_handle_t *)&r->term, NULL);
  uv_close((uv_handle_t *)&r->intr, NULL);
  uv_close((uv_handle_t *)&r->usr1, NULL);
  uv_close((uv_handle_t *)&r->usr2, NULL);
}

static void watch_signals(uv_loop_t *loop, struct run *r) {
  uv_signal_t *handles[] = {&r->term, &r->intr, &r->usr1, &r->usr2};
  int signums[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < 4; i++) {
    uv_signal_init(loop, handles[i]);
    handles[i]->data = r;
    uv_signal_start(handles[i], on_signal, signums[i]);
  }
}

int main(int argc, char **argv) {
  struct options o;
  if (parse_options(argc, argv, &o) < 0)
    return 2;
  if (raise_fd_limit(o.agents) < 0)
    return 2;
  signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error code, not a death */
  static struct many_counts counts;
  counts.agents_total = o.agents;
  o.group.counts = &counts;
  struct run r = {.groups = calloc(o.loops, sizeof *r.groups)};
  if (r.groups == NULL)
    return 1;
  uv_loop_t loop;
  uv_loop_init(&loop);
  watch_signals(&loop, &r); /* before the groups start: no signal is missed */
  for (unsigned i = 0; i < o.loops; i++) {
    struct agent_group_config gc = o.group;
    gc.first = (unsigned)((unsigned long long)o.agents * i / o.loops);
    gc.count = (unsigned)((unsigned long long)o.agents * (i + 1) / o.loops) - gc.first;
    int rc = agent_group_start(&gc, &r.groups[r.n_groups]);
    if (rc < 0) {
      TR_ERROR("many_agents", "cannot start loop thread %u: %s", i, tr_strerror(rc));
      on_signal(&r.term, SIGTERM);
      break;
    }
    r.n_groups++;
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  for (unsigned i = 0; i < r.n_groups; i++)
    agent_group_join(r.groups[i]);
  uv_loop_close(&loop);
  free(r.groups);
  printf("many_agents: %u agents, %u failed to start; producers: %llu starts, %llu stops, "
         "%llu flushes, %llu events written, %llu dropped (SMB full), %u connections lost\n",
         counts.agents_started, counts.agents_failed, (unsigned long long)counts.starts,
         (unsigned long long)counts.stops, (unsigned long long)counts.flushes,
         (unsigned long long)counts.events_written, (unsigned long long)counts.events_dropped,
         counts.producers_lost);
  return counts.agents_failed || r.n_groups < o.loops ? 1 : 0;
}
