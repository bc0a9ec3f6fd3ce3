/* fuzz_guests.c: libFuzzer target for what a guest machine's traced_relay controls at the
 * agent's relay endpoint (relay/producer/guests.h and relay_port.c's decoding): RelayPort
 * requests decoded as the port decodes them (InitRelayRequest, SyncClockRequest), and a run
 * of attach / detach / SystemInfo / SyncClock operations on the guest table driven by the
 * input. Checks that names stay in the machine-name alphabet and unique, the table bounded,
 * and every exchange ordered (t1 <= t4, t2 == t3); ASan/UBSan catch the rest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/relay_port.pb-c.h"
#include "relay/base/pb_valid.h"
#include "relay/producer/guests.h"

static void decode_requests(const uint8_t *data, size_t size) {
  Perfetto__Protos__InitRelayRequest *init =
      perfetto__protos__init_relay_request__unpack(NULL, size, data);
  if (init && tr_pb_tags_valid(&init->base) && init->system_info) {
    size_t n = protobuf_c_message_get_packed_size(&init->system_info->base);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf)
      protobuf_c_message_pack(&init->system_info->base, buf);
    free(buf);
  }
  if (init)
    perfetto__protos__init_relay_request__free_unpacked(init, NULL);
  Perfetto__Protos__SyncClockRequest *sync =
      perfetto__protos__sync_clock_request__unpack(NULL, size, data);
  if (sync)
    perfetto__protos__sync_clock_request__free_unpacked(sync, NULL);
}

static void check_table(const tr_guests *gs) {
  if (gs->n > TR_GUESTS_MAX)
    abort();
  for (size_t i = 0; i < gs->n; i++) {
    const char *name = gs->v[i].name;
    if (!name[0] || strlen(name) > TR_GUEST_NAME_MAX + 7)
      abort();
    for (const char *c = name; *c; c++)
      if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
            *c == '.' || *c == '_' || *c == '-'))
        abort();
    for (size_t j = 0; j < i; j++)
      if (strcmp(gs->v[j].name, name) == 0)
        abort();
  }
}

/* Reads n bytes of input (fewer at its end). */
static size_t take(const uint8_t **data, size_t *size, size_t n) {
  if (n > *size)
    n = *size;
  *data += n;
  *size -= n;
  return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  decode_requests(data, size);
  tr_guests gs;
  tr_guests_init(&gs);
  uint32_t ids[8] = {0};
  while (size >= 2) {
    uint8_t op = data[0], arg = data[1];
    take(&data, &size, 2);
    uint32_t id = ids[arg % 8] ? ids[arg % 8] : arg;
    switch (op % 4) {
    case 0: { /* attach: key and claimed name from the input */
      char key[48] = {0}, name[48] = {0};
      const uint8_t *k = data;
      size_t kn = take(&data, &size, arg % 40);
      memcpy(key, k, kn);
      const uint8_t *c = data;
      size_t cn = take(&data, &size, (arg >> 3) % 40);
      memcpy(name, c, cn);
      uint32_t out;
      bool created;
      if (tr_guests_attach(&gs, key, name, &out, &created) == 0)
        ids[arg % 8] = out;
      break;
    }
    case 1:
      tr_guests_detach(&gs, id);
      break;
    case 2: {
      const uint8_t *p = data;
      size_t n = take(&data, &size, (size_t)arg * 32);
      tr_guests_set_system_info(&gs, id, p, n);
      break;
    }
    case 3: {
      struct tr_guest_clock clocks[TR_GUEST_CLOCKS_MAX + 1];
      size_t n = arg % (TR_GUEST_CLOCKS_MAX + 2);
      for (size_t i = 0; i < n; i++) {
        uint64_t ts = 0;
        const uint8_t *p = data;
        size_t got = take(&data, &size, 9);
        memcpy(&ts, p, got > 8 ? 8 : got);
        clocks[i] = (struct tr_guest_clock){got > 8 ? p[8] % 12 : 6, ts};
      }
      uint64_t now = 0;
      const uint8_t *p = data;
      memcpy(&now, p, take(&data, &size, 8));
      struct tr_guest_exchange x;
      if (tr_guests_sync_clock(&gs, id, (enum tr_guest_phase)(op >> 2), clocks, n, now, &x) == 1 &&
          (x.t1 > x.t4 || x.t2 != x.t3 || x.num_clocks > TR_GUEST_CLOCKS_MAX))
        abort();
      break;
    }
    }
    check_table(&gs);
  }
  tr_guests_free(&gs);
  return 0;
}
