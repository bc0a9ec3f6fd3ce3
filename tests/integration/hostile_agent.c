/* hostile_agent.c: a deliberately malicious agent for test_hostile_agent.sh, the link-side
 * twin of hostile_producer.c. It holds a valid agent certificate, so it passes mutual TLS and
 * says a proper Hello; then, after Welcome, it misbehaves in one way per --mode, each a way to
 * make the root hold memory for it (docs/security.md, "Agents"):
 *   replies   --count CommandReplies of the largest frame the service takes, each for a
 *             request id the service never sent, ordered after a batch that will never come
 *             (after_seq 2^63): the root must refuse them unheld and count them
 *             (tracerelay_host_replies_unexpected_total), keeping the link.
 *   ends      --count ProducerUpdate PRODUCER_DISCONNECTED of the largest frame, after_seq
 *             2^63: the root may hold producer ends, but only so many bytes of them, then it
 *             must close the link with a Goodbye naming the limit.
 *   sources   one ProducerUpdate with 100,000 distinct data sources (2.4 MiB; the root took
 *             each with a search over those before it): refused with a Goodbye naming the limit of 256 at once.
 *   names     one ProducerUpdate whose producer name fills the largest frame: refused with a
 *             Goodbye naming the byte limit.
 * Frames go one at a time, the next once the link's write queue is empty, so that the attack
 * is limited by the root's reading and not by our own queue.
 * Exit: 0 when the outcome the mode expects came (replies: every frame sent and the link still
 * up, then an orderly Goodbye; the others: the root's Goodbye with --expect's text in it), 1
 * otherwise, including a timeout (--timeout-ms). Prints one line with what happened.
 * Usage: hostile_agent --service HOST:PORT --server-name NAME --ca CA --cert CERT --key KEY
 *        --mode MODE [--count N] [--expect TEXT] [--timeout-ms MS] */
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_link.h"
#include "relay/link/tls.h"

enum mode { MODE_REPLIES, MODE_ENDS, MODE_SOURCES, MODE_NAMES };

static struct {
  enum mode mode;
  unsigned count, sent;
  const char *expect;
  size_t max_frame; /* the service's, from Welcome */
  bool welcomed, finished, goodbye_sent;
  char goodbye[1024]; /* the root's Goodbye text, if one came */
  int goodbye_reason;
  uv_timer_t pace, deadline;
  tr_relay_link *link;
} g = {.goodbye_reason = -1};

static const uint64_t kNeverSeq = 1ull << 63;

/* Room for payload in one frame of the service's size, with the message around it. */
static size_t payload_room(void) { return g.max_frame - 4096; }

static char *filler(size_t n) {
  char *s = malloc(n + 1);
  if (s != NULL) {
    memset(s, 'x', n);
    s[n] = '\0';
  }
  return s;
}

static int send_reply(unsigned i) {
  char *text = filler(payload_room());
  Tracerelay__CommandReply r = TRACERELAY__COMMAND_REPLY__INIT;
  r.has_request_id = r.has_after_seq = 1;
  r.request_id = 0x4000000000000000ull + i; /* never one the service sent */
  r.after_seq = kNeverSeq;
  r.error = text;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY;
  f.command_reply = &r;
  int rc = text != NULL ? tr_relay_link_send(g.link, &f) : TR_ERR_NOMEM;
  free(text);
  return rc;
}

