/* test_chunk.c: chunk header and fragment parsing (relay/trace/chunk.h), first on hand-built
 * payloads for every rule, then on the real SDK-written chunks of the producer-emulated
 * captures, checked against their chunks.json tables and against the trace traced wrote. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/common/commit_data_request.pb-c.h"
#include "relay/trace/chunk.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"

/* ---- hand-built payloads ---- */

static void test_header_decode(void **state) {
  (void)state;
  const uint8_t raw[8] = {0x78, 0x56, 0x34, 0x12, 0x01, 0x00, 0x05, 0x1c};
  tr_chunk_header h;
  assert_int_equal(tr_chunk_header_decode(raw, 8, &h), 0);
  assert_int_equal(h.chunk_id, 0x12345678);
  assert_int_equal(h.writer_id, 1);
  assert_int_equal(h.count, 0x005); /* 0x1c05: count bits 0-9 = 5 */
  assert_int_equal(h.flags, 0x07);  /* bits 10-12 */
  assert_int_equal(tr_chunk_header_decode(raw, 7, &h), TR_ERR_INVAL);

  uint8_t out[8];
  tr_chunk_header_encode(&h, out);
  assert_memory_equal(out, raw, 8);

  h = (tr_chunk_header){.chunk_id = 9, .writer_id = 0, .count = 1};
  tr_chunk_header_encode(&h, out);
  assert_int_equal(tr_chunk_header_decode(out, 8, &h), TR_ERR_PROTO);
  h.writer_id = 32768;
  tr_chunk_header_encode(&h, out);
  assert_int_equal(tr_chunk_header_decode(out, 8, &h), TR_ERR_PROTO);
  h.writer_id = 32767;
  h.count = 1023;
  h.flags = 0x3f;
  tr_chunk_header_encode(&h, out);
  assert_int_equal(tr_chunk_header_decode(out, 8, &h), 0);
  assert_int_equal(h.count, 1023);
  assert_int_equal(h.flags, 0x3f);
}

static void test_minimal_varints_and_empty_packet(void **state) {
  (void)state;
  const uint8_t p[] = {3, 'a', 'b', 'c', 0, 1, 'x'};
  tr_chunk_iter it;
  tr_chunk_fragment f;
  tr_chunk_iter_init(&it, p, sizeof(p), 3, 0);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_int_equal(f.len, 3);
  assert_memory_equal(f.data, "abc", 3);
  assert_false(f.continues_from_prev);
  assert_false(f.continues_in_next);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_int_equal(f.len, 0); /* an empty packet */
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_int_equal(f.len, 1);
  assert_int_equal(f.data[0], 'x');
  assert_int_equal(tr_chunk_iter_next(&it, &f), 0);
  assert_int_equal(it.redundant_varints, 0);

  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, sizeof(p), 3, &info), 0);
  assert_int_equal(info.fragments, 3);
  assert_int_equal(info.used, 7);
  assert_false(info.packet_dropped);
  assert_false(info.abi_violation);

  assert_int_equal(tr_chunk_parse(p, sizeof(p), 0, &info), 0);
  assert_int_equal(info.fragments, 0);
  assert_int_equal(info.used, 0);
}

static void test_padded_varints(void **state) {
  (void)state;
  /* 4-byte (as the SDK back-fills) and 2-byte padded forms, then a minimal 2-byte one. */
  uint8_t p[4 + 3 + 2 + 1 + 2 + 200];
  size_t n = 0;
  memcpy(p + n, "\x83\x80\x80\x00" "abc", 7);
  n += 7;
  memcpy(p + n, "\x81\x00" "z", 3);
  n += 3;
  p[n++] = 0xc8; /* 200 = 0xc8 0x01 */
  p[n++] = 0x01;
  memset(p + n, 'q', 200);
  n += 200;
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, n, 3, &info), 0);
  assert_int_equal(info.fragments, 3);
  assert_int_equal(info.redundant_varints, 2);
  assert_int_equal(info.used, n);
}

static void test_five_byte_varint_refused(void **state) {
  (void)state;
  const uint8_t p[] = {1, 'a', 0x81, 0x80, 0x80, 0x80, 0x00, 'b'};
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, sizeof(p), 2, &info), TR_ERR_PROTO);
  assert_true(info.abi_violation);
  assert_int_equal(info.fragments, 1); /* the good prefix survives */
  assert_int_equal(info.used, 2);
  /* A varint cut by the payload end is refused too. */
  const uint8_t q[] = {1, 'a', 0x81};
  assert_int_equal(tr_chunk_parse(q, sizeof(q), 2, &info), TR_ERR_PROTO);
  assert_int_equal(info.used, 2);
}

