/* sock_stamp.c: kernel socket timestamps as BOOTTIME (see sock_stamp.h for the contract). */
#include "relay/link/sock_stamp.h"

#include "relay/clock/clock.h"

#include <errno.h>
#include <linux/errqueue.h>
#include <linux/tcp.h>
#include <linux/net_tstamp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_AGE_NS (10 * 1000000000LL) /* an older "stamp" means REALTIME stepped */

static int64_t ts_ns(const struct timespec *t) {
  return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

/* BOOTTIME (as relay/clock/clock.h reads it) at the REALTIME instant *stamp, or 0 if that cannot be
 * told reliably. The real BOOTTIME reading lies between two REALTIME ones: measuring the
 * stamp's age from the earlier one errs late, from the later one early, by at most their
 * distance. The age is taken off the real clock, which runs at REALTIME's rate, and only the
 * instant found is then put on the simulated clock, if one is on (its drift would otherwise
 * stretch the age: 200 ppm of a stamp 30 ms old is 6 us). */
static int64_t to_boottime(const struct timespec *stamp, bool err_early) {
  if (stamp->tv_sec == 0 && stamp->tv_nsec == 0)
    return 0;
  for (int i = 0; i < 3; i++) {
    struct timespec r0, r1, b;
    clock_gettime(CLOCK_REALTIME, &r0);
    int rc = clock_gettime(CLOCK_BOOTTIME, &b);
    clock_gettime(CLOCK_REALTIME, &r1);
    if (rc != 0)
      return 0;
    if (ts_ns(&r1) - ts_ns(&r0) > TR_SOCK_STAMP_PAIR_NS)
      continue;
    int64_t now = ts_ns(&b);
    int64_t age = ts_ns(err_early ? &r1 : &r0) - ts_ns(stamp);
    uint64_t at = 0;
    if (age < 0 || age >= MAX_AGE_NS || age >= now ||
        tr_clock_boottime_at((uint64_t)(now - age), &at) != 0 || at > INT64_MAX)
      return 0;
    return (int64_t)at;
  }
  return 0;
}

void tr_sock_stamp_enable(tr_sock_stamp *s, int fd) {
  memset(s, 0, sizeof *s);
  int on = 1;
  s->rx = setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) == 0;
  /* Reporting only (stamps are requested per write); OPT_ID counts bytes from now on, which
   * is why nothing may have been written yet; TSONLY: the stamp without a copy of the data. */
  int flags = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY;
  s->tx = setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof flags) == 0;
}

ssize_t tr_sock_stamp_recv(tr_sock_stamp *s, int fd, void *buf, size_t cap, int64_t *arrival_ns) {
  *arrival_ns = 0;
  /* Room for SO_TIMESTAMPNS and for SCM_TIMESTAMPING, which the send stamps' reporting flag
   * adds to reads as well. */
  union {
    char buf[CMSG_SPACE(sizeof(struct timespec)) + CMSG_SPACE(sizeof(struct scm_timestamping))];
    struct cmsghdr align;
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                     .msg_controllen = sizeof ctl.buf};
  ssize_t n;
  do
    n = recvmsg(fd, &m, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    /* A wake-up with no data may be a send stamp in the error queue: left there, it would
     * keep the socket signalled. */
    if (err == EAGAIN || err == EWOULDBLOCK)
      tr_sock_stamp_drain(s, fd);
    return -err;
  }
  if (s->tx_waiting)
    tr_sock_stamp_drain(s, fd);
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); n > 0 && cm != NULL; cm = CMSG_NXTHDR(&m, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPNS &&
        cm->cmsg_len >= CMSG_LEN(sizeof(struct timespec))) {
      struct timespec t;
      memcpy(&t, CMSG_DATA(cm), sizeof t);
      *arrival_ns = to_boottime(&t, false); /* a receipt: never before it */
    }
  }
  return n;
}

void tr_sock_stamp_count(tr_sock_stamp *s, size_t n) { s->sent += (uint32_t)n; }

