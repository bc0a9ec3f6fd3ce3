/* status.c: `tracerelay status`: one line per host of a tracerelay service, from
 * ConsumerPort.QueryServiceState. Perfetto's TracingServiceState gives the service and its
 * sessions; the per-host lines come from our extension in the same replies
 * (tracerelay.TracingServiceStateExtension, field 1000, see service/status.h), which the real
 * `perfetto --query` skips. Against traced (no extension) it prints the producers only. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perfetto/common/tracing_service_state.pb-c.h"
#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_client.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/byte_size.h"
#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "tools/tracerelay/commands.h"
#include "tracerelay/tracerelay_status.pb-c.h"

#define DEFAULT_SOCKET "/run/tracerelay/consumer.sock"
#define TIMEOUT_MS 5000
#define MAX_STATE_BYTES (64u << 20) /* a service with thousands of hosts stays far below */

typedef Perfetto__Protos__TracingServiceState ServiceState;
typedef Tracerelay__TracingServiceStateExtension StatusExt;
typedef Tracerelay__HostStatus HostStatus;

void cmd_status_usage(FILE *out) {
  fputs("usage: tracerelay status [--socket PATH] [--watch [SECONDS]] [--json]\n"
        "\n"
        "Shows what a tracerelay service sees, one line per host that ever connected:\n"
        "machine name, connected since (or disconnected), producers, data sources, its\n"
        "sessions' state, bytes and chunks relayed, clock offset to the service (service minus\n"
        "host), drift, best round trip and error bound of the clock mapping, and losses by kind\n"
        "(none when nothing was lost):\n"
        "  queue    chunks the agent dropped: its queue (--queue-mb) was full\n"
        "  spill    chunks dropped from the agent's spill queue (--spill-mb) during an outage\n"
        "  link     chunks the service never received (sequence gaps on the link)\n"
        "  smb      producers' shared memory was full (SDK-side drops)\n"
        "  abi      chunks the agent refused as invalid\n"
        "  overwr   chunks overwritten in a RING_BUFFER central buffer before being read\n"
        "  discard  chunks refused by a full DISCARD central buffer\n"
        "  gaps     packets lost because a chunk of their sequence was missing\n"
        "  flush    flushes the host did not answer within the timeout\n"
        "docs/troubleshooting.md says what to change for each.\n"
        "At a regional's consumer socket (tracerelay-service --upstream): its upstream and the\n"
        "agents it forwards, each forwarded, held (its upstream link draining) or connecting.\n"
        "\n"
        "  --socket PATH      the consumer socket. Default: $TRACERELAY_CONSUMER_SOCK, else\n"
        "                     $PERFETTO_CONSUMER_SOCK_NAME, else " DEFAULT_SOCKET "\n"
        "  --watch [SECONDS]  query again every SECONDS (default 2) until interrupted; on a\n"
        "                     terminal the screen is redrawn in place, otherwise each query is\n"
        "                     printed as a block after a blank line\n"
        "  --json             one JSON object per query (one per line with --watch)\n"
        "  -h, --help         this text\n"
        "\n"
        "Exit status: 0, 1 when the service cannot be queried, 2 for bad usage.\n"
        "example:\n"
        "  tracerelay status --socket /tmp/relay.sock --watch 1\n",
        out);
}

/* ---- query ---- */

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  size_t pos = 0;
  bool ok = tr_varint_get(*p, (size_t)(end - *p), &pos, v);
  *p += pos;
  return ok;
}

/* Appends the payload of every service_state (field 1) of a QueryServiceStateResponse:
 * their concatenation is one TracingServiceState. */
