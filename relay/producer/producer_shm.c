/* producer_shm.c: CommitData, patches, flush acks and scraping for one producer (reference
 * 4.4, 4.6, 4.7). See producer_shm.h for what is checked and why; the order of the checks
 * follows traced's commit handling. */
#include "relay/producer/producer_shm.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay/base/tr_error.h"

void tr_producer_shm_init(tr_producer_shm *s, uint32_t producer_id, uint32_t uid, int32_t pid) {
  memset(s, 0, sizeof(*s));
  s->producer_id = producer_id;
  s->uid = uid;
  s->pid = pid;
  s->smb.fd = -1;
}

void tr_producer_shm_free(tr_producer_shm *s) {
  if (s->has_smb)
    tr_smb_close(&s->smb);
  free(s->scratch);
  free(s->buffers);
  free(s->writers);
  s->has_smb = false;
  s->scratch = NULL;
  s->buffers = NULL;
  s->writers = NULL;
  s->num_buffers = s->cap_buffers = s->num_writers = s->cap_writers = 0;
}

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int tr_producer_shm_set_smb(tr_producer_shm *s, tr_smb *smb) {
  if (s->has_smb)
    return TR_ERR_STATE;
  s->scratch = malloc(smb->page_size);
  if (!s->scratch)
    return TR_ERR_NOMEM;
  s->smb = *smb;
  s->has_smb = true;
  s->last_commit_ns = monotonic_ns();
  return 0;
}

bool tr_producer_shm_has_buffer(const tr_producer_shm *s, uint32_t buffer) {
  for (size_t i = 0; i < s->num_buffers; i++)
    if (s->buffers[i] == buffer)
      return true;
  return false;
}

int tr_producer_shm_add_buffer(tr_producer_shm *s, uint32_t buffer) {
  if (tr_producer_shm_has_buffer(s, buffer))
    return 0;
  if (s->num_buffers == s->cap_buffers) {
    size_t cap = s->cap_buffers ? 2 * s->cap_buffers : 4;
    uint32_t *b = realloc(s->buffers, cap * sizeof(*b));
    if (!b)
      return TR_ERR_NOMEM;
    s->buffers = b;
    s->cap_buffers = cap;
  }
  s->buffers[s->num_buffers++] = buffer;
  return 0;
}

