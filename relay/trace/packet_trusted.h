/* packet_trusted.h: what the service adds to, and checks in, every producer packet it emits
 * (reference 4.8). Part of module tr_tbuf; pure functions over bytes.
 *
 * A producer must not set the fields only the service may write, so every packet is checked
 * first (top-level fields only, as traced's PacketStreamValidator does), then the service's
 * slice is appended after the packet bytes. Protobuf is last-one-wins, so the appended values
 * are the ones readers see even if a field were repeated. */
#ifndef TR_PACKET_TRUSTED_H
#define TR_PACKET_TRUSTED_H

#include <stddef.h>
#include <stdint.h>

/* Longest slice tr_tbuf_append_trusted writes. */
#define TR_TBUF_TRUSTED_MAX 48u

typedef struct tr_tbuf_trusted {
  int32_t uid;                      /* trusted_uid (3), always written */
  uint32_t sequence_id;             /* trusted_packet_sequence_id (10), always written */
  int32_t pid;                      /* trusted_pid (79), written when > 0 */
  uint32_t machine_id;              /* machine_id (98), written when non-zero */
  uint32_t previous_packet_dropped; /* previous_packet_dropped (42), written when non-zero */
} tr_tbuf_trusted;

/* Writes the trusted slice at `out`, in the order traced writes it: 3, 10, 79, 98, 42, each a
 * varint field (int32 values sign-extended to 64 bits as protobuf does). Returns the number of
 * bytes written, or TR_ERR_TOO_BIG when `cap` is smaller than the slice. */
int tr_tbuf_append_trusted(uint8_t *out, size_t cap, const tr_tbuf_trusted *t);

/* Checks a producer packet: 0 if acceptable, TR_ERR_PERM if it carries a top-level field
 * reserved to the service (3, 10, 33, 35, 36, 50, 69, 79, 98, 124, 125, 133), TR_ERR_DECODE if
 * it is truncated or malformed (bad varint, field number 0, group or unknown wire type, length
 * past the end). Nested messages are not entered. O(len). */
int tr_tbuf_validate_packet(const uint8_t *packet, size_t len);

#endif