static int send_update(unsigned i) {
  Tracerelay__ProducerUpdate u = TRACERELAY__PRODUCER_UPDATE__INIT;
  u.has_producer_id = u.has_state = 1;
  u.producer_id = 1 + i;
  char *name = NULL;
  Perfetto__Protos__DataSourceDescriptor *ds = NULL, **dsp = NULL;
  int rc = TR_ERR_NOMEM;
  if (g.mode == MODE_SOURCES) {
    /* Each descriptor {name: "hostile.source.NNNNNNN"}, distinct (the same one again would
     * only replace itself), is 25 bytes with its tag and length prefix: long enough for the
     * root's decoder, whose allocations may be 16 times the frame (relay_frame.h). */
    size_t n = 100000;
    ds = calloc(n, sizeof *ds);
    dsp = calloc(n, sizeof *dsp);
    name = calloc(n, 24);
    if (ds == NULL || dsp == NULL || name == NULL)
      goto out;
    for (size_t k = 0; k < n; k++) {
      perfetto__protos__data_source_descriptor__init(&ds[k]);
      snprintf(name + 24 * k, 24, "hostile.source.%07zu", k);
      ds[k].name = name + 24 * k;
      dsp[k] = &ds[k];
    }
    u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
    u.n_data_sources = n;
    u.data_sources = dsp;
  } else {
    if ((name = filler(payload_room())) == NULL)
      goto out;
    u.name = name;
    if (g.mode == MODE_ENDS) {
      u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED;
      u.has_after_seq = 1;
      u.after_seq = kNeverSeq;
    } else {
      u.state = TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED;
    }
  }
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE;
  f.producer_update = &u;
  rc = tr_relay_link_send(g.link, &f);
out:
  free(name);
  free(ds);
  free(dsp);
  return rc;
}

static void finish(void) {
  if (g.finished)
    return;
  g.finished = true;
  uv_timer_stop(&g.pace);
  uv_timer_stop(&g.deadline);
  uv_close((uv_handle_t *)&g.pace, NULL);
  uv_close((uv_handle_t *)&g.deadline, NULL);
}

/* The next frame once the queue is empty; after the last, the replies mode ends in order. */
static void on_pace(uv_timer_t *t) {
  (void)t;
  if (!g.welcomed || g.link == NULL || tr_relay_link_closing(g.link) || !tr_relay_link_idle(g.link))
    return;
  if (g.sent == g.count) {
    if (g.mode == MODE_REPLIES && !g.goodbye_sent) {
      g.goodbye_sent = true;
      tr_relay_link_close(g.link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "done");
    }
    return;
  }
  int rc = g.mode == MODE_REPLIES ? send_reply(g.sent) : send_update(g.sent);
  if (rc < 0) {
    fprintf(stderr, "hostile_agent: send %u failed: %s\n", g.sent, tr_strerror(rc));
    return;
  }
  g.sent++;
}

static void on_deadline(uv_timer_t *t) {
  (void)t;
  fprintf(stderr, "hostile_agent: timed out after %u of %u frames\n", g.sent, g.count);
  if (g.link != NULL && !tr_relay_link_closing(g.link))
    tr_relay_link_hang_up(g.link);
  finish();
}

static void on_open(tr_relay_link *l) {
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_agent_instance_id = h.has_max_frame_bytes = 1;
  h.agent_instance_id = ((uint64_t)time(NULL) << 20) ^ (uint64_t)uv_os_getpid();
  h.max_frame_bytes = TR_RELAY_MAX_FRAME_DEFAULT;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  f.hello = &h;
  tr_relay_link_send(l, &f);
}

static void on_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_WELCOME && !g.welcomed) {
    g.welcomed = true;
    g.max_frame = f->welcome->has_max_frame_bytes ? f->welcome->max_frame_bytes
                                                  : TR_RELAY_MAX_FRAME_DEFAULT;
    tr_relay_link_established(l, g.max_frame);
  } else if (f->msg_case == TRACERELAY__RELAY_FRAME__MSG_GOODBYE) {
    g.goodbye_reason = (int)f->goodbye->reason;
    snprintf(g.goodbye, sizeof g.goodbye, "%s", f->goodbye->text ? f->goodbye->text : "");
    tr_relay_link_hang_up(l);
  }
  tr_relay_frame_free(f);
}

static void on_closed(tr_relay_link *l, int reason, const char *why) {
  (void)l;
  (void)reason;
  g.link = NULL;
  if (g.goodbye_reason < 0 && why != NULL)
    fprintf(stderr, "hostile_agent: link closed: %s\n", why);
  finish();
}

