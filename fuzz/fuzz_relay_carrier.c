/* fuzz_relay_carrier.c: a carrier's demultiplexer (relay/link/relay_carrier.c, through
 * relay_link.c's reading) on a byte stream as the peer sends it over the carrier, between calls
 * this side makes: slots the peer opens (accepted, or refused by the end), frames for open,
 * ended and unknown slots, slot ends with and without a reason, more slots than allowed, the
 * carrier's own frames and its end. relay_link.c and relay_carrier.c are compiled from source
 * over a fake transport (fake_tls_uv.h: no socket, no TLS); everything above it is the daemons'
 * code, in a real libuv loop, whose prepare/check phases reap ended slots and send what was
 * gathered.
 *
 * Checked beyond memory safety, against a model of docs/relay-protocol.md's Multiplexing that
 * reads the same stream with its own frame reader, before the link does:
 * - every frame goes to the end of its slot, in order (counts, a hash of the message kinds,
 *   tr_relay_link_bytes_in); the carrier's own to the carrier; a frame for a slot that ended,
 *   was never opened below the highest, or that the end refused at its on_open, is dropped and
 *   counted (dropped_frames); one past max_slots, or that does not decode, closes the carrier;
 * - a carried link never hears on_frame after its slot ended, hears on_closing once and
 *   on_closed once, never from inside the call that ended it, with 0 (ended here) or
 *   TR_ERR_CLOSED (by the peer) or its carrier's reason; every one before the carrier's
 *   on_closed; on_read_done once per read that brought it frames, while open; on_drain once;
 * - what goes out: whole frames, each slot's heartbeats in the order sent, one Goodbye at most
 *   per slot and nothing after it (with a reason exactly when one was given), none after the
 *   carrier's own Goodbye; every frame a send accepted leaves, unless the peer's transport
 *   ended first; frames_out and writes add up to what the transport was given;
 * - open_slot's result and slot numbers (the next above the highest, by either side);
 * - at the end the loop has no handle left and nothing leaked.
 *
 * Input: [config][ops...]. config: bit 0 the carrier accepts slots the peer opens (the
 * upstream's side; else only this side opens, as a regional), bits 1-3 max_slots (1, 2, 3, 4,
 * 8, 17, 33 or 256: past the slot table's first sizes, 16 and 32), bit 4 the end refuses
 * (closes at on_open, with a reason) accepted slots numbered a multiple of 3, bit 5 a carried
 * link's end does not hang up on the peer's Goodbye with a reason (it ends anyway).
 * An op byte below 0xf0 reads the next op+1 bytes (one socket read); 0xf9 reads the next
 * LE16-long bytes. Others, each taking the byte after it as its argument where it has one:
 * 0xf0 open a slot, 0xf1 close a carried link without a reason, 0xf2 with one, 0xf3 hang it
 * up, 0xf4 send a heartbeat on it, 0xf5 one turn of the loop, 0xf6 the queue drained (with the
 * argument's top bit, every third open link hangs up in its on_drain, from the argument mod 3),
 * 0xf7 close the carrier (REASON_SHUTDOWN) and stop, 0xf8 the peer's transport ends and stop.
 * At the end of the input the carrier is closed without a reason. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "fuzz/fake_tls_uv.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/link/relay_frame.h"
#include "relay/link/relay_link.h"

#define CHECK(c)                                                                                  \
  do {                                                                                            \
    if (!(c)) {                                                                                   \
      fprintf(stderr, "fuzz_relay_carrier: check failed at line %d: %s\n", __LINE__, #c);        \
      abort();                                                                                    \
    }                                                                                             \
  } while (0)

#define MSG(x) TRACERELAY__RELAY_FRAME__MSG_##x
#define REASON(x) TRACERELAY__GOODBYE__REASON__REASON_##x

enum op { /* below OP_OPEN: a read of op + 1 bytes */
  OP_OPEN = 0xf0, OP_CLOSE, OP_CLOSE_REASON, OP_HANG_UP, OP_SEND, OP_TURN, OP_DRAIN,
  OP_SHUTDOWN, OP_PEER_GONE, OP_LONG_READ
};

