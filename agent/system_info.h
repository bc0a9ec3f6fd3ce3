/* system_info.h: this host's SystemInfo for the agent's Hello (docs/relay-protocol.md,
 * Handshake): utsname, CPU count, RAM, page size, clock ticks and the timezone offset, read once
 * at start. The machine name is left out: the service takes it from our certificate. */
#ifndef TR_SYSTEM_INFO_H
#define TR_SYSTEM_INFO_H

#include <sys/utsname.h>

#include "perfetto/trace/system_info.pb-c.h"

/* The message and the strings it points into; fields are system_info.c's. */
struct tr_system_info {
  struct utsname uts;
  Perfetto__Protos__Utsname uts_msg;
  Perfetto__Protos__SystemInfo msg;
};

/* Fills si; what cannot be read is left unset. si must not move afterwards. */
void tr_system_info_read(struct tr_system_info *si);

#endif
