/* test_relay_link.c: the relay link core (relay/link/relay_link.h) over real TLS on 127.0.0.1,
 * both ends in one libuv loop, as the agent and the service use it.
 *
 * Covers frames both ways in order (Hello, Welcome, numbered heartbeats, a stamped send), a
 * Goodbye seen by the peer with its reason and text before the connection closes, protocol
 * errors (a frame that does not decode, an empty one, an oversize length) closing the link
 * with REASON_PROTOCOL_ERROR and delivering nothing after them, a silent peer closed at the
 * heartbeat timeout while heartbeats keep a quiet established link up, backpressure (reading
 * paused while our answers back up, the rest of the read held and delivered in order once they
 * drain), input held by the end until it lets go (delivered in order then), and a connection
 * that never comes up still ending in on_closed. Every test ends
 * with uv_loop_close() succeeding, so no handle outlives its link. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/link/relay_link.h"
#include "relay/base/tr_error.h"
#include "tests/unit/test_certs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[256];

static int make_certs(void **state) {
  (void)state;
  return test_certs_make(dir, sizeof dir, "test_relay_link",
                         "--service-name relay.test --localhost --agent web-1");
}

static int remove_certs(void **state) {
  (void)state;
  return test_certs_remove(dir);
}

static tr_tls_config *config(enum tr_tls_role role, const char *name) {
  return test_certs_config(dir, dir, role, name);
}

/* ---- one end of a link ---- */

struct side {
  tr_relay_link *link;
  bool opened, closed;
  int closings; /* on_closing calls */
  int close_reason;
  int frames, heartbeats;
  uint64_t last_heartbeat;   /* timestamp_ns of the last one: they are numbered */
  bool heartbeats_in_order;
  int answers;               /* big answers (Welcomes numbered in service_instance_id) */
  uint64_t last_answer;
  bool answers_in_order;
  int goodbye_reason;        /* -1: none received */
  char goodbye_text[256];
  /* what this end does */
  bool say_hello;            /* send Hello on open */
  bool welcome;              /* answer Hello with Welcome (and be established) */
  bool echo;                 /* answer each heartbeat with one of the same number */
  bool answer_big;           /* answer each heartbeat with a big Welcome of its number */
  bool hang_up_on_goodbye;
  Tracerelay__Goodbye__Reason refuse; /* if set, close with it on Hello */
  bool watch;                /* the fixture's timer runs the heartbeats of this end */
  uint64_t hold_after;       /* hold the input (tr_relay_link_hold_input) at this heartbeat */
};

static void side_init(struct side *s) {
  memset(s, 0, sizeof *s);
  s->goodbye_reason = -1;
  s->heartbeats_in_order = true;
  s->answers_in_order = true;
}

static int send_heartbeat(struct side *s, uint64_t n, bool stamped) {
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, n);
  int64_t sent = 0;
  return stamped ? tr_relay_link_send_stamped(s->link, &f, &sent)
                 : tr_relay_link_send(s->link, &f);
}

static void send_hello(struct side *s) {
  Tracerelay__Hello h = TRACERELAY__HELLO__INIT;
  h.has_max_frame_bytes = 1;
  h.max_frame_bytes = (uint32_t)tr_relay_link_max_in(s->link);
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_HELLO;
  f.hello = &h;
  assert_int_equal(tr_relay_link_send(s->link, &f), 0);
}

static void send_welcome(struct side *s) {
  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.machine_name = "web-1";
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  assert_int_equal(tr_relay_link_send(s->link, &f), 0);
}

#define BIG_ANSWER 16000

static void send_big_answer(struct side *s, uint64_t n) {
  static char name[BIG_ANSWER + 1];
  memset(name, 'x', BIG_ANSWER);
  Tracerelay__Welcome w = TRACERELAY__WELCOME__INIT;
  w.machine_name = name;
  w.has_service_instance_id = 1;
  w.service_instance_id = n;
  Tracerelay__RelayFrame f = TRACERELAY__RELAY_FRAME__INIT;
  f.msg_case = TRACERELAY__RELAY_FRAME__MSG_WELCOME;
  f.welcome = &w;
  assert_int_equal(tr_relay_link_send(s->link, &f), 0);
}

