/* test_smb.c: the SMB (relay/producer/smb.h): memfd creation and seals, adoption of a producer's fd,
 * geometry choice and validation, the page word and chunk state machine, scraping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "relay/producer/smb.h"
#include "relay/base/tr_error.h"

#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static uint32_t *word(tr_smb *smb, size_t page) {
  return (uint32_t *)(smb->base + page * smb->page_size);
}

static void test_create_is_sealed_memfd(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, tr_smb_choose_geometry(0, 0, 0, 0)), 0);
  assert_int_equal(smb.size, 256 * 1024);
  assert_int_equal(smb.page_size, 4096);
  assert_int_equal(smb.num_pages, 64);
  assert_int_equal(fcntl(smb.fd, F_GET_SEALS) & SEALS, SEALS);
  assert_true(fcntl(smb.fd, F_GETFD) & FD_CLOEXEC);
  assert_int_equal(ftruncate(smb.fd, 4096), -1);
  assert_int_equal(errno, EPERM);
  char path[64], target[128];
  snprintf(path, sizeof(path), "/proc/self/fd/%d", smb.fd);
  ssize_t n = readlink(path, target, sizeof(target) - 1);
  assert_true(n > 0);
  target[n] = 0;
  assert_non_null(strstr(target, "memfd:perfetto_shmem"));
  /* Fresh memory: every page unpartitioned. */
  uint32_t w = 1;
  assert_int_equal(tr_smb_page_word(&smb, 63, &w), 0);
  assert_int_equal(w, 0);
  assert_int_equal(tr_smb_page_word(&smb, 64, &w), TR_ERR_INVAL);
  tr_smb_close(&smb);
  assert_int_equal(smb.fd, -1);

  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){12288, 12288}), TR_ERR_INVAL);
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){64 << 20, 4096}), TR_ERR_INVAL);
}

static void test_geometry_table(void **state) {
  (void)state;
  static const struct {
    uint32_t cfg_kb, cfg_page_kb, hint, hint_page;
    size_t size, page;
  } rows[] = {
      {0, 0, 0, 0, 256 << 10, 4096},                 /* nothing: defaults */
      {0, 0, 1 << 20, 16384, 1 << 20, 16384},        /* valid hints */
      {0, 0, 1 << 20, 65536, 1 << 20, 32768},        /* page hint clamped to 32 KiB */
      {0, 0, 64u << 20, 4096, 32 << 20, 4096},       /* size clamped to 32 MiB */
      {0, 0, 1 << 20, 12288, 256 << 10, 4096},       /* 3 x 4 KiB: not a power of two */
      {0, 0, 1 << 20, 6000, 256 << 10, 4096},        /* not a multiple of 4 KiB */
      {0, 0, 1 << 20, 2048, 256 << 10, 4096},        /* below 4 KiB */
      {0, 0, 100 << 10, 8192, 256 << 10, 4096},      /* page does not divide the size */
      {0, 0, 4096, 8192, 256 << 10, 4096},           /* size below one page */
      {0, 0, 100 << 10, 0, 100 << 10, 4096},         /* size hint alone, default page */
      {0, 0, 0, 32768, 256 << 10, 32768},            /* page hint alone, default size */
      {2048, 8, 1 << 20, 16384, 2 << 20, 8192},      /* config beats hints */
      {2048, 0, 1 << 20, 16384, 2 << 20, 16384},     /* config size, hinted page */
      {0, 16, 1 << 20, 4096, 1 << 20, 16384},        /* config page, hinted size */
      {UINT32_MAX, UINT32_MAX, 0, 0, 32 << 20, 32768}, /* huge config: clamped, no wrap */
      {0, 0, 3 << 20, 32768, 3 << 20, 32768},
  };
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    tr_smb_geometry g =
        tr_smb_choose_geometry(rows[i].cfg_kb, rows[i].cfg_page_kb, rows[i].hint, rows[i].hint_page);
    if (g.size != rows[i].size || g.page_size != rows[i].page)
      fail_msg("row %zu: got %zu/%zu, want %zu/%zu", i, g.size, g.page_size, rows[i].size,
               rows[i].page);
    assert_true(tr_smb_geometry_valid(g.size, g.page_size));
  }
}

