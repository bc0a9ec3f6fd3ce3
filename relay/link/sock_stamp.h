/* sock_stamp.h: the kernel's software timestamps of one TCP socket's traffic, as BOOTTIME.
 *
 * What the clock probes of the relay link measure (docs/timeline.md, Probes): a probe's legs
 * are as short and as alike as the path itself only when both ends are timed by the kernel,
 * not by a process that a scheduler may hold for tens of microseconds.
 * - Receive stamp (SO_TIMESTAMPNS): when the newest segment a read returned reached this host's
 *   network stack. TCP reports the last segment's, so a message read together with a later one
 *   gets the later one's time (still no earlier than its own arrival).
 * - Send stamp (SO_TIMESTAMPING, software, requested for one write at a time): when the last
 *   byte of that write was handed to the device driver, i.e. left this host's stack. It is
 *   read from the socket's error queue, matched to its write by byte count (OPT_ID), and is
 *   usually there when the write returns; a write the kernel held back (congestion window, a
 *   queueing discipline) gets its stamp when it really leaves.
 * The kernel stamps on REALTIME; each is converted as "BOOTTIME now minus the stamp's age",
 * the real BOOTTIME read between two REALTIME readings at most TR_SOCK_STAMP_PAIR_NS apart, so
 * that a preemption between the clocks cannot move it, and the instant found then put on the
 * simulated clock if one is on (relay/clock/clock.h, tr_clock_boottime_at: a stamp collected late
 * keeps its place instead of drifting with its age);
 * the age is taken from the later reading for a send stamp and from the earlier one for a
 * receive stamp, so that each errs on its safe side (a departure never late, an arrival never
 * early) and a send always converts to no later than its receipt.
 * A stamp that makes no sense (REALTIME stepped, no pair within three tries) is dropped: the
 * callers then fall back to their own clock readings, which are valid but later bounds.
 *
 * Where the kernel offers neither (not Linux, options refused), rx/tx stay false and reads and
 * writes work unstamped. The kernel turns receive stamping on system-wide asynchronously when
 * the first socket asks for it, so the first segments of a connection can come unstamped too. Pure socket calls: no event loop; the caller owns the descriptor. */
#ifndef TR_SOCK_STAMP_H
#define TR_SOCK_STAMP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TR_SOCK_STAMP_PAIR_NS 2000

typedef struct tr_sock_stamp {
  bool rx, tx;       /* receive / send stamps are on */
  uint32_t sent;     /* bytes written since tr_sock_stamp_enable, mod 2^32 (OPT_ID's count) */
  uint32_t tx_key;   /* the count at the last byte of the marked write */
  bool tx_waiting;   /* the marked write's stamp has not arrived yet */
  int64_t tx_ns;     /* its send stamp (BOOTTIME) once arrived, else 0 */
  uint32_t ooo_mark; /* TCP's count of segments received out of order, at the last mark */
  uint32_t errq_reads; /* error-queue reads so far (each a system call), for tests */
} tr_sock_stamp;

/* Turns stamps on for a connected TCP socket with nothing written yet. */
void tr_sock_stamp_enable(tr_sock_stamp *s, int fd);
/* recvmsg without blocking: the byte count, 0 at EOF, or -errno (-EAGAIN: nothing there).
 * *arrival_ns: the receive stamp of the newest bytes read, or 0 if there is none. */
ssize_t tr_sock_stamp_recv(tr_sock_stamp *s, int fd, void *buf, size_t cap, int64_t *arrival_ns);
/* Bytes the caller wrote to fd some other way (they move OPT_ID's count). */
void tr_sock_stamp_count(tr_sock_stamp *s, size_t n);
/* Writes without blocking and asks for a send stamp of the last byte: the byte count written
 * or -errno. A full write becomes the marked write (any earlier mark is forgotten); a partial
 * one marks nothing (its stamp, if any, is discarded when it arrives). */
ssize_t tr_sock_stamp_send(tr_sock_stamp *s, int fd, const void *buf, size_t len);
/* The send stamp of the marked write, once arrived (collected from the error queue now if
 * need be), else 0. */
int64_t tr_sock_stamp_sent_time(tr_sock_stamp *s, int fd);
/* True if TCP received segments out of order since the last tr_sock_stamp_mark_order (or
 * since enable): then the receive stamp of a read may be that of bytes that came early, ahead
 * of a lost segment, not of the retransmission that completed the read (seen behind a
 * saturated link: stamps up to 14 ms early). Such bytes can sit in TCP's out-of-order queue
 * across many reads, so the mark belongs where the awaited message cannot have arrived yet
 * (when the probe it answers left). One getsockopt(TCP_INFO) each; false (and no mark) where
 * the kernel does not count. With mark, the count read is also the new mark (one call for
 * both, where every read is checked). */
bool tr_sock_stamp_reordered(tr_sock_stamp *s, int fd, bool mark);
void tr_sock_stamp_mark_order(tr_sock_stamp *s, int fd);
/* Reads the error queue up to the marked write's stamp, which it keeps (the stamps before it are
 * of writes no longer marked; a stamp behind it would be of a later write, and the marked
 * write is the latest), or until the queue is empty. */
void tr_sock_stamp_drain(tr_sock_stamp *s, int fd);

#endif
