/* test_port_handoff.c: what passes between the producer-port thread and the link's loop
 * (agent/port_handoff.h, relay/producer/chunk_queue.h's take and move): on one thread, events
 * land in their place among the chunks and every drop is counted once, at the outbox or at
 * the chunk queue, and the link is woken once until it takes (again when urged, and for every
 * event); across two threads with two loops (as the agent runs them), bursts of
 * chunks and their events, commands the other way, nothing reordered, lost uncounted or
 * leaked (the ASan build checks the memory). Every field the threads share is under the one
 * mutex, so a thread sanitizer has nothing to doubt; built by hand with gcc -fsanitize=thread
 * (this file, agent/port_handoff.c, relay/producer/chunk_queue.c, relay/trace/chunk.c, libuv
 * and cmocka) it runs clean. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agent/port_handoff.h"
#include "relay/base/tr_error.h"

#define PAYLOAD 100

struct test_msg {
  tr_port_msg msg;
  uint32_t value; /* an event: the last chunk id pushed before it; a command: a burst */
};

static struct test_msg *msg_new(uint32_t value) {
  struct test_msg *m = calloc(1, sizeof(*m));
  assert_non_null(m);
  m->value = value;
  return m;
}

static void free_msg(tr_port_msg *m) { free(m); }

/* The port's side: one chunk with this id, pushed as the producer port does. */
static int push_chunk(tr_port_handoff *h, uint32_t id) {
  static const uint8_t payload[PAYLOAD] = {1, 2, 3};
  tr_chunkq_chunk c = {.producer_id = 7, .target_buffer = 2,
                       .header = {.chunk_id = id, .writer_id = 1, .count = 0}};
  uv_mutex_lock(&h->lock);
  int rc = tr_chunkq_push_chunk(&h->outbox, &c, payload, sizeof(payload), sizeof(payload));
  uv_mutex_unlock(&h->lock);
  return rc;
}

/* The link's side: what was posted, into q in order; each event checked against the last
 * chunk id in q when its turn comes. Returns the events seen. */
static unsigned take_into(tr_port_handoff *h, tr_chunkq *q, uint32_t *last_id) {
  tr_chunkq entries;
  tr_port_msg *m = tr_port_handoff_take_events(h, &entries);
  unsigned n = 0;
  while (m != NULL) {
    struct test_msg *t = (struct test_msg *)m;
    m = m->next;
    tr_chunkq_move(&entries, q, t->msg.after_qseq);
    /* every chunk pushed before the event is in q now (or counted as dropped), none after */
    if (q->tail != NULL)
      *last_id = q->tail->u.chunk.header.chunk_id;
    assert_true(*last_id <= t->value);
    if (entries.head != NULL)
      assert_true(entries.head->u.chunk.header.chunk_id > t->value);
    n++;
    free(t);
  }
  tr_chunkq_move(&entries, q, UINT64_MAX);
  if (q->tail != NULL)
    *last_id = q->tail->u.chunk.header.chunk_id;
  tr_chunkq_move_drops(&entries, q);
  tr_chunkq_free(&entries);
  return n;
}

static unsigned wakes;
static void on_wake(uv_async_t *a) {
  (void)a;
  wakes++;
}

/* The link's wake-ups since the last call. */
static unsigned wakes_seen(uv_loop_t *loop) {
  wakes = 0;
  uv_run(loop, UV_RUN_NOWAIT);
  return wakes;
}

