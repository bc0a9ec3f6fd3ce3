/* batch_builder.c: ChunkBatches packed and compressed on a worker thread (batch_builder.h): the
 * job that carries queue entries to the worker, which maps them to items (relay/producer/chunk_item.h)
 * and encodes them. */
#include "agent/batch_builder.h"

#include <stdlib.h>

#include "relay/producer/chunk_item.h"
#include "relay/base/tr_error.h"

#define ITEM_OVERHEAD 64 /* protobuf envelope of one item, an upper estimate */

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
  tr_chunk_item_slot *slots = malloc(o->entries * sizeof *slots);
  Tracerelay__ChunkItem **items = malloc(o->entries * sizeof *items);
  o->rc = slots && items ? 0 : TR_ERR_NOMEM;
  for (size_t i = 0; o->rc == 0 && i < o->entries; i++) {
    tr_chunk_item_fill(&slots[i], b->entries[i]);
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
