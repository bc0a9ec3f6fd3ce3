/* config_check.c: the table of what the service does with each TraceConfig field, and the
 * EnableTracing checks that need more than one field (config_check.h).
 *
 * The walk goes over the protobuf-c descriptors, so every field the generated code knows is
 * seen; a field set to a value other than its default (a present message, a non-empty string
 * or list, a non-zero number) is looked up by its path of field names from TraceConfig
 * ("buffers.name"). A path missing from the table is refused, so a field added to our protos
 * is refused until someone decides about it (test_config_check walks the descriptors and fails
 * on any such path). Cost: O(fields set * table rows), once per EnableTracing. */
#include "service/config_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define COMP "config"
#define PATH_MAX_LEN 160

enum rule_kind {
  HONOURED, /* acted on, by the service or by the producers it is sent to */
  WALK,     /* a message whose own fields are looked up in turn */
  IGNORED,  /* ignorable: one log line saying why */
  REFUSED,  /* EnableTracing fails, saying what to do instead */
  CHECKED,  /* refused for the values refuse_value picks, honoured otherwise */
};

typedef struct rule {
  const char *path;
  enum rule_kind kind;
  const char *text; /* IGNORED: why nothing is lost; REFUSED, CHECKED: what to do instead */
  bool (*refuse_value)(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);
} rule;

static bool lockdown_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);
static bool clock_not_boottime(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);

#define ANDROID_ONLY "read on Android only (reporting, bugreports, statsd)"

