/* hostport.c: HOST:PORT of the daemons' address flags (see hostport.h). */
#include "relay/base/hostport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

int tr_hostport_parse(const char *s, bool listen, struct tr_hostport *out) {
  const char *port = NULL, *colon = strrchr(s, ':');
  size_t hlen;
  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (end == NULL || (end[1] != '\0' && end[1] != ':'))
      return TR_ERR_CONFIG;
    hlen = (size_t)(end - s - 1);
    s++;
    port = end[1] == ':' ? end + 2 : NULL;
  } else if (colon != NULL && strchr(s, ':') == colon) {
    hlen = (size_t)(colon - s);
    port = colon + 1;
  } else if (colon != NULL && !listen) {
    return TR_ERR_CONFIG; /* a bare IPv6 address needs brackets to carry a port */
  } else {
    hlen = strlen(s);
  }
  if (hlen == 0 || hlen >= sizeof out->host)
    return TR_ERR_CONFIG;
  snprintf(out->host, sizeof out->host, "%.*s", (int)hlen, s);
  out->port = TR_HOSTPORT_DEFAULT;
  if (port != NULL) {
    char *end;
    unsigned long p = strtoul(port, &end, 10);
    if (*port < '0' || *port > '9' || *end != '\0' || p > 65535 || (p == 0 && !listen))
      return TR_ERR_CONFIG;
    out->port = (unsigned)p;
  }
  return 0;
}
