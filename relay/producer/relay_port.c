/* relay_port.c: the producer port's relay endpoint, where Perfetto's traced_relay connects as
 * it would to traced's (reference 7): the ProducerPort of producer_port.c with shared memory
 * emulated, and RelayPort's two methods, InitRelay (the guest's SystemInfo) and SyncClock (its
 * clock exchanges). Each connection is put in its guest machine (guests.h) by the identity it
 * opened with, before any other frame of it is handled; what the guest says is checked for
 * size and shape and scoped to that guest, never taken as this host's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/relay_port.pb-c.h"
#include "relay/base/log.h"
#include "relay/base/pb_valid.h"
#include "relay/base/tr_error.h"
#include "relay/clock/clock.h"
#include "relay/producer/producer_port_priv.h"

#define LOG_COMP "relay-port"

static void tell_guest(tr_producer_port *port, const tr_guest *g, bool gone) {
  if (port->cfg.cb.guest_changed && g)
    port->cfg.cb.guest_changed(port, g, gone);
}

/* The guest this connection is of: its claimed boot id (else its address, traced's fallback,
 * so that a connection with no claim is still some guest's, never this host's) and its
 * claimed name: relays sharing a kernel (containers, namespaces) share a boot id, and are
 * told apart by PERFETTO_MACHINE_NAME. */
static void on_identity(tr_ipc_conn *conn, const Perfetto__Protos__IPCFrame__SetPeerIdentity *id) {
  pp_producer *p = tr_ipc_conn_data(conn);
  tr_producer_port *port = p->port;
  char key[TR_GUEST_KEY_MAX + 1];
  const char *name = id && id->machine_name ? id->machine_name : "";
  snprintf(key, sizeof key, "%.*s|%s", TR_GUEST_KEY_MAX / 2,
           id && id->machine_id_hint && id->machine_id_hint[0] ? id->machine_id_hint
                                                               : tr_ipc_conn_peer_addr(conn),
           name);
  bool created;
  int rc = tr_guests_attach(&port->guests, key, name, &p->guest_id, &created);
  if (rc < 0) {
    tr_ipc_conn_close(conn, TR_IPC_CLOSE_RESOURCES,
                      rc == TR_ERR_FULL ? "too many guest machines behind the relay endpoint"
                                        : "out of memory");
    return;
  }
  if (id) {
    /* The claims only ever name things inside the guest: its producers' trusted_uid/pid. */
    p->peer.uid = id->has_uid && id->uid >= 0 ? (uid_t)id->uid : 0;
    p->peer.pid = id->has_pid && id->pid >= 0 ? (pid_t)id->pid : 0;
    p->shm.uid = (uint32_t)p->peer.uid;
    p->shm.pid = (int32_t)p->peer.pid;
  }
  const tr_guest *g = tr_guests_find(&port->guests, p->guest_id);
  if (created) {
    TR_INFO(LOG_COMP, "guest machine %u \"%s\" (from %s) joined through the relay endpoint",
            g->id, g->name, tr_ipc_conn_peer_addr(conn));
    tell_guest(port, g, false);
  }
}

void pp_relay_leave(pp_producer *p) {
  if (!p->guest_id)
    return;
  tr_producer_port *port = p->port;
  const tr_guest *g = tr_guests_find(&port->guests, p->guest_id);
  if (!g || g->conns > 1) {
    tr_guests_detach(&port->guests, p->guest_id);
    return;
  }
  /* Its last connection: the caller hears of it before the entry goes. */
  TR_INFO(LOG_COMP, "guest machine %u \"%s\" left", g->id, g->name);
  tell_guest(port, g, true);
  tr_guests_detach(&port->guests, p->guest_id);
}

static ProtobufCMessage *decode(tr_ipc_conn *conn, uint64_t request_id,
                                const ProtobufCMessageDescriptor *d, const uint8_t *args,
                                size_t len) {
  pp_producer *p = tr_ipc_conn_data(conn);
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, args);
  if (m && !tr_pb_tags_valid(m)) {
    protobuf_c_message_free_unpacked(m, NULL);
    m = NULL;
  }
  if (!m || !p->guest_id) {
    if (m)
      protobuf_c_message_free_unpacked(m, NULL);
    tr_ipc_conn_reply(conn, request_id, false, false, NULL, 0, -1);
    pp_violation(p, d->short_name, m ? "no guest identity" : "arguments do not decode");
    return NULL;
  }
  return m;
}

