/* test_sock_stamp.c: kernel send and receive stamps on a real TCP connection over loopback:
 * a marked write gets a send stamp (matched by byte count, also after unmarked bytes), the
 * read gets a receive stamp, both lie between clock reads taken around them and in causal
 * order (sent <= received), both on the simulated clock when one is set, and a write that is
 * no longer the marked one never lends it its stamp, one error-queue read finds a stamp that is
 * there; over IPv6 too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/clock/clock.h"
#include "relay/link/sock_stamp.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct pair {
  int a, b; /* a connected TCP pair on loopback */
  tr_sock_stamp sa, sb;
};

/* On 127.0.0.1, or on ::1 (false if this host has no IPv6 loopback). */
static bool open_pair_on(struct pair *p, int family) {
  struct sockaddr_storage addr = {0};
  socklen_t len;
  if (family == AF_INET6) {
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&addr;
    a6->sin6_family = AF_INET6;
    a6->sin6_addr = in6addr_loopback;
    len = sizeof *a6;
  } else {
    struct sockaddr_in *a4 = (struct sockaddr_in *)&addr;
    a4->sin_family = AF_INET;
    a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof *a4;
  }
  int l = socket(family, SOCK_STREAM, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&addr, len) != 0) {
    assert_int_not_equal(family, AF_INET);
    if (l >= 0)
      close(l);
    return false;
  }
  assert_int_equal(listen(l, 1), 0);
  assert_int_equal(getsockname(l, (struct sockaddr *)&addr, &len), 0);
  p->a = socket(family, SOCK_STREAM, 0);
  assert_int_equal(connect(p->a, (struct sockaddr *)&addr, len), 0);
  p->b = accept(l, NULL, NULL);
  assert_true(p->b >= 0);
  close(l);
  int on = 1;
  setsockopt(p->a, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  tr_sock_stamp_enable(&p->sa, p->a);
  tr_sock_stamp_enable(&p->sb, p->b);
  return true;
}

static void open_pair(struct pair *p) { open_pair_on(p, AF_INET); }

static void close_pair(struct pair *p) {
  close(p->a);
  close(p->b);
}

static int64_t now(void) {
  uint64_t t = 0;
  assert_int_equal(tr_clock_read(TR_CLOCK_BOOTTIME, &t), 0);
  return (int64_t)t;
}

/* Reads exactly n bytes on b; *arrival = the stamp of the read that completed them. */
static void read_n(struct pair *p, size_t n, int64_t *arrival) {
  char buf[256];
  size_t got = 0;
  for (int i = 0; i < 1000 && got < n; i++) {
    struct pollfd pf = {.fd = p->b, .events = POLLIN};
    poll(&pf, 1, 10);
    ssize_t r = tr_sock_stamp_recv(&p->sb, p->b, buf, n - got, arrival);
    if (r > 0)
      got += (size_t)r;
    else
      assert_int_equal(r, -EAGAIN);
  }
  assert_int_equal(got, n);
}

/* One marked write from a to b: before <= sent <= received <= after. */
static void check_one_exchange(struct pair *p) {
  static const char msg[] = "clock probe";
  int64_t before = now();
  assert_int_equal(tr_sock_stamp_send(&p->sa, p->a, msg, sizeof msg), (ssize_t)sizeof msg);
  int64_t arrival = 0;
  read_n(p, sizeof msg, &arrival);
  int64_t sent = tr_sock_stamp_sent_time(&p->sa, p->a);
  int64_t after = now();
  assert_true(p->sa.tx);
  assert_true(p->sb.rx);
  /* Each stamp errs on its safe side by at most the REALTIME bracket of its conversion. */
  assert_true(sent >= before - TR_SOCK_STAMP_PAIR_NS);
  assert_true(arrival >= sent);
  assert_true(after >= arrival);
}