enum how { LIVE, BY_US, BY_PEER, BY_CARRIER }; /* LIVE: in the carrier's table */

/* A carried link: what the model expects of it, what it heard, and what went out on its slot. */
struct end {
  tr_relay_link *link; /* from on_open to on_closed */
  uint64_t slot;
  bool ours; /* opened by this side */
  enum how how;
  int want_reason; /* on_closed's */
  uint64_t want_frames, want_hash, want_bytes, want_drains;
  bool want_touched;                            /* frames for it in the read being processed */
  bool want_goodbye_out, want_goodbye_reason; /* ended by us, the carrier still open */
  bool drain_hangs_up;
  bool opened;
  int closings, closeds;
  uint64_t frames, hash, read_dones, drains;
  uint64_t sent, out_heartbeats; /* heartbeats a send accepted / seen leaving */
  int out_goodbyes;
  bool out_reason;
};

static uv_loop_t loop; /* one for every input: its handles are all closed after each */

static struct run {
  bool accept, refuse, keep_on_goodbye;
  unsigned max_slots;
  tr_relay_link *carrier; /* until its on_closed */
  tr_tls_uv_conn *conn;   /* until the transport ends */
  struct end *ends;
  size_t n_ends, cap_ends, next_accept;
  size_t *active; /* indexes of the ends not closed yet: the checks walk these, not all */
  size_t n_active, cap_active;
  /* the model of the carrier */
  tr_relay_reader shadow;
  uint64_t last_slot, dropped;
  size_t live;
  bool closing;
  bool peer_ended; /* the transport ended without our close: what was gathered may be lost */
  bool in_call;    /* inside a call into the link that may end slots: no on_closed then */
  uint64_t want_carrier_frames, want_carrier_hash;
  /* what the carrier heard */
  uint64_t carrier_frames, carrier_hash, carrier_read_dones, carrier_drains;
  int carrier_closings, carrier_closeds;
  /* what the transport was given */
  uint64_t out_frames, out_writes, carrier_goodbyes_out;
} R;

static uint64_t mix(uint64_t h, unsigned v) { return (h ^ v) * 0x100000001b3ull; }

/* ---- the model ---- */

static struct end *new_end(uint64_t slot, bool ours) {
  if (R.n_ends == R.cap_ends) {
    R.cap_ends = R.cap_ends ? 2 * R.cap_ends : 16;
    R.ends = realloc(R.ends, R.cap_ends * sizeof *R.ends);
    CHECK(R.ends != NULL);
  }
  if (R.n_active == R.cap_active) {
    R.cap_active = R.cap_active ? 2 * R.cap_active : 16;
    R.active = realloc(R.active, R.cap_active * sizeof *R.active);
    CHECK(R.active != NULL);
  }
  R.active[R.n_active++] = R.n_ends;
  struct end *e = &R.ends[R.n_ends++];
  *e = (struct end){.slot = slot, .ours = ours};
  R.live++;
  return e;
}

static void end_by(struct end *e, enum how how) {
  CHECK(e->how == LIVE);
  e->how = how;
  e->want_reason = how == BY_PEER ? TR_ERR_CLOSED : 0;
  R.live--;
}

/* An end this side closes: its Goodbye goes out unless the carrier is closing. */
static void end_by_us(struct end *e, bool reason) {
  end_by(e, BY_US);
  e->want_goodbye_out = !R.closing;
  e->want_goodbye_reason = reason;
}

static struct end *active(size_t k) { return &R.ends[R.active[k]]; }

static struct end *live_end(uint64_t slot) {
  for (size_t k = 0; k < R.n_active; k++)
    if (active(k)->how == LIVE && active(k)->slot == slot)
      return active(k);
  return NULL;
}

static bool refused(uint64_t slot) { return R.refuse && slot % 3 == 0; }

