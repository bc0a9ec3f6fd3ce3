/* session_clone.c: snapshots of a live session (CloneSession, `perfetto --clone`), with
 * traced v58.2's rules (session.h, "Snapshots").
 *
 * A clone is taken at one flush across the cluster: the buffers marked clear_before_clone are
 * emptied first, every host's producers are flushed (reason: trace clone), and when the flush
 * completes (or times out, which the clone's stats say as its final flush's outcome) every host
 * entry's central buffers are copied (tr_tbuf_clone) into a new read-only session, or moved
 * there for buffers with transfer_on_clone, which leaves the source's empty. The clone reads as
 * a stopped session does: the source's config (less trace_filter with skip_trace_filter), start
 * clocks, service events and link marks not yet written, its host entries and their stats, its
 * flush counts and the uuid lsb; then clone_started, buffer_cloned per buffer and
 * tracing_disabled. Its instances are copies, stopped: nothing runs for a clone and no chunk
 * reaches it (its buffers have ids of their own).
 *
 * This file writes the fields of the clones it makes (host entries, instances) and swaps the
 * source's central buffers it clears or moves; session.c makes the session itself
 * (tr_session_new_read_only). */
#include "service/session_priv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "service/hosts.h"

#define COMP "session"
#define FLUSH_FLAGS_CLONE 0x13u      /* reason trace-clone | initiator traced << 4 */
#define FLUSH_CLONE_BUGREPORT 0x100u /* clone target: bugreport */

typedef struct clone_op {
  tr_session *src;
  struct tr_session_clone_args a; /* its strings owned */
  uint64_t started_ns;
  tr_session_clone_cb cb;
  void *ud;
  char error[320]; /* why make_clone refused, when it says */
} clone_op;

static void op_free(clone_op *op) {
  free((char *)op->a.trigger.trigger_name);
  free((char *)op->a.trigger.producer_name);
  free(op);
}

tr_session *tr_session_clone_source(tr_service *svc, bool has_id, uint64_t id, const char *name,
                                    uid_t uid, char *err, size_t err_len) {
  tr_session *s = NULL;
  if (has_id && id == UINT64_MAX) {
    snprintf(err, err_len, "cloning the bugreport session (id %llu) is not supported by "
             "tracerelay: give the session's id or unique_session_name",
             (unsigned long long)id);
    return NULL;
  }
  if (has_id) {
    for (s = svc->sessions; s && s->id != id; s = s->next)
      ;
  } else if (name && name[0]) {
    s = tr_session_named(svc, name);
  }
  if (!s) {
    snprintf(err, err_len, "Tracing session not found");
    return NULL;
  }
  if (uid != 0 && uid != s->consumer_uid) {
    snprintf(err, err_len, "Not allowed to clone a session from another UID");
    return NULL;
  }
  if (s->cfg->write_into_file) {
    snprintf(err, err_len, "session %llu writes into a file: tracerelay clones only sessions "
             "read with ReadBuffers", (unsigned long long)s->id);
    return NULL;
  }
  return s;
}

/* A fresh empty central buffer in place of each host's buffer b of s (clear_before_clone);
 * on failure s is as it was. */
static int clear_buffer(tr_session *s, size_t b) {
  tr_tbuf **fresh = calloc(s->num_hosts + 1, sizeof *fresh);
  int rc = fresh ? 0 : TR_ERR_NOMEM;
  for (size_t h = 0; h < s->num_hosts && rc == 0; h++)
    if (s->hosts[h].tbufs[b])
      rc = tr_tbuf_new(s->buffers[b].size, s->buffers[b].policy, &fresh[h]);
  for (size_t h = 0; h < s->num_hosts && fresh; h++) {
    if (rc == 0 && s->hosts[h].tbufs[b]) {
      tr_tbuf_free(s->hosts[h].tbufs[b]);
      s->hosts[h].tbufs[b] = fresh[h];
    } else {
      tr_tbuf_free(fresh[h]);
    }
  }
  free(fresh);
  return rc;
}

static bool transfers(const tr_session *s, size_t b) {
  return s->cfg->buffers[b]->transfer_on_clone;
}

/* Host entry h of src, frozen as it is now into clone entry h (entries are added in src's
 * order, so older_entry and entry_of stay valid), with its central buffers copied or moved. */