static void test_marked_write_is_stamped(void **state) {
  (void)state;
  struct pair p;
  open_pair(&p);
  check_one_exchange(&p);
  /* Unmarked bytes in between, counted: the next marked write still finds its stamp. */
  char filler[100];
  memset(filler, 'x', sizeof filler);
  assert_int_equal(write(p.a, filler, sizeof filler), (ssize_t)sizeof filler);
  tr_sock_stamp_count(&p.sa, sizeof filler);
  int64_t ignored;
  read_n(&p, sizeof filler, &ignored);
  check_one_exchange(&p);
  close_pair(&p);
}

/* The marked write's stamp ends the error queue's reading: on loopback it is there when the
 * write returns, so one read finds it (no second read to hear the queue is empty), and
 * nothing is left queued to keep the socket signalled. */
static void test_one_read_per_stamp(void **state) {
  (void)state;
  struct pair p;
  open_pair(&p);
  for (int i = 0; i < 20; i++) {
    uint32_t reads = p.sa.errq_reads;
    assert_int_equal(tr_sock_stamp_send(&p.sa, p.a, "probe", 5), 5);
    if (!p.sa.tx_waiting) /* found in the send's own reading */
      assert_int_equal(p.sa.errq_reads - reads, 1);
    assert_true(tr_sock_stamp_sent_time(&p.sa, p.a) > 0);
    struct pollfd pf = {.fd = p.a, .events = 0};
    assert_int_equal(poll(&pf, 1, 0), 0); /* no POLLERR: the queue is empty */
    int64_t ignored;
    read_n(&p, 5, &ignored);
  }
  close_pair(&p);
}

static void test_simulated_clock(void **state) {
  (void)state;
  /* Two hours ahead and 200 ppm fast: the stamps are converted onto that clock. */
  assert_int_equal(tr_clock_set_fake(7200000000000LL, 200.0), 0);
  struct pair p;
  open_pair(&p);
  check_one_exchange(&p);
  close_pair(&p);
  tr_clock_clear_fake();
}

/* IPv6 reports send stamps under its own error-queue level (IPV6_RECVERR). */
static void test_ipv6(void **state) {
  (void)state;
  struct pair p;
  if (!open_pair_on(&p, AF_INET6))
    skip();
  check_one_exchange(&p);
  close_pair(&p);
}

static void test_only_the_marked_write(void **state) {
  (void)state;
  struct pair p;
  open_pair(&p);
  check_one_exchange(&p);
  int64_t first = tr_sock_stamp_sent_time(&p.sa, p.a);
  assert_true(first > 0);
  /* Bytes written behind the stamper's back shift the count: the next marked write's stamp
   * does not match and is not taken, and the old one is gone with its mark. */
  assert_int_equal(write(p.a, "?", 1), 1);
  assert_int_equal(tr_sock_stamp_send(&p.sa, p.a, "probe", 5), 5);
  int64_t ignored;
  read_n(&p, 6, &ignored);
  assert_int_equal(tr_sock_stamp_sent_time(&p.sa, p.a), 0);
  close_pair(&p);
}

/* The kernel turns receive stamping on for the whole system asynchronously once a socket asks
 * for it (and off once none does), so a fresh process's first segments can come unstamped. A
 * pair kept open for the whole group holds it on; the group starts once a segment is stamped
 * (bounded: at most a second). */
static struct pair keeper;

static int stamping_on(void **state) {
  (void)state;
  open_pair(&keeper);
  for (int i = 0; i < 1000; i++) {
    int64_t arrival = 0;
    char c;
    if (write(keeper.a, "k", 1) != 1)
      return -1;
    struct pollfd pf = {.fd = keeper.b, .events = POLLIN};
    poll(&pf, 1, 10);
    if (tr_sock_stamp_recv(&keeper.sb, keeper.b, &c, 1, &arrival) == 1 && arrival != 0)
      return 0;
    usleep(1000);
  }
  return -1;
}

static int stamping_off(void **state) {
  (void)state;
  close_pair(&keeper);
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_marked_write_is_stamped),
      cmocka_unit_test(test_one_read_per_stamp),
      cmocka_unit_test(test_simulated_clock),
      cmocka_unit_test(test_ipv6),
      cmocka_unit_test(test_only_the_marked_write),
  };
  return cmocka_run_group_tests(tests, stamping_on, stamping_off);
}
