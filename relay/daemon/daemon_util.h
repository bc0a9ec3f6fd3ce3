/* daemon_util.h: what the main() of both daemons (tracerelay-agent, tracerelay-service) share,
 * so that they answer bad flags and signals alike.
 *
 * Flags: the messages for a flag getopt_long refused, a bad value, a stray argument, a missing
 * required flag or a config file entry that is no flag, written to stderr as "PROG: ... (see
 * --help)". These functions return an exit status: 0, or 2 (bad flags, as both --help say).
 *
 * Signals: the first SIGTERM or SIGINT starts the daemon's shutdown, later ones are only logged;
 * SIGHUP asks for a reload until the shutdown began. All on the daemon's libuv loop. */
#ifndef TR_DAEMON_UTIL_H
#define TR_DAEMON_UTIL_H

#include <getopt.h>
#include <stdbool.h>
#include <uv.h>

#include "relay/daemon/config_file.h"

/* The flags every daemon has, with these getopt_long values (above any of its own):
 * --log-level LEVEL, --config FILE (read before getopt by tr_config_file_args) and --help. */
enum { TR_DAEMON_OPT_LOG_LEVEL = 1024, TR_DAEMON_OPT_CONFIG, TR_DAEMON_OPT_HELP, TR_DAEMON_OPT_VERSION };

/* getopt_long's optstring for the daemons: no short options, and a leading ':' so that getopt
 * prints nothing itself and returns ':' for a missing value (tr_daemon_common_flag says it,
 * once). */
#define TR_DAEMON_OPTSTRING ":"

/* For a getopt_long result that is none of the daemon's own flags: one of the flags above
 * (--help prints help and exits 0), getopt's ':' for an option that lacks its value, or '?' for
 * one that is unknown or given a value it does not take. 0, or 2 after a message. */
int tr_daemon_common_flag(const char *prog, int opt, const char *help, char *const *argv);
/* A value a flag cannot take; why (may be NULL) says what would do. Returns 2. */
int tr_daemon_bad_value(const char *prog, const char *flag, const char *value, const char *why);
/* --cipher LIST: 0 if LIST names ciphers of relay/link/tls_ciphers.h, else says why (as
 * tr_daemon_bad_value) and returns 2. */
int tr_daemon_cipher_flag(const char *prog, const char *list);
/* Once getopt_long is done: 2 when an argument is left over (optind < argc) or `missing` names
 * a required flag that was not given ("--ca FILE"), else 0. */
int tr_daemon_flags_done(const char *prog, int argc, char *const *argv, const char *missing);
/* The first of the TLS flags both daemons require that was not given ("--ca FILE"), or NULL. */
const char *tr_daemon_missing_tls(const char *ca_path, const char *cert_path,
                                  const char *key_path);
/* The entries of the --config file cf (tr_config_file_args) checked against the daemon's
 * getopt_long table, before getopt sees them, so that an error names the file and its line
 * rather than an argument the user never typed. 0 (also when there is no file), or 2. */
int tr_daemon_check_config(const char *prog, const tr_config_file *cf, int argc,
                           char *const *argv, const struct option *longopts);

typedef struct tr_daemon_signals tr_daemon_signals;
typedef void (*tr_daemon_signal_cb)(tr_daemon_signals *sig);

/* Caller-allocated; the caller sets the fields up to on_hup, then calls tr_daemon_run. */
struct tr_daemon_signals {
  void *data;
  const char *comp;      /* log component: "agent" */
  const char *stop_note; /* logged with the first SIGTERM or SIGINT: "shutting down" */
  const char *again_note; /* logged with a later one: "already shutting down (...)" */
  tr_daemon_signal_cb on_stop; /* the first SIGTERM or SIGINT; ends with tr_daemon_signals_close */
  tr_daemon_signal_cb on_hup;  /* SIGHUP, before stopping; may be NULL */
  bool stopping;
  uv_signal_t term, intr, hup;
};

/* Catches the signals on loop, runs it until nothing is left in it and closes it. Returns the
 * exit status: 0, or 1 when the loop could not be closed. */
int tr_daemon_run(uv_loop_t *loop, tr_daemon_signals *sig);
/* After the daemon failed to start: lets what was started close, closes the loop. Returns 1. */
int tr_daemon_start_failed(uv_loop_t *loop);
/* Stops catching the signals, once the shutdown is done, so that the loop can end. */
void tr_daemon_signals_close(tr_daemon_signals *sig);

#endif