/* What the carrier must do with one frame of the stream. */
static void model_frame(const uint8_t *payload, size_t len) {
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(payload, len);
  if (f == NULL || f->msg_case == MSG(_NOT_SET)) {
    R.closing = true; /* a protocol error */
    tr_relay_frame_free(f);
    return;
  }
  if (!f->has_slot || f->slot == 0) {
    R.want_carrier_frames++;
    R.want_carrier_hash = mix(R.want_carrier_hash, f->msg_case);
    R.closing |= f->msg_case == MSG(GOODBYE); /* the carrier's end hangs up */
    tr_relay_frame_free(f);
    return;
  }
  struct end *e = live_end(f->slot);
  if (e == NULL) {
    if (!R.accept || f->slot <= R.last_slot) {
      R.dropped++;
    } else if (R.live >= R.max_slots) {
      R.closing = true; /* more slots than this side takes */
    } else {
      e = new_end(f->slot, false);
      R.last_slot = f->slot;
      if (refused(f->slot)) {
        end_by_us(e, true);
        R.dropped++;
        e = NULL;
      }
    }
    if (e == NULL) {
      tr_relay_frame_free(f);
      return;
    }
  }
  e->want_bytes += len;
  e->want_touched = true;
  if (f->msg_case == MSG(GOODBYE)) {
    if (f->goodbye->has_reason && f->goodbye->reason != REASON(UNSPECIFIED)) {
      e->want_frames++;
      e->want_hash = mix(e->want_hash, f->msg_case);
    }
    end_by(e, BY_PEER);
  } else {
    e->want_frames++;
    e->want_hash = mix(e->want_hash, f->msg_case);
  }
  tr_relay_frame_free(f);
}

/* A socket read, as relay_link.c's consume() cuts it into frames. */
static void model_read(const uint8_t *data, size_t len) {
  for (;;) {
    while (!R.closing) {
      const uint8_t *payload;
      size_t n;
      int rc = tr_frame_reader_next(&R.shadow, &payload, &n);
      if (rc < 0)
        R.closing = true;
      if (rc <= 0)
        break;
      model_frame(payload, n);
    }
    if (R.closing || len == 0)
      return;
    int n = tr_frame_reader_push(&R.shadow, data, len);
    if (n < 0) {
      R.closing = true;
      return;
    }
    data += n;
    len -= (size_t)n;
  }
}

/* ---- the carried links' end ---- */

static struct end *end_of(tr_relay_link *l) {
  uintptr_t i = (uintptr_t)tr_relay_link_data(l);
  CHECK(i >= 1 && i <= R.n_ends);
  return &R.ends[i - 1];
}

static void slot_opened(tr_relay_link *l) {
  struct end *e = end_of(l);
  CHECK(e->ours && !e->opened);
  e->opened = true;
  e->link = l;
}

/* The peer's first frame on a new slot: the model made its entry. */
static void slot_accepted(tr_relay_link *l) {
  CHECK(tr_relay_link_data(l) == NULL && tr_relay_link_carried(l));
  while (R.next_accept < R.n_ends && R.ends[R.next_accept].ours)
    R.next_accept++;
  CHECK(R.next_accept < R.n_ends);
  struct end *e = &R.ends[R.next_accept++];
  CHECK(!e->opened);
  tr_relay_link_set_data(l, (void *)(uintptr_t)(e - R.ends + 1));
  e->opened = true;
  e->link = l;
  CHECK(tr_relay_link_bytes_in(l) == 0);
  if (refused(e->slot))
    tr_relay_link_close(l, REASON(OVERLOADED), "refused: slot %llu", (unsigned long long)e->slot);
}

static void slot_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  struct end *e = end_of(l);
  CHECK(!f->has_slot && f->slot == 0); /* as if it had come on a link of its own */
  CHECK(e->closings == 0 && e->closeds == 0); /* never a frame after its end */
  e->frames++;
  e->hash = mix(e->hash, f->msg_case);
  CHECK(e->frames <= e->want_frames);
  if (f->msg_case == MSG(GOODBYE) && !R.keep_on_goodbye)
    tr_relay_link_hang_up(l); /* as link_server.c does */
  tr_relay_frame_free(f);
}

