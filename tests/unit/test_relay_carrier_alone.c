/* test_relay_carrier_alone.c: relay/link/relay_carrier.c on its own (issue 39 item 9): compiled
 * without relay_link.c, which it reaches only through the table every link carries (struct
 * tr_relay_link_ops, relay_link_priv.h); this test gives its own, recording what the carrier
 * asks of the links, over the fake transport (fuzz/fake_tls_uv.h) in a real libuv loop.
 *
 * Covers: what two carried links send gathered into one write at the loop's turn, each frame
 * marked with its slot; frames the peer sends for a new slot opening an accepted link (slot
 * mark taken off), for an unknown slot dropped and counted; on_read_done once per touched
 * link; the peer's Goodbye ending a slot with on_closed in the next turn, never inside; one
 * slot past max_slots closing the carrier as a protocol error through the table; the carrier's
 * end ending every carried link with its reason, each freed through the table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "fuzz/fake_tls_uv.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link_priv.h"

/* ---- the table, as the links above would answer it ---- */

static int links_alive, closes;
static Tracerelay__Goodbye__Reason close_reason;
static char close_text[256];

static tr_relay_link *t_alloc(const struct tr_relay_link_opts *opts,
                              const struct tr_relay_link_events *ev, void *data);

static void t_free(tr_relay_link *l) {
  links_alive--;
  free(l);
}

static int t_wrote(tr_relay_link *l, int rc) {
  (void)l;
  return rc < 0 ? rc : 0;
}

static void t_close(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *text) {
  l->closing = true;
  closes++;
  close_reason = reason;
  snprintf(close_text, sizeof close_text, "%s", text);
}

static const struct tr_relay_link_ops ops = {
    .alloc = t_alloc, .free = t_free, .wrote = t_wrote, .close = t_close};

static tr_relay_link *t_alloc(const struct tr_relay_link_opts *opts,
                              const struct tr_relay_link_events *ev, void *data) {
  tr_relay_link *l = calloc(1, sizeof *l);
  if (l == NULL)
    return NULL;
  l->ops = &ops;
  l->ev = ev;
  l->data = data;
  l->opts = *opts;
  l->max_out = TR_RELAY_MAX_FRAME_DEFAULT;
  l->reader.max_payload = TR_RELAY_MAX_FRAME_DEFAULT;
  links_alive++;
  return l;
}

/* ---- the ends of carried links ---- */

static int opened, frames_in, read_dones, closed, closed_reason;
static tr_relay_link *last_opened;

static void on_open(tr_relay_link *l) {
  opened++;
  last_opened = l;
}
static void on_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  (void)l;
  assert_false(f->has_slot); /* the mark is the carrier's, taken off */
  frames_in++;
  tr_relay_frame_free(f);
}
static void on_read_done(tr_relay_link *l) {
  (void)l;
  read_dones++;
}
static void on_closed(tr_relay_link *l, int reason, const char *why) {
  (void)l, (void)why;
  closed++;
  closed_reason = reason;
}
static const struct tr_relay_link_events ev = {.on_open = on_open,
                                               .on_frame = on_frame,
                                               .on_read_done = on_read_done,
                                               .on_closed = on_closed};

/* ---- the transport ---- */

static uint8_t written[4096];
static size_t written_len;
static int writes;

static void on_write(void *arg, const void *data, size_t len) {
  (void)arg;
  assert_true(written_len + len <= sizeof written);
  memcpy(written + written_len, data, len);
  written_len += len;
  writes++;
}

static void conn_closed(tr_tls_uv_conn *c, int reason, const char *why) {
  (void)c, (void)reason, (void)why;
}
static void conn_open(tr_tls_uv_conn *c) { (void)c; }
static const struct tr_tls_uv_callbacks cbs = {.on_connect = conn_open, .on_close = conn_closed};

static uv_loop_t loop;
static tr_relay_link *carrier;

static int setup(void **state) {
  (void)state;
  links_alive = closes = opened = frames_in = read_dones = closed = closed_reason = writes = 0;
  written_len = 0;
  last_opened = NULL;
  fake_tls_uv_set_write_hook(on_write, NULL);
  if (uv_loop_init(&loop) != 0)
    return -1;
  struct tr_relay_link_opts opts = {.peer_role = "peer"};
  carrier = t_alloc(&opts, &ev, NULL);
  if (carrier == NULL ||
      tr_tls_uv_connect(&loop, NULL, "x", NULL, NULL, &cbs, carrier, &carrier->conn) < 0)
    return -1;
  fake_tls_uv_open(carrier->conn);
  carrier->open = carrier->established = true;
  snprintf(carrier->label, sizeof carrier->label, "the carrier");
  return 0;
}

/* The carrier's end: its links end first, then its handles close and the loop empties. */
static int teardown(void **state) {
  (void)state;
  if (carrier->carrier != NULL)
    tr_relay_carrier_end(carrier, 0, "closed by us");
  fake_tls_uv_end(carrier->conn, 0, "closed by us");
  t_free(carrier);
  uv_run(&loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&loop), 0);
  assert_int_equal(links_alive, 0);
  return 0;
}

/* f on slot, decoded as the carrier's reading hands frames over (the carrier takes it). */
static Tracerelay__RelayFrame *on_slot(Tracerelay__RelayFrame f, uint64_t slot) {
  f.has_slot = 1;
  f.slot = slot;
  uint8_t buf[64];
  size_t len = tracerelay__relay_frame__pack(&f, buf);
  Tracerelay__RelayFrame *out = tr_relay_frame_decode(buf, len);
  assert_non_null(out);
  return out;
}

