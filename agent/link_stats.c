/* link_stats.c: the agent's losses as one AgentStats message (see link_stats.h). */
#include "agent/link_stats.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/producer/ipc_host.h"

/* The close reasons travel as their tr_ipc_close values. */
#define SAME(name, ipc) ((int)TRACERELAY__PRODUCER_CLOSE__PRODUCER_CLOSE_##name == (int)(ipc))
_Static_assert(SAME(STALLED, TR_IPC_CLOSE_STALLED) && SAME(IDLE, TR_IPC_CLOSE_IDLE) &&
                   SAME(NOT_READING, TR_IPC_CLOSE_NOT_READING) &&
                   SAME(TOO_MANY_REQUESTS, TR_IPC_CLOSE_TOO_MANY_REQUESTS) &&
                   SAME(PROTOCOL, TR_IPC_CLOSE_PROTOCOL) &&
                   SAME(VIOLATIONS, TR_IPC_CLOSE_VIOLATIONS) &&
                   SAME(RESOURCES, TR_IPC_CLOSE_RESOURCES),
               "ProducerClose and enum tr_ipc_close differ");
#undef SAME

/* One buffer's ProducersClosed entries, one per reason at most. */
struct buffer_closes {
  Tracerelay__AgentStats__ProducersClosed e[TR_IPC_CLOSE_REASONS];
  Tracerelay__AgentStats__ProducersClosed *p[TR_IPC_CLOSE_REASONS];
};

int tr_link_stats_set_producer(tr_link_stats *s, uint32_t producer_id,
                               const struct tr_link_producer_counts *c) {
  struct tr_link_stats_producer counts = {producer_id, *c};
  for (size_t i = 0; i < s->n_producers; i++) {
    if (s->producers[i].producer_id == producer_id) {
      s->producers[i] = counts;
      return 0;
    }
  }
  if (c->abi_violations == 0 && c->smb_full == 0)
    return 0;
  struct tr_link_stats_producer *grown =
      realloc(s->producers, (s->n_producers + 1) * sizeof *grown);
  if (grown == NULL)
    return TR_ERR_NOMEM;
  s->producers = grown;
  s->producers[s->n_producers++] = counts;
  return 0;
}

static void add_id(uint32_t *ids, size_t *n, uint32_t id) {
  for (size_t i = 0; i < *n; i++)
    if (ids[i] == id)
      return;
  ids[(*n)++] = id;
}

/* One producer's entry: what each queue dropped of it and its own counts. */
static void fill_producer(const tr_link_stats *s, const tr_chunkq *q, const tr_relay_agent *a,
                          uint32_t id, Tracerelay__AgentStats__Producer *p) {
  *p = (Tracerelay__AgentStats__Producer)TRACERELAY__AGENT_STATS__PRODUCER__INIT;
  p->has_producer_id = p->has_spill_dropped_chunks = p->has_spill_dropped_bytes = 1;
  p->has_queue_dropped_chunks = p->has_queue_dropped_bytes = p->has_abi_violations = 1;
  p->producer_id = id;
  tr_chunkq_drops d = tr_chunkq_drops_of(q, id);
  p->queue_dropped_chunks = d.chunks;
  p->queue_dropped_bytes = d.bytes;
  p->has_queue_dropped_packets = p->has_spill_dropped_packets = 1;
  p->queue_dropped_packets = d.packets;
  p->has_exit_unscraped_chunks = 1;
  p->exit_unscraped_chunks = d.unscraped_chunks;
  p->has_closed_by_agent = d.closed_why != 0;
  p->closed_by_agent = (Tracerelay__ProducerClose)d.closed_why;
  for (size_t j = 0; j < a->n_lost; j++) {
    if (a->lost[j].producer_id == id) {
      p->spill_dropped_chunks += a->lost[j].chunks;
      p->spill_dropped_bytes += a->lost[j].bytes;
      p->spill_dropped_packets += a->lost[j].packets;
    }
  }
  p->has_smb_full = p->has_smb_full_ns = 1;
  for (size_t j = 0; j < s->n_producers; j++) {
    if (s->producers[j].producer_id == id) {
      p->abi_violations = s->producers[j].c.abi_violations;
      p->smb_full = s->producers[j].c.smb_full;
      p->smb_full_ns = s->producers[j].c.smb_full_ns;
    }
  }
}

/* The buffer's closed producer connections, by reason, into c. */
static void fill_closes(const tr_chunkq *q, uint32_t buffer, struct buffer_closes *c,
                        Tracerelay__AgentStats__Buffer *b) {
  uint64_t count[TR_IPC_CLOSE_REASONS] = {0};
  for (size_t j = 0; j < q->num_drops; j++)
    if (q->drops[j].target_buffer == buffer && q->drops[j].closed_why < TR_IPC_CLOSE_REASONS)
      count[q->drops[j].closed_why]++;
  for (unsigned why = 1; why < TR_IPC_CLOSE_REASONS; why++) {
    if (count[why] == 0)
      continue;
    Tracerelay__AgentStats__ProducersClosed *e = &c->e[b->n_producers_closed];
    *e = (Tracerelay__AgentStats__ProducersClosed)TRACERELAY__AGENT_STATS__PRODUCERS_CLOSED__INIT;
    e->has_reason = e->has_connections = 1;
    e->reason = (Tracerelay__ProducerClose)why;
    e->connections = count[why];
    c->p[b->n_producers_closed++] = e;
  }
  b->producers_closed = c->p;
}

