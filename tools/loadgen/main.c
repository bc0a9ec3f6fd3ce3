/* main.c: tracerelay-loadgen, a Perfetto producer that loads a producer socket as an SDK app
 * does (see --help in options.c). The main thread is the IPC thread: it follows the service's
 * commands (setup_tracing with the SMB fd, setup/start/stop data source, flush, clear
 * incremental state) while writer threads (load.c) fill the shared memory. One data source
 * instance per run; the run ends when the service stops it. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "relay/clock/clock.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "tools/loadgen/commit_latency.h"
#include "tools/loadgen/load.h"
#include "tools/loadgen/options.h"
#include "tools/loadgen/session.h"
#include "tools/loadgen_writer/smb_writer.h"
#include "tools/loadgen/stats.h"

#define COMMAND_WAIT_MS 200

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

typedef struct run {
  const lg_options *opt;
  lg_session session;
  lg_smb smb;
  lg_load load;
  lg_flows flows;
  bool running;
  bool stopped;
  uint64_t instance_id;
  uint64_t start_ns;
  uint64_t end_ns;
  uint64_t stop_due_ns; /* --stop-delay: when the stop asked for is confirmed (0: none asked) */
  bool triggered;       /* --trigger was activated */
  uint64_t connect_ns;  /* when the producer connected */
} run;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int setup_tracing(run *r, const Perfetto__Protos__GetAsyncCommandResponse__SetupTracing *st) {
  int fd = lg_session_take_fd(&r->session);
  if (fd < 0) {
    TR_ERROR("loadgen", "setup_tracing came without a shared memory fd");
    return TR_ERR_PROTO;
  }
  if (r->smb.base) {
    TR_WARN("loadgen", "a second setup_tracing was ignored: the SMB lives as long as the connection");
    close(fd);
    return 0;
  }
  uint32_t page_kb = st->shared_buffer_page_size_kb ? st->shared_buffer_page_size_kb : 4;
  int rc = lg_smb_map(&r->smb, fd, (size_t)page_kb * 1024, r->opt->chunks_per_page);
  close(fd);
  if (rc < 0) {
    TR_ERROR("loadgen", "cannot map the SMB (page %u KiB): %s", page_kb, tr_strerror(rc));
    return rc;
  }
  TR_INFO("loadgen", "shared memory: %zu KiB in pages of %u KiB", r->smb.size >> 10, page_kb);
  if (r->opt->commit_latency && (rc = lg_latency_start(&r->session.latency, &r->smb)) < 0)
    TR_ERROR("loadgen", "cannot start the commit latency sampler: %s", tr_strerror(rc));
  return rc;
}

static int start_data_source(run *r, const Perfetto__Protos__GetAsyncCommandResponse__StartDataSource *sd) {
  const char *name = sd->config && sd->config->name ? sd->config->name : "";
  if (strcmp(name, r->opt->data_source) != 0 || r->running || r->stopped) {
    TR_WARN("loadgen", "start of data source '%s' instance %llu ignored", name,
            (unsigned long long)sd->new_instance_id);
    return 0;
  }
  if (!r->smb.base) {
    TR_ERROR("loadgen", "start_data_source before setup_tracing: no shared memory to write to");
    return TR_ERR_PROTO;
  }
  uint32_t target_buffer = sd->config->target_buffer;
  r->instance_id = sd->new_instance_id;
  int rc = lg_session_notify_started(&r->session, r->instance_id);
  for (unsigned i = 0; rc == 0 && i < r->opt->writers; i++)
    rc = lg_session_register_writer(&r->session, i + 1, target_buffer);
  lg_load_config cfg = {.writers = r->opt->writers, .rate = r->opt->rate,
                        .packet_size = r->opt->packet_size, .duration_s = r->opt->duration_s,
                        .packets = r->opt->packets,
                        .flows = r->opt->flow_send || r->opt->flow_recv ? &r->flows : NULL,
                        .hang = r->opt->hang_after != 0};
  if (rc == 0)
    rc = lg_load_start(&r->load, &cfg, &r->smb, target_buffer, lg_session_queue_commit,
                       &r->session);
  r->running = rc == 0;
  r->start_ns = mono_ns();
  return rc;
}

static int stop_load(run *r) {
  if (!r->running)
    return 0;
  int rc = lg_load_stop(&r->load);
  int sent = lg_session_send_commits(&r->session, 0);
  r->end_ns = mono_ns();
  r->running = false;
  r->stopped = true;
  return rc < 0 ? rc : sent;
}

/* Confirms the stop the service asked for once --stop-delay has passed since. */
static int stop_when_due(run *r) {
  if (!r->stop_due_ns || mono_ns() < r->stop_due_ns)
    return 0;
  int rc = stop_load(r);
  return rc < 0 ? rc : lg_session_notify_stopped(&r->session, r->instance_id);
}

/* Activates --trigger once the data source has run --trigger-after. */
static int trigger_when_due(run *r) {
  bool from_connect = r->opt->trigger_from_connect;
  uint64_t from = from_connect ? r->connect_ns : r->start_ns;
  if (!r->opt->trigger || r->triggered || (!from_connect && !r->running) ||
      mono_ns() < from + (uint64_t)(r->opt->trigger_after_s * 1e9))
    return 0;
  r->triggered = true;
  TR_INFO("loadgen", "activating trigger \"%s\"", r->opt->trigger);
  return lg_session_activate_trigger(&r->session, r->opt->trigger);
}