static void on_open(tr_relay_link *l) {
  struct side *s = tr_relay_link_data(l);
  s->link = l;
  s->opened = true;
  if (s->say_hello)
    send_hello(s);
}

static void on_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  struct side *s = tr_relay_link_data(l);
  s->frames++;
  switch (f->msg_case) {
  case TRACERELAY__RELAY_FRAME__MSG_HELLO:
    if (s->refuse)
      tr_relay_link_close(l, s->refuse, "host %s is already connected", "web-1");
    else if (s->welcome) {
      send_welcome(s);
      tr_relay_link_established(l, f->hello->max_frame_bytes);
    }
    break;
  case TRACERELAY__RELAY_FRAME__MSG_WELCOME:
    tr_relay_link_established(l, TR_RELAY_MAX_FRAME_DEFAULT);
    if (f->welcome->has_service_instance_id) {
      if (f->welcome->service_instance_id != s->last_answer + 1)
        s->answers_in_order = false;
      s->last_answer = f->welcome->service_instance_id;
      s->answers++;
    }
    break;
  case TRACERELAY__RELAY_FRAME__MSG_HEARTBEAT:
    if (f->heartbeat->timestamp_ns != s->last_heartbeat + 1)
      s->heartbeats_in_order = false;
    s->last_heartbeat = f->heartbeat->timestamp_ns;
    s->heartbeats++;
    if (s->hold_after != 0 && s->last_heartbeat == s->hold_after)
      tr_relay_link_hold_input(l);
    if (s->echo)
      assert_int_equal(send_heartbeat(s, f->heartbeat->timestamp_ns, false), 0);
    if (s->answer_big)
      send_big_answer(s, f->heartbeat->timestamp_ns);
    break;
  case TRACERELAY__RELAY_FRAME__MSG_GOODBYE:
    s->goodbye_reason = (int)f->goodbye->reason;
    snprintf(s->goodbye_text, sizeof s->goodbye_text, "%s",
             f->goodbye->text ? f->goodbye->text : "");
    if (s->hang_up_on_goodbye)
      tr_relay_link_hang_up(l);
    break;
  default:
    break;
  }
  tr_relay_frame_free(f);
}

static void on_closing(tr_relay_link *l) {
  struct side *s = tr_relay_link_data(l);
  s->closings++;
  assert_true(tr_relay_link_closing(l));
}

static void on_closed(tr_relay_link *l, int reason, const char *why) {
  (void)why;
  struct side *s = tr_relay_link_data(l);
  assert_false(s->closed);
  s->closed = true;
  s->close_reason = reason;
  s->link = NULL;
}

static const struct tr_relay_link_events client_events = {
    .on_open = on_open, .on_frame = on_frame, .on_closing = on_closing, .on_closed = on_closed};

/* An accepted link starts with the listener's data, the fixture: it takes the server side. */
struct fixture;
static void server_on_open(tr_relay_link *l);
static const struct tr_relay_link_events server_events = {
    .on_open = server_on_open, .on_frame = on_frame, .on_closing = on_closing,
    .on_closed = on_closed};

/* ---- the fixture: a listener, one client, a timer ---- */

struct fixture {
  uv_loop_t loop;
  tr_tls_config *scfg, *ccfg;
  tr_relay_link_listener *listener;
  struct sockaddr_in addr;
  struct tr_relay_link_opts opts, client_opts;
  struct side server, client;
  int accepted;
  uv_timer_t tick;
};

static void server_on_open(tr_relay_link *l) {
  struct fixture *f = tr_relay_link_data(l);
  f->accepted++;
  tr_relay_link_set_data(l, &f->server);
  on_open(l);
}

/* The ends' heartbeat timer, as link_client.c and link_server.c run it. */
static void on_tick(uv_timer_t *t) {
  struct fixture *f = t->data;
  uint64_t now = uv_hrtime();
  struct side *sides[] = {&f->server, &f->client};
  for (int i = 0; i < 2; i++)
    if (sides[i]->watch && sides[i]->link != NULL && tr_relay_link_check_alive(sides[i]->link, now))
      tr_relay_link_keep_alive(sides[i]->link, now);
}

