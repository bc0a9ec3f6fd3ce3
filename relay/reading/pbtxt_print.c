/* pbtxt_print.c: protobuf-c message -> text format (the printer half of pbtxt.h).
 *
 * Walks the descriptor in field-number order and prints what is set, in a form the parser in
 * pbtxt.c reads back to the same message: floats with enough digits to round-trip, strings and
 * bytes quoted with octal escapes, enums by name when the number is known. Recursion is bounded
 * by TR_PBTXT_MAX_DEPTH, since unpacked messages from a trace may nest arbitrarily. */
#include "relay/reading/pbtxt.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "relay/base/tr_error.h"

static void indent(FILE *out, int depth) {
  for (int i = 0; i < depth; i++)
    fputs("  ", out);
}

/* Quoted, with \ooo for anything not printable ASCII; string fields keep UTF-8 bytes as they
 * are so text stays readable. */
static void print_quoted(FILE *out, const uint8_t *data, size_t len, bool keep_utf8) {
  fputc('"', out);
  for (size_t i = 0; i < len; i++) {
    uint8_t c = data[i];
    if (c == '"' || c == '\\')
      fprintf(out, "\\%c", c);
    else if (c == '\n')
      fputs("\\n", out);
    else if ((c >= 0x20 && c < 0x7f) || (keep_utf8 && c >= 0x80))
      fputc(c, out);
    else
      fprintf(out, "\\%03o", c);
  }
  fputc('"', out);
}

static void print_double(FILE *out, double v, int digits) {
  if (isnan(v))
    fputs("nan", out);
  else if (isinf(v))
    fputs(v < 0 ? "-inf" : "inf", out);
  else
    fprintf(out, "%.*g", digits, v);
}

static int print_message(FILE *out, const ProtobufCMessage *m, int depth);

/* One value of field f stored at p, after "name: " (or "name " for messages). */
static int print_value(FILE *out, const ProtobufCFieldDescriptor *f, const void *p, int depth) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    fprintf(out, "%" PRId32, *(const int32_t *)p);
    break;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    fprintf(out, "%" PRIu32, *(const uint32_t *)p);
    break;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    fprintf(out, "%" PRId64, *(const int64_t *)p);
    break;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    fprintf(out, "%" PRIu64, *(const uint64_t *)p);
    break;
  case PROTOBUF_C_TYPE_FLOAT: print_double(out, *(const float *)p, 9); break;
  case PROTOBUF_C_TYPE_DOUBLE: print_double(out, *(const double *)p, 17); break;
  case PROTOBUF_C_TYPE_BOOL: fputs(*(const protobuf_c_boolean *)p ? "true" : "false", out); break;
  case PROTOBUF_C_TYPE_ENUM: {
    int32_t v = *(const int32_t *)p;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
    if (ev)
      fputs(ev->name, out);
    else
      fprintf(out, "%" PRId32, v);
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    print_quoted(out, (const uint8_t *)s, strlen(s), true);
    break;
  }
  case PROTOBUF_C_TYPE_BYTES: {
    const ProtobufCBinaryData *bd = p;
    print_quoted(out, bd->data, bd->len, false);
    break;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    int rc;
    fputs("{\n", out);
    rc = print_message(out, *(ProtobufCMessage *const *)p, depth + 1);
    indent(out, depth);
    fputc('}', out);
    return rc;
  }
  }
  return 0;
}

/* Whether a singular field is set, by the same rules protobuf_c_message_pack() uses. */
static bool is_set(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const char *base = (const char *)m;
  const void *p = base + f->offset;
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    return *(const uint32_t *)(base + f->quantifier_offset) == f->id;
  if (f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING) {
    const void *ptr = *(const void *const *)p;
    return ptr && (f->label != PROTOBUF_C_LABEL_OPTIONAL || ptr != f->default_value);
  }
  if (f->label == PROTOBUF_C_LABEL_REQUIRED)
    return true;
  if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset)
    return *(const protobuf_c_boolean *)(base + f->quantifier_offset);
  /* proto3 without presence: set when not zero. */
  if (f->type == PROTOBUF_C_TYPE_BYTES)
    return ((const ProtobufCBinaryData *)p)->len > 0;
  static const uint8_t zero[8];
  return memcmp(p, zero, tr_pbtxt_value_size(f->type)) != 0;
}

static int print_field(FILE *out, const ProtobufCFieldDescriptor *f, const void *p, int depth) {
  indent(out, depth);
  fputs(f->name, out);
  fputs(f->type == PROTOBUF_C_TYPE_MESSAGE ? " " : ": ", out);
  int rc = print_value(out, f, p, depth);
  fputc('\n', out);
  return rc;
}

static int print_message(FILE *out, const ProtobufCMessage *m, int depth) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  if (depth > TR_PBTXT_MAX_DEPTH) {
    indent(out, depth);
    fputs("# nested too deep, not printed\n", out);
    return TR_ERR_TOO_BIG;
  }
  int rc = 0;
  for (unsigned i = 0; i < md->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &md->fields[i];
    const char *field = (const char *)m + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
      const char *array = *(const char *const *)field;
      for (size_t k = 0; k < n; k++) {
        int r = print_field(out, f, array + k * tr_pbtxt_value_size(f->type), depth);
        rc = rc ? rc : r;
      }
    } else if (is_set(m, f)) {
      int r = print_field(out, f, field, depth);
      rc = rc ? rc : r;
    }
  }
  for (unsigned i = 0; i < m->n_unknown_fields; i++) {
    indent(out, depth);
    fprintf(out, "# unknown field %" PRIu32 " (wire type %d, %zu bytes)\n",
            m->unknown_fields[i].tag, (int)m->unknown_fields[i].wire_type,
            m->unknown_fields[i].len);
  }
  return rc;
}

int tr_pbtxt_print(FILE *out, const ProtobufCMessage *msg) {
  int rc = print_message(out, msg, 0);
  if (ferror(out))
    return TR_ERR_SYS(EIO);
  return rc;
}
