/* trace_reader.h: a bounded reader of Perfetto trace files, one TracePacket at a time.
 *
 * A trace is a run of `0x0A varint(len) <TracePacket>` records (reference 5.1); files concatenate,
 * so a run of files is one trace. Other top-level fields are skipped by wire type (varint, 64-bit,
 * length-delimited, 32-bit); groups, wire types 6/7 and field number 0 are malformed. Every
 * length is checked against the bytes left and against TR_TRACE_READER_MAX_PACKET.
 *
 * Packets holding compressed_packets (zlib/gzip deflate) or zstd_compressed_packets are not
 * returned themselves: their content is decompressed (at most TR_TRACE_READER_MAX_INFLATED bytes
 * each) and its records returned in order, as trace_processor does. Compressed packets inside
 * compressed packets are malformed.
 *
 * Errors stop the reader for good and say where: the byte offset of the offending record in the
 * file and, inside a compressed packet, the offset within its decompressed bytes.
 *
 * Cost: one protobuf-c unpack per packet; the input is never copied, a compressed packet's content
 * is held once while its records are read. Memory: the current packet plus one inflated block. */
#ifndef TR_TRACE_READER_H
#define TR_TRACE_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/trace/trace_packet.pb-c.h"

#define TR_TRACE_READER_MAX_PACKET (64u << 20)    /* bytes of one record */
#define TR_TRACE_READER_MAX_INFLATED (256u << 20) /* bytes decompressed from one packet */

struct tr_trace_cursor { /* a run of records in memory */
  const uint8_t *data;
  size_t len, pos;
};

struct tr_trace_reader_error {
  int code;            /* 0, or the TR_ERR_* that stopped the reader */
  uint64_t offset;     /* of the offending record in the file */
  int64_t inner;       /* offset inside the decompressed content, -1 if not inside one */
  const char *what;    /* static English text, e.g. "record length runs past the end" */
};

struct tr_trace_reader {
  struct tr_trace_cursor outer;
  struct tr_trace_cursor inner; /* decompressed content being read, data NULL when none */
  uint8_t *inflated;            /* owns inner.data */
  uint64_t inner_base;          /* file offset of the compressed packet */
  Perfetto__Protos__TracePacket *packet;
  struct tr_trace_reader_error error;
  /* counts so far */
  uint64_t records;             /* TracePackets returned */
  uint64_t zlib_packets, zstd_packets, inflated_bytes;
  uint64_t skipped_fields;      /* top-level fields other than packets */
  uint64_t undecodable_packets; /* well-framed records whose packet does not decode: skipped */
  uint64_t first_undecodable_offset;
};

struct tr_trace_record {
  const Perfetto__Protos__TracePacket *packet; /* valid until the next call */
  uint64_t offset;  /* of its record in the file (of the compressed packet holding it) */
  int64_t inner;    /* offset in the decompressed content, -1 for a plain record */
  size_t size;      /* encoded size of the packet */
};

/* Reads from len bytes at data, which must stay valid and unchanged until tr_trace_reader_free. */
void tr_trace_reader_init(struct tr_trace_reader *r, const void *data, size_t len);
/* 1 and *rec for the next packet, 0 at the end of the input, or a negative TR_ERR_* (DECODE for
 * malformed bytes, TOO_BIG over a cap, NOMEM) with r->error filled; after an error every call
 * returns the same code. */
int tr_trace_reader_next(struct tr_trace_reader *r, struct tr_trace_record *rec);
void tr_trace_reader_free(struct tr_trace_reader *r);

#endif