static void slot_read_done(tr_relay_link *l) {
  struct end *e = end_of(l);
  CHECK(e->how == LIVE && e->closings == 0);
  e->read_dones++;
}

static void slot_drain(tr_relay_link *l) {
  struct end *e = end_of(l);
  CHECK(e->closings == 0);
  e->drains++;
  if (e->drain_hangs_up)
    tr_relay_link_hang_up(l);
}

static void slot_closing(tr_relay_link *l) {
  struct end *e = end_of(l);
  CHECK(e->how != LIVE && tr_relay_link_closing(l));
  CHECK(++e->closings == 1);
}

static void slot_closed(tr_relay_link *l, int reason, const char *why) {
  struct end *e = end_of(l);
  CHECK(why != NULL);
  CHECK(e->how != LIVE && e->closings == 1);
  CHECK(++e->closeds == 1);
  CHECK(!R.in_call);
  CHECK(reason == e->want_reason);
  e->link = NULL;
}

static const struct tr_relay_link_events slot_events = {
    .on_open = slot_opened, .on_frame = slot_frame, .on_read_done = slot_read_done,
    .on_drain = slot_drain, .on_closing = slot_closing, .on_closed = slot_closed};
static const struct tr_relay_link_events accept_events = {
    .on_open = slot_accepted, .on_frame = slot_frame, .on_read_done = slot_read_done,
    .on_drain = slot_drain, .on_closing = slot_closing, .on_closed = slot_closed};

/* ---- what went out ---- */

static struct end *any_end(uint64_t slot) {
  for (size_t i = 0; i < R.n_ends; i++)
    if (R.ends[i].slot == slot && (R.ends[i].opened || R.ends[i].how != LIVE))
      return &R.ends[i];
  return NULL;
}

static void on_write(void *arg, const void *data, size_t len) {
  (void)arg;
  const uint8_t *p = data;
  R.out_writes++;
  while (len > 0) {
    CHECK(len >= 4); /* whole frames only */
    uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    CHECK(len - 4 >= n);
    Tracerelay__RelayFrame *f = tr_relay_frame_decode(p + 4, n);
    CHECK(f != NULL && f->msg_case != MSG(_NOT_SET));
    CHECK(R.carrier_goodbyes_out == 0); /* nothing after the carrier's Goodbye */
    R.out_frames++;
    if (f->has_slot && f->slot != 0) {
      struct end *e = any_end(f->slot);
      CHECK(e != NULL);
      CHECK(e->out_goodbyes == 0); /* nothing on a slot after our Goodbye */
      if (f->msg_case == MSG(GOODBYE)) {
        e->out_goodbyes++;
        e->out_reason =
            f->goodbye->has_reason && f->goodbye->reason != REASON(UNSPECIFIED);
      } else {
        CHECK(f->msg_case == MSG(HEARTBEAT));
        CHECK(f->heartbeat->timestamp_ns == ++e->out_heartbeats); /* in the order sent */
      }
    } else {
      CHECK(f->msg_case == MSG(GOODBYE)); /* the harness sends nothing else of the carrier's */
      R.carrier_goodbyes_out++;
    }
    tr_relay_frame_free(f);
    p += 4 + n;
    len -= 4 + n;
  }
}

/* Everything a send accepted, and every Goodbye due, has gone out; the counts add up. */
static void check_output(void) {
  uint64_t frames = 0;
  for (size_t i = 0; i < R.n_ends; i++) {
    const struct end *e = &R.ends[i];
    CHECK(e->out_heartbeats == e->sent);
    CHECK(e->out_goodbyes == (e->want_goodbye_out ? 1 : 0));
    CHECK(!e->out_goodbyes || e->out_reason == e->want_goodbye_reason);
    frames += e->sent + (uint64_t)e->out_goodbyes;
  }
  CHECK(R.out_frames == frames + R.carrier_goodbyes_out);
  if (R.carrier != NULL) {
    struct tr_relay_carrier_stats st;
    tr_relay_link_carrier_stats(R.carrier, &st);
    CHECK(st.frames_out == frames);
    CHECK(st.writes + R.carrier_goodbyes_out == R.out_writes);
  }
}

