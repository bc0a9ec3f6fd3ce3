/* test_due_heap.c: the intrusive min-heap against a plain array of what should be in it, over
 * long random runs of inserts, removes from anywhere and takes of the first, with the tree's
 * shape and links checked after every step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdlib.h>

#include "relay/base/due_heap.h"

#define NODES 300

static struct tr_due_node nodes[NODES];
static bool in_heap[NODES];

/* Checks n's subtree: links both ways, heap order; returns its size. Records the depth of each
 * leaf slot (a missing child) so that the caller can check the tree is complete. */
static size_t check_subtree(const struct tr_due_node *n, const struct tr_due_node *parent,
                            unsigned depth, unsigned *min_gap, unsigned *max_gap) {
  if (n == NULL) {
    *min_gap = depth < *min_gap ? depth : *min_gap;
    *max_gap = depth > *max_gap ? depth : *max_gap;
    return 0;
  }
  assert_ptr_equal(n->parent, parent);
  if (parent != NULL)
    assert_true(parent->due <= n->due);
  assert_true(in_heap[n - nodes]);
  return 1 + check_subtree(n->left, n, depth + 1, min_gap, max_gap) +
         check_subtree(n->right, n, depth + 1, min_gap, max_gap);
}

static void check(const struct tr_due_heap *h) {
  size_t expected = 0;
  uint64_t least = UINT64_MAX;
  for (unsigned i = 0; i < NODES; i++)
    if (in_heap[i]) {
      expected++;
      least = nodes[i].due < least ? nodes[i].due : least;
    }
  unsigned min_gap = UINT32_MAX, max_gap = 0;
  assert_int_equal(check_subtree(h->root, NULL, 0, &min_gap, &max_gap), expected);
  assert_int_equal(h->count, expected);
  assert_true(max_gap - min_gap <= 1); /* complete: every missing child on the last two levels */
  if (expected == 0)
    assert_null(tr_due_heap_first(h));
  else
    assert_int_equal(tr_due_heap_first(h)->due, least);
}

static void test_random_runs(void **state) {
  (void)state;
  srand(25);
  for (unsigned run = 0; run < 20; run++) {
    struct tr_due_heap h = {0};
    for (unsigned i = 0; i < NODES; i++)
      in_heap[i] = false;
    /* Few distinct due times in odd runs: many ties. */
    unsigned spread = run % 2 ? 8 : 1000000;
    for (unsigned step = 0; step < 4000; step++) {
      unsigned i = (unsigned)rand() % NODES;
      int op = rand() % 3;
      if (!in_heap[i]) {
        tr_due_heap_insert(&h, &nodes[i], (uint64_t)(rand() % spread));
        in_heap[i] = true;
      }
      else if (op == 0) {
        tr_due_heap_remove(&h, &nodes[i]);
        in_heap[i] = false;
      }
      else if (op == 1 && h.root != NULL) {
        struct tr_due_node *first = tr_due_heap_first(&h);
        tr_due_heap_remove(&h, first);
        in_heap[first - nodes] = false;
      }
      check(&h);
    }
    /* Emptied by taking the first each time: in order of due time. */
    uint64_t last = 0;
    while (h.root != NULL) {
      struct tr_due_node *first = tr_due_heap_first(&h);
      assert_true(first->due >= last);
      last = first->due;
      tr_due_heap_remove(&h, first);
      in_heap[first - nodes] = false;
      check(&h);
    }
  }
}

static void test_one_node(void **state) {
  (void)state;
  struct tr_due_heap h = {0};
  assert_null(tr_due_heap_first(&h));
  tr_due_heap_insert(&h, &nodes[0], 7);
  assert_ptr_equal(tr_due_heap_first(&h), &nodes[0]);
  assert_int_equal(nodes[0].due, 7);
  tr_due_heap_remove(&h, &nodes[0]);
  assert_null(tr_due_heap_first(&h));
  assert_int_equal(h.count, 0);
  /* Inserted again, with another time. */
  tr_due_heap_insert(&h, &nodes[0], 3);
  tr_due_heap_insert(&h, &nodes[1], 1);
  assert_ptr_equal(tr_due_heap_first(&h), &nodes[1]);
  tr_due_heap_remove(&h, &nodes[0]);
  assert_ptr_equal(tr_due_heap_first(&h), &nodes[1]);
  assert_null(nodes[1].left);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_random_runs),
      cmocka_unit_test(test_one_node),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