static int append_state(const uint8_t *p, size_t len, uint8_t **buf, size_t *used) {
  const uint8_t *end = p + len;
  while (p < end) {
    uint64_t key, n;
    if (!read_varint(&p, end, &key))
      return TR_ERR_PROTO;
    switch (key & 7) {
    case 0:
      if (!read_varint(&p, end, &n))
        return TR_ERR_PROTO;
      break;
    case 1: if ((size_t)(end - p) < 8) return TR_ERR_PROTO; p += 8; break;
    case 5: if ((size_t)(end - p) < 4) return TR_ERR_PROTO; p += 4; break;
    case 2:
      if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p))
        return TR_ERR_PROTO;
      if (key >> 3 == 1) {
        if (*used + n > MAX_STATE_BYTES)
          return TR_ERR_TOO_BIG;
        uint8_t *nb = realloc(*buf, *used + n + 1);
        if (!nb)
          return TR_ERR_NOMEM;
        *buf = nb;
        memcpy(*buf + *used, p, n);
        *used += n;
      }
      p += n;
      break;
    default: return TR_ERR_PROTO;
    }
  }
  return 0;
}

/* QueryServiceState on path; *state and *ext decoded from the same bytes. Prints why on
 * failure and returns 1. */
static int query(const char *path, ServiceState **state, StatusExt **ext) {
  Perfetto__Protos__QueryServiceStateRequest req =
      PERFETTO__PROTOS__QUERY_SERVICE_STATE_REQUEST__INIT;
  uint8_t args[16];
  size_t args_len = perfetto__protos__query_service_state_request__pack(&req, args);
  tr_ipc_client *c = NULL;
  uint8_t *buf = NULL;
  size_t used = 0;
  uint64_t id;
  int rc = tr_ipc_client_connect(path, TIMEOUT_MS, &c);
  *state = NULL;
  *ext = NULL;
  if (rc < 0) {
    fprintf(stderr, "tracerelay status: cannot connect to %s: %s\n", path, tr_strerror(rc));
    return 1;
  }
  if ((rc = tr_ipc_client_bind(c, "ConsumerPort", TIMEOUT_MS)) < 0 ||
      (rc = tr_ipc_client_invoke(c, "QueryServiceState", args, args_len, false, -1, &id)) < 0) {
    fprintf(stderr, "tracerelay status: %s does not answer QueryServiceState: %s\n", path,
            tr_strerror(rc));
    tr_ipc_client_close(c);
    return 1;
  }
  for (bool more = true; more;) {
    Perfetto__Protos__IPCFrame *f = NULL;
    if ((rc = tr_ipc_client_recv(c, TIMEOUT_MS, &f, NULL)) < 0) {
      fprintf(stderr, "tracerelay status: no answer from %s: %s\n", path, tr_strerror(rc));
      goto fail;
    }
    if (f->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY ||
        f->request_id != id) {
      tr_ipc_frame_free(f);
      continue;
    }
    const Perfetto__Protos__IPCFrame__InvokeMethodReply *rep = f->msg_invoke_method_reply;
    more = rep->has_more;
    rc = rep->success ? append_state(rep->reply_proto.data, rep->reply_proto.len, &buf, &used)
                      : TR_ERR_STATE;
    tr_ipc_frame_free(f);
    if (rc < 0) {
      fprintf(stderr, "tracerelay status: bad QueryServiceState reply from %s: %s\n", path,
              tr_strerror(rc));
      goto fail;
    }
  }
  tr_ipc_client_close(c);
  c = NULL;
  *state = perfetto__protos__tracing_service_state__unpack(NULL, used, buf ? buf : args);
  *ext = tracerelay__tracing_service_state_extension__unpack(NULL, used, buf ? buf : args);
  free(buf);
  buf = NULL;
  if (!*state || !*ext) {
    fprintf(stderr, "tracerelay status: undecodable service state from %s\n", path);
    goto fail;
  }
  return 0;
fail:
  if (*state)
    perfetto__protos__tracing_service_state__free_unpacked(*state, NULL);
  if (*ext)
    tracerelay__tracing_service_state_extension__free_unpacked(*ext, NULL);
  *state = NULL;
  *ext = NULL;
  tr_ipc_client_close(c);
  free(buf);
  return 1;
}

