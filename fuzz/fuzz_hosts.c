/* fuzz_hosts.c: the service's side of the relay link past frame decoding: what an agent's
 * RelayFrames do to the host table (service/hosts.c) and to the batch sequence bookkeeping
 * (relay/link/relay_session.c), dispatched as link_server.c's on_frame does: Hello (agent
 * instances, acked_seq, system info copies), ProducerUpdate (producers and their descriptor
 * copies, resync), ChunkBatch (seq bookkeeping and items), CommandReply (held until their
 * batch, released in order), AgentStats. The sessions' side of the upward calls is a stub that
 * checks what hosts.h promises: the producer a call names is findable during the call.
 *
 * Input: a stream of relay frames (uint32 LE length + RelayFrame), as on the link; the first
 * byte picks the host name (two hosts, so state survives a second machine's traffic), and a
 * payload of exactly one byte 0xff ends the connection (resync_end, as a reconnect would do). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/base/log.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_session.h"
#include "service/hosts.h"

static tr_relay_codec codec;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (tr_relay_codec_init(&codec, 1, TR_RELAY_MIN_FRAME * 16) < 0)
    abort();
  tr_log_set_level(TR_LOG_ERROR); /* every agent restart logs a line: millions of them */
  return 0;
}

/* ---- the sessions' side, stubbed (session.c is not linked) ---- */

static void on_producers_changed(tr_service *svc, tr_host *host, uint32_t producer_id) {
  (void)svc;
  bool found = false;
  for (size_t i = 0; i < host->num_producers; i++) {
    const tr_remote_producer *p = &host->producers[i];
    found |= p->id == producer_id;
    for (size_t j = 0; j < p->num_data_sources; j++)
      if (p->data_sources[j] == NULL)
        abort();
  }
  (void)found; /* an update for an unknown producer is legal: it may have been ended */
}

static bool in_hello; /* a Hello from a restarted agent releases every held reply */

static void on_command_reply(tr_service *svc, tr_host *host,
                             const Tracerelay__CommandReply *reply) {
  (void)svc;
  if (!in_hello && reply->after_seq > tr_hosts_peer(host)->stored_seq)
    abort(); /* released before the batch it waits for was stored */
}

/* hosts.c makes only these two of the link's upward calls. */
static const struct tr_link_events events = {.producers_changed = on_producers_changed,
                                             .command_reply = on_command_reply};

/* ---- one connection ---- */

struct conn {
  tr_hosts *hs;
  tr_host *host;
  bool welcomed, resyncing;
};

static void on_batch(struct conn *c, const Tracerelay__ChunkBatch *batch) {
  tr_relay_peer *seqs = tr_hosts_peer(c->host);
  uint64_t before = seqs->stored_seq;
  int rc = tr_relay_peer_batch(seqs, batch->seq);
  if (rc <= 0)
    return;
  if (seqs->stored_seq < before)
    abort(); /* stored_seq never goes back within an agent instance */
  Tracerelay__ChunkItems *owned = NULL;
  Tracerelay__ChunkItem **items = NULL;
  size_t n = 0;
  if (tr_relay_batch_items(&codec, batch, &owned, &items, &n) == 0) {
    for (size_t i = 0; i < n; i++)
      if (items[i] == NULL)
        abort();
    tr_relay_items_free(owned);
  }
  tr_hosts_release_ordered(c->hs, c->host);
}

/* Returns false when the connection ends (a protocol error in link_server.c). */
static bool on_frame(struct conn *c, Tracerelay__RelayFrame *f) {
  bool ok = true;
  if (!c->welcomed) {
    uint64_t welcome_seq;
    in_hello = true;
    ok = f->msg_case == TRACERELAY__RELAY_FRAME__MSG_HELLO &&
         tr_hosts_hello(c->hs, c->host, f->hello, &welcome_seq) == 0;
    in_hello = false;
    if (ok) {
      if (c->host->system_info == NULL ||
          strcmp(c->host->system_info->machine_name, c->host->name) != 0)
        abort(); /* the certificate's name, whatever the agent wrote */
      c->welcomed = true;
      c->resyncing = tr_hosts_resync_begin(c->hs, c->host) == 0;
    }
    tr_relay_frame_free(f);
    return ok;
  }
  if (c->resyncing && !(f->msg_case == TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE &&
                        f->producer_update->state ==
                            TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_CONNECTED)) {
    c->resyncing = false;
    tr_hosts_resync_end(c->hs, c->host);
  }
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE:
    if (f->producer_update->state == TRACERELAY__PRODUCER_UPDATE__STATE__PRODUCER_DISCONNECTED &&
        f->producer_update->has_after_seq && f->producer_update->producer_id != 0) {
      ok = tr_hosts_hold_ordered(c->host, f) == 0;
      f = NULL; /* taken, even on failure */
      if (ok)
        tr_hosts_release_ordered(c->hs, c->host);
      break;
    }
    ok = tr_hosts_producer_update(c->hs, c->host, f->producer_update) == 0;
    if (c->host->num_producers > TR_HOSTS_MAX_PRODUCERS)
      abort();
    break;
  case TRACERELAY__RELAY_FRAME__MSG_CHUNK_BATCH:
    on_batch(c, f->chunk_batch);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_COMMAND_REPLY:
    ok = tr_hosts_hold_ordered(c->host, f) == 0;
    f = NULL; /* taken, even on failure */
    if (ok)
      tr_hosts_release_ordered(c->hs, c->host);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_AGENT_STATS:
    tr_hosts_agent_stats(c->host, f->agent_stats);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    ok = false;
    break;
  default:
    break;
  }
  tr_relay_frame_free(f);
  return ok;
}

static void end_conn(struct conn *c) {
  if (c->resyncing)
    tr_hosts_resync_end(c->hs, c->host);
  c->welcomed = c->resyncing = false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const names[] = {"web-1", "db-2.example"};
  if (size < 1)
    return 0;
  tr_hosts *hs;
  if (tr_hosts_new(NULL, &events, &hs) < 0)
    abort();
  struct conn c = {.hs = hs};
  if (tr_hosts_get(hs, names[data[0] & 1], &c.host) < 0)
    abort();
  data++;
  size--;
  tr_relay_reader r;
  if (tr_relay_reader_init(&r, TR_RELAY_MIN_FRAME * 16) < 0)
    abort();
  bool open = true;
  while (size > 0 && open) {
    int taken = tr_frame_reader_push(&r, data, size);
    if (taken < 0)
      break;
    data += taken;
    size -= (size_t)taken;
    const uint8_t *payload;
    size_t len;
    int rc = 0;
    while (open && (rc = tr_frame_reader_next(&r, &payload, &len)) == 1) {
      if (len == 1 && payload[0] == 0xff) {
        end_conn(&c); /* a reconnect: the next frame must be a Hello again */
        continue;
      }
      Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
      if (f == NULL || f->msg_case == TRACERELAY__RELAY_FRAME__MSG__NOT_SET) {
        tr_relay_frame_free(f);
        open = false;
        break;
      }
      open = on_frame(&c, f);
    }
    if (rc < 0)
      break;
  }
  end_conn(&c);
  tr_frame_reader_free(&r);
  tr_hosts_free(hs);
  return 0;
}
