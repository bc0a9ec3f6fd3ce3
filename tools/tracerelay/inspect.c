/* inspect.c: `tracerelay inspect TRACE`: reads a Perfetto trace, puts every timestamp on the trace
 * clock with tracerelay's own resolver (relay/reading/trace_inspect.h) and prints, per host, packets,
 * sequences, time range, losses, clock mapping and unresolved packets; `--json` prints the same
 * for scripts and `--packets` adds one line per timestamp. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay/clock/clock.h"
#include "relay/base/tr_error.h"
#include "relay/reading/trace_inspect.h"
#include "tools/tracerelay/check_order.h"
#include "tools/tracerelay/commands.h"

void cmd_inspect_usage(FILE *out) {
  fputs("usage: tracerelay inspect TRACE [--json] [--packets] [--check-order]\n"
        "\n"
        "Reads a Perfetto trace (written by tracerelay-service, traced or several concatenated),\n"
        "resolves every packet's timestamp to the trace clock as trace_processor does (clock\n"
        "snapshots, remote_clock_sync, sequence-scoped incremental clocks, packet defaults,\n"
        "ftrace clocks) and prints per host: packets, sequences, first/last trace time, losses\n"
        "from TraceStats, the mapping of its BOOTTIME to the trace clock (offset, drift, error\n"
        "bound) and the packets it could not resolve. A host is a machine_id, or in the\n"
        "global-clocks encoding the machine whose global clock ids a sequence uses. Then the\n"
        "service's marks: hosts that disconnected, reconnected or restarted their agent\n"
        "during the session, at the service's time. For each host the clock error bound\n"
        "track the service wrote (how far the trace may place its events from their true\n"
        "instants) and the link marks on that host's track.\n"
        "\n"
        "options:\n"
        "  --json     print the summary as one JSON object (times in ns)\n"
        "  --packets  also print one line per timestamp: byte offset, machine, sequence, clock,\n"
        "             raw and trace timestamps (with --json: a \"points\" array)\n"
        "  --check-order\n"
        "             also check causality across hosts: every flow (TrackEvent flow_ids ->\n"
        "             terminating_flow_ids) whose ends lie on two hosts must arrive after it\n"
        "             departs on the merged timeline; lists those that do not, by how much, and\n"
        "             whether that is within the two hosts' clock error bounds (then the\n"
        "             order was never certain) or beyond them (a clock is wrong: exit 3)\n"
        "  --help     this text\n"
        "\n"
        "exit status: 0 read in full (unresolved packets are reported, not fatal), 1 unreadable,\n"
        "empty or malformed file (the message gives the byte offset; for a file cut short or\n"
        "corrupt further on, the summary of the records before that point is printed first),\n"
        "2 bad usage, 3 --check-order found a flow that arrives before it departs by more than\n"
        "the hosts' bounds.\n"
        "example:\n"
        "  tracerelay inspect cluster.pftrace --json | jq '.hosts[] | {name, unresolved}'\n",
        out);
}

struct opts {
  const char *path;
  bool json, packets, check_order;
};

struct printer {
  const struct opts *o;
  uint64_t points;
  struct order_check *order; /* with --check-order */
};

/* JSON string body: quotes, backslashes and control bytes escaped. */
static void put_json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(out, "\\%c", ch);
    else if (ch < 0x20 || ch == 0x7f)
      fprintf(out, "\\u%04x", ch);
    else
      fputc(ch, out);
  }
  fputc('"', out);
}

