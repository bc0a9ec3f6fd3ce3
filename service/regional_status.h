/* regional_status.h: a regional's consumer socket, for `tracerelay status` (and `perfetto
 * --query`). A regional records nothing, so of Perfetto's ConsumerPort it answers only
 * QueryServiceState: the regional's own figures (service/regional.h, its upstream, agents
 * forwarded and held, bytes both ways) and one HostStatus per agent it forwards, in the
 * TracingServiceStateExtension that the service's own replies carry (tracerelay_status.proto).
 * EnableTracing is refused with a reply that says where to record instead; the other methods
 * are left out of BindServiceReply, so Perfetto clients fail them before sending.
 * Everything runs on the loop's thread. */
#ifndef TR_SERVICE_REGIONAL_STATUS_H
#define TR_SERVICE_REGIONAL_STATUS_H

#include <sys/types.h>

#include "relay/producer/ipc_host.h"
#include "service/regional.h"

typedef struct tr_regional_status tr_regional_status;
typedef void (*tr_regional_status_close_cb)(void *data);

/* Listens on path (mode as the consumer socket's) for the regional r, whose state names it
 * service_version and machine (both kept, not copied: they outlive the socket). On failure
 * (logged by the caller) *out is still set and must be closed. */
int tr_regional_status_start(uv_loop_t *loop, tr_regional *r, const char *service_version,
                             const char *machine, const char *path, mode_t mode,
                             tr_regional_status **out);
/* Closes the socket and its connections; cb(data) once done, then it is freed. Call before
 * tr_regional_stop. */
void tr_regional_status_close(tr_regional_status *s, tr_regional_status_close_cb cb, void *data);

#endif