static void fixture_start(struct fixture *f, uint64_t hb_interval_ms, uint64_t hb_timeout_ms) {
  memset(f, 0, sizeof *f);
  side_init(&f->server);
  side_init(&f->client);
  assert_int_equal(uv_loop_init(&f->loop), 0);
  f->scfg = config(TR_TLS_SERVER, "service");
  f->ccfg = config(TR_TLS_CLIENT, "agent-web-1");
  f->opts = (struct tr_relay_link_opts){.heartbeat_interval_ms = hb_interval_ms,
                                        .heartbeat_timeout_ms = hb_timeout_ms,
                                        .peer_role = "peer"};
  f->client_opts = f->opts;
}

/* Listens with f->opts (which the test may have changed since fixture_start). */
static void listen_server(struct fixture *f) {
  struct sockaddr_in any;
  uv_ip4_addr("127.0.0.1", 0, &any);
  assert_int_equal(tr_relay_link_listen(&f->loop, f->scfg, (struct sockaddr *)&any, &f->opts,
                                        &server_events, f, &f->listener), 0);
  int port = tr_relay_link_listener_port(f->listener);
  assert_true(port > 0);
  uv_ip4_addr("127.0.0.1", port, &f->addr);
  uv_timer_init(&f->loop, &f->tick);
  f->tick.data = f;
  uv_timer_start(&f->tick, on_tick, 20, 20);
}

static void connect_client(struct fixture *f) {
  assert_int_equal(tr_relay_link_connect(&f->loop, f->ccfg, "relay.test",
                                         (struct sockaddr *)&f->addr, &f->client_opts,
                                         &client_events,
                                         &f->client, &f->client.link), 0);
}

/* Runs the loop until cond holds (the timer ticks, so UV_RUN_ONCE returns), failing after ms. */
#define RUN_UNTIL(f, cond, ms)                                                                    \
  do {                                                                                            \
    uv_update_time(&(f)->loop);                                                                   \
    uint64_t deadline_ = uv_now(&(f)->loop) + (ms);                                               \
    while (!(cond) && uv_now(&(f)->loop) < deadline_)                                             \
      uv_run(&(f)->loop, UV_RUN_ONCE);                                                            \
    if (!(cond))                                                                                  \
      fail_msg("timed out after %d ms waiting for %s", (int)(ms), #cond);                         \
  } while (0)

static void run_for(struct fixture *f, uint64_t ms) {
  uv_update_time(&f->loop);
  uint64_t deadline = uv_now(&f->loop) + ms;
  while (uv_now(&f->loop) < deadline)
    uv_run(&f->loop, UV_RUN_ONCE);
}

/* Both links must be closed by now. */
static void fixture_finish(struct fixture *f) {
  RUN_UNTIL(f, f->client.closed && (f->accepted == 0 || f->server.closed), 5000);
  assert_int_equal(f->client.closings, 1);
  assert_int_equal(f->server.closings, f->accepted ? 1 : 0);
  tr_relay_link_listener_close(f->listener);
  uv_close((uv_handle_t *)&f->tick, NULL);
  tr_tls_config_unref(f->scfg);
  tr_tls_config_unref(f->ccfg);
  uv_run(&f->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&f->loop), 0);
}

/* ---- tests ---- */

static void test_frames_both_ways_then_goodbye(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0, 0);
  listen_server(&f);
  f.client.say_hello = true;
  f.server.welcome = f.server.echo = true;
  f.server.hang_up_on_goodbye = true;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.frames == 1, 5000); /* the Welcome */
  for (uint64_t n = 1; n <= 200; n++)
    assert_int_equal(send_heartbeat(&f.client, n, n % 50 == 0), 0);
  RUN_UNTIL(&f, f.client.heartbeats == 200, 5000);
  assert_int_equal(f.server.heartbeats, 200);
  assert_true(f.server.heartbeats_in_order);
  assert_true(f.client.heartbeats_in_order);
  assert_int_equal(f.server.frames, 201);

  tr_relay_link *client = f.client.link;
  tr_relay_link_close(client, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "bye %d", 1);
  tr_relay_link_close(client, TRACERELAY__GOODBYE__REASON__REASON_OVERLOADED, "ignored");
  assert_true(tr_relay_link_closing(client));
  assert_int_equal(send_heartbeat(&f.client, 201, false), TR_ERR_CLOSED);
  RUN_UNTIL(&f, f.server.closed && f.client.closed, 5000);
  assert_int_equal(f.server.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN);
  assert_string_equal(f.server.goodbye_text, "bye 1");
  assert_int_equal(f.server.close_reason, 0); /* it hung up itself on the Goodbye */
  assert_int_equal(f.client.close_reason, 0);
  fixture_finish(&f);
}

