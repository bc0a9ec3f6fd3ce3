/* trace_filter.c: Perfetto's filter bytecode, loaded and walked over packets as traced v58.2
 * does (src/protozero/filtering/ of v58.2 for the facts; the code is ours).
 *
 * BYTECODE. A run of varints (each read as 64 bits, kept as its low 32), the last one a
 * checksum: the low 32 bits of FNV-1a-64 over the others, each hashed as its 4 little-endian
 * bytes. v1 (TraceFilter.bytecode) and v2 (bytecode_v2) are read alike; v2 is preferred when
 * both are set. Each word is (field << 3) | opcode:
 *   0 END_OF_MESSAGE  closes the message being described; messages are numbered from 0 in
 *                     this order, and message 0 is the root (perfetto.protos.Trace);
 *   1 SIMPLE_FIELD    field `field` is allowed and copied as it is;
 *   2 RANGE           fields [field, field + next word) are allowed, simple;
 *   3 NESTED          field `field` is a message, described by message number `next word`;
 *   4 FILTER_STRING   field `field` is a string to pass through the string filter chain;
 *   5 FILTER_STRING_TYPED  likewise, with the string's semantic type in the next word (low 16
 *                     bits), which selects the rules that apply.
 * A field of 0 (but in END_OF_MESSAGE), an unknown opcode, a missing operand, ranges of a
 * message at 128 and above that overlap (or come out of order), a last word that is not
 * END_OF_MESSAGE, or a NESTED index past the last message make the bytecode invalid. A later
 * word for the same field replaces the earlier one.
 *
 * OVERLAY (bytecode_overlay_v54). The same varints and checksum, in triples [message, field
 * word, argument], sorted strictly by (message, field): each upgrades that field of that
 * message (or adds it) to SIMPLE, FILTER_STRING or FILTER_STRING_TYPED(argument); any other
 * opcode, a triple out of order, or one for a message the bytecode does not have (left over
 * at the end) makes the load fail. Merged as the bytecode is read: at each field word, the
 * overlay's entries of that message below the field are added, one equal to it replaces it;
 * at END_OF_MESSAGE the message's remaining entries are added.
 *
 * TABLES. Per message: the count d of directly indexed fields (those below 128), d states,
 * then [start, end, state] triples for larger fields. A state is 0 (not allowed) or bit 31
 * plus what the field is: a message number, 0x7fffffff simple, 0x7ffffffe filter string,
 * 0x7fff0000 | type a typed filter string. A lookup is O(1) for fields below 128, else a walk
 * of the message's ranges. Message numbers never reach 0x7fff0000 (the bytecode size bound).
 *
 * FILTERING. One pass over the input bytes, whatever the slices (a packet and its trusted
 * slice), with a stack of the messages entered. Fields are read as protobuf wire fields and:
 * - an allowed simple varint or fixed field is written again (tag and varint minimally
 *   encoded, the tag computed in 32 bits as traced does); anything else is dropped;
 * - a length-delimited field: longer than what is left of its message is an error; allowed as
 *   a nested message with a non-zero length, it is entered (its tag and a length varint of the
 *   input length's width are written, the length filled in, padded to that width, when the
 *   message ends: so a shorter output keeps the input's length width, as traced's does);
 *   allowed otherwise (string, bytes, empty message) it is copied, through the string filter
 *   for FILTER_STRING fields; not allowed, it is skipped;
 * - a field numbered 0 is not a field: its tag is read and nothing else happens (its payload,
 *   if any, is read as fields), as in traced's tokenizer;
 * - a wire type 3, 4, 6 or 7, a varint over 10 bytes, a length over 2^28 - 1, a message that
 *   ends inside a field, or input that ends inside one makes the whole packet an error.
 * The output is never longer than the input; an error leaves no output (the caller writes an
 * empty packet, as traced does, and it is counted in errors). */
#include "relay/trace/trace_filter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "relay/base/tr_error.h"
#include "relay/base/varint.h"
#include "relay/trace/trace_filter_priv.h"

