/* test_pb_valid.c: regression test for the first crash of the fuzz campaign (fuzz_ipc_frame,
 * input fuzz/corpus/ipc_frame/crash-overlong-tag-field0): protobuf-c 1.4 accepts field number
 * 0 behind an over-long tag varint, keeps it as an unknown field, and re-encodes it as a short
 * tag it then refuses itself. Our decoders of outside input (IPC frames, producer requests,
 * relay frames) must refuse such messages (relay/base/pb_valid.h), and still keep honest unknown
 * fields. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "perfetto/common/data_source_descriptor.pb-c.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/pb_valid.h"
#include "relay/link/relay_frame.h"

/* The payload the fuzzer found: request_id 3, msg_invoke_method_reply { field 0 (tag 0x81
 * 0x00, fixed64) }. */
static const uint8_t crash_frame[] = {0x10, 0x03, 0x32, 0x0a, 0x81, 0x00, 0x00, 0x00,
                                      0x00, 0x00, 0x02, 0x41, 0x08, 0x04};

/* DataSourceDescriptor { name: "abc", field 0 over-long }, and the same with field 15. */
static const uint8_t desc_field0[] = {0x0a, 0x03, 'a', 'b', 'c', 0x80, 0x00, 0x07};
static const uint8_t desc_field15[] = {0x0a, 0x03, 'a', 'b', 'c', 0x78, 0x07};

static void crash_frame_is_refused(void **state) {
  (void)state;
  assert_null(tr_ipc_frame_decode(crash_frame, sizeof crash_frame));
  /* What protobuf-c alone does with it: accepts, then cannot read its own encoding. */
  Perfetto__Protos__IPCFrame *f =
      perfetto__protos__ipcframe__unpack(NULL, sizeof crash_frame, crash_frame);
  assert_non_null(f);
  assert_false(tr_pb_tags_valid(&f->base));
  uint8_t out[64];
  size_t n = perfetto__protos__ipcframe__pack(f, out);
  assert_null(perfetto__protos__ipcframe__unpack(NULL, n, out));
  perfetto__protos__ipcframe__free_unpacked(f, NULL);
}

static void honest_unknown_fields_are_kept(void **state) {
  (void)state;
  Perfetto__Protos__DataSourceDescriptor *d =
      perfetto__protos__data_source_descriptor__unpack(NULL, sizeof desc_field15, desc_field15);
  assert_non_null(d);
  assert_true(tr_pb_tags_valid(&d->base));
  assert_int_equal(d->base.n_unknown_fields, 1);
  perfetto__protos__data_source_descriptor__free_unpacked(d, NULL);

  d = perfetto__protos__data_source_descriptor__unpack(NULL, sizeof desc_field0, desc_field0);
  assert_non_null(d);
  assert_false(tr_pb_tags_valid(&d->base));
  perfetto__protos__data_source_descriptor__free_unpacked(d, NULL);
  assert_true(tr_pb_tags_valid(NULL));
}

/* RelayFrame { producer_update { producer_id 1, state CONNECTED, data_sources [desc] } }. */
static size_t producer_update(const uint8_t *desc, size_t desc_len, uint8_t *out) {
  size_t n = 0;
  out[n++] = 0x52; /* RelayFrame.producer_update (10) */
  out[n++] = (uint8_t)(6 + desc_len);
  out[n++] = 0x08, out[n++] = 0x01; /* producer_id */
  out[n++] = 0x10, out[n++] = 0x01; /* state */
  out[n++] = 0x52; /* ProducerUpdate.data_sources (10): a repeated sub-message */
  out[n++] = (uint8_t)desc_len;
  memcpy(out + n, desc, desc_len);
  return n + desc_len;
}

static void relay_frames_are_checked_deep(void **state) {
  (void)state;
  uint8_t buf[64];
  size_t n = producer_update(desc_field15, sizeof desc_field15, buf);
  Tracerelay__RelayFrame *f = tr_relay_frame_decode(buf, n);
  assert_non_null(f);
  assert_int_equal(f->msg_case, TRACERELAY__RELAY_FRAME__MSG_PRODUCER_UPDATE);
  tr_relay_frame_free(f);
  n = producer_update(desc_field0, sizeof desc_field0, buf);
  assert_null(tr_relay_frame_decode(buf, n));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(crash_frame_is_refused),
      cmocka_unit_test(honest_unknown_fields_are_kept),
      cmocka_unit_test(relay_frames_are_checked_deep),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
