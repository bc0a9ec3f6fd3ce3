/* test_link_ordered.c: the agent's frames that follow the data queued before them
 * (agent/link_ordered.h): a frame is ready once the entry before it is in a batch, with that
 * batch as after_seq; frames leave in the order they came, never overtaking one still waiting;
 * the error text is copied; the queue is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/link_ordered.h"
#include "relay/base/tr_error.h"

#include <string.h>

static void test_resolved_in_order_after_their_batch(void **state) {
  (void)state;
  tr_link_ordered q = {0};
  assert_true(tr_link_ordered_empty(&q));
  char error[] = "no such data source";
  struct tr_link_ordered_frame reply = {.request_id = 7, .error = error};
  struct tr_link_ordered_frame gone = {.gone_producer_id = 3};
  /* The reply waits for queue entry 10, the producer's end for entry 20. */
  assert_int_equal(tr_link_ordered_push(&q, &reply, 10, false, 0), 0);
  assert_int_equal(tr_link_ordered_push(&q, &gone, 20, false, 0), 0);
  error[0] = 'X'; /* the queue kept its own copy */
  assert_null(tr_link_ordered_ready(&q));

  tr_link_ordered_resolve(&q, 15, 4); /* entries up to 15 are in batches up to 4 */
  const struct tr_link_ordered_frame *p = tr_link_ordered_ready(&q);
  assert_non_null(p);
  assert_int_equal(p->request_id, 7);
  assert_string_equal(p->error, "no such data source");
  assert_int_equal(p->after_seq, 4);
  tr_link_ordered_pop(&q);
  assert_null(tr_link_ordered_ready(&q)); /* entry 20 is not in a batch yet */

  tr_link_ordered_resolve(&q, 25, 6);
  p = tr_link_ordered_ready(&q);
  assert_non_null(p);
  assert_int_equal(p->gone_producer_id, 3);
  assert_int_equal(p->after_seq, 6);
  tr_link_ordered_pop(&q);
  assert_true(tr_link_ordered_empty(&q));
  tr_link_ordered_free(&q);
}

static void test_a_ready_frame_waits_behind_an_earlier_one(void **state) {
  (void)state;
  tr_link_ordered q = {0};
  struct tr_link_ordered_frame first = {.request_id = 1}, second = {.request_id = 2};
  assert_int_equal(tr_link_ordered_push(&q, &first, 10, false, 0), 0);
  assert_int_equal(tr_link_ordered_push(&q, &second, 5, true, 3), 0); /* batched already */
  assert_null(tr_link_ordered_ready(&q));
  tr_link_ordered_resolve(&q, 10, 5);
  assert_int_equal(tr_link_ordered_ready(&q)->request_id, 1);
  assert_int_equal(tr_link_ordered_ready(&q)->after_seq, 5);
  tr_link_ordered_pop(&q);
  assert_int_equal(tr_link_ordered_ready(&q)->request_id, 2);
  assert_int_equal(tr_link_ordered_ready(&q)->after_seq, 3); /* resolved when pushed */
  tr_link_ordered_free(&q);
  assert_true(tr_link_ordered_empty(&q));
}

static void test_bounded(void **state) {
  (void)state;
  tr_link_ordered q = {0};
  struct tr_link_ordered_frame reply = {.request_id = 1};
  for (int i = 0; i < TR_LINK_MAX_PENDING_FRAMES; i++)
    assert_int_equal(tr_link_ordered_push(&q, &reply, 1, false, 0), 0);
  assert_int_equal(tr_link_ordered_push(&q, &reply, 1, false, 0), TR_ERR_FULL);
  tr_link_ordered_pop(&q);
  assert_int_equal(tr_link_ordered_push(&q, &reply, 1, false, 0), 0);
  tr_link_ordered_free(&q); /* frees what still waits (ASan checks) */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_resolved_in_order_after_their_batch),
      cmocka_unit_test(test_a_ready_frame_waits_behind_an_earlier_one),
      cmocka_unit_test(test_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
