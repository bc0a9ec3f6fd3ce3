/* record_config.c: loading a TraceConfig file and applying `tracerelay record`'s short flags.
 *
 * Everything added to the config is malloc'd in protobuf-c's unpacked layout, so the caller
 * frees the result with protobuf_c_message_free_unpacked() whatever its origin. */
#include "tools/tracerelay/record_config.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "relay/reading/pbtxt.h"
#include "relay/base/tr_error.h"

typedef Perfetto__Protos__TraceConfig TraceConfig;
typedef Perfetto__Protos__TraceConfig__BufferConfig BufferConfig;
typedef Perfetto__Protos__TraceConfig__DataSource DataSource;
typedef Perfetto__Protos__DataSourceConfig DataSourceConfig;

static bool has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* Binary protobuf always holds tags and lengths below 0x20; hand-written text never does,
 * apart from whitespace. */
static bool looks_like_text(const uint8_t *data, size_t len) {
  for (size_t i = 0; i < len; i++)
    if (data[i] < 0x20 && data[i] != '\n' && data[i] != '\r' && data[i] != '\t')
      return false;
  return true;
}

/* path "-" is standard input. */
static int read_whole_file(const char *path, uint8_t **out, size_t *len, char *err,
                           size_t errlen) {
  bool std_in = strcmp(path, "-") == 0;
  FILE *f = std_in ? stdin : fopen(path, "rb");
  if (!f) {
    snprintf(err, errlen, "cannot open config %s: %s", path, strerror(errno));
    return TR_ERR_SYS(errno);
  }
  /* One byte over the cap tells "too big" from "exactly at the cap". */
  uint8_t *buf = malloc(TR_PBTXT_MAX_INPUT + 1);
  if (!buf) {
    if (!std_in)
      fclose(f);
    snprintf(err, errlen, "out of memory reading %s", path);
    return TR_ERR_NOMEM;
  }
  size_t n = fread(buf, 1, TR_PBTXT_MAX_INPUT + 1, f);
  int failed = ferror(f);
  if (!std_in)
    fclose(f);
  if (failed || n > TR_PBTXT_MAX_INPUT) {
    free(buf);
    snprintf(err, errlen, failed ? "cannot read config %s" : "config %s is over %u bytes", path,
             TR_PBTXT_MAX_INPUT);
    return failed ? TR_ERR_SYS(EIO) : TR_ERR_TOO_BIG;
  }
  *out = buf;
  *len = n;
  return 0;
}

int record_config_load(const char *path, bool force_text, TraceConfig **out, char *err,
                       size_t errlen) {
  uint8_t *data = NULL;
  size_t len = 0;
  int rc = read_whole_file(path, &data, &len, err, errlen);
  if (rc < 0)
    return rc;
  if (strcmp(path, "-") == 0)
    path = "<stdin>"; /* for messages */
  bool text;
  if (force_text)
    text = true;
  else if (has_suffix(path, ".pbtxt") || has_suffix(path, ".txt") || has_suffix(path, ".textproto"))
    text = true;
  else if (has_suffix(path, ".pb") || has_suffix(path, ".bin"))
    text = false;
  else
    text = looks_like_text(data, len);

  ProtobufCMessage *m = NULL;
  if (text) {
    tr_pbtxt_error perr;
    rc = tr_pbtxt_parse(&perfetto__protos__trace_config__descriptor, (const char *)data, len,
                        path, &m, &perr);
    if (rc < 0)
      snprintf(err, errlen, "%s", perr.msg);
  } else {
    m = protobuf_c_message_unpack(&perfetto__protos__trace_config__descriptor, NULL, len, data);
    if (!m) {
      rc = TR_ERR_DECODE;
      snprintf(err, errlen, "%s is not a binary TraceConfig (name text configs *.pbtxt)", path);
    }
  }
  free(data);
  *out = (TraceConfig *)m;
  return rc;
}

TraceConfig *record_config_new(void) {
  TraceConfig *cfg = malloc(sizeof *cfg);
  if (cfg)
    perfetto__protos__trace_config__init(cfg);
  return cfg;
}

/* Appends a pointer to a repeated field's array (protobuf-c layout: T **array, size_t n). */
static int append(void *array_ptr, size_t *n, void *item) {
  void **array = *(void ***)array_ptr;
  void **grown = realloc(array, (*n + 1) * sizeof *grown);
  if (!grown)
    return TR_ERR_NOMEM;
  grown[(*n)++] = item;
  *(void ***)array_ptr = grown;
  return 0;
}

static int add_buffer(TraceConfig *cfg) {
  BufferConfig *b = malloc(sizeof *b);
  if (!b)
    return TR_ERR_NOMEM;
  perfetto__protos__trace_config__buffer_config__init(b);
  b->has_size_kb = true;
  b->size_kb = RECORD_DEFAULT_BUFFER_KB;
  int rc = append(&cfg->buffers, &cfg->n_buffers, b);
  if (rc < 0)
    free(b);
  return rc;
}

