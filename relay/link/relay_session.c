/* relay_session.c: the link bookkeeping behind relay_session.h.
 *
 * Why a dropped batch can be "in doubt", and why one ack or Welcome settles it: batches go out
 * in seq order on a connection, and TCP delivers in order, so if the service processed a
 * batch sent after batch k on k's connection, it had k too. A batch dropped after it was sent
 * is therefore stored exactly when a later ack or Welcome reaches its seq; at a Welcome, every
 * dropped batch above Welcome.stored_seq never arrived and never will (we no longer hold it).
 * Held batches are one singly linked FIFO, with a cursor for the next one to send. */
#include "relay/link/relay_session.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

struct tr_relay_batch {
  tr_relay_batch *next;
  uint64_t seq;
  uint8_t *frame; /* NULL once dropped */
  size_t len;
  /* Written on the current connection, or on the last one and no Welcome since: the
   * service may have it. */
  bool sent;
  tr_relay_tally *tally;
  size_t n_tally;
};

/* ---- features ---- */

uint64_t tr_relay_features_negotiate(uint64_t ours, uint64_t offered) { return ours & offered; }

uint32_t tr_relay_max_frame_said(bool has, uint32_t bytes) {
  uint32_t max = has && bytes != 0 ? bytes : TR_RELAY_MAX_FRAME_DEFAULT;
  return max < TR_RELAY_MIN_FRAME || max > TR_RELAY_MAX_FRAME_LIMIT ? 0 : max;
}

int tr_relay_features_check(uint64_t offered, uint64_t accepted) {
  return (accepted & ~offered) ? TR_ERR_PROTO : 0;
}

/* ---- agent ---- */

static void batch_free(tr_relay_batch *b) {
  free(b->frame);
  free(b->tally);
  free(b);
}

static void list_free(tr_relay_batch *b) {
  while (b) {
    tr_relay_batch *next = b->next;
    batch_free(b);
    b = next;
  }
}

static void append(tr_relay_batch **head, tr_relay_batch **tail, tr_relay_batch *b) {
  b->next = NULL;
  if (*tail)
    (*tail)->next = b;
  else
    *head = b;
  *tail = b;
}

/* Counts a batch the service will never have, then frees it. */
static int count_lost(tr_relay_agent *a, tr_relay_batch *b) {
  int rc = 0;
  a->lost_batches++;
  a->lost_frame_bytes += b->len;
  for (size_t i = 0; i < b->n_tally && rc == 0; i++)
    rc = tr_relay_tally_add(&a->lost, &a->n_lost, &b->tally[i]);
  batch_free(b);
  return rc;
}

/* Takes the oldest held batch out of the queue: lost now if the service cannot have it,
 * in doubt until the next ack or Welcome otherwise. */
static int drop_oldest(tr_relay_agent *a) {
  tr_relay_batch *b = a->head;
  a->head = b->next;
  if (a->tail == b)
    a->tail = NULL;
  if (a->cursor == b)
    a->cursor = b->next;
  a->held_bytes -= b->len;
  free(b->frame);
  b->frame = NULL;
  if (!b->sent)
    return count_lost(a, b);
  append(&a->doubt_head, &a->doubt_tail, b);
  return 0;
}

/* Frees held batches up to seq: the service has them. */
static void free_stored(tr_relay_agent *a, uint64_t seq) {
  while (a->head && a->head->seq <= seq) {
    tr_relay_batch *b = a->head;
    a->head = b->next;
    if (a->tail == b)
      a->tail = NULL;
    if (a->cursor == b)
      a->cursor = b->next;
    a->held_bytes -= b->len;
    batch_free(b);
  }
}

/* Settles dropped batches: up to seq they were stored; above it, if lost_above, they were not. */
static int settle_doubt(tr_relay_agent *a, uint64_t seq, bool lost_above) {
  int rc = 0;
  tr_relay_batch *keep_head = NULL, *keep_tail = NULL;
  tr_relay_batch *b = a->doubt_head;
  while (b) {
    tr_relay_batch *next = b->next;
    if (b->seq <= seq)
      batch_free(b);
    else if (lost_above) {
      int r = count_lost(a, b);
      if (r < 0)
        rc = r;
    } else
      append(&keep_head, &keep_tail, b);
    b = next;
  }
  a->doubt_head = keep_head;
  a->doubt_tail = keep_tail;
  return rc;
}

int tr_relay_agent_init(tr_relay_agent *a, uint64_t instance_id, size_t spill_bytes) {
  memset(a, 0, sizeof *a);
  if (instance_id == 0)
    return TR_ERR_INVAL;
  a->instance_id = instance_id;
  a->next_seq = 1;
  a->spill_bytes = spill_bytes ? spill_bytes : TR_RELAY_SPILL_DEFAULT;
  return 0;
}

void tr_relay_agent_free(tr_relay_agent *a) {
  list_free(a->head);
  list_free(a->doubt_head);
  free(a->lost);
  memset(a, 0, sizeof *a);
}