static void test_geometry_validity(void **state) {
  (void)state;
  assert_true(tr_smb_geometry_valid(4096, 4096));
  assert_true(tr_smb_geometry_valid(32 << 20, 32768));
  assert_false(tr_smb_geometry_valid(0, 4096));
  assert_false(tr_smb_geometry_valid(4096, 0));
  assert_false(tr_smb_geometry_valid((32 << 20) + 32768, 32768)); /* over 32 MiB */
  assert_false(tr_smb_geometry_valid(1 << 20, 65536));            /* ABI allows it, we do not */
  assert_false(tr_smb_geometry_valid(24576, 24576));              /* 6 x 4 KiB */
  assert_false(tr_smb_geometry_valid(12288, 8192));               /* does not divide */
}

static void test_layout_chunk_sizes(void **state) {
  (void)state;
  static const struct {
    unsigned layout, chunks;
    size_t at4k, at32k;
  } rows[] = {
      {0, 0, 0, 0},       {1, 1, 4088, 32760}, {2, 2, 2044, 16380}, {3, 4, 1020, 8188},
      {4, 7, 584, 4680},  {5, 14, 292, 2340},  {6, 0, 0, 0},        {7, 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
    assert_int_equal(tr_smb_layout_chunks(rows[i].layout), rows[i].chunks);
    assert_int_equal(tr_smb_chunk_size(4096, rows[i].layout), rows[i].at4k);
    assert_int_equal(tr_smb_chunk_size(32768, rows[i].layout), rows[i].at32k);
  }
  assert_int_equal(tr_smb_layout_chunks(8), 0);
  uint32_t w = 3u << 28 | 1u << 2 | 3u << 6;
  assert_int_equal(tr_smb_word_layout(w), TR_SMB_LAYOUT_DIV4);
  assert_int_equal(tr_smb_word_state(w, 0), TR_SMB_CHUNK_FREE);
  assert_int_equal(tr_smb_word_state(w, 1), TR_SMB_CHUNK_BEING_WRITTEN);
  assert_int_equal(tr_smb_word_state(w, 3), TR_SMB_CHUNK_COMPLETE);
}

static int sealed_memfd(size_t size, unsigned seals) {
  int fd = memfd_create("test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)size), 0);
  if (seals)
    assert_int_equal(fcntl(fd, F_ADD_SEALS, seals), 0);
  return fd;
}

static void test_adopt(void **state) {
  (void)state;
  tr_smb smb;
  int fd = sealed_memfd(64 << 10, SEALS);
  assert_int_equal(tr_smb_adopt(&smb, fd, 8192), 0);
  assert_int_equal(smb.size, 64 << 10);
  assert_int_equal(smb.num_pages, 8);
  assert_int_equal(smb.fd, fd);
  tr_smb_close(&smb);
  assert_int_equal(fcntl(fd, F_GETFD), -1); /* the SMB owned it */
}

static void test_adopt_rejections(void **state) {
  (void)state;
  tr_smb smb;
  /* Each refused fd stays the caller's: still open afterwards. */
  int fd = sealed_memfd(64 << 10, 0);
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_PERM); /* no seals */
  assert_true(fcntl(fd, F_GETFD) >= 0);
  close(fd);
  fd = sealed_memfd(64 << 10, F_SEAL_SHRINK | F_SEAL_GROW); /* could still be resealed */
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_PERM);
  close(fd);
  fd = sealed_memfd(64 << 10, F_SEAL_SEAL); /* could still be shrunk: SIGBUS for us */
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_PERM);
  close(fd);

  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  assert_int_equal(tr_smb_adopt(&smb, pipefd[0], 4096), TR_ERR_PERM);
  close(pipefd[0]);
  close(pipefd[1]);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  assert_int_equal(ftruncate(fileno(tmp), 65536), 0);
  assert_int_equal(tr_smb_adopt(&smb, fileno(tmp), 4096), TR_ERR_PERM);
  fclose(tmp);
  assert_int_equal(tr_smb_adopt(&smb, -1, 4096), TR_ERR_PERM);

  /* Sealed, but the geometry is not valid as it is: never clamped, refused. */
  fd = sealed_memfd(64 << 10, SEALS);
  assert_int_equal(tr_smb_adopt(&smb, fd, 0), TR_ERR_INVAL);
  assert_int_equal(tr_smb_adopt(&smb, fd, 12288), TR_ERR_INVAL);
  assert_int_equal(tr_smb_adopt(&smb, fd, 65536), TR_ERR_INVAL);
  close(fd);
  fd = sealed_memfd(20 << 10, SEALS);
  assert_int_equal(tr_smb_adopt(&smb, fd, 8192), TR_ERR_INVAL);
  close(fd);
  fd = sealed_memfd(0, SEALS);
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_INVAL);
  close(fd);
  fd = sealed_memfd(64u << 20, SEALS);
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_INVAL);
  close(fd);
  /* Write-sealed: we could not map it writable. */
  fd = sealed_memfd(64 << 10, SEALS | F_SEAL_WRITE);
  assert_int_equal(tr_smb_adopt(&smb, fd, 4096), TR_ERR_SYS(EPERM));
  close(fd);
}

