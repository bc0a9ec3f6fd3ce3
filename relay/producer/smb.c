/* smb.c: the SMB memfd and its page/chunk state machine (reference 4.1, 4.4-4.6). The page
 * word is only ever changed by CAS and loaded once per decision; see smb.h for the
 * guarantees towards an untrusted producer. */
#include "relay/producer/smb.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "relay/base/tr_error.h"

#define REQUIRED_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define ALL_CHUNKS_MASK 0x0FFFFFFFu /* the 14 two-bit states */
/* As traced: a producer that keeps changing the page word under us wins after this many
 * lost CAS; only its own page suffers. */
#define MAX_CAS_ATTEMPTS 64

static const uint8_t kLayoutChunks[8] = {0, 1, 2, 4, 7, 14, 0, 0};

unsigned tr_smb_layout_chunks(unsigned layout) {
  return layout < 8 ? kLayoutChunks[layout] : 0;
}

size_t tr_smb_chunk_size(size_t page_size, unsigned layout) {
  unsigned n = tr_smb_layout_chunks(layout);
  if (n == 0 || page_size < TR_SMB_PAGE_HEADER_SIZE)
    return 0;
  return ((page_size - TR_SMB_PAGE_HEADER_SIZE) / n) & ~(size_t)3;
}

bool tr_smb_geometry_valid(size_t size, size_t page_size) {
  if (page_size < TR_SMB_MIN_PAGE_SIZE || page_size > TR_SMB_MAX_PAGE_SIZE ||
      page_size % TR_SMB_MIN_PAGE_SIZE != 0)
    return false;
  size_t units = page_size / TR_SMB_MIN_PAGE_SIZE;
  if (units & (units - 1))
    return false;
  return size >= page_size && size <= TR_SMB_MAX_SIZE && size % page_size == 0;
}

tr_smb_geometry tr_smb_choose_geometry(uint32_t config_size_kb, uint32_t config_page_kb,
                                       uint32_t hint_size, uint32_t hint_page_size) {
  uint64_t size = (uint64_t)config_size_kb * 1024;
  uint64_t page = (uint64_t)config_page_kb * 1024;
  if (size == 0)
    size = hint_size ? hint_size : TR_SMB_DEFAULT_SIZE;
  if (page == 0)
    page = hint_page_size ? hint_page_size : TR_SMB_DEFAULT_PAGE_SIZE;
  if (page > TR_SMB_MAX_PAGE_SIZE)
    page = TR_SMB_MAX_PAGE_SIZE;
  if (size > TR_SMB_MAX_SIZE)
    size = TR_SMB_MAX_SIZE;
  if (!tr_smb_geometry_valid(size, page))
    return (tr_smb_geometry){TR_SMB_DEFAULT_SIZE, TR_SMB_DEFAULT_PAGE_SIZE};
  return (tr_smb_geometry){size, page};
}

static int map_fd(tr_smb *smb, int fd, size_t size, size_t page_size) {
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return TR_ERR_SYS(errno);
  smb->base = p;
  smb->size = size;
  smb->page_size = page_size;
  smb->num_pages = size / page_size;
  smb->fd = fd;
  smb->owned = true;
  return 0;
}

int tr_smb_create(tr_smb *smb, tr_smb_geometry geometry) {
  if (!tr_smb_geometry_valid(geometry.size, geometry.page_size))
    return TR_ERR_INVAL;
  int fd = memfd_create(TR_SMB_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return TR_ERR_SYS(errno);
  int rc;
  if (ftruncate(fd, (off_t)geometry.size) < 0 || fcntl(fd, F_ADD_SEALS, REQUIRED_SEALS) < 0) {
    rc = TR_ERR_SYS(errno);
    goto fail;
  }
  rc = map_fd(smb, fd, geometry.size, geometry.page_size);
  if (rc < 0)
    goto fail;
  return 0;
fail:
  close(fd);
  return rc;
}

int tr_smb_adopt(tr_smb *smb, int fd, size_t page_size) {
  /* The seals come first: only once the size cannot change is it worth checking. */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS)
    return TR_ERR_PERM;
  struct stat st;
  if (fstat(fd, &st) < 0)
    return TR_ERR_SYS(errno);
  if (!S_ISREG(st.st_mode) || st.st_size < 0 ||
      !tr_smb_geometry_valid((size_t)st.st_size, page_size))
    return TR_ERR_INVAL;
  return map_fd(smb, fd, (size_t)st.st_size, page_size);
}