enum { OP_EOM, OP_SIMPLE, OP_RANGE, OP_NESTED, OP_STRING, OP_STRING_TYPED };

#define ALLOWED 0x80000000u
#define KIND_SIMPLE 0x7fffffffu
#define KIND_STRING 0x7ffffffeu
#define KIND_TYPED 0x7fff0000u
#define TYPE_MASK 0xffffu
#define DIRECT_LIMIT 128u
#define MAX_LEN_DELIM 0x0fffffffu /* the largest length traced's tokenizer takes */

typedef struct u32vec {
  uint32_t *v;
  size_t n, cap;
} u32vec;

/* The walker's tokenizer: where it is in a field's encoding. */
enum { TOK_TAG, TOK_VARINT, TOK_FIXED, TOK_LEN };

typedef struct tokenizer {
  int state;
  uint32_t field;
  uint64_t varint;
  unsigned shift;
  unsigned fixed_shift, fixed_bits;
  uint64_t fixed;
} tokenizer;

enum { ACT_DROP, ACT_COPY, ACT_STRING };

/* One message being walked. */
typedef struct level {
  uint32_t in_bytes;  /* input bytes of this message read so far */
  uint32_t in_limit;  /* its length */
  uint32_t skip;      /* payload bytes of a string or skipped field still to read */
  int action;         /* what to do with them */
  uint32_t msg;       /* its message number */
  size_t out_start;   /* output offset where its payload starts */
  size_t size_at;     /* output offset of its length varint, size_len bytes wide */
  unsigned size_len;
  size_t str_at;      /* ACT_STRING: output offset of the string */
  uint32_t str_type;
} level;

struct tr_trace_filter {
  u32vec words;   /* the tables, message after message */
  u32vec offsets; /* offsets[m]: message m's table; one more at the end */
  uint32_t root;
  tr_trace_filter_chain chain;
  tr_trace_filter_stats stats;
  /* per run */
  level *stack;
  size_t depth, stack_cap;
  tokenizer tok;
  uint8_t *out;
  size_t out_len;
  bool error;
};

static int push_word(u32vec *v, uint32_t w) {
  if (v->n == v->cap) {
    size_t cap = v->cap ? 2 * v->cap : 64;
    uint32_t *n = realloc(v->v, cap * sizeof *n);
    if (!n)
      return TR_ERR_NOMEM;
    v->v = n;
    v->cap = cap;
  }
  v->v[v->n++] = w;
  return 0;
}

/* ---- loading ---- */

/* The words of a bytecode or overlay, its checksum checked and dropped. */
static int read_words(const uint8_t *p, size_t len, u32vec *out) {
  uint64_t hash = 0xcbf29ce484222325ull, v = 0;
  size_t pos = 0;
  bool have = false;
  if (len == 0 || len > TR_TRACE_FILTER_MAX_BYTECODE)
    return TR_ERR_DECODE;
  while (pos < len) {
    if (have) { /* the word before this one was not the checksum */
      uint32_t w = (uint32_t)v;
      for (int i = 0; i < 4; i++)
        hash = (hash ^ (uint8_t)(w >> (8 * i))) * 0x100000001b3ull;
      if (push_word(out, w) != 0)
        return TR_ERR_NOMEM;
    }
    if (!tr_varint_get(p, len, &pos, &v))
      return TR_ERR_DECODE;
    have = true;
  }
  return (uint32_t)v == (uint32_t)hash ? 0 : TR_ERR_DECODE;
}

typedef struct overlay_entry {
  uint32_t msg, field, state;
} overlay_entry;

/* The message being built, and the overlay merged into it. */
typedef struct builder {
  uint32_t direct[DIRECT_LIMIT];
  uint32_t n_direct;
  u32vec ranges;
  const overlay_entry *ov;
  size_t n_ov, next_ov;
  uint32_t msg;
} builder;

static void add_direct(builder *b, uint32_t field, uint32_t state) {
  if (field + 1 > b->n_direct)
    b->n_direct = field + 1;
  b->direct[field] = ALLOWED | state;
}