static void test_init_view(void **state) {
  (void)state;
  tr_smb smb;
  uint8_t *mem = aligned_alloc(4096, 8192);
  assert_non_null(mem);
  assert_int_equal(tr_smb_init_view(&smb, mem + 4, 4096, 4096), TR_ERR_INVAL);
  assert_int_equal(tr_smb_init_view(&smb, mem, 8192, 3000), TR_ERR_INVAL);
  assert_int_equal(tr_smb_init_view(&smb, mem, 8192, 4096), 0);
  assert_int_equal(smb.num_pages, 2);
  tr_smb_close(&smb); /* does not free the caller's memory */
  free(mem);
}

static void write_chunk(tr_smb *smb, size_t page, size_t chunk, uint32_t id, uint8_t fill) {
  tr_chunk_header h = {.chunk_id = id, .writer_id = 7, .count = 1, .flags = 0};
  uint8_t *p;
  size_t size;
  assert_int_equal(tr_smb_begin_write(smb, page, chunk, &h, &p, &size), 0);
  memset(p + TR_CHUNK_HEADER_SIZE, fill, size - TR_CHUNK_HEADER_SIZE);
}

static void test_state_machine(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){16384, 4096}), 0);
  uint8_t dst[4096];

  assert_int_equal(tr_smb_partition_page(&smb, 1, TR_SMB_LAYOUT_DIV4), 0);
  assert_int_equal(*word(&smb, 1), 3u << 28);
  write_chunk(&smb, 1, 2, 42, 0xab);
  assert_int_equal(*word(&smb, 1), 3u << 28 | 1u << 4);
  /* Not Complete yet: the service may not take it. */
  assert_int_equal(tr_smb_read_chunk(&smb, 1, 2, dst, sizeof(dst)), TR_ERR_STATE);
  assert_int_equal(tr_smb_complete_chunk(&smb, 1, 2), 0);
  assert_int_equal(*word(&smb, 1), 3u << 28 | 3u << 4);
  write_chunk(&smb, 1, 0, 43, 0xcd); /* a neighbour still being written */

  memset(dst, 0, sizeof(dst));
  assert_int_equal(tr_smb_read_chunk(&smb, 1, 2, dst, sizeof(dst)), 1020);
  tr_chunk_header h;
  assert_int_equal(tr_chunk_header_decode(dst, 1020, &h), 0);
  assert_int_equal(h.chunk_id, 42);
  assert_int_equal(h.writer_id, 7);
  assert_int_equal(dst[8], 0xab);
  assert_int_equal(dst[1019], 0xab);
  assert_int_equal(dst[1020], 0); /* nothing past the chunk */
  /* Freed: state bits cleared, header zeroed, the layout kept for the neighbour. */
  assert_int_equal(*word(&smb, 1), 3u << 28 | 1u << 0);
  uint8_t *freed = smb.base + 4096 + 8 + 2 * 1020;
  assert_memory_equal(freed, "\0\0\0\0\0\0\0\0", 8);
  /* A chunk is read once. */
  assert_int_equal(tr_smb_read_chunk(&smb, 1, 2, dst, sizeof(dst)), TR_ERR_STATE);

  /* Freeing the last used chunk clears the page word entirely. */
  assert_int_equal(tr_smb_complete_chunk(&smb, 1, 0), 0);
  assert_int_equal(tr_smb_read_chunk(&smb, 1, 0, dst, sizeof(dst)), 1020);
  assert_int_equal(*word(&smb, 1), 0);
  /* And it can be partitioned again, differently. */
  assert_int_equal(tr_smb_partition_page(&smb, 1, TR_SMB_LAYOUT_DIV1), 0);
  write_chunk(&smb, 1, 0, 44, 0x11);
  assert_int_equal(tr_smb_complete_chunk(&smb, 1, 0), 0);
  assert_int_equal(tr_smb_read_chunk(&smb, 1, 0, dst, sizeof(dst)), 4088);
  assert_int_equal(*word(&smb, 1), 0);
  tr_smb_close(&smb);
}

