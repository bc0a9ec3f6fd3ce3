/* relay_allow.c: the root's rules of who may relay whom (see relay_allow.h). */
#include "service/relay_allow.h"

#include <fnmatch.h>
#include <string.h>

#include "relay/link/tls.h"

int tr_relay_allow_add(tr_relay_allow *a, const char *spec, const char **why) {
  const char *eq = strchr(spec, '=');
  if (eq == NULL) {
    *why = "give REGIONAL=PATTERN[,PATTERN...], e.g. regional-eu=eu-*";
    return -1;
  }
  size_t len = (size_t)(eq - spec);
  if (!tr_tls_valid_machine_name(spec, len)) {
    *why = "REGIONAL must be the machine name in the regional's certificate "
           "(1-64 of A-Z a-z 0-9 . _ -)";
    return -1;
  }
  const char *pats = eq + 1;
  for (const char *p = pats;; p++) {
    size_t n = strcspn(p, ",");
    if (n == 0 || n >= TR_RELAY_ALLOW_PATTERN_MAX) {
      *why = "every PATTERN must be 1 to 255 characters";
      return -1;
    }
    p += n;
    if (*p == '\0')
      break;
  }
  if (a->n == TR_RELAY_ALLOW_MAX) {
    *why = "too many rules (64 at most): put several patterns in one";
    return -1;
  }
  a->rules[a->n].regional = spec;
  a->rules[a->n].regional_len = len;
  a->rules[a->n].patterns = pats;
  a->n++;
  return 0;
}

/* True if host matches one of the comma-separated patterns. */
static bool matches_one(const char *patterns, const char *host) {
  char pat[TR_RELAY_ALLOW_PATTERN_MAX];
  while (*patterns != '\0') {
    size_t len = strcspn(patterns, ",");
    memcpy(pat, patterns, len); /* shorter than pat: tr_relay_allow_add checked */
    pat[len] = '\0';
    if (fnmatch(pat, host, 0) == 0)
      return true;
    patterns += len;
    if (*patterns == ',')
      patterns++;
  }
  return false;
}

/* host NULL: any host. */
static bool permits(const tr_relay_allow *a, const char *regional, const char *host) {
  size_t len = strlen(regional);
  for (size_t i = 0; i < a->n; i++)
    if (a->rules[i].regional_len == len && memcmp(a->rules[i].regional, regional, len) == 0 &&
        (host == NULL || matches_one(a->rules[i].patterns, host)))
      return true;
  return false;
}

bool tr_relay_allow_permits(const tr_relay_allow *a, const char *regional, const char *host) {
  return permits(a, regional, host);
}

bool tr_relay_allow_regional(const tr_relay_allow *a, const char *regional) {
  return permits(a, regional, NULL);
}