static const char *arg(int argc, char **argv, const char *name, const char *dflt) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0)
      return argv[i + 1];
  return dflt;
}

int main(int argc, char **argv) {
  const char *service = arg(argc, argv, "--service", NULL);
  const char *mode = arg(argc, argv, "--mode", "");
  static const char *kModes[] = {"replies", "ends", "sources", "names"};
  int m = -1;
  for (int i = 0; i < 4; i++)
    if (strcmp(mode, kModes[i]) == 0)
      m = i;
  const char *colon = service ? strrchr(service, ':') : NULL;
  if (m < 0 || colon == NULL) {
    fprintf(stderr, "usage: hostile_agent --service HOST:PORT --server-name NAME --ca CA --cert "
                    "CERT --key KEY --mode replies|ends|sources|names [--count N] "
                    "[--expect TEXT] [--timeout-ms MS]\n");
    return 2;
  }
  tr_log_set_level(TR_LOG_ERROR);
  signal(SIGPIPE, SIG_IGN); /* the root may close first: a write then fails, and is told */
  g.mode = (enum mode)m;
  g.count = (unsigned)atoi(arg(argc, argv, "--count", "1"));
  g.expect = arg(argc, argv, "--expect", NULL);
  char err[512];
  struct tr_tls_config_opts t = {.role = TR_TLS_CLIENT,
                                 .ca_path = arg(argc, argv, "--ca", NULL),
                                 .cert_path = arg(argc, argv, "--cert", NULL),
                                 .key_path = arg(argc, argv, "--key", NULL)};
  tr_tls_config *cfg;
  if (tr_tls_config_new(&t, &cfg, err, sizeof err) < 0) {
    fprintf(stderr, "hostile_agent: %s\n", err);
    return 1;
  }
  char host[256];
  snprintf(host, sizeof host, "%.*s", (int)(colon - service), service);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0) {
    fprintf(stderr, "hostile_agent: cannot resolve %s\n", service);
    return 1;
  }
  uv_loop_t *loop = uv_default_loop();
  static const struct tr_relay_link_events ev = {
      .on_open = on_open, .on_frame = on_frame, .on_closed = on_closed};
  struct tr_relay_link_opts opts = {.peer_role = "service"};
  uv_timer_init(loop, &g.pace);
  uv_timer_init(loop, &g.deadline);
  uv_timer_start(&g.pace, on_pace, 1, 1);
  uv_timer_start(&g.deadline, on_deadline,
                 (uint64_t)atoi(arg(argc, argv, "--timeout-ms", "60000")), 0);
  int rc = tr_relay_link_connect(loop, cfg, arg(argc, argv, "--server-name", host), res->ai_addr,
                                 &opts, &ev, NULL, &g.link);
  freeaddrinfo(res);
  if (rc < 0) {
    fprintf(stderr, "hostile_agent: cannot connect: %s\n", tr_strerror(rc));
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  tr_tls_config_unref(cfg);
  bool ok;
  if (g.mode == MODE_REPLIES)
    ok = g.sent == g.count && g.goodbye_sent && g.goodbye_reason < 0;
  else
    ok = g.goodbye_reason >= 0 && (g.expect == NULL || strstr(g.goodbye, g.expect) != NULL);
  printf("hostile agent %s: %s after %u of %u frames of up to %zu bytes; the root's goodbye: "
         "%s%s%s\n",
         kModes[m], ok ? "as expected" : "NOT as expected", g.sent, g.count, g.max_frame,
         g.goodbye_reason >= 0 ? "\"" : "", g.goodbye_reason >= 0 ? g.goodbye : "none",
         g.goodbye_reason >= 0 ? "\"" : "");
  /* 3: the root closed the link, but its Goodbye was lost in the reset of a link still
   * sending (the caller then looks for the reason in the root's log). */
  return ok ? 0 : g.mode != MODE_REPLIES && g.goodbye_reason < 0 ? 3 : 1;
}