/* Full means every page partitioned and no chunk Free; one chunk freed ends it. */
static void test_has_free_chunk(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){8192, 4096}), 0);
  uint8_t dst[4096];
  assert_true(tr_smb_has_free_chunk(&smb)); /* nothing partitioned */
  assert_int_equal(tr_smb_partition_page(&smb, 0, TR_SMB_LAYOUT_DIV1), 0);
  write_chunk(&smb, 0, 0, 1, 0x01);
  assert_true(tr_smb_has_free_chunk(&smb)); /* page 1 still free */
  assert_int_equal(tr_smb_partition_page(&smb, 1, TR_SMB_LAYOUT_DIV2), 0);
  write_chunk(&smb, 1, 0, 2, 0x02);
  assert_true(tr_smb_has_free_chunk(&smb)); /* chunk 1 of page 1 */
  write_chunk(&smb, 1, 1, 3, 0x03);
  assert_false(tr_smb_has_free_chunk(&smb));
  assert_int_equal(tr_smb_complete_chunk(&smb, 1, 1), 0);
  assert_false(tr_smb_has_free_chunk(&smb)); /* Complete is not free */
  assert_true(tr_smb_read_chunk(&smb, 1, 1, dst, sizeof(dst)) > 0);
  assert_true(tr_smb_has_free_chunk(&smb));
  tr_smb_close(&smb);
}

