/* batch_builder.c: ChunkBatches packed and compressed on a worker thread (batch_builder.h): the
 * queue entries' wire mapping (fill_item) and the job that carries them to the worker. */
#include "agent/batch_builder.h"

#include <stdlib.h>

#include "relay/tr_error.h"

#define ITEM_OVERHEAD 64 /* protobuf envelope of one item, an upper estimate */

/* One item and the message it points to, built in place for one encode. */
typedef struct item_slot {
  Tracerelay__ChunkItem item;
  union {
    Tracerelay__Chunk chunk;
    struct {
      Tracerelay__Patch patch;
      Tracerelay__Patch__Entry entry;
      Tracerelay__Patch__Entry *entries[1];
    } p;
    Tracerelay__FlushAck ack;
  } u;
} item_slot;

static void fill_item(item_slot *s, const tr_chunkq_entry *e) {
  s->item = (Tracerelay__ChunkItem)TRACERELAY__CHUNK_ITEM__INIT;
  switch (e->kind) {
  case TR_CHUNKQ_CHUNK: {
    const tr_chunkq_chunk *c = &e->u.chunk;
    Tracerelay__Chunk *m = &s->u.chunk;
    *m = (Tracerelay__Chunk)TRACERELAY__CHUNK__INIT;
    m->has_producer_id = m->has_writer_id = m->has_chunk_id = m->has_packet_count = 1;
    m->has_flags = m->has_target_buffer = m->has_incomplete = m->has_trusted_uid = 1;
    m->has_trusted_pid = m->has_payload = 1;
    m->producer_id = c->producer_id;
    m->writer_id = c->header.writer_id;
    m->chunk_id = c->header.chunk_id;
    m->packet_count = c->header.count;
    m->flags = c->header.flags;
    m->target_buffer = c->target_buffer;
    m->incomplete = c->incomplete;
    m->trusted_uid = c->trusted_uid;
    m->trusted_pid = c->trusted_pid;
    m->payload.data = (uint8_t *)e->data;
    m->payload.len = e->len;
    s->item.item_case = TRACERELAY__CHUNK_ITEM__ITEM_CHUNK;
    s->item.chunk = m;
    break;
  }
  case TR_CHUNKQ_PATCH: {
    const tr_chunkq_patch *p = &e->u.patch;
    Tracerelay__Patch *m = &s->u.p.patch;
    *m = (Tracerelay__Patch)TRACERELAY__PATCH__INIT;
    s->u.p.entry = (Tracerelay__Patch__Entry)TRACERELAY__PATCH__ENTRY__INIT;
    s->u.p.entry.has_offset = s->u.p.entry.has_data = 1;
    s->u.p.entry.offset = p->offset;
    s->u.p.entry.data = (uint32_t)p->data[0] | (uint32_t)p->data[1] << 8 |
                        (uint32_t)p->data[2] << 16 | (uint32_t)p->data[3] << 24;
    s->u.p.entries[0] = &s->u.p.entry;
    m->has_producer_id = m->has_target_buffer = m->has_writer_id = m->has_chunk_id = 1;
    m->has_has_more = 1;
    m->producer_id = p->producer_id;
    m->target_buffer = p->target_buffer;
    m->writer_id = p->writer_id;
    m->chunk_id = p->chunk_id;
    m->has_more = p->has_more;
    m->n_entries = 1;
    m->entries = s->u.p.entries;
    s->item.item_case = TRACERELAY__CHUNK_ITEM__ITEM_PATCH;
    s->item.patch = m;
    break;
  }
  case TR_CHUNKQ_FLUSH_ACK: {
    Tracerelay__FlushAck *m = &s->u.ack;
    *m = (Tracerelay__FlushAck)TRACERELAY__FLUSH_ACK__INIT;
    m->has_flush_request_id = m->has_producer_id = 1;
    m->flush_request_id = e->u.flush_ack.request_id;
    m->producer_id = e->u.flush_ack.producer_id;
    s->item.item_case = TRACERELAY__CHUNK_ITEM__ITEM_FLUSH_ACK;
    s->item.flush_ack = m;
    break;
  }
  }
}

