/* relay_carrier.c: carriers, links that carry other links (relay_link.h, carriers): a
 * regional's one link to its upstream, with every relayed host's link in a slot of it.
 *
 * A carrier keeps its open slots in an array sorted by slot (slots only grow, so a new one is
 * appended; lookups are binary searches), and gathers what is written to it, its own frames
 * and its carried links', into one buffer sent once per loop turn (libuv's prepare and check
 * phases: before the loop sleeps, after it woke) or at once past FLUSH_AT bytes: a thousand
 * hosts' acks or flush commands become a few TLS records and one system call. With a linger
 * (tr_relay_carrier_set_linger) what was gathered waits up to that long after its first byte
 * for the turns after, on a timer: a regional's upstream then wakes once for many of its
 * turns. A carried link
 * that ends is taken out of the array at once (later frames for its slot are dropped) and
 * hears on_closed in the same phases, never from inside the call that ended it. The carrier's
 * state lives apart from the link, as the two libuv handles close after it is gone.
 *
 * Below relay_link.c: it calls nothing there by name, only the table of the link it serves
 * (l->ops, relay_link_priv.h), and the transport (tls_uv.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link_priv.h"

#define FLUSH_AT (256u << 10)
/* Room a slot takes in a frame: its tag and a varint of up to 10 bytes. */
#define SLOT_OVERHEAD 16

struct slot_entry {
  uint64_t slot;
  tr_relay_link *link;
};

struct tr_relay_carrier {
  tr_relay_link *link; /* NULL once the link is freed: the handles are closing */
  const struct tr_relay_link_events *accept_ev; /* slots the peer opens; NULL: none */
  void *accept_data;
  unsigned max_slots;
  struct slot_entry *slots;
  size_t num_slots, cap_slots;
  uint64_t last_slot; /* the highest slot opened, by either side */
  tr_relay_link *touched;      /* carried links with frames in the read being processed */
  tr_relay_link **ended;       /* carried links that ended, waiting for their on_closed */
  size_t num_ended, cap_ended;
  tr_byte_buf out;             /* the gathered output */
  unsigned linger_ms;          /* how long it may wait for more; 0: it goes at the turn's end */
  uint64_t gathered_ms;        /* the loop's time when its first byte was gathered */
  uv_prepare_t prepare;
  uv_check_t check;
  uv_timer_t linger;           /* the gathered output's time is up */
  int handles_open;
};

/* ---- the slot table ---- */

static size_t slot_index(const tr_relay_carrier *c, uint64_t slot) {
  size_t lo = 0, hi = c->num_slots;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->slots[mid].slot < slot)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static tr_relay_link *slot_find(const tr_relay_carrier *c, uint64_t slot) {
  size_t i = slot_index(c, slot);
  return i < c->num_slots && c->slots[i].slot == slot ? c->slots[i].link : NULL;
}

/* Slots are added in increasing order: at the end. */
static int slot_add(tr_relay_carrier *c, tr_relay_link *child) {
  if (c->num_slots == c->cap_slots) {
    size_t cap = c->cap_slots ? c->cap_slots * 2 : 16;
    struct slot_entry *grown = realloc(c->slots, cap * sizeof *grown);
    if (grown == NULL)
      return TR_ERR_NOMEM;
    c->slots = grown;
    c->cap_slots = cap;
  }
  c->slots[c->num_slots++] = (struct slot_entry){child->slot, child};
  return 0;
}

static void slot_remove(tr_relay_carrier *c, uint64_t slot) {
  size_t i = slot_index(c, slot);
  if (i == c->num_slots || c->slots[i].slot != slot)
    return;
  memmove(&c->slots[i], &c->slots[i + 1], (c->num_slots - i - 1) * sizeof c->slots[0]);
  c->num_slots--;
}

/* ---- the loop's phases: the gathered output goes, ended links hear on_closed ---- */

static void phase_stop(tr_relay_carrier *c) {
  uv_prepare_stop(&c->prepare);
  uv_check_stop(&c->check);
  uv_timer_stop(&c->linger);
}

static void reap_ended(tr_relay_carrier *c) {
  /* on_closed may end more links: take the list as it is, and go round again. */
  while (c->num_ended > 0) {
    tr_relay_link *child = c->ended[--c->num_ended];
    child->ev->on_closed(child, child->end_reason,
                         child->end_reason != 0 ? "the peer ended it" : "closed by us");
    child->ops->free(child);
  }
}

static void on_linger(uv_timer_t *t);

