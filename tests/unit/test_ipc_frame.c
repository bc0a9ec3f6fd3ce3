/* test_ipc_frame.c: the bounded IPC frame reader and the IPCFrame codec (relay/producer/ipc_frame.h),
 * on hand-made frames and on every frame of the recorded Perfetto v58.2 traffic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"

/* BindService("ProducerPort"), request_id 1: the reference's example (section 1.1). */
static const uint8_t bind_producer[] = {0x12, 0x00, 0x00, 0x00, 0x10, 0x01, 0x1a, 0x0e,
                                        0x0a, 0x0c, 'P',  'r',  'o',  'd',  'u',  'c',
                                        'e',  'r',  'P',  'o',  'r',  't'};

static uint8_t *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)size + 1);
  assert_non_null(buf);
  assert_int_equal(fread(buf, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *len = (size_t)size;
  return buf;
}

static void put_le32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static void test_byte_by_byte(void **state) {
  (void)state;
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  const uint8_t *payload;
  size_t len;
  for (size_t i = 0; i < sizeof bind_producer; i++) {
    assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 0);
    assert_int_equal(tr_frame_reader_push(&r, &bind_producer[i], 1), 1);
  }
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
  assert_int_equal(len, 18);
  Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(payload, len);
  assert_non_null(f);
  assert_int_equal(f->request_id, 1);
  assert_int_equal(f->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE);
  assert_string_equal(f->msg_bind_service->service_name, "ProducerPort");
  tr_ipc_frame_free(f);
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 0);
  tr_frame_reader_free(&r);
}

/* Three frames and two zero-length frames in one push come out as three frames. */
static void test_several_frames_and_zero_length(void **state) {
  (void)state;
  uint8_t buf[3 * sizeof bind_producer + 8] = {0};
  size_t off = 0;
  memcpy(buf + off, bind_producer, sizeof bind_producer);
  off += sizeof bind_producer + 4; /* a zero-length frame */
  memcpy(buf + off, bind_producer, sizeof bind_producer);
  off += sizeof bind_producer + 4;
  memcpy(buf + off, bind_producer, sizeof bind_producer);
  off += sizeof bind_producer;
  assert_int_equal(off, sizeof buf);

  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  assert_int_equal(tr_frame_reader_push(&r, buf, sizeof buf), (int)sizeof buf);
  const uint8_t *payload;
  size_t len;
  for (int i = 0; i < 3; i++) {
    assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
    assert_int_equal(len, 18);
    assert_memory_equal(payload, bind_producer + 4, 18);
  }
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 0);
  tr_frame_reader_free(&r);
}

static void test_oversize_declared_length(void **state) {
  (void)state;
  uint8_t hdr[4];
  put_le32(hdr, TR_IPC_MAX_PAYLOAD + 1);
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  assert_int_equal(tr_frame_reader_push(&r, hdr, 3), 3);
  const uint8_t *payload;
  size_t len;
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 0);
  assert_int_equal(tr_frame_reader_push(&r, hdr + 3, 1), 1);
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), TR_ERR_TOO_BIG);
  uint8_t *dst;
  size_t room;
  assert_int_equal(tr_frame_reader_space(&r, &dst, &room), TR_ERR_TOO_BIG);
  assert_int_equal(tr_frame_reader_push(&r, hdr, 1), TR_ERR_TOO_BIG);
  tr_frame_reader_free(&r);

  put_le32(hdr, UINT32_MAX);
  tr_ipc_reader_init(&r);
  assert_int_equal(tr_frame_reader_push(&r, hdr, 4), 4);
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), TR_ERR_TOO_BIG);
  tr_frame_reader_free(&r);
}

/* A frame of exactly 131072 bytes, header included, is accepted, and the reader never
 * grows past it; the encoder stops at the same limit. */