/* ---- the carrier's end ---- */

static void carrier_open(tr_relay_link *l) {
  R.carrier = l;
  CHECK(tr_relay_link_carry(l, R.accept ? &accept_events : NULL, NULL, R.max_slots) == 0);
}

static void carrier_frame(tr_relay_link *l, Tracerelay__RelayFrame *f) {
  CHECK(!f->has_slot || f->slot == 0);
  R.carrier_frames++;
  R.carrier_hash = mix(R.carrier_hash, f->msg_case);
  CHECK(R.carrier_frames <= R.want_carrier_frames);
  if (f->msg_case == MSG(GOODBYE))
    tr_relay_link_hang_up(l);
  tr_relay_frame_free(f);
}

static void carrier_read_done(tr_relay_link *l) {
  (void)l;
  R.carrier_read_dones++;
}

static void carrier_drain(tr_relay_link *l) {
  (void)l;
  R.carrier_drains++;
}

static void carrier_closing(tr_relay_link *l) {
  CHECK(tr_relay_link_closing(l));
  CHECK(++R.carrier_closings == 1);
}

static void carrier_closed(tr_relay_link *l, int reason, const char *why) {
  (void)reason;
  CHECK(why != NULL);
  CHECK(++R.carrier_closeds == 1 && R.carrier_closings == 1);
  for (size_t i = 0; i < R.n_ends; i++) /* every carried link ended first */
    CHECK(R.ends[i].closeds == 1);
  struct tr_relay_carrier_stats st;
  tr_relay_link_carrier_stats(l, &st);
  CHECK(st.carried == 0 && st.dropped_frames == R.dropped);
  if (!R.peer_ended)
    check_output();
  R.carrier = NULL;
}

static const struct tr_relay_link_events carrier_events = {
    .on_open = carrier_open, .on_frame = carrier_frame, .on_read_done = carrier_read_done,
    .on_drain = carrier_drain, .on_closing = carrier_closing, .on_closed = carrier_closed};

/* ---- ops ---- */

/* The model and the link agree. */
static void check_state(void) {
  size_t kept = 0;
  for (size_t k = 0; k < R.n_active; k++) {
    const struct end *e = active(k);
    if (e->closeds == 0) /* a closed one changes no more */
      R.active[kept++] = R.active[k];
    CHECK(e->opened);
    CHECK(e->frames == e->want_frames && e->hash == e->want_hash);
    CHECK((e->how == LIVE) == (e->closings == 0));
    CHECK(e->drains == e->want_drains);
    if (e->link != NULL)
      CHECK(tr_relay_link_bytes_in(e->link) == e->want_bytes);
  }
  R.n_active = kept;
  CHECK(R.carrier_frames == R.want_carrier_frames && R.carrier_hash == R.want_carrier_hash);
  if (R.carrier != NULL) {
    struct tr_relay_carrier_stats st;
    tr_relay_link_carrier_stats(R.carrier, &st);
    CHECK(st.carried == R.live);
    CHECK(st.dropped_frames == R.dropped);
    CHECK(tr_relay_link_closing(R.carrier) == R.closing);
  }
}

static void op_read(const uint8_t *data, size_t len) {
  if (len == 0)
    return;
  model_read(data, len);
  R.carrier_read_dones = 0;
  R.in_call = true;
  fake_tls_uv_read(R.conn, data, len);
  R.in_call = false;
  for (size_t k = 0; k < R.n_active; k++) {
    struct end *e = active(k);
    CHECK(e->read_dones == (e->want_touched && e->how == LIVE ? 1u : 0u));
    e->read_dones = 0;
    e->want_touched = false;
  }
  CHECK(R.carrier_read_dones == (R.closing ? 0u : 1u));
}