static int add_field(builder *b, uint32_t field, uint32_t state) {
  int rc;
  if (field < DIRECT_LIMIT) {
    add_direct(b, field, state);
    return 0;
  }
  if ((rc = push_word(&b->ranges, field)) != 0 || (rc = push_word(&b->ranges, field + 1)) != 0)
    return rc;
  return push_word(&b->ranges, ALLOWED | state);
}

/* Adds the overlay's entries of the current message below `field`; *upgrade gets the state
 * of the one equal to it (0: none). */
static int merge_overlay(builder *b, uint32_t field, uint32_t *upgrade) {
  *upgrade = 0;
  while (b->next_ov < b->n_ov) {
    const overlay_entry *e = &b->ov[b->next_ov];
    int rc;
    if (e->msg > b->msg || (e->msg == b->msg && e->field > field))
      break;
    b->next_ov++;
    if (e->field == field) {
      *upgrade = e->state;
      break;
    }
    if ((rc = add_field(b, e->field, e->state)) != 0)
      return rc;
  }
  return 0;
}

static int end_message(tr_trace_filter *f, builder *b) {
  uint32_t ignored;
  int rc;
  if ((rc = merge_overlay(b, UINT32_MAX, &ignored)) != 0)
    return rc;
  for (size_t r = 0; r + 3 < b->ranges.n; r += 3)
    if (b->ranges.v[r + 3] < b->ranges.v[r + 1])
      return TR_ERR_DECODE; /* overlapping (or unordered) ranges */
  if ((rc = push_word(&f->offsets, (uint32_t)f->words.n)) != 0 ||
      (rc = push_word(&f->words, b->n_direct)) != 0)
    return rc;
  for (uint32_t i = 0; i < b->n_direct; i++)
    if ((rc = push_word(&f->words, b->direct[i])) != 0)
      return rc;
  for (size_t i = 0; i < b->ranges.n; i++)
    if ((rc = push_word(&f->words, b->ranges.v[i])) != 0)
      return rc;
  memset(b->direct, 0, sizeof b->direct);
  b->n_direct = 0;
  b->ranges.n = 0;
  b->msg++;
  return 0;
}

/* The overlay's triples as entries, checked. */
static int read_overlay(const u32vec *w, overlay_entry **out, size_t *n) {
  overlay_entry *e;
  *out = NULL;
  *n = 0;
  if (w->n % 3 != 0)
    return TR_ERR_DECODE;
  if (w->n == 0)
    return 0;
  if (!(e = calloc(w->n / 3, sizeof *e)))
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < w->n / 3; i++) {
    uint32_t op = w->v[3 * i + 1] & 7u, arg = w->v[3 * i + 2];
    e[i].msg = w->v[3 * i];
    e[i].field = w->v[3 * i + 1] >> 3;
    e[i].state = op == OP_SIMPLE            ? KIND_SIMPLE
                 : op == OP_STRING          ? KIND_STRING
                 : op == OP_STRING_TYPED    ? KIND_TYPED | (arg & TYPE_MASK)
                                            : 0;
    if (e[i].state == 0 ||
        (i > 0 && (e[i].msg < e[i - 1].msg ||
                   (e[i].msg == e[i - 1].msg && e[i].field <= e[i - 1].field)))) {
      free(e);
      return TR_ERR_DECODE;
    }
  }
  *out = e;
  *n = w->n / 3;
  return 0;
}

