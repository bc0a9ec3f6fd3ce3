/* hostport.h: "HOST:PORT", "[V6]:PORT" or "HOST" (default port) as typed in --service and
 * --listen, split and checked in one place, so a flag can be refused while the command line is
 * read (exit 2) and the link code uses exactly what was checked. Pure: no name resolution. */
#ifndef TR_HOSTPORT_H
#define TR_HOSTPORT_H

#include <stdbool.h>
#include <stddef.h>

#define TR_HOSTPORT_DEFAULT 7393 /* the relay link's port */

struct tr_hostport {
  char host[256]; /* without brackets */
  unsigned port;
};

/* listen: a bare IPv6 address (no brackets, so no port) is the host, and port 0 (any) is
 * allowed; else both are refused. 0, or TR_ERR_CONFIG for an empty or too long host, an
 * unclosed bracket, or a port that is not a number in range. */
int tr_hostport_parse(const char *s, bool listen, struct tr_hostport *out);

#endif
