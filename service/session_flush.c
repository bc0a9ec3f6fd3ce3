/* session_flush.c: flushes of a session across hosts.
 *
 * One flush sends Command.flush to every producer that has a started instance of the session
 * (except those whose data sources all said no_flush, as traced skips them), and waits for one
 * FlushAck per (host, producer). It completes when all acked, or at the timeout: then every host
 * that still owes an ack is named in the log and counted (tr_host_stats.flushes_missed and the
 * session's per-host count, both in the trace's stats). A host whose link is down owes its acks
 * at once. Before sending, each host whose last clock probe is older than its probe period is
 * probed, so the timeline is fresh at the end of the data. Of a flush every producer answered,
 * the service's own part of the round trip is observed apart
 * (tr_session_flush_service_part_ns): the agents' and the network's stretch ends when the last
 * ack reaches the service's socket.
 *
 * This file alone keeps the session's flush bookkeeping (tr_session.flushes): the flushes in
 * flight, the counts for TraceStats and each host entry's missed flushes. */
#include "service/session_priv.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/clock/clock.h"
#include "service/hosts.h"

#define COMP "session"
#define MISSED_NAMED_MAX 8 /* hosts named in the log per flush; the rest counted */

#define NO_ACK SIZE_MAX

typedef struct pending_ack {
  size_t host_index;
  uint32_t producer_id;
  bool acked;
  size_t next_of_host; /* the next ack owed by the same host, or NO_ACK */
  size_t first_id, num_ids; /* its instances' ids in the flush's ids (while sending) */
} pending_ack;

typedef struct tr_flush_op tr_flush_op;

struct tr_session_flushes {
  tr_flush_op *ops;
  struct tr_session_flush_counts counts;
  uint64_t instances_examined; /* by the flushes' fan-outs (for the tests of their cost) */
  uint64_t *missed; /* [cap_missed], by host entry: flushes it did not answer in time */
  size_t cap_missed;
};

struct tr_flush_op {
  tr_session *s;
  tr_flush_op *next;
  uint64_t id;
  uv_timer_t timer;
  pending_ack *acks;
  size_t num_acks;
  size_t *first_of_host; /* [num_hosts]: each host's first ack, or NO_ACK (a chain per host) */
  size_t num_hosts;      /* host entries when the flush began: later ones owe nothing */
  size_t outstanding;    /* acks not yet acked nor settled as missed */
  tr_session_flush_cb cb;
  void *ud;
  bool done;
  bool missed; /* some host was counted as not answering */
  uint64_t started_ns; /* uv_hrtime() when it was sent */
  int64_t fanned_out_ns;   /* BOOTTIME when every command had been handed to the link */
  int64_t last_arrival_ns; /* BOOTTIME when the latest ack so far reached the socket; 0: none */
};

static void on_flush_closed(uv_handle_t *h) {
  tr_flush_op *f = h->data;
  free(f->acks);
  free(f->first_of_host);
  free(f);
}

static void unlink_flush(tr_flush_op *f) {
  for (tr_flush_op **p = &f->s->flushes->ops; *p; p = &(*p)->next)
    if (*p == f) {
      *p = f->next;
      break;
    }
  uv_close((uv_handle_t *)&f->timer, on_flush_closed);
}

static void complete(tr_flush_op *f, bool ok) {
  tr_session *s = f->s;
  tr_session_flush_cb cb = f->cb;
  void *ud = f->ud;
  if (f->done)
    return;
  f->done = true;
  if (f->num_acks > 0)
    tr_session_observe_flush(s, (double)(uv_hrtime() - f->started_ns) / 1e9);
  ok = ok && !f->missed;
  uv_timer_stop(&f->timer);
  if (ok) {
    s->flushes->counts.succeeded++;
    tr_session_add_event(s, TR_TW_ALL_DATA_SOURCES_FLUSHED);
  } else {
    s->flushes->counts.failed++;
  }
  if (s->duration_flushing || s->state >= TR_SESSION_STOPPING)
    s->flushes->counts.final_outcome = ok ? 1 : 2;
  unlink_flush(f);
  if (cb)
    cb(ud, ok);
}

