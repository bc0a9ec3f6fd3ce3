/* daemon_util.c: the flag messages and signal handling both daemons share (see daemon_util.h). */
#include "relay/daemon/daemon_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "relay/base/log.h"
#include "relay/link/tls_ciphers.h"

/* The --config file whose entries are argv[1 .. num_entries] (tr_config_file_args), so that a
 * bad value in it is reported with its file and line, not as if it had been typed. */
static const tr_config_file *g_config;
static const char *g_config_path;

int tr_daemon_bad_value(const char *prog, const char *flag, const char *value, const char *why) {
  int arg = optind - 1; /* the option getopt just returned: "--key=value" from the file */
  fprintf(stderr, "%s: invalid value '%s' for %s%s%s", prog, value, flag, why ? ": " : "",
          why ? why : "");
  if (g_config && arg >= 1 && (size_t)arg <= g_config->num_entries)
    fprintf(stderr, " in config file %s, line %u\n", g_config_path,
            g_config->entries[arg - 1].line);
  else
    fputs(" (see --help)\n", stderr);
  return 2;
}

int tr_daemon_cipher_flag(const char *prog, const char *list) {
  int suites[TR_TLS_MAX_SUITES];
  char why[256];
  if (tr_tls_ciphers_parse(list, suites, why, sizeof why) != 0)
    return tr_daemon_bad_value(prog, "--cipher", list, why);
  return 0;
}

int tr_daemon_common_flag(const char *prog, int opt, const char *help, char *const *argv) {
  switch (opt) {
  case TR_DAEMON_OPT_LOG_LEVEL: {
    enum tr_log_level level;
    if (tr_log_parse_level(optarg, &level) < 0)
      return tr_daemon_bad_value(prog, "--log-level", optarg, NULL);
    tr_log_set_level(level);
    return 0;
  }
  case TR_DAEMON_OPT_CONFIG:
    return 0; /* read by main() before getopt */
  case TR_DAEMON_OPT_HELP:
    fputs(help, stdout);
    exit(0);
  case TR_DAEMON_OPT_VERSION:
    printf("%s %s\n", prog, TR_VERSION);
    exit(0);
  case ':':
    fprintf(stderr, "%s: option '%s' needs a value (see --help)\n", prog, argv[optind - 1]);
    return 2;
  default: /* '?': getopt_long sets optopt to a known option's value, 0 for an unknown one */
    fprintf(stderr, "%s: %s '%s' (see --help)\n", prog,
            optopt ? "this option takes no value:" : "unknown option", argv[optind - 1]);
    return 2;
  }
}

int tr_daemon_flags_done(const char *prog, int argc, char *const *argv, const char *missing) {
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, argv[optind]);
    return 2;
  }
  if (missing) {
    fprintf(stderr, "%s: %s is required (see --help)\n", prog, missing);
    return 2;
  }
  return 0;
}

const char *tr_daemon_missing_tls(const char *ca_path, const char *cert_path,
                                  const char *key_path) {
  return ca_path == NULL     ? "--ca FILE"
         : cert_path == NULL ? "--cert FILE"
         : key_path == NULL  ? "--key FILE"
                             : NULL;
}

int tr_daemon_check_config(const char *prog, const tr_config_file *cf, int argc,
                           char *const *argv, const struct option *longopts) {
  const char *path;
  char err[256];
  if (cf->num_entries == 0 || tr_config_file_find_arg(argc, argv, &path) < 0 || !path)
    return 0;
  g_config = cf;
  g_config_path = path;
  if (tr_config_file_check(cf, longopts, err, sizeof err) == 0)
    return 0;
  fprintf(stderr, "%s: config file %s: %s\n", prog, path, err);
  return 2;
}

static void on_stop_signal(uv_signal_t *s, int signum) {
  tr_daemon_signals *sig = s->data;
  if (sig->stopping) {
    TR_WARN(sig->comp, "signal %d: %s", signum, sig->again_note);
    return;
  }
  sig->stopping = true;
  TR_INFO(sig->comp, "signal %d: %s", signum, sig->stop_note);
  sig->on_stop(sig);
}

static void on_hup_signal(uv_signal_t *s, int signum) {
  (void)signum;
  tr_daemon_signals *sig = s->data;
  if (!sig->stopping && sig->on_hup)
    sig->on_hup(sig);
}

int tr_daemon_run(uv_loop_t *loop, tr_daemon_signals *sig) {
  uv_signal_init(loop, &sig->term);
  uv_signal_init(loop, &sig->intr);
  uv_signal_init(loop, &sig->hup);
  sig->term.data = sig->intr.data = sig->hup.data = sig;
  uv_signal_start(&sig->term, on_stop_signal, SIGTERM);
  uv_signal_start(&sig->intr, on_stop_signal, SIGINT);
  uv_signal_start(&sig->hup, on_hup_signal, SIGHUP);
  uv_run(loop, UV_RUN_DEFAULT);
  return uv_loop_close(loop) == 0 ? 0 : 1;
}

int tr_daemon_start_failed(uv_loop_t *loop) {
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 1;
}

void tr_daemon_signals_close(tr_daemon_signals *sig) {
  uv_close((uv_handle_t *)&sig->term, NULL);
  uv_close((uv_handle_t *)&sig->intr, NULL);
  uv_close((uv_handle_t *)&sig->hup, NULL);
}