/* Names come from the trace: show control bytes as '?' so they cannot drive the terminal. */
static void put_text(FILE *out, const char *s) {
  for (; *s; s++)
    fputc((unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s, out);
}

static void clock_label(uint32_t id, char *buf, size_t size) {
  const char *n = tr_clock_name(id);
  if (n)
    snprintf(buf, size, "%s", n);
  else if (id >= 64 && id < 128)
    snprintf(buf, size, "seq:%" PRIu32, id);
  else
    snprintf(buf, size, "%" PRIu32, id);
}

static void seconds(char *buf, size_t size, int64_t ns) {
  uint64_t a = ns < 0 ? -(uint64_t)ns : (uint64_t)ns;
  snprintf(buf, size, "%s%" PRIu64 ".%09" PRIu64, ns < 0 ? "-" : "", a / 1000000000u,
           a % 1000000000u);
}

static const char *source_name(enum tr_inspect_source s) {
  switch (s) {
  case TR_INSPECT_FTRACE_EVENT:
    return "ftrace";
  case TR_INSPECT_COMPACT_SWITCH:
    return "sched_switch";
  case TR_INSPECT_COMPACT_WAKING:
    return "sched_waking";
  default:
    return "packet";
  }
}

static void print_point(struct printer *pr, const struct tr_inspect_point *p) {
  char clock[24];
  clock_label(p->clock_id, clock, sizeof(clock));
  if (pr->o->json) {
    printf("%s\n  {\"offset\":%" PRIu64 ",\"index\":%" PRIu64 ",\"machine_id\":%" PRIu32
           ",\"seq\":%" PRIu32 ",\"clock\":%" PRIu32 ",\"source\":\"%s\",\"event\":%" PRIu32
           ",\"raw_ts\":%" PRIu64 ",\"clock_ts\":%" PRIu64,
           pr->points ? "," : "", p->offset, p->index, p->machine_id, p->seq_id, p->clock_id,
           source_name(p->source), p->event, p->raw_ts, p->clock_ts);
    if (p->status == 0)
      printf(",\"trace_ts\":%" PRId64 "}", p->trace_ts);
    else
      printf(",\"trace_ts\":null,\"error\":\"%s\"}", tr_strerror(p->status));
  } else {
    if (pr->points == 0)
      printf("%-10s %-10s %-6s %-9s %-14s %20s %20s\n", "offset", "machine", "seq", "clock",
             "source", "raw_ts", "trace_ts");
    char src[32];
    if (p->source == TR_INSPECT_PACKET)
      snprintf(src, sizeof(src), "packet");
    else
      snprintf(src, sizeof(src), "%s[%" PRIu32 "]", source_name(p->source), p->event);
    printf("%-10" PRIu64 " %-10" PRIu32 " %-6" PRIu32 " %-9s %-14s %20" PRIu64, p->offset,
           p->machine_id, p->seq_id, clock, src, p->raw_ts);
    if (p->status == 0)
      printf(" %20" PRId64 "\n", p->trace_ts);
    else
      printf(" %20s  (%s)\n", "-", tr_strerror(p->status));
  }
  pr->points++;
}

static void on_point(const struct tr_inspect_point *p, void *arg) {
  struct printer *pr = arg;
  if (pr->order)
    order_check_point(pr->order, p);
  if (pr->o->packets)
    print_point(pr, p);
}

static void print_host_json(const struct tr_inspect_result *r, const struct tr_inspect_host *h) {
  printf("{\"machine_id\":%" PRIu32 ",\"domain\":%" PRIu32 ",\"name\":", h->machine_id,
         h->domain);
  put_json_str(stdout, h->name);
  printf(",\"packets\":%" PRIu64 ",\"ftrace_events\":%" PRIu64 ",\"timestamps\":%" PRIu64
         ",\"sequences\":{",
         h->packets, h->ftrace_events, h->timestamps);
  for (size_t i = 0; i < h->n_seqs; i++)
    printf("%s\"%" PRIu32 "\":%" PRIu64, i ? "," : "", h->seqs[i].seq_id, h->seqs[i].packets);
  printf("}");
  if (h->has_range)
    printf(",\"first_ts\":%" PRId64 ",\"last_ts\":%" PRId64, h->first_ts, h->last_ts);
  else
    printf(",\"first_ts\":null,\"last_ts\":null");
  const struct tr_inspect_losses *l = &h->losses;
  printf(",\"losses\":{\"trace_stats_packets\":%" PRIu64 ",\"chunks_overwritten\":%" PRIu64
         ",\"bytes_overwritten\":%" PRIu64 ",\"chunks_discarded\":%" PRIu64
         ",\"abi_violations\":%" PRIu64 ",\"trace_writer_packet_loss\":%" PRIu64
         ",\"patches_failed\":%" PRIu64 ",\"patches_discarded\":%" PRIu64
         ",\"invalid_packets\":%" PRIu64 ",\"flushes_failed\":%" PRIu64
         ",\"previous_packet_dropped\":%" PRIu64 "}",
         l->trace_stats_packets, l->chunks_overwritten, l->bytes_overwritten, l->chunks_discarded,
         l->abi_violations, l->trace_writer_packet_loss, l->patches_failed,
         l->patches_discarded, l->invalid_packets, l->flushes_failed,
         l->previous_packet_dropped);
  if (l->has_host_stats)
    printf(",\"host_stats\":{\"connected\":%s,\"link_lost_chunks\":%" PRIu64
           ",\"link_lost_bytes\":%" PRIu64 ",\"agent_queue_dropped_chunks\":%" PRIu64
           ",\"agent_spill_dropped_chunks\":%" PRIu64 ",\"agent_smb_full\":%" PRIu64
           ",\"agent_abi_violations\":%" PRIu64 ",\"flushes_missed\":%" PRIu64
           ",\"session_chunks_refused\":%" PRIu64 ",\"session_flushes_missed\":%" PRIu64
           ",\"session_disconnects\":%" PRIu64 ",\"session_smb_full\":%" PRIu64
           ",\"session_smb_full_ms\":%" PRIu64
           ",\"session_instances_not_started\":%" PRIu64
           ",\"session_agent_exits_unclean\":%" PRIu64 ",\"session_stops_timed_out\":%" PRIu64
           ",\"session_exit_unscraped_chunks\":%" PRIu64 ",\"session_producers_closed\":%" PRIu64
           ",\"agent_queue_dropped_packets\":%" PRIu64
           ",\"agent_spill_dropped_packets\":%" PRIu64
           ",\"session_packets_lost_in_gaps\":%" PRIu64 ",\"lost_packets\":%" PRIu64 "}",
           l->connected ? "true" : "false", l->link_lost_chunks, l->link_lost_bytes,
           l->agent_queue_dropped_chunks, l->agent_spill_dropped_chunks, l->agent_smb_full,
           l->agent_abi_violations, l->flushes_missed, l->session_chunks_refused,
           l->session_flushes_missed, l->session_disconnects, l->session_smb_full,
           l->session_smb_full_ms,
           l->session_instances_not_started, l->session_agent_exits_unclean,
           l->session_stops_timed_out, l->session_exit_unscraped_chunks,
           l->session_producers_closed, l->agent_queue_dropped_packets,
           l->agent_spill_dropped_packets, l->session_packets_lost_in_gaps,
           l->agent_queue_dropped_packets + l->agent_spill_dropped_packets +
               l->session_packets_lost_in_gaps);
  if (l->has_host_stats) {
    printf(",\"disconnected_at_ns\":[");
    for (size_t i = 0; i < l->num_disconnected_at; i++)
      printf("%s%" PRIu64, i ? "," : "", l->disconnected_at_ns[i]);
    printf("]");
  } else
    printf(",\"host_stats\":null");
  if (h->has_mapping)
    printf(",\"clock\":{\"offset_ns\":%" PRId64 ",\"drift_ppm\":%.6f,\"span_ns\":%" PRIu64,
           h->offset_ns, h->drift_ppm, h->mapping_span_ns);
  else
    printf(",\"clock\":{\"offset_ns\":null,\"drift_ppm\":null,\"span_ns\":null");
  if (h->has_sync_offset)
    printf(",\"remote_sync_offset_ns\":%" PRId64, h->sync_offset_ns);
  else
    printf(",\"remote_sync_offset_ns\":null");
  if (h->sync_round_trip_ns >= 0)
    printf(",\"remote_sync_round_trip_ns\":%" PRId64 "}", h->sync_round_trip_ns);
  else
    printf(",\"remote_sync_round_trip_ns\":null}");
  const struct tr_trace_bound_track *bt = tr_trace_bounds_find(&r->bounds, h->name);
  if (h->name[0] && bt && bt->n_samples)
    printf(",\"clock_error_bound_track\":{\"samples\":%zu,\"largest_us\":%.3f,"
           "\"at_end_us\":%.3f}",
           bt->n_samples, bt->max_us, bt->samples[bt->n_samples - 1].us);
  else
    printf(",\"clock_error_bound_track\":null");
  printf(",\"host_track_marks_total\":%" PRIu64 ",\"host_track_marks\":[",
         h->name[0] && bt ? bt->marks_total : 0);
  for (size_t i = 0; h->name[0] && bt && i < bt->n_marks; i++) {
    printf("%s{\"ts\":%" PRIu64 ",\"name\":", i ? "," : "", bt->marks[i].ts);
    put_json_str(stdout, bt->marks[i].name);
    printf("}");
  }
  printf("]");
  printf(",\"skipped_after_loss\":%" PRIu64, h->skipped_after_loss);
  printf(",\"unresolved\":%" PRIu64 ",\"unresolved_offsets\":[", h->unresolved);
  for (size_t i = 0; i < h->n_unresolved_offsets; i++)
    printf("%s%" PRIu64, i ? "," : "", h->unresolved_offsets[i]);
  printf("]}");
}

static void print_json(const struct opts *o, const struct tr_inspect_result *r,
                       const struct order_check *order, int *order_rc) {
  char clock[24];
  clock_label(r->trace_clock, clock, sizeof(clock));
  printf("%s\"file\":", o->packets ? "\n ],\n " : "{");
  put_json_str(stdout, o->path);
  printf(",\"bytes\":%" PRIu64 ",\"packets\":%" PRIu64 ",\"trace_clock\":%" PRIu32
         ",\"trace_clock_name\":\"%s\",\"clock_snapshots\":%" PRIu64
         ",\"snapshots_rejected\":%" PRIu64 ",\"remote_clock_syncs\":%" PRIu64
         ",\"sync_edges\":%" PRIu64 ",\"zlib_packets\":%" PRIu64 ",\"zstd_packets\":%" PRIu64
         ",\"undecodable_packets\":%" PRIu64 ",\"missing\":",
         r->bytes, r->packets, r->trace_clock, clock, r->clock_snapshots, r->snapshots_rejected,
         r->remote_clock_syncs, r->sync_edges, r->zlib_packets, r->zstd_packets,
         r->undecodable_packets);
  put_json_str(stdout, r->missing);
  printf(",\n \"hosts\":[");
  for (size_t i = 0; i < r->n_hosts; i++) {
    printf("%s\n  ", i ? "," : "");
    print_host_json(r, &r->hosts[i]);
  }
  printf("\n ],\n \"service_marks_total\":%" PRIu64 ",\"service_marks\":[", r->service_marks_total);
  for (size_t i = 0; i < r->n_service_marks; i++) {
    printf("%s{\"ts\":%" PRIu64 ",\"name\":", i ? "," : "", r->service_marks[i].ts);
    put_json_str(stdout, r->service_marks[i].name);
    printf("}");
  }
  printf("]");
  if (order) {
    printf(",\n \"order_check\":");
    *order_rc = order_check_report(order, r, true, stdout);
  }
  printf("}\n");
}

static void print_host_text(const struct tr_inspect_result *r, const struct tr_inspect_host *h) {
  char a[32], b[32];
  printf("\nhost machine %" PRIu32, h->machine_id);
  if (h->domain)
    printf(" clock domain 0x%08" PRIx32, h->domain);
  printf(" (");
  put_text(stdout, h->name[0] ? h->name : "unnamed");
  printf(")\n  sequences (packets):");
  for (size_t i = 0; i < h->n_seqs; i++)
    printf(" %" PRIu32 " (%" PRIu64 ")", h->seqs[i].seq_id, h->seqs[i].packets);
  printf("\n  clock:  ");
  if (h->has_mapping) {
    seconds(a, sizeof(a), h->offset_ns < 0 ? -h->offset_ns : h->offset_ns);
    seconds(b, sizeof(b), (int64_t)h->mapping_span_ns);
    printf("trace time = BOOTTIME %c %s s, drift %+.3f ppm over %s s",
           h->offset_ns < 0 ? '-' : '+', a, h->drift_ppm, b);
  } else {
    printf("no mapping to the trace clock");
  }
  /* The bound figures a trace holds (docs/timeline.md, "Clock error bound: three figures"). */
  const struct tr_trace_bound_track *bt = tr_trace_bounds_find(&r->bounds, h->name);
  if (h->on_trace_clock)
    printf("\n  clock error bound: 0 (its clock is the trace clock)");
  else if (h->name[0] && bt && bt->n_samples)
    printf("\n  clock error bound: largest %.3f us, at the end %.3f us (its bound track, %zu "
           "samples)", bt->max_us, bt->samples[bt->n_samples - 1].us, bt->n_samples);
  else
    printf("\n  clock error bound: unknown (no bound track)");
  if (h->has_sync_offset) {
    printf("\n  last remote_clock_sync: offset %" PRId64 " ns", h->sync_offset_ns);
    if (h->sync_round_trip_ns >= 0)
      printf(", round trip %.3f us", (double)h->sync_round_trip_ns / 1e3);
  }
  if (h->name[0] && bt && bt->marks_total)
    printf("\n  link marks on its track: %" PRIu64, bt->marks_total);
  if (h->skipped_after_loss)
    printf("\n  %" PRIu64 " packets skipped after a loss (they need incremental state the loss "
           "broke, as trace_processor skips them, until the sequence clears it)",
           h->skipped_after_loss);
  const struct tr_inspect_losses *l = &h->losses;
  printf("\n  losses: %" PRIu64 " chunks (%" PRIu64 " bytes) overwritten, %" PRIu64
         " chunks discarded, %" PRIu64 " ABI violations, %" PRIu64 " writer packet losses, %" PRIu64
         " patches failed, %" PRIu64 " invalid packets, %" PRIu64
         " previous_packet_dropped\n",
         l->chunks_overwritten, l->bytes_overwritten, l->chunks_discarded, l->abi_violations,
         l->trace_writer_packet_loss, l->patches_failed, l->invalid_packets,
         l->previous_packet_dropped);
  if (l->has_host_stats)
    printf("  relay:  %s; this session: %" PRIu64 " disconnects, %" PRIu64 " flushes missed, %" PRIu64
           " chunks refused, %" PRIu64 " times a producer's shared memory was full (each a loss, "
           "packet count unknown; full for at most %" PRIu64 " ms in all); service lifetime: "
           "link lost %" PRIu64 " chunks (%" PRIu64
           " bytes), agent dropped %" PRIu64 " queued + %" PRIu64 " spilled chunks, %" PRIu64
           " SMB full, %" PRIu64 " ABI violations, %" PRIu64 " flushes missed\n",
           l->connected ? "connected" : "disconnected", l->session_disconnects,
           l->session_flushes_missed, l->session_chunks_refused, l->session_smb_full,
           l->session_smb_full_ms, l->link_lost_chunks,
           l->link_lost_bytes, l->agent_queue_dropped_chunks, l->agent_spill_dropped_chunks,
           l->agent_smb_full, l->agent_abi_violations, l->flushes_missed);
  if (l->session_instances_not_started)
    printf("  relay:  %" PRIu64 " data source instance(s) never started on this host: their "
           "data is missing\n",
           l->session_instances_not_started);
  if (l->session_agent_exits_unclean)
    printf("  relay:  its agent was replaced %" PRIu64 " time(s) without an orderly stop "
           "(killed or crashed): what its producers had written and it had not relayed is "
           "lost, packet count unknown; its sequences end early\n",
           l->session_agent_exits_unclean);
  if (l->session_stops_timed_out)
    printf("  relay:  %" PRIu64 " data source instance(s) had not confirmed their stop when "
           "the session's stop timeout ran out: their last data, and what the agent still had "
           "queued behind it, may be missing (packet count unknown)\n",
           l->session_stops_timed_out);
  if (l->session_exit_unscraped_chunks)
    printf("  relay:  %" PRIu64 " chunk(s) of producers that left (exited or crashed) could not "
           "be scraped from their shared memory: lost\n",
           l->session_exit_unscraped_chunks);
  if (l->session_producers_closed)
    printf("  relay:  its agent closed %" PRIu64 " producer connection(s) during the session "
           "(stalled, misbehaving: the agent's log says why): what they wrote after is missing\n",
           l->session_producers_closed);
  for (size_t i = 0; i < l->num_disconnected_at; i++)
    printf("  relay:  link down during this session at %" PRIu64 " ns (trace clock)\n",
           l->disconnected_at_ns[i]);
  if (h->unresolved) {
    printf("  unresolved: %" PRIu64 " timestamps, first at byte offsets", h->unresolved);
    for (size_t i = 0; i < h->n_unresolved_offsets; i++)
      printf(" %" PRIu64, h->unresolved_offsets[i]);
    printf("\n");
  }
}

static void print_text(const struct opts *o, const struct tr_inspect_result *r) {
  char clock[24];
  clock_label(r->trace_clock, clock, sizeof(clock));
  printf("%s%s: %" PRIu64 " bytes, %" PRIu64 " packets, trace clock %s\n", o->packets ? "\n" : "",
         o->path, r->bytes, r->packets, clock);
  printf("clock snapshots %" PRIu64 " (%" PRIu64 " rejected), remote_clock_sync %" PRIu64
         " (%" PRIu64 " edges)",
         r->clock_snapshots, r->snapshots_rejected, r->remote_clock_syncs, r->sync_edges);
  if (r->zlib_packets || r->zstd_packets)
    printf(", compressed packets %" PRIu64 " zlib + %" PRIu64 " zstd", r->zlib_packets,
           r->zstd_packets);
  if (r->undecodable_packets)
    printf(", %" PRIu64 " undecodable packets skipped (first at byte %" PRIu64 ")",
           r->undecodable_packets, r->first_undecodable_offset);
  if (r->missing[0]) {
    printf("\nconfig: ");
    put_text(stdout, r->missing);
  }
  printf("\n\n%-10s %-10s %-28s %8s %5s %20s %20s %10s\n", "machine", "domain", "name",
         "packets", "seqs", "first (s)", "last (s)", "unresolved");
  for (size_t i = 0; i < r->n_hosts; i++) {
    const struct tr_inspect_host *h = &r->hosts[i];
    char first[32] = "-", last[32] = "-", dom[16] = "-", name[29];
    if (h->has_range) {
      seconds(first, sizeof(first), h->first_ts);
      seconds(last, sizeof(last), h->last_ts);
    }
    if (h->domain)
      snprintf(dom, sizeof(dom), "0x%08" PRIx32, h->domain);
    snprintf(name, sizeof(name), "%.28s", h->name[0] ? h->name : "-");
    printf("%-10" PRIu32 " %-10s ", h->machine_id, dom);
    put_text(stdout, name);
    printf("%*s %8" PRIu64 " %5zu %20s %20s %10" PRIu64 "\n", (int)(28 - strlen(name)), "",
           h->packets, h->n_seqs, first, last, h->unresolved);
  }
  for (size_t i = 0; i < r->n_hosts; i++)
    print_host_text(r, &r->hosts[i]);
  if (r->service_marks_total)
    printf("\nservice marks (%" PRIu64 "):\n", r->service_marks_total);
  for (size_t i = 0; i < r->n_service_marks; i++) {
    char at[32];
    seconds(at, sizeof(at), (int64_t)r->service_marks[i].ts);
    printf("  %20s  ", at);
    put_text(stdout, r->service_marks[i].name);
    printf("\n");
  }
}

static int parse(int argc, char **argv, struct opts *o) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json"))
      o->json = true;
    else if (!strcmp(argv[i], "--packets"))
      o->packets = true;
    else if (!strcmp(argv[i], "--check-order"))
      o->check_order = true;
    else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
      return 1;
    else if (argv[i][0] == '-' && argv[i][1]) {
      fprintf(stderr, "tracerelay inspect: unknown option '%s' (see --help)\n", argv[i]);
      return -1;
    } else if (o->path) {
      fprintf(stderr, "tracerelay inspect: one trace at a time ('%s' and '%s'); concatenate "
                      "shards with cat first\n", o->path, argv[i]);
      return -1;
    } else {
      o->path = argv[i];
    }
  }
  if (!o->path) {
    fprintf(stderr, "tracerelay inspect: which trace? usage: tracerelay inspect TRACE [--json] "
                    "[--packets]\n");
    return -1;
  }
  return 0;
}