static int handle(run *r, const Perfetto__Protos__GetAsyncCommandResponse *cmd) {
  switch (cmd->cmd_case) {
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_SETUP_TRACING:
    return setup_tracing(r, cmd->setup_tracing);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_START_DATA_SOURCE:
    return start_data_source(r, cmd->start_data_source);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_STOP_DATA_SOURCE:
    if (!r->running || cmd->stop_data_source->instance_id != r->instance_id || r->stop_due_ns)
      return 0;
    r->stop_due_ns = mono_ns() + (uint64_t)(r->opt->stop_delay_s * 1e9);
    return stop_when_due(r);
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_FLUSH: {
    /* The SDK commits what its writers hold, then acks; moves and patches go first. */
    int rc = r->running ? lg_load_flush(&r->load) : 0;
    return rc < 0 ? rc : lg_session_send_commits(&r->session, cmd->flush->request_id);
  }
  case PERFETTO__PROTOS__GET_ASYNC_COMMAND_RESPONSE__CMD_CLEAR_INCREMENTAL_STATE:
    if (r->running)
      lg_load_clear_incremental_state(&r->load);
    return 0;
  default:
    /* setup_data_source needs nothing before start; unknown commands come from newer peers. */
    return 0;
  }
}

static int report(run *r);

/* --hang-after: every writer stopped inside a packet. What it completed goes out as the SDK's
 * commits would have, the counts are written, and the process waits for its end (SIGKILL: a
 * crash mid-write; a catchable signal ends it as usual, without touching the writers). */
static int hang(run *r) {
  int rc = lg_session_send_commits(&r->session, 0);
  r->end_ns = mono_ns();
  if (rc >= 0)
    rc = report(r);
  TR_INFO("loadgen", "every writer stopped mid-packet after %llu events (--hang-after): "
          "waiting to be killed", (unsigned long long)r->opt->hang_after);
  while (rc >= 0 && !g_signal)
    pause();
  return rc;
}

static int report(run *r) {
  lg_stats st = {0};
  unsigned n = r->load.writers ? r->load.cfg.writers : 0;
  st.writers = calloc(n + 1, sizeof(lg_writer_stats));
  if (!st.writers)
    return TR_ERR_NOMEM;
  for (unsigned i = 0; i < n; i++) {
    const lg_writer *w = &r->load.writers[i];
    lg_writer_stats ws = {.writer_id = w->tw.writer_id, .tw = w->tw.counters,
                          .events_written = w->seq.events_written,
                          .events_dropped = w->seq.events_dropped};
    lg_stats_add(&st, &ws);
  }
  st.commit_data_frames = r->session.commits_sent;
  st.elapsed_s = r->end_ns > r->start_ns ? (double)(r->end_ns - r->start_ns) / 1e9 : 0;
  struct lg_latency_result latency;
  if (r->session.latency) {
    lg_latency_stop(r->session.latency, &latency);
    r->session.latency = NULL;
    st.latency = &latency;
  }
  lg_stats_print(&st, stdout);
  fflush(stdout);
  int rc = r->opt->stats_json ? lg_stats_write_json(&st, r->opt->stats_json) : 0;
  if (rc < 0)
    TR_ERROR("loadgen", "cannot write %s: %s", r->opt->stats_json, tr_strerror(rc));
  free(st.writers);
  return rc;
}

int main(int argc, char **argv) {
  lg_options opt;
  int rc = lg_options_parse(argc, argv, &opt);
  if (rc != 0)
    return rc == 1 ? 0 : 2;
  if (opt.fake_clock && tr_clock_set_fake(opt.fake_offset_ns, opt.fake_drift_ppm) < 0) {
    fprintf(stderr, "tracerelay-loadgen: --fake-clock drift out of range (see --help)\n");
    return 2;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  run r = {.opt = &opt};
  if (lg_flows_open(&r.flows, opt.flow_send, opt.flow_recv) < 0)
    return 2;
  lg_session_config cfg = {.producer_name = opt.producer_name, .data_source = opt.data_source,
                           .page_size_hint = opt.page_size_hint,
                           .smb_size_hint = opt.smb_size_hint, .no_flush = opt.no_flush};
  rc = lg_session_open(&r.session, opt.socket_path, &cfg);
  if (rc < 0) {
    TR_ERROR("loadgen", "cannot start a producer session on %s: %s (is the agent or traced "
             "listening there?)", opt.socket_path, tr_strerror(rc));
    return 1;
  }
  r.connect_ns = mono_ns();
  while (rc >= 0 && !r.stopped && !g_signal) {
    Perfetto__Protos__GetAsyncCommandResponse *cmd = NULL;
    rc = lg_session_next_command(&r.session, COMMAND_WAIT_MS, &cmd);
    if (rc == 1) {
      rc = handle(&r, cmd);
      perfetto__protos__get_async_command_response__free_unpacked(cmd, NULL);
    }
    if (rc >= 0)
      rc = stop_when_due(&r);
    if (rc >= 0)
      rc = trigger_when_due(&r);
    if (rc >= 0 && r.running && opt.hang_after && lg_load_all_hung(&r.load))
      _exit(hang(&r) < 0 ? 1 : 0); /* the writers are stuck mid-packet: no orderly exit */
  }
  if (rc < 0)
    TR_ERROR("loadgen", "producer session on %s ended: %s", opt.socket_path, tr_strerror(rc));
  int stop_rc = stop_load(&r);
  if (rc >= 0 && stop_rc < 0)
    rc = stop_rc;
  int report_rc = report(&r);
  if (r.load.writers)
    lg_load_free(&r.load);
  lg_smb_unmap(&r.smb);
  lg_session_close(&r.session);
  lg_flows_close(&r.flows);
  return rc < 0 || report_rc < 0 || g_signal ? 1 : 0;
}
