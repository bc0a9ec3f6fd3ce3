/* link_stub.h: a recording stand-in for the sessions' side of the link's upward calls
 * (link_stub_events, for tr_link_server_start), so the relay link can be tested without
 * sessions. Every upward call is appended, in order, to one event log that the test reads. */
#ifndef TR_TEST_LINK_STUB_H
#define TR_TEST_LINK_STUB_H

#include <stddef.h>
#include <stdint.h>

#include "service/link_calls.h"

enum link_event_kind {
  EV_CONNECTED,
  EV_DISCONNECTED,
  EV_PRODUCERS,
  EV_CHUNK,
  EV_PATCH,
  EV_FLUSH_ACK,
  EV_REPLY,
};

struct link_event {
  enum link_event_kind kind;
  char host[TR_HOST_NAME_MAX + 1];
  uint32_t producer_id;
  uint64_t id; /* chunk_id, patched chunk_id, flush_request_id or request_id */
  uint32_t patch_offset;
  uint32_t patch_data;
  size_t payload_len;
  int64_t arrived_ns; /* a flush ack's: when its bytes reached the service's socket */
};

#define LINK_STUB_MAX_EVENTS 200000

extern struct link_event link_events[LINK_STUB_MAX_EVENTS];
extern size_t link_n_events;

extern const struct tr_link_events link_stub_events;
/* What any_session answers (false unless a test sets it). */
extern bool link_stub_session;

void link_stub_reset(void);
/* Events of one kind for one host. */
size_t link_stub_count(enum link_event_kind kind, const char *host);

#endif
