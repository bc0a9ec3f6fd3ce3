/* guests.h: the guest machines behind an agent's relay endpoint: every machine whose Perfetto
 * traced_relay (reference 7) connects to the agent over TCP or vsock, as a VM guest's relay
 * connects to its host's traced. Pure: no sockets, no libuv; the producer port feeds it what
 * each connection claims (SetPeerIdentity, InitRelay, SyncClock) and relays what it derives.
 *
 * Identity. A guest is keyed by what its relay claims, the caller's choice of bytes (the
 * producer port takes machine_id_hint, its boot id, or the peer's address for a connection
 * that claimed none, plus machine_name): every remote connection belongs to some guest, never
 * to the agent's own host. Its name is the claimed machine_name reduced to
 * the machine-name alphabet ([A-Za-z0-9._-], at most TR_GUEST_NAME_MAX bytes), or "guest-"
 * and the start of its key without one, made unique among the agent's guests with a "-2",
 * "-3"... suffix. Everything a guest claims is untrusted: the name only ever names the guest
 * under its agent (the service calls it "<agent>/<name>", a name no certificate can carry),
 * and its pid/uid claims are scoped to it.
 *
 * Clocks. traced_relay sends SyncClock PING (its clocks at c1), waits for the reply, then
 * UPDATE (its clocks at c2). The agent reads its own BOOTTIME h1 when the PING arrives (before
 * replying) and h2 when the UPDATE arrives; the guest sent the UPDATE after it had the reply,
 * so c2 happened after h1 and before h2 on the agent's clock: {t1 = h1, t2 = t3 = c2, t4 = h2}
 * is a valid four-timestamp exchange, the guest's clock bounded by the agent's.
 *
 * Guarantees: at most TR_GUESTS_MAX guests (attach refuses more), names and keys bounded,
 * SystemInfo kept as the bytes the guest sent (at most TR_GUEST_SYSINFO_MAX). Costs: O(guests)
 * per lookup, a handful of guests per agent. */
#ifndef TR_GUESTS_H
#define TR_GUESTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TR_GUESTS_MAX 64
#define TR_GUEST_NAME_MAX 32
#define TR_GUEST_KEY_MAX 128
#define TR_GUEST_SYSINFO_MAX 4096
#define TR_GUEST_CLOCKS_MAX 16 /* clocks kept of one SyncClock (traced_relay sends 7) */

/* SyncClock phases (relay_port.proto). */
enum tr_guest_phase { TR_GUEST_PING = 1, TR_GUEST_UPDATE = 2 };

struct tr_guest_clock {
  uint32_t clock_id; /* a BuiltinClock */
  uint64_t timestamp;
};

/* One completed exchange: t1, t4 on the agent's BOOTTIME, t2 = t3 on the guest's, and the
 * guest's clocks of its UPDATE (BOOTTIME among them) for its own clock snapshot. */
struct tr_guest_exchange {
  uint64_t t1, t2, t3, t4;
  struct tr_guest_clock clocks[TR_GUEST_CLOCKS_MAX];
  size_t num_clocks;
};

typedef struct tr_guest {
  uint32_t id; /* agent-local, 1, 2, ... never reused */
  char key[TR_GUEST_KEY_MAX + 1];
  char name[TR_GUEST_NAME_MAX + 8]; /* room for the uniqueness suffix */
  uint8_t *system_info;             /* serialised SystemInfo from InitRelay, or NULL */
  size_t system_info_len;
  unsigned conns; /* connections attached to it */
  bool ping_seen; /* a PING arrived at ping_host_ns and no UPDATE yet */
  uint64_t ping_host_ns;
} tr_guest;

typedef struct tr_guests {
  tr_guest *v;
  size_t n, cap;
  uint32_t next_id;
} tr_guests;

void tr_guests_init(tr_guests *gs);
void tr_guests_free(tr_guests *gs);

/* Attaches one connection to the guest keyed by `key` (cut to TR_GUEST_KEY_MAX), created if new with a name derived
 * from `claimed_name` (may be NULL). *id is its id, *created whether it is new. TR_ERR_INVAL
 * (empty key), TR_ERR_FULL (TR_GUESTS_MAX guests), TR_ERR_NOMEM. */
int tr_guests_attach(tr_guests *gs, const char *key, const char *claimed_name, uint32_t *id,
                     bool *created);
/* Detaches a connection; returns true when that was the guest's last one and it is gone. */
bool tr_guests_detach(tr_guests *gs, uint32_t id);
/* The guest of that id, or NULL. Valid until the next attach or detach. */
const tr_guest *tr_guests_find(const tr_guests *gs, uint32_t id);

/* InitRelay: keeps a copy of the guest's serialised SystemInfo (replacing an earlier one).
 * TR_ERR_NOT_FOUND, TR_ERR_TOO_BIG (over TR_GUEST_SYSINFO_MAX), TR_ERR_NOMEM. */
int tr_guests_set_system_info(tr_guests *gs, uint32_t id, const uint8_t *data, size_t len);

/* SyncClock of `phase` carrying the guest's clocks, arrived at agent BOOTTIME now_ns. Returns 1
 * with *out filled when it completes an exchange (an UPDATE after a PING), 0 when it does
 * not (a PING, or an UPDATE with no PING before it), TR_ERR_INVAL when the clocks have no
 * BOOTTIME, repeat a clock, or give a time at or above 2^62, TR_ERR_NOT_FOUND. */
int tr_guests_sync_clock(tr_guests *gs, uint32_t id, enum tr_guest_phase phase,
                         const struct tr_guest_clock *clocks, size_t num_clocks, uint64_t now_ns,
                         struct tr_guest_exchange *out);

#endif
