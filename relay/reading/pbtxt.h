/* pbtxt.h: protobuf text format, parsed into and printed from protobuf-c messages.
 *
 * Driven only by protobuf-c descriptors, so any generated message works (TraceConfig for
 * `tracerelay record -c`, TracePacket for `tracerelay inspect`). The parser accepts the text
 * format users write by hand:
 *   field: value            scalars; the colon is required
 *   field { ... }           messages; also `field: { ... }` and `field < ... >`
 *   field: [a, b]           repeated fields, as well as plain repetition of `field: a`
 *   # comment               to the end of the line; `;` or `,` may follow any field
 * Values: enums by name or number (numbers pass through unchecked, as on the wire), integers in
 * decimal, hex (0x) or octal (leading 0), optionally negative for signed types; floats, inf, nan
 * (an `f` suffix is allowed); true/false/t/f/1/0; strings and bytes in double or single quotes
 * with C escapes (\n \t \\ \" \' \ooo \xHH ...), adjacent literals concatenated.
 * Refused, with line:column and the field: unknown fields, a singular field or oneof given
 * twice, out-of-range numbers, unknown enum names, NUL in a string field, missing required
 * fields, extensions (`[x.y]`). Bounded: TR_PBTXT_MAX_INPUT bytes and TR_PBTXT_MAX_DEPTH nested
 * messages; cost is linear in the input.
 *
 * Parsed messages are laid out exactly as protobuf_c_message_unpack() would leave them (every
 * pointer from malloc, defaults where nothing was given), so protobuf_c_message_pack() and
 * protobuf_c_message_free_unpacked(msg, NULL) work on them. */
#ifndef TR_PBTXT_H
#define TR_PBTXT_H

#include <stddef.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

#define TR_PBTXT_MAX_INPUT (1u << 20) /* bytes of text */
#define TR_PBTXT_MAX_DEPTH 32         /* nested messages below the top one */

/* Where and why a parse failed. msg reads "NAME:LINE:COL: what", e.g.
 * "config.pbtxt:3:5: unknown field 'bufers' in perfetto.protos.TraceConfig". */
typedef struct tr_pbtxt_error {
  unsigned line;   /* 1-based */
  unsigned column; /* 1-based, in bytes */
  char msg[320];
} tr_pbtxt_error;

/* Parses len bytes of text (no NUL needed) as a message of type desc. name labels error
 * messages (a file name; NULL gives "<input>"). On success returns 0 and sets *out (free with
 * protobuf_c_message_free_unpacked(*out, NULL)). On failure returns TR_ERR_DECODE (bad text),
 * TR_ERR_TOO_BIG (size or depth cap) or TR_ERR_NOMEM, fills *err if err is not NULL, and leaves
 * *out NULL. */
int tr_pbtxt_parse(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                   const char *name, ProtobufCMessage **out, tr_pbtxt_error *err);

/* Writes msg as text, two-space indented, fields in field-number order, only fields that are
 * set. The output parses back to an equal message (tr_pbtxt_parse then pack gives the same
 * bytes), except unknown fields, which are listed as `# unknown field N (wire type W)` comments.
 * Returns 0, TR_ERR_TOO_BIG if messages nest deeper than TR_PBTXT_MAX_DEPTH (output up to
 * there is written), or TR_ERR_SYS(EIO) if the stream failed. */
int tr_pbtxt_print(FILE *out, const ProtobufCMessage *msg);

/* Bytes one value of a field of type t takes in an unpacked protobuf-c message (its member,
 * or one element of its repeated array); the parser and the printer both walk by it. */
size_t tr_pbtxt_value_size(ProtobufCType t);

#endif
