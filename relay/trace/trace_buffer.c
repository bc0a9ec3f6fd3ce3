/* trace_buffer.c: the central buffer, modelled on Perfetto's TraceBufferV1
 * (src/tracing/service/trace_buffer.cc) and kept to what a relay needs.
 *
 * STORAGE. One byte ring of fixed size holds records, back to back, 8-byte aligned:
 *   [size u32][kind u32][producer u32][chunk id u32][writer u16][0 u16][0 u32][payload...]
 * `size` covers the whole record; a chunk record takes at least REC_MIN_SIZE (64) bytes so that
 * the index entries (32 bytes each) of the chunks stored never cost more than half the ring;
 * with the deques' slack (capacity between 1x and 4x of their entries) the worst case, a ring
 * of empty chunks, is twice the ring. Real chunks (>= 292 bytes) keep it under 50%. A PADDING record (only its first 8 bytes
 * mean anything) fills the tail before a wrap, the rest of a record partly overwritten, and
 * takes the place of every chunk that was read or replaced. From the write pointer to the end
 * of the ring the records always form an unbroken chain (or reach never-written zeros, which
 * is why the ring starts zeroed), and so does [0, write pointer): writing walks that chain to
 * find what it overwrites, and reading walks it to find the oldest chunks first.
 *
 * INDEX. Per sequence (producer, writer), a deque of small entries (struct chunk, 32 bytes)
 * sorted by chunk id in wrap-around order: ids are compared as (id - (last_written + 1)) mod
 * 2^32, which puts the newest id last, as Perfetto's index does. The stored ids of a sequence
 * always lie within 2^31 of each other (a chunk breaking that is refused), so the order never
 * changes as the newest id moves on. Sequences sit in an array sorted by (producer, writer).
 * Costs: a chunk committed in order is appended in O(1) amortised, found in O(log n); an
 * out-of-order one costs O(n) to insert; a sequence costs O(log s) to find and O(s) to add.
 * Sequence state is kept for the buffer's life (about 100 bytes per writer ever seen) because
 * the last chunk id read is what tells a gap from a successor.
 *
 * WRITING. RING_BUFFER evicts whatever the new record overlaps; evicting a chunk not fully read
 * counts chunks_overwritten and marks its sequence DATA_LOSS_OVERWRITE. DISCARD refuses, and
 * from then on refuses everything, as soon as a write would overlap a chunk not yet read
 * (chunks already read are padding and may be reused). A re-commit of a stored chunk must keep
 * or raise the fragment count and the payload length and keep every flag; it is copied in
 * place when the length is unchanged, else into a new record; how far the chunk was read is
 * kept. A chunk marked incomplete keeps all but its last counted fragment readable.
 *
 * READING. A sequence is read from its oldest chunk in chunk-id order. For the oldest chunk:
 * - needs patching: the sequence stalls (the final read drops the chunk, counted);
 * - its id does not follow the last id read: DATA_LOSS_READ_GAP on the next packet;
 * - a leading fragment flagged "continues from previous" is an orphan (its head was never
 *   read with it): skipped and counted per fragment;
 * - a size varint over 4 bytes, or a size past the payload: ABI violation, rest of chunk gone;
 * - a kPacketSizeDropPacket size: the writer abandoned the packet, rest of chunk gone;
 * - a last fragment flagged "continues in next" is joined with the leading fragments of the
 *   following chunks (ids +1, +2...), copied into one scratch buffer. If the next chunk is not
 *   there yet and no later chunk of the sequence is either, the sequence waits; if a later one
 *   is there (or on the final read) the next chunk is lost, and so is the packet;
 * - a chunk read to its last fragment is freed; one that was incomplete waits for its full
 *   commit first (or the final read).
 * A packet is emitted only whole; every loss on the way ORs a DATA_LOSS_ bit (plus PRESENT) into
 * the sequence's pending mask, which the next packet emitted from it carries and clears.
 */
#include "relay/trace/trace_buffer.h"

#include <stdlib.h>
#include <string.h>

#include "relay/trace/chunk.h"
#include "relay/trace/packet_trusted.h"
#include "relay/base/tr_error.h"

#define REC_HDR_SIZE 24u
#define REC_MIN_SIZE 64u
#define REC_PADDING 1u
#define REC_CHUNK 2u
#define HALF_ID_SPACE 0x80000000u

