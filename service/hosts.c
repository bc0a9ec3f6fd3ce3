/* hosts.c: the host table behind hosts.h.
 *
 * Each host is a private record whose first member is the public tr_host, so a tr_host
 * pointer from anywhere in the service leads back to its record. A record is freed before the
 * table only when it is retired: a host gone (its link down, or never up) and held by no
 * session (tr_link_events.holds_host) while max_gone hosts are gone, the longest gone first,
 * its guests with it. That is checked when a new entry is made, so the table holds at
 * most the connected hosts, the hosts the sessions hold, and max_gone others (a regional
 * allowed `eu-*` can mint names without end, an autoscaled fleet renames its hosts). Whoever
 * keeps a tr_host pointer past the loop's turn must be a session (and so hold it), or look the
 * name up again (link_server.c's regionals do). A retired host that comes back is a new entry:
 * its counters start again, its machine id is claimed again.
 * Protobuf messages kept from the link (system info, data source descriptors) are deep
 * copies made by re-encoding, so unknown fields survive and nothing points into a frame. */
#include "service/hosts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/fnv1a.h"
#include "relay/base/log.h"
#include "relay/base/pb_valid.h"
#include "relay/link/relay_frame.h"
#include "relay/link/tls.h"
#include "relay/base/tr_error.h"
#include "service/machine_ids.h"

/* What one agent instance reported in its latest AgentStats, summed over producers. */
typedef struct agent_counters {
  uint64_t queue_chunks, queue_bytes, spill_chunks, spill_bytes, smb_full, smb_full_ns, abi;
  uint64_t queue_packets, spill_packets;
  uint64_t producers_closed, exit_unscraped;
} agent_counters;

typedef struct tr_host_buffer_drops_rec buffer_drops;

/* A CommandReply, or a ProducerUpdate that says a producer is gone, waiting for the batches
 * the agent queued before it. */
typedef struct held_frame {
  struct held_frame *next;
  Tracerelay__RelayFrame *frame;
} held_frame;

typedef struct host_rec {
  tr_host host; /* first: a tr_host * is a host_rec * */
  tr_host **guests; /* the guest entries of this host, ever made (at most TR_HOSTS_MAX_GUESTS) */
  size_t n_guests;
  bool has_held_clock; /* a guest: an exchange its host's clock could not map yet */
  struct tr_clocksync_probe held_clock;
  tr_relay_peer peer;
  agent_counters earlier;  /* sum over the agent instances before the current one */
  agent_counters current;  /* the current instance's latest report */
  held_frame *held_head, *held_tail;
  size_t n_held;
  size_t held_bytes; /* the held frames, as encoded */
  /* Request ids of the commands awaiting a reply, oldest first. */
  uint64_t *in_flight;
  size_t n_in_flight;
  uint32_t *stale; /* during a resync: producer ids not re-announced yet */
  size_t n_stale;
  size_t ordinal; /* 0, 1, 2... in the order the table made them */
  tr_host *prev;  /* in the table's list */
  struct tr_hosts *table;
  /* On the gone list (hosts only, not guests): link down or never up, oldest first. */
  bool gone;
  struct host_rec *gone_prev, *gone_next;
  struct host_rec *same_bucket; /* the next record in its bucket of the name index */
} host_rec;

struct tr_hosts {
  tr_service *svc;
  const struct tr_link_events *ev; /* called with svc */
  tr_host *head, *tail;
  size_t made; /* entries made so far: the next ordinal */
  size_t live; /* entries in the table now */
  host_rec *gone_head, *gone_tail;
  size_t num_gone;
  size_t max_gone;  /* TR_HOSTS_MAX_GONE unless a test sets it */
  uint64_t retired; /* hosts retired so far (their guests not counted) */
  /* By name: FNV-1a of it, chained in a power-of-two number of buckets, at most one record a
   * bucket on average (a reconnect storm of 10,000 agents looked each Hello's name up among
   * 10,000 records: a fifth of a starved root's samples). */
  host_rec **buckets;
  size_t num_buckets;
  tr_machine_ids ids; /* the hosts' trace names and the ids made from them, kept unique */
};

static host_rec *rec_of(tr_host *h) { return (host_rec *)h; }

static void gone_add(tr_hosts *hs, host_rec *r);
static void gone_remove(tr_hosts *hs, host_rec *r);

/* ---- protobuf copies ---- */

