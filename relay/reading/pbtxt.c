/* pbtxt.c: the protobuf text-format parser (see pbtxt.h for the accepted syntax).
 *
 * A recursive-descent parser over the raw bytes, one call of parse_body() per message block.
 * Values are decoded straight into the protobuf-c struct, using the descriptor's offsets, and
 * every pointer stored there comes from malloc, so the tree is always in a state that
 * protobuf_c_message_free_unpacked() can release: on error the caller just frees the root.
 * Recursion is bounded by TR_PBTXT_MAX_DEPTH, and every token is consumed in one pass. */
#include "relay/reading/pbtxt.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "relay/base/tr_error.h"

#define MAX_NUMBER_TOKEN 64

typedef struct parser {
  const char *src;
  size_t len;
  size_t pos;
  unsigned line, col;
  unsigned tok_line, tok_col; /* start of the last token, where value errors point */
  const char *name;
  int depth;
  tr_pbtxt_error *err;
} parser;

/* A decoded string or bytes literal. */
typedef struct literal {
  uint8_t *data;
  size_t len;
} literal;

static int failv(parser *p, unsigned line, unsigned col, int code, const char *fmt, va_list ap) {
  if (p->err) {
    char what[256];
    vsnprintf(what, sizeof what, fmt, ap);
    p->err->line = line;
    p->err->column = col;
    snprintf(p->err->msg, sizeof p->err->msg, "%s:%u:%u: %s", p->name, line, col, what);
  }
  return code;
}

/* An error at the current position. */
__attribute__((format(printf, 3, 4))) static int fail(parser *p, int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  failv(p, p->line, p->col, code, fmt, ap);
  va_end(ap);
  return code;
}

/* A bad value or name: the error points at the start of its token. */
__attribute__((format(printf, 2, 3))) static int fail_token(parser *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  failv(p, p->tok_line, p->tok_col, TR_ERR_DECODE, fmt, ap);
  va_end(ap);
  return TR_ERR_DECODE;
}

static void mark_token(parser *p) {
  p->tok_line = p->line;
  p->tok_col = p->col;
}

static int fail_nomem(parser *p) { return fail(p, TR_ERR_NOMEM, "out of memory"); }

static bool at_end(const parser *p) { return p->pos >= p->len; }
static int peek(const parser *p) { return at_end(p) ? -1 : (unsigned char)p->src[p->pos]; }

static void advance(parser *p) {
  if (p->src[p->pos] == '\n') {
    p->line++;
    p->col = 1;
  } else {
    p->col++;
  }
  p->pos++;
}

static void skip_space(parser *p) {
  while (!at_end(p)) {
    int c = peek(p);
    if (c == '#') {
      while (!at_end(p) && peek(p) != '\n')
        advance(p);
    } else if (isspace(c)) {
      advance(p);
    } else {
      return;
    }
  }
}

/* Skips space, then takes c if it is next. */
static bool accept(parser *p, int c) {
  skip_space(p);
  if (peek(p) != c)
    return false;
  advance(p);
  return true;
}

static bool is_ident_start(int c) { return c == '_' || isalpha(c); }
static bool is_ident_char(int c) { return c == '_' || isalnum(c); }

/* A value word: an identifier or a number, copied into buf. Numbers may carry a sign, a
 * fraction, an exponent with its own sign, a hex prefix and an `f` suffix. */
static int read_word(parser *p, char *buf, size_t cap) {
  size_t n = 0;
  bool hex = false;
  skip_space(p);
  mark_token(p);
  while (!at_end(p)) {
    int c = peek(p);
    bool sign = c == '-' || c == '+';
    bool exp_sign = sign && n > 0 && !hex && (buf[n - 1] == 'e' || buf[n - 1] == 'E');
    if (!(is_ident_char(c) || c == '.' || (sign && n == 0) || exp_sign))
      break;
    if (n + 1 >= cap)
      return fail_token(p, "value is too long");
    buf[n++] = (char)c;
    hex = hex || c == 'x' || c == 'X';
    advance(p);
  }
  buf[n] = '\0';
  if (n == 0 || (n == 1 && (buf[0] == '-' || buf[0] == '+'))) {
    int c = peek(p);
    if (c < 0)
      return fail(p, TR_ERR_DECODE, "expected a value, got end of input");
    return fail(p, TR_ERR_DECODE, "expected a value, got '%c'", isprint(c) ? c : '?');
  }
  return 0;
}