static const rule kRules[] = {
    {"buffers", WALK, NULL, NULL},
    {"buffers.size_kb", HONOURED, NULL, NULL},
    {"buffers.fill_policy", HONOURED, NULL, NULL},
    {"buffers.transfer_on_clone", HONOURED, NULL, NULL},
    {"buffers.clear_before_clone", HONOURED, NULL, NULL},
    {"buffers.name", HONOURED, NULL, NULL},
    {"buffers.experimental_mode", IGNORED,
     "it picks traced's buffer implementation; tracerelay's central buffers keep the same "
     "packets",
     NULL},
    {"data_sources", WALK, NULL, NULL},
    {"data_sources.config", WALK, NULL, NULL},
    {"data_sources.config.name", HONOURED, NULL, NULL},
    {"data_sources.config.target_buffer", HONOURED, NULL, NULL},
    {"data_sources.config.target_buffer_name", HONOURED, NULL, NULL},
    /* Set by the service for each instance, whatever the consumer wrote, as traced does. */
    {"data_sources.config.trace_duration_ms", HONOURED, NULL, NULL},
    {"data_sources.config.tracing_session_id", HONOURED, NULL, NULL},
    {"data_sources.config.stop_timeout_ms", HONOURED, NULL, NULL},
    /* The producers' to act on: sent to them as written. */
    {"data_sources.config.enable_extra_guardrails", HONOURED, NULL, NULL},
    {"data_sources.config.buffer_exhausted_policy", HONOURED, NULL, NULL},
    {"data_sources.config.priority_boost", HONOURED, NULL, NULL},
    {"data_sources.config.prefer_suspend_clock_for_duration", HONOURED, NULL, NULL},
    {"data_sources.config.ftrace_config", HONOURED, NULL, NULL},
    {"data_sources.config.track_event_config", HONOURED, NULL, NULL},
    {"data_sources.config.legacy_config", HONOURED, NULL, NULL},
    /* traced clears it for all but Android's system consumers; producers trust it. */
    {"data_sources.config.session_initiator", REFUSED,
     "only the tracing service may set it; remove it", NULL},
    {"data_sources.producer_name_filter", HONOURED, NULL, NULL},
    {"data_sources.producer_name_regex_filter", HONOURED, NULL, NULL},
    {"data_sources.machine_name_filter", HONOURED, NULL, NULL},
    {"builtin_data_sources", WALK, NULL, NULL},
    {"builtin_data_sources.disable_clock_snapshotting", HONOURED, NULL, NULL},
    {"builtin_data_sources.disable_trace_config", HONOURED, NULL, NULL},
    {"builtin_data_sources.disable_system_info", HONOURED, NULL, NULL},
    {"builtin_data_sources.disable_service_events", HONOURED, NULL, NULL},
    {"builtin_data_sources.primary_trace_clock", CHECKED,
     "the cluster's one timeline is the service's BOOTTIME, which every host's clock is "
     "synchronised to; leave it unset or BOOTTIME",
     clock_not_boottime},
    {"builtin_data_sources.snapshot_interval_ms", HONOURED, NULL, NULL},
    {"builtin_data_sources.prefer_suspend_clock_for_snapshot", IGNORED,
     "a best-effort hint (traced too falls back where no suspend-aware timer exists); "
     "snapshots use the loop's timers",
     NULL},
    /* tracerelay writes neither chunk usage histograms nor extension descriptors. */
    {"builtin_data_sources.disable_chunk_usage_histograms", HONOURED, NULL, NULL},
    {"builtin_data_sources.disable_extension_descriptors", HONOURED, NULL, NULL},
    {"builtin_data_sources.enable_concurrent_session_events", REFUSED,
     "tracerelay writes no ConcurrentSessionEvent packets; leave it unset", NULL},
    {"duration_ms", HONOURED, NULL, NULL},
    {"enable_extra_guardrails", IGNORED,
     "Android statsd's guardrails; tracerelay's own limits apply", NULL},
    {"lockdown_mode", CHECKED,
     "tracerelay does not check producers' uids: limit who can reach the agents' producer "
     "sockets (their mode and group) instead",
     lockdown_set},
    {"producers", REFUSED,
     "the agents size each producer's shared memory from the producer's own hint, else their "
     "--smb-kb; set those instead",
     NULL},
    {"statsd_metadata", IGNORED, ANDROID_ONLY, NULL},
    {"write_into_file", HONOURED, NULL, NULL},
    {"file_write_period_ms", HONOURED, NULL, NULL},
    {"max_file_size_bytes", HONOURED, NULL, NULL},
    {"guardrail_overrides", IGNORED, "Android statsd's guardrails; tracerelay's own limits apply",
     NULL},
    {"deferred_start", HONOURED, NULL, NULL},
    {"flush_period_ms", HONOURED, NULL, NULL},
    {"flush_timeout_ms", HONOURED, NULL, NULL},
    {"notify_traceur", IGNORED, ANDROID_ONLY, NULL},
    {"trigger_config", WALK, NULL, NULL},
    {"trigger_config.trigger_mode", HONOURED, NULL, NULL},
    {"trigger_config.triggers", WALK, NULL, NULL},
    {"trigger_config.triggers.name", HONOURED, NULL, NULL},
    {"trigger_config.triggers.producer_name_regex", HONOURED, NULL, NULL},
    {"trigger_config.triggers.stop_delay_ms", HONOURED, NULL, NULL},
    {"trigger_config.triggers.max_per_24_h", HONOURED, NULL, NULL},
    {"trigger_config.triggers.skip_probability", HONOURED, NULL, NULL},
    {"trigger_config.trigger_timeout_ms", HONOURED, NULL, NULL},
    {"trigger_config.use_clone_snapshot_if_available", HONOURED, NULL, NULL},
    {"activate_triggers", HONOURED, NULL, NULL},
    {"allow_user_build_tracing", IGNORED, "deprecated: a no-op in traced too", NULL},
    {"incremental_state_config", WALK, NULL, NULL},
    {"incremental_state_config.clear_period_ms", HONOURED, NULL, NULL},
    {"unique_session_name", HONOURED, NULL, NULL},
    {"data_source_stop_timeout_ms", HONOURED, NULL, NULL},
    {"compression_type", HONOURED, NULL, NULL},
    {"incident_report_config", IGNORED, ANDROID_ONLY, NULL},
    {"trace_uuid_msb", HONOURED, NULL, NULL},
    {"trace_uuid_lsb", HONOURED, NULL, NULL},
    {"output_path", HONOURED, NULL, NULL},
    {"bugreport_score", IGNORED, ANDROID_ONLY, NULL},
    {"statsd_logging", IGNORED, ANDROID_ONLY, NULL},
    /* Checked whole by the filter's own code (an invalid filter refuses the session). */
    {"trace_filter", HONOURED, NULL, NULL},
    {"android_report_config", IGNORED, ANDROID_ONLY, NULL},
    {"cmd_trace_start_delay", IGNORED,
     "the perfetto CLI's own: it waits before it connects; the service has nothing to do", NULL},
    {"prefer_suspend_clock_for_duration", REFUSED,
     "the service's duration timer does not count time in suspend; leave it unset", NULL},
    {"bugreport_filename", IGNORED, ANDROID_ONLY, NULL},
    {"session_semaphores", WALK, NULL, NULL},
    {"session_semaphores.name", HONOURED, NULL, NULL},
    {"session_semaphores.max_other_session_count", HONOURED, NULL, NULL},
    {"priority_boost", REFUSED,
     "the service does not change its scheduling per session; run it under the policy you "
     "want (chrt, or systemd's CPUSchedulingPolicy=)",
     NULL},
    {"exclusive_prio", HONOURED, NULL, NULL},
    /* Every host is traced by default (docs/compat.md): true asks for just that. */
    {"trace_all_machines", HONOURED, NULL, NULL},
    {"write_flush_mode", HONOURED, NULL, NULL},
    {"fflush_post_write", HONOURED, NULL, NULL},
    /* Checked whole by the compression's own code. */
    {"compression", HONOURED, NULL, NULL},
    /* Echoed into the trace with the config, where trace_processor reads them (as traced). */
    {"trace_attributes", HONOURED, NULL, NULL},
};

