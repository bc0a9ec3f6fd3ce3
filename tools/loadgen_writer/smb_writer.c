/* smb_writer.c: the producer side of the shared-memory ABI (see smb_writer.h for the rules it
 * follows and why). Page and chunk-header words are shared with the service and touched only
 * with atomics; everything else in a chunk is ours while it is BeingWritten. */
#include "tools/loadgen_writer/smb_writer.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "relay/base/tr_error.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the SMB ABI is little-endian");

enum { CHUNK_FREE = 0, CHUNK_BEING_WRITTEN = 1, CHUNK_COMPLETE = 3 };
enum { FLAG_FIRST_CONTINUES = 1, FLAG_LAST_CONTINUES = 2, FLAG_NEEDS_PATCHING = 4 };

static const unsigned kChunksPerLayout[8] = {0, 1, 2, 4, 7, 14, 0, 0};

static uint32_t *page_word(const lg_smb *smb, size_t page) {
  return (uint32_t *)(smb->base + page * smb->page_size);
}

static size_t chunk_size(const lg_smb *smb, uint32_t layout) {
  return ((smb->page_size - LG_SMB_PAGE_HEADER) / kChunksPerLayout[layout]) & ~(size_t)3;
}

const uint8_t *lg_smb_chunk_at(const lg_smb *smb, uint32_t page, uint32_t chunk) {
  return smb->base + (size_t)page * smb->page_size + LG_SMB_PAGE_HEADER +
         chunk * chunk_size(smb, smb->layout);
}

unsigned lg_smb_chunk_state(const lg_smb *smb, uint32_t page, uint32_t chunk) {
  return __atomic_load_n(page_word(smb, page), __ATOMIC_ACQUIRE) >> (2 * chunk) & 3;
}

int lg_smb_map(lg_smb *smb, int fd, size_t page_size, unsigned chunks_per_page) {
  memset(smb, 0, sizeof(*smb));
  for (uint32_t l = 1; l <= 5; l++)
    if (kChunksPerLayout[l] == chunks_per_page)
      smb->layout = l;
  if (smb->layout == 0 || page_size < 4096 || page_size > 65536 ||
      (page_size & (page_size - 1)) != 0)
    return TR_ERR_INVAL;
  struct stat st;
  if (fstat(fd, &st) != 0)
    return TR_ERR_SYS(errno);
  if (st.st_size <= 0 || (size_t)st.st_size % page_size != 0)
    return TR_ERR_INVAL;
  void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return TR_ERR_SYS(errno);
  smb->base = base;
  smb->size = (size_t)st.st_size;
  smb->page_size = page_size;
  smb->num_pages = smb->size / page_size;
  return 0;
}

void lg_smb_unmap(lg_smb *smb) {
  if (smb->base)
    munmap(smb->base, smb->size);
  memset(smb, 0, sizeof(*smb));
}

/* A chunk marked BeingWritten for us. */
typedef struct chunk_slot {
  uint8_t *begin;
  uint8_t *end;
  uint32_t page;
  uint32_t index;
} chunk_slot;

/* Finds a free chunk and marks it BeingWritten, partitioning a free page first. The search
 * starts at the page last used, as the SDK's arbiter does. */