static void test_exact_limit(void **state) {
  (void)state;
  uint8_t *frame = calloc(1, TR_IPC_MAX_FRAME + 8);
  assert_non_null(frame);
  put_le32(frame, TR_IPC_MAX_PAYLOAD);
  put_le32(frame + TR_IPC_MAX_FRAME, 4); /* the next frame's header */
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  size_t off = 0;
  const uint8_t *payload;
  size_t len;
  while (off < TR_IPC_MAX_FRAME + 8) {
    int n = tr_frame_reader_push(&r, frame + off, TR_IPC_MAX_FRAME + 8 - off);
    assert_true(n >= 0);
    assert_true(r.cap <= TR_IPC_MAX_FRAME);
    if (n == 0) {
      assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
      assert_int_equal(len, TR_IPC_MAX_PAYLOAD);
    }
    off += (size_t)n;
  }
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
  assert_int_equal(len, 4);
  tr_frame_reader_free(&r);

  /* data_for_testing of 131064 bytes: tag 1 + 3-byte varint + data = 131068. */
  ProtobufCBinaryData blob = {.len = TR_IPC_MAX_PAYLOAD - 4, .data = frame};
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.n_data_for_testing = 1;
  f.data_for_testing = &blob;
  uint8_t *out;
  size_t out_len;
  assert_int_equal(tr_ipc_frame_encode(&f, &out, &out_len), 0);
  assert_int_equal(out_len, TR_IPC_MAX_FRAME);
  free(out);
  blob.len++;
  assert_int_equal(tr_ipc_frame_encode(&f, &out, &out_len), TR_ERR_TOO_BIG);
  free(frame);
}

static void test_round_trip(void **state) {
  (void)state;
  uint8_t args[300];
  for (size_t i = 0; i < sizeof args; i++)
    args[i] = (uint8_t)i;
  Perfetto__Protos__IPCFrame__InvokeMethod im = PERFETTO__PROTOS__IPCFRAME__INVOKE_METHOD__INIT;
  im.has_service_id = im.has_method_id = im.has_args_proto = im.has_drop_reply = true;
  im.service_id = 1;
  im.method_id = 4;
  im.args_proto = (ProtobufCBinaryData){.len = sizeof args, .data = args};
  im.drop_reply = true;
  Perfetto__Protos__IPCFrame f = PERFETTO__PROTOS__IPCFRAME__INIT;
  f.has_request_id = true;
  f.request_id = 1ull << 40;
  f.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD;
  f.msg_invoke_method = &im;
  uint8_t *out;
  size_t out_len;
  assert_int_equal(tr_ipc_frame_encode(&f, &out, &out_len), 0);
  /* protozero layout: tag 0x2a, then a 4-byte padded length for a message >= 128 bytes. */
  size_t msg_len = protobuf_c_message_get_packed_size(&im.base);
  assert_int_equal(out_len, 4 + 1 + 6 + 1 + 4 + msg_len);
  assert_int_equal(out[4 + 7], 0x2a);
  assert_int_equal(out[4 + 11] & 0x80, 0);

  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  assert_int_equal(tr_frame_reader_push(&r, out, out_len), (int)out_len);
  const uint8_t *payload;
  size_t len;
  assert_int_equal(tr_frame_reader_next(&r, &payload, &len), 1);
  Perfetto__Protos__IPCFrame *d = tr_ipc_frame_decode(payload, len);
  assert_non_null(d);
  assert_int_equal(d->request_id, 1ull << 40);
  assert_int_equal(d->msg_case, PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD);
  assert_int_equal(d->msg_invoke_method->method_id, 4);
  assert_true(d->msg_invoke_method->drop_reply);
  assert_int_equal(d->msg_invoke_method->args_proto.len, sizeof args);
  assert_memory_equal(d->msg_invoke_method->args_proto.data, args, sizeof args);
  tr_ipc_frame_free(d);
  tr_frame_reader_free(&r);
  free(out);

  /* A small message keeps a one-byte length, as traced writes it. */
  Perfetto__Protos__IPCFrame__BindService bs = PERFETTO__PROTOS__IPCFRAME__BIND_SERVICE__INIT;
  bs.service_name = "ProducerPort";
  Perfetto__Protos__IPCFrame b = PERFETTO__PROTOS__IPCFRAME__INIT;
  b.has_request_id = true;
  b.request_id = 1;
  b.msg_case = PERFETTO__PROTOS__IPCFRAME__MSG_MSG_BIND_SERVICE;
  b.msg_bind_service = &bs;
  assert_int_equal(tr_ipc_frame_encode(&b, &out, &out_len), 0);
  assert_int_equal(out_len, sizeof bind_producer);
  assert_memory_equal(out, bind_producer, sizeof bind_producer);
  free(out);
}

static void test_garbage_does_not_decode(void **state) {
  (void)state;
  static const uint8_t bad[] = {0xff, 0xff, 0xff};
  assert_null(tr_ipc_frame_decode(bad, sizeof bad));
  static const uint8_t truncated[] = {0x10, 0x01, 0x1a, 0x0e, 0x0a};
  assert_null(tr_ipc_frame_decode(truncated, sizeof truncated));
}