static bool lockdown_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  (void)f;
  return ((const Perfetto__Protos__TraceConfig *)m)->lockdown_mode ==
         PERFETTO__PROTOS__TRACE_CONFIG__LOCKDOWN_MODE_OPERATION__LOCKDOWN_SET;
}

static bool clock_not_boottime(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  (void)f;
  return ((const Perfetto__Protos__TraceConfig__BuiltinDataSource *)m)->primary_trace_clock !=
         PERFETTO__PROTOS__BUILTIN_CLOCK__BUILTIN_CLOCK_BOOTTIME;
}

static const rule *find_rule(const char *path) {
  for (size_t i = 0; i < sizeof kRules / sizeof kRules[0]; i++)
    if (strcmp(kRules[i].path, path) == 0)
      return &kRules[i];
  return NULL;
}

/* ---- the walk ---- */

static const void *member(const ProtobufCMessage *m, unsigned offset) {
  return (const char *)m + offset;
}

static bool scalar_nonzero(const ProtobufCFieldDescriptor *f, const void *v) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT64:
  case PROTOBUF_C_TYPE_SINT64:
  case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64:
  case PROTOBUF_C_TYPE_FIXED64:
    return *(const uint64_t *)v != 0;
  case PROTOBUF_C_TYPE_DOUBLE:
    return *(const double *)v != 0;
  case PROTOBUF_C_TYPE_FLOAT:
    return *(const float *)v != 0;
  case PROTOBUF_C_TYPE_BOOL:
    return *(const protobuf_c_boolean *)v != 0;
  default: /* the 32-bit integers and enums */
    return *(const uint32_t *)v != 0;
  }
}

/* Whether f holds a value other than its default in m. */
static bool is_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const void *v = member(m, f->offset);
  if (f->label == PROTOBUF_C_LABEL_REPEATED)
    return *(const size_t *)member(m, f->quantifier_offset) > 0;
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    return *(const uint32_t *)member(m, f->quantifier_offset) == f->id;
  switch (f->type) {
  case PROTOBUF_C_TYPE_MESSAGE:
    return *(const void *const *)v != NULL;
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(const char *const *)v;
    return s != NULL && s[0] != '\0';
  }
  case PROTOBUF_C_TYPE_BYTES:
    return ((const ProtobufCBinaryData *)v)->len > 0;
  default:
    if (f->quantifier_offset && !*(const protobuf_c_boolean *)member(m, f->quantifier_offset))
      return false;
    return scalar_nonzero(f, v);
  }
}