/* Builds the tables from the bytecode's words. */
static int build(tr_trace_filter *f, const u32vec *w, builder *b) {
  uint32_t max_msg = 0;
  bool eom = true;
  int rc;
  for (size_t i = 0; i < w->n; i++) {
    uint32_t op = w->v[i] & 7u, field = w->v[i] >> 3, state, upgrade;
    bool has_next = i + 1 < w->n;
    eom = op == OP_EOM;
    if (field == 0 && op != OP_EOM)
      return TR_ERR_DECODE;
    switch (op) {
    case OP_SIMPLE:
    case OP_STRING:
    case OP_STRING_TYPED:
    case OP_NESTED:
      if ((op == OP_STRING_TYPED || op == OP_NESTED) && !has_next)
        return TR_ERR_DECODE;
      if (op == OP_SIMPLE)
        state = KIND_SIMPLE;
      else if (op == OP_STRING)
        state = KIND_STRING;
      else if (op == OP_STRING_TYPED)
        state = KIND_TYPED | (w->v[++i] & TYPE_MASK);
      else {
        state = w->v[++i];
        if (state > max_msg)
          max_msg = state;
      }
      if ((rc = merge_overlay(b, field, &upgrade)) != 0)
        return rc;
      if ((rc = add_field(b, field, upgrade ? upgrade : state)) != 0)
        return rc;
      break;
    case OP_RANGE: {
      if (!has_next)
        return TR_ERR_DECODE;
      uint32_t end = field + w->v[++i], id = field; /* wraps as traced's does */
      for (; id < end && id < DIRECT_LIMIT; id++)
        add_direct(b, id, KIND_SIMPLE);
      if (id < end && ((rc = push_word(&b->ranges, id)) != 0 ||
                       (rc = push_word(&b->ranges, end)) != 0 ||
                       (rc = push_word(&b->ranges, ALLOWED | KIND_SIMPLE)) != 0))
        return rc;
      break;
    }
    case OP_EOM:
      if ((rc = end_message(f, b)) != 0)
        return rc;
      break;
    default:
      return TR_ERR_DECODE;
    }
  }
  if (!eom || b->next_ov != b->n_ov || (max_msg > 0 && max_msg >= f->offsets.n))
    return TR_ERR_DECODE;
  return push_word(&f->offsets, (uint32_t)f->words.n);
}

int tr_trace_filter_load(tr_trace_filter *f, const uint8_t *bytecode, size_t len,
                         const uint8_t *overlay, size_t overlay_len) {
  u32vec words = {0}, ov_words = {0};
  builder *b = calloc(1, sizeof *b);
  overlay_entry *ov = NULL;
  int rc = TR_ERR_NOMEM;

  f->words.n = f->offsets.n = 0;
  f->root = 0;
  if (!b)
    goto out;
  if ((rc = read_words(bytecode, len, &words)) != 0)
    goto out;
  if (overlay && overlay_len > 0 &&
      ((rc = read_words(overlay, overlay_len, &ov_words)) != 0 ||
       (rc = read_overlay(&ov_words, &ov, &b->n_ov)) != 0))
    goto out;
  b->ov = ov;
  rc = build(f, &words, b);
out:
  if (rc != 0)
    f->words.n = f->offsets.n = 0; /* nothing loaded: every field is refused */
  if (b)
    free(b->ranges.v);
  free(b);
  free(ov);
  free(ov_words.v);
  free(words.v);
  return rc;
}

/* The state of field `field` in message `msg` (0: not allowed). */
static uint32_t lookup(const tr_trace_filter *f, uint32_t msg, uint32_t field) {
  if ((uint64_t)msg + 1 >= f->offsets.n)
    return 0;
  const uint32_t *w = &f->words.v[f->offsets.v[msg]], *end = &f->words.v[f->offsets.v[msg + 1]];
  uint32_t n_direct = *w++;
  if (field < n_direct)
    return w[field];
  for (w += n_direct; w + 3 <= end; w += 3)
    if (field >= w[0] && field < w[1])
      return w[2];
  return 0;
}

static bool is_nested(uint32_t state) { return (state & ~ALLOWED) < KIND_TYPED; }
static bool is_string(uint32_t state) {
  uint32_t k = state & ~ALLOWED;
  return k >= KIND_TYPED && k <= KIND_STRING;
}

int tr_trace_filter_set_root(tr_trace_filter *f, uint32_t field) {
  uint32_t state = lookup(f, f->root, field);
  if (!(state & ALLOWED) || !is_nested(state))
    return TR_ERR_NOT_FOUND;
  f->root = state & ~ALLOWED;
  return 0;
}

