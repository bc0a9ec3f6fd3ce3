/* session_priv.h: the inside of a tracing session (session.h), for the session module's own
 * files only: session.c, which alone writes these fields (but for a clone's host entries,
 * instances and the central buffers it copies or moves, which session_clone.c writes), and
 * session_admit.c, session_flush.c, session_stats.c and session_unmatched.c, which read them. Any other file
 * goes through session.h's functions. */
#ifndef TR_SESSION_PRIV_H
#define TR_SESSION_PRIV_H

#include <regex.h>

#include "relay/trace/trace_buffer.h"
#include "service/session.h"

enum tr_ds_state { TR_DS_SETUP, TR_DS_STARTING, TR_DS_STARTED, TR_DS_STOPPING, TR_DS_STOPPED };

typedef struct tr_ds_instance {
  uint64_t id;
  size_t host_index;
  size_t cfg_index; /* which TraceConfig data source made it */
  uint32_t producer_id;
  char *producer_name;
  char *ds_name;
  bool handles_clear; /* descriptor: handles_incremental_state_clear */
  bool no_flush;
  enum tr_ds_state state;
  bool was_started;          /* it reached TR_DS_STARTED once */
  uint64_t pending_request; /* the start or stop awaiting its CommandReply; 0 none */
  size_t next_of_entry;     /* 1 + the index of its host entry's next instance; 0 for none */
} tr_ds_instance;

#define TR_SESSION_MAX_DISCONNECT_MARKS 16

/* One host in a session. A restarted agent (new agent_instance_id) gets a new entry, so its
 * producer ids, central buffers and sequences never mix with its previous life's. */
typedef struct tr_session_host {
  tr_host *host;
  uint64_t agent_instance_id; /* the agent instance our instances live on */
  bool gone;                  /* link down */
  bool retired;               /* its agent restarted: a newer entry took over */
  /* It joined past the service's buffer budget (tr_session_admit_host_fits): no central
   * buffer is made for it, its chunks are refused and counted in chunks_refused. */
  bool over_budget;
  tr_tbuf **tbufs;            /* [num_buffers], made on the first chunk */
  uint64_t chunks_refused;
  uint64_t smb_full_at_start; /* the host's agent_smb_full when it joined the session */
  uint64_t smb_full_ns_at_start; /* and its agent_smb_full_ns */
  uint64_t smb_full_at_end;      /* both when it was retired: its successor counts on */
  uint64_t smb_full_ns_at_end;
  /* Per buffer of the session, what the host's agent had dropped of its chunks when the entry
   * joined, and when it was retired: the entry's own losses lie between. */
  tr_host_buffer_drops *drops_at_start; /* [num_buffers] */
  tr_host_buffer_drops *drops_at_end;   /* [num_buffers], set when retired */
  uint64_t disconnects;
  uint64_t agent_exits_unclean; /* its agent instance was replaced without an orderly stop */
  uint64_t stops_timed_out;     /* its instances still stopping when the stop timeout ran out */
  uint64_t disconnected_at[TR_SESSION_MAX_DISCONNECT_MARKS]; /* tr_session_now() of the first */
  size_t num_disconnected_at;
  /* Its instances in the order they were made, as a chain through next_of_entry (1 + the
   * index of the first and the last, 0 for none): a host's instances are found without a
   * walk over every host's (a session of 10,000 hosts answered each of its 20,000 setup and
   * start replies with a walk over 10,000 instances). */
  size_t first_instance, last_instance;
  size_t older_entry; /* 1 + the index of the same host's entry before this one; 0 for none */
} tr_session_host;

typedef struct tr_session_buffer {
  uint32_t global_id;
  size_t size;
  enum tr_tbuf_policy policy;
} tr_session_buffer;

/* What a session's triggers did so far: session_triggers.c's alone; NULL without a
 * trigger_config. */
typedef struct tr_session_triggers tr_session_triggers;

/* The session's flushes in flight and what they came to: session_flush.c's alone. */
typedef struct tr_session_flushes tr_session_flushes;

