/* trace_filter.h: TraceConfig.trace_filter as traced v58.2 applies it: a field allow-list
 * ("filter bytecode", v1 or v2, with the v54 overlay merged on top) walked over each serialized
 * TracePacket, and the string filter chain run over the fields it marks "filter_string".
 *
 * Guarantees: the bytecode is untrusted and fully validated when loaded (every message index,
 * every range, the FNV checksum); a loaded filter never reads outside its tables. Filtering one
 * packet reads each input byte once, writes at most as many bytes as it read, and allocates
 * nothing. A packet that is not valid protobuf gives an error and no output (traced: an empty
 * packet). Not thread-safe: one filter per reader (the string filter keeps match scratch).
 * Cost: O(input bytes) per packet, plus the regex rules on each filtered string. */
#ifndef TR_TRACE_FILTER_H
#define TR_TRACE_FILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/config/trace_config.pb-c.h"

/* Bytecode (or overlay) longer than this is refused: it bounds the tables a load builds (at
 * most 129 words per 3 input bytes); a TraceConfig over Perfetto IPC is 128 KiB at most. */
#define TR_TRACE_FILTER_MAX_BYTECODE (1u << 20)
/* String rules per chain, and semantic types (TraceFilter.StringFilterRule.semantic_type
 * values are below this, as in traced). */
#define TR_TRACE_FILTER_MAX_RULES 1024u
#define TR_TRACE_FILTER_SEMANTIC_TYPES 128u

/* The string filter policies (TraceConfig.TraceFilter.StringFilterPolicy values). */
enum tr_trace_filter_policy {
  TR_SFP_MATCH_REDACT_GROUPS = 1,
  TR_SFP_ATRACE_MATCH_REDACT_GROUPS = 2,
  TR_SFP_MATCH_BREAK = 3,
  TR_SFP_ATRACE_MATCH_BREAK = 4,
  TR_SFP_ATRACE_REPEATED_SEARCH_REDACT_GROUPS = 5,
};

typedef struct tr_trace_filter tr_trace_filter;

/* One string filter rule. A rule with the name of an earlier one replaces it in place. */
typedef struct tr_trace_filter_rule {
  int policy;                /* enum tr_trace_filter_policy */
  const char *regex;         /* POSIX extended, with \d \w \s (and \D \W \S) translated */
  const char *atrace_prefix; /* atrace_payload_starts_with; NULL: "" */
  const char *name;          /* NULL or "": never replaces */
  const int32_t *semantic_types; /* the types it applies to; none: unspecified (0) only */
  size_t n_semantic_types;
} tr_trace_filter_rule;

typedef struct tr_trace_filter_slice {
  const uint8_t *data;
  size_t len;
} tr_trace_filter_slice;

/* What the filter did, for TraceStats.filter_stats (the caller counts what bypasses it). */
typedef struct tr_trace_filter_stats {
  uint64_t input_packets, input_bytes, output_bytes, errors, time_taken_ns;
} tr_trace_filter_stats;

/* A filter with no bytecode (which lets nothing through) and no rules. NULL: out of memory. */
tr_trace_filter *tr_trace_filter_new(void);
void tr_trace_filter_free(tr_trace_filter *f);

/* Appends (or replaces, by name) a string rule. TR_ERR_CONFIG with err filled: an unknown
 * policy, a semantic type out of range, a regex that does not compile; TR_ERR_NOMEM. */
int tr_trace_filter_add_rule(tr_trace_filter *f, const tr_trace_filter_rule *r, char *err,
                             size_t err_len);
/* Loads the bytecode (varints, the last one the FNV-1a checksum of the others) and the
 * optional v54 overlay (overlay_len 0: none), replacing any loaded before; the root is the
 * bytecode's first message. TR_ERR_DECODE: invalid (nothing loaded then); TR_ERR_NOMEM. */
int tr_trace_filter_load(tr_trace_filter *f, const uint8_t *bytecode, size_t len,
                         const uint8_t *overlay, size_t overlay_len);
/* Moves the root to the message of field `field` of the current root (traced filters
 * TracePackets with a bytecode made for perfetto.protos.Trace: field 1). TR_ERR_NOT_FOUND when
 * the field is not an allowed nested message. */
int tr_trace_filter_set_root(tr_trace_filter *f, uint32_t field);

/* The whole setup traced makes at EnableTracing from TraceConfig.trace_filter: the rules of
 * string_filter_chain then string_filter_chain_v54, then bytecode_v2 (or bytecode when v2 is
 * empty) with bytecode_overlay_v54, then the root moved to Trace.packet. TR_ERR_CONFIG with
 * traced's reason in err ("Trace filter bytecode invalid", "Failed to set filter root.",
 * "Trace filter has invalid string filtering rules"...), TR_ERR_NOMEM. */
int tr_trace_filter_from_config(const Perfetto__Protos__TraceConfig__TraceFilter *cfg,
                                tr_trace_filter **out, char *err, size_t err_len);

/* Filters one message given as consecutive slices into out, which has room for the sum of
 * their lengths; *out_len gets the bytes written. 0, or TR_ERR_DECODE (not valid protobuf,
 * or an empty message, as traced counts it; *out_len 0). Counts into the filter's stats. */
int tr_trace_filter_run(tr_trace_filter *f, const tr_trace_filter_slice *slices, size_t n,
                        uint8_t *out, size_t *out_len);
/* The counts so far (time_taken_ns: the time tr_trace_filter_run spent). */
void tr_trace_filter_get_stats(const tr_trace_filter *f, tr_trace_filter_stats *out);

/* The string filter alone on [s, s + len), in place, for a string of semantic type
 * `semantic_type` (0: unspecified): true if it changed the string. */
bool tr_trace_filter_string(tr_trace_filter *f, char *s, size_t len, uint32_t semantic_type);

#endif
