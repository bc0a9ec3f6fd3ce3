/* pb_valid.c: see pb_valid.h. */
#include "relay/base/pb_valid.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

bool tr_pb_tags_valid(const ProtobufCMessage *m) {
  if (m == NULL)
    return true;
  for (unsigned i = 0; i < m->n_unknown_fields; i++)
    if (m->unknown_fields[i].tag == 0)
      return false;
  const ProtobufCMessageDescriptor *d = m->descriptor;
  const char *base = (const char *)m;
  for (unsigned f = 0; f < d->n_fields; f++) {
    const ProtobufCFieldDescriptor *fd = &d->fields[f];
    if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)(base + fd->quantifier_offset);
      ProtobufCMessage *const *items = *(ProtobufCMessage *const *const *)(base + fd->offset);
      for (size_t j = 0; j < n; j++)
        if (!tr_pb_tags_valid(items[j]))
          return false;
      continue;
    }
    /* A oneof member's pointer is meaningful only while it is the case that is set. */
    if ((fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
        *(const uint32_t *)(base + fd->quantifier_offset) != fd->id)
      continue;
    if (!tr_pb_tags_valid(*(ProtobufCMessage *const *)(base + fd->offset)))
      return false;
  }
  return true;
}

ProtobufCMessage *tr_pb_copy(const ProtobufCMessage *m) {
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  if (buf == NULL)
    return NULL;
  protobuf_c_message_pack(m, buf);
  ProtobufCMessage *copy = protobuf_c_message_unpack(m->descriptor, NULL, len, buf);
  free(buf);
  return copy;
}