/* A field name: an identifier (the caller checked its first character). */
static int read_ident(parser *p, char *buf, size_t cap) {
  size_t n = 0;
  mark_token(p);
  while (is_ident_char(peek(p))) {
    if (n + 1 >= cap)
      return fail_token(p, "field name is too long");
    buf[n++] = (char)peek(p);
    advance(p);
  }
  buf[n] = '\0';
  return 0;
}

static int hex_value(int c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static int literal_push(parser *p, literal *lit, size_t *cap, uint8_t byte) {
  if (lit->len == *cap) {
    size_t ncap = *cap ? *cap * 2 : 32;
    uint8_t *nd = realloc(lit->data, ncap);
    if (!nd)
      return fail_nomem(p);
    lit->data = nd;
    *cap = ncap;
  }
  lit->data[lit->len++] = byte;
  return 0;
}

static int read_escape(parser *p, uint8_t *out) {
  static const char simple_from[] = "nrtabfv\\'\"?";
  static const char simple_to[] = "\n\r\t\a\b\f\v\\'\"?";
  int c = peek(p);
  if (c < 0)
    return fail(p, TR_ERR_DECODE, "unterminated string");
  const char *s = c ? strchr(simple_from, c) : NULL;
  if (s) {
    *out = (uint8_t)simple_to[s - simple_from];
    advance(p);
    return 0;
  }
  if (c >= '0' && c <= '7') {
    unsigned v = 0;
    for (int i = 0; i < 3 && peek(p) >= '0' && peek(p) <= '7'; i++) {
      v = v * 8 + (unsigned)(peek(p) - '0');
      advance(p);
    }
    if (v > 0xff)
      return fail(p, TR_ERR_DECODE, "octal escape over \\377");
    *out = (uint8_t)v;
    return 0;
  }
  if (c == 'x' || c == 'X') {
    advance(p);
    unsigned v = 0;
    int i = 0;
    for (; i < 2 && hex_value(peek(p)) >= 0; i++) {
      v = v * 16 + (unsigned)hex_value(peek(p));
      advance(p);
    }
    if (i == 0)
      return fail(p, TR_ERR_DECODE, "\\x needs hex digits");
    *out = (uint8_t)v;
    return 0;
  }
  return fail(p, TR_ERR_DECODE, "unknown escape '\\%c'", isprint(c) ? c : '?');
}

/* One or more adjacent quoted literals, concatenated. */
static int read_literal(parser *p, literal *lit, const char *field) {
  size_t cap = 0;
  int rc;
  lit->data = NULL;
  lit->len = 0;
  skip_space(p);
  mark_token(p);
  if (peek(p) != '"' && peek(p) != '\'')
    return fail(p, TR_ERR_DECODE, "expected a quoted string for field '%s'", field);
  while (peek(p) == '"' || peek(p) == '\'') {
    int quote = peek(p);
    advance(p);
    for (;;) {
      int c = peek(p);
      uint8_t byte;
      if (c < 0 || c == '\n') {
        rc = fail(p, TR_ERR_DECODE, "unterminated string in field '%s'", field);
        goto fail;
      }
      advance(p);
      if (c == quote)
        break;
      byte = (uint8_t)c;
      if (c == '\\' && (rc = read_escape(p, &byte)) < 0)
        goto fail;
      if ((rc = literal_push(p, lit, &cap, byte)) < 0)
        goto fail;
    }
    skip_space(p);
  }
  return 0;
fail:
  free(lit->data);
  lit->data = NULL;
  return rc;
}

/* Integer text (sign, then decimal, 0x hex or 0 octal) to magnitude and sign. */
static bool parse_integer(const char *s, uint64_t *mag, bool *neg) {
  unsigned base = 10;
  *neg = false;
  *mag = 0;
  if (*s == '-' || *s == '+')
    *neg = *s++ == '-';
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s += 2;
  } else if (s[0] == '0' && s[1] != '\0') {
    base = 8;
    s++;
  }
  if (*s == '\0')
    return false;
  for (; *s; s++) {
    int d = hex_value(*s);
    if (d < 0 || (unsigned)d >= base)
      return false;
    if (*mag > (UINT64_MAX - (unsigned)d) / base)
      return false;
    *mag = *mag * base + (unsigned)d;
  }
  return true;
}

static const char *type_name(ProtobufCType t) {
  static const char *const names[] = {"int32",  "sint32", "sfixed32", "int64",  "sint64",
                                      "sfixed64", "uint32", "fixed32", "uint64", "fixed64",
                                      "float",  "double", "bool",     "enum",   "string",
                                      "bytes",  "message"};
  return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

size_t tr_pbtxt_value_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    return sizeof(uint64_t);
  case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  default: return sizeof(uint32_t); /* 32-bit ints, float, enum */
  }
}

