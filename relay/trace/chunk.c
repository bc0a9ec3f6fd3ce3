/* chunk.c: chunk header and fragment parsing (reference 4.2, 4.3). See chunk.h for the
 * guarantees; every length is checked against the bytes left before it is used. */
#include "relay/trace/chunk.h"

#include <string.h>

#include "relay/base/tr_error.h"

#define FLAGS_SHIFT 10
#define COUNT_MASK 0x03FFu

static uint32_t load_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint16_t load_le16(const uint8_t *p) {
  return (uint16_t)(p[0] | p[1] << 8);
}

int tr_chunk_header_decode(const uint8_t *chunk, size_t len, tr_chunk_header *out) {
  if (len < TR_CHUNK_HEADER_SIZE)
    return TR_ERR_INVAL;
  uint16_t packets = load_le16(chunk + 6);
  out->chunk_id = load_le32(chunk);
  out->writer_id = load_le16(chunk + 4);
  out->count = packets & COUNT_MASK;
  out->flags = (uint8_t)(packets >> FLAGS_SHIFT);
  if (out->writer_id == 0 || out->writer_id > TR_CHUNK_MAX_WRITER_ID)
    return TR_ERR_PROTO;
  return 0;
}

void tr_chunk_header_encode(const tr_chunk_header *h, uint8_t out[TR_CHUNK_HEADER_SIZE]) {
  uint16_t packets = (uint16_t)((h->count & COUNT_MASK) | (h->flags & 0x3Fu) << FLAGS_SHIFT);
  out[0] = (uint8_t)h->chunk_id;
  out[1] = (uint8_t)(h->chunk_id >> 8);
  out[2] = (uint8_t)(h->chunk_id >> 16);
  out[3] = (uint8_t)(h->chunk_id >> 24);
  out[4] = (uint8_t)h->writer_id;
  out[5] = (uint8_t)(h->writer_id >> 8);
  out[6] = (uint8_t)packets;
  out[7] = (uint8_t)(packets >> 8);
}

void tr_chunk_iter_init(tr_chunk_iter *it, const uint8_t *payload, size_t len, uint16_t count,
                        uint8_t flags) {
  memset(it, 0, sizeof(*it));
  it->payload = payload;
  it->len = len;
  it->count = count;
  it->flags = flags;
}

/* Reads a varint of at most TR_CHUNK_MAX_VARINT bytes at it->off. Returns its length in
 * bytes, or 0 if it is longer or runs past the payload. */
static size_t read_size(const tr_chunk_iter *it, uint32_t *value) {
  uint32_t v = 0;
  for (size_t i = 0; i < TR_CHUNK_MAX_VARINT && it->off + i < it->len; i++) {
    uint8_t b = it->payload[it->off + i];
    v |= (uint32_t)(b & 0x7Fu) << (7 * i);
    if (!(b & 0x80u)) {
      *value = v;
      return i + 1;
    }
  }
  return 0;
}

static size_t minimal_varint_len(uint32_t v) {
  size_t n = 1;
  while (v >= 0x80u) {
    v >>= 7;
    n++;
  }
  return n;
}

int tr_chunk_iter_next(tr_chunk_iter *it, tr_chunk_fragment *out) {
  if (it->abi_violation)
    return TR_ERR_PROTO;
  if (it->index >= it->count || it->packet_dropped)
    return 0;
  uint32_t size;
  size_t vlen = read_size(it, &size);
  if (vlen == 0) {
    it->abi_violation = true;
    return TR_ERR_PROTO;
  }
  bool last = it->index + 1u == it->count;
  if (last && size == TR_CHUNK_DROP_PACKET_SIZE) {
    it->off += vlen;
    it->packet_dropped = true;
    return 0;
  }
  size_t begin = it->off + vlen;
  if (size > it->len - begin) {
    it->abi_violation = true;
    return TR_ERR_PROTO;
  }
  if (vlen > minimal_varint_len(size))
    it->redundant_varints++;
  out->data = it->payload + begin;
  out->len = size;
  out->continues_from_prev = it->index == 0 && (it->flags & TR_CHUNK_FIRST_CONTINUES);
  out->continues_in_next = last && (it->flags & TR_CHUNK_LAST_CONTINUES);
  it->off = begin + size;
  it->index++;
  return 1;
}

int tr_chunk_parse(const uint8_t *payload, size_t len, uint16_t count, tr_chunk_info *out) {
  tr_chunk_iter it;
  tr_chunk_fragment frag;
  int rc;
  tr_chunk_iter_init(&it, payload, len, count, 0);
  while ((rc = tr_chunk_iter_next(&it, &frag)) == 1)
    ;
  out->fragments = it.index;
  out->redundant_varints = it.redundant_varints;
  out->used = it.off;
  out->packet_dropped = it.packet_dropped;
  out->abi_violation = it.abi_violation;
  return rc;
}

uint32_t tr_chunk_packets_begun(const uint8_t *payload, size_t len, uint16_t count,
                                uint8_t flags, bool incomplete) {
  if (incomplete) {
    count = count > 0 ? count - 1u : 0;
    flags &= (uint8_t)~(TR_CHUNK_LAST_CONTINUES | TR_CHUNK_NEEDS_PATCHING);
  }
  bool unpatched_last = (flags & TR_CHUNK_NEEDS_PATCHING) && count > 0;
  if (unpatched_last) {
    count--;
    flags &= (uint8_t)~TR_CHUNK_LAST_CONTINUES; /* that last fragment is counted below */
  }
  tr_chunk_iter it;
  tr_chunk_fragment f;
  uint32_t begun = 0;
  tr_chunk_iter_init(&it, payload, len, count, flags);
  while (tr_chunk_iter_next(&it, &f) == 1)
    if (!f.continues_from_prev && (f.len > 0 || f.continues_in_next))
      begun++;
  if (unpatched_last && !it.abi_violation && !(count == 0 && (flags & TR_CHUNK_FIRST_CONTINUES)))
    begun++;
  return begun;
}

int tr_chunk_scrape_rule(tr_chunk_header *h) {
  if (h->count < 2)
    return 0;
  h->count--;
  h->flags &= (uint8_t)~(TR_CHUNK_LAST_CONTINUES | TR_CHUNK_NEEDS_PATCHING);
  return 1;
}

int tr_chunk_apply_patch(uint8_t *payload, size_t payload_len, uint32_t offset,
                         const uint8_t *data, size_t data_len) {
  if (data_len != TR_CHUNK_PATCH_SIZE || payload_len < TR_CHUNK_PATCH_SIZE ||
      offset > payload_len - TR_CHUNK_PATCH_SIZE)
    return TR_ERR_PROTO;
  memcpy(payload + offset, data, TR_CHUNK_PATCH_SIZE);
  return 0;
}