/* Whether the gathered output goes now: at once without a linger, else when its time is up
 * (the timer set for then, so that the loop does not sleep past it). */
static bool output_due(tr_relay_carrier *c) {
  if (c->linger_ms == 0)
    return true;
  uint64_t now = uv_now(c->prepare.loop), due = c->gathered_ms + c->linger_ms;
  if (now >= due)
    return true;
  if (!uv_is_active((uv_handle_t *)&c->linger))
    uv_timer_start(&c->linger, on_linger, due - now, 0);
  return false;
}

static void on_phase(tr_relay_carrier *c) {
  tr_relay_link *l = c->link;
  reap_ended(c);
  if (l != NULL && c->out.len > 0 && output_due(c))
    l->ops->wrote(l, tr_relay_carrier_flush(l));
  if (c->num_ended == 0 && c->out.len == 0)
    phase_stop(c);
}

static void on_prepare(uv_prepare_t *h) { on_phase(h->data); }
static void on_check(uv_check_t *h) { on_phase(h->data); }
static void on_linger(uv_timer_t *t) { on_phase(t->data); }

static void phase_start(tr_relay_carrier *c) {
  if (c->link == NULL)
    return;
  uv_prepare_start(&c->prepare, on_prepare);
  uv_check_start(&c->check, on_check);
}

static void on_handle_closed(uv_handle_t *h) {
  tr_relay_carrier *c = h->data;
  if (--c->handles_open == 0)
    free(c);
}

/* ---- output ---- */

int tr_relay_carrier_write(tr_relay_link *l, const uint8_t *buf, size_t len) {
  tr_relay_carrier *c = l->carrier;
  if (c->out.len == 0)
    c->gathered_ms = uv_now(c->prepare.loop);
  if (tr_byte_buf_append(&c->out, buf, len, 64u << 10) < 0)
    return TR_ERR_NOMEM;
  l->frames_out++;
  if (c->out.len >= FLUSH_AT)
    return tr_relay_carrier_flush(l);
  phase_start(c);
  return (int)(tr_tls_uv_queued(l->conn) + c->out.len);
}

int tr_relay_carrier_flush(tr_relay_link *l) {
  tr_relay_carrier *c = l->carrier;
  if (c->out.len == 0)
    return 0;
  uv_timer_stop(&c->linger);
  l->writes++;
  int rc = tr_tls_uv_write(l->conn, c->out.data, c->out.len);
  c->out.len = 0;
  if (c->out.cap > FLUSH_AT * 2) /* a burst's buffer is not kept */
    tr_byte_buf_free(&c->out);
  return rc;
}

size_t tr_relay_carrier_gathered(const tr_relay_link *l) { return l->carrier->out.len; }

void tr_relay_carrier_set_linger(tr_relay_link *l, unsigned ms) {
  if (l->carrier != NULL)
    l->carrier->linger_ms = ms;
}

/* ---- carried links: their side of the API ---- */

/* child ended: out of the table now, on_closed in the loop's next phase. */
static void end_child(tr_relay_link *child) {
  tr_relay_carrier *c = child->parent->carrier;
  if (!child->closing) {
    child->closing = true;
    if (child->ev->on_closing != NULL)
      child->ev->on_closing(child);
  }
  slot_remove(c, child->slot);
  if (c->num_ended == c->cap_ended) {
    size_t cap = c->cap_ended ? c->cap_ended * 2 : 16;
    tr_relay_link **grown = realloc(c->ended, cap * sizeof *grown);
    if (grown == NULL) { /* cannot wait: it hears on_closed now, out of the read's list */
      for (tr_relay_link **t = &c->touched; *t != NULL; t = &(*t)->next_touched)
        if (*t == child) {
          *t = child->next_touched;
          break;
        }
      child->ev->on_closed(child, child->end_reason, "closed");
      child->ops->free(child);
      return;
    }
    c->ended = grown;
    c->cap_ended = cap;
  }
  c->ended[c->num_ended++] = child;
  phase_start(c);
}

int tr_relay_carried_write_frame(tr_relay_link *child, const Tracerelay__RelayFrame *f) {
  tr_relay_link *l = child->parent;
  if (l->closing)
    return TR_ERR_CLOSED;
  Tracerelay__RelayFrame marked = *f;
  marked.has_slot = 1;
  marked.slot = child->slot;
  uint8_t *buf;
  size_t len;
  int rc = tr_relay_frame_encode(&marked, child->max_out + SLOT_OVERHEAD, &buf, &len);
  if (rc < 0)
    return rc;
  rc = tr_relay_carrier_write(l, buf, len);
  free(buf);
  return l->ops->wrote(l, rc);
}