static void free_message(void *m) {
  if (m != NULL)
    protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- producers ---- */

static void producer_clear(tr_remote_producer *p) {
  free(p->name);
  free(p->sdk_version);
  for (size_t i = 0; i < p->num_data_sources; i++)
    free_message(p->data_sources[i]);
  free(p->data_sources);
  memset(p, 0, sizeof *p);
}

static tr_remote_producer *producer_find(tr_host *h, uint32_t id) {
  for (size_t i = 0; i < h->num_producers; i++)
    if (h->producers[i].id == id)
      return &h->producers[i];
  return NULL;
}

/* Tells the sessions the producer is gone, then forgets it. */
static void producer_end(tr_hosts *hs, tr_host *h, uint32_t id) {
  tr_remote_producer *p = producer_find(h, id);
  if (p == NULL)
    return;
  p->connected = false;
  hs->ev->producers_changed(hs->svc, h, id);
  p = producer_find(h, id); /* found again rather than trusted across the call */
  if (p == NULL)
    return;
  producer_clear(p);
  size_t i = (size_t)(p - h->producers);
  memmove(&h->producers[i], &h->producers[i + 1],
          (h->num_producers - i - 1) * sizeof *h->producers);
  h->num_producers--;
}

static void producers_end_all(tr_hosts *hs, tr_host *h) {
  while (h->num_producers > 0)
    producer_end(hs, h, h->producers[h->num_producers - 1].id);
}

static int dup_string(char **dst, const char *src) {
  char *s = NULL;
  if (src != NULL && (s = strdup(src)) == NULL)
    return TR_ERR_NOMEM;
  free(*dst);
  *dst = s;
  return 0;
}

static Perfetto__Protos__DataSourceDescriptor *copy_descriptor(
    const Perfetto__Protos__DataSourceDescriptor *d) {
  return (Perfetto__Protos__DataSourceDescriptor *)tr_pb_copy(&d->base);
}

/* Perfetto matches descriptors on {id, name}. */
static bool same_source(const Perfetto__Protos__DataSourceDescriptor *a,
                        const Perfetto__Protos__DataSourceDescriptor *b) {
  uint64_t ia = a->has_id ? a->id : 0, ib = b->has_id ? b->id : 0;
  return ia == ib && a->name != NULL && b->name != NULL && strcmp(a->name, b->name) == 0;
}

/* Registers or replaces one descriptor. */
static int upsert_source(tr_remote_producer *p, const Perfetto__Protos__DataSourceDescriptor *d) {
  Perfetto__Protos__DataSourceDescriptor *copy = copy_descriptor(d);
  if (copy == NULL)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < p->num_data_sources; i++) {
    if (same_source(p->data_sources[i], d)) {
      free_message(p->data_sources[i]);
      p->data_sources[i] = copy;
      return 0;
    }
  }
  Perfetto__Protos__DataSourceDescriptor **grown =
      realloc(p->data_sources, (p->num_data_sources + 1) * sizeof *grown);
  if (grown == NULL) {
    free_message(copy);
    return TR_ERR_NOMEM;
  }
  p->data_sources = grown;
  p->data_sources[p->num_data_sources++] = copy;
  return 0;
}

static void remove_sources_named(tr_remote_producer *p, const char *name) {
  size_t out = 0;
  for (size_t i = 0; i < p->num_data_sources; i++) {
    Perfetto__Protos__DataSourceDescriptor *d = p->data_sources[i];
    if (d->name != NULL && strcmp(d->name, name) == 0)
      free_message(d);
    else
      p->data_sources[out++] = d;
  }
  p->num_data_sources = out;
}

static size_t described_bytes(const tr_remote_producer *p) {
  size_t n = (p->name ? strlen(p->name) : 0) + (p->sdk_version ? strlen(p->sdk_version) : 0);
  for (size_t i = 0; i < p->num_data_sources; i++)
    n += protobuf_c_message_get_packed_size(&p->data_sources[i]->base);
  return n;
}

static bool over_name_limit(const char *s) {
  return s != NULL && strnlen(s, TR_HOSTS_MAX_NAME_BYTES + 1) > TR_HOSTS_MAX_NAME_BYTES;
}

#define REFUSE(...)                                                                               \
  do {                                                                                            \
    snprintf(err, err_len, __VA_ARGS__);                                                          \
    return TR_ERR_PROTO;                                                                          \
  } while (0)

int tr_hosts_producer_update_check(const tr_host *h, const Tracerelay__ProducerUpdate *u,
                                   char *err, size_t err_len) {
  if (u->producer_id == 0)
    REFUSE("producer id 0");
  tr_remote_producer *p = producer_find((tr_host *)h, u->producer_id);
  size_t sources = 0, bytes = 0, host_bytes = 0;
  switch (u->state) {
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED:
    if (p == NULL && h->num_producers >= TR_HOSTS_MAX_PRODUCERS)
      REFUSE("more than %u producers on one host, the limit", TR_HOSTS_MAX_PRODUCERS);
    break; /* a full description: replaces the producer's */
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_UPDATED:
    if (p == NULL)
      return 0; /* ignored */
    sources = p->num_data_sources;
    bytes = p->described_bytes;
    break;
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED:
    return 0;
  default:
    REFUSE("unknown producer state %d", (int)u->state);
  }
  /* Checked before anything is looked at per descriptor: a 4 MiB update holds ~400,000. */
  if (u->n_data_sources > TR_HOSTS_MAX_DATA_SOURCES)
    REFUSE("%zu data sources in one update, over the limit of %u a producer", u->n_data_sources,
           TR_HOSTS_MAX_DATA_SOURCES);
  if (over_name_limit(u->name) || over_name_limit(u->sdk_version))
    REFUSE("producer name or sdk_version over the limit of %u bytes", TR_HOSTS_MAX_NAME_BYTES);
  bytes += (u->name ? strlen(u->name) : 0) + (u->sdk_version ? strlen(u->sdk_version) : 0);
  for (size_t i = 0; i < u->n_data_sources; i++) {
    const Perfetto__Protos__DataSourceDescriptor *d = u->data_sources[i];
    size_t n = protobuf_c_message_get_packed_size(&d->base);
    if (over_name_limit(d->name))
      REFUSE("data source name over the limit of %u bytes", TR_HOSTS_MAX_NAME_BYTES);
    if (n > TR_HOSTS_MAX_DESCRIPTOR_BYTES)
      REFUSE("data source descriptor of %zu bytes, over the limit of %u bytes", n,
             TR_HOSTS_MAX_DESCRIPTOR_BYTES);
    bytes += n;
    bool replaces = false; /* an update may replace a descriptor rather than add one */
    for (size_t k = 0; p != NULL && u->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_UPDATED &&
                       k < p->num_data_sources && !replaces; k++)
      replaces = same_source(p->data_sources[k], d);
    sources += !replaces;
  }
  if (sources > TR_HOSTS_MAX_DATA_SOURCES)
    REFUSE("producer %u would have %zu data sources, over the limit of %u a producer",
           u->producer_id, sources, TR_HOSTS_MAX_DATA_SOURCES);
  for (size_t i = 0; i < h->num_producers; i++)
    if (&h->producers[i] != p)
      host_bytes += h->producers[i].described_bytes;
  if (host_bytes + bytes > TR_HOSTS_MAX_DESCRIBED_BYTES)
    REFUSE("the host's producers would be described in %zu bytes, over the limit of %u a host",
           host_bytes + bytes, TR_HOSTS_MAX_DESCRIBED_BYTES);
  return 0;
}

