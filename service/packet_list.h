/* packet_list.h: the service's own packets of a session, in the order they are to be written,
 * bytes owned: a read pass's head and the session's clock journal (service/trace_output.h).
 *
 * Room is reserved before pushes, so a push cannot fail; a pinned packet (a `machines` clock
 * anchor, a bound track's sample) survives thinning, which keeps the journal bounded when a
 * session goes unread.
 * tr_output_packet is one packet as a read pass yields it. */
#ifndef TR_PACKET_LIST_H
#define TR_PACKET_LIST_H

#include <stdbool.h>
#include <stddef.h>

#include "relay/trace/packet_trusted.h"
#include "relay/trace/trace_writer.h"

typedef struct tr_output_packet {
  const uint8_t *data; /* valid until the next tr_trace_output_next of the pass */
  size_t len;
  uint8_t trusted[TR_TBUF_TRUSTED_MAX]; /* appended after data; empty for service packets */
  size_t trusted_len;
} tr_output_packet;

typedef struct tr_packet_list {
  tr_trace_writer_buf *items;
  bool *pinned; /* [cap]: items[i] must survive thinning */
  size_t n, cap;
} tr_packet_list;

/* Room for `more` pushes: 0 or TR_ERR_NOMEM. */
int tr_packet_list_reserve(tr_packet_list *l, size_t more);
/* A push into reserved room (pinned: a packet thinning must keep). */
void tr_packet_list_push(tr_packet_list *l, tr_trace_writer_buf b);
void tr_packet_list_push_pinned(tr_packet_list *l, tr_trace_writer_buf b);
/* Drops (frees) every other packet of the list's older half, pinned ones aside, keeping the
 * order: each host's series then covers the same time at half the density there. */
void tr_packet_list_thin(tr_packet_list *l);
/* Frees the list and every packet in it; it is then empty. */
void tr_packet_list_free(tr_packet_list *l);

#endif
