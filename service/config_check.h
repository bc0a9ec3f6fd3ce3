/* config_check.h: what the service does with each field of a TraceConfig (Perfetto v58.2's,
 * nested messages included), decided in one table (config_check.c), so that no field a
 * consumer sets is dropped without a word. Every field is one of:
 *   - honoured: the service (or, for a data source's own config, the producer) acts on it;
 *   - refused: EnableTracing fails with "trace_config.<path> is not supported by tracerelay:
 *     <what to do instead>";
 *   - ignored with one log line: Android-only reporting and guardrail fields, whose absence
 *     cannot change the trace a user gets here.
 * A field the proto does not define (protobuf-c keeps it in base.unknown_fields: a newer or a
 * retired Perfetto's) is refused: traced ignores such fields, but what it asks for cannot be
 * known, and a trace silently unlike the one asked for is what this table exists to prevent.
 * Two exceptions: a data source's config keeps its per-source configs (fields 100 and up) for
 * the producers, which know them, and trace_filter / compression are checked by their own
 * code. docs/compat.md lists every field with traced's behaviour and ours.
 *
 * Also here, the parts of traced's EnableTracing checks that the table cannot express and that
 * need no other session: named buffers, and the flush plan of write_flush_mode (a session's
 * admission among the others is session_admit.c's). */
#ifndef TR_CONFIG_CHECK_H
#define TR_CONFIG_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/config/trace_config.pb-c.h"

/* traced's default period of write_into_file, and of the flushes WRITE_FLUSH_AUTO makes. */
#define TR_CONFIG_CHECK_DEFAULT_WRITE_PERIOD_MS 5000u

/* Walks cfg against the table: 0 when every field set is honoured or ignorable (each ignored
 * one logged once), else TR_ERR_CONFIG with the first refusal's text in err. Also refuses
 * duplicate buffer names and a target_buffer_name that names no buffer or contradicts
 * target_buffer, with traced's texts. cfg is not NULL. */
int tr_config_check_fields(const Perfetto__Protos__TraceConfig *cfg, char *err, size_t err_len);

/* The index into cfg->buffers that data source config dsc writes into: its target_buffer_name
 * resolved, or target_buffer. For a config tr_config_check_fields passed. */
uint32_t tr_config_check_target_buffer(const Perfetto__Protos__TraceConfig *cfg,
                                       const Perfetto__Protos__DataSourceConfig *dsc);

/* A refusal of EnableTracing: err filled from fmt, TR_ERR_CONFIG returned. */
__attribute__((format(printf, 3, 4))) int tr_config_check_refuse(char *err, size_t err_len,
                                                                 const char *fmt, ...);

/* How a session flushes its producers, from flush_period_ms, write_into_file,
 * file_write_period_ms, write_flush_mode and fflush_post_write, as traced resolves them:
 * every period_ms (0: never periodically), and/or before each periodic write into the file
 * (on_write); fflush: the file is synced to disk after each periodic write. */
struct tr_config_flush_plan {
  uint32_t period_ms;
  bool on_write;
  bool fflush;
};
/* Fills *out for cfg; logs (for session_id) a flush_period_ms that write_flush_mode overrides,
 * as traced does. */
void tr_config_check_flush_plan(const Perfetto__Protos__TraceConfig *cfg, uint64_t session_id,
                                struct tr_config_flush_plan *out);

#endif