static void report_error(const char *path, int rc, const struct tr_inspect_result *r) {
  if (!r->error.code) {
    fprintf(stderr, "tracerelay inspect: %s: %s\n", path, tr_strerror(rc));
    return;
  }
  fprintf(stderr, "tracerelay inspect: %s: malformed trace at byte %" PRIu64, path,
          r->error.offset);
  if (r->error.inner >= 0)
    fprintf(stderr, " (inside the compressed packet there, at byte %" PRId64 " of its content)",
            r->error.inner);
  fprintf(stderr, ": %s\n", r->error.what);
}

/* Prints the summary of a trace that read in full, with the order check's verdict when asked;
 * returns the order check's result (< 0 out of memory, > 0 flows out of order). */
static int print_summary(const struct opts *o, const struct tr_inspect_result *res,
                         const struct order_check *order) {
  int order_rc = 0;
  if (o->json) {
    print_json(o, res, order, &order_rc);
  } else {
    print_text(o, res);
    if (order)
      order_rc = order_check_report(order, res, false, stdout);
  }
  return order_rc;
}

/* Inspects len bytes and prints the summary; returns the exit status. An empty file and a file
 * without one packet fail; so do a file cut short (a record running past the end, as a service
 * or record killed mid-write leaves) and one corrupt further on, but for those the summary of
 * the whole records before the bad one is printed first, so what survived can still be seen. */