/* One thread: order, both bounds, and the drop counters moved once. */
static void test_order_and_drops(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  uv_async_t wake_link, wake_port;
  assert_int_equal(uv_async_init(&loop, &wake_link, on_wake), 0);
  assert_int_equal(uv_async_init(&loop, &wake_port, on_wake), 0);
  size_t cost = tr_chunkq_entry_cost(PAYLOAD);
  tr_port_handoff h;
  assert_int_equal(tr_port_handoff_init(&h, 3 * cost, 2 * cost), 0);
  h.wake_link = &wake_link;
  h.wake_port = &wake_port;
  tr_chunkq q;
  tr_chunkq_init(&q, 4 * cost);

  /* chunks 1, 2, an event, chunk 3, an event, chunk 4 (the outbox holds 3: dropped) */
  assert_int_equal(push_chunk(&h, 1), 0);
  assert_int_equal(push_chunk(&h, 2), 0);
  tr_port_handoff_post_event(&h, &msg_new(2)->msg);
  assert_int_equal(push_chunk(&h, 3), 0);
  tr_port_handoff_post_event(&h, &msg_new(3)->msg);
  assert_int_equal(push_chunk(&h, 4), TR_ERR_FULL);
  assert_int_equal(tr_port_handoff_outbox_bytes(&h), 3 * cost);
  uint32_t last = 0;
  assert_int_equal(take_into(&h, &q, &last), 2);
  assert_int_equal(last, 3);
  assert_int_equal(tr_port_handoff_outbox_bytes(&h), 0);
  assert_int_equal(q.len, 3);
  assert_int_equal(q.total.chunks, 1); /* the outbox's drop, now the queue's */
  assert_int_equal(tr_chunkq_drops_of(&q, 7).chunks, 1);
  assert_int_equal(tr_chunkq_drops_of(&q, 7).bytes, PAYLOAD);

  /* the outbox is empty again and numbers on; the queue (room for 1 more) drops what it
   * cannot hold, counted there */
  assert_int_equal(push_chunk(&h, 5), 0);
  assert_int_equal(push_chunk(&h, 6), 0);
  tr_port_handoff_post_event(&h, &msg_new(6)->msg);
  assert_int_equal(take_into(&h, &q, &last), 1);
  assert_int_equal(q.len, 4);
  assert_int_equal(last, 5);
  assert_int_equal(q.total.chunks, 2);
  assert_int_equal(tr_chunkq_drops_of(&q, 7).chunks, 2);
  /* sequence numbers of the queue stay gapless */
  uint64_t seq = tr_chunkq_peek(&q)->seq;
  for (const tr_chunkq_entry *e = q.head; e != NULL; e = e->next)
    assert_int_equal(e->seq, seq++);

  /* commands the other way, in order */
  tr_port_handoff_post_command(&h, &msg_new(1)->msg);
  tr_port_handoff_post_command(&h, &msg_new(2)->msg);
  tr_port_msg *m = tr_port_handoff_take_commands(&h);
  assert_int_equal(((struct test_msg *)m)->value, 1);
  assert_int_equal(((struct test_msg *)m->next)->value, 2);
  assert_null(m->next->next);
  assert_null(tr_port_handoff_take_commands(&h));
  free(m->next);
  free(m);

  /* what is left at the end is freed */
  assert_int_equal(push_chunk(&h, 7), 0);
  tr_port_handoff_post_event(&h, &msg_new(7)->msg);
  tr_port_handoff_post_command(&h, &msg_new(3)->msg);
  tr_port_handoff_free(&h, free_msg, free_msg);
  tr_chunkq_free(&q);
  uv_close((uv_handle_t *)&wake_link, NULL);
  uv_close((uv_handle_t *)&wake_port, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* After a commit the link is woken once until it takes, and once more when the outbox passes
 * urge_bytes; an event always wakes it, and asks it to take at once. */
static void test_wake_rule(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  uv_async_t wake_link, wake_port;
  assert_int_equal(uv_async_init(&loop, &wake_link, on_wake), 0);
  assert_int_equal(uv_async_init(&loop, &wake_port, on_wake), 0);
  size_t cost = tr_chunkq_entry_cost(PAYLOAD);
  tr_port_handoff h;
  assert_int_equal(tr_port_handoff_init(&h, 10 * cost, 3 * cost), 0);
  h.wake_link = &wake_link;
  h.wake_port = &wake_port;
  uint32_t id = 0;
  for (int round = 0; round < 2; round++) {
    assert_int_equal(push_chunk(&h, ++id), 0);
    tr_port_handoff_wake_link(&h);
    assert_int_equal(wakes_seen(&loop), 1);
    assert_false(tr_port_handoff_urgent(&h));
    assert_int_equal(push_chunk(&h, ++id), 0);
    tr_port_handoff_wake_link(&h);
    assert_int_equal(wakes_seen(&loop), 0); /* one is on its way */
    assert_int_equal(push_chunk(&h, ++id), 0);
    tr_port_handoff_wake_link(&h);
    assert_int_equal(wakes_seen(&loop), 1); /* urged: 3 chunks */
    assert_true(tr_port_handoff_urgent(&h));
    assert_int_equal(push_chunk(&h, ++id), 0);
    tr_port_handoff_wake_link(&h);
    assert_int_equal(wakes_seen(&loop), 0); /* urged once */
    tr_chunkq entries;
    assert_null(tr_port_handoff_take_events(&h, &entries));
    assert_int_equal(entries.len, 4);
    tr_chunkq_free(&entries);
    assert_false(tr_port_handoff_urgent(&h)); /* and the next round starts afresh */
  }
  tr_port_handoff_post_event(&h, &msg_new(id)->msg);
  assert_int_equal(wakes_seen(&loop), 1);
  assert_true(tr_port_handoff_urgent(&h));
  tr_port_handoff_free(&h, free_msg, free_msg);
  uv_close((uv_handle_t *)&wake_link, NULL);
  uv_close((uv_handle_t *)&wake_port, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* Pushes chunks until the outbox refuses one; returns how many it took. */
static unsigned fill(tr_port_handoff *h) {
  unsigned n = 0;
  while (push_chunk(h, n + 1) == 0)
    n++;
  tr_chunkq entries;
  assert_null(tr_port_handoff_take_events(h, &entries));
  assert_int_equal(entries.total.chunks, 1); /* the refused one, counted */
  tr_chunkq_free(&entries);
  return n;
}

/* The outbox admits what the link's queue has room for, between a floor and its own bound. */
static void test_room(void **state) {
  (void)state;
  size_t cost = tr_chunkq_entry_cost(PAYLOAD);
  tr_port_handoff h;
  assert_int_equal(tr_port_handoff_init(&h, 4 * TR_PORT_OUTBOX_FLOOR, 1), 0);
  assert_int_equal(fill(&h), 4 * TR_PORT_OUTBOX_FLOOR / cost);
  tr_port_handoff_set_room(&h, 0);
  assert_int_equal(fill(&h), TR_PORT_OUTBOX_FLOOR / cost);
  tr_port_handoff_set_room(&h, 2 * TR_PORT_OUTBOX_FLOOR);
  assert_int_equal(fill(&h), 2 * TR_PORT_OUTBOX_FLOOR / cost);
  tr_port_handoff_set_room(&h, SIZE_MAX);
  assert_int_equal(fill(&h), 4 * TR_PORT_OUTBOX_FLOOR / cost);
  tr_port_handoff_free(&h, free_msg, free_msg);
}

/* ---- two threads ---- */

#define BURSTS 200
#define BURST_CHUNKS 50
#define WINDOW 8 /* bursts asked for and not yet seen; the outbox holds 4 */

struct two {
  tr_port_handoff h;
  uv_loop_t link_loop, port_loop;
  uv_async_t wake_link, wake_port;
  uv_thread_t thread;
  /* the port thread's */
  uint32_t next_id;
  unsigned bursts_run;
  /* the link's */
  tr_chunkq q;
  uint32_t last_id;
  unsigned events, commands;
  uint64_t chunks_seen;
};

/* The port thread: each command is a burst of chunks and then an event naming the last. */
static void on_port_wake(uv_async_t *a) {
  struct two *t = a->data;
  tr_port_msg *m = tr_port_handoff_take_commands(&t->h);
  while (m != NULL) {
    tr_port_msg *next = m->next;
    assert_int_equal(((struct test_msg *)m)->value, t->bursts_run);
    free(m);
    for (int i = 0; i < BURST_CHUNKS; i++) {
      push_chunk(&t->h, ++t->next_id); /* a full outbox drops and counts */
      tr_port_handoff_wake_link(&t->h);
    }
    tr_port_handoff_post_event(&t->h, &msg_new(t->next_id)->msg);
    if (++t->bursts_run == BURSTS) { /* the loop ends: the thread too */
      tr_port_handoff_closing(&t->h, &t->wake_port);
      uv_close((uv_handle_t *)&t->wake_port, NULL);
    }
    m = next;
  }
}

static void run_port(void *arg) {
  struct two *t = arg;
  uv_run(&t->port_loop, UV_RUN_DEFAULT);
}

static void post_commands(struct two *t) {
  while (t->commands < BURSTS && t->commands < t->events + WINDOW)
    tr_port_handoff_post_command(&t->h, &msg_new(t->commands++)->msg);
}

/* The link: takes, checks the order, consumes the queue as the link would, asks for more. */
static void on_link_wake(uv_async_t *a) {
  struct two *t = a->data;
  t->events += take_into(&t->h, &t->q, &t->last_id);
  post_commands(t);
  tr_chunkq_entry *e;
  uint32_t prev = 0;
  while ((e = tr_chunkq_pop(&t->q)) != NULL) {
    assert_true(e->u.chunk.header.chunk_id > prev);
    prev = e->u.chunk.header.chunk_id;
    t->chunks_seen++;
    tr_chunkq_entry_free(e);
  }
  if (t->events == BURSTS) {
    tr_port_handoff_closing(&t->h, &t->wake_link);
    uv_close((uv_handle_t *)&t->wake_link, NULL);
  }
}

static void test_two_threads(void **state) {
  (void)state;
  struct two *t = calloc(1, sizeof(*t));
  assert_non_null(t);
  assert_int_equal(uv_loop_init(&t->link_loop), 0);
  assert_int_equal(uv_loop_init(&t->port_loop), 0);
  assert_int_equal(uv_async_init(&t->link_loop, &t->wake_link, on_link_wake), 0);
  assert_int_equal(uv_async_init(&t->port_loop, &t->wake_port, on_port_wake), 0);
  t->wake_link.data = t->wake_port.data = t;
  /* room for 4 bursts of the WINDOW asked for: drops happen when the link lags */
  size_t outbox_bytes = 4 * BURST_CHUNKS * tr_chunkq_entry_cost(PAYLOAD);
  assert_int_equal(tr_port_handoff_init(&t->h, outbox_bytes, outbox_bytes / 4), 0);
  t->h.wake_link = &t->wake_link;
  t->h.wake_port = &t->wake_port;
  tr_chunkq_init(&t->q, SIZE_MAX / 2);
  assert_int_equal(uv_thread_create(&t->thread, run_port, t), 0);
  post_commands(t);
  uv_run(&t->link_loop, UV_RUN_DEFAULT);
  uv_thread_join(&t->thread);

  assert_int_equal(t->events, BURSTS);
  assert_int_equal(t->bursts_run, BURSTS);
  /* every chunk arrived or was counted as dropped, once */
  assert_int_equal(t->chunks_seen + t->q.total.chunks, (uint64_t)BURSTS * BURST_CHUNKS);
  print_message("%llu chunks arrived, %llu dropped by the outbox\n",
                (unsigned long long)t->chunks_seen, (unsigned long long)t->q.total.chunks);
  tr_port_handoff_free(&t->h, free_msg, free_msg);
  tr_chunkq_free(&t->q);
  assert_int_equal(uv_loop_close(&t->port_loop), 0);
  assert_int_equal(uv_loop_close(&t->link_loop), 0);
  free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_order_and_drops),
      cmocka_unit_test(test_wake_rule),
      cmocka_unit_test(test_room),
      cmocka_unit_test(test_two_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
