/* due_heap.h: a binary min-heap of things due at a time, intrusive: the caller embeds a
 * tr_due_node in each element, so the heap allocates nothing and cannot fail. It answers "what
 * is due first?" without looking at what is not due yet, which a list of timers walked at every
 * tick (relay/clock/clock_probe.c's probe schedule, once) cannot.
 *
 * Guarantees: tr_due_heap_first is a node with the smallest due time (among equal due times,
 * any one of them); a node is in at most one heap at a time, and only between its insert and its
 * remove (the caller keeps track). A node's due time changes only by removing and inserting it.
 * Cost: insert and remove O(log n) (a complete binary tree of pointers, its shape kept by the
 * count: position k's path from the root is k's bits), first O(1); one node is 32 bytes.
 * Not thread-safe. */
#ifndef TR_DUE_HEAP_H
#define TR_DUE_HEAP_H

#include <stddef.h>
#include <stdint.h>

struct tr_due_node {
  struct tr_due_node *parent, *left, *right;
  uint64_t due; /* set by tr_due_heap_insert, read by the caller */
};

/* Zero it to make it empty. */
struct tr_due_heap {
  struct tr_due_node *root;
  size_t count;
};

void tr_due_heap_insert(struct tr_due_heap *h, struct tr_due_node *n, uint64_t due);
/* n must be in h. */
void tr_due_heap_remove(struct tr_due_heap *h, struct tr_due_node *n);
/* The node due first, NULL when h is empty. */
static inline struct tr_due_node *tr_due_heap_first(const struct tr_due_heap *h) {
  return h->root;
}

#endif