int tr_relay_agent_queue(tr_relay_agent *a, uint64_t seq, uint8_t *frame, size_t len,
                         tr_relay_tally *tally, size_t n_tally) {
  if (seq != a->next_seq) {
    free(frame);
    free(tally);
    return TR_ERR_INVAL;
  }
  tr_relay_batch *b = calloc(1, sizeof *b);
  if (!b) {
    free(frame);
    free(tally);
    return TR_ERR_NOMEM;
  }
  *b = (tr_relay_batch){.seq = seq, .frame = frame, .len = len, .tally = tally, .n_tally = n_tally};
  /* The seq is spent even if the batch is dropped here: the service sees the gap. */
  a->next_seq++;
  if (len > a->spill_bytes) {
    int rc = count_lost(a, b);
    return rc < 0 ? rc : TR_ERR_TOO_BIG;
  }
  while (a->held_bytes + len > a->spill_bytes) {
    int rc = drop_oldest(a);
    if (rc < 0) {
      count_lost(a, b);
      return rc;
    }
  }
  append(&a->head, &a->tail, b);
  a->held_bytes += len;
  if (!a->cursor)
    a->cursor = b;
  return 0;
}

int tr_relay_agent_next(tr_relay_agent *a, const uint8_t **frame, size_t *len, uint64_t *seq) {
  if (!a->resumed || !a->cursor)
    return 0;
  tr_relay_batch *b = a->cursor;
  b->sent = true;
  a->sent_seq = b->seq;
  a->cursor = b->next;
  *frame = b->frame;
  *len = b->len;
  *seq = b->seq;
  return 1;
}

int tr_relay_agent_ack(tr_relay_agent *a, uint64_t seq) {
  if (!a->resumed)
    return TR_ERR_PROTO;
  if (seq <= a->acked_seq)
    return 0;
  if (seq > a->sent_seq)
    return TR_ERR_PROTO;
  a->acked_seq = seq;
  free_stored(a, seq);
  return settle_doubt(a, seq, false);
}

int tr_relay_agent_resume(tr_relay_agent *a, uint64_t stored_seq) {
  if (stored_seq >= a->next_seq || (stored_seq != 0 && stored_seq < a->acked_seq))
    return TR_ERR_PROTO;
  if (stored_seq > a->acked_seq)
    a->acked_seq = stored_seq;
  free_stored(a, stored_seq);
  int rc = settle_doubt(a, stored_seq, true);
  /* What is still held is above stored_seq, so the service has none of it. */
  for (tr_relay_batch *b = a->head; b; b = b->next)
    b->sent = false;
  a->cursor = a->head;
  a->sent_seq = a->acked_seq;
  a->resumed = true;
  return rc;
}

void tr_relay_agent_disconnected(tr_relay_agent *a) { a->resumed = false; }

/* ---- service ---- */

void tr_relay_peer_init(tr_relay_peer *p) { memset(p, 0, sizeof *p); }

int tr_relay_peer_hello(tr_relay_peer *p, uint64_t instance_id, uint64_t agent_acked_seq,
                        uint64_t *welcome_seq) {
  if (instance_id == 0)
    return TR_ERR_PROTO;
  if (instance_id == p->instance_id) {
    if (agent_acked_seq > p->stored_seq)
      return TR_ERR_PROTO;
    *welcome_seq = p->stored_seq;
    return 0;
  }
  /* A new agent process, or an agent we have not seen since we started. Batches it says
   * were acked went to an earlier service instance: not a gap. */
  if (p->instance_id != 0)
    p->agent_restarts++;
  p->instance_id = instance_id;
  p->stored_seq = agent_acked_seq;
  *welcome_seq = 0;
  return 0;
}

int tr_relay_peer_batch(tr_relay_peer *p, uint64_t seq) {
  if (seq == 0 || p->instance_id == 0)
    return TR_ERR_PROTO;
  if (seq <= p->stored_seq) {
    p->duplicate_batches++;
    return 0;
  }
  p->lost_batches += seq - p->stored_seq - 1;
  p->stored_seq = seq;
  return 1;
}

/* ---- heartbeats ---- */

int tr_relay_heartbeat_init(tr_relay_heartbeat *hb, uint64_t interval_ns, uint64_t timeout_ns,
                            uint64_t now_ns) {
  hb->interval_ns = interval_ns ? interval_ns : TR_RELAY_HEARTBEAT_INTERVAL_NS;
  hb->timeout_ns = timeout_ns ? timeout_ns : TR_RELAY_HEARTBEAT_TIMEOUT_NS;
  hb->last_sent_ns = now_ns;
  hb->last_heard_ns = now_ns;
  return hb->interval_ns < hb->timeout_ns ? 0 : TR_ERR_INVAL;
}

void tr_relay_heartbeat_sent(tr_relay_heartbeat *hb, uint64_t now_ns) {
  if (now_ns > hb->last_sent_ns)
    hb->last_sent_ns = now_ns;
}

void tr_relay_heartbeat_heard(tr_relay_heartbeat *hb, uint64_t now_ns) {
  if (now_ns > hb->last_heard_ns)
    hb->last_heard_ns = now_ns;
}

bool tr_relay_heartbeat_due(const tr_relay_heartbeat *hb, uint64_t now_ns) {
  return now_ns >= hb->last_sent_ns + hb->interval_ns;
}

bool tr_relay_heartbeat_dead(const tr_relay_heartbeat *hb, uint64_t now_ns) {
  return now_ns >= hb->last_heard_ns + hb->timeout_ns;
}

uint64_t tr_relay_heartbeat_deadline(const tr_relay_heartbeat *hb) {
  uint64_t send = hb->last_sent_ns + hb->interval_ns;
  uint64_t dead = hb->last_heard_ns + hb->timeout_ns;
  return send < dead ? send : dead;
}