static void test_goodbye_reason_seen_by_peer(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0, 0);
  listen_server(&f);
  f.client.say_hello = true;
  f.server.refuse = TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.closed, 5000);
  assert_true(f.client.opened);
  assert_int_equal(f.client.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_DUPLICATE_HOST);
  assert_string_equal(f.client.goodbye_text, "host web-1 is already connected");
  assert_int_equal(f.client.close_reason, TR_ERR_CLOSED); /* the service closed after it */
  fixture_finish(&f);
  assert_int_equal(f.server.close_reason, 0);
}

/* The client writes raw bytes (bad, then a good Heartbeat frame) straight to its connection. */
static void expect_protocol_error(const uint8_t *bad, size_t len, const char *text) {
  struct fixture f;
  fixture_start(&f, 0, 0);
  listen_server(&f);
  f.client.hang_up_on_goodbye = true;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.opened && f.accepted == 1, 5000);
  uint8_t *good;
  size_t good_len;
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame frame;
  tr_relay_frame_heartbeat(&frame, &hb, 1);
  assert_int_equal(tr_relay_frame_encode(&frame, TR_RELAY_MAX_FRAME_DEFAULT, &good, &good_len), 0);
  uint8_t bytes[64];
  assert_true(len + good_len <= sizeof bytes);
  memcpy(bytes, bad, len);
  memcpy(bytes + len, good, good_len);
  free(good);
  assert_true(tr_tls_uv_write(tr_relay_link_conn(f.client.link), bytes, len + good_len) >= 0);
  RUN_UNTIL(&f, f.client.closed && f.server.closed, 5000);
  assert_int_equal(f.client.goodbye_reason, TRACERELAY__GOODBYE__REASON__REASON_PROTOCOL_ERROR);
  assert_string_equal(f.client.goodbye_text, text);
  assert_int_equal(f.server.frames, 0); /* nothing after the error */
  fixture_finish(&f);
}

static void test_protocol_errors_close(void **state) {
  (void)state;
  static const uint8_t garbage[] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff};
  expect_protocol_error(garbage, sizeof garbage,
                        "protocol error: a frame of 5 bytes does not decode to a known message");
  static const uint8_t empty[] = {0, 0, 0, 0};
  expect_protocol_error(empty, sizeof empty,
                        "protocol error: a frame of 0 bytes does not decode to a known message");
  static const uint8_t huge[] = {0xff, 0xff, 0xff, 0x7f};
  char text[96];
  snprintf(text, sizeof text, "protocol error: frame longer than %u bytes",
           (unsigned)TR_RELAY_MAX_FRAME_DEFAULT);
  expect_protocol_error(huge, sizeof huge, text);
}

static void test_heartbeats_keep_link_and_silence_closes_it(void **state) {
  (void)state;
  struct fixture f;
  /* Heartbeats every 50 ms, silence closes after 2 s: the timeout is long enough that a busy
   * machine descheduling this process for a while does not look like silence (it once did at
   * 300 ms), and the test waits for the heartbeats it checks instead of a time. */
  fixture_start(&f, 50, 2000);
  listen_server(&f);
  f.client.say_hello = true;
  f.server.welcome = true;
  f.client.watch = f.server.watch = true;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.frames == 1, 5000);
  /* Established both ways and otherwise quiet: heartbeats alone keep it up. */
  RUN_UNTIL(&f, (f.client.heartbeats >= 5 && f.server.heartbeats >= 5) || f.client.closed ||
                    f.server.closed, 10000);
  assert_false(f.client.closed);
  assert_false(f.server.closed);
  assert_true(f.client.heartbeats >= 5);
  assert_true(f.server.heartbeats >= 5);
  /* The client goes silent (its process hangs): the service closes it at the timeout, with
   * no Goodbye, and the client sees the connection end. */
  f.client.watch = false;
  uv_update_time(&f.loop);
  uint64_t silent_at = uv_now(&f.loop);
  RUN_UNTIL(&f, f.server.closed && f.client.closed, 10000);
  uv_update_time(&f.loop);
  assert_true(uv_now(&f.loop) - silent_at >= 1950);
  assert_int_equal(f.server.close_reason, 0);
  assert_int_equal(f.client.close_reason, TR_ERR_CLOSED);
  assert_int_equal(f.client.goodbye_reason, -1);
  fixture_finish(&f);
}