/* ---- losses ---- */

struct losses {
  uint64_t queue, spill, link, smb, abi, overwritten, discarded, gaps, flush, crash;
};

static struct losses losses_of(const HostStatus *h) {
  struct losses l = {0};
  const Tracerelay__HostStats *st = h->stats;
  if (st) {
    l.queue = st->agent_queue_dropped_chunks;
    l.spill = st->agent_spill_dropped_chunks;
    /* link_lost counts every chunk of a batch missing on the link, spilled ones included:
     * show only what the spill count does not explain. */
    l.link = st->link_lost_chunks > st->agent_spill_dropped_chunks
                 ? st->link_lost_chunks - st->agent_spill_dropped_chunks
                 : 0;
    l.smb = st->agent_smb_full;
    l.abi = st->agent_abi_violations;
    l.flush = st->flushes_missed;
    l.crash = st->agent_exits_unclean;
  }
  for (size_t i = 0; i < h->n_sessions; i++) {
    l.overwritten += h->sessions[i]->chunks_overwritten;
    l.discarded += h->sessions[i]->chunks_discarded;
    l.gaps += h->sessions[i]->packets_lost_in_gaps;
  }
  return l;
}

/* ---- text ---- */

static void fmt_bytes(char *out, size_t n, uint64_t b) {
  static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
  double v = (double)b;
  size_t u = 0;
  while (v >= 1000 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1000;
    u++;
  }
  snprintf(out, n, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
}

/* A signed duration in ns as "+1.234ms", "-56us", "+2.1s". */
static void fmt_ns(char *out, size_t n, int64_t ns, bool sign) {
  double a = fabs((double)ns);
  const char *s = sign ? (ns < 0 ? "-" : "+") : "";
  if (a < 1e3)
    snprintf(out, n, "%s%.0fns", s, a);
  else if (a < 1e6)
    snprintf(out, n, "%s%.1fus", s, a / 1e3);
  else if (a < 1e9)
    snprintf(out, n, "%s%.3fms", s, a / 1e6);
  else
    snprintf(out, n, "%s%.3fs", s, a / 1e9);
}

static void fmt_age(char *out, size_t n, uint64_t ms) {
  uint64_t s = ms / 1000;
  if (s < 60)
    snprintf(out, n, "%" PRIu64 "s", s);
  else if (s < 3600)
    snprintf(out, n, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
  else if (s < 86400)
    snprintf(out, n, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
  else
    snprintf(out, n, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
}

static void fmt_since(char *out, size_t n, const HostStatus *h) {
  char when[32] = "?", age[24];
  if (!h->connected) {
    snprintf(out, n, "disconnected");
    return;
  }
  if (h->has_connected_since_unix_ns) {
    time_t t = (time_t)(h->connected_since_unix_ns / 1000000000);
    struct tm tm;
    if (localtime_r(&t, &tm))
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  }
  fmt_age(age, sizeof age, h->connected_for_ms);
  snprintf(out, n, "%s (%s)", when, age);
}

static void fmt_sessions(char *out, size_t n, const HostStatus *h) {
  size_t used = 0;
  out[0] = '\0';
  if (h->n_sessions == 0) {
    snprintf(out, n, "idle");
    return;
  }
  for (size_t i = 0; i < h->n_sessions && used < n; i++) {
    const Tracerelay__HostSessionStatus *s = h->sessions[i];
    int w = snprintf(out + used, n - used, "%s#%" PRIu64 " %s %u/%u%s", i ? "," : "",
                     s->session_id, s->state ? s->state : "?", s->instances_started,
                     s->instances, s->gone ? " gone" : "");
    if (w < 0)
      break;
    used += (size_t)w;
  }
}

static void fmt_losses(char *out, size_t n, const struct losses *l) {
  size_t used = 0;
  const struct { const char *name; uint64_t v; } kinds[] = {
      {"queue", l->queue},     {"spill", l->spill},           {"link", l->link},
      {"smb", l->smb},         {"abi", l->abi},               {"overwr", l->overwritten},
      {"discard", l->discarded}, {"gaps", l->gaps},           {"flush", l->flush},
      {"crash", l->crash}};
  out[0] = '\0';
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && used < n; i++) {
    if (!kinds[i].v)
      continue;
    int w = snprintf(out + used, n - used, "%s%s=%" PRIu64, used ? " " : "", kinds[i].name,
                     kinds[i].v);
    if (w < 0)
      break;
    used += (size_t)w;
  }
  if (used == 0)
    snprintf(out, n, "none");
}

static bool no_control_chars(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return false;
  return true;
}

/* A regional (tracerelay-service --upstream): its forwarding, and the agents it forwards. */
static void print_regional(FILE *out, const ServiceState *st, const StatusExt *ext) {
  const Tracerelay__RegionalStatus *r = ext->tracerelay_regional;
  char from_agents[24], from_upstream[24];
  fmt_bytes(from_agents, sizeof from_agents, r->bytes_from_agents);
  fmt_bytes(from_upstream, sizeof from_upstream, r->bytes_from_upstream);
  fprintf(out, "regional %s", st->tracing_service_version ? st->tracing_service_version : "?");
  if (ext->tracerelay_service_machine && no_control_chars(ext->tracerelay_service_machine))
    fprintf(out, " on %s", ext->tracerelay_service_machine);
  fprintf(out, ", forwarding to %s: %u agent%s (%u forwarded, %u held), received %s from "
          "agents and %s from the upstream, %" PRIu64 " upstream link%s lost under an agent\n",
          r->upstream && no_control_chars(r->upstream) ? r->upstream : "?", r->agents,
          r->agents == 1 ? "" : "s", r->forwarded, r->held, from_agents, from_upstream,
          r->upstream_lost, r->upstream_lost == 1 ? "" : "s");
  if (ext->n_tracerelay_hosts == 0) {
    fprintf(out, "  no agent is connected\n");
    return;
  }
  fprintf(out, "%-16s %-30s %-10s %10s %10s\n", "HOST", "CONNECTED", "UPSTREAM", "FROM AGENT",
          "FROM UP");
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) {
    const HostStatus *h = ext->tracerelay_hosts[i];
    char since[64], in[24], up[24];
    fmt_since(since, sizeof since, h);
    fmt_bytes(in, sizeof in, h->stats ? h->stats->bytes_received : 0);
    fmt_bytes(up, sizeof up, h->regional_bytes_from_upstream);
    fprintf(out, "%-16s %-30s %-10s %10s %10s\n", h->machine_name ? h->machine_name : "?", since,
            h->regional_upstream_state && no_control_chars(h->regional_upstream_state)
                ? h->regional_upstream_state
                : "?",
            in, up);
  }
  fprintf(out, "record at the upstream %s: this regional records nothing itself\n",
          r->upstream && no_control_chars(r->upstream) ? r->upstream : "service");
}

/* Whole days from now until a certificate's notAfter (negative once it passed). */
static long long days_left(int64_t not_after) {
  int64_t left = not_after - (int64_t)time(NULL);
  return left >= 0 ? left / 86400 : -((-left + 86399) / 86400);
}

/* certificates: days left of the service's own, its CA's and the first to expire among the
 * connected agents'. */
static void print_cert_days(FILE *out, const StatusExt *ext) {
  const Tracerelay__TlsExpiry *tls = ext->tracerelay_tls;
  const HostStatus *first = NULL;
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) {
    const HostStatus *h = ext->tracerelay_hosts[i];
    if (h->has_cert_not_after_unix &&
        (first == NULL || h->cert_not_after_unix < first->cert_not_after_unix))
      first = h;
  }
  if (tls == NULL)
    return;
  fprintf(out, "certificates: service %lld days left, CA %lld days left",
          days_left(tls->cert_not_after_unix), days_left(tls->ca_not_after_unix));
  if (first != NULL && first->machine_name && no_control_chars(first->machine_name))
    fprintf(out, ", agents' first to expire %s %lld days left", first->machine_name,
            days_left(first->cert_not_after_unix));
  fputc('\n', out);
}

/* buffer memory: what the sessions reserve of --max-buffer-memory. */
static void print_buffer_memory(FILE *out, const StatusExt *ext) {
  char reserved[TR_BYTE_SIZE_TEXT], max[TR_BYTE_SIZE_TEXT];
  if (!ext->has_tracerelay_max_buffer_memory || ext->tracerelay_max_buffer_memory == 0)
    return;
  tr_byte_size_format(ext->tracerelay_buffer_memory_reserved, reserved);
  tr_byte_size_format(ext->tracerelay_max_buffer_memory, max);
  fprintf(out, "buffer memory: %s reserved of %s (--max-buffer-memory)\n", reserved, max);
}

static void print_text(FILE *out, const ServiceState *st, const StatusExt *ext) {
  if (ext->tracerelay_regional) {
    print_regional(out, st, ext);
    return;
  }
  size_t connected = 0;
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++)
    connected += ext->tracerelay_hosts[i]->connected;
  fprintf(out, "service %s", st->tracing_service_version ? st->tracing_service_version : "?");
  if (ext->tracerelay_service_machine && no_control_chars(ext->tracerelay_service_machine))
    fprintf(out, " on %s", ext->tracerelay_service_machine); /* as its traces name machine 0 */
  fprintf(out, ": %zu host%s (%zu connected", ext->n_tracerelay_hosts,
          ext->n_tracerelay_hosts == 1 ? "" : "s", connected);
  if (ext->tracerelay_hosts_retired > 0) /* gone, in no session, past those kept */
    fprintf(out, ", %" PRIu64 " retired", ext->tracerelay_hosts_retired);
  fprintf(out, "), %zu producer%s, %d session%s (%d started)\n", st->n_producers,
          st->n_producers == 1 ? "" : "s", st->num_sessions, st->num_sessions == 1 ? "" : "s",
          st->num_sessions_started);
  print_cert_days(out, ext);
  print_buffer_memory(out, ext);
  if (ext->n_tracerelay_hosts == 0) {
    /* traced, or a service with no agent yet: list the producers Perfetto's state has. */
    for (size_t i = 0; i < st->n_producers; i++)
      fprintf(out, "  producer %d %s (pid %d, machine %s)\n", st->producers[i]->id,
              st->producers[i]->name ? st->producers[i]->name : "?", st->producers[i]->pid,
              st->producers[i]->machine_name ? st->producers[i]->machine_name : "local");
    if (st->n_producers == 0)
      fprintf(out, "  no host has connected\n");
    return;
  }
  fprintf(out, "%-16s %-30s %4s %4s %-18s %10s %9s %11s %9s %8s %9s  %s\n", "HOST", "CONNECTED",
          "PROD", "DS", "SESSIONS", "BYTES", "CHUNKS", "OFFSET", "DRIFT", "RTT", "BOUND NOW",
          "LOSSES");
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) {
    const HostStatus *h = ext->tracerelay_hosts[i];
    char since[64], sessions[128], bytes[24], off[24] = "-", drift[24] = "-", rtt[24] = "-",
                                                      err[24] = "-", losses[256];
    struct losses l = losses_of(h);
    fmt_since(since, sizeof since, h);
    fmt_sessions(sessions, sizeof sessions, h);
    fmt_bytes(bytes, sizeof bytes, h->stats ? h->stats->bytes_received : 0);
    if (h->clock_synced) {
      fmt_ns(off, sizeof off, h->clock_offset_ns, true);
      snprintf(drift, sizeof drift, "%+.2fppm", h->clock_drift_ppm);
      fmt_ns(rtt, sizeof rtt, h->clock_rtt_ns, false);
      if (h->has_clock_error_bound_ns) {
        err[0] = '+';
        err[1] = '-';
        fmt_ns(err + 2, sizeof err - 2, h->clock_error_bound_ns, false);
      }
    }
    fmt_losses(losses, sizeof losses, &l);
    fprintf(out, "%-16s %-30s %4u %4u %-18s %10s %9" PRIu64 " %11s %9s %8s %9s  %s\n",
            h->machine_name ? h->machine_name : "?", since, h->producers, h->data_sources,
            sessions, bytes, h->stats ? h->stats->chunks_received : 0, off, drift, rtt, err,
            losses);
  }
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) /* tiers: who carries whom */
    if (ext->tracerelay_hosts[i]->relayed_by)
      fprintf(out, "%s is relayed by the regional %s\n", ext->tracerelay_hosts[i]->machine_name,
              ext->tracerelay_hosts[i]->relayed_by);
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) /* machine ids (docs/timeline.md) */
    if (ext->tracerelay_hosts[i]->trace_machine_name)
      fprintf(out, "%s is %s in traces (machine_id %u): the ids of its name are another host's\n",
              ext->tracerelay_hosts[i]->machine_name,
              ext->tracerelay_hosts[i]->trace_machine_name,
              ext->tracerelay_hosts[i]->machine_id);
}

