/* link_stub.c: see link_stub.h. */
#include "link_stub.h"

#include <stdio.h>
#include <string.h>

#include "relay/base/tr_error.h"

struct link_event link_events[LINK_STUB_MAX_EVENTS];
size_t link_n_events;

static struct link_event *add(enum link_event_kind kind, const tr_host *host) {
  if (link_n_events == LINK_STUB_MAX_EVENTS)
    return NULL;
  struct link_event *e = &link_events[link_n_events++];
  memset(e, 0, sizeof *e);
  e->kind = kind;
  snprintf(e->host, sizeof e->host, "%s", host->name);
  return e;
}

void link_stub_reset(void) { link_n_events = 0; }

size_t link_stub_count(enum link_event_kind kind, const char *host) {
  size_t n = 0;
  for (size_t i = 0; i < link_n_events; i++)
    if (link_events[i].kind == kind && strcmp(link_events[i].host, host) == 0)
      n++;
  return n;
}

static void on_host_connected(tr_service *svc, tr_host *host) {
  (void)svc;
  add(EV_CONNECTED, host);
}

static void on_host_disconnected(tr_service *svc, tr_host *host, const char *reason) {
  (void)svc;
  (void)reason;
  add(EV_DISCONNECTED, host);
}

static void on_producers_changed(tr_service *svc, tr_host *host, uint32_t producer_id) {
  (void)svc;
  struct link_event *e = add(EV_PRODUCERS, host);
  if (e)
    e->producer_id = producer_id;
}

static void on_chunk(tr_service *svc, tr_host *host, const Tracerelay__Chunk *chunk) {
  (void)svc;
  struct link_event *e = add(EV_CHUNK, host);
  if (e) {
    e->producer_id = chunk->producer_id;
    e->id = chunk->chunk_id;
    e->payload_len = chunk->payload.len;
  }
}

static void on_patch(tr_service *svc, tr_host *host, const Tracerelay__Patch *patch) {
  (void)svc;
  struct link_event *e = add(EV_PATCH, host);
  if (e) {
    e->producer_id = patch->producer_id;
    e->id = patch->chunk_id;
    if (patch->n_entries > 0) {
      e->patch_offset = patch->entries[0]->offset;
      e->patch_data = patch->entries[0]->data;
    }
  }
}

static void on_flush_ack(tr_service *svc, tr_host *host, const Tracerelay__FlushAck *ack,
                         int64_t arrived_ns) {
  (void)svc;
  struct link_event *e = add(EV_FLUSH_ACK, host);
  if (e) {
    e->producer_id = ack->producer_id;
    e->id = ack->flush_request_id;
    e->arrived_ns = arrived_ns;
  }
}

static void on_command_reply(tr_service *svc, tr_host *host,
                             const Tracerelay__CommandReply *reply) {
  (void)svc;
  struct link_event *e = add(EV_REPLY, host);
  if (e)
    e->id = reply->request_id;
}

static int on_host_clock_snapshot(tr_service *svc, tr_host *host,
                                  const Tracerelay__HostClockSnapshot *snap) {
  (void)svc;
  (void)host;
  return snap->n_clocks > 0 ? 0 : TR_ERR_PROTO;
}

bool link_stub_session;

static bool any_session(const tr_service *svc) {
  (void)svc;
  return link_stub_session;
}

const struct tr_link_events link_stub_events = {
    .host_connected = on_host_connected,
    .host_disconnected = on_host_disconnected,
    .producers_changed = on_producers_changed,
    .chunk = on_chunk,
    .patch = on_patch,
    .flush_ack = on_flush_ack,
    .command_reply = on_command_reply,
    .host_clock_snapshot = on_host_clock_snapshot,
    .any_session = any_session,
};