static void op_open(void) {
  int want = R.closing                    ? TR_ERR_CLOSED
             : R.live >= R.max_slots      ? TR_ERR_FULL
             : R.last_slot == UINT64_MAX ? TR_ERR_FULL /* no slot left to number it */
                                          : 0;
  new_end(R.last_slot + 1, true);
  tr_relay_link *l = NULL;
  R.in_call = true;
  int rc = tr_relay_link_open_slot(R.carrier, &slot_events, (void *)(uintptr_t)R.n_ends, &l);
  R.in_call = false;
  CHECK(rc == want);
  struct end *e = &R.ends[R.n_ends - 1];
  if (rc == 0) {
    CHECK(e->opened && e->link == l);
    R.last_slot = e->slot;
  } else {
    CHECK(!e->opened);
    R.n_ends--;
    R.n_active--;
    R.live--;
  }
}

/* The arg-th of the carried links not yet closed, or NULL. */
static struct end *pick(uint8_t arg) {
  size_t open = 0;
  for (size_t k = 0; k < R.n_active; k++)
    open += active(k)->link != NULL;
  if (open == 0)
    return NULL;
  size_t n = arg % open;
  for (size_t k = 0; k < R.n_active; k++)
    if (active(k)->link != NULL && n-- == 0)
      return active(k);
  return NULL;
}

enum close_kind { SILENT, WITH_REASON, HANG_UP };

static void op_close(enum close_kind kind, uint8_t arg) {
  struct end *e = pick(arg);
  if (e == NULL)
    return;
  if (e->how == LIVE) /* else it is closing already: the call does nothing */
    end_by_us(e, kind == WITH_REASON);
  R.in_call = true;
  if (kind == HANG_UP)
    tr_relay_link_hang_up(e->link);
  else
    tr_relay_link_close(e->link, kind == WITH_REASON ? REASON(NOT_AUTHORIZED) : REASON(UNSPECIFIED),
                        "closed by the fuzzer");
  R.in_call = false;
}

static void op_send(uint8_t arg) {
  struct end *e = pick(arg);
  if (e == NULL)
    return;
  Tracerelay__Heartbeat hb;
  Tracerelay__RelayFrame f;
  tr_relay_frame_heartbeat(&f, &hb, e->sent + 1);
  R.in_call = true;
  int rc = tr_relay_link_send(e->link, &f);
  R.in_call = false;
  CHECK(rc == (e->how != LIVE || R.closing ? TR_ERR_CLOSED : 0));
  e->sent += rc == 0;
}

/* One turn: ended links hear on_closed, what was gathered goes out. */
static void op_loop(void) {
  uv_run(&loop, UV_RUN_NOWAIT);
  for (size_t k = 0; k < R.n_active; k++)
    CHECK(active(k)->how == LIVE || active(k)->closeds == 1);
  check_output();
}

static void op_drain(uint8_t arg) {
  bool live_carrier = !R.closing;
  for (size_t k = 0; k < R.n_active; k++) {
    struct end *e = active(k);
    e->drain_hangs_up = false;
    if (!live_carrier || e->how != LIVE)
      continue;
    e->want_drains++;
    if ((arg & 0x80) && k % 3 == (size_t)(arg & 0x7f) % 3) {
      e->drain_hangs_up = true;
      end_by_us(e, false);
    }
  }
  uint64_t before = R.carrier_drains;
  R.in_call = true;
  fake_tls_uv_drain(R.conn);
  R.in_call = false;
  CHECK(R.carrier_drains == before + (live_carrier ? 1 : 0));
}

/* The transport ends (after tr_tls_uv_close, reason 0): every open link ends first. */
static void end_transport(int reason, const char *why) {
  R.closing = true;
  for (size_t k = 0; k < R.n_active; k++)
    if (active(k)->how == LIVE) {
      end_by(active(k), BY_CARRIER);
      active(k)->want_reason = reason != 0 ? reason : TR_ERR_CLOSED;
    }
  R.peer_ended = reason != 0;
  fake_tls_uv_end(R.conn, reason, why);
  R.conn = NULL;
  CHECK(R.carrier == NULL && R.carrier_closeds == 1);
}

