/* packet_compress.h: TraceConfig's compression (compression_type, compression) applied to
 * packets as they leave the service, as traced v58.2 does it (module tr_packet_compress).
 *
 * What traced does, and so what this does: the packets of one read step (a ReadBuffers reply
 * of about 32 KiB of packets, a write_into_file step of about 1 MiB) become ONE TracePacket
 * holding them: compressed_packets (field 50, zlib-format deflate at level 6) or
 * zstd_compressed_packets (field 133, one zstd frame at the config's level). Its content is
 * the packets in a trace file's own form, `0x0A varint(len) <TracePacket>` each, so a reader
 * splits it as it splits a file. Every packet of the step goes in, the service's own (clock
 * snapshots, trace_config, stats) as well as the producers', each with its trusted fields
 * appended as it would be uncompressed; the compressed packet carries no field but its
 * content (traced gives it no trusted_uid or sequence id either), and the trace's stats say
 * nothing of compression. The codec: `compression.zstd` if set, else `compression.deflate`
 * or `compression_type: COMPRESSION_TYPE_DEFLATE`, else none (traced's order: the highest
 * field number it knows wins).
 *
 * Guarantees: a group is started by its first tr_packet_compress_add and ended by
 * tr_packet_compress_finish (or dropped by tr_packet_compress_reset); full() turns true once
 * the group's packets reach group_bytes (traced's threshold: not an upper bound, the packet
 * that crosses it is in the group). Memory is bounded: the codec's state (deflate's about
 * 270 KiB; zstd's window capped at TR_PACKET_COMPRESS_ZSTD_WINDOW_LOG and a group compressed
 * whole, so level 22 takes 39 MB where streaming it would take 674 MB: test_packet_compress
 * measures it), for zstd the group's records (about group_bytes plus the last packet), and
 * one output buffer, at most twice the largest group's compressed packet, kept across groups.
 * tr_packet_compress_memory says how much that is now.
 *
 * Cost: the codec's, per byte added (zstd's at finish, after one copy of the records); the
 * buffers grow by doubling. No I/O, no libuv. */
#ifndef TR_PACKET_COMPRESS_H
#define TR_PACKET_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "perfetto/config/trace_config.pb-c.h"

/* traced's read step sizes (tracing_service_impl: kApproxBytesPerTask for a consumer's
 * ReadBuffers, kWriteIntoFileChunkSize for write_into_file): one compressed packet each. */
#define TR_PACKET_COMPRESS_READ_GROUP (32u * 1024u)
#define TR_PACKET_COMPRESS_FILE_GROUP (1u << 20)
/* zstd's window: 2 MiB covers a whole file group and a large packet past it, so capping it
 * costs nothing in ratio and keeps a high level from reserving a 128 MiB window. */
#define TR_PACKET_COMPRESS_ZSTD_WINDOW_LOG 21
/* TracePacket fields of the compressed packet (reference 5.2). */
#define TR_PACKET_COMPRESS_FIELD_DEFLATE 50u
#define TR_PACKET_COMPRESS_FIELD_ZSTD 133u
#define TR_PACKET_COMPRESS_DEFLATE_LEVEL 6 /* traced's, whatever the config */

enum tr_packet_codec {
  TR_PACKET_CODEC_NONE = 0,
  TR_PACKET_CODEC_DEFLATE,
  TR_PACKET_CODEC_ZSTD,
};

typedef struct tr_packet_compress tr_packet_compress;

/* The codec cfg asks for, and (zstd) its level as given: 0 is zstd's default, levels past
 * zstd's range are clamped by zstd, negative ones are its fast modes. */
enum tr_packet_codec tr_packet_compress_codec(const Perfetto__Protos__TraceConfig *cfg,
                                              int *level);
/* A compressor for groups of about group_bytes (> 0) with codec (not NONE). 0, TR_ERR_INVAL,
 * TR_ERR_NOMEM. */
int tr_packet_compress_new(enum tr_packet_codec codec, int level, size_t group_bytes,
                           tr_packet_compress **out);
void tr_packet_compress_free(tr_packet_compress *pc); /* NULL is ignored */

/* Adds one packet to the group: its bytes, then tail (its trusted fields; may be empty), as
 * one record. The bytes are consumed before this returns. 0, TR_ERR_TOO_BIG (a packet of
 * 4 GiB or more), TR_ERR_NOMEM (the group is
 * then broken: finish returns that error and drops it). */
int tr_packet_compress_add(tr_packet_compress *pc, const uint8_t *data, size_t len,
                           const uint8_t *tail, size_t tail_len);
/* Whether the group reached group_bytes: time to finish it. */
bool tr_packet_compress_full(const tr_packet_compress *pc);
/* Packets in the group so far. */
size_t tr_packet_compress_count(const tr_packet_compress *pc);
/* Ends the group: *packet, *len = the compressed TracePacket (no record header), valid until
 * the next add, finish, reset or free. The next add begins a new group. 0, TR_ERR_STATE (an
 * empty group: traced writes nothing for it either), TR_ERR_NOMEM (the group is dropped). */
int tr_packet_compress_finish(tr_packet_compress *pc, const uint8_t **packet, size_t *len);
/* Drops the group under way, if any (a read pass that ended early). */
void tr_packet_compress_reset(tr_packet_compress *pc);
/* Bytes held now: the codec's state and the output buffer. */
size_t tr_packet_compress_memory(const tr_packet_compress *pc);

#endif