static void test_size_past_end(void **state) {
  (void)state;
  const uint8_t p[] = {2, 'a', 'b', 5, 'c', 'd', 'e'};
  tr_chunk_iter it;
  tr_chunk_fragment f;
  tr_chunk_iter_init(&it, p, sizeof(p), 2, 0);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_int_equal(tr_chunk_iter_next(&it, &f), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_iter_next(&it, &f), TR_ERR_PROTO); /* sticky */
  assert_int_equal(it.off, 3);
  /* Exactly to the end is fine. */
  const uint8_t q[] = {2, 'a', 'b', 3, 'c', 'd', 'e'};
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(q, sizeof(q), 2, &info), 0);
  assert_int_equal(info.used, sizeof(q));
  /* More fragments announced than the payload holds. */
  assert_int_equal(tr_chunk_parse(q, sizeof(q), 3, &info), TR_ERR_PROTO);
  assert_int_equal(info.fragments, 2);
}

static void test_stale_tail_is_not_read(void **state) {
  (void)state;
  /* count 1: the bytes after the first fragment are stale and would be a violation. */
  const uint8_t p[] = {1, 'a', 0xff, 0xff, 0xff, 0xff, 0xff};
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, sizeof(p), 1, &info), 0);
  assert_int_equal(info.used, 2);
}

static void test_drop_packet_marker(void **state) {
  (void)state;
  const uint8_t p[] = {1, 'a', 0xff, 0xff, 0xff, 0x7f, 9, 9};
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, sizeof(p), 2, &info), 0);
  assert_true(info.packet_dropped);
  assert_false(info.abi_violation);
  assert_int_equal(info.fragments, 1);
  assert_int_equal(info.used, 6);
  /* Anywhere but last it is a size past the end. */
  assert_int_equal(tr_chunk_parse(p, sizeof(p), 3, &info), TR_ERR_PROTO);
  assert_false(info.packet_dropped);
  assert_int_equal(info.fragments, 1);
  /* Alone in a chunk (what a writer that could not get a chunk leaves). */
  assert_int_equal(tr_chunk_parse(p + 2, 4, 1, &info), 0);
  assert_true(info.packet_dropped);
  assert_int_equal(info.fragments, 0);
}

static void test_continuation_flags(void **state) {
  (void)state;
  const uint8_t p[] = {1, 'a', 1, 'b', 1, 'c'};
  tr_chunk_iter it;
  tr_chunk_fragment f;
  tr_chunk_iter_init(&it, p, sizeof(p), 3, TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_LAST_CONTINUES);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_true(f.continues_from_prev);
  assert_false(f.continues_in_next);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_false(f.continues_from_prev);
  assert_false(f.continues_in_next);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_false(f.continues_from_prev);
  assert_true(f.continues_in_next);
  /* One fragment that is the middle of a big packet carries both. */
  tr_chunk_iter_init(&it, p, sizeof(p), 1, TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_LAST_CONTINUES);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 1);
  assert_true(f.continues_from_prev);
  assert_true(f.continues_in_next);
  assert_int_equal(tr_chunk_iter_next(&it, &f), 0);
}

static void test_patch_bounds(void **state) {
  (void)state;
  uint8_t p[10] = {0};
  const uint8_t d[5] = {1, 2, 3, 4, 5};
  assert_int_equal(tr_chunk_apply_patch(p, 10, 6, d, 4), 0);
  assert_memory_equal(p + 6, d, 4);
  assert_int_equal(tr_chunk_apply_patch(p, 10, 0, d, 4), 0);
  assert_int_equal(tr_chunk_apply_patch(p, 10, 7, d, 4), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_apply_patch(p, 10, UINT32_MAX, d, 4), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_apply_patch(p, 10, 0, d, 3), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_apply_patch(p, 10, 0, d, 5), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_apply_patch(p, 3, 0, d, 4), TR_ERR_PROTO);
  assert_int_equal(tr_chunk_apply_patch(p, 4, 0, d, 4), 0);
}