typedef struct walk {
  char *err;
  size_t err_len;
} walk;

static int refuse(walk *w, const char *where, const char *what_instead) {
  snprintf(w->err, w->err_len, "trace_config.%s is not supported by tracerelay: %s", where,
           what_instead);
  return TR_ERR_CONFIG;
}

/* A field m's descriptor does not define: refused, but for a data source's per-source
 * configs (numbers 100 and up), which are the producers'. */
static int check_unknown(walk *w, const char *path, const char *where, uint32_t tag) {
  const char *prefix = where[0] ? "." : "";
  if (strcmp(path, "data_sources.config") == 0) {
    if (tag >= 100)
      return 0;
    if (tag == 12) {
      snprintf(w->err, w->err_len,
               "trace_config.%s.protovm_config is not supported by tracerelay: it runs no "
               "ProtoVM programs; remove it",
               where);
      return TR_ERR_CONFIG;
    }
  }
  snprintf(w->err, w->err_len,
           "trace_config%s%s holds field %u, which Perfetto v58.2 does not define (a newer or "
           "a retired Perfetto's): tracerelay cannot tell what it asks for; remove it",
           prefix, where, (unsigned)tag);
  return TR_ERR_CONFIG;
}

static int walk_message(walk *w, const ProtobufCMessage *m, const char *path, const char *where);

/* Field f of m, set, at path (names only: the table's key) and where (with indices: what the
 * message names). */
static int walk_field(walk *w, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                      const char *path, const char *where) {
  const rule *r = find_rule(path);
  if (!r)
    return refuse(w, where, "it is missing from tracerelay's table of fields (a bug)");
  switch (r->kind) {
  case HONOURED:
    return 0;
  case IGNORED:
    TR_INFO(COMP, "trace_config.%s ignored: %s", where, r->text);
    return 0;
  case REFUSED:
    return refuse(w, where, r->text);
  case CHECKED:
    return r->refuse_value(m, f) ? refuse(w, where, r->text) : 0;
  case WALK:
    break;
  }
  if (f->type != PROTOBUF_C_TYPE_MESSAGE)
    return refuse(w, where, "its table row is wrong (a bug)");
  if (f->label != PROTOBUF_C_LABEL_REPEATED)
    return walk_message(w, *(const ProtobufCMessage *const *)member(m, f->offset), path, where);
  size_t n = *(const size_t *)member(m, f->quantifier_offset);
  const ProtobufCMessage *const *items =
      *(const ProtobufCMessage *const *const *)member(m, f->offset);
  for (size_t i = 0; i < n; i++) {
    char at[PATH_MAX_LEN];
    if (snprintf(at, sizeof at, "%s[%zu]", where, i) >= (int)sizeof at)
      return refuse(w, where, "its path is too long to name (a bug)");
    int rc = walk_message(w, items[i], path, at);
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int walk_message(walk *w, const ProtobufCMessage *m, const char *path, const char *where) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    char p[PATH_MAX_LEN], at[PATH_MAX_LEN];
    if (!is_set(m, f))
      continue;
    if (snprintf(p, sizeof p, "%s%s%s", path, path[0] ? "." : "", f->name) >= (int)sizeof p ||
        snprintf(at, sizeof at, "%s%s%s", where, where[0] ? "." : "", f->name) >= (int)sizeof at)
      return refuse(w, where, "its path is too long to name (a bug)");
    int rc = walk_field(w, m, f, p, at);
    if (rc != 0)
      return rc;
  }
  for (size_t i = 0; i < m->n_unknown_fields; i++) {
    int rc = check_unknown(w, path, where, m->unknown_fields[i].tag);
    if (rc != 0)
      return rc;
  }
  return 0;
}

/* ---- named buffers ---- */

int tr_config_check_refuse(char *err, size_t err_len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_len, fmt, ap);
  va_end(ap);
  return TR_ERR_CONFIG;
}

static bool named(const char *s) { return s != NULL && s[0] != '\0'; }

