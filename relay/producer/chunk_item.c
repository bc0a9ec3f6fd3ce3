/* chunk_item.c: the relay link's item wire mapping, both ways (see chunk_item.h). */
#include "relay/producer/chunk_item.h"

#include <string.h>

uint32_t tr_chunk_item_patch_word(const uint8_t data[TR_CHUNK_PATCH_SIZE]) {
  return (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
         (uint32_t)data[3] << 24;
}

void tr_chunk_item_patch_bytes(uint32_t word, uint8_t data[TR_CHUNK_PATCH_SIZE]) {
  data[0] = (uint8_t)word;
  data[1] = (uint8_t)(word >> 8);
  data[2] = (uint8_t)(word >> 16);
  data[3] = (uint8_t)(word >> 24);
}

void tr_chunk_item_fill(tr_chunk_item_slot *s, const tr_chunkq_entry *e) {
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
    s->u.p.entry.data = tr_chunk_item_patch_word(p->data);
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

void tr_chunk_item_to_tbuf(const Tracerelay__Chunk *m, tr_tbuf_chunk *out) {
  memset(out, 0, sizeof *out);
  out->producer_id = m->producer_id;
  out->writer_id = m->writer_id > 0xffff ? 0 : (uint16_t)m->writer_id; /* 0 is refused */
  out->chunk_id = m->chunk_id;
  out->fragments = m->packet_count > 0xffff ? 0xffff : (uint16_t)m->packet_count;
  out->flags = (uint8_t)(m->flags & 0x3f);
  out->incomplete = m->incomplete;
  out->uid = (int32_t)m->trusted_uid;
  out->pid = m->trusted_pid;
  out->payload = m->payload.data;
  out->payload_len = m->payload.len;
}
