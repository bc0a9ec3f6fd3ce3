/* trace_bounds.c: the hosts' clock error bound tracks read back from a trace (trace_bounds.h). */
#include "relay/reading/trace_bounds.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "relay/trace/trace_writer.h"

static struct tr_trace_bound_track *by_uuid(const struct tr_trace_bounds *b, uint64_t uuid,
                                            bool host_track) {
  for (size_t i = 0; i < b->n_tracks; i++)
    if ((host_track ? b->tracks[i].host_uuid : b->tracks[i].uuid) == uuid)
      return &b->tracks[i];
  return NULL;
}

static int grow(void **arr, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t n = *cap ? *cap * 2 : 8;
  void *p = realloc(*arr, n * elem);
  if (p == NULL)
    return TR_ERR_NOMEM;
  *arr = p;
  *cap = n;
  return 0;
}

/* The host named by `name` without its prefix and suffix, into host; false if it does not fit. */
static bool host_of_name(const char *name, const char *prefix, const char *suffix, char *host,
                         size_t cap) {
  size_t len = strlen(name), plen = strlen(prefix), slen = strlen(suffix);
  if (len <= plen + slen || len - plen - slen >= cap || strncmp(name, prefix, plen) != 0 ||
      strcmp(name + len - slen, suffix) != 0)
    return false;
  memcpy(host, name + plen, len - plen - slen);
  host[len - plen - slen] = '\0';
  return true;
}

static struct tr_trace_bound_track *of_host(struct tr_trace_bounds *b, const char *host) {
  for (size_t i = 0; i < b->n_tracks; i++)
    if (strcmp(b->tracks[i].host, host) == 0)
      return &b->tracks[i];
  if (grow((void **)&b->tracks, &b->cap_tracks, b->n_tracks + 1, sizeof *b->tracks) != 0)
    return NULL;
  struct tr_trace_bound_track *t = &b->tracks[b->n_tracks++];
  memset(t, 0, sizeof *t);
  snprintf(t->host, sizeof t->host, "%s", host);
  return t;
}

int tr_trace_bounds_add_track(struct tr_trace_bounds *b,
                              const Perfetto__Protos__TrackDescriptor *td) {
  char host[TR_TRACE_BOUNDS_NAME_MAX];
  struct tr_trace_bound_track *t;
  bool counter = td->counter != NULL;
  if (!td->has_uuid || td->uuid == 0 || by_uuid(b, td->uuid, !counter) ||
      td->static_or_dynamic_name_case !=
          PERFETTO__PROTOS__TRACK_DESCRIPTOR__STATIC_OR_DYNAMIC_NAME_NAME ||
      !td->name)
    return 0;
  if (counter ? !host_of_name(td->name, "", TR_TRACE_WRITER_BOUND_TRACK_SUFFIX, host, sizeof host)
                      || td->uuid != tr_trace_writer_bound_track_uuid(host)
              : !host_of_name(td->name, "host ", "", host, sizeof host) ||
                    td->uuid != tr_trace_writer_host_track_uuid(host))
    return 0;
  if ((t = of_host(b, host)) == NULL)
    return TR_ERR_NOMEM;
  if (counter)
    t->uuid = td->uuid;
  else
    t->host_uuid = td->uuid;
  return 0;
}

static void add_mark(struct tr_trace_bound_track *t, uint64_t ts, const char *name) {
  t->marks_total++;
  if (t->n_marks == TR_TRACE_BOUNDS_MAX_MARKS)
    return;
  t->marks[t->n_marks].ts = ts;
  snprintf(t->marks[t->n_marks++].name, sizeof t->marks[0].name, "%s", name);
}

int tr_trace_bounds_add_event(struct tr_trace_bounds *b, uint64_t ts,
                              const Perfetto__Protos__TrackEvent *te) {
  struct tr_trace_bound_track *t;
  double v;
  if (!te->has_track_uuid || te->track_uuid == 0)
    return 0;
  if (te->type == PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_INSTANT &&
      te->name_field_case == PERFETTO__PROTOS__TRACK_EVENT__NAME_FIELD_NAME && te->name &&
      (t = by_uuid(b, te->track_uuid, true)) != NULL) {
    add_mark(t, ts, te->name);
    return 0;
  }
  if ((t = by_uuid(b, te->track_uuid, false)) == NULL ||
      te->type != PERFETTO__PROTOS__TRACK_EVENT__TYPE__TYPE_COUNTER)
    return 0;
  if (te->counter_value_field_case ==
      PERFETTO__PROTOS__TRACK_EVENT__COUNTER_VALUE_FIELD_DOUBLE_COUNTER_VALUE)
    v = te->double_counter_value;
  else if (te->counter_value_field_case ==
           PERFETTO__PROTOS__TRACK_EVENT__COUNTER_VALUE_FIELD_COUNTER_VALUE)
    v = (double)te->counter_value;
  else
    return 0;
  if (grow((void **)&t->samples, &t->cap_samples, t->n_samples + 1, sizeof *t->samples) != 0)
    return TR_ERR_NOMEM;
  t->samples[t->n_samples++] = (struct tr_trace_bound_sample){.ts = ts, .us = v};
  if (v > t->max_us)
    t->max_us = v;
  return 0;
}

const struct tr_trace_bound_track *tr_trace_bounds_find(const struct tr_trace_bounds *b,
                                                        const char *host) {
  for (size_t i = 0; i < b->n_tracks; i++)
    if (strcmp(b->tracks[i].host, host) == 0)
      return &b->tracks[i];
  return NULL;
}

double tr_trace_bounds_at(const struct tr_trace_bound_track *t, uint64_t ts) {
  size_t lo = 0, hi = t->n_samples; /* first sample after ts */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->samples[mid].ts <= ts)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo ? t->samples[lo - 1].us : -1;
}

void tr_trace_bounds_free(struct tr_trace_bounds *b) {
  for (size_t i = 0; i < b->n_tracks; i++)
    free(b->tracks[i].samples);
  free(b->tracks);
  memset(b, 0, sizeof *b);
}
