/* config_file.c: `key = value` config files turned into flags (see config_file.h). */
#include "relay/daemon/config_file.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t err_len,
                                                      const char *fmt, ...) {
  va_list ap;
  if (err && err_len) {
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return TR_ERR_CONFIG;
}

static bool blank(char c) { return c == ' ' || c == '\t'; }

static bool key_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (!first && c == '-');
}

void tr_config_file_free(tr_config_file *cf) {
  if (!cf)
    return;
  free(cf->entries);
  free(cf->storage);
  memset(cf, 0, sizeof *cf);
}

/* Parses one line [p, end) (no line terminator) into *e, with its strings written into
 * storage at *used. Returns 0 for an entry, 1 for a blank or comment line, or an error. */
static int parse_line(const char *p, const char *end, unsigned line, char *storage, size_t *used,
                      tr_config_entry *e, char *err, size_t err_len) {
  while (p < end && blank(*p))
    p++;
  while (end > p && blank(end[-1]))
    end--;
  if (p == end || *p == '#')
    return 1;
  const char *k = p;
  while (p < end && key_char(*p, p == k))
    p++;
  size_t klen = (size_t)(p - k);
  if (klen == 0)
    return fail(err, err_len, "line %u: a key (a long flag name such as cert) must start the line",
                line);
  if (klen > TR_CONFIG_MAX_KEY)
    return fail(err, err_len, "line %u: key longer than %u characters", line, TR_CONFIG_MAX_KEY);
  if ((klen == 6 && !memcmp(k, "config", 6)) || (klen == 4 && !memcmp(k, "help", 4)))
    return fail(err, err_len, "line %u: '%.*s' cannot be set in a config file", line, (int)klen,
                k);
  const char *v = NULL, *vend = NULL;
  while (p < end && blank(*p))
    p++;
  if (p < end) {
    if (*p != '=')
      return fail(err, err_len,
                  "line %u: expected '=' after '%.*s' (keys are flag names: lowercase letters, "
                  "digits and '-')",
                  line, (int)klen, k);
    p++;
    while (p < end && blank(*p))
      p++;
    v = p;
    vend = end;
    if (vend - v >= 2 && *v == '"' && vend[-1] == '"') {
      v++;
      vend--;
    } else if (v < vend && (*v == '"' || vend[-1] == '"')) {
      return fail(err, err_len, "line %u: unbalanced double quote in the value of '%.*s'", line,
                  (int)klen, k);
    }
    if (v == vend && vend == end)
      return fail(err, err_len,
                  "line %u: '%.*s =' has no value (write the key alone for a flag without one, "
                  "or \"\" for an empty value)",
                  line, (int)klen, k);
  }
  e->line = line;
  e->key = storage + *used;
  memcpy(storage + *used, k, klen);
  *used += klen;
  storage[(*used)++] = '\0';
  e->value = NULL;
  if (v) {
    e->value = storage + *used;
    memcpy(storage + *used, v, (size_t)(vend - v));
    *used += (size_t)(vend - v);
    storage[(*used)++] = '\0';
  }
  return 0;
}

int tr_config_file_parse(const char *text, size_t len, tr_config_file *out, char *err,
                         size_t err_len) {
  memset(out, 0, sizeof *out);
  if (err && err_len)
    err[0] = '\0';
  if (len > TR_CONFIG_MAX_BYTES)
    return fail(err, err_len, "larger than %u bytes", TR_CONFIG_MAX_BYTES);
  /* Each entry's strings fit in its line's bytes plus two NULs. */
  char *storage = malloc(len + 2 * TR_CONFIG_MAX_ENTRIES + 1);
  tr_config_entry *entries = NULL;
  size_t used = 0, n = 0, cap = 0;
  unsigned line = 0;
  int rc = 0;
  if (!storage)
    return TR_ERR_NOMEM;
  for (size_t pos = 0; pos < len;) {
    size_t start = pos;
    while (pos < len && text[pos] != '\n')
      pos++;
    size_t stop = pos;
    if (pos < len)
      pos++; /* the LF */
    if (stop > start && text[stop - 1] == '\r')
      stop--;
    line++;
    if (stop - start > TR_CONFIG_MAX_LINE) {
      rc = fail(err, err_len, "line %u: longer than %u bytes", line, TR_CONFIG_MAX_LINE);
      goto fail;
    }
    for (size_t i = start; i < stop; i++) {
      unsigned char c = (unsigned char)text[i];
      if ((c < 0x20 && c != '\t') || c == 0x7f) {
        rc = fail(err, err_len, "line %u: control character 0x%02x", line, c);
        goto fail;
      }
    }
    tr_config_entry e;
    rc = parse_line(text + start, text + stop, line, storage, &used, &e, err, err_len);
    if (rc < 0)
      goto fail;
    if (rc == 1) {
      rc = 0;
      continue;
    }
    if (n == TR_CONFIG_MAX_ENTRIES) {
      rc = fail(err, err_len, "line %u: more than %u settings", line, TR_CONFIG_MAX_ENTRIES);
      goto fail;
    }
    if (n == cap) {
      size_t ncap = cap ? cap * 2 : 16;
      tr_config_entry *ne = realloc(entries, ncap * sizeof *ne);
      if (!ne) {
        rc = TR_ERR_NOMEM;
        goto fail;
      }
      entries = ne;
      cap = ncap;
    }
    entries[n++] = e;
  }
  out->entries = entries;
  out->num_entries = n;
  out->storage = storage;
  return 0;
fail:
  free(entries);
  free(storage);
  return rc;
}