/* Integer fields: range-checked against the field's type. */
static int parse_int_value(parser *p, const ProtobufCFieldDescriptor *f, const char *tok,
                           void *dst) {
  uint64_t mag;
  bool neg;
  bool is_signed = f->type == PROTOBUF_C_TYPE_INT32 || f->type == PROTOBUF_C_TYPE_SINT32 ||
                   f->type == PROTOBUF_C_TYPE_SFIXED32 || f->type == PROTOBUF_C_TYPE_INT64 ||
                   f->type == PROTOBUF_C_TYPE_SINT64 || f->type == PROTOBUF_C_TYPE_SFIXED64 ||
                   f->type == PROTOBUF_C_TYPE_ENUM;
  bool wide = tr_pbtxt_value_size(f->type) == 8;
  if (!parse_integer(tok, &mag, &neg))
    return fail_token(p, "invalid %s value '%s' for field '%s'", type_name(f->type), tok,
                f->name);
  if (neg && mag != 0 && !is_signed)
    return fail_token(p, "negative value '%s' for unsigned field '%s'", tok, f->name);
  uint64_t limit = wide ? (is_signed ? (uint64_t)INT64_MAX : UINT64_MAX)
                        : (is_signed ? (uint64_t)INT32_MAX : UINT32_MAX);
  if (mag > limit + (neg && is_signed))
    return fail_token(p, "value '%s' out of range for %s field '%s'", tok,
                type_name(f->type), f->name);
  uint64_t v = neg ? (uint64_t)0 - mag : mag;
  if (wide)
    memcpy(dst, &v, 8);
  else {
    uint32_t v32 = (uint32_t)v;
    memcpy(dst, &v32, 4);
  }
  return 0;
}

static int parse_float_value(parser *p, const ProtobufCFieldDescriptor *f, char *tok, void *dst) {
  const char *s = tok;
  bool neg = false;
  double v;
  if (*s == '-' || *s == '+')
    neg = *s++ == '-';
  if (!strcasecmp(s, "inf") || !strcasecmp(s, "infinity")) {
    v = INFINITY;
  } else if (!strcasecmp(s, "nan")) {
    v = NAN;
  } else {
    size_t n = strlen(s);
    char *end;
    /* An `f` suffix is allowed after a decimal number, not after hex digits. */
    if (n > 1 && (s[n - 1] == 'f' || s[n - 1] == 'F') && !strpbrk(s, "xX"))
      tok[(s - tok) + n - 1] = '\0';
    if (!isdigit((unsigned char)*s) && *s != '.')
      goto bad;
    v = strtod(s, &end);
    if (*end != '\0' || end == s)
      goto bad;
  }
  if (neg)
    v = -v;
  if (f->type == PROTOBUF_C_TYPE_FLOAT) {
    float fv = (float)v;
    memcpy(dst, &fv, sizeof fv);
  } else {
    memcpy(dst, &v, sizeof v);
  }
  return 0;
bad:
  return fail_token(p, "invalid %s value '%s' for field '%s'", type_name(f->type), tok,
              f->name);
}

static int parse_enum_value(parser *p, const ProtobufCFieldDescriptor *f, const char *tok,
                            void *dst) {
  const ProtobufCEnumDescriptor *ed = f->descriptor;
  if (!is_ident_start((unsigned char)tok[0]))
    return parse_int_value(p, f, tok, dst);
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value_by_name(ed, tok);
  if (!ev)
    return fail_token(p, "unknown value '%s' for enum field '%s' (%s)", tok, f->name,
                ed->name);
  int32_t v = ev->value;
  memcpy(dst, &v, sizeof v);
  return 0;
}

static int parse_bool_value(parser *p, const ProtobufCFieldDescriptor *f, const char *tok,
                            void *dst) {
  static const char *const truths[] = {"true", "True", "t", "1"};
  static const char *const falses[] = {"false", "False", "f", "0"};
  for (int i = 0; i < 4; i++) {
    protobuf_c_boolean b = !strcmp(tok, truths[i]) ? 1 : !strcmp(tok, falses[i]) ? 0 : 2;
    if (b != 2) {
      memcpy(dst, &b, sizeof b);
      return 0;
    }
  }
  return fail_token(p, "invalid bool value '%s' for field '%s'", tok, f->name);
}