/* Index of the first writer with id >= `id`. */
static size_t writer_pos(const tr_producer_shm *s, uint32_t id) {
  size_t lo = 0, hi = s->num_writers;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->writers[mid].id < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static const tr_producer_writer *find_writer(const tr_producer_shm *s, uint32_t id) {
  size_t i = writer_pos(s, id);
  return i < s->num_writers && s->writers[i].id == id ? &s->writers[i] : NULL;
}

int tr_producer_shm_register_writer(tr_producer_shm *s, uint32_t writer_id, uint32_t buffer) {
  if (writer_id == 0 || writer_id > TR_CHUNK_MAX_WRITER_ID)
    return TR_ERR_PROTO;
  size_t i = writer_pos(s, writer_id);
  if (i < s->num_writers && s->writers[i].id == writer_id) {
    s->writers[i].target_buffer = buffer;
    return 0;
  }
  /* Distinct ids are at most 32767, so this table is bounded (256 KiB). */
  if (s->num_writers == s->cap_writers) {
    size_t cap = s->cap_writers ? 2 * s->cap_writers : 8;
    tr_producer_writer *w = realloc(s->writers, cap * sizeof(*w));
    if (!w)
      return TR_ERR_NOMEM;
    s->writers = w;
    s->cap_writers = cap;
  }
  memmove(&s->writers[i + 1], &s->writers[i], (s->num_writers - i) * sizeof(*s->writers));
  s->writers[i] = (tr_producer_writer){.id = (uint16_t)writer_id, .target_buffer = buffer};
  s->num_writers++;
  return 0;
}

int tr_producer_shm_unregister_writer(tr_producer_shm *s, uint32_t writer_id) {
  size_t i = writer_pos(s, writer_id);
  if (i >= s->num_writers || s->writers[i].id != writer_id)
    return TR_ERR_NOT_FOUND;
  memmove(&s->writers[i], &s->writers[i + 1], (s->num_writers - i - 1) * sizeof(*s->writers));
  s->num_writers--;
  return 0;
}

static void refuse(tr_producer_shm *s, tr_producer_commit_result *res, const char *why) {
  s->stats.abi_violations++;
  if (res->violations++ == 0)
    res->first_violation = why;
}

/* The buffer rule of reference 4.4: the producer was given the buffer and, if the writer
 * registered, it is that writer's buffer. NULL if allowed, else why not. */
static const char *check_buffer(const tr_producer_shm *s, uint16_t writer_id, uint32_t buffer) {
  if (!tr_producer_shm_has_buffer(s, buffer))
    return "target buffer not given to this producer";
  const tr_producer_writer *w = find_writer(s, writer_id);
  if (w && w->target_buffer != buffer)
    return "target buffer is not the writer's registered buffer";
  return NULL;
}

/* Queues one chunk copied out of the SMB or the request: `chunk` holds header and payload,
 * h is its decoded header. The payload is trimmed to its last counted fragment (the tail is
 * stale, 9b), except when sizes are still to be patched. A chunk whose fragments run past its
 * end is the producer's ABI violation, but it still goes whole, so the central buffer keeps
 * the good prefix and counts it as traced would. */
static int queue_chunk(tr_producer_shm *s, tr_chunkq *q, const uint8_t *chunk, size_t len,
                       const tr_chunk_header *h, uint32_t buffer, bool incomplete,
                       tr_producer_commit_result *res) {
  const uint8_t *payload = chunk + TR_CHUNK_HEADER_SIZE;
  size_t payload_len = len - TR_CHUNK_HEADER_SIZE;
  size_t used = payload_len;
  tr_chunk_header readable = *h;
  if (incomplete)
    tr_chunk_scrape_rule(&readable); /* only to know where the readable part ends */
  if (!(readable.flags & TR_CHUNK_NEEDS_PATCHING)) {
    tr_chunk_info info;
    if (tr_chunk_parse(payload, payload_len, readable.count, &info) == 0)
      used = info.used;
    else if (res)
      refuse(s, res, "chunk fragments run past its end (queued whole)");
  }
  tr_chunkq_chunk c = {.producer_id = s->producer_id,
                       .target_buffer = buffer,
                       .header = *h,
                       .incomplete = incomplete,
                       .trusted_uid = s->uid,
                       .trusted_pid = s->pid};
  int rc = tr_chunkq_push_chunk(q, &c, payload, payload_len, used);
  if (rc == 0)
    s->stats.bytes_moved += (h->flags & TR_CHUNK_NEEDS_PATCHING) ? payload_len : used;
  return rc;
}

/* One ChunksToMove with `data`: the whole chunk travels in the request (reference 4.7). */
static void move_emulated(tr_producer_shm *s, tr_chunkq *q,
                          const Perfetto__Protos__CommitDataRequest__ChunksToMove *m,
                          tr_producer_commit_result *res) {
  if (m->data.len < TR_CHUNK_HEADER_SIZE || m->data.len > TR_PRODUCER_MAX_EMULATED_CHUNK) {
    refuse(s, res, "emulated chunk data shorter than a header or over 65536 bytes");
    return;
  }
  tr_chunk_header h;
  if (tr_chunk_header_decode(m->data.data, m->data.len, &h) < 0) {
    refuse(s, res, "chunk writer id 0 or over 32767");
    return;
  }
  const char *why = check_buffer(s, h.writer_id, m->target_buffer);
  if (why) {
    refuse(s, res, why);
    return;
  }
  bool incomplete = m->has_chunk_incomplete && m->chunk_incomplete;
  if (queue_chunk(s, q, m->data.data, m->data.len, &h, m->target_buffer, incomplete, res) == 0) {
    s->stats.chunks_moved++;
    res->queued++;
  }
}

static const char *read_error(int rc) {
  switch (rc) {
  case TR_ERR_STATE: return "chunk is not Complete";
  case TR_ERR_AGAIN: return "page word kept changing under the read";
  case TR_ERR_PROTO: return "page changed under the read (layout or chunk state)";
  default: return "chunk could not be read";
  }
}

/* One ChunksToMove by page and chunk index in our SMB (reference 4.4). */
static void move_from_smb(tr_producer_shm *s, tr_chunkq *q,
                          const Perfetto__Protos__CommitDataRequest__ChunksToMove *m,
                          tr_producer_commit_result *res) {
  if (!s->has_smb) {
    refuse(s, res, "chunk moved before the SMB was set up");
    return;
  }
  uint32_t word;
  if (tr_smb_page_word(&s->smb, m->page, &word) < 0) {
    refuse(s, res, "page out of range");
    return;
  }
  if (m->chunk >= tr_smb_layout_chunks(tr_smb_word_layout(word))) {
    refuse(s, res, "chunk index not in the page's layout");
    return;
  }
  int n = tr_smb_read_chunk(&s->smb, m->page, m->chunk, s->scratch, s->smb.page_size);
  if (n < 0) {
    refuse(s, res, read_error(n));
    return;
  }
  /* The chunk is Free again in the SMB: from here on only the private copy is used. */
  tr_chunk_header h;
  if (tr_chunk_header_decode(s->scratch, (size_t)n, &h) < 0) {
    refuse(s, res, "chunk writer id 0 or over 32767");
    return;
  }
  const char *why = check_buffer(s, h.writer_id, m->target_buffer);
  if (why) {
    refuse(s, res, why);
    return;
  }
  if (queue_chunk(s, q, s->scratch, (size_t)n, &h, m->target_buffer, false, res) == 0) {
    s->stats.chunks_moved++;
    res->queued++;
  }
}

static const char *check_patch_entry(const tr_producer_shm *s,
                                     const Perfetto__Protos__CommitDataRequest__ChunkToPatch *e) {
  if (e->writer_id == 0 || e->writer_id > TR_CHUNK_MAX_WRITER_ID)
    return "patch for writer id 0 or over 32767";
  if (e->n_patches > TR_PRODUCER_MAX_PATCHES)
    return "more than 1024 patches in one entry";
  const char *why = check_buffer(s, (uint16_t)e->writer_id, e->target_buffer);
  if (why)
    return why;
  for (size_t i = 0; i < e->n_patches; i++) {
    const Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *p = e->patches[i];
    if (!p->has_data || p->data.len != TR_CHUNK_PATCH_SIZE)
      return "patch data not exactly 4 bytes";
    /* No chunk is longer than an emulated one; the central buffer checks the real size. */
    if (p->offset > TR_PRODUCER_MAX_EMULATED_CHUNK - TR_CHUNK_HEADER_SIZE - TR_CHUNK_PATCH_SIZE)
      return "patch offset past any chunk";
  }
  return NULL;
}

static void patch(tr_producer_shm *s, tr_chunkq *q,
                  const Perfetto__Protos__CommitDataRequest__ChunkToPatch *e,
                  tr_producer_commit_result *res) {
  const char *why = check_patch_entry(s, e);
  if (why) {
    refuse(s, res, why);
    return;
  }
  for (size_t i = 0; i < e->n_patches; i++) {
    tr_chunkq_patch p = {.producer_id = s->producer_id,
                         .target_buffer = e->target_buffer,
                         .chunk_id = e->chunk_id,
                         .writer_id = (uint16_t)e->writer_id,
                         .offset = e->patches[i]->offset,
                         .has_more = i + 1 < e->n_patches || e->has_more_patches};
    memcpy(p.data, e->patches[i]->data.data, TR_CHUNK_PATCH_SIZE);
    if (tr_chunkq_push_patch(q, &p) == 0) {
      s->stats.patches++;
      res->queued++;
    }
  }
}

int tr_producer_shm_commit(tr_producer_shm *s, tr_chunkq *q,
                           const Perfetto__Protos__CommitDataRequest *req,
                           tr_producer_commit_result *res) {
  memset(res, 0, sizeof(*res));
  /* Only this reader frees chunks, so an SMB full now was full since the producer last found
   * it so: whatever it wrote in between was dropped or waited. The commit before left it with
   * free chunks, so it was full for at most the time since then. */
  if (s->has_smb) {
    uint64_t now = monotonic_ns();
    if (!tr_smb_has_free_chunk(&s->smb)) {
      s->stats.smb_full++;
      s->stats.smb_full_ns += now - s->last_commit_ns;
    }
    s->last_commit_ns = now;
  }
  for (size_t i = 0; i < req->n_chunks_to_move; i++) {
    const Perfetto__Protos__CommitDataRequest__ChunksToMove *m = req->chunks_to_move[i];
    if (m->has_data)
      move_emulated(s, q, m, res);
    else
      move_from_smb(s, q, m, res);
  }
  for (size_t i = 0; i < req->n_chunks_to_patch; i++)
    patch(s, q, req->chunks_to_patch[i], res);
  if (req->has_flush_request_id) {
    res->flush_ack = true;
    res->flush_request_id = req->flush_request_id;
    s->stats.flush_acks++;
    if (tr_chunkq_push_flush_ack(q, s->producer_id, req->flush_request_id) == 0)
      res->queued++;
  }
  return 0;
}

static bool one_of(const uint32_t *set, size_t n, uint32_t v) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == v)
      return true;
  return false;
}

