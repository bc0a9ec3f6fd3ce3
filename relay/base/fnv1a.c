/* fnv1a.c: FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3). */
#include "relay/base/fnv1a.h"

#include <string.h>

static uint64_t fnv1a64_update(uint64_t h, const void *data, size_t len) {
  const unsigned char *p = data;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t tr_fnv1a64(const void *data, size_t len) {
  return fnv1a64_update(0xcbf29ce484222325ull, data, len);
}

uint32_t tr_machine_id(const char *machine_name) {
  uint32_t id = (uint32_t)tr_fnv1a64(machine_name, strlen(machine_name));
  return id ? id : 1;
}

uint32_t tr_global_clock_id(const char *machine_name, const char *clock_name) {
  uint64_t h = fnv1a64_update(0xcbf29ce484222325ull, machine_name, strlen(machine_name));
  h = fnv1a64_update(h, "/", 1);
  h = fnv1a64_update(h, clock_name, strlen(clock_name));
  return (uint32_t)h | 0x80000000u;
}
