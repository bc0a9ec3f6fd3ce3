/* test_relay_carrier.c: carriers and the links they carry (relay/link/relay_link.h, carriers)
 * over real TLS on 127.0.0.1, both ends in one libuv loop, as a regional and its upstream use
 * them.
 *
 * Covers: many slots opened by one side and accepted by the other, frames both ways in order
 * on each, a burst of every slot's frames going out in one write (and the answers in few); a
 * slot ended by either side, without a reason (silently, as a closed connection) or with one
 * (the Goodbye reaches the peer's end), the others carrying on; frames for a slot that ended or
 * was never opened dropped and counted; the carrier's end ending every slot first, with its
 * reason; a slot on a link that carries none, and more slots than the receiver takes, closing
 * with a protocol error; what was gathered leaving when the carrier hangs up, and no slot to
 * open after the highest number (two bugs fuzz_relay_carrier found). Every test ends with uv_loop_close() succeeding. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link.h"
#include "tests/unit/test_certs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[256];

static int make_certs(void **state) {
  (void)state;
  return test_certs_make(dir, sizeof dir, "test_relay_carrier",
                         "--service-name relay.test --localhost --agent regional-a");
}

static int remove_certs(void **state) {
  (void)state;
  return test_certs_remove(dir);
}

enum { MAX_SLOTS = 256 };

/* One end of a carried link (or of the carrier itself). */
struct end {
  struct fixture *f;
  tr_relay_link *link;
  bool closed;
  int closings, close_reason;
  int heartbeats;
  uint64_t last_heartbeat;
  bool in_order;
  int goodbye_reason; /* -1: none reached on_frame */
  char goodbye_text[128];
  bool echo; /* answer each heartbeat with one of the same number */
};

struct fixture {
  uv_loop_t loop;
  tr_tls_config *scfg, *ccfg;
  tr_relay_link_listener *listener;
  struct sockaddr_in addr;
  struct end client, server;         /* the carriers */
  struct end opened[MAX_SLOTS + 1];  /* the client's slots, by slot */
  struct end accepted[MAX_SLOTS + 1]; /* the server's, by the order they opened */
  int num_opened, num_accepted;
  unsigned server_max_slots; /* 0: the server's link carries nothing */
  bool accepted_echo;
};

static void end_init(struct end *e, struct fixture *f) {
  memset(e, 0, sizeof *e);
  e->f = f;
  e->in_order = true;
  e->goodbye_reason = -1;
}

static int send_heartbeat(tr_relay_link *l, uint64_t n) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, n);
  return tr_relay_link_send(l, &f);
}

static void on_frame(tr_relay_link *l, Tracerelay__RelayFrame *fr) {
  struct end *e = tr_relay_link_data(l);
  assert_false(fr->has_slot); /* a carried link sees its frames as if they came alone */
  if (fr->msg_case == TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT) {
    uint64_t n = fr->heartbeat->timestamp_ns;
    if (n != e->last_heartbeat + 1)
      e->in_order = false;
    e->last_heartbeat = n;
    e->heartbeats++;
    if (e->echo)
      assert_int_equal(send_heartbeat(l, n), 0);
  } else if (fr->msg_case == TRACERELAY__RELAY_FRAME__MSG_GOODBYE) {
    e->goodbye_reason = (int)fr->goodbye->reason;
    snprintf(e->goodbye_text, sizeof e->goodbye_text, "%s",
             fr->goodbye->text ? fr->goodbye->text : "");
  }
  tr_relay_frame_free(fr);
}

static void on_closing(tr_relay_link *l) {
  struct end *e = tr_relay_link_data(l);
  e->closings++;
  assert_true(tr_relay_link_closing(l));
}

static void on_closed(tr_relay_link *l, int reason, const char *why) {
  (void)why;
  struct end *e = tr_relay_link_data(l);
  assert_false(e->closed);
  e->closed = true;
  e->close_reason = reason;
  e->link = NULL;
}

static void slot_opened(tr_relay_link *l) {
  struct end *e = tr_relay_link_data(l);
  e->link = l;
}

static const struct tr_relay_link_events slot_events = {
    .on_open = slot_opened, .on_frame = on_frame, .on_closing = on_closing,
    .on_closed = on_closed};