/* The index of the buffer named name, or n_buffers for none. */
static size_t buffer_named(const Perfetto__Protos__TraceConfig *cfg, const char *name) {
  for (size_t i = 0; i < cfg->n_buffers; i++)
    if (named(cfg->buffers[i]->name) && strcmp(cfg->buffers[i]->name, name) == 0)
      return i;
  return cfg->n_buffers;
}

/* traced's rules and texts: names unique; a name must name a buffer, and agree with a
 * non-zero target_buffer (0 cannot be told from unset). */
static int check_buffer_names(const Perfetto__Protos__TraceConfig *cfg, char *err,
                              size_t err_len) {
  for (size_t i = 0; i < cfg->n_buffers; i++) {
    const char *name = cfg->buffers[i]->name;
    size_t first = named(name) ? buffer_named(cfg, name) : i;
    if (first < i)
      return tr_config_check_refuse(err, err_len,
                     "Duplicate buffer name \"%s\" at index %zu (first occurrence at index %zu)",
                     name, i, first);
  }
  for (size_t i = 0; i < cfg->n_data_sources; i++) {
    const Perfetto__Protos__DataSourceConfig *dsc = cfg->data_sources[i]->config;
    if (!dsc || !named(dsc->target_buffer_name))
      continue;
    const char *ds = dsc->name ? dsc->name : "";
    size_t b = buffer_named(cfg, dsc->target_buffer_name);
    if (b == cfg->n_buffers)
      return tr_config_check_refuse(err, err_len,
                     "Data source \"%s\" specified target_buffer_name \"%s\" which does not "
                     "match any buffer",
                     ds, dsc->target_buffer_name);
    if (dsc->target_buffer > 0 && dsc->target_buffer != b)
      return tr_config_check_refuse(err, err_len,
                     "Data source \"%s\" specified both target_buffer=%u and "
                     "target_buffer_name=\"%s\" (index %zu) but they don't match",
                     ds, dsc->target_buffer, dsc->target_buffer_name, b);
  }
  return 0;
}

uint32_t tr_config_check_target_buffer(const Perfetto__Protos__TraceConfig *cfg,
                                       const Perfetto__Protos__DataSourceConfig *dsc) {
  if (named(dsc->target_buffer_name))
    return (uint32_t)buffer_named(cfg, dsc->target_buffer_name);
  return dsc->target_buffer;
}

int tr_config_check_fields(const Perfetto__Protos__TraceConfig *cfg, char *err, size_t err_len) {
  walk w = {err, err_len};
  int rc = walk_message(&w, &cfg->base, "", "");
  return rc ? rc : check_buffer_names(cfg, err, err_len);
}

/* ---- flushes ---- */

void tr_config_check_flush_plan(const Perfetto__Protos__TraceConfig *cfg, uint64_t session_id,
                                struct tr_config_flush_plan *out) {
  *out = (struct tr_config_flush_plan){.period_ms = cfg->flush_period_ms};
  if (!cfg->write_into_file)
    return;
  uint32_t write_ms = cfg->file_write_period_ms ? cfg->file_write_period_ms
                                                : TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS;
  out->fflush = cfg->fflush_post_write ==
                PERFETTO__PROTOS__TRACE_CONFIG__FFLUSH_MODE__FFLUSH_ENABLED;
  switch (cfg->write_flush_mode) {
  case PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_DISABLED:
    return;
  case PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_ENABLED:
    out->period_ms = 0;
    out->on_write = true;
    break;
  default: /* AUTO, and unset: a short write period gets flushes at the default period, a
            * long one a flush before each write */
    out->period_ms = write_ms <= TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS
                         ? TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS
                         : 0;
    out->on_write = out->period_ms == 0;
    break;
  }
  if (cfg->flush_period_ms)
    TR_WARN(COMP, "session %llu: flush_period_ms is ignored because write_flush_mode is %s; "
            "set write_flush_mode to WRITE_FLUSH_DISABLED to use flush_period_ms",
            (unsigned long long)session_id,
            cfg->write_flush_mode ==
                    PERFETTO__PROTOS__TRACE_CONFIG__WRITE_FLUSH_MODE__WRITE_FLUSH_ENABLED
                ? "WRITE_FLUSH_ENABLED"
                : "AUTO");
}