static bool all_acked(const tr_flush_op *f) { return f->outstanding == 0; }

static void settle(tr_flush_op *f, size_t i) {
  if (!f->acks[i].acked) {
    f->acks[i].acked = true;
    f->outstanding--;
  }
}

/* Settles every ack the host still owes; true if there was one. */
static bool settle_host(tr_flush_op *f, size_t hi) {
  bool owed = false;
  if (hi >= f->num_hosts)
    return false;
  for (size_t i = f->first_of_host[hi]; i != NO_ACK; i = f->acks[i].next_of_host) {
    owed |= !f->acks[i].acked;
    settle(f, i);
  }
  return owed;
}

/* Counts every host that still owes an ack (each host once), and names the first
 * MISSED_NAMED_MAX in the log, then how many more: a fleet of silent hosts would write a line
 * each at every flush (10,000 a flush at 10,000 hosts) on the loop's thread. Acks are settled
 * host by host, so a host is counted at its first unsettled ack only. */
static void count_missed(tr_flush_op *f, size_t only_host, bool all_hosts) {
  tr_session *s = f->s;
  size_t counted = 0;
  for (size_t i = 0; i < f->num_acks; i++) {
    size_t hi = f->acks[i].host_index;
    if (f->acks[i].acked || (!all_hosts && hi != only_host) || !settle_host(f, hi))
      continue;
    f->missed = true;
    s->flushes->missed[hi]++;
    tr_hosts_count_flush_missed(s->hosts[hi].host);
    if (counted++ < MISSED_NAMED_MAX)
      TR_WARN(COMP, "session %llu: flush %llu: host %s did not answer%s",
              (unsigned long long)s->id, (unsigned long long)f->id, s->hosts[hi].host->name,
              s->hosts[hi].gone ? " (disconnected)" : " within the timeout");
  }
  if (counted > MISSED_NAMED_MAX)
    TR_WARN(COMP,
            "session %llu: flush %llu: %zu more hosts did not answer within the timeout (%zu in "
            "all; each host's count in `tracerelay status` and "
            "tracerelay_host_flushes_missed_total)",
            (unsigned long long)s->id, (unsigned long long)f->id, counted - MISSED_NAMED_MAX,
            counted);
}

static void on_flush_timeout(uv_timer_t *t) {
  tr_flush_op *f = t->data;
  count_missed(f, 0, true);
  complete(f, false);
}

/* The ack the host's producer owes, or NO_ACK. O(that host's producers). */
static size_t find_ack(const tr_flush_op *f, size_t hi, uint32_t producer_id) {
  if (hi >= f->num_hosts)
    return NO_ACK;
  for (size_t i = f->first_of_host[hi]; i != NO_ACK; i = f->acks[i].next_of_host)
    if (f->acks[i].producer_id == producer_id)
      return i;
  return NO_ACK;
}

/* Sends one flush command to the producer of ack a, for its instances' ids. */
static int send_flush(tr_flush_op *f, const pending_ack *a, uint64_t *ids, uint64_t flags) {
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__Flush fl = TRACERELAY__COMMAND__FLUSH__INIT;
  fl.has_flush_request_id = 1;
  fl.flush_request_id = f->id;
  fl.n_instance_ids = a->num_ids;
  fl.instance_ids = ids + a->first_id;
  fl.has_flags = 1;
  fl.flags = flags;
  cmd.has_producer_id = 1;
  cmd.producer_id = a->producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_FLUSH;
  cmd.flush = &fl;
  return tr_session_send(f->s, a->host_index, &cmd);
}

static bool flushed(const tr_ds_instance *in) {
  return in->state == TR_DS_STARTED && !in->no_flush;
}

