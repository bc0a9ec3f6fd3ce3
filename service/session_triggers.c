/* session_triggers.c: recording modes driven by triggers (TraceConfig.trigger_config), for the
 * whole cluster, with traced v58.2's rules (its TracingServiceImpl::ActivateTriggers).
 *
 * A trigger is raised anywhere: a producer on any host (ActivateTriggers on its agent's
 * producer socket, relayed as a Trigger frame), or `tracerelay trigger` on the service's own
 * host (consumer_port.c). Each name is matched against every session's triggers: the name,
 * then producer_name_regex (a full match on the producer's name), then skip_probability (a
 * draw in [0, 1) below it skips), then max_per_24_h (the triggers of that name that matched
 * any session in the last 24 hours, service-wide). A match is recorded (a `trigger` packet in
 * the trace, naming the host) and acts on the session, across every host:
 * - START_TRACING: a session waiting for it (CONFIGURED) starts, and stops stop_delay_ms
 *   later; if none comes within trigger_timeout_ms the session ends empty.
 * - STOP_TRACING: the first match flushes every host and stops the session stop_delay_ms
 *   later; later ones are recorded only. The session runs trigger_timeout_ms at most and,
 *   without a trigger, ends empty.
 * - CLONE_SNAPSHOT (or STOP_TRACING with use_clone_snapshot_if_available): every match tells
 *   the session's consumer stop_delay_ms later (ObservableEvents.clone_trigger_hit), which
 *   then clones the session (the perfetto CLI and `tracerelay record` write OUT.0, OUT.1,
 *   ...); the session goes on. At most PENDING_CLONES notifications wait for their delay at
 *   once (more are logged and dropped).
 * Until its first trigger a session's trace is withheld: reading it yields nothing, as traced
 * returns no packet of a session waiting for its trigger; a CLONE_SNAPSHOT session's, always
 * (it is read through its clones). A clone has no triggers. How long a stop takes is bounded
 * by the session's own timeouts: stop_delay_ms, then flush_timeout_ms for the final flush and
 * data_source_stop_timeout_ms for the stops (bench/bench_triggers measures it).
 *
 * Cost: O(sessions x triggers of each) per trigger name, plus the history's purge, amortised
 * O(1); the history holds at most HISTORY_MAX entries (older ones forgotten first, so a
 * trigger of over HISTORY_MAX matches a day can pass max_per_24_h: logged). */
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/fnv1a.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_session.h"
#include "service/session_priv.h"

#define COMP "session"
#define DAY_NS (24ll * 3600 * 1000000000)
#define HISTORY_MAX 4096u
#define PENDING_CLONES 16u

typedef Perfetto__Protos__TraceConfig__TriggerConfig trigger_config;
typedef Perfetto__Protos__TraceConfig__TriggerConfig__Trigger trigger_rule;

enum {
  MODE_NONE = PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER_MODE__UNSPECIFIED,
  MODE_START = PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER_MODE__START_TRACING,
  MODE_STOP = PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER_MODE__STOP_TRACING,
  MODE_CLONE = PERFETTO__PROTOS__TRACE_CONFIG__TRIGGER_CONFIG__TRIGGER_MODE__CLONE_SNAPSHOT,
};

/* Matches of any session, service-wide, oldest first: a ring. */
struct tr_session_trigger_history {
  struct {
    int64_t ts;
    uint64_t name_hash;
  } at[HISTORY_MAX];
  size_t first, n;
  bool overflow_logged;
};

/* A CLONE_SNAPSHOT match waiting for its stop_delay_ms. */
struct pending_clone {
  uint64_t due_ms; /* the loop's clock */
  char name[TR_RELAY_TRIGGER_NAME_MAX + 1], producer[2 * TR_RELAY_TRIGGER_NAME_MAX + 2];
  uint32_t producer_uid;
  uint64_t boot_time_ns, delay_ms;
};

struct tr_session_triggers {
  int mode;
  uint64_t received; /* matches so far */
  struct pending_clone clones[PENDING_CLONES]; /* by due time, [0] the next */
  size_t num_clones;
};

/* traced's GetTriggerMode: use_clone_snapshot_if_available makes a STOP_TRACING
 * session's triggers clone it instead. */
static int mode_of(const Perfetto__Protos__TraceConfig *cfg) {
  const trigger_config *tc = cfg->trigger_config;
  if (!tc)
    return MODE_NONE;
  return tc->use_clone_snapshot_if_available ? MODE_CLONE : (int)tc->trigger_mode;
}

#define CONFIG_ERROR(...)                                                                          \
  do {                                                                                             \
    snprintf(err, err_len, __VA_ARGS__);                                                           \
    return TR_ERR_CONFIG;                                                                          \
  } while (0)

