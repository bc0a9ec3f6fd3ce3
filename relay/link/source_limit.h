/* source_limit.h: connections counted per source address, so that a server can bound what one
 * address holds before it has authenticated anybody (tls_uv.c: its handshake slots and its
 * waiting list).
 *
 * Guarantees: one entry per distinct address (IPv4 and IPv4-mapped IPv6 are the same source;
 * an IPv6 address counts alone, not its /64), made on first use and freed as soon as the
 * caller's counts are both back to 0, so the table holds no more entries than the server holds
 * connections. The counts are the caller's to keep; the table only finds and frees entries.
 * Cost: a lookup hashes 16 bytes and walks one bucket (TR_SOURCE_LIMIT_BUCKETS of them, so a
 * few entries each at the thousands of connections a server may hold). */
#ifndef TR_SOURCE_LIMIT_H
#define TR_SOURCE_LIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define TR_SOURCE_LIMIT_BUCKETS 256

struct tr_source_entry {
  struct tr_source_entry *next;
  unsigned char addr[16]; /* IPv6, or IPv4-mapped; all zero for an address of another family */
  unsigned active;        /* the caller's: connections in their handshake */
  unsigned waiting;       /* the caller's: connections waiting for a handshake slot */
  bool warned;            /* the caller's: a refusal of this source was logged */
};

struct tr_source_limit {
  struct tr_source_entry *buckets[TR_SOURCE_LIMIT_BUCKETS];
  size_t entries;
};

void tr_source_limit_init(struct tr_source_limit *t);
/* The entry of sa's address (a new one with counts 0), or NULL when out of memory. */
struct tr_source_entry *tr_source_limit_get(struct tr_source_limit *t, const struct sockaddr *sa);
/* Frees e once its counts are both 0; else does nothing. NULL is ignored. */
void tr_source_limit_put(struct tr_source_limit *t, struct tr_source_entry *e);

#endif
