/* status.c: per-host status for QueryServiceState (see status.h). */
#include "service/status.h"

#include <stdlib.h>
#include <string.h>

#include "relay/clock/clock.h"
#include "relay/clock/clocksync.h"
#include "relay/base/tr_error.h"
#include "service/hosts.h"
#include "tracerelay/tracerelay_status.pb-c.h"

static char *const kStates[] = {"CONFIGURED", "STARTED", "DISABLING_WAITING_STOP_ACKS",
                                "DISABLED"};

/* The session's view of host: its instances there and its central buffers' losses. A session
 * may hold several entries for one host (one per agent instance); all are summed. */
static void fill_session(Tracerelay__HostSessionStatus *ss, const tr_session *s,
                         const tr_host *host) {
  struct tr_host_buffer_losses l = {0};
  struct tr_session_host_summary sum;
  ss->has_session_id = 1;
  ss->session_id = tr_session_id(s);
  ss->state = kStates[tr_session_get_state(s)];
  tr_session_stats_add_host_losses(s, host, &l);
  ss->has_chunks_overwritten = ss->has_bytes_overwritten = ss->has_chunks_discarded = 1;
  ss->has_packets_lost_in_gaps = 1;
  ss->chunks_overwritten = l.chunks_overwritten;
  ss->bytes_overwritten = l.bytes_overwritten;
  ss->chunks_discarded = l.chunks_discarded;
  ss->packets_lost_in_gaps = l.packets_lost_in_gaps;
  tr_session_stats_host_summary(s, host, &sum);
  ss->has_instances = ss->has_instances_started = 1;
  ss->instances = sum.instances;
  ss->instances_started = sum.instances_started;
  ss->has_gone = 1;
  ss->gone = sum.gone;
}

bool tr_status_host_clock(const tr_host *host, uint64_t boot_now, struct tr_host_clock *out) {
  struct tr_clocksync_stats cs;
  if (!host->clock)
    return false;
  tr_clocksync_get_stats(host->clock, &cs);
  if (cs.probes == 0)
    return false;
  out->offset_ns = tr_clocksync_offset_ns(host->clock);
  out->drift_ppm = tr_clocksync_drift_ppm(host->clock);
  out->rtt_ns = tr_clocksync_rtt_ns(host->clock);
  /* The bound grows with the distance from the fit's samples: report it for "now" on the
   * host's clock, where the next event will land, not at the last probe. */
  int64_t host_now = (int64_t)boot_now - out->offset_ns;
  out->bound_ns = tr_clocksync_error_bound(host->clock, host_now > 0 ? host_now : 0);
  out->probes = cs.probes;
  out->outliers = cs.outliers;
  return true;
}

static void fill_clock(Tracerelay__HostStatus *hs, const tr_host *host, uint64_t boot_now) {
  struct tr_host_clock c;
  if (!tr_status_host_clock(host, boot_now, &c))
    return;
  hs->has_clock_synced = hs->clock_synced = 1;
  hs->has_clock_offset_ns = 1;
  hs->clock_offset_ns = c.offset_ns;
  hs->has_clock_drift_ppm = 1;
  hs->clock_drift_ppm = c.drift_ppm;
  hs->has_clock_rtt_ns = 1;
  hs->clock_rtt_ns = c.rtt_ns;
  if (c.bound_ns >= 0) {
    hs->has_clock_error_bound_ns = 1;
    hs->clock_error_bound_ns = c.bound_ns;
  }
  hs->has_clock_probes = hs->has_clock_outliers = 1;
  hs->clock_probes = c.probes;
  hs->clock_outliers = c.outliers;
}