static int acquire(lg_smb *smb, chunk_slot *out) {
  unsigned start = __atomic_load_n(&smb->next_page, __ATOMIC_RELAXED);
  for (size_t n = 0; n < smb->num_pages; n++) {
    size_t page = (start + n) % smb->num_pages;
    uint32_t *word = page_word(smb, page);
    uint32_t w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    if ((w >> 28 & 7) == 0) {
      uint32_t partitioned = smb->layout << 28;
      if (__atomic_compare_exchange_n(word, &w, partitioned, false, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE))
        w = partitioned;
    }
    uint32_t layout = w >> 28 & 7;
    for (unsigned i = 0; i < kChunksPerLayout[layout]; i++) {
      while ((w >> (2 * i) & 3) == CHUNK_FREE && (w >> 28 & 7) == layout) {
        uint32_t taken = w | (uint32_t)CHUNK_BEING_WRITTEN << (2 * i);
        if (__atomic_compare_exchange_n(word, &w, taken, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
          __atomic_store_n(&smb->next_page, (unsigned)page, __ATOMIC_RELAXED);
          size_t size = chunk_size(smb, layout);
          out->begin = (uint8_t *)word + LG_SMB_PAGE_HEADER + i * size;
          out->end = out->begin + size;
          out->page = (uint32_t)page;
          out->index = i;
          return 0;
        }
      }
    }
  }
  return TR_ERR_FULL;
}

/* BeingWritten -> Complete. Only the service changes a chunk we hold, and only if it breaks
 * the ABI, so a chunk found in another state is reported, not retried. */
static int complete(lg_smb *smb, uint32_t page, uint32_t chunk) {
  uint32_t *word = page_word(smb, page);
  uint32_t w = __atomic_load_n(word, __ATOMIC_RELAXED);
  for (;;) {
    if ((w >> (2 * chunk) & 3) != CHUNK_BEING_WRITTEN)
      return TR_ERR_PROTO;
    uint32_t done = w | (uint32_t)CHUNK_COMPLETE << (2 * chunk);
    if (__atomic_compare_exchange_n(word, &w, done, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
      return 0;
  }
}

static void write_redundant_varint(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)((v & 0x7f) | 0x80);
  p[1] = (uint8_t)((v >> 7 & 0x7f) | 0x80);
  p[2] = (uint8_t)((v >> 14 & 0x7f) | 0x80);
  p[3] = (uint8_t)(v >> 21 & 0x7f);
}

static uint8_t *payload(const lg_trace_writer *tw) { return tw->chunk + LG_SMB_CHUNK_HEADER; }

static void store_packets_word(lg_trace_writer *tw) {
  uint16_t word = (uint16_t)(tw->count | tw->flags << 10);
  __atomic_store_n((uint16_t *)(tw->chunk + 6), word, __ATOMIC_RELEASE);
}

void lg_tw_init(lg_trace_writer *tw, lg_smb *smb, uint16_t writer_id, uint32_t target_buffer,
                lg_commit_fn commit, void *commit_ctx) {
  memset(tw, 0, sizeof(*tw));
  tw->smb = smb;
  tw->writer_id = writer_id;
  tw->target_buffer = target_buffer;
  tw->commit = commit;
  tw->commit_ctx = commit_ctx;
}

/* Makes `slot` the current chunk and writes its header. */
static void install_chunk(lg_trace_writer *tw, const chunk_slot *slot, uint8_t flags) {
  tw->chunk = slot->begin;
  tw->end = slot->end;
  tw->wptr = payload(tw);
  tw->page = slot->page;
  tw->chunk_index = slot->index;
  tw->chunk_id = tw->next_chunk_id++;
  tw->count = 0;
  tw->flags = flags;
  __atomic_store_n((uint32_t *)tw->chunk, tw->chunk_id, __ATOMIC_RELAXED);
  __atomic_store_n((uint16_t *)(tw->chunk + 4), tw->writer_id, __ATOMIC_RELAXED);
  store_packets_word(tw);
}

static void start_fragment(lg_trace_writer *tw) {
  tw->frag_size = tw->wptr;
  memset(tw->wptr, 0, 4);
  tw->wptr += 4;
  tw->frag_start = tw->wptr;
  tw->count++;
  store_packets_word(tw);
}

/* Sends the current chunk (if `move`) and the patches ready at the front of the queue. */
static int send_commit(lg_trace_writer *tw, bool move) {
  lg_patch ready[LG_SMB_MAX_PENDING_PATCHES];
  size_t n = 0;
  while (n < tw->num_patches && tw->patches[n].ready)
    ready[n] = tw->patches[n], n++;
  if (!move && n == 0)
    return 0;
  memmove(tw->patches, tw->patches + n, (tw->num_patches - n) * sizeof(lg_patch));
  tw->num_patches -= n;
  /* Nested messages still open refer to their patch by index. */
  for (int d = 0; d < tw->depth; d++)
    if (!tw->nest[d].size_field && tw->nest[d].patch >= 0)
      tw->nest[d].patch -= (int)n;
  lg_commit c = {
      .has_move = move,
      .page = tw->page,
      .chunk = tw->chunk_index,
      .target_buffer = tw->target_buffer,
      .writer_id = tw->writer_id,
      .patches = ready,
      .num_patches = n,
      .last_has_more = n > 0 && tw->num_patches > 0 &&
                       tw->patches[0].chunk_id == ready[n - 1].chunk_id,
  };
  if (tw->error == 0) {
    int rc = tw->commit(tw->commit_ctx, &c);
    if (rc < 0)
      tw->error = rc;
  }
  tw->counters.patches_sent += n;
  return tw->error;
}

/* Hands the current chunk to the service: Complete, then CommitData. */
static int release_chunk(lg_trace_writer *tw) {
  store_packets_word(tw);
  int rc = complete(tw->smb, tw->page, tw->chunk_index);
  if (rc < 0 && tw->error == 0)
    tw->error = rc;
  rc = send_commit(tw, true);
  tw->counters.chunks_committed++;
  tw->chunk = NULL;
  return rc;
}

/* The packet being written needs more room: continue it in a new chunk or, if the SMB is
 * full, abandon it with the drop-packet size so that the service discards what was written.
 * As in the SDK, the new chunk is taken before the old one is handed over. */
static void switch_chunk(lg_trace_writer *tw) {
  chunk_slot next;
  if (acquire(tw->smb, &next) < 0) {
    write_redundant_varint(tw->frag_size, LG_SMB_DROP_PACKET_SIZE);
    /* No patches for a packet the service will discard anyway. */
    for (int d = 0; d < tw->depth; d++)
      tw->nest[d].size_field = NULL;
    release_chunk(tw);
    tw->dropping = true;
    return;
  }
  uint32_t partial = (uint32_t)(tw->wptr - tw->frag_start);
  write_redundant_varint(tw->frag_size, partial);
  /* An empty fragment is an empty packet: the packet starts afresh in the next chunk. */
  if (partial > 0) {
    tw->flags |= FLAG_LAST_CONTINUES;
    for (int d = 0; d < tw->depth; d++) {
      uint8_t *field = tw->nest[d].size_field;
      if (!field)
        continue;
      if (tw->num_patches == LG_SMB_MAX_PENDING_PATCHES) {
        tw->error = TR_ERR_INVAL;
        break;
      }
      tw->patches[tw->num_patches] = (lg_patch){
          .chunk_id = tw->chunk_id, .offset = (uint32_t)(field - payload(tw))};
      tw->nest[d].size_field = NULL;
      tw->nest[d].patch = (int)tw->num_patches++;
      tw->flags |= FLAG_NEEDS_PATCHING;
    }
  }
  release_chunk(tw);
  install_chunk(tw, &next, partial > 0 ? FLAG_FIRST_CONTINUES : 0);
  tw->single_chunk = partial == 0;
  start_fragment(tw);
}

int lg_tw_begin_packet(lg_trace_writer *tw) {
  if (tw->error)
    return tw->error;
  if (tw->chunk && (tw->end - tw->wptr < 4 || tw->count >= LG_SMB_MAX_FRAGMENTS))
    release_chunk(tw);
  send_commit(tw, false);
  tw->in_packet = true;
  tw->packet_bytes = 0;
  tw->depth = 0;
  tw->single_chunk = true;
  if (!tw->chunk) {
    chunk_slot slot;
    tw->dropping = acquire(tw->smb, &slot) < 0;
    if (tw->dropping)
      return TR_ERR_FULL;
    install_chunk(tw, &slot, 0);
  }
  start_fragment(tw);
  int lost = tw->loss_pending;
  tw->loss_pending = false;
  return lost;
}

void lg_tw_append(lg_trace_writer *tw, const void *data, size_t len) {
  const uint8_t *p = data;
  tw->packet_bytes += len;
  while (len > 0 && !tw->dropping) {
    if (tw->wptr == tw->end) {
      switch_chunk(tw);
      continue;
    }
    size_t n = (size_t)(tw->end - tw->wptr);
    if (n > len)
      n = len;
    memcpy(tw->wptr, p, n);
    tw->wptr += n;
    p += n;
    len -= n;
  }
}

void lg_tw_begin_nested(lg_trace_writer *tw, uint32_t field) {
  uint8_t tag[5];
  size_t n = 0;
  for (uint32_t v = field << 3 | 2; ; v >>= 7) {
    tag[n++] = (uint8_t)(v > 0x7f ? (v & 0x7f) | 0x80 : v);
    if (v <= 0x7f)
      break;
  }
  lg_tw_append(tw, tag, n);
  /* A size field never straddles chunks: the rest of a too-short tail is left unused. */
  if (!tw->dropping && tw->end - tw->wptr < 4)
    switch_chunk(tw);
  int d = tw->depth++;
  tw->nest[d].size_field = NULL;
  tw->nest[d].patch = -1;
  if (!tw->dropping) {
    tw->nest[d].size_field = tw->wptr;
    memset(tw->wptr, 0, 4);
    tw->wptr += 4;
  }
  tw->packet_bytes += 4;
  tw->nest[d].start = tw->packet_bytes;
}

void lg_tw_end_nested(lg_trace_writer *tw) {
  int d = --tw->depth;
  uint32_t size = (uint32_t)(tw->packet_bytes - tw->nest[d].start);
  if (tw->nest[d].size_field) {
    write_redundant_varint(tw->nest[d].size_field, size);
  } else if (tw->nest[d].patch >= 0) {
    lg_patch *patch = &tw->patches[tw->nest[d].patch];
    write_redundant_varint(patch->data, size);
    patch->ready = true;
  }
}

uint64_t lg_tw_packet_bytes(const lg_trace_writer *tw) { return tw->packet_bytes; }

int lg_tw_end_packet(lg_trace_writer *tw) {
  tw->in_packet = false;
  tw->depth = 0;
  if (tw->dropping) {
    tw->dropping = false;
    tw->loss_pending = true;
    tw->counters.packets_dropped++;
    return tw->error ? tw->error : TR_ERR_FULL;
  }
  uint32_t size = (uint32_t)(tw->wptr - tw->frag_start);
  if (tw->single_chunk && size < 0x80) {
    /* The SDK shortens the size of a small packet that stayed in one chunk to one byte. */
    memmove(tw->frag_size + 1, tw->frag_start, size);
    tw->frag_size[0] = (uint8_t)size;
    tw->wptr -= 3;
  } else {
    write_redundant_varint(tw->frag_size, size);
  }
  tw->counters.packets_written++;
  tw->counters.bytes_written += tw->packet_bytes;
  return tw->error;
}

int lg_tw_flush(lg_trace_writer *tw) {
  if (tw->chunk)
    return release_chunk(tw);
  return send_commit(tw, false);
}