static bool has_data_source(const TraceConfig *cfg, const char *name) {
  for (size_t i = 0; i < cfg->n_data_sources; i++) {
    const DataSourceConfig *c = cfg->data_sources[i]->config;
    if (c && c->name && strcmp(c->name, name) == 0)
      return true;
  }
  return false;
}

static int add_data_source(TraceConfig *cfg, const char *name) {
  DataSource *ds = malloc(sizeof *ds);
  DataSourceConfig *c = malloc(sizeof *c);
  char *copy = strdup(name);
  if (!ds || !c || !copy)
    goto fail;
  perfetto__protos__trace_config__data_source__init(ds);
  perfetto__protos__data_source_config__init(c);
  c->name = copy;
  ds->config = c;
  if (append(&cfg->data_sources, &cfg->n_data_sources, ds) == 0)
    return 0;
  protobuf_c_message_free_unpacked(&ds->base, NULL);
  return TR_ERR_NOMEM;
fail:
  free(copy);
  free(c);
  free(ds);
  return TR_ERR_NOMEM;
}

/* Replaces a data source's machine_name_filter with the names in a comma-separated list. */
static int set_machines(DataSource *ds, const char *list) {
  for (size_t i = 0; i < ds->n_machine_name_filter; i++)
    free(ds->machine_name_filter[i]);
  free(ds->machine_name_filter);
  ds->machine_name_filter = NULL;
  ds->n_machine_name_filter = 0;
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n > 0) {
      char *name = strndup(p, n);
      if (!name || append(&ds->machine_name_filter, &ds->n_machine_name_filter, name) < 0) {
        free(name);
        return TR_ERR_NOMEM;
      }
    }
    p += n + (p[n] == ',');
  }
  return 0;
}

int record_config_apply(TraceConfig *cfg, const record_overrides *o, char *err, size_t errlen) {
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < o->n_data_sources; i++)
    if (!has_data_source(cfg, o->data_sources[i]))
      rc = add_data_source(cfg, o->data_sources[i]);
  if (rc == 0 && cfg->n_buffers == 0)
    rc = add_buffer(cfg);
  if (rc < 0) {
    snprintf(err, errlen, "out of memory building the config");
    return rc;
  }
  if (o->machines) {
    if (o->machines[strspn(o->machines, ",")] == '\0') {
      snprintf(err, errlen, "--machines needs at least one machine name");
      return TR_ERR_CONFIG;
    }
    for (size_t i = 0; i < cfg->n_data_sources; i++)
      if ((rc = set_machines(cfg->data_sources[i], o->machines)) < 0) {
        snprintf(err, errlen, "out of memory building the config");
        return rc;
      }
  }
  for (size_t i = 0; i < cfg->n_buffers; i++) {
    if (o->buffer_kb >= 0) {
      cfg->buffers[i]->has_size_kb = true;
      cfg->buffers[i]->size_kb = (uint32_t)o->buffer_kb;
    }
    if (o->fill_policy) {
      cfg->buffers[i]->has_fill_policy = true;
      cfg->buffers[i]->fill_policy = o->fill_policy;
    }
  }
  if (o->duration_ms >= 0) {
    cfg->has_duration_ms = true;
    cfg->duration_ms = (uint32_t)o->duration_ms;
  }
  if (o->flush_period_ms >= 0) {
    cfg->has_flush_period_ms = true;
    cfg->flush_period_ms = (uint32_t)o->flush_period_ms;
  }
  if (cfg->n_data_sources == 0) {
    snprintf(err, errlen, "nothing to record: the config has no data sources "
                          "(add --data-source NAME, e.g. --data-source track_event)");
    return TR_ERR_CONFIG;
  }
  return 0;
}

/* A number followed by a unit from the table; returns value * multiplier, or -1. */
struct unit {
  const char *name;
  int64_t mult;
};

static int64_t parse_with_units(const char *s, const struct unit *units, size_t n_units,
                                int64_t bare_mult, int64_t max) {
  char *end;
  errno = 0;
  if (*s < '0' || *s > '9')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno)
    return -1;
  int64_t mult = *end ? -1 : bare_mult;
  for (size_t i = 0; i < n_units && mult < 0; i++)
    if (strcasecmp(end, units[i].name) == 0)
      mult = units[i].mult;
  if (mult < 0 || v > (unsigned long long)(max / mult))
    return -1;
  return (int64_t)v * mult;
}

int64_t record_parse_duration_ms(const char *s, int64_t bare_ms) {
  static const struct unit units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
  return parse_with_units(s, units, 4, bare_ms, UINT32_MAX);
}

int64_t record_parse_size_kb(const char *s) {
  static const struct unit units[] = {{"k", 1}, {"kb", 1}, {"m", 1024}, {"mb", 1024},
                                      {"g", 1 << 20}, {"gb", 1 << 20}};
  return parse_with_units(s, units, 6, 1, UINT32_MAX);
}
