/* bench_link_floor.c: the least a central service can spend on N directly connected hosts that
 * it flushes P times a second, on this machine (issue 25 item 1).
 *
 * One process (the "service") accepts N TCP connections on loopback and, on one thread, every
 * period writes each connection one small record (the flush command) and reads each answer (the
 * batch); every record is sealed and opened with AES-128-GCM as a TLS 1.2 record is (13-byte
 * additional data, 8-byte explicit nonce, 16-byte tag), unless --plain. Nothing else: no
 * protobuf, no trace buffers, no clock probes, no libuv, no TLS session layer. The hosts' side
 * is a second process with one thread for all N. Printed: the service process's CPU over the
 * measured seconds (% of one core, and microseconds per host and round) and the answers it
 * got against the rounds it sent, so a starved run shows. bench_tiers --compare-direct gives a
 * real root's figure in the same terms, to be read beside this one from the same machine.
 *
 * Usage: bench_link_floor [--hosts N] [--period-ms P] [--seconds S] [--command-bytes C]
 *                         [--answer-bytes A] [--plain] */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <mbedtls/gcm.h>

#define HDR 5          /* type, version, length */
#define NONCE 8        /* explicit part of the GCM nonce */
#define TAG 16
#define MAX_PLAIN 4096 /* a record's plaintext at most (the options are checked against it) */
#define MAX_RECORD (HDR + NONCE + MAX_PLAIN + TAG)

struct opts {
  int hosts, period_ms, seconds, command_bytes, answer_bytes;
  bool plain;
};

/* One side of one connection: its socket, its record sequence numbers, bytes of a record
 * not yet whole. */
struct conn {
  int fd;
  uint64_t seq_out, seq_in;
  size_t held;
  unsigned char in[2 * MAX_RECORD];
};

static mbedtls_gcm_context gcm; /* one key for every connection and both directions */
static const unsigned char kSalt[4] = {1, 2, 3, 4};

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void nonce_of(uint64_t seq, unsigned char iv[12]) {
  memcpy(iv, kSalt, 4);
  memcpy(iv + 4, &seq, 8);
}

static void aad_of(uint64_t seq, size_t len, unsigned char aad[13]) {
  memcpy(aad, &seq, 8);
  aad[8] = 23, aad[9] = 3, aad[10] = 3, aad[11] = (unsigned char)(len >> 8),
  aad[12] = (unsigned char)len;
}

/* Seals len bytes of plaintext into one record at out; returns the record's length. */
static size_t seal(struct conn *c, const unsigned char *plain, size_t len, bool sealed,
                   unsigned char *out) {
  size_t body = sealed ? NONCE + len + TAG : len;
  out[0] = 23, out[1] = 3, out[2] = 3, out[3] = (unsigned char)(body >> 8),
  out[4] = (unsigned char)body;
  if (!sealed) {
    memcpy(out + HDR, plain, len);
    return HDR + len;
  }
  unsigned char iv[12], aad[13];
  uint64_t seq = c->seq_out++;
  nonce_of(seq, iv);
  aad_of(seq, len, aad);
  memcpy(out + HDR, &seq, NONCE);
  if (mbedtls_gcm_crypt_and_tag(&gcm, MBEDTLS_GCM_ENCRYPT, len, iv, 12, aad, 13, plain,
                                out + HDR + NONCE, TAG, out + HDR + NONCE + len) != 0)
    die("seal");
  return HDR + body;
}