static int inspect_mapped(const struct opts *o, const uint8_t *data, size_t len) {
  struct tr_inspect_result res;
  struct printer pr = {.o = o};
  if (o->check_order && (pr.order = order_check_new()) == NULL) {
    fprintf(stderr, "tracerelay inspect: out of memory\n");
    return 1;
  }
  if (o->json && o->packets)
    printf("{\"points\":[");
  int rc = tr_inspect_trace(data, len, o->packets || pr.order ? on_point : NULL, &pr, &res);
  int order_rc = 0;
  if (rc < 0 && res.error.code && res.error.offset > 0 && res.error.offset < len) {
    struct tr_inspect_result part;
    uint64_t at = res.error.offset;
    bool cut = res.error.inner < 0 && res.error.what &&
               (strstr(res.error.what, "past the end") || !strncmp(res.error.what, "truncated", 9));
    order_check_free(pr.order);
    pr.order = o->check_order ? order_check_new() : NULL;
    pr.points = 0;
    if (tr_inspect_trace(data, (size_t)at, o->packets || pr.order ? on_point : NULL, &pr,
                         &part) == 0)
      order_rc = print_summary(o, &part, pr.order);
    fflush(stdout);
    if (cut) {
      fprintf(stderr, "tracerelay inspect: %s: truncated trace at byte %" PRIu64 ": %s (the "
                      "file ends at byte %zu); the summary covers the %" PRIu64 " bytes before "
                      "it\n", o->path, at, res.error.what, len, at);
    } else {
      report_error(o->path, rc, &res);
      fprintf(stderr, "tracerelay inspect: %s: the summary covers its first %" PRIu64
              " bytes, the part that reads\n", o->path, at);
    }
    tr_inspect_result_free(&part);
  } else if (rc < 0) {
    fflush(stdout);
    report_error(o->path, rc, &res);
  } else if (res.packets == 0) {
    fflush(stdout);
    fprintf(stderr, "tracerelay inspect: %s: %s: not a trace (was the recording cut off?)\n",
            o->path, len ? "no trace packets" : "empty file");
    rc = -1;
  } else {
    order_rc = print_summary(o, &res, pr.order);
  }
  if (order_rc < 0)
    fprintf(stderr, "tracerelay inspect: %s: the order check ran out of memory\n", o->path);
  order_check_free(pr.order);
  tr_inspect_result_free(&res);
  return rc < 0 || order_rc < 0 ? 1 : order_rc > 0 ? 3 : 0;
}

int cmd_inspect(int argc, char **argv) {
  struct opts o = {0};
  int rc = parse(argc, argv, &o);
  if (rc) {
    if (rc > 0)
      cmd_inspect_usage(stdout);
    return rc > 0 ? 0 : 2;
  }
  int fd = open(o.path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) < 0) {
    fprintf(stderr, "tracerelay inspect: cannot read %s: %s\n", o.path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return 1;
  }
  size_t len = (size_t)st.st_size;
  void *data = len ? mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (data == MAP_FAILED) {
    fprintf(stderr, "tracerelay inspect: cannot map %s: %s\n", o.path, strerror(errno));
    return 1;
  }
  rc = inspect_mapped(&o, data, len);
  if (data)
    munmap(data, len);
  if (fflush(stdout) != 0) {
    fprintf(stderr, "tracerelay inspect: writing the output failed: %s\n", strerror(errno));
    return 1;
  }
  return rc;
}