/* A string or bytes literal, stored as a malloc'd value. */
static int parse_text_value(parser *p, const ProtobufCFieldDescriptor *f, void *dst) {
  literal lit;
  int rc = read_literal(p, &lit, f->name);
  if (rc < 0)
    return rc;
  if (f->type == PROTOBUF_C_TYPE_BYTES) {
    ProtobufCBinaryData bd = {lit.len, lit.data};
    memcpy(dst, &bd, sizeof bd);
    return 0;
  }
  if (lit.len && memchr(lit.data, '\0', lit.len)) {
    free(lit.data);
    return fail_token(p, "string field '%s' cannot hold a NUL byte (use bytes)",
                f->name);
  }
  char *s = realloc(lit.data, lit.len + 1);
  if (!s) {
    free(lit.data);
    return fail_nomem(p);
  }
  s[lit.len] = '\0';
  memcpy(dst, &s, sizeof s);
  return 0;
}

/* One non-message value for field f, written to dst (tr_pbtxt_value_size(f->type) bytes). */
static int parse_scalar(parser *p, const ProtobufCFieldDescriptor *f, void *dst) {
  char tok[MAX_NUMBER_TOKEN];
  int rc;
  if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES)
    return parse_text_value(p, f, dst);
  if ((rc = read_word(p, tok, sizeof tok)) < 0)
    return rc;
  switch (f->type) {
  case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE:
    return parse_float_value(p, f, tok, dst);
  case PROTOBUF_C_TYPE_BOOL: return parse_bool_value(p, f, tok, dst);
  case PROTOBUF_C_TYPE_ENUM: return parse_enum_value(p, f, tok, dst);
  default: return parse_int_value(p, f, tok, dst);
  }
}

static int parse_body(parser *p, ProtobufCMessage *m, int close);

/* Opens a `{ ... }` or `< ... >` block: a new, initialised message and the closing character. */
static int open_message(parser *p, const ProtobufCFieldDescriptor *f, ProtobufCMessage **out,
                        int *close) {
  const ProtobufCMessageDescriptor *md = f->descriptor;
  if (accept(p, '{'))
    *close = '}';
  else if (accept(p, '<'))
    *close = '>';
  else
    return fail(p, TR_ERR_DECODE, "expected '{' to open message field '%s' (%s)", f->name,
                md->name);
  if (p->depth >= TR_PBTXT_MAX_DEPTH)
    return fail(p, TR_ERR_TOO_BIG, "messages nested deeper than %d at field '%s'",
                TR_PBTXT_MAX_DEPTH, f->name);
  *out = malloc(md->sizeof_message);
  if (!*out)
    return fail_nomem(p);
  protobuf_c_message_init(md, *out);
  return 0;
}

static int parse_nested(parser *p, ProtobufCMessage *sub, int close) {
  p->depth++;
  int rc = parse_body(p, sub, close);
  p->depth--;
  return rc;
}

/* Appends one value to a repeated field. The array grows to the next power of two whenever
 * the count reaches one, so no capacity needs storing. The count covers a message as soon as
 * it exists, so the parent frees it even if its body fails. */
static int parse_repeated_one(parser *p, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  size_t *count = (size_t *)((char *)m + f->quantifier_offset);
  void **array = (void **)((char *)m + f->offset);
  size_t elem = tr_pbtxt_value_size(f->type);
  size_t n = *count;
  ProtobufCMessage *sub;
  int close, rc;
  if (n == 0 || (n & (n - 1)) == 0) {
    void *grown = realloc(*array, (n ? n * 2 : 1) * elem);
    if (!grown)
      return fail_nomem(p);
    *array = grown;
  }
  char *slot = (char *)*array + n * elem;
  if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
    if ((rc = parse_scalar(p, f, slot)) == 0)
      (*count)++;
    return rc;
  }
  if ((rc = open_message(p, f, &sub, &close)) < 0)
    return rc;
  memcpy(slot, &sub, sizeof sub);
  (*count)++;
  return parse_nested(p, sub, close);
}

static int parse_repeated(parser *p, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                          bool colon) {
  int rc;
  if (!colon || !accept(p, '['))
    return parse_repeated_one(p, m, f);
  if (accept(p, ']'))
    return 0;
  do {
    if ((rc = parse_repeated_one(p, m, f)) < 0)
      return rc;
  } while (accept(p, ','));
  if (!accept(p, ']'))
    return fail(p, TR_ERR_DECODE, "expected ',' or ']' in the list for field '%s'", f->name);
  return 0;
}

/* Marks a singular field present: its has_x flag or its oneof case. */
static void mark_present(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
    *(uint32_t *)((char *)m + f->quantifier_offset) = f->id;
  else if (f->quantifier_offset && f->label == PROTOBUF_C_LABEL_OPTIONAL)
    *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
}

/* Sets a singular field. A scalar is stored only once decoded; a message as soon as it exists,
 * so the parent frees it even if its body fails. */