/* One ack owed per (host, producer) with an instance to flush, and the instances' ids grouped
 * by ack (ids[a.first_id ...]): two passes over the instances, each O(its host's producers),
 * not one pass per producer (with 1,000 hosts, a million steps per flush). */
static void gather(tr_flush_op *f, size_t *ack_of, uint64_t *ids) {
  tr_session *s = f->s;
  for (size_t i = 0; i < s->num_instances; i++) {
    const tr_ds_instance *in = &s->instances[i];
    s->flushes->instances_examined++;
    if (!flushed(in))
      continue;
    size_t a = find_ack(f, in->host_index, in->producer_id);
    if (a == NO_ACK) {
      a = f->num_acks++;
      f->acks[a] = (pending_ack){.host_index = in->host_index, .producer_id = in->producer_id,
                                 .next_of_host = f->first_of_host[in->host_index]};
      f->first_of_host[in->host_index] = a;
      f->outstanding++;
    }
    f->acks[a].num_ids++;
    ack_of[i] = a;
  }
  for (size_t a = 0, at = 0; a < f->num_acks; at += f->acks[a++].num_ids) {
    f->acks[a].first_id = at;
    f->acks[a].num_ids = 0;
  }
  for (size_t i = 0; i < s->num_instances; i++) {
    s->flushes->instances_examined++;
    if (flushed(&s->instances[i])) {
      pending_ack *a = &f->acks[ack_of[i]];
      ids[a->first_id + a->num_ids++] = s->instances[i].id;
    }
  }
}

int tr_session_flush(tr_session *s, uint32_t timeout_ms, uint64_t flags, tr_session_flush_cb cb,
                     void *ud) {
  tr_flush_op *f = calloc(1, sizeof *f);
  if (!f)
    return TR_ERR_NOMEM;
  f->acks = calloc(s->num_instances + 1, sizeof *f->acks);
  f->first_of_host = malloc((s->num_hosts + 1) * sizeof *f->first_of_host);
  size_t *ack_of = malloc((s->num_instances + 1) * sizeof *ack_of);
  uint64_t *ids = malloc((s->num_instances + 1) * sizeof *ids);
  if (!f->acks || !f->first_of_host || !ack_of || !ids) {
    free(f->acks);
    free(f->first_of_host);
    free(f);
    free(ack_of);
    free(ids);
    return TR_ERR_NOMEM;
  }
  f->num_hosts = s->num_hosts;
  for (size_t h = 0; h < s->num_hosts; h++)
    f->first_of_host[h] = NO_ACK;
  f->s = s;
  f->id = tr_session_next_flush_id(s);
  f->cb = cb;
  f->ud = ud;
  f->started_ns = uv_hrtime();
  uv_timer_init(s->svc->loop, &f->timer);
  f->timer.data = f;
  f->next = s->flushes->ops;
  s->flushes->ops = f;
  s->flushes->counts.requested++;
  tr_session_add_event(s, TR_TW_FLUSH_STARTED);

  for (size_t h = 0; h < s->num_hosts; h++)
    if (!s->hosts[h].gone && !s->hosts[h].retired)
      s->svc->link->probe_clock(s->hosts[h].host);
  gather(f, ack_of, ids);
  /* A host that could not be asked owes all its acks at once: it is not asked again. */
  for (size_t a = 0; a < f->num_acks; a++)
    if (!f->acks[a].acked && send_flush(f, &f->acks[a], ids, flags) != 0)
      count_missed(f, f->acks[a].host_index, false);
  free(ack_of);
  free(ids);
  f->fanned_out_ns = (int64_t)tr_clock_boottime_ns();
  if (timeout_ms == 0)
    timeout_ms = s->flush_timeout_ms;
  if (all_acked(f)) {
    /* Nothing to wait for, or only hosts that could not be asked. */
    complete(f, true);
    return 0;
  }
  uv_timer_start(&f->timer, on_flush_timeout, timeout_ms, 0);
  return 0;
}

