/* fuzz_pbtxt.c: libFuzzer target for the text-format parser and printer (relay/reading/pbtxt.h).
 *
 * The first byte picks the message type (TraceConfig, or TracePacket for oneofs, doubles and
 * 64-bit ints); the rest is the text. Besides memory safety it checks the printer's contract:
 * whatever parses prints to text that parses back and prints the same. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/config/trace_config.pb-c.h"
#include "perfetto/trace/trace_packet.pb-c.h"
#include "relay/reading/pbtxt.h"

static char *print(const ProtobufCMessage *m, size_t *len) {
  char *text = NULL;
  FILE *out = open_memstream(&text, len);
  if (!out || tr_pbtxt_print(out, m) != 0)
    abort();
  fclose(out);
  return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const ProtobufCMessageDescriptor *desc = (data[0] & 1)
                                               ? &perfetto__protos__trace_packet__descriptor
                                               : &perfetto__protos__trace_config__descriptor;
  ProtobufCMessage *m;
  tr_pbtxt_error err;
  if (tr_pbtxt_parse(desc, (const char *)data + 1, size - 1, "fuzz", &m, &err) != 0)
    return 0;
  uint8_t *packed = malloc(protobuf_c_message_get_packed_size(m) + 1);
  protobuf_c_message_pack(m, packed);
  free(packed);

  size_t len, len2;
  char *text = print(m, &len);
  ProtobufCMessage *again;
  if (tr_pbtxt_parse(desc, text, len, "printed", &again, &err) != 0) {
    fprintf(stderr, "printed text does not parse: %s\n%s", err.msg, text);
    abort();
  }
  char *text2 = print(again, &len2);
  if (len != len2 || memcmp(text, text2, len) != 0) {
    fprintf(stderr, "round trip differs:\n%s---\n%s", text, text2);
    abort();
  }
  free(text);
  free(text2);
  protobuf_c_message_free_unpacked(again, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