static void test_scrape_rule(void **state) {
  (void)state;
  tr_chunk_header h = {.chunk_id = 4, .writer_id = 2, .count = 1, .flags = 7};
  assert_int_equal(tr_chunk_scrape_rule(&h), 0);
  h.count = 0;
  assert_int_equal(tr_chunk_scrape_rule(&h), 0);
  h.count = 3;
  assert_int_equal(tr_chunk_scrape_rule(&h), 1);
  assert_int_equal(h.count, 2);
  assert_int_equal(h.flags, TR_CHUNK_FIRST_CONTINUES);
  /* The unfinished last fragment is then never read. */
  const uint8_t p[] = {1, 'a', 1, 'b', 0x7f, 'c'};
  tr_chunk_info info;
  assert_int_equal(tr_chunk_parse(p, sizeof(p), h.count, &info), 0);
  assert_int_equal(info.used, 4);
}

/* What a lost chunk loses: the packets a reader would have taken from it, and no more
 * (issue 24 item 2: the agent counted a dropped chunk's drop marker as a lost packet, so a
 * Release run under overload counted 41 more packets lost than were written). */
static void test_packets_begun(void **state) {
  (void)state;
  const uint8_t whole[] = {3, 'a', 'b', 'c', 1, 'x'};
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 2, 0, false), 2);
  /* The leading continuation's packet began in the chunk before. */
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 2, TR_CHUNK_FIRST_CONTINUES,
                                          false), 1);
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 1,
                                          TR_CHUNK_FIRST_CONTINUES | TR_CHUNK_LAST_CONTINUES,
                                          false), 0);
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 2, TR_CHUNK_LAST_CONTINUES,
                                          false), 2);
  assert_int_equal(tr_chunk_packets_begun(whole, 0, 0, TR_CHUNK_FIRST_CONTINUES, false), 0);
  /* The writer's drop marker ends a packet it abandoned (and counted as dropped itself). */
  const uint8_t dropped[] = {3, 'a', 'b', 'c', 0xff, 0xff, 0xff, 0x7f};
  assert_int_equal(tr_chunk_packets_begun(dropped, sizeof(dropped), 2, 0, false), 1);
  assert_int_equal(tr_chunk_packets_begun(dropped, sizeof(dropped), 2,
                                          TR_CHUNK_FIRST_CONTINUES, false), 0);
  assert_int_equal(tr_chunk_packets_begun(dropped + 4, 4, 1, 0, false), 0);
  assert_int_equal(tr_chunk_packets_begun(dropped + 4, 4, 1, TR_CHUNK_FIRST_CONTINUES, false),
                   0);
  /* An empty fragment is an empty packet, which no reader emits. */
  const uint8_t empty_last[] = {3, 'a', 'b', 'c', 0};
  assert_int_equal(tr_chunk_packets_begun(empty_last, sizeof(empty_last), 2, 0, false), 1);
  /* Still to be patched: the last size is a placeholder, but that fragment begins a packet. */
  const uint8_t unpatched[] = {3, 'a', 'b', 'c', 0x80, 0x80, 0x80, 0x00, 'x', 'y'};
  const uint8_t patch_flags = TR_CHUNK_LAST_CONTINUES | TR_CHUNK_NEEDS_PATCHING;
  assert_int_equal(tr_chunk_packets_begun(unpatched, sizeof(unpatched), 2, patch_flags, false),
                   2);
  assert_int_equal(tr_chunk_packets_begun(unpatched + 4, 6, 1, patch_flags, false), 1);
  assert_int_equal(tr_chunk_packets_begun(unpatched + 4, 6, 1,
                                          patch_flags | TR_CHUNK_FIRST_CONTINUES, false), 0);
  /* Incomplete: the last counted fragment may be unfinished and is not read. */
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 2, 0, true), 1);
  assert_int_equal(tr_chunk_packets_begun(whole, sizeof(whole), 1, 0, true), 0);
  assert_int_equal(tr_chunk_packets_begun(unpatched, sizeof(unpatched), 2, patch_flags, true),
                   1);
  /* A size past the end: only what parsed before it. */
  const uint8_t broken[] = {1, 'a', 9, 'b'};
  assert_int_equal(tr_chunk_packets_begun(broken, sizeof(broken), 2, 0, false), 1);
  assert_int_equal(tr_chunk_packets_begun(broken, sizeof(broken), 3, patch_flags, false), 1);
}

/* ---- real captures ---- */