static void test_wrong_transitions(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){16384, 4096}), 0);
  uint8_t dst[4096];
  tr_chunk_header h = {.chunk_id = 1, .writer_id = 1};
  uint8_t *p;
  size_t size;

  /* Unpartitioned page: no chunk exists. */
  assert_int_equal(tr_smb_begin_write(&smb, 0, 0, &h, &p, &size), TR_ERR_PROTO);
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_PROTO);
  /* Bad arguments. */
  assert_int_equal(tr_smb_partition_page(&smb, 4, TR_SMB_LAYOUT_DIV1), TR_ERR_INVAL);
  assert_int_equal(tr_smb_partition_page(&smb, 0, TR_SMB_LAYOUT_NONE), TR_ERR_INVAL);
  assert_int_equal(tr_smb_partition_page(&smb, 0, 6), TR_ERR_INVAL);
  assert_int_equal(tr_smb_read_chunk(&smb, 4, 0, dst, sizeof(dst)), TR_ERR_INVAL);
  assert_int_equal(tr_smb_read_chunk(&smb, SIZE_MAX, 0, dst, sizeof(dst)), TR_ERR_INVAL);

  assert_int_equal(tr_smb_partition_page(&smb, 0, TR_SMB_LAYOUT_DIV4), 0);
  assert_int_equal(tr_smb_partition_page(&smb, 0, TR_SMB_LAYOUT_DIV4), TR_ERR_STATE);
  /* Chunk index outside the layout. */
  assert_int_equal(tr_smb_begin_write(&smb, 0, 4, &h, &p, &size), TR_ERR_PROTO);
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 4, dst, sizeof(dst)), TR_ERR_PROTO);
  assert_int_equal(tr_smb_read_chunk(&smb, 0, SIZE_MAX, dst, sizeof(dst)), TR_ERR_PROTO);
  /* Free: only Free -> BeingWritten. */
  assert_int_equal(tr_smb_complete_chunk(&smb, 0, 0), TR_ERR_STATE);
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_STATE);
  assert_int_equal(tr_smb_begin_write(&smb, 0, 0, &h, &p, &size), 0);
  assert_int_equal(size, 1020);
  /* BeingWritten: only -> Complete. */
  assert_int_equal(tr_smb_begin_write(&smb, 0, 0, &h, &p, &size), TR_ERR_STATE);
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_STATE);
  assert_int_equal(tr_smb_complete_chunk(&smb, 0, 0), 0);
  /* Complete: only -> BeingRead (by the service). */
  assert_int_equal(tr_smb_begin_write(&smb, 0, 0, &h, &p, &size), TR_ERR_STATE);
  assert_int_equal(tr_smb_complete_chunk(&smb, 0, 0), TR_ERR_STATE);
  /* A too small destination is refused before the chunk changes state. */
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, 1020), TR_ERR_INVAL);
  assert_int_equal(tr_smb_word_state(*word(&smb, 0), 0), TR_SMB_CHUNK_COMPLETE);

  /* BeingRead (as if another reader held it): nobody else may move it. */
  *word(&smb, 0) = 3u << 28 | 2u << 0;
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_STATE);
  assert_int_equal(tr_smb_begin_write(&smb, 0, 0, &h, &p, &size), TR_ERR_STATE);
  assert_int_equal(tr_smb_complete_chunk(&smb, 0, 0), TR_ERR_STATE);

  /* Reserved layouts have no chunks, whatever the state bits say. */
  *word(&smb, 0) = 6u << 28 | 3u;
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_PROTO);
  *word(&smb, 0) = 7u << 28 | 3u;
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), TR_ERR_PROTO);
  /* The reserved bit 31 does not change the layout. */
  *word(&smb, 0) = 1u << 31 | 1u << 28 | 3u;
  assert_int_equal(tr_smb_read_chunk(&smb, 0, 0, dst, sizeof(dst)), 4088);
  tr_smb_close(&smb);
}

static void test_scrape(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){5 * 8192, 8192}), 0);
  uint8_t dst[8192 - 8];
  /* page 0 Div2: chunk 0 Complete, chunk 1 BeingWritten; page 1 empty; page 2 Div14:
   * chunk 13 BeingWritten; page 3 reserved layout with state bits; page 4 Div1 being read. */
  assert_int_equal(tr_smb_partition_page(&smb, 0, TR_SMB_LAYOUT_DIV2), 0);
  write_chunk(&smb, 0, 0, 1, 0x01);
  assert_int_equal(tr_smb_complete_chunk(&smb, 0, 0), 0);
  write_chunk(&smb, 0, 1, 2, 0x02);
  assert_int_equal(tr_smb_partition_page(&smb, 2, TR_SMB_LAYOUT_DIV14), 0);
  write_chunk(&smb, 2, 13, 3, 0x03);
  *word(&smb, 3) = 7u << 28 | 0x0FFFFFFFu;
  *word(&smb, 4) = 1u << 28 | 2u;
  uint32_t before[5];
  for (size_t i = 0; i < 5; i++)
    before[i] = *word(&smb, i);

  static const struct {
    size_t page;
    unsigned chunk;
    bool complete;
    size_t len;
    uint32_t id;
  } want[] = {{0, 0, true, 4092, 1}, {0, 1, false, 4092, 2}, {2, 13, false, 584, 3}};
  tr_smb_scrape_iter it;
  tr_smb_scraped s;
  tr_smb_scrape_init(&it);
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(tr_smb_scrape_next(&smb, &it, dst, sizeof(dst), &s), 1);
    assert_int_equal(s.page, want[i].page);
    assert_int_equal(s.chunk, want[i].chunk);
    assert_int_equal(s.complete, want[i].complete);
    assert_int_equal(s.len, want[i].len);
    tr_chunk_header h;
    assert_int_equal(tr_chunk_header_decode(dst, s.len, &h), 0);
    assert_int_equal(h.chunk_id, want[i].id);
    assert_int_equal(dst[s.len - 1], want[i].id);
  }
  assert_int_equal(tr_smb_scrape_next(&smb, &it, dst, sizeof(dst), &s), 0);
  assert_int_equal(tr_smb_scrape_next(&smb, &it, dst, sizeof(dst), &s), 0);
  for (size_t i = 0; i < 5; i++)
    assert_int_equal(*word(&smb, i), before[i]); /* scraping changes no state */
  tr_smb_scrape_init(&it);
  assert_int_equal(tr_smb_scrape_next(&smb, &it, dst, 100, &s), TR_ERR_INVAL);
  tr_smb_close(&smb);
}