/* Frame counts per recorded stream, from the vectors README (section 4). */
static const struct {
  const char *file;
  size_t frames;
} recorded[] = {
    {"producer-unix.to-service.bin", 17},        {"producer-unix.to-producer.bin", 7},
    {"producer-unix-n300.to-service.bin", 22},   {"producer-unix-n300.to-producer.bin", 7},
    {"producer-emulated.to-service.bin", 22},    {"producer-emulated.to-producer.bin", 8},
    {"producer-emulated-n50.to-service.bin", 18}, {"producer-emulated-n50.to-producer.bin", 7},
    {"producer-relay-unix.to-relay.bin", 21},    {"producer-relay-unix.to-producer.bin", 8},
    {"relay-client.to-service.bin", 5},          {"relay-client.to-relay.bin", 4},
    {"consumer-cli.to-service.bin", 3},          {"consumer-cli.to-consumer.bin", 3},
    {"consumer-cli-relay.to-service.bin", 3},    {"consumer-cli-relay.to-consumer.bin", 8},
    {"consumer-sdk.to-service.bin", 5},          {"consumer-sdk.to-consumer.bin", 7},
};

/* Counts the "=== #" frame headers of a capture's frames.txt (both directions). */
static size_t listed_frames(const char *capture) {
  char path[512];
  snprintf(path, sizeof path, "%s/ipc/%s.frames.txt", TR_VECTORS_DIR, capture);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  size_t n = 0;
  while (fgets(line, sizeof line, f))
    n += strncmp(line, "=== #", 5) == 0;
  fclose(f);
  return n;
}

/* Replays one stream in `step`-byte pieces; every frame must parse, and re-encoding it must
 * give back the recorded bytes (our encoder writes protozero's layout). */
static size_t replay(const uint8_t *data, size_t size, size_t step) {
  tr_ipc_reader r;
  tr_ipc_reader_init(&r);
  size_t off = 0, frames = 0, frame_start = 0;
  while (off < size) {
    size_t n = size - off < step ? size - off : step;
    int taken = tr_frame_reader_push(&r, data + off, n);
    assert_true(taken >= 0);
    off += (size_t)taken;
    const uint8_t *payload;
    size_t len;
    int rc;
    while ((rc = tr_frame_reader_next(&r, &payload, &len)) == 1) {
      Perfetto__Protos__IPCFrame *f = tr_ipc_frame_decode(payload, len);
      assert_non_null(f);
      uint8_t *out;
      size_t out_len;
      assert_int_equal(tr_ipc_frame_encode(f, &out, &out_len), 0);
      assert_int_equal(out_len, 4 + len);
      assert_memory_equal(out, data + frame_start, out_len);
      free(out);
      tr_ipc_frame_free(f);
      frame_start += 4 + len;
      frames++;
    }
    assert_int_equal(rc, 0);
  }
  assert_int_equal(frame_start, size);
  assert_int_equal(r.len - r.start, 0);
  tr_frame_reader_free(&r);
  return frames;
}

static void test_recorded_vectors(void **state) {
  (void)state;
  size_t n = sizeof recorded / sizeof recorded[0];
  for (size_t i = 0; i < n; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/ipc/%s", TR_VECTORS_DIR, recorded[i].file);
    size_t size;
    uint8_t *data = read_file(path, &size);
    static const size_t steps[] = {1, 7, 4096, 1 << 20};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
      if (steps[s] == 1 && size > 50000)
        continue; /* byte by byte is slow under ASan; 7 covers every split point too */
      if (replay(data, size, steps[s]) != recorded[i].frames)
        fail_msg("%s: frame count differs from the README's %zu", recorded[i].file,
                 recorded[i].frames);
    }
    free(data);
  }
  /* Both directions of a capture together match its frames.txt listing. */
  for (size_t i = 0; i < n; i += 2) {
    char capture[128];
    snprintf(capture, sizeof capture, "%s", recorded[i].file);
    *strstr(capture, ".to-") = '\0';
    assert_int_equal(listed_frames(capture), recorded[i].frames + recorded[i + 1].frames);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_byte_by_byte),
      cmocka_unit_test(test_several_frames_and_zero_length),
      cmocka_unit_test(test_oversize_declared_length),
      cmocka_unit_test(test_exact_limit),
      cmocka_unit_test(test_round_trip),
      cmocka_unit_test(test_garbage_does_not_decode),
      cmocka_unit_test(test_recorded_vectors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