int tr_session_triggers_validate(const Perfetto__Protos__TraceConfig *cfg, char *err,
                                 size_t err_len) {
  const trigger_config *tc = cfg->trigger_config;
  if (!tc)
    return 0;
  int mode = mode_of(cfg);
  /* traced's checks, in its order and with its words. */
  if (mode != MODE_NONE &&
      (tc->trigger_timeout_ms == 0 || tc->trigger_timeout_ms > TR_SESSION_MAX_DURATION_MS))
    CONFIG_ERROR("Traces with START_TRACING triggers must provide a positive "
                 "trigger_timeout_ms "
                 "< 7 days (received %ums)",
                 tc->trigger_timeout_ms);
  if ((int)tc->trigger_mode < 0 || (int)tc->trigger_mode > MODE_CLONE || tc->trigger_mode == 3)
    CONFIG_ERROR("The trace config specified an invalid trigger_mode");
  if (tc->use_clone_snapshot_if_available && (int)tc->trigger_mode != MODE_STOP)
    CONFIG_ERROR("trigger_mode must be STOP_TRACING when "
                 "use_clone_snapshot_if_available=true");
  if (mode != MODE_NONE && cfg->duration_ms != 0)
    CONFIG_ERROR("duration_ms was set, this must not be set for traces with triggers.");
  if ((mode == MODE_STOP || mode == MODE_CLONE) && cfg->write_into_file)
    CONFIG_ERROR("Specifying trigger mode STOP_TRACING/CLONE_SNAPSHOT and "
                 "write_into_file "
                 "together is unsupported");
  for (size_t i = 0; i < tc->n_triggers; i++) {
    const trigger_rule *t = tc->triggers[i];
    const char *name = t->name ? t->name : "";
    for (size_t j = 0; j < i; j++)
      if (strcmp(name, tc->triggers[j]->name ? tc->triggers[j]->name : "") == 0)
        CONFIG_ERROR("Duplicate trigger name: %s", name);
    if (t->producer_name_regex && t->producer_name_regex[0]) {
      regex_t re;
      if (tr_session_regex_compile(t->producer_name_regex, &re) != 0)
        CONFIG_ERROR("trigger_config.triggers[%zu].producer_name_regex \"%s\" "
                     "is not a valid "
                     "POSIX extended regex",
                     i, t->producer_name_regex);
      regfree(&re);
    }
  }
  /* Beyond traced: it accepts these and then never returns data (a session
   * whose triggers have no mode waits for ever; a trigger that can never fire
   * likewise). */
  if (mode == MODE_NONE && tc->n_triggers > 0)
    CONFIG_ERROR("trigger_config has triggers but no trigger_mode: give START_TRACING, "
                 "STOP_TRACING or CLONE_SNAPSHOT");
  return 0;
}

int tr_session_triggers_new(const Perfetto__Protos__TraceConfig *cfg, tr_session_triggers **out) {
  *out = NULL;
  if (mode_of(cfg) == MODE_NONE)
    return 0;
  if (!(*out = calloc(1, sizeof **out)))
    return TR_ERR_NOMEM;
  (*out)->mode = mode_of(cfg);
  return 0;
}

void tr_session_triggers_free(tr_session_triggers *t) { free(t); }

bool tr_session_triggers_wait_to_start(const Perfetto__Protos__TraceConfig *cfg) {
  return mode_of(cfg) == MODE_START;
}

uint32_t tr_session_triggers_duration_ms(const Perfetto__Protos__TraceConfig *cfg) {
  int mode = mode_of(cfg);
  return mode == MODE_STOP || mode == MODE_CLONE ? cfg->trigger_config->trigger_timeout_ms
                                                 : cfg->duration_ms;
}

static void on_start_timeout(uv_timer_t *timer) {
  tr_session *s = timer->data;
  if (s->state != TR_SESSION_CONFIGURED)
    return;
  TR_INFO(COMP, "session %llu: no START_TRACING trigger within %u ms: ending it, empty",
          (unsigned long long)s->id, s->cfg->trigger_config->trigger_timeout_ms);
  tr_session_disable(s);
}

void tr_session_triggers_enabled(tr_session *s) {
  if (!s->triggers || s->read_only)
    return;
  tr_trace_output_withhold(s->output, true);
  if (s->triggers->mode == MODE_START)
    uv_timer_start(&s->trigger_timer, on_start_timeout, s->cfg->trigger_config->trigger_timeout_ms,
                   0);
}

bool tr_session_triggers_stop_pending(const tr_session *s) {
  return s->triggers && s->triggers->mode == MODE_STOP && s->triggers->received > 0;
}

/* ---- matching ---- */