struct rec_hdr {
  uint32_t size; /* 0: never written, the rest of this stretch of ring is empty */
  uint32_t kind;
  uint32_t producer_id;
  uint32_t chunk_id;
  uint16_t writer_id;
  uint16_t unused16;
  uint32_t unused32;
};
_Static_assert(sizeof(struct rec_hdr) == REC_HDR_SIZE, "record header layout");

struct chunk {
  uint32_t id;
  uint32_t off;      /* ring offset of its record */
  uint32_t len;      /* payload bytes */
  uint32_t read_off; /* payload offset of the next unread fragment */
  int32_t uid;
  int32_t pid;
  uint16_t nfrags;   /* readable fragments (after the incomplete rule) */
  uint16_t frags_read;
  uint8_t flags;
  bool incomplete;
  bool trimmed;      /* incomplete, and a counted fragment was left out */
};
_Static_assert(sizeof(struct chunk) == 32, "index entry cost quoted above");

struct seq {
  uint32_t producer_id;
  uint16_t writer_id;
  uint32_t last_written; /* newest chunk id stored, in wrap-around order */
  bool have_read;
  uint32_t last_read_id;
  uint32_t loss;         /* tr_tbuf_loss bits for the next packet emitted */
  uint64_t pass;         /* read pass that last visited this sequence */
  struct chunk *q;       /* deque, cap a power of two */
  uint32_t head, count, cap;
};

struct tr_tbuf {
  uint8_t *ring;
  uint32_t size;
  uint32_t wptr;
  enum tr_tbuf_policy policy;
  bool discarding; /* DISCARD buffer that has filled up */
  struct seq **seqs; /* sorted by (producer, writer) */
  size_t nseqs, capseqs;
  uint8_t *scratch; /* packets spanning chunks are joined here */
  size_t scratch_cap;
  /* read pass: a walk of the ring from wptr to the end, then from 0 to wptr */
  bool pass_active;
  bool pass_final;
  bool pass_wrapped;
  uint32_t pass_pos;
  uint64_t pass_id;
  struct seq *cur;
  tr_tbuf_stats st;
};

struct frag {
  uint32_t start; /* payload offset of the fragment's bytes */
  uint32_t len;
  bool drop;      /* kPacketSizeDropPacket */
};

/* What reading a packet spanning chunks came to; SPAN_NONE: nothing to emit, read on. */
enum span_result { SPAN_STALLED, SPAN_EMITTED, SPAN_NONE };

/* ---- ring records ---- */

static uint32_t record_size(size_t payload_len) {
  size_t n = (REC_HDR_SIZE + payload_len + 7) & ~(size_t)7;
  return n < REC_MIN_SIZE ? REC_MIN_SIZE : (uint32_t)n;
}

static void rec_read(const tr_tbuf *b, uint32_t off, struct rec_hdr *h) {
  /* A padding record may be only 8 bytes long, at the very end of the ring. */
  memset(h, 0, sizeof *h);
  memcpy(h, b->ring + off, 8);
  if (h->kind == REC_CHUNK)
    memcpy(h, b->ring + off, sizeof *h);
}

static void set_kind(tr_tbuf *b, uint32_t off, uint32_t kind) {
  memcpy(b->ring + off + 4, &kind, 4);
}

static void put_padding(tr_tbuf *b, uint32_t off, uint32_t size) {
  uint32_t words[2] = {size, REC_PADDING};
  memcpy(b->ring + off, words, 8);
}

static uint8_t *payload_of(const tr_tbuf *b, const struct chunk *c) {
  return b->ring + c->off + REC_HDR_SIZE;
}

/* ---- per-sequence deque ---- */

static struct chunk *at(const struct seq *s, uint32_t k) {
  return &s->q[(s->head + k) & (s->cap - 1)];
}

static uint32_t order_key(const struct seq *s, uint32_t id) {
  return id - s->last_written - 1;
}

