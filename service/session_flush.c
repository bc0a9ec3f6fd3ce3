/* session_flush.c: flushes of a session across hosts.
 *
 * One flush sends Command.flush to every producer that has a started instance of the session
 * (except those whose data sources all said no_flush, as traced skips them), and waits for one
 * FlushAck per (host, producer). It completes when all acked, or at the timeout: then every host
 * that still owes an ack is named in the log and counted (tr_host_stats.flushes_missed and the
 * session's per-host count, both in the trace's stats). A host whose link is down owes its acks
 * at once. Before sending, each host whose last clock probe is older than its probe period is
 * probed, so the timeline is fresh at the end of the data.
 *
 * This file alone keeps the session's flush bookkeeping (tr_session.flushes): the flushes in
 * flight, the counts for TraceStats and each host entry's missed flushes. */
#include "service/session_priv.h"

#include <stdlib.h>
#include <string.h>

#include "relay/log.h"
#include "relay/tr_error.h"
#include "service/hosts.h"

#define COMP "session"

typedef struct pending_ack {
  size_t host_index;
  uint32_t producer_id;
  bool acked;
} pending_ack;

typedef struct tr_flush_op tr_flush_op;

struct tr_session_flushes {
  tr_flush_op *ops;
  struct tr_session_flush_counts counts;
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
  tr_session_flush_cb cb;
  void *ud;
  bool done;
  bool missed; /* some host was counted as not answering */
  uint64_t started_ns; /* uv_hrtime() when it was sent */
};

static void on_flush_closed(uv_handle_t *h) {
  tr_flush_op *f = h->data;
  free(f->acks);
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

static bool all_acked(const tr_flush_op *f) {
  for (size_t i = 0; i < f->num_acks; i++)
    if (!f->acks[i].acked)
      return false;
  return true;
}

/* Counts and names every host that still owes an ack (each host once). */
static void count_missed(tr_flush_op *f, size_t only_host, bool all_hosts) {
  tr_session *s = f->s;
  for (size_t i = 0; i < f->num_acks; i++) {
    size_t hi = f->acks[i].host_index;
    bool seen = false;
    if (f->acks[i].acked || (!all_hosts && hi != only_host))
      continue;
    for (size_t j = 0; j < i && !seen; j++)
      seen = f->acks[j].host_index == hi && !f->acks[j].acked;
    for (size_t j = i; j < f->num_acks; j++)
      if (f->acks[j].host_index == hi)
        f->acks[j].acked = true; /* settled: missed */
    if (seen)
      continue;
    f->missed = true;
    s->flushes->missed[hi]++;
    tr_hosts_count_flush_missed(s->hosts[hi].host);
    TR_WARN(COMP, "session %llu: flush %llu: host %s did not answer%s", (unsigned long long)s->id,
            (unsigned long long)f->id, s->hosts[hi].host->name,
            s->hosts[hi].gone ? " (disconnected)" : " within the timeout");
  }
}

static void on_flush_timeout(uv_timer_t *t) {
  tr_flush_op *f = t->data;
  count_missed(f, 0, true);
  complete(f, false);
}

static bool producer_listed(const tr_flush_op *f, size_t hi, uint32_t producer_id) {
  for (size_t i = 0; i < f->num_acks; i++)
    if (f->acks[i].host_index == hi && f->acks[i].producer_id == producer_id)
      return true;
  return false;
}

/* Sends one flush command to a producer, for its started instances. */
static int send_flush(tr_flush_op *f, size_t hi, uint32_t producer_id, uint64_t flags) {
  tr_session *s = f->s;
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  Tracerelay__Command__Flush fl = TRACERELAY__COMMAND__FLUSH__INIT;
  uint64_t *ids = malloc((s->num_instances + 1) * sizeof *ids);
  size_t n = 0;
  int rc;
  if (!ids)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < s->num_instances; i++) {
    const tr_ds_instance *in = &s->instances[i];
    if (in->host_index == hi && in->producer_id == producer_id && in->state == TR_DS_STARTED &&
        !in->no_flush)
      ids[n++] = in->id;
  }
  fl.has_flush_request_id = 1;
  fl.flush_request_id = f->id;
  fl.n_instance_ids = n;
  fl.instance_ids = ids;
  fl.has_flags = 1;
  fl.flags = flags;
  cmd.has_producer_id = 1;
  cmd.producer_id = producer_id;
  cmd.cmd_case = TRACERELAY__COMMAND__CMD_FLUSH;
  cmd.flush = &fl;
  rc = tr_session_send(s, hi, &cmd);
  free(ids);
  return rc;
}

int tr_session_flush(tr_session *s, uint32_t timeout_ms, uint64_t flags, tr_session_flush_cb cb,
                     void *ud) {
  tr_flush_op *f = calloc(1, sizeof *f);
  if (!f)
    return TR_ERR_NOMEM;
  f->acks = calloc(s->num_instances + 1, sizeof *f->acks);
  if (!f->acks) {
    free(f);
    return TR_ERR_NOMEM;
  }
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
      tr_link_server_probe_clock(s->hosts[h].host);
  for (size_t i = 0; i < s->num_instances; i++) {
    const tr_ds_instance *in = &s->instances[i];
    if (in->state != TR_DS_STARTED || in->no_flush ||
        producer_listed(f, in->host_index, in->producer_id))
      continue;
    f->acks[f->num_acks].host_index = in->host_index;
    f->acks[f->num_acks].producer_id = in->producer_id;
    f->num_acks++;
    if (send_flush(f, in->host_index, in->producer_id, flags) != 0)
      count_missed(f, in->host_index, false);
  }
  if (timeout_ms == 0)
    timeout_ms = s->cfg->flush_timeout_ms ? s->cfg->flush_timeout_ms
                                          : TR_SESSION_DEFAULT_TIMEOUT_MS;
  if (all_acked(f)) {
    /* Nothing to wait for, or only hosts that could not be asked. */
    complete(f, true);
    return 0;
  }
  uv_timer_start(&f->timer, on_flush_timeout, timeout_ms, 0);
  return 0;
}

void tr_session_flush_on_ack(tr_session *s, size_t host_index, const Tracerelay__FlushAck *ack) {
  for (tr_flush_op *f = s->flushes->ops; f; f = f->next) {
    if (f->id != ack->flush_request_id || f->done)
      continue;
    for (size_t i = 0; i < f->num_acks; i++)
      if (f->acks[i].host_index == host_index && f->acks[i].producer_id == ack->producer_id)
        f->acks[i].acked = true;
    if (all_acked(f))
      complete(f, true);
    return;
  }
}

void tr_session_flush_on_host_gone(tr_session *s, size_t host_index) {
  tr_flush_op *f = s->flushes->ops;
  while (f) {
    tr_flush_op *next = f->next;
    bool owed = false;
    for (size_t i = 0; i < f->num_acks; i++)
      owed |= f->acks[i].host_index == host_index && !f->acks[i].acked;
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

void tr_session_flush_counts(const tr_session *s, struct tr_session_flush_counts *out) {
  *out = s->flushes->counts;
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