static void count_unscraped(tr_producer_shm *s, tr_chunkq *q, uint32_t buffer) {
  s->stats.exit_unscraped_chunks++;
  tr_chunkq_count_exit(q, s->producer_id, buffer, 1, 0);
}

/* One pass over the SMB's used chunks, queueing what the scraping rule allows. `only` NULL: a
 * flush or stop (every buffer given, nothing counted); else the producer's departure, for
 * only[0..n_only) and counting what cannot go (see tr_producer_shm_scrape_exit). */
static size_t scrape_pass(tr_producer_shm *s, tr_chunkq *q, const uint32_t *only, size_t n_only) {
  bool departure = only != NULL;
  size_t queued = 0;
  tr_smb_scrape_iter it;
  tr_smb_scraped sc;
  tr_smb_scrape_init(&it);
  while (tr_smb_scrape_next(&s->smb, &it, s->scratch, s->smb.page_size, &sc) == 1) {
    tr_chunk_header h, readable;
    /* A chunk being written may not have its header yet: not a violation, just nothing. The
     * decoder fills the count before it judges the writer id. */
    bool valid = tr_chunk_header_decode(s->scratch, sc.len, &h) == 0;
    const tr_producer_writer *w = valid ? find_writer(s, h.writer_id) : NULL;
    if (departure && h.count == 0)
      continue; /* taken, nothing begun in it yet: nothing to lose */
    if (departure && w == NULL)
      count_unscraped(s, q, 0);
    if (w == NULL || !(departure ? one_of(only, n_only, w->target_buffer)
                                 : tr_producer_shm_has_buffer(s, w->target_buffer)))
      continue;
    readable = h;
    if (!s->scraping || (!sc.complete && tr_chunk_scrape_rule(&readable) == 0)) {
      if (departure)
        count_unscraped(s, q, w->target_buffer);
      continue;
    }
    if (queue_chunk(s, q, s->scratch, sc.len, &h, w->target_buffer, !sc.complete, NULL) == 0) {
      s->stats.scraped_chunks++;
      queued++;
    }
  }
  return queued;
}

size_t tr_producer_shm_scrape(tr_producer_shm *s, tr_chunkq *q) {
  if (!s->scraping || !s->has_smb)
    return 0;
  return scrape_pass(s, q, NULL, 0);
}

size_t tr_producer_shm_scrape_exit(tr_producer_shm *s, tr_chunkq *q, const uint32_t *buffers,
                                   size_t num_buffers) {
  if (!s->has_smb || num_buffers == 0)
    return 0;
  return scrape_pass(s, q, buffers, num_buffers);
}