static struct tr_session_trigger_history *history(tr_service *svc) {
  if (!svc->trigger_history)
    svc->trigger_history = calloc(1, sizeof *svc->trigger_history);
  return svc->trigger_history;
}

/* Forgets what is over a day old; returns how many of name_hash are left. */
static size_t count_in_day(struct tr_session_trigger_history *h, int64_t now, uint64_t name_hash) {
  size_t count = 0;
  while (h->n > 0 && h->at[h->first].ts < now - DAY_NS) {
    h->first = (h->first + 1) % HISTORY_MAX;
    h->n--;
  }
  for (size_t i = 0; i < h->n; i++)
    count += h->at[(h->first + i) % HISTORY_MAX].name_hash == name_hash;
  return count;
}

static void remember(struct tr_session_trigger_history *h, int64_t now, uint64_t name_hash) {
  if (h->n == HISTORY_MAX) {
    if (!h->overflow_logged)
      TR_WARN(COMP,
              "over %u triggers matched within 24 hours: the oldest are "
              "forgotten, and "
              "max_per_24_h counts only the newest %u",
              HISTORY_MAX, HISTORY_MAX);
    h->overflow_logged = true;
    h->first = (h->first + 1) % HISTORY_MAX;
    h->n--;
  }
  h->at[(h->first + h->n) % HISTORY_MAX].ts = now;
  h->at[(h->first + h->n) % HISTORY_MAX].name_hash = name_hash;
  h->n++;
}

static const trigger_rule *find_rule(const tr_session *s, const char *name) {
  const trigger_config *tc = s->cfg->trigger_config;
  for (size_t i = 0; tc && i < tc->n_triggers; i++)
    if (tc->triggers[i]->name && strcmp(tc->triggers[i]->name, name) == 0)
      return tc->triggers[i];
  return NULL;
}

static bool producer_matches(const trigger_rule *rule, const char *producer) {
  regex_t re;
  if (!rule->producer_name_regex || !rule->producer_name_regex[0])
    return true;
  if (tr_session_regex_compile(rule->producer_name_regex, &re) != 0)
    return false; /* validated at enable: only out of memory */
  bool match = regexec(&re, producer, 0, NULL, 0) == 0;
  regfree(&re);
  return match;
}

static bool skipped(const trigger_rule *rule) {
  double draw = (double)arc4random() / 4294967296.0; /* [0, 1) */
  return rule->skip_probability > 0 && draw < rule->skip_probability;
}

static void on_stop_delay(uv_timer_t *timer) {
  tr_session *s = timer->data;
  tr_session_stop_after_flush(s);
}

static void on_clone_due(uv_timer_t *timer) {
  tr_session *s = timer->data;
  tr_session_triggers *tr = s->triggers;
  uint64_t now = uv_now(s->svc->loop);
  while (tr->num_clones > 0 && tr->clones[0].due_ms <= now) {
    struct pending_clone c = tr->clones[0];
    memmove(&tr->clones[0], &tr->clones[1], --tr->num_clones * sizeof c);
    struct tr_session_clone_trigger hit = {.trigger_name = c.name,
                                           .producer_name = c.producer,
                                           .producer_uid = c.producer_uid,
                                           .boot_time_ns = c.boot_time_ns,
                                           .delay_ms = c.delay_ms};
    tr_session_clone_trigger_hit(s, &hit);
  }
  if (tr->num_clones > 0)
    uv_timer_start(&s->trigger_timer, on_clone_due, tr->clones[0].due_ms - now, 0);
}

/* Queues the consumer's clone_trigger_hit for stop_delay_ms from now. */
static bool schedule_clone(tr_session *s, const trigger_rule *rule, const char *producer,
                           const struct tr_session_trigger *t, uint64_t boot_ns) {
  tr_session_triggers *tr = s->triggers;
  if (tr->num_clones == PENDING_CLONES) {
    TR_WARN(COMP, "session %llu: %u CLONE_SNAPSHOT triggers wait for their delay: trigger \"%s\" "
            "from %s clones nothing", (unsigned long long)s->id, PENDING_CLONES, t->name, producer);
    return false;
  }
  struct pending_clone c = {.due_ms = uv_now(s->svc->loop) + rule->stop_delay_ms,
                            .producer_uid = t->producer_uid,
                            .boot_time_ns = boot_ns,
                            .delay_ms = rule->stop_delay_ms};
  snprintf(c.name, sizeof c.name, "%s", t->name);
  snprintf(c.producer, sizeof c.producer, "%s", producer);
  size_t at = tr->num_clones;
  while (at > 0 && tr->clones[at - 1].due_ms > c.due_ms)
    at--;
  memmove(&tr->clones[at + 1], &tr->clones[at], (tr->num_clones - at) * sizeof c);
  tr->clones[at] = c;
  tr->num_clones++;
  uv_timer_start(&s->trigger_timer, on_clone_due, tr->clones[0].due_ms - uv_now(s->svc->loop), 0);
  return true;
}