/* One tracing session; every field written by session.c alone. */
struct tr_session {
  tr_service *svc;
  tr_session *next;
  uint64_t id;
  uid_t consumer_uid;
  Perfetto__Protos__TraceConfig *cfg; /* owned */
  /* cfg's data_source_stop_timeout_ms and flush_timeout_ms, or TR_SESSION_DEFAULT_TIMEOUT_MS
   * where it gives none: resolved once, at enable. */
  uint32_t stop_timeout_ms, flush_timeout_ms;
  /* How it flushes its producers (config_check.h's flush plan of flush_period_ms and
   * write_flush_mode), resolved at enable too: every flush_period_ms (0: never), and/or before
   * each periodic write into its file. */
  uint32_t flush_period_ms;
  bool flush_on_write;
  enum tr_session_state state;
  tr_session_buffer *buffers;
  size_t num_buffers;
  uint64_t bytes_per_host; /* the sum of its buffers' sizes: one host's central buffers */
  uint64_t reserved;       /* its part of svc->buffer_memory_reserved */
  tr_session_host *hosts;
  size_t num_hosts;
  /* By host (tr_hosts_ordinal): 1 + the index of its newest entry in hosts, 0 for none. */
  size_t *entry_of;
  size_t cap_entry_of;
  uint64_t host_entries_examined; /* by tr_session_find_host (for the tests of its cost) */
  tr_ds_instance *instances;
  size_t num_instances;
  size_t cap_instances;
  /* Instances in TR_DS_SETUP or TR_DS_STARTING, and in TR_DS_STOPPING (kept by session.c's
   * set_state, the only writer of an instance's state). */
  size_t num_starting, num_stopping;
  uint64_t instances_examined; /* by the walks over a host's instances (for the tests of their
                                  cost) */
  bool all_started;
  tr_trace_output *output; /* the read side: owned, never NULL once enabled */
  tr_session_flushes *flushes; /* owned; NULL only while tr_session_enable builds it */
  uv_timer_t duration_timer, flush_timer, clear_timer, stop_timer;
  uv_timer_t trigger_timer; /* session_triggers.c's: a START_TRACING timeout, a stop delay */
  tr_session_triggers *triggers; /* owned */
  unsigned timers_open;
  bool duration_flushing;
  tr_session_observer obs;
  void *obs_ud;
  char *detach_key;
  bool freeing;
  /* Stopped, its file's final pass being written: the end is announced (log, observer) when
   * it is in the file, with this error (owned, NULL for none). */
  bool file_pending;
  char *end_error;
  bool read_only; /* a clone (session_clone.c): no instances run, no chunk comes */
};

/* session.c's side of a clone (session_clone.c, which fills its host entries, instances and
 * flush counts): a read-only session owned by consumer_uid, of cfg (copied), with new buffer
 * ids, src's read side cloned (trace_output.h) and no host entry yet, in the service's list,
 * STARTED until its maker calls tr_session_end. TR_ERR_FULL (too many sessions), TR_ERR_NOMEM. */
int tr_session_new_read_only(tr_session *src, uid_t consumer_uid,
                             const Perfetto__Protos__TraceConfig *cfg, tr_session **out);

/* The session host entry for a host (its newest, when its agent restarted); NULL if the host
 * never joined the session. */
tr_session_host *tr_session_find_host(tr_session *s, const tr_host *host, size_t *index);
/* 1 + the index of host's newest entry, 0 if it never joined; the entries before it follow
 * through older_entry (a status call or a scrape reads every host's entries this way). */
size_t tr_session_newest_entry(const tr_session *s, const tr_host *host);
void tr_session_add_event(tr_session *s, enum tr_trace_writer_event ev);
/* Sends cmd to the agent of host entry host_index, with a new request id: TR_ERR_CLOSED when
 * that entry is gone or retired. */
int tr_session_send(tr_session *s, size_t host_index, Tracerelay__Command *cmd);
uint64_t tr_session_now(void);
/* The service-wide parts of a flush (session.c's): its id, unique over the service's life so
 * that an ack names one flush, its duration, from the request to the last ack or the
 * timeout, for the service's flush duration histogram, and the service's own part of it. */
uint64_t tr_session_next_flush_id(tr_session *s);
void tr_session_observe_flush(tr_session *s, double seconds);
void tr_session_observe_flush_service_part(tr_session *s, double seconds);

/* A producer_name_regex (filter or trigger) as a full match: 0, or TR_ERR_CONFIG if it is
 * not a POSIX extended regex. */
int tr_session_regex_compile(const char *pattern, regex_t *re);
/* Flushes every host, then stops the session (at its duration's end, or a trigger's). */
void tr_session_stop_after_flush(tr_session *s);
/* Starts a session that waited for a START_TRACING trigger, to run duration_ms (0: until it
 * is stopped). */
void tr_session_start_triggered(tr_session *s, uint32_t duration_ms);

/* session_triggers.c's side: the session's trigger state from its config (*out NULL without
 * trigger_config; 0 or TR_ERR_NOMEM), freed with the session; whether the session waits for
 * a START_TRACING trigger, and the duration it runs (traced's: trigger_timeout_ms for
 * STOP_TRACING and CLONE_SNAPSHOT); _enabled once the session is made (withholds its trace,
 * arms the START_TRACING timeout); whether a STOP_TRACING trigger's stop is under way (the
 * duration's end then leaves the stop to it). */
int tr_session_triggers_new(const Perfetto__Protos__TraceConfig *cfg, tr_session_triggers **out);
void tr_session_triggers_free(tr_session_triggers *t);
bool tr_session_triggers_wait_to_start(const Perfetto__Protos__TraceConfig *cfg);
uint32_t tr_session_triggers_duration_ms(const Perfetto__Protos__TraceConfig *cfg);
void tr_session_triggers_enabled(tr_session *s);
bool tr_session_triggers_stop_pending(const tr_session *s);
void tr_session_triggers_service_free(tr_service *svc);

