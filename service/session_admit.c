/* session_admit.c: whether a new session may join the others, as traced's EnableTracing
 * decides (session_priv.h): exclusive_prio, session_semaphores and the per-uid limit, with
 * traced's texts; and an exclusive session ending the ones it outranks. O(sessions) each.
 * Also the service's own rule, the buffer budget (--max-buffer-memory): every session
 * reserves its buffers' sizes once for each host entry it has (each host gets central
 * buffers of its own), and neither a new session nor a host joining a running one may take
 * the sum past the budget. A session's reservation is counted by session.c as its entries
 * are made and released when it is freed. */
#include "service/session_priv.h"

#include <stdio.h>
#include <string.h>

#include "relay/base/byte_size.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "service/config_check.h"

#define COMP "session"


static uint32_t highest_exclusive_prio(const tr_service *svc) {
  uint32_t prio = 0;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    uint32_t p = tr_session_config(s)->exclusive_prio;
    prio = p > prio ? p : prio;
  }
  return prio;
}

/* traced's rule: of the running sessions holding the semaphore, no more than the smallest
 * max_other_session_count among them and cfg's. */
static int check_semaphore(const tr_service *svc,
                           const Perfetto__Protos__TraceConfig__SessionSemaphore *sem, char *err,
                           size_t err_len) {
  const char *name = sem->name ? sem->name : "";
  uint64_t holders = 0, smallest = UINT64_MAX;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    const Perfetto__Protos__TraceConfig *c = tr_session_config(s);
    if (tr_session_get_state(s) == TR_SESSION_STOPPED)
      continue;
    for (size_t i = 0; i < c->n_session_semaphores; i++) {
      const char *other = c->session_semaphores[i]->name ? c->session_semaphores[i]->name : "";
      if (strcmp(other, name) != 0)
        continue;
      holders++;
      if (c->session_semaphores[i]->max_other_session_count < smallest)
        smallest = c->session_semaphores[i]->max_other_session_count;
    }
  }
  if (holders == 0)
    return 0;
  uint64_t allowed = sem->max_other_session_count < smallest ? sem->max_other_session_count
                                                             : smallest;
  if (holders > allowed)
    return tr_config_check_refuse(err, err_len,
                   "Semaphore \"%s\" exceeds maximum allowed other session count (%llu > "
                   "min(%llu, %llu))",
                   name, (unsigned long long)holders,
                   (unsigned long long)sem->max_other_session_count,
                   (unsigned long long)smallest);
  return 0;
}

int tr_session_admit_check(const tr_service *svc, uid_t uid,
                           const Perfetto__Protos__TraceConfig *cfg, char *err, size_t err_len) {
  uint32_t current = highest_exclusive_prio(svc);
  if (current > 0 && current >= cfg->exclusive_prio)
    return tr_config_check_refuse(err, err_len,
                   "An exclusive session with priority %u >= requested priority %u is already "
                   "active.",
                   current, cfg->exclusive_prio);
  if (cfg->exclusive_prio > 0)
    return 0; /* every other session is ended before it starts (tr_session_admit_preempt) */
  for (size_t i = 0; i < cfg->n_session_semaphores; i++) {
    int rc = check_semaphore(svc, cfg->session_semaphores[i], err, err_len);
    if (rc != 0)
      return rc;
  }
  int of_uid = 0;
  for (const tr_session *s = svc->sessions; s; s = tr_session_next(s))
    of_uid += tr_session_consumer_uid(s) == uid;
  if (of_uid >= TR_SESSION_MAX_SESSIONS_PER_UID) {
    snprintf(err, err_len, "Too many concurrent tracing sesions (%d) for uid %d limit is %d",
             of_uid, (int)uid, TR_SESSION_MAX_SESSIONS_PER_UID);
    return TR_ERR_FULL;
  }
  return 0;
}

void tr_session_admit_preempt(tr_service *svc, const Perfetto__Protos__TraceConfig *cfg) {
  char reason[128];
  if (cfg->exclusive_prio == 0)
    return;
  snprintf(reason, sizeof reason,
           "Aborted due to user requested higher-priority (%u) exclusive session.",
           cfg->exclusive_prio);
  for (tr_session *s = svc->sessions; s; s = tr_session_next(s)) {
    if (tr_session_get_state(s) == TR_SESSION_STOPPED)
      continue;
    TR_WARN(COMP, "session %llu: %s", (unsigned long long)tr_session_id(s), reason);
    /* Its instances are asked to stop; the end (and its consumer's reply) does not wait. */
    tr_session_disable(s);
    tr_session_end(s, reason);
  }
}