/* ---- setup ---- */

tr_trace_filter *tr_trace_filter_new(void) { return calloc(1, sizeof(tr_trace_filter)); }

void tr_trace_filter_free(tr_trace_filter *f) {
  if (!f)
    return;
  tr_trace_filter_string_free(&f->chain);
  free(f->words.v);
  free(f->offsets.v);
  free(f->stack);
  free(f);
}

int tr_trace_filter_add_rule(tr_trace_filter *f, const tr_trace_filter_rule *r, char *err,
                             size_t err_len) {
  return tr_trace_filter_string_add(&f->chain, r, err, err_len);
}

static int add_chain(tr_trace_filter *f,
                     const Perfetto__Protos__TraceConfig__TraceFilter__StringFilterChain *c,
                     char *err, size_t err_len) {
  for (size_t i = 0; c && i < c->n_rules; i++) {
    const Perfetto__Protos__TraceConfig__TraceFilter__StringFilterRule *in = c->rules[i];
    tr_trace_filter_rule r = {
        .policy = (int)in->policy,
        .regex = in->regex_pattern,
        .atrace_prefix = in->atrace_payload_starts_with,
        .name = in->name,
        .semantic_types = in->semantic_type,
        .n_semantic_types = in->n_semantic_type,
    };
    int rc = tr_trace_filter_add_rule(f, &r, err, err_len);
    if (rc != 0)
      return rc;
  }
  return 0;
}

#define FAIL(code, ...)                                                                           \
  do {                                                                                            \
    snprintf(err, err_len, __VA_ARGS__);                                                          \
    rc = code;                                                                                    \
    goto fail;                                                                                    \
  } while (0)

int tr_trace_filter_from_config(const Perfetto__Protos__TraceConfig__TraceFilter *cfg,
                                tr_trace_filter **out, char *err, size_t err_len) {
  tr_trace_filter *f = tr_trace_filter_new();
  int rc;
  *out = NULL;
  if (!f)
    return TR_ERR_NOMEM;
  if ((rc = add_chain(f, cfg->string_filter_chain, err, err_len)) != 0 ||
      (rc = add_chain(f, cfg->string_filter_chain_v54, err, err_len)) != 0)
    goto fail;
  ProtobufCBinaryData code = {0, NULL}; /* none: refused below, as traced refuses it */
  if (cfg->has_bytecode_v2 && cfg->bytecode_v2.len)
    code = cfg->bytecode_v2;
  else if (cfg->has_bytecode)
    code = cfg->bytecode;
  rc = tr_trace_filter_load(f, code.data, code.len, cfg->bytecode_overlay_v54.data,
                            cfg->has_bytecode_overlay_v54 ? cfg->bytecode_overlay_v54.len : 0);
  if (rc == TR_ERR_DECODE)
    FAIL(TR_ERR_CONFIG, "Trace filter bytecode invalid");
  if (rc != 0)
    goto fail;
  if (tr_trace_filter_set_root(f, 1) != 0) /* Trace.packet */
    FAIL(TR_ERR_CONFIG, "Failed to set filter root.");
  *out = f;
  return 0;
fail:
  tr_trace_filter_free(f);
  return rc;
}

/* ---- filtering ---- */

static void put_varint(tr_trace_filter *f, uint64_t v) { f->out_len += tr_varint_put(f->out + f->out_len, v); }

static void put_tag(tr_trace_filter *f, uint32_t field, uint32_t wire) {
  put_varint(f, (uint32_t)(field << 3) | wire); /* 32 bits, as traced computes it */
}

/* Reads one byte of a field's encoding: true when it completes a field (*wire, *value: its
 * wire type and its value, or its payload's length). Sets f->error on a bad encoding. */
