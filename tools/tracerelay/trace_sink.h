/* trace_sink.h: turns ReadBuffers slices into a trace file: consecutive slices up to the one
 * flagged last_slice_for_packet form one packet, written as a `0x0A varint(len) packet` record
 * (reference 5.1), so the file is a valid Perfetto trace after every packet. */
#ifndef TRACERELAY_TRACE_SINK_H
#define TRACERELAY_TRACE_SINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRACE_SINK_MAX_PACKET (64u << 20) /* a service sending more for one packet is broken */

typedef struct trace_sink {
  int fd;
  uint8_t *pending; /* slices of the packet being reassembled */
  size_t pending_len;
  size_t pending_cap;
  uint64_t bytes;   /* written to fd, headers included */
  uint64_t packets;
} trace_sink;

void trace_sink_init(trace_sink *s, int fd);
/* Frees the pending packet; the fd is the caller's. */
void trace_sink_free(trace_sink *s);
/* Adds one slice; writes the packet when last is set. Returns 0, TR_ERR_TOO_BIG over
 * TRACE_SINK_MAX_PACKET, TR_ERR_NOMEM, or a write error. */
int trace_sink_add(trace_sink *s, const uint8_t *data, size_t len, bool last);

#endif