/* Reads what the socket has (one read), and opens every whole record; returns how many. */
static int read_records(struct conn *c, bool sealed) {
  ssize_t n = read(c->fd, c->in + c->held, sizeof c->in - c->held);
  if (n == 0)
    return -1;
  if (n < 0)
    return errno == EAGAIN ? 0 : -1;
  c->held += (size_t)n;
  int records = 0;
  size_t at = 0;
  while (c->held - at >= HDR) {
    size_t body = (size_t)c->in[at + 3] << 8 | c->in[at + 4];
    if (c->held - at < HDR + body)
      break;
    if (sealed) {
      unsigned char iv[12], aad[13], plain[MAX_PLAIN];
      size_t len = body - NONCE - TAG;
      uint64_t seq = c->seq_in++;
      nonce_of(seq, iv);
      aad_of(seq, len, aad);
      if (mbedtls_gcm_auth_decrypt(&gcm, len, iv, 12, aad, 13, c->in + at + HDR + NONCE + len,
                                   TAG, c->in + at + HDR + NONCE, plain) != 0) {
        fprintf(stderr, "bench_link_floor: a record did not open\n");
        exit(1);
      }
    }
    at += HDR + body;
    records++;
  }
  memmove(c->in, c->in + at, c->held - at);
  c->held -= at;
  return records;
}

static void write_all(int fd, const unsigned char *p, size_t len) {
  while (len > 0) { /* small records into an idle socket: the kernel takes them whole */
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      die("write");
    if (n > 0)
      p += n, len -= (size_t)n;
  }
}

static void nodelay_nonblock(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    die("TCP_NODELAY");
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0)
    die("O_NONBLOCK");
}

static int epoll_with(struct conn *conns, int n) {
  int ep = epoll_create1(0);
  if (ep < 0)
    die("epoll_create1");
  for (int i = 0; i < n; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &ev) != 0)
      die("epoll_ctl");
  }
  return ep;
}

/* The hosts: connect, then answer every command with one record of answer_bytes. */
static void hosts_main(const struct opts *o, int port) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct conn *conns = calloc((size_t)o->hosts, sizeof *conns);
  if (!conns)
    die("calloc");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int i = 0; i < o->hosts; i++) {
    conns[i].fd = socket(AF_INET, SOCK_STREAM, 0);
    if (conns[i].fd < 0 || connect(conns[i].fd, (struct sockaddr *)&a, sizeof a) != 0)
      die("connect");
    nodelay_nonblock(conns[i].fd);
  }
  int ep = epoll_with(conns, o->hosts);
  unsigned char answer[MAX_PLAIN], rec[MAX_RECORD];
  memset(answer, 'a', sizeof answer);
  for (int open = o->hosts; open > 0;) {
    struct epoll_event evs[256];
    int k = epoll_wait(ep, evs, 256, -1);
    for (int e = 0; e < k; e++) {
      struct conn *c = &conns[evs[e].data.u64];
      int got = read_records(c, !o->plain);
      if (got < 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        open--;
        continue;
      }
      for (int r = 0; r < got; r++)
        write_all(c->fd, rec, seal(c, answer, (size_t)o->answer_bytes, !o->plain, rec));
    }
  }
  exit(0);
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static int opt_int(const char *v, int lo, int hi, const char *name) {
  char *end;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || x < lo || x > hi) {
    fprintf(stderr, "bench_link_floor: %s must be %d..%d\n", name, lo, hi);
    exit(2);
  }
  return (int)x;
}

static void parse(int argc, char **argv, struct opts *o) {
  *o = (struct opts){.hosts = 1000, .period_ms = 250, .seconds = 10, .command_bytes = 64,
                     .answer_bytes = 512};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--plain") == 0) {
      o->plain = true;
      continue;
    }
    if (v == NULL || strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "usage: bench_link_floor [--hosts N] [--period-ms P] [--seconds S] "
                      "[--command-bytes C] [--answer-bytes A] [--plain]\n");
      exit(2);
    }
    i++;
    if (strcmp(a, "--hosts") == 0)
      o->hosts = opt_int(v, 1, 100000, a);
    else if (strcmp(a, "--period-ms") == 0)
      o->period_ms = opt_int(v, 1, 60000, a);
    else if (strcmp(a, "--seconds") == 0)
      o->seconds = opt_int(v, 1, 3600, a);
    else if (strcmp(a, "--command-bytes") == 0)
      o->command_bytes = opt_int(v, 1, MAX_PLAIN, a);
    else if (strcmp(a, "--answer-bytes") == 0)
      o->answer_bytes = opt_int(v, 1, MAX_PLAIN, a);
    else {
      fprintf(stderr, "bench_link_floor: unknown option %s\n", a);
      exit(2);
    }
  }
}