static void m_init_relay(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                         size_t len, bool drop_reply) {
  (void)drop_reply;
  pp_producer *p = tr_ipc_conn_data(conn);
  tr_producer_port *port = p->port;
  Perfetto__Protos__InitRelayRequest *req =
      (void *)decode(conn, request_id, &perfetto__protos__init_relay_request__descriptor, args, len);
  if (!req)
    return;
  int rc = 0;
  if (req->system_info) {
    /* Kept as the guest's bytes re-encoded from the checked message: its unknown fields too. */
    size_t n = protobuf_c_message_get_packed_size(&req->system_info->base);
    uint8_t *buf = n <= TR_GUEST_SYSINFO_MAX ? malloc(n ? n : 1) : NULL;
    rc = buf ? 0 : n > TR_GUEST_SYSINFO_MAX ? TR_ERR_TOO_BIG : TR_ERR_NOMEM;
    if (buf) {
      protobuf_c_message_pack(&req->system_info->base, buf);
      rc = tr_guests_set_system_info(&port->guests, p->guest_id, buf, n);
      free(buf);
    }
  }
  perfetto__protos__init_relay_request__free_unpacked(req, NULL);
  if (rc < 0) {
    tr_ipc_conn_reply(conn, request_id, false, false, NULL, 0, -1);
    pp_violation(p, "InitRelay", tr_strerror(rc));
    return;
  }
  tr_ipc_conn_reply(conn, request_id, true, false, NULL, 0, -1);
  tell_guest(port, tr_guests_find(&port->guests, p->guest_id), false);
}

static void m_sync_clock(tr_ipc_conn *conn, uint64_t request_id, const uint8_t *args,
                         size_t len, bool drop_reply) {
  (void)drop_reply;
  /* Read first: the exchange's bound is the earlier, the closer this is to the arrival. */
  uint64_t now = tr_clock_boottime_ns();
  pp_producer *p = tr_ipc_conn_data(conn);
  tr_producer_port *port = p->port;
  Perfetto__Protos__SyncClockRequest *req =
      (void *)decode(conn, request_id, &perfetto__protos__sync_clock_request__descriptor, args, len);
  if (!req)
    return;
  struct tr_guest_clock clocks[TR_GUEST_CLOCKS_MAX];
  size_t n = req->n_clocks <= TR_GUEST_CLOCKS_MAX ? req->n_clocks : TR_GUEST_CLOCKS_MAX + 1;
  for (size_t i = 0; i < n && i < TR_GUEST_CLOCKS_MAX; i++)
    clocks[i] = (struct tr_guest_clock){req->clocks[i]->clock_id, req->clocks[i]->timestamp};
  enum tr_guest_phase phase = (enum tr_guest_phase)req->phase;
  perfetto__protos__sync_clock_request__free_unpacked(req, NULL);
  /* The reply goes first: the guest's UPDATE, which closes the exchange, waits for it. */
  tr_ipc_conn_reply(conn, request_id, true, false, NULL, 0, -1);
  struct tr_guest_exchange x;
  int rc = tr_guests_sync_clock(&port->guests, p->guest_id, phase, clocks, n, now, &x);
  if (rc < 0)
    pp_violation(p, "SyncClock", "clocks without BOOTTIME, repeated, out of range or too many");
  else if (rc == 1 && port->cfg.cb.guest_clock)
    port->cfg.cb.guest_clock(port, p->guest_id, &x);
}

static const tr_ipc_method kRelayMethods[] = {
    {"InitRelay", m_init_relay},
    {"SyncClock", m_sync_clock},
};

static const tr_ipc_service kRelayService = {
    "RelayPort", kRelayMethods, sizeof(kRelayMethods) / sizeof(kRelayMethods[0])};

int tr_producer_port_start_relay(tr_producer_port *port, const char *addr) {
  if (port->relay_inited)
    return TR_ERR_STATE;
  /* Service ids as on traced's relay endpoint: ProducerPort 1, RelayPort 2. */
  port->relay_services[0] = pp_producer_service;
  port->relay_services[1] = kRelayService;
  tr_ipc_host_config hc = {.name = "relay endpoint",
                           .services = port->relay_services,
                           .num_services = 2,
                           .on_connect = pp_on_connect,
                           .on_disconnect = pp_on_disconnect,
                           .on_identity = on_identity,
                           .max_conns = port->cfg.max_producers,
                           .max_conns_flag = port->cfg.max_producers_flag};
  int rc = tr_ipc_host_init(&port->relay_host, port->loop, &hc);
  if (rc < 0)
    return rc;
  /* From here on the port's close closes it too, and counts it. */
  port->relay_host.data = port;
  port->relay_inited = true;
  port->handles_open++;
  rc = tr_ipc_host_start_net(&port->relay_host, addr);
  if (rc < 0)
    TR_ERROR(LOG_COMP, "relay endpoint %s: %s", addr, tr_strerror(rc));
  return rc;
}

int tr_producer_port_relay_port(const tr_producer_port *port) {
  return port->relay_inited ? tr_ipc_host_net_port(&port->relay_host) : TR_ERR_STATE;
}
