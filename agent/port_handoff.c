/* port_handoff.c: two message lists and a chunk queue under one mutex (see port_handoff.h). */
#include "agent/port_handoff.h"

#include <string.h>

int tr_port_handoff_init(tr_port_handoff *h, size_t outbox_bytes, size_t urge_bytes) {
  memset(h, 0, sizeof(*h));
  tr_chunkq_init(&h->outbox, outbox_bytes);
  h->urge_bytes = urge_bytes;
  h->outbox_cap = outbox_bytes;
  return uv_mutex_init(&h->lock);
}

static void free_list(tr_port_msg *m, void (*free_msg)(tr_port_msg *m)) {
  while (m != NULL) {
    tr_port_msg *next = m->next;
    free_msg(m);
    m = next;
  }
}

void tr_port_handoff_free(tr_port_handoff *h, void (*free_event)(tr_port_msg *m),
                          void (*free_command)(tr_port_msg *m)) {
  free_list(h->events, free_event);
  free_list(h->commands, free_command);
  h->events = h->commands = NULL;
  tr_chunkq_free(&h->outbox);
  uv_mutex_destroy(&h->lock);
}

static void append(tr_port_msg **head, tr_port_msg **tail, tr_port_msg *m) {
  m->next = NULL;
  if (*tail)
    (*tail)->next = m;
  else
    *head = m;
  *tail = m;
}

static tr_port_msg *take(tr_port_msg **head, tr_port_msg **tail) {
  tr_port_msg *m = *head;
  *head = *tail = NULL;
  return m;
}

static void wake(uv_async_t *a) {
  if (a != NULL)
    uv_async_send(a);
}

void tr_port_handoff_closing(tr_port_handoff *h, uv_async_t *a) {
  uv_mutex_lock(&h->lock);
  if (h->wake_link == a)
    h->wake_link = NULL;
  if (h->wake_port == a)
    h->wake_port = NULL;
  uv_mutex_unlock(&h->lock);
}

size_t tr_port_handoff_outbox_bytes(tr_port_handoff *h) {
  uv_mutex_lock(&h->lock);
  size_t bytes = h->outbox.bytes;
  uv_mutex_unlock(&h->lock);
  return bytes;
}

void tr_port_handoff_post_event(tr_port_handoff *h, tr_port_msg *m) {
  uv_mutex_lock(&h->lock);
  m->after_qseq = h->outbox.next_seq - 1;
  append(&h->events, &h->events_tail, m);
  h->link_woken = true;
  wake(h->wake_link);
  uv_mutex_unlock(&h->lock);
}

void tr_port_handoff_wake_link(tr_port_handoff *h) {
  uv_mutex_lock(&h->lock);
  bool urge = !h->link_urged && h->outbox.bytes >= h->urge_bytes;
  if (!h->link_woken || urge)
    wake(h->wake_link);
  h->link_woken = true;
  h->link_urged |= urge;
  uv_mutex_unlock(&h->lock);
}

tr_port_msg *tr_port_handoff_take_commands(tr_port_handoff *h) {
  uv_mutex_lock(&h->lock);
  tr_port_msg *m = take(&h->commands, &h->commands_tail);
  uv_mutex_unlock(&h->lock);
  return m;
}

void tr_port_handoff_post_command(tr_port_handoff *h, tr_port_msg *m) {
  m->after_qseq = 0;
  uv_mutex_lock(&h->lock);
  append(&h->commands, &h->commands_tail, m);
  wake(h->wake_port);
  uv_mutex_unlock(&h->lock);
}

void tr_port_handoff_set_room(tr_port_handoff *h, size_t room) {
  size_t floor = TR_PORT_OUTBOX_FLOOR < h->outbox_cap ? TR_PORT_OUTBOX_FLOOR : h->outbox_cap;
  uv_mutex_lock(&h->lock);
  h->outbox.max_bytes = room < floor ? floor : room > h->outbox_cap ? h->outbox_cap : room;
  uv_mutex_unlock(&h->lock);
}

bool tr_port_handoff_urgent(tr_port_handoff *h) {
  uv_mutex_lock(&h->lock);
  bool urgent = h->events != NULL || h->outbox.bytes >= h->urge_bytes;
  uv_mutex_unlock(&h->lock);
  return urgent;
}

tr_port_msg *tr_port_handoff_take_events(tr_port_handoff *h, tr_chunkq *entries) {
  uv_mutex_lock(&h->lock);
  h->link_woken = h->link_urged = false;
  tr_port_msg *m = take(&h->events, &h->events_tail);
  tr_chunkq_take(&h->outbox, entries);
  uv_mutex_unlock(&h->lock);
  return m;
}