#undef REFUSE

static int apply_connected(tr_host *h, const Tracerelay__ProducerUpdate *u) {
  tr_remote_producer *p = producer_find(h, u->producer_id);
  if (p == NULL) {
    if (h->num_producers >= TR_HOSTS_MAX_PRODUCERS)
      return TR_ERR_PROTO;
    tr_remote_producer *grown = realloc(h->producers, (h->num_producers + 1) * sizeof *grown);
    if (grown == NULL)
      return TR_ERR_NOMEM;
    h->producers = grown;
    p = &h->producers[h->num_producers++];
    memset(p, 0, sizeof *p);
    p->id = u->producer_id;
  }
  /* A full description replaces everything we knew. */
  for (size_t i = 0; i < p->num_data_sources; i++)
    free_message(p->data_sources[i]);
  p->num_data_sources = 0;
  p->uid = u->uid;
  p->pid = u->pid;
  p->connected = true;
  int rc = dup_string(&p->name, u->name);
  if (rc == 0)
    rc = dup_string(&p->sdk_version, u->sdk_version);
  for (size_t i = 0; i < u->n_data_sources && rc == 0; i++)
    rc = upsert_source(p, u->data_sources[i]);
  return rc;
}

static int apply_updated(tr_remote_producer *p, const Tracerelay__ProducerUpdate *u) {
  for (size_t i = 0; i < u->n_unregistered_data_sources; i++)
    remove_sources_named(p, u->unregistered_data_sources[i]);
  for (size_t i = 0; i < u->n_data_sources; i++) {
    int rc = upsert_source(p, u->data_sources[i]);
    if (rc < 0)
      return rc;
  }
  return 0;
}

static void stale_remove(host_rec *r, uint32_t id) {
  for (size_t i = 0; i < r->n_stale; i++) {
    if (r->stale[i] == id) {
      r->stale[i] = r->stale[--r->n_stale];
      return;
    }
  }
}

int tr_hosts_producer_update(tr_hosts *hs, tr_host *h, const Tracerelay__ProducerUpdate *u) {
  char why[160];
  if ((h = tr_hosts_update_entry(h, u)) == NULL)
    return 0;
  if (tr_hosts_producer_update_check(h, u, why, sizeof why) < 0)
    return TR_ERR_PROTO;
  int rc;
  tr_remote_producer *p;
  switch (u->state) {
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED:
    stale_remove(rec_of(h), u->producer_id);
    rc = apply_connected(h, u);
    if ((p = producer_find(h, u->producer_id)) != NULL)
      p->described_bytes = described_bytes(p);
    break;
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_UPDATED:
    if ((p = producer_find(h, u->producer_id)) == NULL)
      return 0;
    rc = apply_updated(p, u);
    p->described_bytes = described_bytes(p);
    break;
  case TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED:
    stale_remove(rec_of(h), u->producer_id);
    producer_end(hs, h, u->producer_id);
    return 0;
  default:
    return TR_ERR_PROTO;
  }
  if (rc < 0)
    return rc;
  hs->ev->producers_changed(hs->svc, h, u->producer_id);
  return 0;
}

static int resync_begin(tr_host *h) {
  host_rec *r = rec_of(h);
  free(r->stale);
  r->stale = NULL;
  r->n_stale = 0;
  if (h->num_producers == 0)
    return 0;
  r->stale = malloc(h->num_producers * sizeof *r->stale);
  if (r->stale == NULL)
    return TR_ERR_NOMEM;
  for (size_t i = 0; i < h->num_producers; i++)
    r->stale[r->n_stale++] = h->producers[i].id;
  return 0;
}

int tr_hosts_resync_begin(tr_hosts *hs, tr_host *h) {
  (void)hs;
  int rc = resync_begin(h);
  for (size_t i = 0; i < rec_of(h)->n_guests && rc == 0; i++)
    rc = resync_begin(rec_of(h)->guests[i]);
  return rc;
}

static void resync_end(tr_hosts *hs, tr_host *h) {
  host_rec *r = rec_of(h);
  uint32_t *stale = r->stale;
  size_t n = r->n_stale;
  r->stale = NULL;
  r->n_stale = 0;
  for (size_t i = 0; i < n; i++)
    producer_end(hs, h, stale[i]);
  free(stale);
}

void tr_hosts_resync_end(tr_hosts *hs, tr_host *h) {
  resync_end(hs, h);
  for (size_t i = 0; i < rec_of(h)->n_guests; i++)
    resync_end(hs, rec_of(h)->guests[i]);
}

/* ---- agent stats ---- */