/* The service's backpressure: its answers back up behind a client that does not read, so it
 * stops reading that client; the frames of the read it was in are held, and every frame is
 * delivered, in order, once the client reads again. */
static void test_backpressure_holds_frames_in_order(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0, 0);
  f.opts.tls.max_queued = 64 * 1024;
  f.opts.pause_read_above = 32 * 1024;
  listen_server(&f);
  f.client.say_hello = true;
  f.server.welcome = f.server.answer_big = true;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.frames == 1, 5000);
  tr_tls_uv_conn *client_conn = tr_relay_link_conn(f.client.link);
  assert_int_equal(tr_tls_uv_pause_read(client_conn), 0);
  enum { N = 2000 }; /* 32 MB of answers: more than the sockets' buffers hold */
  for (uint64_t n = 1; n <= N; n++)
    assert_int_equal(send_heartbeat(&f.client, n, false), 0);
  run_for(&f, 500);
  assert_true(f.server.heartbeats < N);
  assert_false(tr_relay_link_idle(f.server.link));
  assert_false(f.server.closed);
  assert_int_equal(tr_tls_uv_resume_read(client_conn), 0);
  RUN_UNTIL(&f, f.client.answers == N, 20000);
  assert_int_equal(f.server.heartbeats, N);
  assert_true(f.server.heartbeats_in_order);
  assert_true(f.client.answers_in_order);
  tr_relay_link_close(f.client.link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "done");
  f.server.hang_up_on_goodbye = true;
  fixture_finish(&f);
}

/* The end holds the input from inside a frame's delivery (a regional whose upstream backed up):
 * nothing more is delivered, however much arrives, until it lets go; then everything, in
 * order. */
static void test_held_input_waits_for_release(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0, 0);
  listen_server(&f);
  f.client.say_hello = true;
  f.server.welcome = true;
  f.server.hold_after = 10;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.frames == 1, 5000);
  enum { N = 3000 };
  for (uint64_t n = 1; n <= N; n++)
    assert_int_equal(send_heartbeat(&f.client, n, false), 0);
  RUN_UNTIL(&f, f.server.heartbeats == 10, 5000);
  run_for(&f, 300);
  assert_int_equal(f.server.heartbeats, 10);
  assert_true(tr_relay_link_input_held(f.server.link));
  assert_false(f.server.closed);
  tr_relay_link_release_input(f.server.link);
  assert_false(tr_relay_link_input_held(f.server.link));
  RUN_UNTIL(&f, f.server.heartbeats == N, 10000);
  assert_true(f.server.heartbeats_in_order);
  tr_relay_link_close(f.client.link, TRACERELAY__GOODBYE__REASON__REASON_SHUTDOWN, "done");
  f.server.hang_up_on_goodbye = true;
  fixture_finish(&f);
}

static void test_connection_never_up(void **state) {
  (void)state;
  struct fixture f;
  fixture_start(&f, 0, 0);
  listen_server(&f);
  struct sockaddr_in nobody;
  uv_ip4_addr("127.0.0.1", 1, &nobody); /* nothing listens on port 1 */
  f.addr = nobody;
  connect_client(&f);
  RUN_UNTIL(&f, f.client.closed, 5000);
  assert_false(f.client.opened);
  assert_true(f.client.close_reason < 0);
  fixture_finish(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_frames_both_ways_then_goodbye),
      cmocka_unit_test(test_goodbye_reason_seen_by_peer),
      cmocka_unit_test(test_protocol_errors_close),
      cmocka_unit_test(test_heartbeats_keep_link_and_silence_closes_it),
      cmocka_unit_test(test_backpressure_holds_frames_in_order),
      cmocka_unit_test(test_held_input_waits_for_release),
      cmocka_unit_test(test_connection_never_up),
  };
  return cmocka_run_group_tests(tests, make_certs, remove_certs);
}