struct tr_batch_builder {
  uv_loop_t *loop;
  tr_chunkq *queue;
  tr_relay_codec codec;
  void (*on_built)(void *data, struct tr_built_batch *b);
  void *data;
  bool busy;
  uv_work_t work;
  bool compress;
  tr_chunkq_entry **entries;
  size_t cap;
  struct tr_built_batch out;
};

int tr_batch_builder_new(uv_loop_t *loop, tr_chunkq *queue,
                         void (*on_built)(void *data, struct tr_built_batch *b), void *data,
                         tr_batch_builder **out) {
  tr_batch_builder *b = calloc(1, sizeof *b);
  if (b == NULL)
    return TR_ERR_NOMEM;
  int rc = tr_relay_codec_init(&b->codec, TR_RELAY_ZSTD_LEVEL_DEFAULT, 0);
  if (rc < 0) {
    free(b);
    return rc;
  }
  b->loop = loop;
  b->queue = queue;
  b->on_built = on_built;
  b->data = data;
  b->work.data = b;
  *out = b;
  return 0;
}

/* On the worker: the items, their tally and the encoded frame. */
static void build(uv_work_t *w) {
  tr_batch_builder *b = w->data;
  struct tr_built_batch *o = &b->out;
  item_slot *slots = malloc(o->entries * sizeof *slots);
  Tracerelay__ChunkItem **items = malloc(o->entries * sizeof *items);
  o->rc = slots && items ? 0 : TR_ERR_NOMEM;
  for (size_t i = 0; o->rc == 0 && i < o->entries; i++) {
    fill_item(&slots[i], b->entries[i]);
    items[i] = &slots[i].item;
  }
  if (o->rc == 0)
    o->rc = tr_relay_batch_tally(items, o->entries, &o->tally, &o->n_tally);
  if (o->rc == 0)
    o->rc = tr_relay_batch_encode(&b->codec, o->seq, b->compress, items, o->entries, &o->frame,
                                  &o->len);
  if (o->rc < 0) {
    free(o->tally);
    o->tally = NULL;
  }
  free(slots);
  free(items);
  for (size_t i = 0; i < o->entries; i++)
    tr_chunkq_entry_free(b->entries[i]);
}

/* Back on the loop's thread. */
static void built(uv_work_t *w, int status) {
  tr_batch_builder *b = w->data;
  struct tr_built_batch o = b->out;
  (void)status; /* never cancelled: the job always ran */
  b->busy = false;
  b->on_built(b->data, &o);
}

bool tr_batch_builder_start(tr_batch_builder *b, uint64_t seq, bool compress, size_t limit) {
  if (b->busy || tr_chunkq_peek(b->queue) == NULL)
    return false;
  struct tr_built_batch *o = &b->out;
  *o = (struct tr_built_batch){.seq = seq};
  const tr_chunkq_entry *head;
  while ((head = tr_chunkq_peek(b->queue)) != NULL) {
    size_t cost = head->len + ITEM_OVERHEAD;
    if (o->entries > 0 && o->bytes + cost > limit)
      break;
    if (o->entries == b->cap) {
      size_t cap = b->cap ? b->cap * 2 : 64;
      tr_chunkq_entry **grown = realloc(b->entries, cap * sizeof *grown);
      if (grown == NULL)
        break;
      b->entries = grown;
      b->cap = cap;
    }
    b->entries[o->entries++] = tr_chunkq_pop(b->queue);
    o->bytes += cost;
    o->last_qseq = b->entries[o->entries - 1]->seq;
  }
  if (o->entries == 0) /* no room even for one entry's pointer: tried again next time */
    return false;
  b->compress = compress;
  b->busy = true;
  int rc = uv_queue_work(b->loop, &b->work, build, built);
  if (rc < 0) { /* cannot happen with a valid loop and callbacks; built inline if it does */
    build(&b->work);
    built(&b->work, 0);
  }
  return true;
}

bool tr_batch_builder_busy(const tr_batch_builder *b) {
  return b->busy;
}

void tr_batch_builder_free(tr_batch_builder *b) {
  if (b == NULL)
    return;
  tr_relay_codec_free(&b->codec);
  free(b->entries);
  free(b);
}
