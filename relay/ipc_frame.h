/* ipc_frame.h: Perfetto IPC framing (reference section 1.1): a uint32 little-endian payload
 * length, then a serialised IPCFrame. The decoder is bounded: a declared size over
 * TR_IPC_MAX_FRAME (header included) is an error and the connection must be dropped.
 * Pure code over memory: no sockets here. */
#ifndef TR_IPC_FRAME_H
#define TR_IPC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "perfetto/ipc/wire_protocol.pb-c.h"

#define TR_IPC_MAX_FRAME 131072u                /* kIPCBufferSize, header included */
#define TR_IPC_MAX_PAYLOAD (TR_IPC_MAX_FRAME - 4u)

/* Accumulates bytes from a stream and hands out whole frames. Owns a buffer that grows on
 * demand up to TR_IPC_MAX_FRAME bytes and never beyond. Bytes [start, len) are buffered. */
typedef struct tr_ipc_reader {
  uint8_t *buf;
  size_t start;
  size_t len;
  size_t cap;
} tr_ipc_reader;

void tr_ipc_reader_init(tr_ipc_reader *r);
void tr_ipc_reader_free(tr_ipc_reader *r);
/* Where the next recv() should write and how much room there is. Room is never 0 unless a
 * whole frame is waiting to be taken with tr_ipc_reader_next. Returns 0, TR_ERR_NOMEM, or
 * TR_ERR_TOO_BIG when the buffered header declares an oversize frame. */
int tr_ipc_reader_space(tr_ipc_reader *r, uint8_t **out, size_t *room);
/* Records that n bytes (n <= room) were written at the place tr_ipc_reader_space gave. */
void tr_ipc_reader_commit(tr_ipc_reader *r, size_t n);
/* Copies as many of the len bytes as fit and returns how many were taken (less than len
 * when whole frames must be taken with tr_ipc_reader_next first), or a negative error as
 * tr_ipc_reader_space. */
int tr_ipc_reader_push(tr_ipc_reader *r, const uint8_t *data, size_t len);
/* Takes the next whole frame. Returns 1 and sets *payload and *len (valid until the next call
 * on this reader) when a frame is ready, 0 when more bytes are needed, TR_ERR_TOO_BIG for
 * an oversize declared length. Zero-length frames are skipped, as Perfetto does. */
int tr_ipc_reader_next(tr_ipc_reader *r, const uint8_t **payload, size_t *len);

/* Decodes a payload into an IPCFrame (free with tr_ipc_frame_free); NULL if it does not parse. */
Perfetto__Protos__IPCFrame *tr_ipc_frame_decode(const uint8_t *payload, size_t len);
void tr_ipc_frame_free(Perfetto__Protos__IPCFrame *frame);
/* Serialises header + frame into a new malloc'd buffer; TR_ERR_TOO_BIG over the frame limit.
 * The layout is protozero's, so our frames are byte-identical to traced's: the nested `msg`
 * gets a 4-byte padded length varint when it is 128 bytes or longer. */
int tr_ipc_frame_encode(const Perfetto__Protos__IPCFrame *frame, uint8_t **out, size_t *out_len);

#endif
