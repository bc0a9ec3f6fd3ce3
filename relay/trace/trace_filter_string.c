/* trace_filter_string.c: the string filter chain of TraceConfig.trace_filter (see
 * trace_filter.h), with traced v58.2's rules, on POSIX regex (regex.h) instead of traced's
 * engine (RE2 or std::regex, ECMAScript syntax): docs/compat.md says what differs.
 *
 * The chain is "iptables"-like: the rules are tried in order on a string, skipping those whose
 * semantic types do not include the string's; the first that decides ends the walk:
 * - MATCH_BREAK: the whole string matches: left as is;
 * - MATCH_REDACT_GROUPS: the whole string matches: every non-empty capture group overwritten;
 * - the ATRACE_ variants do the same but only for atrace strings ("B|pid|payload"; never one
 *   starting with 'E') whose payload (after the second '|') starts with the rule's prefix;
 * - ATRACE_REPEATED_SEARCH_REDACT_GROUPS: every non-overlapping match anywhere in such a
 *   string has its groups overwritten (each search sees the redactions before it).
 * A group is overwritten with "P60REDACTED" cut to its length, then '-' to its end: a string
 * never changes length, so the message around it keeps its encoding.
 *
 * Patterns: POSIX extended, with the Perl classes ECMAScript patterns use most (\d \w \s and
 * their negations) translated to bracket expressions; a pattern that still does not compile
 * refuses the session (traced would abort on it). Cost: one regexec per rule tried. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/trace/trace_filter_priv.h"

static const char REDACTED[] = "P60REDACTED";
#define REDACTED_LEN (sizeof REDACTED - 1)

/* What a Perl class stands for inside a bracket expression (NULL: none) and as a whole. */
static const char *class_inside(char c) {
  switch (c) {
  case 'd': return "0-9";
  case 'w': return "[:alnum:]_";
  case 's': return "[:space:]";
  default: return NULL;
  }
}

static const char *class_outside(char c) {
  switch (c) {
  case 'd': return "[0-9]";
  case 'D': return "[^0-9]";
  case 'w': return "[[:alnum:]_]";
  case 'W': return "[^[:alnum:]_]";
  case 's': return "[[:space:]]";
  case 'S': return "[^[:space:]]";
  default: return NULL;
  }
}

/* The pattern in POSIX extended syntax, wrapped as `pre` pattern `post`; NULL when out of
 * memory or (*bad set) a negated class inside brackets, which POSIX cannot say. */
static char *translate(const char *p, const char *pre, const char *post, bool *bad) {
  size_t n = strlen(p), cap = strlen(pre) + strlen(post) + 14 * n + 1, o = 0;
  char *out = malloc(cap);
  bool in_bracket = false;
  *bad = false;
  if (!out)
    return NULL;
  o += (size_t)snprintf(out, cap, "%s", pre);
  for (size_t i = 0; i < n; i++) {
    const char *rep;
    if (in_bracket) {
      if (p[i] == '[' && (p[i + 1] == ':' || p[i + 1] == '.' || p[i + 1] == '=')) {
        const char *end = strstr(p + i + 2, (char[]){p[i + 1], ']', 0});
        size_t len = end ? (size_t)(end - (p + i)) + 2 : 1;
        memcpy(out + o, p + i, len);
        o += len;
        i += len - 1;
        continue;
      }
      if (p[i] == '\\' && p[i + 1] && strchr("dDwWsS", p[i + 1])) {
        if (!(rep = class_inside(p[i + 1]))) {
          *bad = true;
          free(out);
          return NULL;
        }
        o += (size_t)snprintf(out + o, cap - o, "%s", rep);
        i++;
        continue;
      }
      if (p[i] == ']')
        in_bracket = false;
      out[o++] = p[i];
      continue;
    }
    if (p[i] == '\\' && p[i + 1]) {
      if ((rep = class_outside(p[i + 1])))
        o += (size_t)snprintf(out + o, cap - o, "%s", rep);
      else {
        out[o++] = p[i];
        out[o++] = p[i + 1];
      }
      i++;
      continue;
    }
    out[o++] = p[i];
    if (p[i] == '[') { /* a leading ']' (after an optional '^') is a member, not the end */
      in_bracket = true;
      if (p[i + 1] == '^')
        out[o++] = p[++i];
      if (p[i + 1] == ']')
        out[o++] = p[++i];
    }
  }
  o += (size_t)snprintf(out + o, cap - o, "%s", post);
  return out;
}