int tr_smb_init_view(tr_smb *smb, void *mem, size_t size, size_t page_size) {
  if (((uintptr_t)mem & 7u) || !tr_smb_geometry_valid(size, page_size))
    return TR_ERR_INVAL;
  smb->base = mem;
  smb->size = size;
  smb->page_size = page_size;
  smb->num_pages = size / page_size;
  smb->fd = -1;
  smb->owned = false;
  return 0;
}

void tr_smb_close(tr_smb *smb) {
  if (smb->owned && smb->base)
    munmap(smb->base, smb->size);
  if (smb->fd >= 0)
    close(smb->fd);
  smb->base = NULL;
  smb->fd = -1;
  smb->owned = false;
}

static uint32_t *word_ptr(const tr_smb *smb, size_t page) {
  return (uint32_t *)(smb->base + page * smb->page_size);
}

int tr_smb_page_word(const tr_smb *smb, size_t page, uint32_t *word) {
  if (page >= smb->num_pages)
    return TR_ERR_INVAL;
  *word = __atomic_load_n(word_ptr(smb, page), __ATOMIC_ACQUIRE);
  return 0;
}

bool tr_smb_has_free_chunk(const tr_smb *smb) {
  for (size_t page = 0; page < smb->num_pages; page++) {
    uint32_t word = __atomic_load_n(word_ptr(smb, page), __ATOMIC_ACQUIRE);
    unsigned layout = tr_smb_word_layout(word);
    if (layout == TR_SMB_LAYOUT_NONE)
      return true;
    unsigned chunks = tr_smb_layout_chunks(layout);
    for (unsigned c = 0; c < chunks; c++)
      if (tr_smb_word_state(word, c) == TR_SMB_CHUNK_FREE)
        return true;
  }
  return false;
}

/* Only valid for a chunk index inside `layout`, which bounds it to the page. */
static uint8_t *chunk_ptr(const tr_smb *smb, size_t page, size_t chunk, size_t chunk_size) {
  return smb->base + page * smb->page_size + TR_SMB_PAGE_HEADER_SIZE + chunk * chunk_size;
}

/* Moves one chunk from state `from` to `to` by CAS on the page word, retrying while the
 * producer changes other bits of it. *before gets the word the CAS replaced. Freeing the
 * last used chunk of a page clears the whole word (the page is no longer partitioned). */
