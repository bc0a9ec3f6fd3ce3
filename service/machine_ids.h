/* machine_ids.h: the ids a trace derives from a host's name, kept unique across the host table.
 *
 * A trace tells hosts apart by ids hashed from their names (relay/base/fnv1a.h): the
 * `machines` encoding by machine_id (32 bits of FNV-1a), `global-clocks` by the global ids of
 * each host's clocks (31 bits). Two names can hash alike (about 1 % odds among 10,000 hosts
 * for machine_id, far more for the clock ids; and a regional allowed a pattern can search
 * for a name that does): their data would merge in the trace. So each host gets a trace name
 * its ids derive from: its own name when they are all free, else "NAME#K" for the smallest
 * K >= 1 whose machine_id and six builtin global clock ids no other host holds. '#' is in no
 * certificate name, so a trace name is never another host's name. Decided when a host is
 * added, so by the order hosts arrive, and kept while the host is in the table (docs/timeline.md,
 * Machine ids). Memory: one 16-byte slot per id, in tables at most half full. */
#ifndef TR_SERVICE_MACHINE_IDS_H
#define TR_SERVICE_MACHINE_IDS_H

#include <stddef.h>
#include <stdint.h>

/* A trace name: a machine name (105 bytes at most: a guest's "HOST/NAME", host.h's
 * TR_HOST_NAME_MAX), '#' and up to 10 digits. */
#define TR_MACHINE_IDS_NAME_MAX 116

struct tr_machine_id_slot {
  uint32_t id;       /* 0: empty (no id made from a name is 0) */
  const char *owner; /* the trace name that holds it */
};

struct tr_machine_id_set {
  struct tr_machine_id_slot *slots;
  size_t cap, n; /* cap: a power of two, or 0 */
};

typedef struct tr_machine_ids {
  struct tr_machine_id_set machines; /* machine_id */
  struct tr_machine_id_set clocks;   /* global clock ids of the six builtin clocks */
} tr_machine_ids;

/* Gives name its ids: writes its trace name into trace_name (TR_MACHINE_IDS_NAME_MAX + 1
 * bytes, which must stay where they are while the ids are held: the tables point at it) and
 * its machine_id; *collided_with (may be NULL) is set to the trace name of a host that holds
 * one of the plain name's ids, or NULL. 0, TR_ERR_INVAL (name too long), TR_ERR_NOMEM, or
 * TR_ERR_FULL (no free K found, which takes billions of hosts). */
int tr_machine_ids_claim(tr_machine_ids *ids, const char *name, char *trace_name,
                         uint32_t *machine_id, const char **collided_with);
/* Frees the ids of a trace name claim gave (a host that leaves the table). */
void tr_machine_ids_release(tr_machine_ids *ids, const char *trace_name);
void tr_machine_ids_free(tr_machine_ids *ids);

#endif
