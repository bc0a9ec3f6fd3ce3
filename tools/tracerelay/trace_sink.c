/* trace_sink.c: slice reassembly and packet records for `tracerelay record`.
 *
 * A packet that arrives in one slice (the usual case) is written straight from the reply's
 * buffer with writev; only packets split over slices are copied. */
#include "tools/tracerelay/trace_sink.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "relay/base/tr_error.h"

void trace_sink_init(trace_sink *s, int fd) {
  memset(s, 0, sizeof *s);
  s->fd = fd;
}

void trace_sink_free(trace_sink *s) {
  free(s->pending);
  s->pending = NULL;
  s->pending_len = s->pending_cap = 0;
}

/* writev until everything is out (regular files may still write short). */
static int write_all(int fd, struct iovec *iov, int n) {
  while (n > 0) {
    ssize_t w = writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return TR_ERR_SYS(errno);
    }
    for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--)
      w -= (ssize_t)iov->iov_len;
    if (n > 0) {
      iov->iov_base = (uint8_t *)iov->iov_base + w;
      iov->iov_len -= (size_t)w;
    }
  }
  return 0;
}

static int write_packet(trace_sink *s, const uint8_t *data, size_t len) {
  uint8_t header[11];
  size_t h = 0;
  header[h++] = 0x0a; /* Trace.packet, field 1, length-delimited */
  uint64_t v = len;
  do {
    header[h++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  struct iovec iov[2] = {{header, h}, {(void *)data, len}};
  int rc = write_all(s->fd, iov, 2);
  if (rc < 0)
    return rc;
  s->bytes += h + len;
  s->packets++;
  return 0;
}

int trace_sink_add(trace_sink *s, const uint8_t *data, size_t len, bool last) {
  if (last && s->pending_len == 0)
    return write_packet(s, data, len);
  if (len > TRACE_SINK_MAX_PACKET - s->pending_len)
    return TR_ERR_TOO_BIG;
  if (s->pending_len + len > s->pending_cap) {
    size_t cap = s->pending_cap ? s->pending_cap : 4096;
    while (cap < s->pending_len + len)
      cap *= 2;
    uint8_t *grown = realloc(s->pending, cap);
    if (!grown)
      return TR_ERR_NOMEM;
    s->pending = grown;
    s->pending_cap = cap;
  }
  if (len)
    memcpy(s->pending + s->pending_len, data, len);
  s->pending_len += len;
  if (!last)
    return 0;
  int rc = write_packet(s, s->pending, s->pending_len);
  s->pending_len = 0;
  return rc;
}