int tr_relay_carried_send(tr_relay_link *child, const Tracerelay__RelayFrame *f) {
  if (child->closing || child->parent->closing)
    return TR_ERR_CLOSED;
  return tr_relay_carried_write_frame(child, f);
}

/* Ends the slot for the peer too: a Goodbye without a reason, as a closed connection says,
 * unless ours with a reason or the peer's own ended it. */
void tr_relay_carried_hang_up(tr_relay_link *child) {
  if (!child->peer_gone && !child->said_goodbye && !child->parent->closing) {
    Tracerelay__Goodbye bye = TRACERELAY__GOODBYE__INIT;
    Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
    f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GOODBYE;
    f.goodbye = &bye;
    tr_relay_carried_write_frame(child, &f);
  }
  end_child(child);
}

static tr_relay_link *new_child(tr_relay_link *l, uint64_t slot,
                                const struct tr_relay_link_events *ev, void *data) {
  tr_relay_carrier *c = l->carrier;
  struct tr_relay_link_opts opts = l->opts;
  opts.label = NULL;
  opts.pause_read_above = 0;
  tr_relay_link *child = l->ops->alloc(&opts, ev, data);
  if (child == NULL)
    return NULL;
  child->parent = l;
  child->slot = slot;
  child->open = child->established = true;
  /* What a carried frame may be: what the carrier's reader takes, less the slot's room. */
  child->reader.max_payload = l->reader.max_payload - SLOT_OVERHEAD;
  child->max_out = l->max_out - SLOT_OVERHEAD;
  int n = snprintf(child->label, sizeof child->label, "slot %llu of ", (unsigned long long)slot);
  snprintf(child->label + n, sizeof child->label - (size_t)n, "%.*s",
           (int)(sizeof child->label - (size_t)n - 1), l->label);
  if (slot_add(c, child) < 0) {
    child->ops->free(child);
    return NULL;
  }
  c->last_slot = slot;
  return child;
}

int tr_relay_link_open_slot(tr_relay_link *l, const struct tr_relay_link_events *ev, void *data,
                            tr_relay_link **out) {
  if (l->carrier == NULL || l->closing)
    return l->carrier == NULL ? TR_ERR_STATE : TR_ERR_CLOSED;
  /* No number is left after the highest slot (the peer may have opened it): one past it would
   * wrap to 0, the carrier's own frames. */
  if (l->carrier->num_slots >= l->carrier->max_slots || l->carrier->last_slot == UINT64_MAX)
    return TR_ERR_FULL;
  tr_relay_link *child = new_child(l, l->carrier->last_slot + 1, ev, data);
  if (child == NULL)
    return TR_ERR_NOMEM;
  *out = child;
  if (ev->on_open != NULL)
    ev->on_open(child);
  return 0;
}

/* ---- frames in ---- */

static void mark_touched(tr_relay_link *child) {
  if (child->touched)
    return;
  tr_relay_carrier *c = child->parent->carrier;
  child->touched = true;
  child->next_touched = c->touched;
  c->touched = child;
}

/* The carried link a frame for slot is for: open, or opened now by the peer; NULL: the frame
 * is dropped (a slot that ended, or one the peer may not open; or l is closing). */
static tr_relay_link *child_for(tr_relay_link *l, uint64_t slot) {
  tr_relay_carrier *c = l->carrier;
  tr_relay_link *child = slot_find(c, slot);
  if (child != NULL || c->accept_ev == NULL || slot <= c->last_slot)
    return child;
  if (c->num_slots >= c->max_slots) {
    char text[160];
    snprintf(text, sizeof text, "protocol error: slot %llu opened while %zu are open, the most "
             "this side takes", (unsigned long long)slot, c->num_slots);
    l->ops->close(l, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR, text);
    return NULL;
  }
  child = new_child(l, slot, c->accept_ev, c->accept_data);
  if (child == NULL) {
    l->ops->close(l, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "out of memory");
    return NULL;
  }
  if (child->ev->on_open != NULL)
    child->ev->on_open(child);
  return child->closing ? NULL : child;
}

