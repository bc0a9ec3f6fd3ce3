/* pb_valid.h: checks protobuf-c cannot make on a message it decoded from outside, and the copy
 * of a decoded message that keeps (agent/port_msgs.c, service/hosts.c), made through the encoding
 * those checks keep sound.
 *
 * protobuf-c 1.4 accepts a tag of field number 0 when the tag varint is over-long (0x81 0x00
 * is field 0, fixed64) and keeps it as an unknown field; re-encoding then writes the short
 * tag 0x01, which protobuf-c itself refuses. Anything we decode, keep and copy or forward
 * (IPC frames, a producer's data source descriptors, relay frames, a consumer's TraceConfig)
 * would then turn into bytes the next copy or hop cannot parse: the agent silently failed to
 * announce such a producer's data sources, and a relay peer would take the frame for a
 * protocol error. Field 0 is invalid in every protobuf encoding, so such messages are refused
 * at decode (found by fuzz_ipc_frame; docs/fuzzing.md).
 *
 * Cost: one walk over the decoded message tree, O(fields). Pure. */
#ifndef TR_PB_VALID_H
#define TR_PB_VALID_H

#include <stdbool.h>

#include <protobuf-c/protobuf-c.h>

/* True unless m or a message inside it holds an unknown field numbered 0. NULL is valid. */
bool tr_pb_tags_valid(const ProtobufCMessage *m);
/* A deep copy of a decoded message (encoded and decoded again, unknown fields and all); free it
 * with protobuf_c_message_free_unpacked. NULL when out of memory. */
ProtobufCMessage *tr_pb_copy(const ProtobufCMessage *m);

#endif