static int compile(const char *pattern, const char *pre, const char *post, regex_t *re,
                   size_t rule, char *err, size_t err_len) {
  bool bad;
  char *t = translate(pattern, pre, post, &bad);
  int rc;
  if (!t) {
    if (!bad)
      return TR_ERR_NOMEM;
    snprintf(err, err_len, "Trace filter has invalid string filtering rules: regex_pattern "
             "\"%s\" of rule %zu negates a class inside brackets, which POSIX regex cannot say",
             pattern, rule);
    return TR_ERR_CONFIG;
  }
  rc = regcomp(re, t, REG_EXTENDED);
  free(t);
  if (rc == 0)
    return 0;
  char why[128];
  regerror(rc, NULL, why, sizeof why);
  snprintf(err, err_len, "Trace filter has invalid string filtering rules: regex_pattern \"%s\" "
           "of rule %zu is not a valid POSIX extended regex (%s)", pattern, rule, why);
  return TR_ERR_CONFIG;
}

static void free_rule(tr_trace_filter_srule *r) {
  regfree(&r->full);
  if (r->has_search)
    regfree(&r->search);
  free(r->prefix);
  free(r->name);
}

static int make_rule(const tr_trace_filter_rule *in, size_t index, tr_trace_filter_srule *r,
                     char *err, size_t err_len) {
  const char *pattern = in->regex ? in->regex : "";
  int rc;
  memset(r, 0, sizeof *r);
  if (in->policy < TR_SFP_MATCH_REDACT_GROUPS ||
      in->policy > TR_SFP_ATRACE_REPEATED_SEARCH_REDACT_GROUPS) {
    snprintf(err, err_len, "Trace filter has invalid string filtering rules");
    return TR_ERR_CONFIG;
  }
  if (in->n_semantic_types == 0)
    r->types[0] = 1; /* unspecified only */
  for (size_t i = 0; i < in->n_semantic_types; i++) {
    int32_t t = in->semantic_types[i];
    if (t < 0 || (uint32_t)t >= TR_TRACE_FILTER_SEMANTIC_TYPES) {
      snprintf(err, err_len, "Trace filter has invalid semantic types in string filtering rules");
      return TR_ERR_CONFIG;
    }
    r->types[t / 64] |= 1ull << (t % 64);
  }
  r->policy = in->policy;
  if ((rc = compile(pattern, "^(", ")$", &r->full, index, err, err_len)) != 0)
    return rc;
  if (r->policy == TR_SFP_ATRACE_REPEATED_SEARCH_REDACT_GROUPS) {
    if ((rc = compile(pattern, "", "", &r->search, index, err, err_len)) != 0) {
      regfree(&r->full);
      return rc;
    }
    r->has_search = true;
  }
  r->prefix = strdup(in->atrace_prefix ? in->atrace_prefix : "");
  r->name = strdup(in->name ? in->name : "");
  if (!r->prefix || !r->name) {
    free_rule(r);
    return TR_ERR_NOMEM;
  }
  r->prefix_len = strlen(r->prefix);
  return 0;
}

int tr_trace_filter_string_add(tr_trace_filter_chain *c, const tr_trace_filter_rule *r,
                               char *err, size_t err_len) {
  tr_trace_filter_srule nr;
  int rc;
  if (c->n >= TR_TRACE_FILTER_MAX_RULES) {
    snprintf(err, err_len, "Trace filter has invalid string filtering rules: over %u rules",
             TR_TRACE_FILTER_MAX_RULES);
    return TR_ERR_CONFIG;
  }
  if ((rc = make_rule(r, c->n, &nr, err, err_len)) != 0)
    return rc;
  size_t groups = nr.full.re_nsub + 1;
  if (groups > c->m_cap) {
    regmatch_t *m = realloc(c->m, groups * sizeof *m);
    if (!m) {
      free_rule(&nr);
      return TR_ERR_NOMEM;
    }
    c->m = m;
    c->m_cap = groups;
  }
  for (size_t i = 0; nr.name[0] && i < c->n; i++)
    if (strcmp(c->rules[i].name, nr.name) == 0) {
      free_rule(&c->rules[i]);
      c->rules[i] = nr;
      return 0;
    }
  if (c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 4;
    tr_trace_filter_srule *n = realloc(c->rules, cap * sizeof *n);
    if (!n) {
      free_rule(&nr);
      return TR_ERR_NOMEM;
    }
    c->rules = n;
    c->cap = cap;
  }
  c->rules[c->n++] = nr;
  return 0;
}

void tr_trace_filter_string_free(tr_trace_filter_chain *c) {
  for (size_t i = 0; i < c->n; i++)
    free_rule(&c->rules[i]);
  free(c->rules);
  free(c->m);
  free(c->copy);
  memset(c, 0, sizeof *c);
}