static int transition(tr_smb *smb, size_t page, size_t chunk, unsigned from, unsigned to,
                      uint32_t *before) {
  if (page >= smb->num_pages)
    return TR_ERR_INVAL;
  uint32_t *w = word_ptr(smb, page);
  uint32_t word = __atomic_load_n(w, __ATOMIC_ACQUIRE);
  for (int attempt = 0; attempt < MAX_CAS_ATTEMPTS; attempt++) {
    if (chunk >= tr_smb_layout_chunks(tr_smb_word_layout(word)))
      return TR_ERR_PROTO;
    if (tr_smb_word_state(word, (unsigned)chunk) != from)
      return TR_ERR_STATE;
    unsigned shift = 2 * (unsigned)chunk;
    uint32_t next = (word & ~(3u << shift)) | (uint32_t)to << shift;
    if (to == TR_SMB_CHUNK_FREE && (next & ALL_CHUNKS_MASK) == 0)
      next = 0;
    /* On failure `word` is reloaded with the current value and re-checked. */
    if (__atomic_compare_exchange_n(w, &word, next, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      *before = word;
      return 0;
    }
  }
  return TR_ERR_AGAIN;
}

/* Copies a chunk out of shared memory. The packet count is loaded with acquire ordering
 * before the payload, so the copied payload is at least as new as the count: a fragment the
 * count announces was started before we copy it. */
static void copy_chunk(uint8_t *dst, const uint8_t *src, size_t size) {
  uint16_t packets = __atomic_load_n((const uint16_t *)(src + 6), __ATOMIC_ACQUIRE);
  uint32_t chunk_id = __atomic_load_n((const uint32_t *)src, __ATOMIC_RELAXED);
  uint16_t writer_id = __atomic_load_n((const uint16_t *)(src + 4), __ATOMIC_RELAXED);
  memcpy(dst, &chunk_id, 4); /* the ABI is little-endian, as is every host we build for */
  memcpy(dst + 4, &writer_id, 2);
  memcpy(dst + 6, &packets, 2);
  memcpy(dst + TR_CHUNK_HEADER_SIZE, src + TR_CHUNK_HEADER_SIZE, size - TR_CHUNK_HEADER_SIZE);
}

int tr_smb_read_chunk(tr_smb *smb, size_t page, size_t chunk, uint8_t *dst, size_t dst_cap) {
  if (dst_cap < smb->page_size - TR_SMB_PAGE_HEADER_SIZE)
    return TR_ERR_INVAL;
  uint32_t before, after;
  int rc = transition(smb, page, chunk, TR_SMB_CHUNK_COMPLETE, TR_SMB_CHUNK_BEING_READ, &before);
  if (rc < 0)
    return rc;
  unsigned layout = tr_smb_word_layout(before);
  size_t size = tr_smb_chunk_size(smb->page_size, layout);
  uint8_t *src = chunk_ptr(smb, page, chunk, size);
  copy_chunk(dst, src, size);
  /* A freed chunk has a zeroed header, so a producer re-acquiring it starts clean. */
  __atomic_store_n((uint32_t *)src, 0, __ATOMIC_RELAXED);
  __atomic_store_n((uint32_t *)(src + 4), 0, __ATOMIC_RELAXED);
  rc = transition(smb, page, chunk, TR_SMB_CHUNK_BEING_READ, TR_SMB_CHUNK_FREE, &after);
  /* Only the producer can have moved our BeingRead chunk or re-partitioned the page while
   * we copied: the copy then means nothing. */
  if (rc < 0)
    return rc == TR_ERR_AGAIN ? rc : TR_ERR_PROTO;
  if (tr_smb_word_layout(after) != layout)
    return TR_ERR_PROTO;
  return (int)size;
}

void tr_smb_scrape_init(tr_smb_scrape_iter *it) {
  it->page = 0;
  it->chunk = 0;
}

int tr_smb_scrape_next(const tr_smb *smb, tr_smb_scrape_iter *it, uint8_t *dst,
                       size_t dst_cap, tr_smb_scraped *out) {
  if (dst_cap < smb->page_size - TR_SMB_PAGE_HEADER_SIZE)
    return TR_ERR_INVAL;
  for (; it->page < smb->num_pages; it->page++, it->chunk = 0) {
    uint32_t word = __atomic_load_n(word_ptr(smb, it->page), __ATOMIC_ACQUIRE);
    unsigned layout = tr_smb_word_layout(word);
    unsigned n = tr_smb_layout_chunks(layout);
    size_t size = tr_smb_chunk_size(smb->page_size, layout);
    while (it->chunk < n) {
      unsigned c = it->chunk++;
      unsigned state = tr_smb_word_state(word, c);
      if (state != TR_SMB_CHUNK_BEING_WRITTEN && state != TR_SMB_CHUNK_COMPLETE)
        continue;
      copy_chunk(dst, chunk_ptr(smb, it->page, c, size), size);
      out->page = it->page;
      out->chunk = c;
      out->complete = state == TR_SMB_CHUNK_COMPLETE;
      out->len = size;
      return 1;
    }
  }
  return 0;
}

int tr_smb_partition_page(tr_smb *smb, size_t page, unsigned layout) {
  if (page >= smb->num_pages || tr_smb_layout_chunks(layout) == 0)
    return TR_ERR_INVAL;
  uint32_t expected = 0;
  if (!__atomic_compare_exchange_n(word_ptr(smb, page), &expected, (uint32_t)layout << 28, false,
                                   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return TR_ERR_STATE;
  return 0;
}

int tr_smb_begin_write(tr_smb *smb, size_t page, size_t chunk, const tr_chunk_header *h,
                       uint8_t **chunk_out, size_t *size_out) {
  uint32_t before;
  int rc = transition(smb, page, chunk, TR_SMB_CHUNK_FREE, TR_SMB_CHUNK_BEING_WRITTEN, &before);
  if (rc < 0)
    return rc;
  size_t size = tr_smb_chunk_size(smb->page_size, tr_smb_word_layout(before));
  uint8_t *p = chunk_ptr(smb, page, chunk, size);
  tr_chunk_header_encode(h, p);
  *chunk_out = p;
  *size_out = size;
  return 0;
}

int tr_smb_complete_chunk(tr_smb *smb, size_t page, size_t chunk) {
  uint32_t before;
  return transition(smb, page, chunk, TR_SMB_CHUNK_BEING_WRITTEN, TR_SMB_CHUNK_COMPLETE,
                    &before);
}
