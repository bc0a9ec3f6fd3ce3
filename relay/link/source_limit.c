/* source_limit.c: the per-address table behind a server's pre-authentication limits (see
 * source_limit.h). */
#include "relay/link/source_limit.h"

#include "relay/base/fnv1a.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

void tr_source_limit_init(struct tr_source_limit *t) { memset(t, 0, sizeof *t); }

/* IPv4 as ::ffff:a.b.c.d, so a dual-stack listener counts one peer once. */
static void key_of(const struct sockaddr *sa, unsigned char key[16]) {
  memset(key, 0, 16);
  if (sa == NULL)
    return;
  if (sa->sa_family == AF_INET) {
    key[10] = key[11] = 0xff;
    memcpy(key + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
  }
}

static struct tr_source_entry **bucket_of(struct tr_source_limit *t, const unsigned char key[16]) {
  return &t->buckets[tr_fnv1a64(key, 16) % TR_SOURCE_LIMIT_BUCKETS];
}

struct tr_source_entry *tr_source_limit_get(struct tr_source_limit *t, const struct sockaddr *sa) {
  unsigned char key[16];
  key_of(sa, key);
  struct tr_source_entry **b = bucket_of(t, key);
  for (struct tr_source_entry *e = *b; e != NULL; e = e->next)
    if (memcmp(e->addr, key, 16) == 0)
      return e;
  struct tr_source_entry *e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  memcpy(e->addr, key, 16);
  e->next = *b;
  *b = e;
  t->entries++;
  return e;
}

void tr_source_limit_put(struct tr_source_limit *t, struct tr_source_entry *e) {
  if (e == NULL || e->active > 0 || e->waiting > 0)
    return;
  for (struct tr_source_entry **p = bucket_of(t, e->addr); *p != NULL; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      t->entries--;
      free(e);
      return;
    }
}
