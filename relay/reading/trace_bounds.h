/* trace_bounds.h: reads back the tracks the service writes per host (tr_trace_writer_host_tracks):
 * the clock error bound counter track and the samples on it, and the host track with its link
 * marks (instants such as "disconnected"). Used by
 * the trace resolver (relay/reading/trace_inspect.h) and so by `tracerelay inspect` and the timeline
 * checker, which compares each event's true error with the bound shown at its instant.
 *
 * A track counts as a host's bound track only when its descriptor is a counter track named
 * "<host> clock error bound (us)" whose uuid is tr_trace_writer_bound_track_uuid(<host>), and
 * the caller gives only the service's own packets (trusted sequence 1, which the service never
 * hands to a producer), so no producer can pass a counter of its own off as a host's bound.
 * The same holds for the host track, "host <host>" with uuid tr_trace_writer_host_track_uuid.
 * Samples are the counters on such a track, at their packet's timestamp, which for the
 * service's own packets is the trace clock (the service's BOOTTIME). Samples of a host come in
 * time order (the service writes them along its clock mapping); tr_trace_bounds_at relies on it.
 * Cost: O(tracks) per track event (a handful of hosts), O(log samples) per lookup. */
#ifndef TR_TRACE_BOUNDS_H
#define TR_TRACE_BOUNDS_H

#include <stddef.h>
#include <stdint.h>

#include "perfetto/trace/track_event/track_descriptor.pb-c.h"
#include "perfetto/trace/track_event/track_event.pb-c.h"

#define TR_TRACE_BOUNDS_NAME_MAX 96

struct tr_trace_bound_sample {
  uint64_t ts;
  double us;
};

#define TR_TRACE_BOUNDS_MAX_MARKS 16

struct tr_trace_host_mark {
  uint64_t ts;
  char name[32];
};

struct tr_trace_bound_track {
  char host[TR_TRACE_BOUNDS_NAME_MAX];
  uint64_t uuid;      /* of the bound track; 0 until its descriptor was seen */
  uint64_t host_uuid; /* of the host track; 0 until its descriptor was seen */
  struct tr_trace_host_mark marks[TR_TRACE_BOUNDS_MAX_MARKS]; /* the first ones */
  size_t n_marks;
  uint64_t marks_total;
  struct tr_trace_bound_sample *samples;
  size_t n_samples, cap_samples;
  double max_us;
};

struct tr_trace_bounds {
  struct tr_trace_bound_track *tracks;
  size_t n_tracks, cap_tracks;
};

/* A TrackDescriptor of the trace: noted when it is a host's bound or host track. 0 or
 * TR_ERR_NOMEM. */
int tr_trace_bounds_add_track(struct tr_trace_bounds *b, const Perfetto__Protos__TrackDescriptor *td);
/* A TrackEvent at ts: a sample when it is a counter on a bound track, a mark when it is a named
 * instant on a host track. 0 or TR_ERR_NOMEM. */
int tr_trace_bounds_add_event(struct tr_trace_bounds *b, uint64_t ts,
                              const Perfetto__Protos__TrackEvent *te);
/* The host's tracks, or NULL. */
const struct tr_trace_bound_track *tr_trace_bounds_find(const struct tr_trace_bounds *b,
                                                        const char *host);
/* The value shown at ts (the last sample at or before it), in us; -1 before the first sample. */
double tr_trace_bounds_at(const struct tr_trace_bound_track *t, uint64_t ts);
void tr_trace_bounds_free(struct tr_trace_bounds *b);

#endif