static void publish_counters(tr_host *h) {
  host_rec *r = rec_of(h);
  h->stats.agent_queue_dropped_chunks = r->earlier.queue_chunks + r->current.queue_chunks;
  h->stats.agent_queue_dropped_bytes = r->earlier.queue_bytes + r->current.queue_bytes;
  h->stats.agent_spill_dropped_chunks = r->earlier.spill_chunks + r->current.spill_chunks;
  h->stats.agent_spill_dropped_bytes = r->earlier.spill_bytes + r->current.spill_bytes;
  h->stats.agent_smb_full = r->earlier.smb_full + r->current.smb_full;
  h->stats.agent_smb_full_ns = r->earlier.smb_full_ns + r->current.smb_full_ns;
  h->stats.agent_abi_violations = r->earlier.abi + r->current.abi;
  h->stats.agent_queue_dropped_packets = r->earlier.queue_packets + r->current.queue_packets;
  h->stats.agent_spill_dropped_packets = r->earlier.spill_packets + r->current.spill_packets;
  h->stats.agent_producers_closed = r->earlier.producers_closed + r->current.producers_closed;
  h->stats.agent_exit_unscraped_chunks = r->earlier.exit_unscraped + r->current.exit_unscraped;
}

static void add_drops(tr_host_buffer_drops *to, const tr_host_buffer_drops *d) {
  to->queue_chunks += d->queue_chunks;
  to->queue_bytes += d->queue_bytes;
  to->queue_packets += d->queue_packets;
  to->spill_chunks += d->spill_chunks;
  to->spill_bytes += d->spill_bytes;
  to->spill_packets += d->spill_packets;
  to->exit_unscraped_chunks += d->exit_unscraped_chunks;
  for (size_t i = 0; i <= TR_IPC_CLOSE_REASONS; i++)
    to->producers_closed[i] += d->producers_closed[i];
}

/* A reported close reason as an index of producers_closed: one this service does not know (a
 * newer agent's, or none of the agent's own) at TR_IPC_CLOSE_REASONS. */
static size_t close_slot(int reason) {
  return reason > TR_IPC_CLOSE_HOST && reason < TR_IPC_CLOSE_REASONS ? (size_t)reason
                                                                      : TR_IPC_CLOSE_REASONS;
}

static buffer_drops *buffer_entry(tr_host *h, uint32_t global_id) {
  for (size_t i = 0; i < h->num_buffer_drops; i++)
    if (h->buffer_drops[i].global_id == global_id)
      return &h->buffer_drops[i];
  if (h->num_buffer_drops == TR_HOSTS_MAX_BUFFER_DROPS)
    return NULL;
  buffer_drops *grown = realloc(h->buffer_drops, (h->num_buffer_drops + 1) * sizeof *grown);
  if (grown == NULL)
    return NULL;
  h->buffer_drops = grown;
  grown[h->num_buffer_drops] = (buffer_drops){.global_id = global_id};
  return &grown[h->num_buffer_drops++];
}

/* The report's per-buffer drops replace the current instance's. A buffer over the bound, or one
 * the allocation fails for, keeps its last values (its losses then stay in the host-wide
 * counters alone). */
static void set_buffer_drops(tr_host *h, const Tracerelay__AgentStats *s) {
  for (size_t i = 0; i < s->n_buffers; i++) {
    const Tracerelay__AgentStats__Buffer *in = s->buffers[i];
    buffer_drops *b = buffer_entry(h, in->target_buffer);
    if (b == NULL)
      continue;
    b->current = (tr_host_buffer_drops){.queue_chunks = in->queue_dropped_chunks,
                                        .queue_bytes = in->queue_dropped_bytes,
                                        .queue_packets = in->queue_dropped_packets,
                                        .spill_chunks = in->spill_dropped_chunks,
                                        .spill_bytes = in->spill_dropped_bytes,
                                        .spill_packets = in->spill_dropped_packets,
                                        .exit_unscraped_chunks = in->exit_unscraped_chunks};
    for (size_t k = 0; k < in->n_producers_closed; k++)
      b->current.producers_closed[close_slot((int)in->producers_closed[k]->reason)] +=
          in->producers_closed[k]->connections;
  }
}

void tr_hosts_agent_stats(tr_host *h, const Tracerelay__AgentStats *s) {
  agent_counters c = {0};
  for (size_t i = 0; i < s->n_producers; i++) {
    const Tracerelay__AgentStats__Producer *p = s->producers[i];
    c.queue_chunks += p->queue_dropped_chunks;
    c.queue_bytes += p->queue_dropped_bytes;
    c.spill_chunks += p->spill_dropped_chunks;
    c.spill_bytes += p->spill_dropped_bytes;
    c.smb_full += p->smb_full;
    c.smb_full_ns += p->smb_full_ns;
    c.abi += p->abi_violations;
    c.queue_packets += p->queue_dropped_packets;
    c.spill_packets += p->spill_dropped_packets;
    c.producers_closed += p->has_closed_by_agent;
    c.exit_unscraped += p->exit_unscraped_chunks;
  }
  rec_of(h)->current = c;
  publish_counters(h);
  set_buffer_drops(h, s);
}

tr_host_buffer_drops tr_hosts_buffer_drops(const tr_host *h, uint32_t global_id) {
  tr_host_buffer_drops sum = {0};
  for (size_t i = 0; i < h->num_buffer_drops; i++) {
    const buffer_drops *b = &h->buffer_drops[i];
    if (b->global_id == global_id) {
      sum = b->earlier;
      add_drops(&sum, &b->current);
    }
  }
  return sum;
}

void tr_hosts_count_flush_missed(tr_host *h) { h->stats.flushes_missed++; }

/* ---- the link's state and counters ---- */