static bool tokenize(tr_trace_filter *f, uint8_t c, uint32_t *wire, uint64_t *value) {
  tokenizer *t = &f->tok;
  if (t->state == TOK_FIXED) {
    t->fixed |= (uint64_t)c << t->fixed_shift;
    t->fixed_shift += 8;
    if (t->fixed_shift < t->fixed_bits)
      return false;
    *wire = t->fixed_bits == 32 ? TR_WIRE_FIXED32 : TR_WIRE_FIXED64;
    *value = t->fixed;
    t->state = TOK_TAG;
    t->fixed = 0;
    t->fixed_shift = t->fixed_bits = 0;
    return t->field != 0;
  }
  t->varint |= (uint64_t)(c & 0x7f) << t->shift;
  if (c & 0x80) {
    t->shift += 7;
    if (t->shift >= 64)
      f->error = true;
    return false;
  }
  uint64_t v = t->varint;
  t->varint = 0;
  t->shift = 0;
  switch (t->state) {
  case TOK_TAG:
    t->field = (uint32_t)(v >> 3);
    switch (v & 7u) {
    case TR_WIRE_VARINT: t->state = TOK_VARINT; break;
    case TR_WIRE_FIXED32: t->state = TOK_FIXED; t->fixed_bits = 32; break;
    case TR_WIRE_FIXED64: t->state = TOK_FIXED; t->fixed_bits = 64; break;
    case TR_WIRE_BYTES: t->state = TOK_LEN; break;
    default: f->error = true; break;
    }
    return false;
  case TOK_VARINT:
    t->state = TOK_TAG;
    *wire = TR_WIRE_VARINT;
    *value = v;
    return t->field != 0;
  default: /* TOK_LEN */
    if (v > MAX_LEN_DELIM) {
      f->error = true;
      return false;
    }
    t->state = TOK_TAG;
    *wire = TR_WIRE_BYTES;
    *value = v;
    return t->field != 0;
  }
}

static bool tokenizer_idle(const tokenizer *t) {
  return t->state == TOK_TAG && t->shift == 0 && t->fixed_shift == 0;
}

static void put_fixed(tr_trace_filter *f, uint64_t v, unsigned bytes) {
  for (unsigned i = 0; i < bytes; i++)
    f->out[f->out_len++] = (uint8_t)(v >> (8 * i));
}

/* A length-delimited field of the message `st`: true when it is a message to enter, described
 * in *enter (pushed once this byte is counted); else st skips its payload. */
static bool on_bytes(tr_trace_filter *f, level *st, uint32_t field, uint32_t len, level *enter) {
  uint32_t state = lookup(f, st->msg, field);
  bool allowed = state & ALLOWED;
  if (len > st->in_limit - st->in_bytes - 1) {
    f->error = true; /* longer than what is left of its message */
    return false;
  }
  if (allowed && is_nested(state) && len > 0) {
    put_tag(f, field, TR_WIRE_BYTES);
    memset(enter, 0, sizeof *enter);
    enter->size_at = f->out_len;
    put_varint(f, len); /* reserves the width; filled in when the message ends */
    enter->size_len = (unsigned)(f->out_len - enter->size_at);
    enter->msg = state & ~ALLOWED;
    enter->in_limit = len;
    enter->out_start = f->out_len;
    return true;
  }
  st->skip = len;
  st->action = ACT_DROP;
  if (!allowed)
    return false;
  put_tag(f, field, TR_WIRE_BYTES);
  put_varint(f, len);
  st->action = ACT_COPY;
  if (is_string(state)) {
    uint32_t k = state & ~ALLOWED;
    st->action = ACT_STRING;
    st->str_at = f->out_len;
    st->str_type = (k & KIND_TYPED) == KIND_TYPED && k != KIND_STRING ? k & TYPE_MASK : 0;
  }
  return false;
}

/* Writes v as exactly `width` varint bytes (padded with continuation bits). */
static void put_padded_varint(uint8_t *p, uint32_t v, unsigned width) {
  for (unsigned i = 0; i < width; i++, v >>= 7)
    p[i] = (uint8_t)((v & 0x7f) | (i + 1 < width ? 0x80 : 0));
}

