/* smb.h: the shared memory buffer (SMB) a producer writes trace chunks into (reference 4.1,
 * 4.4-4.6): creating or adopting the memfd, its geometry, the page header word and the
 * per-chunk state machine.
 *
 * The producer shares this memory and may change it at any time, so:
 * - every value read from the SMB (page word, chunk header) is loaded once into a local and
 *   only that local is checked and used;
 * - chunks leave the SMB by being copied into private memory (tr_smb_read_chunk,
 *   tr_smb_scrape_next) and are parsed only there (chunk.h);
 * - page and chunk indices are checked against the mapping, and chunk positions come from the
 *   layout in the loaded word, so nothing outside the mapping is ever touched;
 * - a CAS that keeps losing to the producer gives up after a bounded number of attempts.
 * Cost per chunk read: one or two CAS on the page word and one memcpy of the chunk
 * (<= 32760 bytes). Pure code over memory: no sockets, no event loop. */
#ifndef TR_SMB_H
#define TR_SMB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "relay/trace/chunk.h"

#define TR_SMB_PAGE_HEADER_SIZE 8u
#define TR_SMB_MAX_CHUNKS 14u /* per page (layout Div14) */
#define TR_SMB_MIN_PAGE_SIZE 4096u
#define TR_SMB_MAX_PAGE_SIZE (32u * 1024)
#define TR_SMB_MAX_SIZE (32u * 1024 * 1024)
#define TR_SMB_DEFAULT_PAGE_SIZE 4096u
#define TR_SMB_DEFAULT_SIZE (256u * 1024)
#define TR_SMB_NAME "perfetto_shmem"

enum tr_smb_chunk_state {
  TR_SMB_CHUNK_FREE = 0,
  TR_SMB_CHUNK_BEING_WRITTEN = 1,
  TR_SMB_CHUNK_BEING_READ = 2,
  TR_SMB_CHUNK_COMPLETE = 3,
};

/* Page layouts (bits 28-30 of the page word); 6 and 7 are reserved and invalid. */
enum tr_smb_layout {
  TR_SMB_LAYOUT_NONE = 0, /* not partitioned */
  TR_SMB_LAYOUT_DIV1 = 1,
  TR_SMB_LAYOUT_DIV2 = 2,
  TR_SMB_LAYOUT_DIV4 = 3,
  TR_SMB_LAYOUT_DIV7 = 4,
  TR_SMB_LAYOUT_DIV14 = 5,
};

typedef struct tr_smb {
  uint8_t *base;
  size_t size;
  size_t page_size;
  size_t num_pages;
  int fd;     /* the memfd, or -1 for a view over plain memory */
  bool owned; /* base is our mapping (munmap on close) */
} tr_smb;

typedef struct tr_smb_geometry {
  size_t size;
  size_t page_size;
} tr_smb_geometry;

/* True if page_size is a power-of-two multiple of 4 KiB, <= 32 KiB, divides size, and
 * size <= 32 MiB. */
bool tr_smb_geometry_valid(size_t size, size_t page_size);
/* traced's choice of geometry (reference 4.5): TraceConfig.producers[] values (in KiB, 0 =
 * unset) beat the InitializeConnection hints (bytes, 0 = unset); unset means the default;
 * the page is clamped to 32 KiB and the size to 32 MiB; anything still invalid gives the
 * defaults (256 KiB, 4 KiB). Always returns a valid geometry. */
tr_smb_geometry tr_smb_choose_geometry(uint32_t config_size_kb, uint32_t config_page_kb,
                                       uint32_t hint_size, uint32_t hint_page_size);

/* Creates a memfd named "perfetto_shmem" of a valid geometry, sealed against shrinking,
 * growing and further sealing, and maps it shared. TR_ERR_INVAL for an invalid geometry. */
int tr_smb_create(tr_smb *smb, tr_smb_geometry geometry);
/* Adopts a producer-provided fd (InitializeConnection.producer_provided_shmem). It must be a
 * memfd carrying F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL (else TR_ERR_PERM), and its size with
 * page_size (the producer's page size hint) must be a valid geometry as they are, with no
 * clamping (else TR_ERR_INVAL). On success the SMB owns fd; on failure the caller still
 * does. */