int tr_config_file_load(const char *path, tr_config_file *out, char *err, size_t err_len) {
  char msg[256];
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    snprintf(err, err_len, "cannot read %s: %s", path, strerror(e));
    return TR_ERR_SYS(e);
  }
  char *text = malloc(TR_CONFIG_MAX_BYTES + 1);
  if (!text) {
    fclose(f);
    return TR_ERR_NOMEM;
  }
  size_t len = fread(text, 1, TR_CONFIG_MAX_BYTES + 1, f);
  int rd_err = ferror(f);
  fclose(f);
  int rc;
  if (rd_err) {
    snprintf(err, err_len, "cannot read %s", path);
    rc = TR_ERR_SYS(EIO);
  } else if (len > TR_CONFIG_MAX_BYTES) {
    snprintf(err, err_len, "%s: larger than %u bytes", path, TR_CONFIG_MAX_BYTES);
    rc = TR_ERR_TOO_BIG;
  } else if ((rc = tr_config_file_parse(text, len, out, msg, sizeof msg)) < 0) {
    snprintf(err, err_len, "%s: %s", path, rc == TR_ERR_NOMEM ? tr_strerror(rc) : msg);
  }
  free(text);
  return rc;
}

int tr_config_file_check(const tr_config_file *cf, const struct option *longopts, char *err,
                         size_t err_len) {
  for (size_t i = 0; i < cf->num_entries; i++) {
    const tr_config_entry *e = &cf->entries[i];
    const struct option *o = longopts;
    while (o->name && strcmp(o->name, e->key) != 0)
      o++;
    if (!o->name)
      return fail(err, err_len, "line %u: unknown key '%s' (keys are the long flags of --help)",
                  e->line, e->key);
    if (o->has_arg == required_argument && !e->value)
      return fail(err, err_len, "line %u: '%s' needs a value: %s = VALUE", e->line, e->key,
                  e->key);
    if (o->has_arg == no_argument && e->value)
      return fail(err, err_len, "line %u: '%s' takes no value: write the key alone", e->line,
                  e->key);
  }
  return 0;
}

int tr_config_file_find_arg(int argc, char *const *argv, const char **path) {
  *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--"))
      break;
    if (!strcmp(argv[i], "--config")) {
      if (i + 1 >= argc)
        return TR_ERR_INVAL;
      *path = argv[++i];
    } else if (!strncmp(argv[i], "--config=", 9)) {
      *path = argv[i] + 9;
    }
  }
  return 0;
}

int tr_config_file_argv(const tr_config_file *cf, int argc, char *const *argv, int *out_argc,
                        char ***out_argv, int *first_cmdline) {
  size_t n = cf->num_entries + (size_t)(argc > 0 ? argc : 1);
  size_t bytes = (n + 1) * sizeof(char *);
  for (size_t i = 0; i < cf->num_entries; i++)
    bytes += 3 + strlen(cf->entries[i].key) +
             (cf->entries[i].value ? 1 + strlen(cf->entries[i].value) : 0);
  for (int i = 0; i < argc; i++)
    bytes += strlen(argv[i]) + 1;
  char **av = malloc(bytes + 1);
  if (!av)
    return TR_ERR_NOMEM;
  char *s = (char *)(av + n + 1);
  size_t k = 0;
  av[k++] = s;
  s = stpcpy(s, argc > 0 ? argv[0] : "") + 1;
  for (size_t i = 0; i < cf->num_entries; i++) {
    const tr_config_entry *e = &cf->entries[i];
    av[k++] = s;
    s = stpcpy(stpcpy(s, "--"), e->key);
    if (e->value)
      s = stpcpy(stpcpy(s, "="), e->value);
    s++;
  }
  for (int i = 1; i < argc; i++) {
    av[k++] = s;
    s = stpcpy(s, argv[i]) + 1;
  }
  av[k] = NULL;
  *out_argc = (int)k;
  *out_argv = av;
  *first_cmdline = (int)cf->num_entries + 1;
  return 0;
}

int tr_config_file_args(const char *prog, int argc, char *const *argv, tr_config_file *cf,
                        int *out_argc, char ***out_argv) {
  const char *path;
  char err[512];
  int first, rc;
  memset(cf, 0, sizeof *cf);
  *out_argc = argc;
  *out_argv = NULL;
  if (tr_config_file_find_arg(argc, argv, &path) < 0) {
    fprintf(stderr, "%s: --config needs a FILE (see --help)\n", prog);
    return TR_ERR_CONFIG;
  }
  if (!path)
    return 0;
  if ((rc = tr_config_file_load(path, cf, err, sizeof err)) < 0) {
    fprintf(stderr, "%s: config file %s\n", prog, rc == TR_ERR_NOMEM ? tr_strerror(rc) : err);
    return rc == TR_ERR_NOMEM ? rc : TR_ERR_CONFIG;
  }
  if ((rc = tr_config_file_argv(cf, argc, argv, out_argc, out_argv, &first)) < 0) {
    fprintf(stderr, "%s: %s\n", prog, tr_strerror(rc));
    tr_config_file_free(cf);
    return rc;
  }
  return 0;
}