uint64_t tr_session_flush_service_part_ns(uint64_t total_ns, int64_t fanned_out_ns,
                                          int64_t last_arrival_ns) {
  if (fanned_out_ns <= 0 || last_arrival_ns <= fanned_out_ns)
    return total_ns;
  uint64_t theirs = (uint64_t)(last_arrival_ns - fanned_out_ns);
  return theirs < total_ns ? total_ns - theirs : 0;
}

void tr_session_flush_on_ack(tr_session *s, size_t host_index, const Tracerelay__FlushAck *ack,
                             int64_t arrived_ns) {
  for (tr_flush_op *f = s->flushes->ops; f; f = f->next) {
    if (f->id != ack->flush_request_id || f->done)
      continue;
    size_t i = find_ack(f, host_index, ack->producer_id);
    if (i != NO_ACK)
      settle(f, i);
    if (arrived_ns > f->last_arrival_ns)
      f->last_arrival_ns = arrived_ns;
    if (all_acked(f)) {
      if (!f->missed) {
        uint64_t part = tr_session_flush_service_part_ns(uv_hrtime() - f->started_ns,
                                                         f->fanned_out_ns, f->last_arrival_ns);
        tr_session_observe_flush_service_part(s, (double)part / 1e9);
      }
      complete(f, true);
    }
    return;
  }
}

void tr_session_flush_on_host_gone(tr_session *s, size_t host_index) {
  tr_flush_op *f = s->flushes->ops;
  while (f) {
    tr_flush_op *next = f->next;
    bool owed = false;
    if (host_index < f->num_hosts)
      for (size_t i = f->first_of_host[host_index]; i != NO_ACK; i = f->acks[i].next_of_host)
        owed |= !f->acks[i].acked;
    if (owed) {
      count_missed(f, host_index, false);
      if (all_acked(f))
        complete(f, false);
    }
    f = next;
  }
}

int tr_session_flush_new(tr_session_flushes **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : TR_ERR_NOMEM;
}

/* Room for one more host entry; a failed call leaves the room as it was. */
int tr_session_flush_add_host(tr_session *s) {
  tr_session_flushes *fl = s->flushes;
  size_t need = s->num_hosts + 1;
  uint64_t *n;
  if (fl->cap_missed >= need)
    return 0;
  n = realloc(fl->missed, need * sizeof *n);
  if (!n)
    return TR_ERR_NOMEM;
  memset(n + fl->cap_missed, 0, (need - fl->cap_missed) * sizeof *n);
  fl->missed = n;
  fl->cap_missed = need;
  return 0;
}

int tr_session_flush_clone(const tr_session *src, tr_session *dst, bool flush_ok) {
  tr_session_flushes *fl = dst->flushes;
  size_t n = src->num_hosts;
  if (n > fl->cap_missed) {
    uint64_t *m = realloc(fl->missed, n * sizeof *m);
    if (!m)
      return TR_ERR_NOMEM;
    fl->missed = m;
    fl->cap_missed = n;
  }
  if (n)
    memcpy(fl->missed, src->flushes->missed, n * sizeof *fl->missed);
  fl->counts = src->flushes->counts;
  fl->counts.final_outcome = flush_ok ? 1 : 2;
  return 0;
}

void tr_session_flush_counts(const tr_session *s, struct tr_session_flush_counts *out) {
  *out = s->flushes->counts;
}

uint64_t tr_session_flush_examined(const tr_session *s) {
  return s->flushes->instances_examined;
}

uint64_t tr_session_flush_missed(const tr_session *s, size_t host_index) {
  return s->flushes->missed[host_index];
}

void tr_session_flush_free(tr_session_flushes *fl) {
  if (!fl)
    return;
  while (fl->ops) {
    tr_flush_op *f = fl->ops;
    f->done = true;
    uv_timer_stop(&f->timer);
    unlink_flush(f);
    if (f->cb)
      f->cb(f->ud, false); /* the caller learns its flush will never complete */
  }
  free(fl->missed);
  free(fl);
}