static Tracerelay__RelayFrame *heartbeat_for(uint64_t slot) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, 1);
  return on_slot(f, slot);
}

static Tracerelay__RelayFrame *goodbye_for(uint64_t slot) {
  Tracerelay__Goodbye bye = TRACERELAY__GOODBYE__INIT;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_GOODBYE;
  f.goodbye = &bye;
  return on_slot(f, slot);
}

static void test_output_gathered_into_one_write(void **state) {
  (void)state;
  assert_int_equal(tr_relay_link_carry(carrier, NULL, NULL, 4), 0);
  tr_relay_link *a, *b;
  assert_int_equal(tr_relay_link_open_slot(carrier, &ev, NULL, &a), 0);
  assert_int_equal(tr_relay_link_open_slot(carrier, &ev, NULL, &b), 0);
  assert_int_equal(opened, 2);
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, 7);
  assert_int_equal(tr_relay_carried_send(a, &f), 0);
  assert_int_equal(tr_relay_carried_send(b, &f), 0);
  assert_int_equal(tr_relay_carried_send(a, &f), 0);
  assert_int_equal(writes, 0); /* gathered until the loop's turn */
  assert_true(tr_relay_carrier_gathered(carrier) > 0);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(writes, 1);
  /* Three whole frames, marked with their slots, in the order sent. */
  tr_relay_reader r;
  assert_int_equal(tr_relay_reader_init(&r, 0), 0);
  assert_int_equal(tr_frame_reader_push(&r, written, written_len), (int)written_len);
  uint64_t want[] = {1, 2, 1};
  for (size_t i = 0; i < 3; i++) {
    const uint8_t *payload;
    size_t len;
    assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
    Tracerelay__RelayFrame *got = tr_relay_frame_decode(payload, len);
    assert_non_null(got);
    assert_int_equal(got->msg_case, TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT);
    assert_true(got->has_slot);
    assert_int_equal(got->slot, want[i]);
    tr_relay_frame_free(got);
  }
  tr_frame_reader_free(&r);
  struct tr_relay_carrier_stats st;
  tr_relay_link_carrier_stats(carrier, &st);
  assert_int_equal(st.carried, 2);
  assert_int_equal(st.frames_out, 3);
  assert_int_equal(st.writes, 1);
}

static void test_frames_in(void **state) {
  (void)state;
  assert_int_equal(tr_relay_link_carry(carrier, &ev, NULL, 4), 0);
  tr_relay_carrier_deliver(carrier, heartbeat_for(5), 10); /* the peer opens slot 5 */
  assert_int_equal(opened, 1);
  tr_relay_link *five = last_opened;
  assert_true(tr_relay_link_carried(five));
  tr_relay_carrier_deliver(carrier, heartbeat_for(5), 10);
  tr_relay_carrier_deliver(carrier, heartbeat_for(3), 10); /* below the highest: unknown */
  assert_int_equal(frames_in, 2);
  assert_int_equal(five->bytes_in, 20);
  tr_relay_carrier_read_done(carrier);
  assert_int_equal(read_dones, 1);
  struct tr_relay_carrier_stats st;
  tr_relay_link_carrier_stats(carrier, &st);
  assert_int_equal(st.dropped_frames, 1);
  /* The peer's Goodbye without a reason: the slot ends, on_closed in the next turn. */
  tr_relay_carrier_deliver(carrier, goodbye_for(5), 4);
  assert_int_equal(closed, 0);
  uv_run(&loop, UV_RUN_NOWAIT);
  assert_int_equal(closed, 1);
  assert_int_equal(closed_reason, TR_ERR_CLOSED);
  tr_relay_carrier_deliver(carrier, heartbeat_for(5), 10); /* ended: dropped */
  tr_relay_link_carrier_stats(carrier, &st);
  assert_int_equal(st.dropped_frames, 2);
  assert_int_equal(st.carried, 0);
  assert_int_equal(closes, 0);
}

static void test_too_many_slots(void **state) {
  (void)state;
  assert_int_equal(tr_relay_link_carry(carrier, &ev, NULL, 1), 0);
  tr_relay_carrier_deliver(carrier, heartbeat_for(1), 10);
  tr_relay_carrier_deliver(carrier, heartbeat_for(2), 10);
  assert_int_equal(opened, 1);
  assert_int_equal(closes, 1);
  assert_int_equal(close_reason, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR);
  assert_non_null(strstr(close_text, "protocol error: slot 2 opened while 1 are open"));
}

static void test_end_ends_every_link(void **state) {
  (void)state;
  assert_int_equal(tr_relay_link_carry(carrier, NULL, NULL, 4), 0);
  tr_relay_link *a, *b;
  assert_int_equal(tr_relay_link_open_slot(carrier, &ev, NULL, &a), 0);
  assert_int_equal(tr_relay_link_open_slot(carrier, &ev, NULL, &b), 0);
  assert_int_equal(links_alive, 3);
  tr_relay_carrier_end(carrier, TR_ERR_PROTO, "the peer's transport ended");
  assert_int_equal(closed, 2);
  assert_int_equal(closed_reason, TR_ERR_PROTO);
  assert_int_equal(links_alive, 1); /* the carrier's own link is its end's to free */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_output_gathered_into_one_write, setup, teardown),
      cmocka_unit_test_setup_teardown(test_frames_in, setup, teardown),
      cmocka_unit_test_setup_teardown(test_too_many_slots, setup, teardown),
      cmocka_unit_test_setup_teardown(test_end_ends_every_link, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