/* The payload of an atrace string (after "X|pid|"), or NULL. */
static const char *atrace_payload(const char *s, size_t len) {
  if (len <= 2 || s[0] == 'E')
    return NULL;
  const char *pipe = memchr(s + 2, '|', len - 2);
  return pipe ? pipe + 1 : NULL;
}

static bool starts_with(const char *p, const char *end, const tr_trace_filter_srule *r) {
  return (size_t)(end - p) >= r->prefix_len && memcmp(p, r->prefix, r->prefix_len) == 0;
}

/* regexec on s[from, len) (offsets in m are from s). */
static bool match(const regex_t *re, const char *s, size_t from, size_t len, regmatch_t *m,
                  size_t nm) {
  m[0].rm_so = (regoff_t)from;
  m[0].rm_eo = (regoff_t)len;
  return regexec(re, s, nm, m, REG_STARTEND | (from ? REG_NOTBOL : 0)) == 0;
}

/* Overwrites groups [first, nm) of a match. */
static void redact(char *s, const regmatch_t *m, size_t first, size_t nm) {
  for (size_t g = first; g < nm; g++) {
    if (m[g].rm_so < 0 || m[g].rm_eo <= m[g].rm_so)
      continue; /* did not take part, or empty */
    size_t len = (size_t)(m[g].rm_eo - m[g].rm_so);
    size_t k = len < REDACTED_LEN ? len : REDACTED_LEN;
    memcpy(s + m[g].rm_so, REDACTED, k);
    memset(s + m[g].rm_so + k, '-', len - k);
  }
}

/* Whole-string match of rule r; its groups redacted when `redact_groups`. */
static bool full_match(tr_trace_filter_chain *c, const tr_trace_filter_srule *r, char *s,
                       size_t len, bool redact_groups) {
  size_t nm = r->full.re_nsub + 1;
  if (!match(&r->full, s, 0, len, c->m, nm))
    return false;
  if (redact_groups)
    redact(s, c->m, 2, nm); /* group 1 is the wrapper */
  return true;
}

static bool repeated_search(tr_trace_filter_chain *c, const tr_trace_filter_srule *r, char *s,
                            size_t len) {
  size_t nm = r->search.re_nsub + 1, from = 0;
  bool any = false;
  while (from <= len && match(&r->search, s, from, len, c->m, nm)) {
    size_t end = (size_t)c->m[0].rm_eo;
    redact(s, c->m, 1, nm);
    any = true;
    from = end == (size_t)c->m[0].rm_so ? end + 1 : end; /* an empty match moves on by one */
  }
  return any;
}

/* The rules on s, a NUL-terminated copy (regexec's sanitizer interceptor reads to a NUL even
 * with REG_STARTEND; embedded NULs are still matched as bytes): true if it changed. */
static bool apply(tr_trace_filter_chain *c, char *s, size_t len, uint32_t semantic_type) {
  const char *payload = NULL;
  bool payload_found = false;
  for (size_t i = 0; i < c->n; i++) {
    const tr_trace_filter_srule *r = &c->rules[i];
    if (semantic_type < TR_TRACE_FILTER_SEMANTIC_TYPES &&
        !(r->types[semantic_type / 64] >> (semantic_type % 64) & 1))
      continue;
    if (r->policy != TR_SFP_MATCH_BREAK && r->policy != TR_SFP_MATCH_REDACT_GROUPS) {
      if (!payload_found)
        payload = atrace_payload(s, len);
      payload_found = true;
      if (!payload || !starts_with(payload, s + len, r))
        continue;
    }
    switch (r->policy) {
    case TR_SFP_MATCH_BREAK:
    case TR_SFP_ATRACE_MATCH_BREAK:
      if (full_match(c, r, s, len, false))
        return false;
      break;
    case TR_SFP_MATCH_REDACT_GROUPS:
    case TR_SFP_ATRACE_MATCH_REDACT_GROUPS:
      if (full_match(c, r, s, len, true))
        return true;
      break;
    default:
      if (repeated_search(c, r, s, len))
        return true;
      break;
    }
  }
  return false;
}

bool tr_trace_filter_string_apply(tr_trace_filter_chain *c, char *s, size_t len,
                                  uint32_t semantic_type) {
  if (len == 0 || c->n == 0)
    return false;
  if (len + 1 > c->copy_cap) {
    char *n = realloc(c->copy, len + 1);
    if (!n)
      return false; /* left as is: only a redaction rule could have changed it */
    c->copy = n;
    c->copy_cap = len + 1;
  }
  memcpy(c->copy, s, len);
  c->copy[len] = 0;
  if (!apply(c, c->copy, len, semantic_type))
    return false;
  memcpy(s, c->copy, len);
  return true;
}