int main(int argc, char **argv) {
  struct opts o;
  parse(argc, argv, &o);
  struct rlimit fds = {(rlim_t)o.hosts * 2 + 64, (rlim_t)o.hosts * 2 + 64};
  if (setrlimit(RLIMIT_NOFILE, &fds) != 0)
    die("RLIMIT_NOFILE");
  static const unsigned char key[16] = "tracerelay-floor";
  mbedtls_gcm_init(&gcm);
  if (mbedtls_gcm_setkey(&gcm, MBEDTLS_CIPHER_ID_AES, key, 128) != 0)
    die("gcm key");

  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 4096) != 0 ||
      getsockname(ls, (struct sockaddr *)&a, &alen) != 0)
    die("listen");
  pid_t hosts = fork();
  if (hosts < 0)
    die("fork");
  if (hosts == 0)
    hosts_main(&o, ntohs(a.sin_port));

  struct conn *conns = calloc((size_t)o.hosts, sizeof *conns);
  if (!conns)
    die("calloc");
  for (int i = 0; i < o.hosts; i++) {
    if ((conns[i].fd = accept(ls, NULL, NULL)) < 0)
      die("accept");
    nodelay_nonblock(conns[i].fd);
  }
  int ep = epoll_with(conns, o.hosts);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
  struct itimerspec every = {.it_interval = {o.period_ms / 1000, (o.period_ms % 1000) * 1000000L},
                             .it_value = {0, 1}};
  struct epoll_event tev = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
  if (tfd < 0 || timerfd_settime(tfd, 0, &every, NULL) != 0 ||
      epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev) != 0)
    die("timerfd");

  unsigned char command[MAX_PLAIN], rec[MAX_RECORD];
  memset(command, 'c', sizeof command);
  const int warm_rounds = 1000 / o.period_ms + 1; /* about a second before measuring */
  const int rounds = warm_rounds + o.seconds * 1000 / o.period_ms;
  long answers = 0, answers_measured = 0;
  double cpu0 = 0, t0 = 0;
  for (int round = 0; round <= rounds;) {
    struct epoll_event evs[256];
    int k = epoll_wait(ep, evs, 256, -1);
    for (int e = 0; e < k; e++) {
      if (evs[e].data.u64 == UINT64_MAX) {
        uint64_t ticks;
        if (read(tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
          die("timerfd read");
        if (round == warm_rounds) {
          cpu0 = cpu_s(), t0 = now_s();
          answers_measured = answers;
        }
        if (round++ == rounds)
          break;
        for (int i = 0; i < o.hosts; i++)
          write_all(conns[i].fd, rec,
                    seal(&conns[i], command, (size_t)o.command_bytes, !o.plain, rec));
        continue;
      }
      int got = read_records(&conns[evs[e].data.u64], !o.plain);
      if (got < 0) {
        fprintf(stderr, "bench_link_floor: a host's connection ended\n");
        return 1;
      }
      answers += got;
    }
  }
  double cpu = cpu_s() - cpu0, wall = now_s() - t0;
  long measured_rounds = rounds - warm_rounds;
  answers_measured = answers - answers_measured;
  printf("bench_link_floor: %d hosts, a round every %d ms, %s records of %d bytes out and %d "
         "back, %.1f s measured\n",
         o.hosts, o.period_ms, o.plain ? "plain" : "AES-128-GCM", o.command_bytes,
         o.answer_bytes, wall);
  printf("service CPU %.2f %% of a core, %.1f us per host and round; answers %ld of %ld "
         "(%.1f %%)\n",
         100 * cpu / wall, 1e6 * cpu / ((double)o.hosts * (double)measured_rounds),
         answers_measured, (long)o.hosts * measured_rounds,
         100.0 * (double)answers_measured / ((double)o.hosts * (double)measured_rounds));
  for (int i = 0; i < o.hosts; i++)
    close(conns[i].fd);
  int status;
  waitpid(hosts, &status, 0);
  mbedtls_gcm_free(&gcm);
  return 0;
}
