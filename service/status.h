/* status.h: the live per-host status the consumer port adds to QueryServiceState replies
 * (tracerelay.HostStatus, protos/tracerelay/tracerelay_status.proto), read by
 * `tracerelay status`: connection, producers, sessions and their buffer losses on the host,
 * link and agent counters, and the clock estimate.
 *
 * The encoding is a TracingServiceStateExtension holding ONE host (field 1000), or the
 * service's own machine name (field 1001), meant to be appended to a TracingServiceState's bytes: Perfetto's own clients skip the unknown field.
 * Cost O(sessions x (buffers + instances)) per host. Runs on the service's loop. */
#ifndef TR_SERVICE_STATUS_H
#define TR_SERVICE_STATUS_H

#include <stddef.h>
#include <stdint.h>

#include "service/session.h"

/* The host's clock mapping as status and metrics show it: the bound is for "now" on the host's
 * clock (boot_now is the service's BOOTTIME), -1 when there is none. false before the first
 * probe. */
struct tr_host_clock {
  int64_t offset_ns, rtt_ns, bound_ns;
  double drift_ppm;
  uint64_t probes, outliers;
};
bool tr_status_host_clock(const tr_host *host, uint64_t boot_now, struct tr_host_clock *out);

/* Encodes host's status, as the consumer of uid viewer may see it (only its own uid's sessions
 * unless it is root), into a new buffer (*out, freed by the caller with free()). TR_ERR_NOMEM. */
int tr_status_host(tr_service *svc, tr_host *host, uid_t viewer, uint8_t **out,
                   size_t *out_len);
/* Encodes the service's own part (field 1001: its machine, as its traces name it) the same
 * way. TR_ERR_NOMEM. */
int tr_status_service(const tr_service *svc, uint8_t **out, size_t *out_len);

#endif