static void close_carrier(Tracerelay__Goodbye__Reason reason) {
  if (!fake_tls_uv_closing(R.conn)) {
    R.closing = true;
    tr_relay_link_close(R.carrier, reason, "closed by the fuzzer");
  }
  CHECK(fake_tls_uv_closing(R.conn));
  end_transport(0, "closed by this side");
}

/* ---- the target ---- */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  tr_log_set_level(TR_LOG_OFF); /* protocol errors and closes log a line each */
  if (uv_loop_init(&loop) != 0)
    abort();
  fake_tls_uv_set_write_hook(on_write, NULL);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  memset(&R, 0, sizeof R);
  R.accept = data[0] & 1;
  static const unsigned max_slots[8] = {1, 2, 3, 4, 8, 17, 33, 256};
  R.max_slots = max_slots[(data[0] >> 1) & 7];
  R.refuse = data[0] & 0x10;
  R.keep_on_goodbye = data[0] & 0x20;
  data++;
  size--;
  CHECK(tr_relay_reader_init(&R.shadow, 0) == 0); /* as tr_relay_link_alloc's */

  struct sockaddr_in addr;
  uv_ip4_addr("192.0.2.1", 7393, &addr);
  struct tr_relay_link_opts opts = {.peer_role = "regional", .label = "the fuzzed carrier"};
  tr_relay_link *l;
  CHECK(tr_relay_link_connect(&loop, NULL, "relay.test", (const struct sockaddr *)&addr, &opts,
                              &carrier_events, NULL, &l) == 0);
  R.conn = tr_relay_link_conn(l);
  fake_tls_uv_open(R.conn);
  CHECK(R.carrier == l);

  while (size > 0 && R.carrier != NULL) {
    uint8_t op = *data++;
    size--;
    if (op < OP_OPEN || op == OP_LONG_READ) {
      size_t n = (size_t)op + 1;
      if (op == OP_LONG_READ) {
        size_t skip = size < 2 ? size : 2;
        n = skip == 2 ? (size_t)data[0] | (size_t)data[1] << 8 : 0;
        data += skip;
        size -= skip;
      }
      n = n < size ? n : size;
      op_read(data, n);
      data += n;
      size -= n;
      check_state();
      continue;
    }
    uint8_t arg = 0;
    if (op != OP_OPEN && op < OP_SHUTDOWN && op != OP_TURN && size > 0) {
      arg = *data++;
      size--;
    }
    switch (op) {
    case OP_OPEN: op_open(); break;
    case OP_CLOSE: op_close(SILENT, arg); break;
    case OP_CLOSE_REASON: op_close(WITH_REASON, arg); break;
    case OP_HANG_UP: op_close(HANG_UP, arg); break;
    case OP_SEND: op_send(arg); break;
    case OP_TURN: op_loop(); break;
    case OP_DRAIN: op_drain(arg); break;
    case OP_SHUTDOWN: close_carrier(REASON(SHUTDOWN)); break;
    case OP_PEER_GONE: end_transport(TR_ERR_CLOSED, "the peer closed the connection"); break;
    default: break; /* 0xfa-0xff: nothing */
    }
    check_state();
  }
  if (R.carrier != NULL)
    close_carrier(REASON(UNSPECIFIED));
  /* The carrier's two handles close in the loop's next turns; then nothing is left. */
  for (int i = 0; i < 8 && uv_loop_alive(&loop); i++)
    uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(!uv_loop_alive(&loop));
  for (size_t i = 0; i < R.n_ends; i++)
    CHECK(R.ends[i].closeds == 1 && R.ends[i].link == NULL);
  tr_frame_reader_free(&R.shadow);
  free(R.ends);
  free(R.active);
  return 0;
}
