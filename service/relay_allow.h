/* relay_allow.h: which regional services may speak for which hosts (tiers,
 * docs/security.md#tiers). A root service is given rules `REGIONAL=PATTERN[,PATTERN...]`
 * (--relay-allow, repeatable): a link whose certificate names REGIONAL may carry the agent of
 * a host whose machine name matches one of the fnmatch(3) PATTERNs. Nothing else may relay:
 * no rule, no relaying. Pure logic, no I/O. */
#ifndef TR_SERVICE_RELAY_ALLOW_H
#define TR_SERVICE_RELAY_ALLOW_H

#include <stdbool.h>
#include <stddef.h>

#define TR_RELAY_ALLOW_MAX 64
#define TR_RELAY_ALLOW_PATTERN_MAX 256 /* bytes, with the terminating NUL */

typedef struct tr_relay_allow {
  size_t n;
  struct {
    const char *regional; /* a machine name */
    const char *patterns; /* "PAT[,PAT...]" */
    size_t regional_len;
  } rules[TR_RELAY_ALLOW_MAX];
} tr_relay_allow;

/* Adds the rule spec (referenced, not copied: it must outlive a). 0, or -1 with *why set to
 * what is wrong (no '=', a regional name that is not a machine name, an empty pattern, too
 * many rules). */
int tr_relay_allow_add(tr_relay_allow *a, const char *spec, const char **why);
/* True if a rule lets regional relay host. */
bool tr_relay_allow_permits(const tr_relay_allow *a, const char *regional, const char *host);
/* True if a rule names regional: it may open a carrier (one link for all its hosts). */
bool tr_relay_allow_regional(const tr_relay_allow *a, const char *regional);

#endif
