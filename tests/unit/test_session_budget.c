/* test_session_budget.c: the service-wide budget of central buffer memory
 * (--max-buffer-memory; service/session_admit.c, service/session.c), on the fake link of
 * session_fixture.h. Checks that a session whose buffers on every connected host would pass
 * the budget, with what the running sessions reserve, is refused with the product in the
 * error; that one with no host yet is refused when even one host would pass it; that a host
 * joining a running session past the budget gets no central buffer there, its chunks refused
 * and counted, logged once naming the host, while the hosts inside the budget keep theirs;
 * and that a freed session gives its reservation back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "relay/base/tr_error.h"
#include "service/hosts.h"
#include "service/session_priv.h"
#include "session_fixture.h"

#define MIB (UINT64_C(1) << 20)
#define START TRACERELAY__COMMAND__CMD_START_DATA_SOURCE

static const char *const kTrackEvent[][3] = {{"track_event", NULL}};
static const char *const kNames[] = {"track_event", NULL};

static int try_enable(struct fx_config *c, tr_session **s, char *err, size_t len) {
  err[0] = '\0';
  return tr_session_enable(&fx_svc, 0, &c->cfg, -1, &fx_observer, NULL, s, err, len);
}

static void test_enable_refused_with_the_product(void **state) {
  struct fx_config cfg;
  char err[256];
  tr_session *s = NULL, *t = NULL;
  (void)state;
  fx_setup();
  tr_session_service_set_max_buffer_memory(&fx_svc, 3 * MIB);
  for (size_t i = 0; i < 2; i++) {
    fx_make_host(i, i ? "host-b" : "host-a", 1, kTrackEvent);
    fx_connect(i);
  }
  fx_config(&cfg, kNames); /* one 1 MiB buffer */
  cfg.buf.size_kb = 2048;
  /* 2 MiB on each of 2 hosts is 4 MiB: over 3 MiB on its own. */
  assert_int_equal(try_enable(&cfg, &s, err, sizeof err), TR_ERR_CONFIG);
  assert_null(s);
  assert_non_null(strstr(err, "buffers of 1 x 2 MiB on each of 2 hosts = 4 MiB, over "
                              "--max-buffer-memory 3 MiB with the 0 bytes running sessions "
                              "reserve"));
  assert_int_equal(fx_num_sent, 0); /* nothing was set up */

  /* 1 MiB each fits and reserves 2 MiB; a second such session would bring 4 MiB. */
  cfg.buf.size_kb = 1024;
  s = fx_enable(&cfg);
  assert_int_equal(fx_svc.buffer_memory_reserved, 2 * MIB);
  assert_int_equal(try_enable(&cfg, &t, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "buffers of 1 x 1 MiB on each of 2 hosts = 2 MiB, over "
                              "--max-buffer-memory 3 MiB with the 2 MiB running sessions "
                              "reserve"));
  /* Freeing the first gives its 2 MiB back: the second fits now. */
  tr_session_free(s);
  assert_int_equal(fx_svc.buffer_memory_reserved, 0);
  t = fx_enable(&cfg);
  assert_int_equal(fx_svc.buffer_memory_reserved, 2 * MIB);
  fx_teardown();
}

static void test_enable_with_no_host_refused_when_one_would_pass(void **state) {
  struct fx_config cfg;
  char err[256];
  tr_session *s = NULL;
  (void)state;
  fx_setup();
  tr_session_service_set_max_buffer_memory(&fx_svc, MIB);
  fx_config(&cfg, kNames);
  cfg.buf.size_kb = 1536;
  assert_int_equal(try_enable(&cfg, &s, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "buffers of 1 x 1.5 MiB = 1.5 MiB for each host, over "
                              "--max-buffer-memory 1 MiB"));
  assert_non_null(strstr(err, "no host could join"));
  cfg.buf.size_kb = 1024;
  s = fx_enable(&cfg);
  assert_int_equal(fx_svc.buffer_memory_reserved, 0); /* no host yet: nothing made */
  fx_teardown();
}

static void connect_host_c(void *ud) {
  (void)ud;
  fx_connect(2);
}

static void test_host_joining_past_the_budget(void **state) {
  struct fx_config cfg;
  struct fx_stats st;
  char log[4096];
  tr_session *s;
  (void)state;
  fx_setup();
  tr_session_service_set_max_buffer_memory(&fx_svc, 2 * MIB);
  fx_make_host(0, "host-a", 1, kTrackEvent);
  fx_make_host(1, "host-b", 1, kTrackEvent);
  fx_make_host(2, "host-c", 1, kTrackEvent);
  fx_connect(0);
  fx_config(&cfg, kNames);
  s = fx_enable(&cfg);
  uint32_t buffer = fx_sent[0].target_buffer;
  fx_connect(1); /* 2 MiB: exactly the budget */
  assert_int_equal(fx_svc.buffer_memory_reserved, 2 * MIB);
  fx_capture_log(connect_host_c, NULL, log, sizeof log);
  assert_int_equal(fx_svc.buffer_memory_reserved, 2 * MIB);
  const char *warn = strstr(log, "host host-c joined past the buffer budget: its 1 MiB of "
                                 "central buffers with the 2 MiB the sessions reserve would "
                                 "pass --max-buffer-memory 2 MiB");
  assert_non_null(warn);
  assert_null(strstr(strstr(warn, "joined") + 1, "joined past the buffer budget")); /* once */
  /* It is still in the session (its data sources run), but what it sends is refused. */
  assert_true(tr_session_has_host(s, fx_hosts[2]));
  for (size_t i = 0; i < 3; i++) {
    fx_answer(i, START);
    fx_send_chunk(i, buffer);
    fx_send_chunk(i, buffer);
  }
  fx_stats(s, &st);
  assert_int_equal(st.ext->n_tracerelay_hosts, 3);
  assert_int_equal(st.stats->n_buffer_stats, 2); /* host-a's and host-b's, not host-c's */
  for (size_t h = 0; h < 3; h++) {
    const Tracerelay__HostStats *hs = st.ext->tracerelay_hosts[h];
    bool is_c = strcmp(hs->machine_name, "host-c") == 0;
    assert_int_equal(hs->session_chunks_refused, is_c ? 2 : 0);
    assert_int_equal(hs->n_buffer_stats_index, is_c ? 0 : 1);
  }
  fx_stats_free(&st);
  /* The same agent connecting again keeps its entry: no second log line. */
  fx_disconnect(2);
  fx_capture_log(connect_host_c, NULL, log, sizeof log);
  assert_null(strstr(log, "joined past the buffer budget"));
  fx_teardown();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_enable_refused_with_the_product),
      cmocka_unit_test(test_enable_with_no_host_refused_when_one_would_pass),
      cmocka_unit_test(test_host_joining_past_the_budget),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
