/* link_ordered.h: the agent's frames that must follow the data queued before them: a
 * CommandReply, or the notice that a producer is gone (PRODUCER_DISCONNECTED: its data source
 * may be what a stopping session waits for). Each carries after_seq, the last batch queued once
 * every chunk queue entry pushed before it is in a batch; the service applies it after that
 * batch (docs/relay-protocol.md, Producers).
 *
 * A FIFO: a frame waits until the entry pushed before it is in a batch (resolved), and frames
 * go out in the order they came, each after those before it. At most TR_LINK_MAX_PENDING_FRAMES
 * wait (made while disconnected, they wait for the next Welcome). Cost: O(waiting) to resolve,
 * after each batch. Pure memory: sending is the caller's. */
#ifndef TR_LINK_ORDERED_H
#define TR_LINK_ORDERED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR_LINK_MAX_PENDING_FRAMES 1024

struct tr_link_ordered_frame {
  struct tr_link_ordered_frame *next;
  uint64_t wait_qseq; /* the last chunk queue entry pushed before the frame */
  bool resolved;      /* that entry is in a batch: after_seq is known */
  uint64_t after_seq;
  uint32_t gone_producer_id; /* non-zero: PRODUCER_DISCONNECTED; else a reply: */
  uint64_t request_id;
  char *error;
};

/* Zero-initialised is empty. Fields are link_ordered.c's. */
typedef struct tr_link_ordered {
  struct tr_link_ordered_frame *head, *tail;
  size_t n;
} tr_link_ordered;

/* Keeps a copy of what (gone_producer_id, request_id, error) behind the others, waiting for
 * chunk queue entry wait_qseq; batched: it is in a batch already, and after_seq is known.
 * 0, TR_ERR_FULL or TR_ERR_NOMEM. */
int tr_link_ordered_push(tr_link_ordered *q, const struct tr_link_ordered_frame *what,
                         uint64_t wait_qseq, bool batched, uint64_t after_seq);
/* Entries up to batched_qseq are in batches, the last of which is batch last_seq: the frames
 * that waited for them come after it. */
void tr_link_ordered_resolve(tr_link_ordered *q, uint64_t batched_qseq, uint64_t last_seq);
/* The first frame, if it may go now (resolved); else NULL. */
const struct tr_link_ordered_frame *tr_link_ordered_ready(const tr_link_ordered *q);
/* Forgets the first frame (it was sent). */
void tr_link_ordered_pop(tr_link_ordered *q);
bool tr_link_ordered_empty(const tr_link_ordered *q);
void tr_link_ordered_free(tr_link_ordered *q);

#endif
