/* relay_link_priv.h: what relay_link.c (links over a connection) and relay_carrier.c
 * (carriers and the links they carry) share of a link. Not for the ends: they use
 * relay_link.h.
 *
 * The two call each other one way by name: relay_link.c calls the carrier functions below, and
 * relay_carrier.c reaches back up only through struct tr_relay_link_ops, the table every link
 * carries (relay_link.c's own, set by its allocation). So relay/link reads bottom-up
 * (relay_carrier.c under relay_link.c), and the carrier runs without relay_link.c behind a table
 * of a test's (tests/unit/test_relay_carrier_alone.c). */
#ifndef TR_RELAY_LINK_PRIV_H
#define TR_RELAY_LINK_PRIV_H

#include "relay/base/byte_buf.h"
#include "relay/link/relay_link.h"
#include "relay/link/relay_session.h"

typedef struct tr_relay_carrier tr_relay_carrier;

/* What a carrier asks of the link code above it. */
struct tr_relay_link_ops {
  /* A new link (a carried one: the carrier sets its slot and state), or NULL. */
  tr_relay_link *(*alloc)(const struct tr_relay_link_opts *opts,
                          const struct tr_relay_link_events *ev, void *data);
  /* Frees a link that heard on_closed. */
  void (*free)(tr_relay_link *l);
  /* What a write to the link's connection returned (tls_uv's write: the bytes now queued, or
   * an error), as the link takes it: a full queue closes it as overloaded, a long queue pauses
   * reading. 0 or the error. */
  int (*wrote)(tr_relay_link *l, int rc);
  /* The link's one close path (tr_relay_link_close) with the whole text. */
  void (*close)(tr_relay_link *l, Tracerelay__Goodbye__Reason reason, const char *text);
};

struct tr_relay_link {
  tr_tls_uv_conn *conn; /* NULL for a carried link: its carrier's is used */
  const struct tr_relay_link_ops *ops;
  const struct tr_relay_link_events *ev;
  void *data;
  struct tr_relay_link_opts opts; /* opts.label is NULL: label[] holds it */
  char label[320];
  tr_relay_reader reader;
  tr_relay_heartbeat hb;
  size_t max_out;   /* the largest frame the peer accepts */
  bool open;        /* the TLS handshake is done */
  bool established; /* Hello / Welcome done: heartbeats go */
  bool closing;
  bool paused;      /* our output is backed up: socket reading is paused, and the rest of the
                       read that was being processed waits in stash */
  bool held;        /* the same, asked by the end (tr_relay_link_hold_input) */
  tr_byte_buf stash;
  /* A carrier (tr_relay_link_carry): its slots and its gathered output; its counts, kept
   * until the link is freed (tr_relay_link_carrier_stats in on_closed too). */
  tr_relay_carrier *carrier;
  uint64_t dropped_frames, frames_out, writes;
  /* A carried link: the carrier it rides on, its slot, and its own state. */
  tr_relay_link *parent;
  uint64_t slot;
  uint64_t bytes_in;     /* frame bytes delivered to it */
  bool peer_gone;        /* the peer ended the slot: nothing more goes to it */
  bool said_goodbye;     /* our Goodbye (with a reason) ended the slot already */
  int end_reason;        /* for on_closed: 0 (we ended it) or TR_ERR_CLOSED (the peer did) */
  bool touched;          /* frames of the carrier's read being processed came for it */
  tr_relay_link *next_touched;
};

/* relay_carrier.c's, for relay_link.c. */
/* A decoded frame with a slot came on carrier l: to its carried link (taken). len: its size. */
void tr_relay_carrier_deliver(tr_relay_link *l, Tracerelay__RelayFrame *f, size_t len);
/* The carried links that had frames in this read hear on_read_done. */
void tr_relay_carrier_read_done(tr_relay_link *l);
/* Appends to l's gathered output (sent at the end of the loop's turn, or at once when large).
 * Returns as tr_relay_link_write. */
int tr_relay_carrier_write(tr_relay_link *l, const uint8_t *buf, size_t len);
/* Sends the gathered output now, as one write. Returns as tr_relay_link_write (0 when nothing
 * waited); the caller takes the result (tr_relay_link_wrote). */
int tr_relay_carrier_flush(tr_relay_link *l);
size_t tr_relay_carrier_gathered(const tr_relay_link *l);
/* Carrier l's queue drained: its carried links hear on_drain. */
void tr_relay_carrier_drain(tr_relay_link *l);
/* Carrier l's connection ended: every carried link ends with it (reason, why), before l. */
void tr_relay_carrier_end(tr_relay_link *l, int reason, const char *why);
/* A carried link's side of the API. */
int tr_relay_carried_send(tr_relay_link *l, const Tracerelay__RelayFrame *f);
/* The same while l is closing (its Goodbye): f on l's slot, without the state checks. */
int tr_relay_carried_write_frame(tr_relay_link *l, const Tracerelay__RelayFrame *f);
/* Ends l (closing, its on_closing heard): the peer hears of it unless it ended the slot, and
 * on_closed follows in the loop's next phase. */
void tr_relay_carried_hang_up(tr_relay_link *l);

#endif