static uint32_t lower_bound(const struct seq *s, uint32_t id) {
  uint32_t key = order_key(s, id), lo = 0, hi = s->count;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (order_key(s, at(s, mid)->id) < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static struct chunk *find_chunk(const struct seq *s, uint32_t id, uint32_t *pos) {
  uint32_t k = lower_bound(s, id);
  if (k >= s->count || at(s, k)->id != id)
    return NULL;
  *pos = k;
  return at(s, k);
}

static int resize(struct seq *s, uint32_t cap) {
  struct chunk *q = malloc((size_t)cap * sizeof *q);
  if (!q)
    return TR_ERR_NOMEM;
  for (uint32_t i = 0; i < s->count; i++)
    q[i] = *at(s, i);
  free(s->q);
  s->q = q;
  s->head = 0;
  s->cap = cap;
  return 0;
}

/* Room for one more entry, so that inserting after the ring write cannot fail. */
static int reserve_one(struct seq *s) {
  if (s->count < s->cap)
    return 0;
  return resize(s, s->cap ? s->cap * 2 : 8);
}

static void insert_at(struct seq *s, uint32_t k, const struct chunk *c) {
  if (k == 0) {
    s->head = (s->head - 1) & (s->cap - 1);
  } else {
    for (uint32_t i = s->count; i > k; i--)
      *at(s, i) = *at(s, i - 1);
  }
  s->count++;
  *at(s, k) = *c;
}

static void remove_at(struct seq *s, uint32_t k) {
  if (k == 0) {
    s->head = (s->head + 1) & (s->cap - 1);
  } else {
    for (uint32_t i = k; i + 1 < s->count; i++)
      *at(s, i) = *at(s, i + 1);
  }
  s->count--;
  /* Shrinking is only an economy: on failure the larger array stays in use. */
  if (s->cap > 8 && s->count < s->cap / 4)
    (void)resize(s, s->cap / 2);
}

/* Whether `id` can join the sequence with all its ids still within 2^31 of each other. */
static bool fits_window(const struct seq *s, uint32_t id) {
  if (s->count == 0)
    return true;
  if ((int32_t)(id - s->last_written) > 0)
    return id - at(s, 0)->id < HALF_ID_SPACE;
  return s->last_written - id < HALF_ID_SPACE;
}

/* ---- sequences ---- */

static int seq_cmp(const struct seq *s, uint32_t producer_id, uint16_t writer_id) {
  if (s->producer_id != producer_id)
    return s->producer_id < producer_id ? -1 : 1;
  if (s->writer_id != writer_id)
    return s->writer_id < writer_id ? -1 : 1;
  return 0;
}

static size_t seq_lower_bound(const tr_tbuf *b, uint32_t producer_id, uint16_t writer_id) {
  size_t lo = 0, hi = b->nseqs;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (seq_cmp(b->seqs[mid], producer_id, writer_id) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static struct seq *find_seq(const tr_tbuf *b, uint32_t producer_id, uint16_t writer_id) {
  size_t i = seq_lower_bound(b, producer_id, writer_id);
  if (i < b->nseqs && seq_cmp(b->seqs[i], producer_id, writer_id) == 0)
    return b->seqs[i];
  return NULL;
}

static int add_seq(tr_tbuf *b, uint32_t producer_id, uint16_t writer_id, struct seq **out) {
  if (b->nseqs == b->capseqs) {
    size_t cap = b->capseqs ? b->capseqs * 2 : 8;
    struct seq **seqs = realloc(b->seqs, cap * sizeof *seqs);
    if (!seqs)
      return TR_ERR_NOMEM;
    b->seqs = seqs;
    b->capseqs = cap;
  }
  struct seq *s = calloc(1, sizeof *s);
  if (!s)
    return TR_ERR_NOMEM;
  s->producer_id = producer_id;
  s->writer_id = writer_id;
  size_t i = seq_lower_bound(b, producer_id, writer_id);
  memmove(&b->seqs[i + 1], &b->seqs[i], (b->nseqs - i) * sizeof *b->seqs);
  b->seqs[i] = s;
  b->nseqs++;
  *out = s;
  return 0;
}

static void mark_loss(struct seq *s, uint32_t bits) {
  s->loss |= TR_TBUF_LOSS_PRESENT | bits;
}

/* ---- writing ---- */

static void end_pass(tr_tbuf *b) {
  b->pass_active = false;
  b->cur = NULL;
}

static void evict_chunk(tr_tbuf *b, uint32_t off, const struct rec_hdr *h) {
  struct seq *s = find_seq(b, h->producer_id, h->writer_id);
  uint32_t k;
  struct chunk *c = s ? find_chunk(s, h->chunk_id, &k) : NULL;
  /* The index and the ring agree by construction; checking keeps a bug from turning into
   * the reuse of a stale entry. */
  if (!c || c->off != off)
    return;
  b->st.chunks_overwritten++;
  b->st.bytes_overwritten += c->len;
  mark_loss(s, TR_TBUF_LOSS_OVERWRITE);
  remove_at(s, k);
}

/* Clears [start, end) for a new record: evicts the chunks there and pads what is left of
 * the last record it cut into, so the chain stays whole. */
static void evict_range(tr_tbuf *b, uint32_t start, uint32_t end) {
  uint32_t pos = start;
  while (pos < end) {
    struct rec_hdr h;
    rec_read(b, pos, &h);
    if (h.size == 0)
      return;
    if (h.kind == REC_CHUNK)
      evict_chunk(b, pos, &h);
    pos += h.size;
  }
  if (pos > end)
    put_padding(b, end, pos - end);
}

static bool range_has_chunks(const tr_tbuf *b, uint32_t start, uint32_t end) {
  uint32_t pos = start;
  while (pos < end) {
    struct rec_hdr h;
    rec_read(b, pos, &h);
    if (h.size == 0)
      return false;
    if (h.kind == REC_CHUNK)
      return true;
    pos += h.size;
  }
  return false;
}

/* Finds `need` bytes at the write pointer, wrapping and evicting (RING_BUFFER) or refusing
 * (DISCARD) as the policy says. Returns 0 or TR_ERR_FULL. */
static int alloc_record(tr_tbuf *b, uint32_t need, uint32_t *off) {
  bool wrap = b->size - b->wptr < need;
  if (b->policy == TR_TBUF_DISCARD) {
    bool busy = wrap ? range_has_chunks(b, b->wptr, b->size) || range_has_chunks(b, 0, need)
                     : range_has_chunks(b, b->wptr, b->wptr + need);
    if (b->discarding || busy) {
      b->discarding = true;
      return TR_ERR_FULL;
    }
  }
  if (wrap) {
    evict_range(b, b->wptr, b->size);
    if (b->wptr < b->size)
      put_padding(b, b->wptr, b->size - b->wptr);
    b->wptr = 0;
    b->st.write_wrap_count++;
  }
  evict_range(b, b->wptr, b->wptr + need);
  *off = b->wptr;
  b->wptr += need;
  return 0;
}

static void put_chunk_record(tr_tbuf *b, uint32_t off, uint32_t need, const struct seq *s,
                             uint32_t chunk_id, const uint8_t *payload, size_t len) {
  struct rec_hdr h = {.size = need,
                      .kind = REC_CHUNK,
                      .producer_id = s->producer_id,
                      .chunk_id = chunk_id,
                      .writer_id = s->writer_id};
  memcpy(b->ring + off, &h, sizeof h);
  if (len)
    memcpy(b->ring + off + REC_HDR_SIZE, payload, len);
}

static int rewrite(tr_tbuf *b, struct seq *s, struct chunk *old, const struct chunk *nc,
                   const uint8_t *payload) {
  if (nc->nfrags < old->nfrags || nc->len < old->len || (old->flags & ~nc->flags)) {
    b->st.abi_violations++;
    return TR_ERR_PROTO;
  }
  uint32_t off = old->off;
  if (nc->len != old->len) {
    /* The old copy is about to be replaced, so it must not count as overwritten if the new
     * record lands on it; it comes back if DISCARD refuses the new one. */
    uint32_t old_off = old->off, need = record_size(nc->len), k;
    set_kind(b, old_off, REC_PADDING);
    int r = alloc_record(b, need, &off);
    if (r < 0) {
      set_kind(b, old_off, REC_CHUNK);
      b->st.chunks_discarded++;
      return r;
    }
    put_chunk_record(b, off, need, s, nc->id, payload, nc->len);
    old = find_chunk(s, nc->id, &k); /* evictions may have moved the entry */
  } else if (nc->len) {
    memcpy(payload_of(b, old), payload, nc->len);
  }
  old->off = off;
  old->len = nc->len;
  old->nfrags = nc->nfrags;
  old->flags = nc->flags;
  old->incomplete = nc->incomplete;
  old->trimmed = nc->trimmed;
  old->uid = nc->uid;
  old->pid = nc->pid;
  b->st.chunks_rewritten++;
  b->st.bytes_written += nc->len;
  return 0;
}

int tr_tbuf_write_chunk(tr_tbuf *b, const tr_tbuf_chunk *in) {
  end_pass(b);
  if (in->writer_id == 0 || in->writer_id > TR_CHUNK_MAX_WRITER_ID ||
      in->fragments > TR_CHUNK_MAX_FRAGMENTS) {
    b->st.abi_violations++;
    return TR_ERR_PROTO;
  }
  if (in->payload_len > TR_TBUF_MAX_PAYLOAD || record_size(in->payload_len) > b->size) {
    b->st.chunks_discarded++;
    return TR_ERR_TOO_BIG;
  }
  struct chunk nc = {.id = in->chunk_id,
                     .len = (uint32_t)in->payload_len,
                     .uid = in->uid,
                     .pid = in->pid,
                     .nfrags = in->fragments,
                     .flags = in->flags,
                     .incomplete = in->incomplete};
  if (in->incomplete) {
    /* The last counted fragment may still be being written (reference 4.6). */
    if (nc.nfrags > 0) {
      nc.nfrags--;
      nc.trimmed = true;
    }
    nc.flags &= (uint8_t)~(TR_CHUNK_LAST_CONTINUES | TR_CHUNK_NEEDS_PATCHING);
  }

  struct seq *s = find_seq(b, in->producer_id, in->writer_id);
  int r = s ? 0 : add_seq(b, in->producer_id, in->writer_id, &s);
  if (r == 0)
    r = reserve_one(s);
  if (r < 0) {
    b->st.chunks_discarded++;
    return r;
  }
  uint32_t k;
  struct chunk *old = find_chunk(s, nc.id, &k);
  if (old)
    return rewrite(b, s, old, &nc, in->payload);
  /* The chunk just read, committed again: its fragments were emitted already. */
  if ((s->have_read && nc.id == s->last_read_id) || !fits_window(s, nc.id)) {
    b->st.abi_violations++;
    return TR_ERR_PROTO;
  }
  uint32_t need = record_size(nc.len);
  r = alloc_record(b, need, &nc.off);
  if (r < 0) {
    b->st.chunks_discarded++;
    return r;
  }
  put_chunk_record(b, nc.off, need, s, nc.id, in->payload, nc.len);
  /* Evictions only remove entries, so the window check above still holds. */
  if (s->count == 0 || (int32_t)(nc.id - s->last_written) > 0) {
    s->last_written = nc.id;
    insert_at(s, s->count, &nc);
  } else {
    insert_at(s, lower_bound(s, nc.id), &nc);
  }
  b->st.chunks_written++;
  b->st.bytes_written += nc.len;
  return 0;
}

int tr_tbuf_patch_chunk(tr_tbuf *b, uint32_t producer_id, uint16_t writer_id, uint32_t chunk_id,
                        const tr_tbuf_patch *patches, size_t n, bool has_more) {
  end_pass(b);
  struct seq *s = find_seq(b, producer_id, writer_id);
  uint32_t k;
  struct chunk *c = s ? find_chunk(s, chunk_id, &k) : NULL;
  if (!c) {
    b->st.patches_failed += n;
    return TR_ERR_NOT_FOUND;
  }
  bool failed = false;
  for (size_t i = 0; i < n; i++) {
    if (c->len < TR_CHUNK_PATCH_SIZE || patches[i].offset > c->len - TR_CHUNK_PATCH_SIZE) {
      b->st.patches_failed++;
      failed = true;
      continue;
    }
    memcpy(payload_of(b, c) + patches[i].offset, patches[i].data, TR_CHUNK_PATCH_SIZE);
    b->st.patches_succeeded++;
  }
  if (failed)
    return TR_ERR_PROTO;
  if (!has_more)
    c->flags &= (uint8_t)~TR_CHUNK_NEEDS_PATCHING;
  return 0;
}

/* ---- reading ---- */

/* Parses the fragment at c->read_off; false on an ABI violation. */
static bool parse_frag(const tr_tbuf *b, const struct chunk *c, struct frag *f) {
  const uint8_t *p = payload_of(b, c);
  uint32_t pos = c->read_off, size = 0;
  for (unsigned i = 0;; i++) {
    if (i == TR_CHUNK_MAX_VARINT || pos >= c->len)
      return false;
    uint8_t byte = p[pos++];
    size |= (uint32_t)(byte & 0x7f) << (7 * i);
    if (!(byte & 0x80))
      break;
  }
  f->start = pos;
  f->drop = size == TR_CHUNK_DROP_PACKET_SIZE;
  f->len = f->drop ? 0 : size;
  return f->drop || size <= c->len - pos;
}

static void advance(struct chunk *c, const struct frag *f) {
  c->read_off = f->start + f->len;
  c->frags_read++;
}

static void exhaust(struct chunk *c) {
  c->frags_read = c->nfrags;
}

/* Frees the oldest chunk of `s`, read or given up on. */
static void consume_front(tr_tbuf *b, struct seq *s) {
  struct chunk *c = at(s, 0);
  set_kind(b, c->off, REC_PADDING);
  s->have_read = true;
  s->last_read_id = c->id;
  remove_at(s, 0);
}

static bool emit(tr_tbuf *b, struct seq *s, const struct chunk *first, const uint8_t *data,
                 size_t len, tr_tbuf_packet *out) {
  if (tr_tbuf_validate_packet(data, len) < 0) {
    b->st.invalid_packets++;
    return false;
  }
  out->data = data;
  out->len = len;
  out->producer_id = s->producer_id;
  out->writer_id = s->writer_id;
  out->uid = first->uid;
  out->pid = first->pid;
  out->previous_packet_dropped = s->loss;
  s->loss = 0;
  b->st.packets_read++;
  return true;
}

/* Gives up the packet started by the oldest chunk's last fragment and carried by the next
 * `k - 1` chunks: they are all read as far as that packet goes. */
static void drop_chain(struct seq *s, uint32_t k, uint32_t loss_bits) {
  for (uint32_t i = 0; i < k; i++)
    exhaust(at(s, i));
  mark_loss(s, loss_bits);
}

static int grow_scratch(tr_tbuf *b, size_t need) {
  if (b->scratch && need <= b->scratch_cap)
    return 0;
  size_t cap = b->scratch_cap ? b->scratch_cap : 4096;
  while (cap < need)
    cap *= 2;
  uint8_t *p = realloc(b->scratch, cap);
  if (!p)
    return TR_ERR_NOMEM;
  b->scratch = p;
  b->scratch_cap = cap;
  return 0;
}

/* The oldest chunk's fragment `f0` is its last and continues in the next chunk: finds the
 * rest of the packet in the chunks that follow and joins it. */
static int read_spanning(tr_tbuf *b, struct seq *s, bool final, const struct frag *f0,
                         tr_tbuf_packet *out) {
  size_t total = f0->len;
  uint32_t k = 1; /* chunks holding the packet so far */
  struct chunk *n;
  struct frag fn;
  for (;; k++) {
    n = k < s->count ? at(s, k) : NULL;
    bool missing = n ? n->id != at(s, k - 1)->id + 1 : final;
    if (!n && !final)
      return SPAN_STALLED; /* the next chunk may still come */
    if (n && !missing && (n->flags & TR_CHUNK_NEEDS_PATCHING)) {
      if (!final)
        return SPAN_STALLED;
      missing = true; /* it will be dropped unpatched */
    }
    if (missing) {
      b->st.packets_lost_in_gaps++;
      drop_chain(s, k, TR_TBUF_LOSS_REASSEMBLY_GAP);
      return SPAN_NONE;
    }
    if (n->nfrags == 0 && n->incomplete && !final)
      return SPAN_STALLED;
    if (n->nfrags == 0 || n->frags_read > 0 || !(n->flags & TR_CHUNK_FIRST_CONTINUES)) {
      b->st.packets_lost_in_gaps++;
      drop_chain(s, k, TR_TBUF_LOSS_REASSEMBLY_BROKEN_CHAIN);
      return SPAN_NONE;
    }
    if (!parse_frag(b, n, &fn)) {
      b->st.abi_violations++;
      exhaust(n);
      drop_chain(s, k, TR_TBUF_LOSS_CHUNK_CORRUPTED);
      return SPAN_NONE;
    }
    if (fn.drop) {
      b->st.trace_writer_packet_loss++;
      exhaust(n);
      drop_chain(s, k, TR_TBUF_LOSS_WRITER_ABORT);
      return SPAN_NONE;
    }
    total += fn.len;
    if (!(n->nfrags == 1 && (n->flags & TR_CHUNK_LAST_CONTINUES)))
      break; /* n ends the packet; otherwise n is a middle chunk */
  }

  int r = grow_scratch(b, total);
  if (r < 0)
    return r;
  struct chunk *c = at(s, 0);
  memcpy(b->scratch, payload_of(b, c) + f0->start, f0->len);
  size_t pos = f0->len;
  advance(c, f0);
  for (uint32_t i = 1; i <= k; i++) {
    struct chunk *m = at(s, i);
    struct frag fm = {0};
    /* Checked by the loop above; parsing again is cheaper than remembering every piece. */
    (void)parse_frag(b, m, &fm);
    memcpy(b->scratch + pos, payload_of(b, m) + fm.start, fm.len);
    pos += fm.len;
    advance(m, &fm);
  }
  /* An empty packet, like a single empty fragment, is skipped. */
  return total > 0 && emit(b, s, c, b->scratch, total, out) ? SPAN_EMITTED : SPAN_NONE;
}

/* 1 with the next packet of `s`, 0 when `s` is empty or stalled, or a negative error. */
static int next_packet(tr_tbuf *b, struct seq *s, bool final, tr_tbuf_packet *out) {
  while (s->count > 0) {
    struct chunk *c = at(s, 0);
    if (c->flags & TR_CHUNK_NEEDS_PATCHING) {
      if (!final)
        return 0;
      b->st.unpatched_chunks_dropped++;
      /* Its unread packets are lost like those of a missing chunk (a packet running into it
       * from the chunk before was counted by read_spanning already). */
      uint8_t unread_flags = c->frags_read == 0 ? c->flags
                                                : c->flags & (uint8_t)~TR_CHUNK_FIRST_CONTINUES;
      b->st.packets_lost_in_gaps +=
          tr_chunk_packets_begun(payload_of(b, c) + c->read_off, c->len - c->read_off,
                                 (uint16_t)(c->nfrags - c->frags_read), unread_flags, false);
      mark_loss(s, TR_TBUF_LOSS_CHUNK_CORRUPTED);
      consume_front(b, s);
      continue;
    }
    if (c->frags_read == 0 && s->have_read && c->id != s->last_read_id + 1)
      mark_loss(s, TR_TBUF_LOSS_READ_GAP);
    if (c->frags_read >= c->nfrags) {
      if (c->incomplete && !final)
        return 0;
      if (c->trimmed) {
        /* The final read of a chunk whose full commit never came (the session ended first,
         * e.g. its stop timed out): the fragment left out began a packet the writer was
         * still writing, which is lost, unless it is a leading continuation (then its
         * packet's head counted the loss, read_spanning). */
        mark_loss(s, TR_TBUF_LOSS_READ_GAP);
        if (!(c->nfrags == 0 && (c->flags & TR_CHUNK_FIRST_CONTINUES)))
          b->st.packets_lost_in_gaps++;
      }
      b->st.chunks_read++;
      b->st.bytes_read += c->len;
      consume_front(b, s);
      continue;
    }
    struct frag f;
    if (!parse_frag(b, c, &f)) {
      b->st.abi_violations++;
      mark_loss(s, TR_TBUF_LOSS_CHUNK_CORRUPTED);
      exhaust(c);
      continue;
    }
    if (f.drop) {
      b->st.trace_writer_packet_loss++;
      mark_loss(s, TR_TBUF_LOSS_WRITER_ABORT);
      exhaust(c);
      continue;
    }
    if (c->frags_read == 0 && (c->flags & TR_CHUNK_FIRST_CONTINUES)) {
      /* Its head was in chunk id - 1, which was not read together with it. */
      b->st.orphan_continuations++;
      mark_loss(s, TR_TBUF_LOSS_ORPHAN_CONTINUATION);
      advance(c, &f);
      continue;
    }
    if (c->frags_read + 1 == c->nfrags && (c->flags & TR_CHUNK_LAST_CONTINUES)) {
      int r = read_spanning(b, s, final, &f, out);
      if (r < 0 || r == SPAN_EMITTED)
        return r < 0 ? r : 1;
      if (r == SPAN_STALLED)
        return 0;
      continue;
    }
    advance(c, &f);
    if (f.len > 0 && emit(b, s, c, payload_of(b, c) + f.start, f.len, out))
      return 1;
  }
  return 0;
}

static void start_pass(tr_tbuf *b, bool final) {
  b->pass_active = true;
  b->pass_final = final;
  b->pass_wrapped = false;
  b->pass_pos = b->wptr;
  b->pass_id++;
  b->cur = NULL;
}

/* The sequence of the next chunk record in ring order not yet visited in this pass. */
static struct seq *next_seq_in_ring(tr_tbuf *b) {
  for (;;) {
    uint32_t limit = b->pass_wrapped ? b->wptr : b->size;
    if (b->pass_pos >= limit) {
      if (b->pass_wrapped)
        return NULL;
      b->pass_wrapped = true;
      b->pass_pos = 0;
      continue;
    }
    struct rec_hdr h;
    rec_read(b, b->pass_pos, &h);
    if (h.size == 0) {
      b->pass_pos = limit;
      continue;
    }
    b->pass_pos += h.size;
    if (h.kind != REC_CHUNK)
      continue;
    struct seq *s = find_seq(b, h.producer_id, h.writer_id);
    if (s && s->pass != b->pass_id) {
      s->pass = b->pass_id;
      return s;
    }
  }
}

int tr_tbuf_read_packet(tr_tbuf *b, bool final, tr_tbuf_packet *out) {
  if (!b->pass_active || b->pass_final != final)
    start_pass(b, final);
  for (;;) {
    if (b->cur) {
      int r = next_packet(b, b->cur, final, out);
      if (r != 0)
        return r;
    }
    b->cur = next_seq_in_ring(b);
    if (!b->cur) {
      b->pass_active = false;
      return 0;
    }
  }
}

/* ---- lifecycle ---- */

int tr_tbuf_new(size_t size, enum tr_tbuf_policy policy, tr_tbuf **out) {
  size &= ~(size_t)7;
  if (size < TR_TBUF_MIN_SIZE || size > TR_TBUF_MAX_SIZE ||
      (policy != TR_TBUF_RING_BUFFER && policy != TR_TBUF_DISCARD))
    return TR_ERR_INVAL;
  tr_tbuf *b = calloc(1, sizeof *b);
  if (!b)
    return TR_ERR_NOMEM;
  /* Zeroed: a zero size word marks ring space never written. */
  b->ring = calloc(1, size);
  if (!b->ring) {
    free(b);
    return TR_ERR_NOMEM;
  }
  b->size = (uint32_t)size;
  b->policy = policy;
  b->st.buffer_size = size;
  *out = b;
  return 0;
}

void tr_tbuf_free(tr_tbuf *b) {
  if (!b)
    return;
  for (size_t i = 0; i < b->nseqs; i++) {
    free(b->seqs[i]->q);
    free(b->seqs[i]);
  }
  free(b->seqs);
  free(b->scratch);
  free(b->ring);
  free(b);
}

static struct seq *clone_seq(const struct seq *src) {
  struct seq *s = malloc(sizeof *s);
  if (!s)
    return NULL;
  *s = *src;
  s->q = NULL;
  if (src->cap) {
    /* The deque is copied slot for slot: head and wrap-around stay valid as they are. */
    if (!(s->q = malloc((size_t)src->cap * sizeof *s->q))) {
      free(s);
      return NULL;
    }
    memcpy(s->q, src->q, (size_t)src->cap * sizeof *s->q);
  }
  return s;
}

int tr_tbuf_clone(const tr_tbuf *src, tr_tbuf **out) {
  tr_tbuf *b = calloc(1, sizeof *b);
  *out = NULL;
  if (!b)
    return TR_ERR_NOMEM;
  *b = *src;
  b->seqs = NULL;
  b->nseqs = b->capseqs = 0;
  b->scratch = NULL;
  b->scratch_cap = 0;
  b->pass_active = false;
  b->cur = NULL;
  if (!(b->ring = malloc(src->size)))
    goto fail;
  memcpy(b->ring, src->ring, src->size);
  if (src->nseqs && !(b->seqs = malloc(src->nseqs * sizeof *b->seqs)))
    goto fail;
  b->capseqs = src->nseqs;
  for (; b->nseqs < src->nseqs; b->nseqs++)
    if (!(b->seqs[b->nseqs] = clone_seq(src->seqs[b->nseqs])))
      goto fail;
  *out = b;
  return 0;
fail:
  tr_tbuf_free(b);
  return TR_ERR_NOMEM;
}

void tr_tbuf_get_stats(const tr_tbuf *b, tr_tbuf_stats *out) {
  *out = b->st;
}
