/* varint.h: protobuf base-128 varints, the one encoder and bounded decoder that the code which
 * reads or writes protobuf wire bytes by hand (packet rewriting, trusted fields, trace records,
 * IPC frames) shares. */
#ifndef TR_VARINT_H
#define TR_VARINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Protobuf wire types (the low 3 bits of a field's tag), and the largest field number. */
#define TR_WIRE_VARINT 0u
#define TR_WIRE_FIXED64 1u
#define TR_WIRE_BYTES 2u
#define TR_WIRE_FIXED32 5u
#define TR_WIRE_MAX_FIELD 0x1FFFFFFFu

/* The most bytes a 64-bit varint takes. */
#define TR_VARINT_MAX 10

/* Bytes v takes as a varint (1..10). */
size_t tr_varint_len(uint64_t v);
/* Writes v at out (room for TR_VARINT_MAX bytes); returns the bytes written. */
size_t tr_varint_put(uint8_t *out, uint64_t v);
/* Reads one varint from p[*pos, len) into *v and advances *pos past it; false (and *pos
 * somewhere inside) if it runs past len or over 10 bytes. */
bool tr_varint_get(const uint8_t *p, size_t len, size_t *pos, uint64_t *v);

#endif