static int clone_entry(tr_session *src, tr_session *c, size_t h) {
  const tr_session_host *sh = &src->hosts[h];
  tr_session_host *n = &c->hosts[h];
  size_t nb = src->num_buffers;
  *n = *sh;
  n->tbufs = calloc(nb, sizeof *n->tbufs);
  n->drops_at_start = malloc((2 * nb + 1) * sizeof *n->drops_at_start);
  if (!n->tbufs || !n->drops_at_start)
    goto fail;
  n->drops_at_end = n->drops_at_start + nb;
  memcpy(n->drops_at_start, sh->drops_at_start, nb * sizeof *n->drops_at_start);
  for (size_t b = 0; b < nb; b++)
    n->drops_at_end[b] = sh->retired ? sh->drops_at_end[b]
                                     : tr_hosts_buffer_drops(sh->host, src->buffers[b].global_id);
  if (!sh->retired) {
    n->smb_full_at_end = sh->host->stats.agent_smb_full;
    n->smb_full_ns_at_end = sh->host->stats.agent_smb_full_ns;
  }
  /* Retired: no chunk nor command reaches a clone's entry (gone keeps the link's state at the
   * clone, which its stats report). */
  n->retired = true;
  for (size_t b = 0; b < nb; b++) {
    if (!sh->tbufs[b])
      continue;
    if (!transfers(src, b) && tr_tbuf_clone(sh->tbufs[b], &n->tbufs[b]) != 0)
      goto fail;
  }
  if (tr_trace_output_add_host(c->output, sh->host, n->tbufs) != 0)
    goto fail;
  for (size_t b = 0; b < nb; b++)
    if (transfers(src, b)) { /* last: nothing can fail after the source gives them up */
      n->tbufs[b] = sh->tbufs[b];
      src->hosts[h].tbufs[b] = NULL; /* made anew on the host's next chunk */
    }
  c->num_hosts++;
  return 0;
fail:
  for (size_t b = 0; n->tbufs && b < nb; b++)
    tr_tbuf_free(n->tbufs[b]);
  free(n->tbufs);
  free(n->drops_at_start);
  return TR_ERR_NOMEM;
}

/* src's instances, stopped, so that the clone's stats and listing say what ran. */
static int clone_instances(const tr_session *src, tr_session *c) {
  if (!src->num_instances)
    return 0;
  if (!(c->instances = calloc(src->num_instances, sizeof *c->instances)))
    return TR_ERR_NOMEM;
  c->cap_instances = src->num_instances;
  for (size_t i = 0; i < src->num_instances; i++) {
    tr_ds_instance *in = &c->instances[i];
    *in = src->instances[i];
    in->state = TR_DS_STOPPED;
    in->pending_request = 0;
    in->producer_name = strdup(src->instances[i].producer_name);
    in->ds_name = strdup(src->instances[i].ds_name);
    if (!in->producer_name || !in->ds_name) {
      free(in->producer_name);
      free(in->ds_name);
      return TR_ERR_NOMEM;
    }
    c->num_instances++;
  }
  return 0;
}

static int clone_hosts(tr_session *src, tr_session *c) {
  if (!(c->hosts = calloc(src->num_hosts + 1, sizeof *c->hosts)))
    return TR_ERR_NOMEM;
  if (src->cap_entry_of) {
    if (!(c->entry_of = malloc(src->cap_entry_of * sizeof *c->entry_of)))
      return TR_ERR_NOMEM;
    memcpy(c->entry_of, src->entry_of, src->cap_entry_of * sizeof *c->entry_of);
    c->cap_entry_of = src->cap_entry_of;
  }
  for (size_t h = 0; h < src->num_hosts; h++)
    if (clone_entry(src, c, h) != 0)
      return TR_ERR_NOMEM;
  return 0;
}

static int clone_trigger_packet(tr_session *c, const struct tr_session_clone_trigger *t) {
  tr_trace_writer_buf p;
  int rc;
  if (!t->trigger_name || !t->trigger_name[0])
    return 0;
  rc = tr_trace_writer_clone_trigger(c->svc->uid, t->boot_time_ns, t->trigger_name,
                                     t->producer_name ? t->producer_name : "",
                                     (int32_t)t->producer_uid, t->delay_ms, &p);
  if (rc == 0)
    tr_trace_output_set_head_packet(c->output, p);
  return rc;
}

/* The central buffer memory a clone of src holds: each buffer copied or moved is whole. */
static uint64_t clone_bytes(const tr_session *src) {
  uint64_t bytes = 0;
  for (size_t h = 0; h < src->num_hosts; h++)
    for (size_t b = 0; b < src->num_buffers; b++)
      if (src->hosts[h].tbufs[b])
        bytes += src->buffers[b].size;
  return bytes;
}

/* The clone of op->src as it is now; flush_ok: how its flush went. Its buffers count in the
 * service's budget (--max-buffer-memory) until it is freed: past it, no clone (op->error). */