/* "2 x 512 MiB" when every buffer has one size, else "1.5 GiB in 3 buffers". */
static void describe_buffers(const Perfetto__Protos__TraceConfig *cfg, uint64_t per_host,
                             char *out, size_t len) {
  char size[TR_BYTE_SIZE_TEXT];
  bool same = true;
  for (size_t i = 1; i < cfg->n_buffers; i++)
    same = same && cfg->buffers[i]->size_kb == cfg->buffers[0]->size_kb;
  if (same) {
    tr_byte_size_format((uint64_t)cfg->buffers[0]->size_kb * 1024u, size);
    snprintf(out, len, "%zu x %s", cfg->n_buffers, size);
  } else {
    tr_byte_size_format(per_host, size);
    snprintf(out, len, "%s in %zu buffers", size, cfg->n_buffers);
  }
}

static uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

/* Whether `bytes` more, with what the sessions reserve, stay within the budget (none: yes). */
static bool within_budget(const tr_service *svc, uint64_t bytes) {
  return svc->max_buffer_memory == 0 ||
         sat_add(bytes, svc->buffer_memory_reserved) <= svc->max_buffer_memory;
}

int tr_session_admit_budget(const tr_service *svc, const Perfetto__Protos__TraceConfig *cfg,
                            char *err, size_t err_len) {
  char bufs[64], total_text[TR_BYTE_SIZE_TEXT], max_text[TR_BYTE_SIZE_TEXT],
      reserved_text[TR_BYTE_SIZE_TEXT];
  uint64_t per_host = 0, hosts = 0, total;
  if (svc->max_buffer_memory == 0)
    return 0;
  for (size_t i = 0; i < cfg->n_buffers; i++)
    per_host += (uint64_t)cfg->buffers[i]->size_kb * 1024u; /* 128 x 4 GiB at most */
  for (const tr_host *h = tr_hosts_first(svc->hosts); h; h = h->next)
    hosts += h->link != NULL;
  /* With no host connected yet, one host is what the first to join will need. */
  total = per_host > UINT64_MAX / (hosts ? hosts : 1) ? UINT64_MAX : per_host * (hosts ? hosts : 1);
  if (within_budget(svc, total))
    return 0;
  describe_buffers(cfg, per_host, bufs, sizeof bufs);
  tr_byte_size_format(total, total_text);
  tr_byte_size_format(svc->max_buffer_memory, max_text);
  tr_byte_size_format(svc->buffer_memory_reserved, reserved_text);
  if (hosts == 0)
    return tr_config_check_refuse(err, err_len,
                                  "buffers of %s = %s for each host, over --max-buffer-memory %s "
                                  "(%s reserved by running sessions): no host could join; ask "
                                  "for smaller buffers, or raise --max-buffer-memory",
                                  bufs, total_text, max_text, reserved_text);
  return tr_config_check_refuse(err, err_len,
                                "buffers of %s on each of %llu hosts = %s, over "
                                "--max-buffer-memory %s with the %s running sessions reserve: "
                                "ask for smaller buffers, stop a session, or raise "
                                "--max-buffer-memory",
                                bufs, (unsigned long long)hosts, total_text, max_text,
                                reserved_text);
}

bool tr_session_admit_host_fits(const tr_session *s, const tr_host *host) {
  const tr_service *svc = s->svc;
  char per_text[TR_BYTE_SIZE_TEXT], max_text[TR_BYTE_SIZE_TEXT], reserved_text[TR_BYTE_SIZE_TEXT];
  if (within_budget(svc, s->bytes_per_host))
    return true;
  tr_byte_size_format(s->bytes_per_host, per_text);
  tr_byte_size_format(svc->max_buffer_memory, max_text);
  tr_byte_size_format(svc->buffer_memory_reserved, reserved_text);
  TR_WARN(COMP,
          "session %llu: host %s joined past the buffer budget: its %s of central buffers with "
          "the %s the sessions reserve would pass --max-buffer-memory %s; none are made and its "
          "chunks for this session are refused and counted (chunks refused)",
          (unsigned long long)s->id, host->name, per_text, reserved_text, max_text);
  return false;
}

int tr_session_admit_clone(const tr_service *svc, uint64_t bytes, char *err, size_t err_len) {
  char bytes_text[TR_BYTE_SIZE_TEXT], max_text[TR_BYTE_SIZE_TEXT],
      reserved_text[TR_BYTE_SIZE_TEXT];
  if (within_budget(svc, bytes))
    return 0;
  tr_byte_size_format(bytes, bytes_text);
  tr_byte_size_format(svc->max_buffer_memory, max_text);
  tr_byte_size_format(svc->buffer_memory_reserved, reserved_text);
  return tr_config_check_refuse(err, err_len,
                                "the clone's copy of the session's central buffers (%s) with the "
                                "%s the sessions and clones reserve would pass "
                                "--max-buffer-memory %s: free a session or a clone, or raise "
                                "--max-buffer-memory",
                                bytes_text, reserved_text, max_text);
}