int tr_smb_adopt(tr_smb *smb, int fd, size_t page_size);
/* An SMB over memory the caller owns (8-byte aligned, valid geometry): tests, fuzzing. */
int tr_smb_init_view(tr_smb *smb, void *mem, size_t size, size_t page_size);
void tr_smb_close(tr_smb *smb);

/* Decoding a page word. The layout and states are only meaningful together, from one load. */
static inline unsigned tr_smb_word_layout(uint32_t word) {
  return (word >> 28) & 7u;
}
static inline unsigned tr_smb_word_state(uint32_t word, unsigned chunk) {
  return (word >> (2 * chunk)) & 3u;
}
/* Chunks per page for a layout: 0 for NONE and the reserved layouts 6 and 7. */
unsigned tr_smb_layout_chunks(unsigned layout);
/* floor((page_size - 8) / chunks) rounded down to a multiple of 4; 0 for a layout without
 * chunks. */
size_t tr_smb_chunk_size(size_t page_size, unsigned layout);
/* Loads a page's word once (acquire). TR_ERR_INVAL if page >= num_pages. */
int tr_smb_page_word(const tr_smb *smb, size_t page, uint32_t *word);
/* True if the producer could take a chunk now: a page not partitioned, or a Free chunk in a
 * partitioned one. A snapshot (the producer may take chunks while the words are read), exact
 * as to the chunks only the reader frees. O(pages). */
bool tr_smb_has_free_chunk(const tr_smb *smb);

/* The commit path (service side): Complete -> BeingRead, copy the whole chunk (header and
 * payload) into dst, zero its header, BeingRead -> Free (the page word becomes 0 when every
 * chunk of the page is Free). Returns the chunk size (bytes written to dst), or:
 * TR_ERR_INVAL page out of range or dst_cap too small for the chunk; TR_ERR_PROTO layout
 * invalid or chunk index not in it, or the producer changed the page under us;
 * TR_ERR_STATE the chunk is not Complete; TR_ERR_AGAIN too much contention on the page. */
int tr_smb_read_chunk(tr_smb *smb, size_t page, size_t chunk, uint8_t *dst, size_t dst_cap);

/* Scraping (flush, stop and a producer's departure, reference 4.6): visits chunks that are BeingWritten or Complete,
 * copying each into private memory and leaving every state alone. */
typedef struct tr_smb_scrape_iter {
  size_t page;
  unsigned chunk;
} tr_smb_scrape_iter;

typedef struct tr_smb_scraped {
  size_t page;
  unsigned chunk;
  bool complete; /* false: BeingWritten; apply tr_chunk_scrape_rule before use */
  size_t len;    /* chunk size copied into dst */
} tr_smb_scraped;

void tr_smb_scrape_init(tr_smb_scrape_iter *it);
/* 1: the next non-free chunk was copied into dst (dst_cap must hold the largest chunk of the
 * SMB, i.e. page_size - 8) and *out describes it; 0: no more. O(pages + chunks) per pass. */
int tr_smb_scrape_next(const tr_smb *smb, tr_smb_scrape_iter *it, uint8_t *dst,
                       size_t dst_cap, tr_smb_scraped *out);

/* The producer's side of the state machine, for tests, tools and the load generator. */
/* CAS 0 -> layout << 28. TR_ERR_STATE if the page is already partitioned. */
int tr_smb_partition_page(tr_smb *smb, size_t page, unsigned layout);
/* Free -> BeingWritten, then writes *h into the chunk header. *chunk_out and *size_out locate
 * the whole chunk (header included) in the SMB. */
int tr_smb_begin_write(tr_smb *smb, size_t page, size_t chunk, const tr_chunk_header *h,
                       uint8_t **chunk_out, size_t *size_out);
/* BeingWritten -> Complete. */
int tr_smb_complete_chunk(tr_smb *smb, size_t page, size_t chunk);

#endif