/* Two producer threads cycle their own chunk of one page while the service side reads both:
 * every CAS on the shared page word races with the others. Each chunk read must be whole
 * and in order; the page is re-partitioned whenever the reader freed it entirely. */
#define ROUNDS 20000u

typedef struct producer_arg {
  tr_smb *smb;
  unsigned chunk;
} producer_arg;

static void *producer_thread(void *arg) {
  producer_arg *a = arg;
  for (uint32_t id = 1; id <= ROUNDS;) {
    tr_chunk_header h = {.chunk_id = id, .writer_id = (uint16_t)(a->chunk + 1), .count = 1};
    uint8_t *p;
    size_t size;
    int rc = tr_smb_begin_write(a->smb, 0, a->chunk, &h, &p, &size);
    if (rc == TR_ERR_PROTO) { /* the reader freed the whole page: partition it again */
      tr_smb_partition_page(a->smb, 0, TR_SMB_LAYOUT_DIV4);
      continue;
    }
    if (rc == TR_ERR_STATE) { /* not read yet */
      sched_yield();
      continue;
    }
    if (rc != 0 || size != 1020)
      return (void *)1;
    memset(p + TR_CHUNK_HEADER_SIZE, (int)(id & 0xff), size - TR_CHUNK_HEADER_SIZE);
    if (tr_smb_complete_chunk(a->smb, 0, a->chunk) != 0)
      return (void *)1;
    id++;
  }
  return NULL;
}

static void test_concurrent_producers(void **state) {
  (void)state;
  tr_smb smb;
  assert_int_equal(tr_smb_create(&smb, (tr_smb_geometry){4096, 4096}), 0);
  producer_arg args[2] = {{&smb, 0}, {&smb, 3}};
  pthread_t threads[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&threads[i], NULL, producer_thread, &args[i]), 0);
  uint32_t next[2] = {1, 1};
  uint8_t dst[4096];
  while (next[0] <= ROUNDS || next[1] <= ROUNDS) {
    for (int i = 0; i < 2; i++) {
      int n = tr_smb_read_chunk(&smb, 0, args[i].chunk, dst, sizeof(dst));
      if (n == TR_ERR_STATE || n == TR_ERR_PROTO || n == TR_ERR_AGAIN)
        continue;
      assert_int_equal(n, 1020);
      tr_chunk_header h;
      assert_int_equal(tr_chunk_header_decode(dst, (size_t)n, &h), 0);
      assert_int_equal(h.writer_id, args[i].chunk + 1);
      assert_int_equal(h.chunk_id, next[i]);
      for (int j = TR_CHUNK_HEADER_SIZE; j < n; j++)
        if (dst[j] != (next[i] & 0xff))
          fail_msg("chunk %u byte %d torn", next[i], j);
      next[i]++;
    }
  }
  for (int i = 0; i < 2; i++) {
    void *ret;
    assert_int_equal(pthread_join(threads[i], &ret), 0);
    assert_null(ret);
  }
  assert_int_equal(*word(&smb, 0), 0);
  tr_smb_close(&smb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create_is_sealed_memfd),
      cmocka_unit_test(test_geometry_table),
      cmocka_unit_test(test_geometry_validity),
      cmocka_unit_test(test_layout_chunk_sizes),
      cmocka_unit_test(test_adopt),
      cmocka_unit_test(test_adopt_rejections),
      cmocka_unit_test(test_init_view),
      cmocka_unit_test(test_state_machine),
      cmocka_unit_test(test_has_free_chunk),
      cmocka_unit_test(test_wrong_transitions),
      cmocka_unit_test(test_scrape),
      cmocka_unit_test(test_concurrent_producers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