/* A slot the client opened reaches the server: its end is the next of accepted[]. */
static void slot_accepted(tr_relay_link *l) {
  struct fixture *f = tr_relay_link_data(l);
  struct end *e = &f->accepted[++f->num_accepted];
  end_init(e, f);
  e->link = l;
  e->echo = f->accepted_echo;
  assert_true(tr_relay_link_carried(l));
  tr_relay_link_set_data(l, e);
}

static const struct tr_relay_link_events accept_events = {
    .on_open = slot_accepted, .on_frame = on_frame, .on_closing = on_closing,
    .on_closed = on_closed};

static void client_open(tr_relay_link *l) {
  struct end *e = tr_relay_link_data(l);
  e->link = l;
}

static const struct tr_relay_link_events client_events = {
    .on_open = client_open, .on_frame = on_frame, .on_closing = on_closing,
    .on_closed = on_closed};

/* The accepted connection: the server's carrier (if the test says), before any slot comes. */
static void server_open(tr_relay_link *l) {
  struct fixture *f = tr_relay_link_data(l);
  f->server.link = l;
  tr_relay_link_set_data(l, &f->server);
  if (f->server_max_slots > 0)
    assert_int_equal(tr_relay_link_carry(l, &accept_events, f, f->server_max_slots), 0);
}

static const struct tr_relay_link_events server_events = {
    .on_open = server_open, .on_frame = on_frame, .on_closing = on_closing,
    .on_closed = on_closed};