static uint8_t *load(const char *name, size_t *len) {
  char path[512];
  snprintf(path, sizeof(path), "%s/%s", TR_VECTORS_DIR, name);
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  assert_int_equal(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  assert_true(n >= 0);
  rewind(f);
  uint8_t *buf = malloc((size_t)n + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = 0;
  fclose(f);
  *len = (size_t)n;
  return buf;
}

typedef void (*frame_fn)(Perfetto__Protos__IPCFrame *frame, void *ctx);

/* Feeds a whole .bin stream through the IPC frame reader. */
static void for_each_frame(const char *name, frame_fn fn, void *ctx) {
  size_t len, off = 0;
  uint8_t *bytes = load(name, &len);
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  for (;;) {
    int pushed = 0;
    if (off < len) {
      pushed = tr_frame_reader_push(&r, bytes + off, len - off);
      assert_true(pushed >= 0);
      off += (size_t)pushed;
    }
    const uint8_t *payload;
    size_t plen;
    int rc, frames = 0;
    while ((rc = tr_frame_reader_next(&r, &payload, &plen)) == 1) {
      Perfetto__Protos__IPCFrame *frame = tr_ipc_frame_decode(payload, plen);
      assert_non_null(frame);
      fn(frame, ctx);
      tr_ipc_frame_free(frame);
      frames++;
    }
    assert_int_equal(rc, 0);
    if (frames == 0 && pushed == 0)
      break;
  }
  assert_int_equal(off, len);
  tr_frame_reader_free(&r);
  free(bytes);
}

static void find_commit_method(Perfetto__Protos__IPCFrame *frame, void *ctx) {
  uint32_t *id = ctx;
  if (frame->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE_REPLY)
    return;
  Perfetto__Protos__IPCFrame__BindServiceReply *r = frame->msg_bind_service_reply;
  for (size_t i = 0; i < r->n_methods; i++)
    if (r->methods[i]->name && strcmp(r->methods[i]->name, "CommitData") == 0)
      *id = r->methods[i]->id;
}

#define MAX_CHUNKS 64

typedef struct capture {
  uint32_t commit_method;
  size_t n;
  uint8_t *chunk[MAX_CHUNKS]; /* whole chunk, header included */
  size_t len[MAX_CHUNKS];
  uint32_t page[MAX_CHUNKS], target_buffer[MAX_CHUNKS];
  bool incomplete[MAX_CHUNKS];
  size_t patches;
  size_t flush_acks;
} capture;

static uint8_t *find_chunk(capture *c, uint32_t target_buffer, uint32_t writer, uint32_t id,
                           size_t *len) {
  for (size_t i = 0; i < c->n; i++) {
    tr_chunk_header h;
    assert_int_equal(tr_chunk_header_decode(c->chunk[i], c->len[i], &h), 0);
    if (c->target_buffer[i] == target_buffer && h.writer_id == writer && h.chunk_id == id) {
      *len = c->len[i];
      return c->chunk[i];
    }
  }
  return NULL;
}

/* Collects chunks in commit order and applies each patch as it arrives: a patch always
 * targets a chunk of the same or an earlier frame. */
static void collect_commit(Perfetto__Protos__IPCFrame *frame, void *ctx) {
  capture *c = ctx;
  if (frame->msg_case != PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD ||
      frame->msg_invoke_method->method_id != c->commit_method)
    return;
  ProtobufCBinaryData args = frame->msg_invoke_method->args_proto;
  Perfetto__Protos__CommitDataRequest *req =
      perfetto__protos__commit_data_request__unpack(NULL, args.len, args.data);
  assert_non_null(req);
  for (size_t i = 0; i < req->n_chunks_to_move; i++) {
    Perfetto__Protos__CommitDataRequest__ChunksToMove *m = req->chunks_to_move[i];
    assert_true(m->has_data);
    assert_true(c->n < MAX_CHUNKS);
    c->chunk[c->n] = malloc(m->data.len);
    assert_non_null(c->chunk[c->n]);
    memcpy(c->chunk[c->n], m->data.data, m->data.len);
    c->len[c->n] = m->data.len;
    c->page[c->n] = m->page;
    c->target_buffer[c->n] = m->target_buffer;
    c->incomplete[c->n] = m->chunk_incomplete;
    c->n++;
  }
  for (size_t i = 0; i < req->n_chunks_to_patch; i++) {
    Perfetto__Protos__CommitDataRequest__ChunkToPatch *p = req->chunks_to_patch[i];
    size_t len = 0;
    uint8_t *chunk = find_chunk(c, p->target_buffer, p->writer_id, p->chunk_id, &len);
    assert_non_null(chunk);
    for (size_t j = 0; j < p->n_patches; j++) {
      Perfetto__Protos__CommitDataRequest__ChunkToPatch__Patch *pa = p->patches[j];
      uint8_t *payload = chunk + TR_CHUNK_HEADER_SIZE;
      size_t payload_len = len - TR_CHUNK_HEADER_SIZE;
      /* The SDK leaves the bytes to patch zeroed. */
      assert_true(pa->offset + 4 <= payload_len);
      assert_memory_equal(payload + pa->offset, "\0\0\0\0", 4);
      assert_int_equal(
          tr_chunk_apply_patch(payload, payload_len, pa->offset, pa->data.data, pa->data.len), 0);
      assert_memory_equal(payload + pa->offset, pa->data.data, 4);
      c->patches++;
    }
  }
  if (req->has_flush_request_id)
    c->flush_acks++;
  perfetto__protos__commit_data_request__free_unpacked(req, NULL);
}

/* The value of "key": in one flat JSON object [obj, end); -1 if absent. false/true = 0/1. */
static long long json_field(const char *obj, const char *end, const char *key) {
  char pat[64];
  snprintf(pat, sizeof(pat), "\"%s\":", key);
  const char *p = strstr(obj, pat);
  if (!p || p >= end)
    return -1;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  if (strncmp(p, "true", 4) == 0)
    return 1;
  if (strncmp(p, "false", 5) == 0)
    return 0;
  return strtoll(p, NULL, 10);
}

/* Appends bytes to a growing packet buffer. */
typedef struct bytes {
  uint8_t *p;
  size_t len, cap;
} bytes;

static void bytes_append(bytes *b, const uint8_t *data, size_t len) {
  if (len == 0)
    return;
  if (b->len + len > b->cap) {
    b->cap = (b->len + len) * 2;
    b->p = realloc(b->p, b->cap);
    assert_non_null(b->p);
  }
  memcpy(b->p + b->len, data, len);
  b->len += len;
}

/* Reads a protobuf varint (test-side helper for walking the trace file). */
static uint64_t pb_varint(const uint8_t *p, size_t len, size_t *off) {
  uint64_t v = 0;
  for (unsigned shift = 0; *off < len && shift < 64; shift += 7) {
    uint8_t b = p[(*off)++];
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80))
      return v;
  }
  fail_msg("bad varint in trace");
  return 0;
}

