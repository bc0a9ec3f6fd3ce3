/* frame_reader.h: a bounded reader for streams of length-prefixed frames (a uint32
 * little-endian payload length, then the payload), shared by Perfetto's IPC framing
 * (ipc_frame.h) and our relay link (relay_frame.h).
 *
 * The reader checks a frame's length header before buffering any of its payload, and its
 * buffer grows on demand only to the largest frame seen, never past header + max_payload:
 * a peer can make us hold at most one maximal frame. Taking a frame is O(1); making room
 * compacts the unread tail once. Pure code over memory: no sockets here. */
#ifndef TR_FRAME_READER_H
#define TR_FRAME_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR_FRAME_HEADER 4u

typedef struct tr_frame_reader {
  uint8_t *buf;
  size_t start;       /* first unread byte */
  size_t len;         /* bytes in buf; [start, len) are buffered */
  size_t cap;
  size_t max_payload; /* largest declared length accepted */
  bool skip_empty;    /* zero-length frames are dropped (Perfetto IPC) rather than returned */
} tr_frame_reader;

void tr_frame_reader_init(tr_frame_reader *r, size_t max_payload, bool skip_empty);
void tr_frame_reader_free(tr_frame_reader *r);
/* Where the next read should write and how much room there is. room is 0 only while a whole
 * frame waits to be taken with tr_frame_reader_next. Returns 0, TR_ERR_NOMEM, or
 * TR_ERR_TOO_BIG when the buffered header declares more than max_payload. */
int tr_frame_reader_space(tr_frame_reader *r, uint8_t **out, size_t *room);
/* Records that n bytes (n <= room) were written where tr_frame_reader_space said. */
void tr_frame_reader_commit(tr_frame_reader *r, size_t n);
/* Copies in as many bytes as fit now and returns how many (possibly fewer than len: take
 * whole frames with tr_frame_reader_next, then push the rest), or a negative error as
 * tr_frame_reader_space. */
int tr_frame_reader_push(tr_frame_reader *r, const uint8_t *data, size_t len);
/* Takes the next whole frame: 1 with *payload and *len set (valid until the next call that
 * changes the reader), 0 when more bytes are needed, TR_ERR_TOO_BIG for an oversize
 * declared length (the connection must be dropped). */
int tr_frame_reader_next(tr_frame_reader *r, const uint8_t **payload, size_t *len);

#endif