static int make_clone(clone_op *op, bool flush_ok, tr_session **out) {
  tr_session *src = op->src, *c = NULL;
  Perfetto__Protos__TraceConfig cfg = *src->cfg; /* shallow: only for the copy below */
  uint64_t bytes = clone_bytes(src);
  int rc;
  if (op->a.skip_trace_filter)
    cfg.trace_filter = NULL;
  if ((rc = tr_session_admit_clone(src->svc, bytes, op->error, sizeof op->error)) != 0)
    return rc;
  if ((rc = tr_session_new_read_only(src, op->a.consumer_uid, &cfg, &c)) != 0)
    return rc;
  c->reserved = bytes; /* given back by tr_session_free, whatever fails below */
  c->svc->buffer_memory_reserved += bytes;
  uint64_t now = tr_session_now();
  if ((rc = clone_hosts(src, c)) != 0 || (rc = clone_instances(src, c)) != 0 ||
      (rc = tr_session_flush_clone(src, c, flush_ok)) != 0 ||
      (rc = clone_trigger_packet(c, &op->a.trigger)) != 0) {
    tr_session_free(c);
    return rc;
  }
  tr_trace_output_add_event_at(c->output, op->started_ns, TR_TW_CLONE_STARTED, 0);
  for (size_t b = 0; b < c->num_buffers; b++)
    tr_trace_output_add_event_at(c->output, now, TR_TW_BUFFER_CLONED, (uint32_t)b);
  tr_session_end(c, NULL);
  TR_INFO(COMP, "session %llu: cloned into session %llu for uid %u (%zu host entries%s)",
          (unsigned long long)src->id, (unsigned long long)c->id, (unsigned)op->a.consumer_uid,
          c->num_hosts, flush_ok ? "" : "; its flush did not complete");
  *out = c;
  return 0;
}

static void on_flushed(void *ud, bool ok) {
  clone_op *op = ud;
  tr_session *clone = NULL;
  const char *error = NULL;
  int rc;
  if (op->src->freeing) {
    error = "the session ended and was freed before its clone was taken";
  } else if ((rc = make_clone(op, ok, &clone)) != 0) {
    error = op->error[0]        ? op->error
            : rc == TR_ERR_FULL ? "too many tracing sessions for the clone: free one first"
                                : "Buffer allocation failed";
    TR_WARN(COMP, "session %llu: clone failed: %s", (unsigned long long)op->src->id, error);
  }
  op->cb(op->ud, clone, error);
  op_free(op);
}

int tr_session_clone_start(tr_session *src, const struct tr_session_clone_args *args,
                           tr_session_clone_cb cb, void *ud, char *err, size_t err_len) {
  clone_op *op = calloc(1, sizeof *op);
  const struct tr_session_clone_trigger *t = &args->trigger;
  if (!op)
    goto nomem;
  op->src = src;
  op->a = *args;
  op->a.trigger.trigger_name = t->trigger_name ? strdup(t->trigger_name) : NULL;
  op->a.trigger.producer_name = t->producer_name ? strdup(t->producer_name) : NULL;
  op->cb = cb;
  op->ud = ud;
  op->started_ns = tr_session_now();
  if ((t->trigger_name && !op->a.trigger.trigger_name) ||
      (t->producer_name && !op->a.trigger.producer_name))
    goto nomem;
  for (size_t b = 0; b < src->num_buffers; b++)
    if (src->cfg->buffers[b]->clear_before_clone && clear_buffer(src, b) != 0) {
      snprintf(err, err_len, "Buffer allocation failed while attempting to clone");
      op_free(op);
      return TR_ERR_NOMEM;
    }
  if (tr_session_flush(src, 0, FLUSH_FLAGS_CLONE | (args->for_bugreport ? FLUSH_CLONE_BUGREPORT
                                                                         : 0),
                       on_flushed, op) != 0)
    goto nomem;
  return 0;
nomem:
  if (op)
    op_free(op);
  snprintf(err, err_len, "out of memory for the clone");
  return TR_ERR_NOMEM;
}

void tr_session_clone_trigger_hit(tr_session *s, const struct tr_session_clone_trigger *t) {
  struct tr_session_clone_trigger hit = *t;
  hit.session_id = s->id;
  TR_INFO(COMP, "session %llu: CLONE_SNAPSHOT trigger '%s' from %s hit%s",
          (unsigned long long)s->id, t->trigger_name ? t->trigger_name : "",
          t->producer_name ? t->producer_name : "?",
          s->obs.on_clone_trigger_hit ? "" : "; no consumer observes it");
  if (s->obs.on_clone_trigger_hit)
    s->obs.on_clone_trigger_hit(s->obs_ud, &hit);
}