/* Every reassembled producer packet must be a byte prefix of the next matching packet of the
 * trace traced wrote from this session (traced appends its trusted fields). */
static void check_against_trace(const char *trace_name, bytes *packets, size_t n_packets) {
  size_t len, off = 0, k = 0;
  uint8_t *t = load(trace_name, &len);
  while (off < len && k < n_packets) {
    uint64_t tag = pb_varint(t, len, &off);
    assert_int_equal(tag, 0x0a); /* Trace.packet, length-delimited */
    uint64_t plen = pb_varint(t, len, &off);
    assert_true(plen <= len - off);
    bytes *want = &packets[k];
    if (want->len <= plen && memcmp(t + off, want->p, want->len) == 0)
      k++;
    off += plen;
  }
  assert_int_equal(k, n_packets);
  free(t);
}

static void check_capture(const char *prefix, size_t want_chunks, size_t want_fragments,
                          size_t want_packets, size_t want_empty, size_t want_patches,
                          const char *trace) {
  char name[256];
  capture *c = calloc(1, sizeof(*c));
  assert_non_null(c);
  snprintf(name, sizeof(name), "ipc/%s.to-producer.bin", prefix);
  for_each_frame(name, find_commit_method, &c->commit_method);
  assert_int_equal(c->commit_method, 4);
  snprintf(name, sizeof(name), "ipc/%s.to-service.bin", prefix);
  for_each_frame(name, collect_commit, c);
  assert_int_equal(c->n, want_chunks);
  assert_int_equal(c->patches, want_patches);

  size_t json_len;
  snprintf(name, sizeof(name), "ipc/%s.chunks.json", prefix);
  char *json = (char *)load(name, &json_len);
  const char *obj = json;
  size_t fragments = 0, objects = 0, n_packets = 0, empty_packets = 0;
  bytes *packets = calloc(want_packets + 1, sizeof(bytes));
  bytes partial = {0};
  bool in_packet = false;
  assert_non_null(packets);
  for (size_t i = 0; i < c->n; i++, objects++) {
    obj = strchr(obj, '{');
    assert_non_null(obj);
    const char *end = strchr(obj, '}');
    assert_non_null(end);

    tr_chunk_header h;
    assert_int_equal(tr_chunk_header_decode(c->chunk[i], c->len[i], &h), 0);
    const uint8_t *payload = c->chunk[i] + TR_CHUNK_HEADER_SIZE;
    size_t payload_len = c->len[i] - TR_CHUNK_HEADER_SIZE;
    tr_chunk_info info;
    assert_int_equal(tr_chunk_parse(payload, payload_len, h.count, &info), 0);

    assert_int_equal(json_field(obj, end, "page"), c->page[i]);
    assert_int_equal(json_field(obj, end, "target_buffer"), c->target_buffer[i]);
    assert_int_equal(json_field(obj, end, "incomplete"), c->incomplete[i]);
    assert_int_equal(json_field(obj, end, "size"), c->len[i]);
    assert_int_equal(json_field(obj, end, "writer_id"), h.writer_id);
    assert_int_equal(json_field(obj, end, "chunk_id"), h.chunk_id);
    assert_int_equal(json_field(obj, end, "fragments"), h.count);
    assert_int_equal(json_field(obj, end, "flags"), h.flags);
    assert_int_equal(info.fragments, h.count);
    assert_false(info.packet_dropped);
    /* "used" counts from the chunk start. */
    assert_int_equal(json_field(obj, end, "used"), TR_CHUNK_HEADER_SIZE + info.used);
    assert_int_equal(json_field(obj, end, "redundant_varints"), info.redundant_varints);
    fragments += info.fragments;

    /* Reassemble packets across chunks the way a reader of the central buffer does. */
    tr_chunk_iter it;
    tr_chunk_fragment f;
    int rc;
    tr_chunk_iter_init(&it, payload, payload_len, h.count, h.flags);
    while ((rc = tr_chunk_iter_next(&it, &f)) == 1) {
      assert_true(f.continues_from_prev == in_packet);
      bytes_append(&partial, f.data, f.len);
      in_packet = f.continues_in_next;
      if (in_packet)
        continue;
      if (partial.len == 0) {
        empty_packets++;
        continue; /* an empty packet: readers skip it */
      }
      assert_true(n_packets < want_packets);
      packets[n_packets++] = partial;
      partial = (bytes){0};
    }
    assert_int_equal(rc, 0);
    obj = end;
  }
  assert_null(strchr(obj, '{')); /* as many objects as chunks */
  assert_false(in_packet);
  assert_int_equal(fragments, want_fragments);
  assert_int_equal(n_packets, want_packets);
  assert_int_equal(empty_packets, want_empty);
  if (trace)
    check_against_trace(trace, packets, n_packets);

  for (size_t i = 0; i < n_packets; i++)
    free(packets[i].p);
  free(packets);
  free(partial.p);
  free(json);
  for (size_t i = 0; i < c->n; i++)
    free(c->chunk[i]);
  free(c);
}

static void test_real_chunks_producer_emulated(void **state) {
  (void)state;
  /* 6044 fragments = 6014 packets + 15 joins across chunks + 15 empty packets. */
  check_capture("producer-emulated", 30, 6044, 6014, 15, 16, "traces/relay-emulated.pftrace");
}

static void test_real_chunks_producer_emulated_n50(void **state) {
  (void)state;
  /* No trace of this session was kept. */
  check_capture("producer-emulated-n50", 10, 106 + 9 * 102, 1014, 10, 0, NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_header_decode),
      cmocka_unit_test(test_minimal_varints_and_empty_packet),
      cmocka_unit_test(test_padded_varints),
      cmocka_unit_test(test_five_byte_varint_refused),
      cmocka_unit_test(test_size_past_end),
      cmocka_unit_test(test_stale_tail_is_not_read),
      cmocka_unit_test(test_drop_packet_marker),
      cmocka_unit_test(test_continuation_flags),
      cmocka_unit_test(test_patch_bounds),
      cmocka_unit_test(test_scrape_rule),
      cmocka_unit_test(test_packets_begun),
      cmocka_unit_test(test_real_chunks_producer_emulated),
      cmocka_unit_test(test_real_chunks_producer_emulated_n50),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