int tr_status_host(tr_service *svc, tr_host *host, uid_t viewer, uint8_t **out,
                   size_t *out_len) {
  Tracerelay__TracingServiceStateExtension x = TRACERELAY__TRACING_SERVICE_STATE_EXTENSION__INIT;
  Tracerelay__HostStatus hs = TRACERELAY__HOST_STATUS__INIT;
  Tracerelay__HostStatus *hsp = &hs;
  Tracerelay__HostStats stats = TRACERELAY__HOST_STATS__INIT;
  Tracerelay__HostSessionStatus *sessions = NULL, **session_ptrs = NULL;
  uint64_t boot_now = 0, real_now = 0;
  size_t n = 0;
  int rc = 0;

  *out = NULL;
  *out_len = 0;
  tr_clock_read(TR_CLOCK_BOOTTIME, &boot_now);
  tr_clock_read(TR_CLOCK_REALTIME, &real_now);
  hs.machine_name = host->name;
  hs.has_machine_id = 1;
  hs.machine_id = host->machine_id;
  if (strcmp(host->trace_name, host->name) != 0)
    hs.trace_machine_name = (char *)host->trace_name;
  hs.has_connected = 1;
  hs.connected = host->link != NULL;
  if (host->relayed_by[0] != '\0')
    hs.relayed_by = (char *)host->relayed_by;
  if (host->connected_since_ns != 0 && host->connected_since_ns <= boot_now) {
    uint64_t ago = boot_now - host->connected_since_ns;
    hs.has_connected_since_unix_ns = 1;
    hs.connected_since_unix_ns = (int64_t)(real_now - ago);
    hs.has_connected_for_ms = hs.connected;
    hs.connected_for_ms = hs.connected ? ago / 1000000u : 0;
  }
  hs.has_producers = hs.has_data_sources = 1;
  for (size_t p = 0; p < host->num_producers; p++) {
    if (!tr_hosts_producer_reachable(host, p))
      continue;
    hs.producers++;
    hs.data_sources += (uint32_t)host->producers[p].num_data_sources;
  }
  tr_session_stats_fill_host(&stats, host, host->link != NULL);
  hs.stats = &stats;
  fill_clock(&hs, host, boot_now);
  int64_t cert = svc->link->cert_expiry != NULL ? svc->link->cert_expiry(host) : 0;
  hs.has_cert_not_after_unix = cert != 0;
  hs.cert_not_after_unix = cert;

  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
    n += tr_session_visible_to(s, viewer) && tr_session_has_host(s, host);
  if (n > 0) {
    sessions = calloc(n, sizeof *sessions);
    session_ptrs = calloc(n, sizeof *session_ptrs);
    if (!sessions || !session_ptrs) {
      rc = TR_ERR_NOMEM;
      goto done;
    }
    n = 0;
    for (const tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
      if (!tr_session_visible_to(s, viewer) || !tr_session_has_host(s, host))
        continue;
      tracerelay__host_session_status__init(&sessions[n]);
      fill_session(&sessions[n], s, host);
      session_ptrs[n] = &sessions[n];
      n++;
    }
  }
  hs.n_sessions = n;
  hs.sessions = session_ptrs;
  x.n_tracerelay_hosts = 1;
  x.tracerelay_hosts = &hsp;
  *out_len = tracerelay__tracing_service_state_extension__get_packed_size(&x);
  *out = malloc(*out_len ? *out_len : 1);
  if (!*out) {
    rc = TR_ERR_NOMEM;
    *out_len = 0;
    goto done;
  }
  tracerelay__tracing_service_state_extension__pack(&x, *out);
done:
  free(session_ptrs);
  free(sessions);
  return rc;
}

int tr_status_service(const tr_service *svc, uint8_t **out, size_t *out_len) {
  Tracerelay__TracingServiceStateExtension x = TRACERELAY__TRACING_SERVICE_STATE_EXTENSION__INIT;
  Tracerelay__TlsExpiry tls = TRACERELAY__TLS_EXPIRY__INIT;
  x.tracerelay_service_machine = svc->system_info->machine_name;
  x.has_tracerelay_hosts_retired = x.has_tracerelay_max_buffer_memory = 1;
  x.has_tracerelay_buffer_memory_reserved = 1;
  x.tracerelay_hosts_retired = tr_hosts_retired(svc->hosts);
  x.tracerelay_max_buffer_memory = svc->max_buffer_memory;
  x.tracerelay_buffer_memory_reserved = svc->buffer_memory_reserved;
  if (svc->cert_expiry != 0) {
    tls.has_cert_not_after_unix = tls.has_ca_not_after_unix = 1;
    tls.cert_not_after_unix = svc->cert_expiry;
    tls.ca_not_after_unix = svc->ca_expiry;
    x.tracerelay_tls = &tls;
  }
  *out_len = tracerelay__tracing_service_state_extension__get_packed_size(&x);
  *out = malloc(*out_len ? *out_len : 1);
  if (!*out) {
    *out_len = 0;
    return TR_ERR_NOMEM;
  }
  tracerelay__tracing_service_state_extension__pack(&x, *out);
  return 0;
}