ssize_t tr_sock_stamp_send(tr_sock_stamp *s, int fd, const void *buf, size_t len) {
  union {
    char buf[CMSG_SPACE(sizeof(uint32_t))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (s->tx) {
    m.msg_control = ctl.buf;
    m.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SO_TIMESTAMPING;
    cm->cmsg_len = CMSG_LEN(sizeof(uint32_t));
    uint32_t want = SOF_TIMESTAMPING_TX_SOFTWARE;
    memcpy(CMSG_DATA(cm), &want, sizeof want);
  }
  ssize_t n;
  do
    n = sendmsg(fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return -errno;
  s->sent += (uint32_t)n;
  if (s->tx && (size_t)n == len && len > 0) {
    s->tx_key = s->sent - 1;
    s->tx_waiting = true;
    s->tx_ns = 0;
    tr_sock_stamp_drain(s, fd); /* mostly there already: the driver took it in this call */
  }
  return n;
}

/* The send stamp of the error-queue message m, or 0 if m is something else. */
static int64_t stamp_of(struct msghdr *m, uint32_t *key) {
  const struct scm_timestamping *stamps = NULL;
  const struct sock_extended_err *ee = NULL;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(m); cm != NULL; cm = CMSG_NXTHDR(m, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_TIMESTAMPING &&
        cm->cmsg_len >= CMSG_LEN(sizeof *stamps))
      stamps = (const struct scm_timestamping *)CMSG_DATA(cm);
    else if (((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
              (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)) &&
             cm->cmsg_len >= CMSG_LEN(sizeof *ee))
      ee = (const struct sock_extended_err *)CMSG_DATA(cm);
  }
  if (stamps == NULL || ee == NULL || ee->ee_errno != ENOMSG ||
      ee->ee_origin != SO_EE_ORIGIN_TIMESTAMPING || ee->ee_info != SCM_TSTAMP_SND)
    return 0;
  struct timespec t;
  memcpy(&t, &stamps->ts[0], sizeof t);
  *key = ee->ee_data;
  return to_boottime(&t, true); /* a departure: never after it */
}

void tr_sock_stamp_drain(tr_sock_stamp *s, int fd) {
  if (!s->tx)
    return;
  for (int i = 0; i < 64; i++) { /* bounded: each message is one stamp */
    union {
      char buf[CMSG_SPACE(sizeof(struct scm_timestamping)) +
               CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
      struct cmsghdr align;
    } ctl;
    char data[64];
    struct iovec iov = {.iov_base = data, .iov_len = sizeof data};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                       .msg_controllen = sizeof ctl.buf};
    s->errq_reads++;
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
      return; /* EAGAIN: empty */
    uint32_t key = 0;
    int64_t t = stamp_of(&m, &key);
    if (t != 0 && s->tx_waiting && key == s->tx_key) {
      s->tx_ns = t;
      s->tx_waiting = false;
      return; /* the newest write's stamp: none can be queued behind it */
    }
  }
}

/* TCP's count of segments received out of order, or false where the kernel has none. */
static bool ooo_count(int fd, uint32_t *count) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(struct tcp_info, tcpi_rcv_ooopack) + sizeof ti.tcpi_rcv_ooopack)
    return false;
  *count = ti.tcpi_rcv_ooopack;
  return true;
}

bool tr_sock_stamp_reordered(tr_sock_stamp *s, int fd, bool mark) {
  uint32_t count;
  if (!ooo_count(fd, &count))
    return false;
  bool reordered = count != s->ooo_mark;
  if (mark)
    s->ooo_mark = count;
  return reordered;
}

void tr_sock_stamp_mark_order(tr_sock_stamp *s, int fd) {
  uint32_t count;
  if (ooo_count(fd, &count))
    s->ooo_mark = count;
}

int64_t tr_sock_stamp_sent_time(tr_sock_stamp *s, int fd) {
  if (s->tx_waiting)
    tr_sock_stamp_drain(s, fd);
  return s->tx_ns;
}