/* session_admit.c's side. Whether a session of cfg for a consumer of uid may join svc's
 * sessions, as traced decides: refused (TR_ERR_CONFIG, or TR_ERR_FULL for the per-uid limit;
 * err filled with traced's text) when an exclusive session of priority >= cfg's exists, when
 * one of cfg's session_semaphores is held by more running sessions than the smallest
 * max_other_session_count allows, or when uid has TR_SESSION_MAX_SESSIONS_PER_UID sessions
 * already. An exclusive cfg (exclusive_prio above every session's) passes the last two:
 * tr_session_admit_preempt ends the others. */
int tr_session_admit_check(const tr_service *svc, uid_t uid,
                           const Perfetto__Protos__TraceConfig *cfg, char *err, size_t err_len);
/* For an admitted exclusive cfg: stops every other session still running, telling its
 * consumer "Aborted due to user requested higher-priority (N) exclusive session." (traced
 * frees them; here what they recorded stays readable until their consumers free them). */
void tr_session_admit_preempt(tr_service *svc, const Perfetto__Protos__TraceConfig *cfg);
/* The buffer budget (svc->max_buffer_memory; none when 0). _budget: whether cfg's buffers on
 * every connected host, with what the sessions reserve already, stay within it: 0, or
 * TR_ERR_CONFIG with the product in err ("buffers of 2 x 512 MiB on each of 40 hosts = 40
 * GiB ..."). _host_fits: whether one more host entry of session s does; if not, says so in
 * the log (once: the caller marks the entry over_budget). O(buffers) and O(hosts). */
int tr_session_admit_budget(const tr_service *svc, const Perfetto__Protos__TraceConfig *cfg,
                            char *err, size_t err_len);
bool tr_session_admit_host_fits(const tr_session *s, const tr_host *host);
/* Whether a clone whose central buffers take `bytes` fits the budget with what the sessions
 * (clones among them) reserve: 0, or TR_ERR_CONFIG with why in err. */
int tr_session_admit_clone(const tr_service *svc, uint64_t bytes, char *err, size_t err_len);

/* session_flush.c's side. The session's flush bookkeeping: made with it (0 or TR_ERR_NOMEM),
 * grown with each host entry (likewise), and freed with it, after every flush still pending
 * was told ok = false. */
int tr_session_flush_new(tr_session_flushes **out);
int tr_session_flush_add_host(tr_session *s);
void tr_session_flush_free(tr_session_flushes *fl);
/* A clone's flush bookkeeping (session_clone.c): src's counts, the flush that made the clone as
 * the final flush's outcome (flush_ok), and each host entry's missed flushes (dst has src's
 * entries). 0 or TR_ERR_NOMEM. */
int tr_session_flush_clone(const tr_session *src, tr_session *dst, bool flush_ok);
void tr_session_flush_on_ack(tr_session *s, size_t host_index, const Tracerelay__FlushAck *ack,
                             int64_t arrived_ns);
/* The service's own part of a flush's round trip of total_ns: all of it but the stretch from
 * the fan-out's end (fanned_out_ns) to the last ack's arrival in the service's socket
 * (last_arrival_ns; both BOOTTIME, 0 = not known), which the network and the agents took. An
 * ack that arrived before the fan-out ended (a quick agent while others were still being
 * asked) leaves it all to the service. */
uint64_t tr_session_flush_service_part_ns(uint64_t total_ns, int64_t fanned_out_ns,
                                          int64_t last_arrival_ns);
void tr_session_flush_on_host_gone(tr_session *s, size_t host_index);
/* How many of the session's flushes host entry host_index did not answer in time. */
uint64_t tr_session_flush_missed(const tr_session *s, size_t host_index);
/* Instances the session's flushes looked at to fan out (two per started instance a flush). */
uint64_t tr_session_flush_examined(const tr_session *s);

/* session_unstopped.c's side: instances whose stop the agent never confirmed (its link was
 * down, or dropped before the answer). _add asks the agent again now if its link is up, else
 * remembers the instance for _reconnected, which asks the same agent instance again when it is
 * back (and forgets what ran on a restarted one). _free is tr_session_service_free's. */
void tr_session_unstopped_add(tr_service *svc, tr_host *host, uint64_t agent_instance_id,
                              uint32_t producer_id, uint64_t instance_id);
void tr_session_unstopped_reconnected(tr_service *svc, tr_host *host);
void tr_session_unstopped_free(tr_service *svc);
/* Whether a stop waits for host (the host table keeps it). */
bool tr_session_unstopped_holds(const tr_service *svc, const tr_host *host);

#endif
