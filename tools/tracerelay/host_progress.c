/* host_progress.c: per-host bytes and losses from a GetTraceStats reply (see host_progress.h).
 *
 * protobuf-c keeps the fields of TraceStats it does not know (our extension) as unknown
 * fields and packs them back, so the extension is read by packing the decoded TraceStats
 * again and decoding those bytes as TraceStatsExtension, which in turn skips Perfetto's fields:
 * no hand-written wire parsing. */
#include "tools/tracerelay/host_progress.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "tracerelay/tracerelay_stats.pb-c.h"

typedef Perfetto__Protos__TraceStats TraceStats;

static void append(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *out, size_t cap, const char *fmt, ...) {
  size_t used = strlen(out);
  if (used + 1 >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + used, cap - used, fmt, ap);
  va_end(ap);
}

/* A machine name, or a guest machine's "<host>/<guest>" (105 bytes at most). */
static bool printable_name(const char *s) {
  if (!s || !*s || strlen(s) > 105)
    return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '.' || *s == '_' || *s == '-' || *s == '/'))
      return false;
  return true;
}

static Tracerelay__TraceStatsExtension *extension_of(const TraceStats *st) {
  if (st->base.n_unknown_fields == 0)
    return NULL;
  size_t n = protobuf_c_message_get_packed_size(&st->base);
  uint8_t *buf = malloc(n + 1);
  if (!buf)
    return NULL;
  protobuf_c_message_pack(&st->base, buf);
  Tracerelay__TraceStatsExtension *x = tracerelay__trace_stats_extension__unpack(NULL, n, buf);
  free(buf);
  return x;
}

/* A close reason from the reply, printed only if it is a short phrase (it is untrusted). */
static bool printable_reason(const char *s) {
  if (!s || !*s || strlen(s) > 40)
    return false;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == ' ' || *s == '-'))
      return false;
  return true;
}

/* Appends "web-1: 1 stalled client, 2 peer not reading" for the entry's closed producers. */
static void note_producers_closed(const Tracerelay__HostStats *h, char *out, size_t cap) {
  for (size_t i = 0; i < h->n_session_producers_closed; i++) {
    const Tracerelay__HostStats__ProducersClosed *c = h->session_producers_closed[i];
    if (i == 0)
      append(out, cap, "%s%s:", out[0] ? "; " : "",
             printable_name(h->machine_name) ? h->machine_name : "?");
    append(out, cap, "%s %llu %s", i ? "," : "", (unsigned long long)c->connections,
           printable_reason(c->reason) ? c->reason : "?");
  }
}

/* What an entry shares with the other entries of its machine: a host whose agent restarted
 * during the session has two (the retired one and its successor), with the same host-wide
 * counters (link and agent drops since the host first connected) and each its own buffers. */
struct machine_of_entry {
  bool first;     /* the machine's first entry: its host-wide counters are counted here */
  bool connected; /* some entry of the machine is connected */
};

/* Appends one host's part of the line; adds its losses to *total. */
static void format_host(const Tracerelay__HostStats *h, struct machine_of_entry m,
                        const TraceStats *st, char *out, size_t cap,
                        struct host_progress_sum *total) {
  uint64_t bytes = 0,
           lost = m.first ? h->agent_queue_dropped_chunks + h->agent_spill_dropped_chunks +
                                h->link_lost_chunks
                          : 0;
  for (size_t i = 0; i < h->n_buffer_stats_index; i++) {
    uint32_t k = h->buffer_stats_index[i];
    if (k >= st->n_buffer_stats)
      continue; /* a service bug or a hostile reply: ignore the entry */
    const Perfetto__Protos__TraceStats__BufferStats *b = st->buffer_stats[k];
    bytes += b->bytes_written;
    lost += b->chunks_discarded + b->chunks_overwritten;
  }
  lost += h->session_exit_unscraped_chunks;
  uint64_t closed = 0;
  for (size_t i = 0; i < h->n_session_producers_closed; i++)
    closed += h->session_producers_closed[i]->connections;
  append(out, cap, "%s%s %.1f MB", out[0] ? "  " : "",
         printable_name(h->machine_name) ? h->machine_name : "?",
         (double)bytes / (1024.0 * 1024.0)); /* MB as the total's: MiB */
  if (lost)
    append(out, cap, " (%llu chunks lost)", (unsigned long long)lost);
  if (h->session_smb_full)
    append(out, cap, " (SMB full %llu times, <= %llu ms)", (unsigned long long)h->session_smb_full,
           (unsigned long long)h->session_smb_full_ms);
  if (h->session_agent_exits_unclean)
    append(out, cap, " (agent killed: %llu)", (unsigned long long)h->session_agent_exits_unclean);
  if (h->session_stops_timed_out)
    append(out, cap, " (stop timed out: %llu)", (unsigned long long)h->session_stops_timed_out);
  if (closed)
    append(out, cap, " (producers cut off: %llu)", (unsigned long long)closed);
  note_producers_closed(h, total->producers_closed, sizeof total->producers_closed);
  bool down = h->has_connected && !m.connected;
  if (down)
    append(out, cap, " (down)");
  if (down && m.first)
    append(total->down, sizeof total->down, "%s%s", total->down[0] ? ", " : "",
           printable_name(h->machine_name) ? h->machine_name : "?");
  total->lost_chunks += lost;
  total->smb_full += h->session_smb_full;
  total->smb_full_ms += h->session_smb_full_ms;
  if (h->session_instances_not_started)
    append(total->not_started, sizeof total->not_started, "%s%s (%llu)",
           total->not_started[0] ? ", " : "",
           printable_name(h->machine_name) ? h->machine_name : "?",
           (unsigned long long)h->session_instances_not_started);
  if (h->session_agent_exits_unclean)
    append(total->agent_crashed, sizeof total->agent_crashed, "%s%s (%llu)",
           total->agent_crashed[0] ? ", " : "",
           printable_name(h->machine_name) ? h->machine_name : "?",
           (unsigned long long)h->session_agent_exits_unclean);
  if (h->session_stops_timed_out)
    append(total->stop_timed_out, sizeof total->stop_timed_out, "%s%s (%llu)",
           total->stop_timed_out[0] ? ", " : "",
           printable_name(h->machine_name) ? h->machine_name : "?",
           (unsigned long long)h->session_stops_timed_out);
}