void tr_hosts_link_up(tr_host *h, tr_link_peer *link, uint64_t now_ns, const char *relayed_by) {
  gone_remove(rec_of(h)->table, rec_of(h));
  h->link = link;
  h->connected_since_ns = now_ns;
  snprintf(h->relayed_by, sizeof h->relayed_by, "%s", relayed_by ? relayed_by : "");
}

void tr_hosts_link_down(tr_host *h) {
  gone_add(rec_of(h)->table, rec_of(h));
  h->link = NULL;
  h->stats.disconnects++;
}

void tr_hosts_agent_goodbye(tr_host *h, bool orderly) { h->agent_said_goodbye = orderly; }

void tr_hosts_batch_seen(tr_host *h) {
  const tr_relay_peer *seqs = &rec_of(h)->peer;
  h->stats.batches_duplicate = seqs->duplicate_batches;
  h->stats.link_lost_batches = seqs->lost_batches;
}

void tr_hosts_batch_unusable(tr_host *h) {
  rec_of(h)->peer.lost_batches++;
  tr_hosts_batch_seen(h);
}

void tr_hosts_chunk_received(tr_host *h, size_t payload_len) {
  h->stats.chunks_received++;
  h->stats.bytes_received += payload_len;
}

void tr_hosts_batch_applied(tr_host *h) { h->stats.batches_received++; }

/* ---- clock snapshots ---- */

int tr_hosts_add_clock_snapshot(tr_host *h, const Tracerelay__HostClockSnapshot *m,
                                int64_t received_ns) {
  if (m->n_clocks == 0 || m->n_clocks > TR_CLOCK_SNAPSHOT_MAX)
    return TR_ERR_PROTO;
  struct tr_host_clock_snapshot *e =
      &h->clock_snapshots[h->clock_snapshots_taken % TR_HOST_CLOCK_SNAPSHOTS];
  struct tr_host_clock_snapshot n = {.received_ns = received_ns};
  for (size_t i = 0; i < m->n_clocks; i++) {
    const Tracerelay__HostClockSnapshot__Clock *c = m->clocks[i];
    if (!c->has_clock_id || c->clock_id == 0 || c->clock_id >= 64 || !c->has_timestamp)
      return TR_ERR_PROTO;
    n.snap.clocks[i] = (struct tr_clock_reading){c->clock_id, c->timestamp};
  }
  n.snap.n = (uint32_t)m->n_clocks;
  *e = n;
  h->clock_snapshots_taken++;
  return 0;
}

/* ---- frames held for their batches ---- */

void tr_hosts_command_sent(tr_host *h, const Tracerelay__Command *cmd) {
  /* A guest's commands go down its host's link, and their replies come back on it. */
  host_rec *r = rec_of(h->guest_of != NULL ? h->guest_of : h);
  if (cmd->cmd_case == TRACERELAY__COMMAND__CMD_FLUSH) /* a FlushAck answers it */
    return;
  if (r->in_flight == NULL &&
      (r->in_flight = malloc(TR_HOSTS_MAX_COMMANDS_IN_FLIGHT * sizeof *r->in_flight)) == NULL)
    return; /* its reply will be refused as unexpected, and counted */
  if (r->n_in_flight == TR_HOSTS_MAX_COMMANDS_IN_FLIGHT) { /* the oldest forgotten */
    memmove(r->in_flight, r->in_flight + 1, (r->n_in_flight - 1) * sizeof *r->in_flight);
    r->n_in_flight--;
  }
  r->in_flight[r->n_in_flight++] = cmd->request_id;
}

/* Whether a command with this request id awaits its reply; forgotten if so (one reply each). */
static bool take_in_flight(host_rec *r, uint64_t request_id) {
  for (size_t i = 0; i < r->n_in_flight; i++) {
    if (r->in_flight[i] == request_id) {
      memmove(&r->in_flight[i], &r->in_flight[i + 1],
              (r->n_in_flight - i - 1) * sizeof *r->in_flight);
      r->n_in_flight--;
      return true;
    }
  }
  return false;
}

int tr_hosts_hold_ordered(tr_host *h, Tracerelay__RelayFrame *frame) {
  host_rec *r = rec_of(h);
  held_frame *e = NULL;
  if (frame->msg_case == TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY &&
      !take_in_flight(r, frame->command_reply->request_id)) {
    h->stats.replies_unexpected++;
    tr_relay_frame_free(frame);
    return TR_ERR_NOT_FOUND;
  }
  size_t bytes = protobuf_c_message_get_packed_size(&frame->base);
  bool full = r->n_held >= TR_HOSTS_MAX_HELD_FRAMES || bytes > TR_HOSTS_MAX_HELD_BYTES - r->held_bytes;
  if (full || (e = malloc(sizeof *e)) == NULL) {
    tr_relay_frame_free(frame);
    return full ? TR_ERR_FULL : TR_ERR_NOMEM;
  }
  r->held_bytes += bytes;
  e->next = NULL;
  e->frame = frame;
  if (r->held_tail != NULL)
    r->held_tail->next = e;
  else
    r->held_head = e;
  r->held_tail = e;
  r->n_held++;
  return 0;
}

static uint64_t held_after_seq(const Tracerelay__RelayFrame *f) {
  return f->msg_case == TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY ? f->command_reply->after_seq
                                                                    : f->producer_update->after_seq;
}