/* One buffer's entry: what each queue dropped of the chunks for it, over every producer, and
 * what producers' departures cost it. */
static void fill_buffer(const tr_chunkq *q, const tr_relay_agent *a, uint32_t buffer,
                        struct buffer_closes *c, Tracerelay__AgentStats__Buffer *b) {
  *b = (Tracerelay__AgentStats__Buffer)TRACERELAY__AGENT_STATS__BUFFER__INIT;
  b->has_target_buffer = b->has_queue_dropped_chunks = b->has_queue_dropped_bytes = 1;
  b->has_queue_dropped_packets = b->has_spill_dropped_chunks = b->has_spill_dropped_bytes = 1;
  b->has_spill_dropped_packets = b->has_exit_unscraped_chunks = 1;
  b->target_buffer = buffer;
  for (size_t j = 0; j < q->num_drops; j++) {
    if (q->drops[j].target_buffer == buffer) {
      b->queue_dropped_chunks += q->drops[j].chunks;
      b->queue_dropped_bytes += q->drops[j].bytes;
      b->queue_dropped_packets += q->drops[j].packets;
      b->exit_unscraped_chunks += q->drops[j].unscraped_chunks;
    }
  }
  fill_closes(q, buffer, c, b);
  for (size_t j = 0; j < a->n_lost; j++) {
    if (a->lost[j].target_buffer == buffer) {
      b->spill_dropped_chunks += a->lost[j].chunks;
      b->spill_dropped_bytes += a->lost[j].bytes;
      b->spill_dropped_packets += a->lost[j].packets;
    }
  }
}

void tr_link_stats_report(tr_link_stats *s, const tr_chunkq *q, const tr_relay_agent *a,
                          bool force, int (*send)(void *data, Tracerelay__RelayFrame *f),
                          void *data) {
  size_t max = q->num_drops + a->n_lost + s->n_producers;
  uint32_t *ids = malloc((max ? max : 1) * sizeof *ids);
  uint32_t *buffer_ids = malloc((max ? max : 1) * sizeof *buffer_ids);
  Tracerelay__AgentStats__Producer *ps = malloc((max ? max : 1) * sizeof *ps);
  Tracerelay__AgentStats__Producer **pp = malloc((max ? max : 1) * sizeof *pp);
  Tracerelay__AgentStats__Buffer *bs = malloc((max ? max : 1) * sizeof *bs);
  Tracerelay__AgentStats__Buffer **bp = malloc((max ? max : 1) * sizeof *bp);
  struct buffer_closes *closes = malloc((max ? max : 1) * sizeof *closes);
  uint8_t *buf = NULL;
  size_t n = 0, nb = 0;
  if (ids == NULL || buffer_ids == NULL || ps == NULL || pp == NULL || bs == NULL || bp == NULL ||
      closes == NULL)
    goto out;
  for (size_t i = 0; i < q->num_drops; i++) {
    add_id(ids, &n, q->drops[i].producer_id);
    if (q->drops[i].target_buffer != 0) /* 0: a flush ack's, no buffer's */
      add_id(buffer_ids, &nb, q->drops[i].target_buffer);
  }
  for (size_t i = 0; i < a->n_lost; i++) {
    add_id(ids, &n, a->lost[i].producer_id);
    add_id(buffer_ids, &nb, a->lost[i].target_buffer);
  }
  for (size_t i = 0; i < s->n_producers; i++)
    add_id(ids, &n, s->producers[i].producer_id);
  for (size_t i = 0; i < n; i++) {
    fill_producer(s, q, a, ids[i], &ps[i]);
    pp[i] = &ps[i];
  }
  for (size_t i = 0; i < nb; i++) {
    fill_buffer(q, a, buffer_ids[i], &closes[i], &bs[i]);
    bp[i] = &bs[i];
  }
  Tracerelay__AgentStats m = TRACERELAY__AGENT_STATS__INIT;
  m.n_producers = n;
  m.producers = pp;
  m.n_buffers = nb;
  m.buffers = bp;
  m.has_spill_dropped_batches = m.has_spill_dropped_frame_bytes = m.has_spill_held_bytes = 1;
  m.spill_dropped_batches = a->lost_batches;
  m.spill_dropped_frame_bytes = a->lost_frame_bytes;
  m.spill_held_bytes = a->held_bytes;
  size_t len = tracerelay__agent_stats__get_packed_size(&m);
  buf = malloc(len ? len : 1);
  if (buf == NULL)
    goto out;
  tracerelay__agent_stats__pack(&m, buf);
  if (!force && len == s->last_len && memcmp(buf, s->last, len) == 0)
    goto out;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_AGENT_STATS;
  f.agent_stats = &m;
  if (send(data, &f) == 0) {
    free(s->last);
    s->last = buf;
    s->last_len = len;
    buf = NULL;
  }
out:
  free(buf);
  free(ids);
  free(buffer_ids);
  free(ps);
  free(pp);
  free(bs);
  free(bp);
  free(closes);
}

struct tr_link_producer_counts tr_link_stats_sum(const tr_link_stats *s) {
  struct tr_link_producer_counts sum = {0};
  for (size_t i = 0; i < s->n_producers; i++) {
    sum.abi_violations += s->producers[i].c.abi_violations;
    sum.smb_full += s->producers[i].c.smb_full;
    sum.smb_full_ns += s->producers[i].c.smb_full_ns;
  }
  return sum;
}

void tr_link_stats_free(tr_link_stats *s) {
  free(s->producers);
  free(s->last);
  *s = (tr_link_stats){0};
}
