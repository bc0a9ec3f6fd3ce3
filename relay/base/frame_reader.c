/* frame_reader.c: the bounded length-prefixed frame reader behind frame_reader.h. */
#include "relay/base/frame_reader.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

#define MIN_CAP 4096u

static uint32_t read_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void tr_frame_reader_init(tr_frame_reader *r, size_t max_payload, bool skip_empty) {
  memset(r, 0, sizeof *r);
  r->max_payload = max_payload;
  r->skip_empty = skip_empty;
}

void tr_frame_reader_free(tr_frame_reader *r) {
  free(r->buf);
  r->buf = NULL;
  r->start = r->len = r->cap = 0;
}

/* The bytes the buffer must hold for the frame at `start`: all of it once its header is in,
 * else the header. */
static int frame_need(const tr_frame_reader *r, size_t *need) {
  if (r->len - r->start < TR_FRAME_HEADER) {
    *need = TR_FRAME_HEADER;
    return 0;
  }
  uint32_t size = read_le32(r->buf + r->start);
  if (size > r->max_payload)
    return TR_ERR_TOO_BIG;
  *need = TR_FRAME_HEADER + size;
  return 0;
}

int tr_frame_reader_space(tr_frame_reader *r, uint8_t **out, size_t *room) {
  size_t need;
  int rc = frame_need(r, &need);
  if (rc < 0)
    return rc;
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->len - r->start);
    r->len -= r->start;
    r->start = 0;
  }
  if (r->cap < need) {
    size_t max_cap = TR_FRAME_HEADER + r->max_payload;
    size_t cap = r->cap * 2 > need ? r->cap * 2 : need;
    if (cap < MIN_CAP)
      cap = MIN_CAP;
    if (cap > max_cap)
      cap = max_cap;
    uint8_t *buf = realloc(r->buf, cap);
    if (!buf)
      return TR_ERR_NOMEM;
    r->buf = buf;
    r->cap = cap;
  }
  *out = r->buf + r->len;
  *room = r->cap - r->len;
  return 0;
}

void tr_frame_reader_commit(tr_frame_reader *r, size_t n) { r->len += n; }

int tr_frame_reader_push(tr_frame_reader *r, const uint8_t *data, size_t len) {
  uint8_t *dst;
  size_t room;
  int rc = tr_frame_reader_space(r, &dst, &room);
  if (rc < 0)
    return rc;
  size_t n = len < room ? len : room;
  if (n > INT32_MAX)
    n = INT32_MAX;
  if (n > 0)
    memcpy(dst, data, n);
  tr_frame_reader_commit(r, n);
  return (int)n;
}

int tr_frame_reader_next(tr_frame_reader *r, const uint8_t **payload, size_t *len) {
  for (;;) {
    size_t avail = r->len - r->start;
    if (avail < TR_FRAME_HEADER)
      return 0;
    uint32_t size = read_le32(r->buf + r->start);
    if (size > r->max_payload)
      return TR_ERR_TOO_BIG;
    if (avail - TR_FRAME_HEADER < size)
      return 0;
    r->start += TR_FRAME_HEADER + size;
    if (size == 0 && r->skip_empty)
      continue;
    *payload = r->buf + r->start - size;
    *len = size;
    return 1;
  }
}
