/* bench_smb_drain.c: how fast the producer port moves committed chunks out of shared memory
 * into the chunk queue, against a plain memcpy of the same bytes in the same run.
 * Usage: bench_smb_drain [rounds, default 200].
 *
 * Each round fills a 4 MiB memfd SMB as a producer does in-process (partition each page, take
 * each chunk Free -> BeingWritten, write 100-byte packets as fragments, Complete), then commits
 * every chunk through the real commit path (tr_producer_shm_commit: page/chunk checks, CAS
 * Complete -> BeingRead, copy out, header and fragment checks, queue push, CAS -> Free), in
 * CommitData-sized batches of 32 chunks, as the SDK batches them. The queue is emptied between
 * rounds, outside the timing, as the relay link would do it. The baseline copies the same
 * chunk bytes with memcpy into fresh buffers of the same sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay/producer/producer_shm.h"
#include "relay/base/tr_error.h"

#define SMB_SIZE (4u << 20)
#define BATCH 32
#define PACKET 100

typedef struct layout_case {
  const char *name;
  size_t page_size;
  unsigned layout;
} layout_case;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Fills every chunk of every page with whole packets; returns the payload bytes in use. */
static size_t fill(tr_smb *smb, unsigned layout, uint32_t *chunk_id) {
  size_t used_total = 0;
  unsigned n = tr_smb_layout_chunks(layout);
  for (size_t page = 0; page < smb->num_pages; page++) {
    if (tr_smb_partition_page(smb, page, layout) < 0)
      abort();
    for (unsigned c = 0; c < n; c++) {
      uint8_t *p;
      size_t size;
      size_t packets = (tr_smb_chunk_size(smb->page_size, layout) - TR_CHUNK_HEADER_SIZE) /
                       (PACKET + 1);
      tr_chunk_header h = {.chunk_id = (*chunk_id)++, .writer_id = 1, .count = (uint16_t)packets};
      if (tr_smb_begin_write(smb, page, c, &h, &p, &size) < 0)
        abort();
      size_t off = TR_CHUNK_HEADER_SIZE;
      for (size_t k = 0; k < packets; k++) {
        p[off] = PACKET;
        memset(p + off + 1, (int)k, PACKET);
        off += PACKET + 1;
      }
      used_total += off - TR_CHUNK_HEADER_SIZE;
      if (tr_smb_complete_chunk(smb, page, c) < 0)
        abort();
    }
  }
  return used_total;
}

static void drain(tr_chunkq *q) {
  tr_chunkq_entry *e;
  while ((e = tr_chunkq_pop(q)) != NULL)
    tr_chunkq_entry_free(e);
}

/* Commits every chunk of the SMB in batches. Returns the seconds spent committing. */
static double commit_all(tr_producer_shm *s, tr_chunkq *q, unsigned layout) {
  Perfetto__Protos__CommitDataRequest__ChunksToMove moves[BATCH], *ptrs[BATCH];
  unsigned n = tr_smb_layout_chunks(layout);
  size_t total = s->smb.num_pages * n, done = 0;
  double t = 0;
  while (done < total) {
    size_t k = 0;
    for (; k < BATCH && done + k < total; k++) {
      perfetto__protos__commit_data_request__chunks_to_move__init(&moves[k]);
      moves[k].has_page = moves[k].has_chunk = moves[k].has_target_buffer = 1;
      moves[k].page = (uint32_t)((done + k) / n);
      moves[k].chunk = (uint32_t)((done + k) % n);
      moves[k].target_buffer = 1;
      ptrs[k] = &moves[k];
    }
    Perfetto__Protos__CommitDataRequest req = PERFETTO__PROTOS__COMMIT_DATA_REQUEST__INIT;
    req.n_chunks_to_move = k;
    req.chunks_to_move = ptrs;
    tr_producer_commit_result res;
    double t0 = now_s();
    tr_producer_shm_commit(s, q, &req, &res);
    t += now_s() - t0;
    if (res.violations || res.queued != k)
      abort();
    done += k;
  }
  return t;
}

/* The same bytes (each chunk's used payload) with memcpy into fresh buffers. */
static double memcpy_all(const tr_smb *smb, unsigned layout, size_t used_per_chunk) {
  unsigned n = tr_smb_layout_chunks(layout);
  size_t csize = tr_smb_chunk_size(smb->page_size, layout);
  double t = 0;
  for (size_t page = 0; page < smb->num_pages; page++) {
    uint8_t *dst[TR_SMB_MAX_CHUNKS];
    double t0 = now_s();
    for (unsigned c = 0; c < n; c++) {
      dst[c] = malloc(used_per_chunk);
      const uint8_t *src = smb->base + page * smb->page_size + TR_SMB_PAGE_HEADER_SIZE +
                           c * csize + TR_CHUNK_HEADER_SIZE;
      memcpy(dst[c], src, used_per_chunk);
    }
    t += now_s() - t0;
    for (unsigned c = 0; c < n; c++)
      free(dst[c]);
  }
  return t;
}

int main(int argc, char **argv) {
  long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 200;
  if (argc > 2 || rounds <= 0 || rounds > 1000000) {
    fprintf(stderr, "usage: bench_smb_drain [rounds, default 200]\n");
    return 2;
  }
  static const layout_case cases[] = {
      {"4 KiB pages, 1 chunk (SDK default)", 4096, TR_SMB_LAYOUT_DIV1},
      {"4 KiB pages, 14 chunks", 4096, TR_SMB_LAYOUT_DIV14},
      {"32 KiB pages, 1 chunk", 32768, TR_SMB_LAYOUT_DIV1},
  };
  printf("SMB drain: %u MiB SMB per round, %ld rounds, CommitData batches of %d chunks\n",
         SMB_SIZE >> 20, rounds, BATCH);
  printf("%-36s %10s %12s %12s %8s\n", "layout", "MB/s", "chunks/s", "memcpy MB/s", "ratio");
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const layout_case *lc = &cases[i];
    tr_smb smb;
    int rc = tr_smb_create(&smb, (tr_smb_geometry){SMB_SIZE, lc->page_size});
    if (rc < 0) {
      fprintf(stderr, "bench_smb_drain: cannot create the SMB: %s\n", tr_strerror(rc));
      return 1;
    }
    tr_producer_shm s;
    tr_producer_shm_init(&s, 1, 0, 0);
    if (tr_producer_shm_set_smb(&s, &smb) < 0 || tr_producer_shm_add_buffer(&s, 1) < 0 ||
        tr_producer_shm_register_writer(&s, 1, 1) < 0)
      abort();
    tr_chunkq q;
    tr_chunkq_init(&q, 2 * (size_t)SMB_SIZE);
    uint32_t chunk_id = 0;
    size_t chunks = smb.num_pages * tr_smb_layout_chunks(lc->layout);
    double t_port = 0, t_copy = 0;
    size_t bytes = 0;
    for (long r = 0; r < rounds; r++) {
      size_t used = fill(&s.smb, lc->layout, &chunk_id);
      t_copy += memcpy_all(&s.smb, lc->layout, used / chunks);
      t_port += commit_all(&s, &q, lc->layout);
      drain(&q);
      bytes += used;
    }
    double mb = (double)bytes / 1e6;
    printf("%-36s %10.1f %12.0f %12.1f %8.2f\n", lc->name, mb / t_port,
           (double)chunks * (double)rounds / t_port, mb / t_copy, (mb / t_port) / (mb / t_copy));
    tr_chunkq_free(&q);
    tr_producer_shm_free(&s);
  }
  printf("ratio = producer port MB/s / memcpy MB/s (1.00 = as fast as a bare copy)\n");
  return 0;
}