#define RUN_UNTIL(f, cond, ms)                                                                    \
  do {                                                                                            \
    uv_update_time(&(f)->loop);                                                                   \
    uint64_t deadline_ = uv_now(&(f)->loop) + (ms);                                               \
    while (!(cond) && uv_now(&(f)->loop) < deadline_)                                             \
      uv_run(&(f)->loop, UV_RUN_NOWAIT);                                                          \
    if (!(cond))                                                                                  \
      fail_msg("timed out after %d ms waiting for %s", (int)(ms), #cond);                         \
  } while (0)

/* Listens, connects, and makes the client's link a carrier once both ends are open; the
 * server's is one, of at most server_max_slots, from its start (0: it carries nothing). */
static void fixture_start(struct fixture *f, unsigned server_max_slots) {
  memset(f, 0, sizeof *f);
  end_init(&f->client, f);
  end_init(&f->server, f);
  f->server_max_slots = server_max_slots;
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->scfg = test_certs_config(dir, dir, TR_TLS_SERVER, "service");
  f->ccfg = test_certs_config(dir, dir, TR_TLS_CLIENT, "agent-regional-a");
  struct tr_relay_link_opts opts = {.peer_role = "peer"};
  struct sockaddr_in any;
  uv_ip4_addr("127.0.0.1", 0, &any);
  assert_int_equal(tr_relay_link_listen(&f->loop, f->scfg, (struct sockaddr *)&any, &opts,
                                        &server_events, f, &f->listener), 0);
  uv_ip4_addr("127.0.0.1", tr_relay_link_listener_port(f->listener), &f->addr);
  tr_relay_link *l;
  assert_int_equal(tr_relay_link_connect(&f->loop, f->ccfg, "relay.test",
                                         (struct sockaddr *)&f->addr, &opts, &client_events,
                                         &f->client, &l), 0);
  RUN_UNTIL(f, f->client.link != NULL && f->server.link != NULL, 5000);
  assert_int_equal(tr_relay_link_carry(f->client.link, NULL, NULL, MAX_SLOTS), 0);
}

static struct end *open_slot(struct fixture *f) {
  struct end *e = &f->opened[++f->num_opened];
  end_init(e, f);
  tr_relay_link *l;
  assert_int_equal(tr_relay_link_open_slot(f->client.link, &slot_events, e, &l), 0);
  assert_ptr_equal(e->link, l); /* on_open ran, with *out set */
  return e;
}

static void fixture_finish(struct fixture *f) {
  if (f->client.link != NULL)
    tr_relay_link_close(f->client.link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "end");
  RUN_UNTIL(f, f->client.closed && f->server.closed, 5000);
  for (int i = 1; i <= f->num_opened; i++)
    assert_true(f->opened[i].closed);
  for (int i = 1; i <= f->num_accepted; i++)
    assert_true(f->accepted[i].closed);
  tr_relay_link_listener_close(f->listener);
  tr_tls_config_unref(f->scfg);
  tr_tls_config_unref(f->ccfg);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

static struct tr_relay_carrier_stats stats(tr_relay_link *l) {
  struct tr_relay_carrier_stats st;
  tr_relay_link_carrier_stats(l, &st);
  return st;
}

/* ---- tests ---- */

/* 200 slots, each sending 5 numbered heartbeats per burst, the server's ends echoing them:
 * every frame arrives on its own slot in order, each burst leaves in one write, and the 1,000
 * answers in far fewer writes than frames. */
static void test_slots_both_ways_gathered(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  f.accepted_echo = true;
  enum { N = 200, PER = 5 };
  for (int i = 0; i < N; i++)
    open_slot(&f);
  for (uint64_t round = 0; round < 2; round++) {
    struct tr_relay_carrier_stats before = stats(f.client.link);
    struct tr_relay_carrier_stats server_before = stats(f.server.link);
    for (uint64_t k = 1; k <= PER; k++)
      for (int i = 1; i <= N; i++)
        assert_int_equal(send_heartbeat(f.opened[i].link, round * PER + k), 0);
    struct tr_relay_carrier_stats mid = stats(f.client.link);
    assert_int_equal(mid.frames_out - before.frames_out, N * PER);
    assert_int_equal(mid.writes, before.writes); /* nothing written yet: gathered */
    uint64_t want = (round + 1) * PER;
    RUN_UNTIL(&f, f.num_accepted == N && f.opened[N].heartbeats == (int)want &&
                      f.opened[1].heartbeats == (int)want, 10000);
    struct tr_relay_carrier_stats after = stats(f.client.link);
    assert_int_equal(after.writes - before.writes, 1);
    struct tr_relay_carrier_stats server_after = stats(f.server.link);
    assert_int_equal(server_after.frames_out - server_before.frames_out, N * PER);
    assert_true((server_after.writes - server_before.writes) * 20 < N * PER);
  }
  RUN_UNTIL(&f, ({
              bool all = true;
              for (int i = 1; i <= N; i++)
                all = all && f.opened[i].heartbeats == 2 * PER;
              all;
            }), 10000);
  for (int i = 1; i <= N; i++) {
    assert_true(f.opened[i].in_order);
    assert_true(f.accepted[i].in_order);
    assert_int_equal(f.accepted[i].heartbeats, 2 * PER);
  }
  assert_int_equal(stats(f.server.link).carried, N);
  assert_int_equal(stats(f.server.link).dropped_frames, 0);
  fixture_finish(&f);
  assert_int_equal(f.accepted[1].closings, 1);
}

/* Either side ends one slot; the peer's end hears it as it would a connection's end, and the
 * slots beside it carry on. */
static void test_slot_ends_either_side(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  f.accepted_echo = true;
  struct end *a = open_slot(&f), *b = open_slot(&f), *c = open_slot(&f);
  for (int i = 1; i <= 3; i++)
    assert_int_equal(send_heartbeat(f.opened[i].link, 1), 0);
  RUN_UNTIL(&f, a->heartbeats == 1 && b->heartbeats == 1 && c->heartbeats == 1, 5000);
  /* The client ends slot 1 without a reason: the server's end sees no Goodbye, just the end. */
  tr_relay_link_close(a->link, TRACERELAY__GOODBYE__REASON__REASON_UNSPECIFIED, "agent gone");
  assert_int_equal(send_heartbeat(a->link, 2), TR_ERR_CLOSED);
  assert_false(a->closed); /* on_closed comes in the loop's next turn */
  RUN_UNTIL(&f, a->closed && f.accepted[1].closed, 5000);
  assert_int_equal(a->close_reason, 0);
  assert_int_equal(f.accepted[1].close_reason, TR_ERR_CLOSED);
  assert_int_equal(f.accepted[1].goodbye_reason, -1);
  /* The server ends slot 2 with a reason: it reaches the client's end, then the end. */
  tr_relay_link_close(f.accepted[2].link, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED,
                      "%s may not relay %s", "regional-a", "web-2");
  RUN_UNTIL(&f, b->closed && f.accepted[2].closed, 5000);
  assert_int_equal(b->goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_NOT_AUTHORIZED);
  assert_string_equal(b->goodbye_text, "regional-a may not relay web-2");
  assert_int_equal(b->close_reason, TR_ERR_CLOSED);
  assert_int_equal(f.accepted[2].close_reason, 0);
  assert_int_equal(b->closings, 1);
  /* Slot 3 and the carriers carry on. */
  assert_int_equal(send_heartbeat(c->link, 2), 0);
  RUN_UNTIL(&f, c->heartbeats == 2, 5000);
  assert_false(f.client.closed || f.server.closed);
  assert_int_equal(stats(f.server.link).carried, 1);
  assert_int_equal(stats(f.client.link).carried, 1);
  fixture_finish(&f);
}

/* Writes a heartbeat for slot straight to the client carrier's connection. */
static void write_raw(struct fixture *f, uint64_t slot, uint64_t n) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame fr;
  tr_relay_frame_heartbeat(&fr, &hb, n);
  fr.has_slot = 1;
  fr.slot = slot;
  uint8_t *buf;
  size_t len;
  assert_int_equal(tr_relay_frame_encode(&fr, TR_RELAY_MAX_FRAME_DEFAULT, &buf, &len), 0);
  assert_true(tr_tls_uv_write(tr_relay_link_conn(f->client.link), buf, len) >= 0);
  free(buf);
}

/* Frames for slots the server does not have: one never opened below the highest, one that
 * ended; both dropped and counted, nothing else touched. A slot above the highest opens. */
static void test_frames_for_unknown_slots_dropped(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  struct end *a = open_slot(&f);
  assert_int_equal(send_heartbeat(a->link, 1), 0);
  RUN_UNTIL(&f, f.num_accepted == 1 && f.accepted[1].heartbeats == 1, 5000);
  write_raw(&f, 5, 1); /* the peer may number slots with gaps */
  RUN_UNTIL(&f, f.num_accepted == 2 && f.accepted[2].heartbeats == 1, 5000);
  write_raw(&f, 3, 1); /* below 5, never opened */
  tr_relay_link_hang_up(a->link);
  RUN_UNTIL(&f, f.accepted[1].closed, 5000);
  write_raw(&f, 1, 2); /* ended */
  write_raw(&f, 5, 2);
  RUN_UNTIL(&f, f.accepted[2].heartbeats == 2, 5000);
  assert_int_equal(stats(f.server.link).dropped_frames, 2);
  assert_int_equal(f.num_accepted, 2);
  assert_int_equal(f.accepted[1].heartbeats, 1);
  assert_false(f.server.closed);
  fixture_finish(&f);
}

/* Bug (fuzz_relay_carrier, crash-hang-up-drops-gathered): a carrier closed without a Goodbye
 * (tr_relay_link_hang_up, as after the peer's Goodbye, or a close without a reason) dropped what
 * its links had sent in the same turn of the loop, still gathered: sends that had returned 0
 * never left, where a plain link's queued frames do. */
static void test_hang_up_sends_what_was_gathered(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  struct end *a = open_slot(&f);
  assert_int_equal(send_heartbeat(a->link, 1), 0);
  RUN_UNTIL(&f, f.num_accepted == 1 && f.accepted[1].heartbeats == 1, 5000);
  assert_int_equal(send_heartbeat(a->link, 2), 0);
  tr_relay_link_hang_up(f.client.link);
  RUN_UNTIL(&f, f.client.closed && f.server.closed, 5000);
  assert_int_equal(f.accepted[1].heartbeats, 2);
  fixture_finish(&f);
}

/* Bug (fuzz_relay_carrier, crash-slot-number-wraps): once the peer had opened slot 2^64 - 1, a
 * slot this side opened was numbered 0, the carrier's own frames, and broke the order of the
 * slot table. Now there is no slot left to open. */
static void test_no_slot_after_the_highest(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  write_raw(&f, UINT64_MAX, 1);
  RUN_UNTIL(&f, f.num_accepted == 1 && f.accepted[1].heartbeats == 1, 5000);
  struct end extra;
  end_init(&extra, &f);
  tr_relay_link *l = NULL;
  assert_int_equal(tr_relay_link_open_slot(f.server.link, &slot_events, &extra, &l), TR_ERR_FULL);
  assert_null(l);
  assert_null(extra.link);
  fixture_finish(&f);
}

/* The carrier ends: every slot on both sides ends first, with the carrier's reason. */
static void test_carrier_end_ends_slots(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  for (int i = 0; i < 5; i++)
    assert_int_equal(send_heartbeat(open_slot(&f)->link, 1), 0);
  RUN_UNTIL(&f, f.num_accepted == 5 && f.accepted[5].heartbeats == 1, 5000);
  tr_relay_link_close(f.client.link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "bye");
  RUN_UNTIL(&f, f.client.closed && f.server.closed, 5000);
  for (int i = 1; i <= 5; i++) {
    assert_int_equal(f.opened[i].close_reason, TR_ERR_CLOSED); /* "its carrier was closed" */
    assert_int_equal(f.opened[i].closings, 1);
    assert_true(f.accepted[i].close_reason < 0);
    assert_int_equal(f.accepted[i].closings, 1);
  }
  assert_int_equal(f.server.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN);
  fixture_finish(&f);
}

/* A frame with a slot on a link that carries none. */
static void test_slot_on_plain_link_is_protocol_error(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0);
  assert_int_equal(send_heartbeat(open_slot(&f)->link, 1), 0);
  RUN_UNTIL(&f, f.client.closed && f.server.closed, 5000);
  assert_int_equal(f.client.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR);
  assert_string_equal(f.client.goodbye_text,
                      "protocol error: a frame for slot 1 on a link that carries none");
  assert_int_equal(f.server.heartbeats, 0);
  fixture_finish(&f);
}