/* ---- JSON ---- */

static void json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(out, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(out, "\\u%04x", *p);
    else
      fputc(*p, out);
  }
  fputc('"', out);
}

static void print_json(FILE *out, const ServiceState *st, const StatusExt *ext) {
  fputs("{\"service\":{\"version\":", out);
  json_str(out, st->tracing_service_version);
  fputs(",\"machine_name\":", out);
  json_str(out, ext->tracerelay_service_machine);
  fprintf(out, ",\"num_sessions\":%d,\"num_sessions_started\":%d,\"num_producers\":%zu",
          st->num_sessions, st->num_sessions_started, st->n_producers);
  if (ext->tracerelay_tls)
    fprintf(out, ",\"cert_not_after_unix\":%" PRId64 ",\"ca_not_after_unix\":%" PRId64,
            ext->tracerelay_tls->cert_not_after_unix, ext->tracerelay_tls->ca_not_after_unix);
  if (ext->has_tracerelay_hosts_retired)
    fprintf(out, ",\"hosts_retired\":%" PRIu64 ",\"max_buffer_memory\":%" PRIu64
            ",\"buffer_memory_reserved\":%" PRIu64,
            ext->tracerelay_hosts_retired, ext->tracerelay_max_buffer_memory,
            ext->tracerelay_buffer_memory_reserved);
  fputs("},", out);
  if (ext->tracerelay_regional) {
    const Tracerelay__RegionalStatus *r = ext->tracerelay_regional;
    fputs("\"regional\":{\"upstream\":", out);
    json_str(out, r->upstream);
    fprintf(out, ",\"agents\":%u,\"forwarded\":%u,\"held\":%u,\"bytes_from_agents\":%" PRIu64
            ",\"bytes_from_upstream\":%" PRIu64 ",\"upstream_lost\":%" PRIu64 "},",
            r->agents, r->forwarded, r->held, r->bytes_from_agents, r->bytes_from_upstream,
            r->upstream_lost);
  }
  fputs("\"sessions\":[", out);
  for (size_t i = 0; i < st->n_tracing_sessions; i++) {
    const Perfetto__Protos__TracingServiceState__TracingSession *s = st->tracing_sessions[i];
    fprintf(out, "%s{\"id\":%" PRIu64 ",\"state\":", i ? "," : "", s->id);
    json_str(out, s->state);
    fprintf(out, ",\"consumer_uid\":%d,\"num_data_sources\":%u,\"duration_ms\":%u}",
            s->consumer_uid, s->num_data_sources, s->duration_ms);
  }
  fputs("],\"hosts\":[", out);
  for (size_t i = 0; i < ext->n_tracerelay_hosts; i++) {
    const HostStatus *h = ext->tracerelay_hosts[i];
    const Tracerelay__HostStats *hs = h->stats;
    struct losses l = losses_of(h);
    fprintf(out, "%s{\"machine_name\":", i ? "," : "");
    json_str(out, h->machine_name);
    fprintf(out, ",\"machine_id\":%u,\"connected\":%s", h->machine_id,
            h->connected ? "true" : "false");
    if (h->has_connected_since_unix_ns)
      fprintf(out, ",\"connected_since_unix_ns\":%" PRId64, h->connected_since_unix_ns);
    if (h->has_cert_not_after_unix)
      fprintf(out, ",\"cert_not_after_unix\":%" PRId64, h->cert_not_after_unix);
    if (h->relayed_by) {
      fputs(",\"relayed_by\":", out);
      json_str(out, h->relayed_by);
    }
    if (h->trace_machine_name) {
      fputs(",\"trace_machine_name\":", out);
      json_str(out, h->trace_machine_name);
    }
    if (h->regional_upstream_state) {
      fputs(",\"regional_upstream_state\":", out);
      json_str(out, h->regional_upstream_state);
      fprintf(out, ",\"regional_bytes_from_upstream\":%" PRIu64, h->regional_bytes_from_upstream);
    }
    fprintf(out, ",\"connected_for_ms\":%" PRIu64 ",\"producers\":%u,\"data_sources\":%u",
            h->connected_for_ms, h->producers, h->data_sources);
    fputs(",\"producer_names\":[", out);
    bool first = true;
    for (size_t p = 0; p < st->n_producers; p++) {
      const Perfetto__Protos__TracingServiceState__Producer *pr = st->producers[p];
      if (!pr->machine_name || !h->machine_name || strcmp(pr->machine_name, h->machine_name))
        continue;
      fputs(first ? "" : ",", out);
      json_str(out, pr->name);
      first = false;
    }
    fputs("],\"sessions\":[", out);
    for (size_t s = 0; s < h->n_sessions; s++) {
      const Tracerelay__HostSessionStatus *ss = h->sessions[s];
      fprintf(out, "%s{\"id\":%" PRIu64 ",\"state\":", s ? "," : "", ss->session_id);
      json_str(out, ss->state);
      fprintf(out,
              ",\"instances\":%u,\"instances_started\":%u,\"chunks_overwritten\":%" PRIu64
              ",\"bytes_overwritten\":%" PRIu64 ",\"chunks_discarded\":%" PRIu64
              ",\"packets_lost_in_gaps\":%" PRIu64 ",\"gone\":%s}",
              ss->instances, ss->instances_started, ss->chunks_overwritten,
              ss->bytes_overwritten, ss->chunks_discarded, ss->packets_lost_in_gaps,
              ss->gone ? "true" : "false");
    }
    fprintf(out,
            "],\"bytes_relayed\":%" PRIu64 ",\"chunks_relayed\":%" PRIu64
            ",\"batches_received\":%" PRIu64 ",\"disconnects\":%" PRIu64,
            hs ? hs->bytes_received : 0, hs ? hs->chunks_received : 0,
            hs ? hs->batches_received : 0, hs ? hs->disconnects : 0);
    fprintf(out,
            ",\"losses\":{\"agent_queue_chunks\":%" PRIu64 ",\"agent_queue_bytes\":%" PRIu64
            ",\"agent_spill_chunks\":%" PRIu64 ",\"agent_spill_bytes\":%" PRIu64
            ",\"link_lost_chunks\":%" PRIu64 ",\"link_lost_bytes\":%" PRIu64
            ",\"link_unexplained_chunks\":%" PRIu64 ",\"agent_smb_full\":%" PRIu64
            ",\"agent_abi_violations\":%" PRIu64 ",\"ring_overwritten_chunks\":%" PRIu64
            ",\"discarded_chunks\":%" PRIu64 ",\"packets_lost_in_gaps\":%" PRIu64
            ",\"flushes_missed\":%" PRIu64 ",\"agent_exits_unclean\":%" PRIu64 "}",
            l.queue, hs ? hs->agent_queue_dropped_bytes : 0, l.spill,
            hs ? hs->agent_spill_dropped_bytes : 0, hs ? hs->link_lost_chunks : 0,
            hs ? hs->link_lost_bytes : 0, l.link, l.smb, l.abi, l.overwritten, l.discarded,
            l.gaps, l.flush, l.crash);
    if (h->clock_synced)
      fprintf(out,
              ",\"clock\":{\"synced\":true,\"offset_ns\":%" PRId64 ",\"drift_ppm\":%.3f"
              ",\"rtt_ns\":%" PRId64 ",\"error_bound_ns\":%" PRId64 ",\"probes\":%" PRIu64
              ",\"outliers\":%" PRIu64 "}",
              h->clock_offset_ns, isfinite(h->clock_drift_ppm) ? h->clock_drift_ppm : 0.0,
              h->clock_rtt_ns, h->clock_error_bound_ns, h->clock_probes, h->clock_outliers);
    else
      fputs(",\"clock\":{\"synced\":false}", out);
    fputc('}', out);
  }
  fputs("]}\n", out);
}