static int one_byte(tr_trace_filter *f, uint8_t c) {
  level *st = &f->stack[f->depth - 1], enter;
  bool push = false;
  uint32_t wire;
  uint64_t value;

  if (st->skip > 0) {
    st->skip--;
    if (st->action != ACT_DROP)
      f->out[f->out_len++] = c;
    if (st->action == ACT_STRING && st->skip == 0)
      tr_trace_filter_string_apply(&f->chain, (char *)f->out + st->str_at,
                                   f->out_len - st->str_at, st->str_type);
  } else if (tokenize(f, c, &wire, &value)) {
    uint32_t field = f->tok.field, state = lookup(f, st->msg, field);
    bool simple = (state & ALLOWED) && (state & ~ALLOWED) == KIND_SIMPLE;
    if (wire == TR_WIRE_BYTES)
      push = on_bytes(f, st, field, (uint32_t)value, &enter);
    else if (simple) {
      put_tag(f, field, wire);
      if (wire == TR_WIRE_VARINT)
        put_varint(f, value);
      else
        put_fixed(f, value, wire == TR_WIRE_FIXED32 ? 4 : 8);
    }
  }
  if (f->error)
    return 0;
  st->in_bytes++;
  while (st->in_bytes >= st->in_limit) { /* the message ends here */
    uint32_t read = st->in_bytes;
    push = false;
    put_padded_varint(f->out + st->size_at, (uint32_t)(f->out_len - st->out_start), st->size_len);
    f->depth--;
    st = &f->stack[f->depth - 1];
    st->in_bytes += read;
    if (!tokenizer_idle(&f->tok)) {
      f->error = true; /* it ended inside a field */
      return 0;
    }
  }
  if (push) {
    if (f->depth == f->stack_cap) {
      size_t cap = 2 * f->stack_cap;
      level *n = realloc(f->stack, cap * sizeof *n);
      if (!n)
        return TR_ERR_NOMEM;
      f->stack = n;
      f->stack_cap = cap;
    }
    f->stack[f->depth++] = enter;
  }
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int tr_trace_filter_run(tr_trace_filter *f, const tr_trace_filter_slice *slices, size_t n,
                        uint8_t *out, size_t *out_len) {
  uint64_t start = now_ns(), total = 0;
  int rc = 0;

  *out_len = 0;
  for (size_t i = 0; i < n; i++)
    total += slices[i].len;
  f->stats.input_packets++;
  f->stats.input_bytes += total;
  if (!f->stack) {
    if (!(f->stack = malloc(16 * sizeof *f->stack)))
      return TR_ERR_NOMEM;
    f->stack_cap = 16;
  }
  memset(&f->tok, 0, sizeof f->tok);
  memset(f->stack, 0, 2 * sizeof *f->stack);
  f->stack[0].in_limit = UINT32_MAX; /* a sentinel, so the root's end never pops past it */
  f->stack[0].skip = UINT32_MAX;
  f->stack[1].in_limit = (uint32_t)total;
  f->stack[1].msg = f->root;
  f->depth = 2;
  f->out = out;
  f->out_len = 0;
  f->error = total >= UINT32_MAX;
  for (size_t i = 0; i < n && !f->error && rc == 0; i++)
    for (size_t j = 0; j < slices[i].len && !f->error && rc == 0; j++)
      rc = one_byte(f, slices[i].data[j]);
  if (rc == 0 && (f->error || f->depth != 1 || !tokenizer_idle(&f->tok) ||
                  f->stack[0].in_bytes != total))
    rc = TR_ERR_DECODE; /* also an empty message: its root never ends */
  if (rc == 0) {
    *out_len = f->out_len;
    f->stats.output_bytes += f->out_len;
  } else {
    f->stats.errors++;
  }
  f->stats.time_taken_ns += now_ns() - start;
  return rc;
}

void tr_trace_filter_get_stats(const tr_trace_filter *f, tr_trace_filter_stats *out) {
  *out = f->stats;
}

bool tr_trace_filter_string(tr_trace_filter *f, char *s, size_t len, uint32_t semantic_type) {
  return tr_trace_filter_string_apply(&f->chain, s, len, semantic_type);
}