/* Applies held frames from the oldest while ready(after_seq) holds; all of them with force. */
static void release(tr_hosts *hs, tr_host *h, bool force) {
  host_rec *r = rec_of(h);
  while (r->held_head != NULL) {
    held_frame *e = r->held_head;
    if (!force && held_after_seq(e->frame) > r->peer.stored_seq)
      return;
    r->held_head = e->next;
    if (r->held_head == NULL)
      r->held_tail = NULL;
    r->n_held--;
    r->held_bytes -= protobuf_c_message_get_packed_size(&e->frame->base);
    if (e->frame->msg_case == TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY) {
      /* A reply names no producer: its request id (unique in the service) finds the command
       * among the host's and its guests' alike. */
      hs->ev->command_reply(hs->svc, h, e->frame->command_reply);
      for (size_t i = 0; i < r->n_guests; i++)
        hs->ev->command_reply(hs->svc, r->guests[i], e->frame->command_reply);
    } else /* a PRODUCER_DISCONNECTED with a producer id, checked before it was held */
      tr_hosts_producer_update(hs, h, e->frame->producer_update);
    tr_relay_frame_free(e->frame);
    free(e);
  }
}

void tr_hosts_release_ordered(tr_hosts *hs, tr_host *h) { release(hs, h, false); }

/* ---- hello ---- */

static int keep_system_info(tr_host *h, const Perfetto__Protos__SystemInfo *in) {
  Perfetto__Protos__SystemInfo *info;
  if (in != NULL)
    info = (Perfetto__Protos__SystemInfo *)tr_pb_copy(&in->base);
  else if ((info = malloc(sizeof *info)) != NULL)
    perfetto__protos__system_info__init(info);
  if (info == NULL)
    return TR_ERR_NOMEM;
  /* The certificate says who this is, and the trace names it so that its ids are its own
   * (machine_ids.h); whatever the agent wrote is dropped. */
  int rc = dup_string(&info->machine_name, h->trace_name);
  if (rc < 0) {
    free_message(info);
    return rc;
  }
  free_message(h->system_info);
  h->system_info = info;
  return 0;
}

int tr_hosts_hello(tr_hosts *hs, tr_host *h, const Tracerelay__Hello *hello,
                   uint64_t *welcome_seq) {
  host_rec *r = rec_of(h);
  uint64_t previous = r->peer.instance_id;
  int rc = tr_relay_peer_hello(&r->peer, hello->agent_instance_id, hello->acked_seq,
                               welcome_seq);
  if (rc < 0)
    return rc;
  h->restarted_unclean = false;
  if (previous != 0 && previous != hello->agent_instance_id) {
    h->restarted_unclean = !h->agent_said_goodbye;
    h->stats.agent_exits_unclean += h->restarted_unclean;
    if (h->restarted_unclean)
      TR_WARN("link", "host %s: agent restarted (instance %016llx -> %016llx) without having "
              "stopped in order: what its producers wrote and it had not relayed is lost",
              h->name, (unsigned long long)previous,
              (unsigned long long)hello->agent_instance_id);
    else
      TR_INFO("link", "host %s: agent restarted (instance %016llx -> %016llx) after an orderly "
              "stop", h->name, (unsigned long long)previous,
              (unsigned long long)hello->agent_instance_id);
    /* The old instance's batches will never come: its replies cannot wait for them; nor will
     * replies to the commands it had not answered. */
    release(hs, h, true);
    r->n_in_flight = 0;
    producers_end_all(hs, h);
    for (size_t i = 0; i < r->n_guests; i++)
      producers_end_all(hs, r->guests[i]);
    r->earlier.queue_chunks += r->current.queue_chunks;
    r->earlier.queue_bytes += r->current.queue_bytes;
    r->earlier.spill_chunks += r->current.spill_chunks;
    r->earlier.spill_bytes += r->current.spill_bytes;
    r->earlier.smb_full += r->current.smb_full;
    r->earlier.smb_full_ns += r->current.smb_full_ns;
    r->earlier.abi += r->current.abi;
    r->earlier.queue_packets += r->current.queue_packets;
    r->earlier.spill_packets += r->current.spill_packets;
    r->earlier.producers_closed += r->current.producers_closed;
    r->earlier.exit_unscraped += r->current.exit_unscraped;
    r->current = (agent_counters){0};
    for (size_t i = 0; i < h->num_buffer_drops; i++) {
      add_drops(&h->buffer_drops[i].earlier, &h->buffer_drops[i].current);
      h->buffer_drops[i].current = (tr_host_buffer_drops){0};
    }
    publish_counters(h);
  }
  h->agent_instance_id = hello->agent_instance_id;
  h->agent_said_goodbye = false;
  return keep_system_info(h, hello->system_info);
}

/* ---- the table ---- */

int tr_hosts_new(tr_service *svc, const struct tr_link_events *ev, tr_hosts **out) {
  tr_hosts *hs = calloc(1, sizeof *hs);
  if (hs == NULL)
    return TR_ERR_NOMEM;
  hs->svc = svc;
  hs->ev = ev;
  hs->max_gone = TR_HOSTS_MAX_GONE;
  *out = hs;
  return 0;
}

static void host_free(host_rec *r) {
  tr_host *h = &r->host;
  for (size_t i = 0; i < h->num_producers; i++)
    producer_clear(&h->producers[i]);
  free(h->producers);
  free_message(h->system_info);
  tr_clocksync_free(h->clock);
  while (r->held_head != NULL) {
    held_frame *e = r->held_head;
    r->held_head = e->next;
    tr_relay_frame_free(e->frame);
    free(e);
  }
  free(r->stale);
  free(r->in_flight);
  free(r->guests);
  free(h->buffer_drops);
  free(r);
}

void tr_hosts_free(tr_hosts *hs) {
  if (hs == NULL)
    return;
  tr_host *h = hs->head;
  while (h != NULL) {
    tr_host *next = h->next;
    host_free(rec_of(h));
    h = next;
  }
  free(hs->buckets);
  tr_machine_ids_free(&hs->ids);
  free(hs);
}

