/* due_heap.c: the intrusive binary min-heap of due_heap.h.
 *
 * The tree is complete: its nodes are positions 1..count in breadth-first order, so the node at
 * position k is reached from the root by k's bits below the highest one (0 left, 1 right), and
 * the next insert goes to position count + 1. A node moves by swapping places with its parent,
 * which rewires the pointers of both, their children and the grandparent. */
#include "relay/base/due_heap.h"

static struct tr_due_node *node_at(const struct tr_due_heap *h, size_t k) {
  struct tr_due_node *n = h->root;
  int bit = 63 - __builtin_clzll((unsigned long long)k);
  while (--bit >= 0)
    n = (k >> bit) & 1 ? n->right : n->left;
  return n;
}

/* c takes the place of its parent p, which becomes c's child. */
static void swap_with_parent(struct tr_due_heap *h, struct tr_due_node *c) {
  struct tr_due_node *p = c->parent, *gp = p->parent;
  struct tr_due_node *c_left = c->left, *c_right = c->right;
  if (p->left == c) {
    c->left = p;
    c->right = p->right;
    if (c->right != NULL)
      c->right->parent = c;
  }
  else {
    c->right = p;
    c->left = p->left;
    if (c->left != NULL)
      c->left->parent = c;
  }
  p->left = c_left;
  p->right = c_right;
  if (c_left != NULL)
    c_left->parent = p;
  if (c_right != NULL)
    c_right->parent = p;
  p->parent = c;
  c->parent = gp;
  if (gp == NULL)
    h->root = c;
  else if (gp->left == p)
    gp->left = c;
  else
    gp->right = c;
}

static void sift_up(struct tr_due_heap *h, struct tr_due_node *n) {
  while (n->parent != NULL && n->due < n->parent->due)
    swap_with_parent(h, n);
}

static void sift_down(struct tr_due_heap *h, struct tr_due_node *n) {
  for (;;) {
    struct tr_due_node *least = n->left;
    if (n->right != NULL && n->right->due < least->due)
      least = n->right;
    if (least == NULL || least->due >= n->due)
      return;
    swap_with_parent(h, least);
  }
}

void tr_due_heap_insert(struct tr_due_heap *h, struct tr_due_node *n, uint64_t due) {
  *n = (struct tr_due_node){.due = due};
  size_t k = ++h->count;
  if (k == 1) {
    h->root = n;
    return;
  }
  n->parent = node_at(h, k / 2);
  if (k & 1)
    n->parent->right = n;
  else
    n->parent->left = n;
  sift_up(h, n);
}

void tr_due_heap_remove(struct tr_due_heap *h, struct tr_due_node *n) {
  /* The last node leaves its place and takes n's, then moves to where its due time belongs. */
  struct tr_due_node *last = node_at(h, h->count--);
  if (last->parent == NULL) {
    h->root = NULL;
    return;
  }
  if (last->parent->left == last)
    last->parent->left = NULL;
  else
    last->parent->right = NULL;
  if (last == n)
    return;
  last->parent = n->parent;
  last->left = n->left;
  last->right = n->right;
  if (last->left != NULL)
    last->left->parent = last;
  if (last->right != NULL)
    last->right->parent = last;
  if (last->parent == NULL)
    h->root = last;
  else if (last->parent->left == n)
    last->parent->left = last;
  else
    last->parent->right = last;
  if (last->parent != NULL && last->due < last->parent->due)
    sift_up(h, last);
  else
    sift_down(h, last);
}
