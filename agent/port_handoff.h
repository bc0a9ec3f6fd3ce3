/* port_handoff.h: what passes between the producer-port thread and the link's loop
 * (agent/port_thread.h), in both directions, and the one lock that makes it safe.
 *
 * - Port to link: the outbox, a bounded chunk queue (relay/producer/chunk_queue.h) into which
 *   the producer port copies committed chunks, patches and flush acks (it takes the lock for
 *   each CommitData: tr_producer_port_config.queue_lock), and events (a producer connected, a
 *   data source started, a command's result...), each stamped with the outbox's last sequence
 *   number when it was posted, so the link's side can put it back in order among the entries.
 * - Link to port: commands (set up, start, stop, flush a data source...).
 * Each side wakes the other with a uv_async_t on the other's loop (uv_async_send is libuv's
 * one call that may be made from any thread; many sends before the wake-up make one). A wake-up
 * is sent with the lock held, and the side that owns a uv_async_t takes it out of the handoff
 * under the lock before closing it (tr_port_handoff_closing), so no send reaches a closed one.
 * Chunks need not reach the link's loop at once (they wait for a batch there anyway): after a
 * commit the port wakes the link only if no wake-up is on its way since the link's last take,
 * or, once, when the outbox passed urge_bytes; the link takes at once when urged or when events
 * wait (tr_port_handoff_urgent), else a few milliseconds later. So the link's loop wakes a few
 * hundred times a second, not once per commit, and leaves the CPU to the port's thread.
 * The outbox admits no more than the link's chunk queue has room for (tr_port_handoff_set_room,
 * at each take; never under TR_PORT_OUTBOX_FLOOR, so that patches and flush acks always find
 * room): when the link falls behind, chunks are dropped as they are committed, before they are
 * copied, as the chunk queue alone would, not copied and then dropped on the link's side.
 *
 * Why it is safe (no atomics, nothing for a thread sanitizer to doubt): every field below the
 * lock is read and written only with `lock` held, on both threads; what a take hands over (a
 * list of messages, the outbox's entries and drop counters) is unlinked under the lock and
 * from then on reachable from the taking thread only, and a posting thread keeps no pointer
 * to what it posted. Memory is bounded by the outbox's bound (chunks beyond it are dropped and
 * counted, as in any chunk queue); messages are few (one per command or producer event).
 *
 * The lock is held for the copy-out of one CommitData on the port thread, and for taking the
 * lists (O(1)) on the link's: the port thread, whose latency a producer waits on, waits at
 * most for a take. */
#ifndef TR_PORT_HANDOFF_H
#define TR_PORT_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "relay/producer/chunk_queue.h"

#define TR_PORT_OUTBOX_FLOOR (64u << 10)

/* A command or an event: embed it first in the message's own struct. */
typedef struct tr_port_msg {
  struct tr_port_msg *next;
  uint64_t after_qseq; /* an event's: the last outbox entry pushed before it (0: none) */
} tr_port_msg;

typedef struct tr_port_handoff {
  uv_mutex_t lock;
  /* With the lock held only: */
  tr_chunkq outbox;
  tr_port_msg *events, *events_tail;
  tr_port_msg *commands, *commands_tail;
  bool link_woken, link_urged; /* since the link's last take: a wake-up / the urge was sent */
  size_t urge_bytes;
  size_t outbox_cap; /* the outbox's bound at most */
  uv_async_t *wake_link; /* on the link's loop; set before the threads share the handoff */
  uv_async_t *wake_port; /* on the port's loop; likewise */
} tr_port_handoff;

/* 0 or a libuv error (the mutex). outbox_bytes: the outbox's bound; urge_bytes: what the outbox
 * holds when the link should take it at once. */
int tr_port_handoff_init(tr_port_handoff *h, size_t outbox_bytes, size_t urge_bytes);
/* Frees what is still queued (free_event, free_command for each message); no thread may use h
 * any more. */
void tr_port_handoff_free(tr_port_handoff *h, void (*free_event)(tr_port_msg *m),
                          void (*free_command)(tr_port_msg *m));

/* The owner of `wake` (wake_link or wake_port) is about to close it: no more sends to it. */
void tr_port_handoff_closing(tr_port_handoff *h, uv_async_t *wake);
/* Bytes in the outbox now (either side). */
size_t tr_port_handoff_outbox_bytes(tr_port_handoff *h);

/* The port's side. */
/* Appends an event after every outbox entry pushed so far, and wakes the link. */
void tr_port_handoff_post_event(tr_port_handoff *h, tr_port_msg *m);
/* The outbox has new entries: wakes the link if no wake-up is on its way, or to urge it. */
void tr_port_handoff_wake_link(tr_port_handoff *h);
/* Every command posted so far, oldest first (NULL if none); the caller owns them. */
tr_port_msg *tr_port_handoff_take_commands(tr_port_handoff *h);

/* The link's side. */
/* Appends a command and wakes the port. */
void tr_port_handoff_post_command(tr_port_handoff *h, tr_port_msg *m);
/* The link's chunk queue has room for `room` bytes: the outbox's bound until the next call. */
void tr_port_handoff_set_room(tr_port_handoff *h, size_t room);
/* True if the link should take now: events wait, or the outbox holds urge_bytes. */
bool tr_port_handoff_urgent(tr_port_handoff *h);
/* Every event posted so far, oldest first (NULL if none), and into *entries (uninitialised or
 * freed: tr_chunkq_take) every outbox entry and drop counter; the caller owns both. Put
 * together in order: an event goes after the entries up to its after_qseq. */
tr_port_msg *tr_port_handoff_take_events(tr_port_handoff *h, tr_chunkq *entries);

#endif