void tr_relay_carrier_deliver(tr_relay_link *l, Tracerelay__RelayFrame *f, size_t len) {
  uint64_t slot = f->slot;
  f->has_slot = 0; /* the frame is the carried link's now, as if it had come on its own */
  f->slot = 0;
  tr_relay_link *child = child_for(l, slot);
  if (child == NULL) {
    l->dropped_frames += !l->closing;
    tr_relay_frame_free(f);
    return;
  }
  child->bytes_in += len;
  mark_touched(child);
  if (f->msg_case != TRACERELAY__RELAY_FRAME__MSG_GOODBYE) {
    child->ev->on_frame(child, f);
    return;
  }
  /* The peer ended the slot: a Goodbye without a reason is a closed connection's silence. */
  child->peer_gone = true;
  child->end_reason = TR_ERR_CLOSED;
  const Tracerelay__Goodbye *g = f->goodbye;
  if (g->has_reason && g->reason != TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED) {
    child->ev->on_frame(child, f);
    f = NULL;
  }
  tr_relay_frame_free(f);
  if (!child->closing)
    end_child(child);
}

void tr_relay_carrier_read_done(tr_relay_link *l) {
  tr_relay_carrier *c = l->carrier;
  tr_relay_link *child = c->touched;
  c->touched = NULL;
  while (child != NULL) {
    tr_relay_link *next = child->next_touched;
    child->touched = false;
    if (!child->closing && child->ev->on_read_done != NULL)
      child->ev->on_read_done(child);
    child = next;
  }
}

void tr_relay_carrier_drain(tr_relay_link *l) {
  tr_relay_carrier *c = l->carrier;
  /* on_drain may end links (and take them out of the table): walk a copy of the slots. */
  size_t n = c->num_slots;
  uint64_t *slots = malloc(n * sizeof *slots + 1);
  if (slots == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    slots[i] = c->slots[i].slot;
  for (size_t i = 0; i < n && !l->closing; i++) {
    tr_relay_link *child = slot_find(c, slots[i]);
    if (child != NULL && child->ev->on_drain != NULL)
      child->ev->on_drain(child);
  }
  free(slots);
}

/* ---- the carrier's life ---- */

int tr_relay_link_carry(tr_relay_link *l, const struct tr_relay_link_events *accept_ev,
                        void *data, unsigned max_slots) {
  if (l->carrier != NULL || l->parent != NULL)
    return TR_ERR_STATE;
  tr_relay_carrier *c = calloc(1, sizeof *c);
  if (c == NULL)
    return TR_ERR_NOMEM;
  c->link = l;
  c->accept_ev = accept_ev;
  c->accept_data = data;
  c->max_slots = max_slots;
  uv_loop_t *loop = tr_tls_uv_loop(l->conn);
  uv_prepare_init(loop, &c->prepare);
  uv_check_init(loop, &c->check);
  uv_timer_init(loop, &c->linger);
  c->prepare.data = c->check.data = c->linger.data = c;
  c->handles_open = 3;
  l->carrier = c;
  return 0;
}

void tr_relay_carrier_end(tr_relay_link *l, int reason, const char *why) {
  tr_relay_carrier *c = l->carrier;
  reap_ended(c);
  /* Newest first, as links go in a table walked from the end. */
  while (c->num_slots > 0) {
    tr_relay_link *child = c->slots[--c->num_slots].link;
    if (!child->closing) {
      child->closing = true;
      if (child->ev->on_closing != NULL)
        child->ev->on_closing(child);
    }
    child->ev->on_closed(child, reason != 0 ? reason : TR_ERR_CLOSED,
                         reason != 0 ? why : "its carrier was closed by this side");
    child->ops->free(child);
  }
  reap_ended(c); /* any that on_closed ended */
  free(c->slots);
  free(c->ended);
  tr_byte_buf_free(&c->out);
  c->slots = NULL;
  c->ended = NULL;
  c->link = NULL;
  l->carrier = NULL;
  phase_stop(c);
  uv_close((uv_handle_t *)&c->prepare, on_handle_closed);
  uv_close((uv_handle_t *)&c->check, on_handle_closed);
  uv_close((uv_handle_t *)&c->linger, on_handle_closed);
}

bool tr_relay_link_carried(const tr_relay_link *l) { return l->parent != NULL; }

void tr_relay_link_carrier_stats(const tr_relay_link *l, struct tr_relay_carrier_stats *out) {
  *out = (struct tr_relay_carrier_stats){.carried = l->carrier ? (unsigned)l->carrier->num_slots
                                                               : 0,
                                         .dropped_frames = l->dropped_frames,
                                         .frames_out = l->frames_out,
                                         .writes = l->writes};
}
