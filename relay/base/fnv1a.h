/* fnv1a.h: FNV-1a 64-bit hashing, and the two identifiers tracerelay derives from it:
 * a machine_id for a machine name (as traced derives it) and a globally-scoped clock id. */
#ifndef TR_FNV1A_H
#define TR_FNV1A_H

#include <stddef.h>
#include <stdint.h>

uint64_t tr_fnv1a64(const void *data, size_t len);
/* Low 32 bits of FNV-1a-64 of the name; 0 becomes 1 because 0 means "the host". */
uint32_t tr_machine_id(const char *machine_name);
/* (uint32)FNV-1a-64("<machine>/<clock_name>") | 0x80000000: always in the global range. */
uint32_t tr_global_clock_id(const char *machine_name, const char *clock_name);

#endif