/* ---- command ---- */

static int show(const char *path, bool json, bool watch, bool tty) {
  ServiceState *st;
  StatusExt *ext;
  if (watch && tty) {
    fputs("\033[H\033[2J", stdout); /* home + clear: redraw in place, errors included */
    fflush(stdout);
  }
  int rc = query(path, &st, &ext);
  if (rc == 0) {
    if (json)
      print_json(stdout, st, ext);
    else
      print_text(stdout, st, ext);
    perfetto__protos__tracing_service_state__free_unpacked(st, NULL);
    tracerelay__tracing_service_state_extension__free_unpacked(ext, NULL);
  }
  fflush(stdout);
  return rc;
}

int cmd_status(int argc, char **argv) {
  const char *path = getenv("TRACERELAY_CONSUMER_SOCK");
  bool json = false, watch = false;
  double period = 2.0;
  if (!path || !*path)
    path = getenv("PERFETTO_CONSUMER_SOCK_NAME");
  if (!path || !*path)
    path = DEFAULT_SOCKET;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      cmd_status_usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = true;
    } else if (!strcmp(a, "--socket") && i + 1 < argc) {
      path = argv[++i];
    } else if (!strncmp(a, "--socket=", 9)) {
      path = a + 9;
    } else if (!strcmp(a, "--watch") || !strncmp(a, "--watch=", 8)) {
      const char *v = a[7] == '=' ? a + 8 : (i + 1 < argc && argv[i + 1][0] != '-' ? argv[++i]
                                                                                     : NULL);
      watch = true;
      if (v) {
        char *end;
        errno = 0;
        period = strtod(v, &end);
        if (*v == '\0' || *end != '\0' || errno || !(period >= 0.1 && period <= 86400)) {
          fprintf(stderr, "tracerelay status: --watch takes seconds, 0.1 to 86400 (got '%s')\n",
                  v);
          return 2;
        }
      }
    } else {
      fprintf(stderr, "tracerelay status: unknown or incomplete option '%s' (see --help)\n", a);
      return 2;
    }
  }
  if (!watch)
    return show(path, json, false, false);
  bool tty = isatty(STDOUT_FILENO);
  for (bool first = true;; first = false) {
    if (!first && !tty && !json)
      fputc('\n', stdout);
    show(path, json, true, tty); /* a failed query is reported and retried */
    struct timespec ts = {(time_t)period, (long)((period - (double)(time_t)period) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
}