tr_service *tr_hosts_service(const tr_hosts *hs) { return hs->svc; }

const struct tr_link_events *tr_hosts_events(const tr_hosts *hs) { return hs->ev; }

tr_host *tr_hosts_first(const tr_hosts *hs) { return hs->head; }

size_t tr_hosts_count(const tr_hosts *hs) { return hs->live; }

static host_rec **bucket_of(const tr_hosts *hs, const char *name) {
  return &hs->buckets[tr_fnv1a64(name, strlen(name)) & (hs->num_buckets - 1)];
}

tr_host *tr_hosts_find(const tr_hosts *hs, const char *name) {
  if (hs->num_buckets == 0)
    return NULL;
  for (host_rec *r = *bucket_of(hs, name); r != NULL; r = r->same_bucket)
    if (strcmp(r->host.name, name) == 0)
      return &r->host;
  return NULL;
}

/* Room in the name index for one more record: the buckets doubled (and every record placed
 * again) when there would be more records than buckets. 0 or TR_ERR_NOMEM. */
static int index_room(tr_hosts *hs) {
  if (hs->live < hs->num_buckets)
    return 0;
  size_t n = hs->num_buckets ? 2 * hs->num_buckets : 64;
  host_rec **grown = calloc(n, sizeof *grown);
  if (grown == NULL)
    return TR_ERR_NOMEM;
  free(hs->buckets);
  hs->buckets = grown;
  hs->num_buckets = n;
  for (tr_host *h = hs->head; h != NULL; h = h->next) {
    host_rec **b = bucket_of(hs, h->name);
    rec_of(h)->same_bucket = *b;
    *b = rec_of(h);
  }
  return 0;
}

/* A new entry called name (checked by the caller). */
static int make(tr_hosts *hs, const char *name, tr_host **out) {
  tr_host *h;
  if (index_room(hs) != 0)
    return TR_ERR_NOMEM;
  host_rec *r = calloc(1, sizeof *r);
  if (r == NULL)
    return TR_ERR_NOMEM;
  h = &r->host;
  const char *collided;
  int rc = tr_machine_ids_claim(&hs->ids, name, h->trace_name, &h->machine_id, &collided);
  if (rc < 0) {
    free(r);
    return rc;
  }
  if ((rc = tr_clocksync_init(&h->clock, NULL)) < 0) {
    tr_machine_ids_release(&hs->ids, h->trace_name);
    free(r);
    return rc;
  }
  tr_relay_peer_init(&r->peer);
  snprintf(h->name, sizeof h->name, "%s", name);
  if (collided != NULL)
    TR_WARN("hosts", "the ids the trace would give %s collide with those of %s: its trace "
            "names it %s (machine_id %u)", name, collided, h->trace_name, h->machine_id);
  r->ordinal = hs->made++;
  r->table = hs;
  hs->live++;
  host_rec **b = bucket_of(hs, h->name);
  r->same_bucket = *b;
  *b = r;
  r->prev = hs->tail;
  if (hs->tail != NULL)
    hs->tail->next = h;
  else
    hs->head = h;
  hs->tail = h;
  *out = h;
  return 0;
}

/* ---- gone hosts, and their retirement ---- */

static void gone_add(tr_hosts *hs, host_rec *r) {
  if (r->gone || r->host.guest_of != NULL)
    return;
  r->gone = true;
  r->gone_prev = hs->gone_tail;
  r->gone_next = NULL;
  if (hs->gone_tail != NULL)
    hs->gone_tail->gone_next = r;
  else
    hs->gone_head = r;
  hs->gone_tail = r;
  hs->num_gone++;
}

static void gone_remove(tr_hosts *hs, host_rec *r) {
  if (!r->gone)
    return;
  if (r->gone_prev != NULL)
    r->gone_prev->gone_next = r->gone_next;
  else
    hs->gone_head = r->gone_next;
  if (r->gone_next != NULL)
    r->gone_next->gone_prev = r->gone_prev;
  else
    hs->gone_tail = r->gone_prev;
  r->gone = false;
  hs->num_gone--;
}

/* Takes one entry out of the table (list, name index, machine ids) and frees it. */
static void unmake(tr_hosts *hs, host_rec *r) {
  tr_host *h = &r->host;
  host_rec **b = bucket_of(hs, h->name);
  while (*b != r)
    b = &(*b)->same_bucket;
  *b = r->same_bucket;
  if (r->prev != NULL)
    r->prev->next = h->next;
  else
    hs->head = h->next;
  if (h->next != NULL)
    rec_of(h->next)->prev = r->prev;
  else
    hs->tail = r->prev;
  tr_machine_ids_release(&hs->ids, h->trace_name);
  hs->live--;
  host_free(r);
}

static bool held(tr_hosts *hs, host_rec *r) {
  if (hs->ev == NULL || hs->ev->holds_host == NULL)
    return false;
  if (hs->ev->holds_host(hs->svc, &r->host))
    return true;
  for (size_t i = 0; i < r->n_guests; i++)
    if (hs->ev->holds_host(hs->svc, r->guests[i]))
      return true;
  return false;
}

/* Room on the gone list for a new entry (gone until its link is up): while max_gone hosts or
 * more are gone, retires the longest gone the sessions do not hold. O(gone hosts the sessions
 * hold) to find each, times the sessions' check. */
