/* record_config.h: the TraceConfig `tracerelay record` sends: loaded from a file (text or
 * binary), then changed by the short flags (-t, -b, --ring/--discard, --data-source,
 * --machines, --flush-period). Every message built here can be freed with
 * protobuf_c_message_free_unpacked(). */
#ifndef TRACERELAY_RECORD_CONFIG_H
#define TRACERELAY_RECORD_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/config/trace_config.pb-c.h"

#define RECORD_DEFAULT_BUFFER_KB 32768u /* when neither the config nor -b gives a buffer */

/* What the flags ask for; -1 / 0 / empty means "leave the config as it is". */
typedef struct record_overrides {
  int64_t duration_ms;
  int64_t buffer_kb;
  int fill_policy; /* PERFETTO__PROTOS__TRACE_CONFIG__BUFFER_CONFIG__FILL_POLICY__* or 0 */
  const char **data_sources;
  size_t n_data_sources;
  const char *machines; /* comma-separated machine names */
  int64_t flush_period_ms;
} record_overrides;

/* Reads path ("-": standard input) as a TraceConfig. Text when force_text (--txt), for
 * .pbtxt/.txt/.textproto, binary for .pb/.bin; anything else is text unless it holds control
 * bytes (binary protobuf always does). On failure returns a negative TR_ERR_* and writes a
 * message naming the file (and line:column) into err. */
int record_config_load(const char *path, bool force_text, Perfetto__Protos__TraceConfig **out,
                       char *err, size_t errlen);
/* An empty config, for when only flags are given. NULL if out of memory. */
Perfetto__Protos__TraceConfig *record_config_new(void);
/* Applies the overrides, adds a default buffer if there is none, and checks that something
 * will be recorded. Returns 0 or a negative TR_ERR_* with a message in err. */
int record_config_apply(Perfetto__Protos__TraceConfig *cfg, const record_overrides *o, char *err,
                        size_t errlen);

/* "500ms", "10s", "2m", "1h" -> milliseconds, at most UINT32_MAX; a bare number counts
 * bare_ms milliseconds per unit. -1 if invalid. */
int64_t record_parse_duration_ms(const char *s, int64_t bare_ms);
/* "64mb", "512kb", "1gb" (also k, m, g; a bare number is KB) -> KB; -1 if invalid. */
int64_t record_parse_size_kb(const char *s);

#endif