struct named_entry {
  const char *name;
  size_t index;
};

static int by_name_then_index(const void *a, const void *b) {
  const struct named_entry *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Each entry's machine (m[i] for entry i), grouped by name; returns the machines, or 0 when
 * out of memory (then every entry stands for its own machine). */
static unsigned group_machines(const Tracerelay__TraceStatsExtension *x,
                               struct machine_of_entry *m) {
  size_t n = x->n_tracerelay_hosts;
  for (size_t i = 0; i < n; i++)
    m[i] = (struct machine_of_entry){true, x->tracerelay_hosts[i]->connected};
  struct named_entry *e = malloc((n + 1) * sizeof *e);
  if (e == NULL)
    return 0;
  for (size_t i = 0; i < n; i++) {
    const char *name = x->tracerelay_hosts[i]->machine_name;
    e[i] = (struct named_entry){name ? name : "", i};
  }
  qsort(e, n, sizeof *e, by_name_then_index);
  unsigned machines = 0;
  for (size_t start = 0, end; start < n; start = end) {
    bool connected = false;
    for (end = start; end < n && strcmp(e[end].name, e[start].name) == 0; end++)
      connected |= m[e[end].index].connected;
    for (size_t k = start; k < end; k++)
      m[e[k].index] = (struct machine_of_entry){k == start, connected};
    machines++;
  }
  free(e);
  return machines;
}

int host_progress_format(const uint8_t *reply, size_t len, char *out, size_t cap,
                         struct host_progress_sum *total) {
  Perfetto__Protos__GetTraceStatsResponse *resp =
      perfetto__protos__get_trace_stats_response__unpack(NULL, len, reply);
  if (!resp || !resp->trace_stats) {
    if (resp)
      perfetto__protos__get_trace_stats_response__free_unpacked(resp, NULL);
    return -1;
  }
  const TraceStats *st = resp->trace_stats;
  uint64_t sum = 0;
  for (size_t i = 0; i < st->n_buffer_stats; i++)
    sum += st->buffer_stats[i]->bytes_written;
  *total = (struct host_progress_sum){.bytes = sum};
  if (cap > 0)
    out[0] = '\0';
  Tracerelay__TraceStatsExtension *x = extension_of(st);
  /* A tracerelay service always sends this field, hosts or not. */
  total->tracerelay = x && x->has_tracerelay_chunks_unknown_buffer;
  struct machine_of_entry *m = x ? calloc(x->n_tracerelay_hosts + 1, sizeof *m) : NULL;
  if (x && m) {
    unsigned machines = group_machines(x, m);
    total->hosts = machines ? machines : (unsigned)x->n_tracerelay_hosts;
    for (size_t i = 0; cap > 0 && i < x->n_tracerelay_hosts; i++)
      format_host(x->tracerelay_hosts[i], m[i], st, out, cap, total);
  }
  free(m);
  for (size_t i = 0; x && i < x->n_tracerelay_unmatched_data_sources; i++) {
    const char *n = x->tracerelay_unmatched_data_sources[i];
    append(total->missing, sizeof total->missing, "%sdata source '%s' matched no producer on any host",
           total->missing[0] ? "; " : "", printable_name(n) ? n : "?");
  }
  for (size_t i = 0; x && i < x->n_tracerelay_machines_not_connected; i++) {
    const char *n = x->tracerelay_machines_not_connected[i];
    append(total->missing, sizeof total->missing, "%smachine '%s' is not connected",
           total->missing[0] ? "; " : "", printable_name(n) ? n : "?");
  }
  if (x)
    tracerelay__trace_stats_extension__free_unpacked(x, NULL);
  perfetto__protos__get_trace_stats_response__free_unpacked(resp, NULL);
  return 0;
}