static void retire_gone(tr_hosts *hs) {
  host_rec *r = hs->gone_head;
  while (hs->num_gone > 0 && hs->num_gone >= hs->max_gone && r != NULL) {
    host_rec *next = r->gone_next;
    if (!held(hs, r)) {
      gone_remove(hs, r);
      hs->retired++;
      TR_INFO("hosts", "retired host %s: disconnected, in no session, the longest gone of the "
              "%zu kept (%llu retired so far); it is a new entry if it comes back",
              r->host.name, hs->max_gone, (unsigned long long)hs->retired);
      for (size_t i = 0; i < r->n_guests; i++)
        unmake(hs, rec_of(r->guests[i]));
      unmake(hs, r);
    }
    r = next;
  }
}

void tr_hosts_set_max_gone(tr_hosts *hs, size_t max_gone) { hs->max_gone = max_gone; }

uint64_t tr_hosts_retired(const tr_hosts *hs) { return hs->retired; }

int tr_hosts_get(tr_hosts *hs, const char *name, tr_host **out) {
  tr_host *h = tr_hosts_find(hs, name);
  if (h != NULL) {
    *out = h;
    return 0;
  }
  if (!tr_tls_valid_machine_name(name, strlen(name)))
    return TR_ERR_INVAL;
  retire_gone(hs);
  int rc = make(hs, name, out);
  if (rc == 0)
    gone_add(hs, rec_of(*out)); /* until its link is up: a Hello refused later leaves it gone */
  return rc;
}

/* ---- guest machines ---- */

tr_host *tr_hosts_guest_find(const tr_host *host, uint32_t guest_id) {
  const host_rec *r = (const host_rec *)host;
  for (size_t i = 0; guest_id != 0 && i < r->n_guests; i++)
    if (r->guests[i]->guest_id == guest_id)
      return r->guests[i];
  return NULL;
}

tr_host *const *tr_hosts_guests(const tr_host *host, size_t *n) {
  *n = ((const host_rec *)host)->n_guests;
  return ((const host_rec *)host)->guests;
}

tr_host *tr_hosts_update_entry(tr_host *host, const Tracerelay__ProducerUpdate *u) {
  return u->guest_id != 0 ? tr_hosts_guest_find(host, u->guest_id)
                          : tr_hosts_producer_owner(host, u->producer_id);
}

tr_host *tr_hosts_producer_owner(tr_host *host, uint32_t producer_id) {
  host_rec *r = rec_of(host);
  for (size_t i = 0; i < r->n_guests; i++)
    if (producer_find(r->guests[i], producer_id) != NULL)
      return r->guests[i];
  return host;
}

/* The entry of host's guest called name, made (and listed under host) if new. */
static int guest_entry(tr_hosts *hs, tr_host *host, const char *name, tr_host **out) {
  char full[2 * (TR_HOST_NAME_MAX + 1)]; /* a host's name is at most 64, a guest's 40 */
  snprintf(full, sizeof full, "%s/%s", host->name, name);
  *out = tr_hosts_find(hs, full);
  if (*out != NULL)
    return 0;
  host_rec *r = rec_of(host);
  if (r->n_guests >= TR_HOSTS_MAX_GUESTS)
    return TR_ERR_FULL;
  tr_host **grown = realloc(r->guests, (r->n_guests + 1) * sizeof *grown);
  if (grown == NULL)
    return TR_ERR_NOMEM;
  r->guests = grown;
  int rc = make(hs, full, out);
  if (rc < 0)
    return rc;
  (*out)->guest_of = host;
  r->guests[r->n_guests++] = *out;
  return 0;
}

int tr_hosts_guest_join(tr_hosts *hs, tr_host *host, const Tracerelay__GuestMachine *g,
                        tr_host **out, bool *joined) {
  const char *name = g->name ? g->name : "";
  size_t len = strlen(name);
  if (g->guest_id == 0 || len > TR_RELAY_GUEST_NAME_MAX || !tr_tls_valid_machine_name(name, len))
    return TR_ERR_PROTO;
  tr_host *other = tr_hosts_guest_find(host, g->guest_id);
  tr_host *h;
  int rc = guest_entry(hs, host, name, &h);
  if (rc < 0)
    return rc;
  if ((other != NULL && other != h) || (h->guest_id != 0 && h->guest_id != g->guest_id))
    return TR_ERR_PROTO; /* one id, one name, while relayed */
  rc = keep_system_info(h, g->system_info);
  if (rc < 0)
    return rc;
  *joined = h->link == NULL;
  h->guest_id = g->guest_id;
  h->agent_instance_id = host->agent_instance_id;
  h->restarted_unclean = host->restarted_unclean;
  if (*joined)
    tr_hosts_link_up(h, host->link, host->connected_since_ns, NULL);
  *out = h;
  return 0;
}

void tr_hosts_guest_hold_clock(tr_host *guest, const struct tr_clocksync_probe *ex) {
  rec_of(guest)->held_clock = *ex;
  rec_of(guest)->has_held_clock = true;
}

bool tr_hosts_guest_held_clock(tr_host *guest, struct tr_clocksync_probe *ex) {
  host_rec *r = rec_of(guest);
  if (!r->has_held_clock)
    return false;
  *ex = r->held_clock;
  r->has_held_clock = false;
  return true;
}

void tr_hosts_guest_leave(tr_host *guest) {
  guest->guest_id = 0;
  if (guest->link != NULL)
    tr_hosts_link_down(guest);
}

tr_relay_peer *tr_hosts_peer(tr_host *h) { return &rec_of(h)->peer; }

size_t tr_hosts_ordinal(const tr_host *h) { return ((const host_rec *)h)->ordinal; }