static int parse_singular(parser *p, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  void *dst = (char *)m + f->offset;
  int rc;
  if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    ProtobufCMessage *sub;
    int close;
    if ((rc = open_message(p, f, &sub, &close)) < 0)
      return rc;
    memcpy(dst, &sub, sizeof sub);
    mark_present(m, f);
    return parse_nested(p, sub, close);
  }
  char value[sizeof(ProtobufCBinaryData)];
  if ((rc = parse_scalar(p, f, value)) < 0)
    return rc;
  memcpy(dst, value, tr_pbtxt_value_size(f->type));
  mark_present(m, f);
  return 0;
}

/* Refuses a second value for a singular field, or a second member of a oneof. */
static int check_singular(parser *p, const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f,
                          const uint8_t *seen) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  if (seen[f - md->fields])
    return fail_token(p, "field '%s' given twice in %s (it is not repeated)", f->name, md->name);
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
    uint32_t set = *(const uint32_t *)((const char *)m + f->quantifier_offset);
    const ProtobufCFieldDescriptor *other = protobuf_c_message_descriptor_get_field(md, set);
    if (other)
      return fail_token(p, "field '%s' conflicts with '%s' (same oneof) in %s", f->name,
                        other->name, md->name);
  }
  return 0;
}

static int parse_field(parser *p, ProtobufCMessage *m, uint8_t *seen) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  char name[128];
  int rc;
  if (peek(p) == '[')
    return fail(p, TR_ERR_DECODE, "extensions and Any ('[...]') are not supported in %s",
                md->name);
  if (!is_ident_start(peek(p)))
    return fail(p, TR_ERR_DECODE, "expected a field name of %s, got '%c'", md->name,
                isprint(peek(p)) ? peek(p) : '?');
  if ((rc = read_ident(p, name, sizeof name)) < 0)
    return rc;
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(md, name);
  if (!f)
    return fail_token(p, "unknown field '%s' in %s", name, md->name);
  bool colon = accept(p, ':');
  if (!colon && f->type != PROTOBUF_C_TYPE_MESSAGE)
    return fail(p, TR_ERR_DECODE, "expected ':' after field '%s'", f->name);
  if (f->label == PROTOBUF_C_LABEL_REPEATED) {
    rc = parse_repeated(p, m, f, colon);
  } else {
    if ((rc = check_singular(p, m, f, seen)) < 0)
      return rc;
    rc = parse_singular(p, m, f);
  }
  seen[f - md->fields] = 1;
  if (rc == 0 && !accept(p, ';'))
    accept(p, ',');
  return rc;
}

/* Fields until `close` (or the end of input for the top message, close == -1). */
static int parse_body(parser *p, ProtobufCMessage *m, int close) {
  const ProtobufCMessageDescriptor *md = m->descriptor;
  uint8_t *seen = calloc(md->n_fields ? md->n_fields : 1, 1);
  int rc = 0;
  if (!seen)
    return fail_nomem(p);
  for (;;) {
    skip_space(p);
    if (at_end(p)) {
      if (close != -1)
        rc = fail(p, TR_ERR_DECODE, "missing '%c' to close %s", close, md->name);
      break;
    }
    if (peek(p) == close) {
      advance(p);
      break;
    }
    if ((rc = parse_field(p, m, seen)) < 0)
      goto out;
  }
  for (unsigned i = 0; rc == 0 && i < md->n_fields; i++)
    if (md->fields[i].label == PROTOBUF_C_LABEL_REQUIRED && !seen[i])
      rc = fail(p, TR_ERR_DECODE, "missing required field '%s' in %s", md->fields[i].name,
                md->name);
out:
  free(seen);
  return rc;
}

int tr_pbtxt_parse(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                   const char *name, ProtobufCMessage **out, tr_pbtxt_error *err) {
  parser p = {.src = text, .len = len, .line = 1, .col = 1, .name = name ? name : "<input>",
              .err = err};
  *out = NULL;
  if (err)
    memset(err, 0, sizeof *err);
  if (len > TR_PBTXT_MAX_INPUT)
    return fail(&p, TR_ERR_TOO_BIG, "input is %zu bytes, over the %u-byte limit", len,
                TR_PBTXT_MAX_INPUT);
  ProtobufCMessage *m = malloc(desc->sizeof_message);
  if (!m)
    return fail_nomem(&p);
  protobuf_c_message_init(desc, m);
  int rc = parse_body(&p, m, -1);
  if (rc < 0) {
    protobuf_c_message_free_unpacked(m, NULL);
    return rc;
  }
  *out = m;
  return 0;
}