/* The match's effect on s; false if it changed nothing (a START for a started
 * session, a STOP after the first). */
static bool act(tr_session *s, const trigger_rule *rule, const char *producer,
                const struct tr_session_trigger *t, uint64_t now) {
  uint32_t delay = rule->stop_delay_ms;
  switch (s->triggers->mode) {
  case MODE_START:
    if (s->state != TR_SESSION_CONFIGURED)
      return false;
    uv_timer_stop(&s->trigger_timer);
    tr_session_start_triggered(s, delay);
    return true;
  case MODE_STOP:
    if (s->triggers->received > 1 || s->state >= TR_SESSION_STOPPING)
      return false;
    uv_timer_start(&s->trigger_timer, on_stop_delay, delay, 0);
    return true;
  case MODE_CLONE:
    return s->state == TR_SESSION_STARTED && schedule_clone(s, rule, producer, t, now);
  default:
    return false;
  }
}

/* The trace names the host with the producer: Perfetto's Trigger has no field for it. */
static void producer_on_host(const struct tr_session_trigger *t, char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", t->host, t->producer_name);
}

static void record(tr_session *s, const trigger_rule *rule, const struct tr_session_trigger *t,
                   const char *producer, uint64_t now) {
  struct tr_trace_writer_trigger packet = {.trigger_name = t->name,
                                           .producer_name = producer,
                                           .producer_uid = (int32_t)t->producer_uid,
                                           .stop_delay_ms = rule->stop_delay_ms};
  s->triggers->received++;
  if (s->triggers->mode != MODE_CLONE)
    tr_trace_output_withhold(s->output, false);
  tr_trace_output_add_trigger(s->output, now, &packet);
}

static const char *mode_name(int mode) {
  return mode == MODE_START  ? "START_TRACING"
         : mode == MODE_STOP ? "STOP_TRACING"
                             : "CLONE_SNAPSHOT";
}

void tr_session_triggers_activate(tr_service *svc, const struct tr_session_trigger *t) {
  uint64_t now = tr_session_now();
  uint64_t name_hash = tr_fnv1a64(t->name, strlen(t->name));
  struct tr_session_trigger_history *h = history(svc);
  if (!h) {
    TR_ERROR(COMP, "out of memory: trigger \"%s\" from %s/%s is lost", t->name, t->host,
             t->producer_name);
    return;
  }
  size_t in_day = count_in_day(h, (int64_t)now, name_hash);
  bool matched = false;
  char producer[2 * TR_RELAY_TRIGGER_NAME_MAX + 2];
  producer_on_host(t, producer, sizeof producer);
  for (tr_session *s = svc->sessions; s; s = s->next) {
    const trigger_rule *rule = s->triggers ? find_rule(s, t->name) : NULL;
    if (!rule || s->state == TR_SESSION_STOPPED || !producer_matches(rule, t->producer_name))
      continue;
    if (skipped(rule)) {
      TR_INFO(COMP,
              "session %llu: trigger \"%s\" from %s/%s skipped "
              "(skip_probability %g)",
              (unsigned long long)s->id, t->name, t->host, t->producer_name,
              rule->skip_probability);
      continue;
    }
    if (rule->max_per_24_h > 0 && in_day >= rule->max_per_24_h) {
      TR_INFO(COMP,
              "session %llu: trigger \"%s\" from %s/%s ignored: max_per_24_h "
              "%u reached",
              (unsigned long long)s->id, t->name, t->host, t->producer_name, rule->max_per_24_h);
      continue;
    }
    matched = true;
    record(s, rule, t, producer, now);
    if (act(s, rule, producer, t, now))
      TR_INFO(COMP,
              "session %llu: trigger \"%s\" from producer %s on %s: %s, %s in "
              "%u ms",
              (unsigned long long)s->id, t->name, t->producer_name, t->host,
              mode_name(s->triggers->mode),
              s->triggers->mode == MODE_START   ? "starting now, stopping"
              : s->triggers->mode == MODE_STOP ? "stopping"
                                               : "the consumer clones it",
              rule->stop_delay_ms);
  }
  if (matched)
    remember(h, (int64_t)now, name_hash);
  else
    TR_DEBUG(COMP, "trigger \"%s\" from %s/%s matched no session", t->name, t->host,
             t->producer_name);
}

void tr_session_triggers_service_free(tr_service *svc) {
  free(svc->trigger_history);
  svc->trigger_history = NULL;
}