/* More slots than the server takes. */
static void test_too_many_slots_is_protocol_error(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 3);
  for (int i = 0; i < 4; i++)
    assert_int_equal(send_heartbeat(open_slot(&f)->link, 1), 0);
  RUN_UNTIL(&f, f.client.closed && f.server.closed, 5000);
  assert_int_equal(f.client.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR);
  assert_string_equal(f.client.goodbye_text,
                      "protocol error: slot 4 opened while 3 are open, the most this side takes");
  assert_int_equal(f.num_accepted, 3);
  fixture_finish(&f);
}

/* With a linger, what a slot writes in ten turns of the loop waits for the linger and goes in
 * one write (without one: a write per turn), in order; the loop does not sleep past it. */
static void test_linger_gathers_turns(void **state) {
  (void)state;
  enum { LINGER_MS = 2000, TURNS = 10 };
  struct fixture f;
  fixture_start(&f, MAX_SLOTS);
  tr_relay_carrier_set_linger(f.client.link, LINGER_MS);
  struct end *e = open_slot(&f);
  struct tr_relay_carrier_stats before = stats(f.client.link);
  uv_update_time(&f.loop);
  uint64_t t0 = uv_now(&f.loop);
  for (uint64_t k = 1; k <= TURNS; k++) {
    assert_int_equal(send_heartbeat(e->link, k), 0);
    uv_run(&f.loop, UV_RUN_NOWAIT);
  }
  uv_update_time(&f.loop);
  uint64_t turns_ms = uv_now(&f.loop) - t0;
  if (turns_ms < LINGER_MS) /* a starved machine may take longer: then some went already */
    assert_int_equal(stats(f.client.link).writes, before.writes);
  RUN_UNTIL(&f, f.num_accepted == 1 && f.accepted[1].heartbeats == TURNS, 10000);
  assert_true(f.accepted[1].in_order);
  uint64_t writes = stats(f.client.link).writes - before.writes;
  assert_true(writes >= 1 && writes <= 1 + turns_ms / LINGER_MS);
  fixture_finish(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slots_both_ways_gathered),
      cmocka_unit_test(test_slot_ends_either_side),
      cmocka_unit_test(test_frames_for_unknown_slots_dropped),
      cmocka_unit_test(test_carrier_end_ends_slots),
      cmocka_unit_test(test_hang_up_sends_what_was_gathered),
      cmocka_unit_test(test_no_slot_after_the_highest),
      cmocka_unit_test(test_slot_on_plain_link_is_protocol_error),
      cmocka_unit_test(test_too_many_slots_is_protocol_error),
      cmocka_unit_test(test_linger_gathers_turns),
  };
  return cmocka_run_group_tests(tests, make_certs, remove_certs);
}
