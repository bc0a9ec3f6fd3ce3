/* fuzz_producer_port.c: libFuzzer target for what a producer controls at the producer port:
 * the arguments of each of the 12 ProducerPort requests, and, for CommitData, the request
 * together with the bytes of a small SMB (4 pages of 4 KiB), run through the real commit path
 * (producer_shm.h: moves, emulated chunks, patches, flush ack) and then scraping. Every queued
 * chunk must lie within what the port may send: its payload within a chunk, its used part
 * parsing as the header says.
 *
 * Input: [method byte][request length, 2 bytes LE][request][SMB bytes, zero-padded]. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/base/pb_valid.h"
#include "relay/producer/producer_shm.h"
#include "relay/base/tr_error.h"

#define SMB_PAGES 4u
#define SMB_PAGE_SIZE 4096u

static const ProtobufCMessageDescriptor *const kRequests[12] = {
    &perfetto__protos__initialize_connection_request__descriptor,
    &perfetto__protos__register_data_source_request__descriptor,
    &perfetto__protos__unregister_data_source_request__descriptor,
    &perfetto__protos__commit_data_request__descriptor,
    &perfetto__protos__get_async_command_request__descriptor,
    &perfetto__protos__register_trace_writer_request__descriptor,
    &perfetto__protos__unregister_trace_writer_request__descriptor,
    &perfetto__protos__notify_data_source_started_request__descriptor,
    &perfetto__protos__notify_data_source_stopped_request__descriptor,
    &perfetto__protos__activate_triggers_request__descriptor,
    &perfetto__protos__sync_request__descriptor,
    &perfetto__protos__update_data_source_request__descriptor,
};

static uint64_t smb_mem[SMB_PAGES * SMB_PAGE_SIZE / 8];

static void drain(tr_chunkq *q) {
  tr_chunkq_entry *e;
  while ((e = tr_chunkq_pop(q)) != NULL) {
    if (e->kind == TR_CHUNKQ_CHUNK) {
      if (e->len > TR_PRODUCER_MAX_EMULATED_CHUNK - TR_CHUNK_HEADER_SIZE)
        abort();
      const tr_chunkq_chunk *c = &e->u.chunk;
      if (c->producer_id != 7 || c->header.writer_id == 0 ||
          (c->target_buffer != 1 && c->target_buffer != 2))
        abort();
      tr_chunk_info info;
      tr_chunk_parse(e->data, e->len, c->header.count, &info);
      if (info.used > e->len)
        abort();
    } else if (e->kind == TR_CHUNKQ_PATCH && e->u.patch.producer_id != 7) {
      abort();
    }
    tr_chunkq_entry_free(e);
  }
}

static void commit(const uint8_t *req_bytes, size_t req_len, const uint8_t *smb_bytes,
                   size_t smb_len) {
  Perfetto__Protos__CommitDataRequest *req =
      perfetto__protos__commit_data_request__unpack(NULL, req_len, req_bytes);
  if (!req)
    return;
  memset(smb_mem, 0, sizeof(smb_mem));
  memcpy(smb_mem, smb_bytes, smb_len < sizeof(smb_mem) ? smb_len : sizeof(smb_mem));
  tr_producer_shm s;
  tr_producer_shm_init(&s, 7, 1000, 42);
  s.scraping = true;
  tr_smb smb;
  tr_chunkq q;
  tr_chunkq_init(&q, 256u << 10);
  if (tr_smb_init_view(&smb, smb_mem, sizeof(smb_mem), SMB_PAGE_SIZE) < 0 ||
      tr_producer_shm_set_smb(&s, &smb) < 0)
    abort();
  tr_producer_shm_add_buffer(&s, 1);
  tr_producer_shm_add_buffer(&s, 2);
  tr_producer_shm_register_writer(&s, 1, 1);
  tr_producer_shm_register_writer(&s, 2, 2);
  tr_producer_shm_register_writer(&s, 3, 9); /* a writer bound to a buffer we were not given */
  tr_producer_commit_result res;
  tr_producer_shm_commit(&s, &q, req, &res);
  if (res.violations && !res.first_violation)
    abort();
  drain(&q);
  tr_producer_shm_scrape(&s, &q);
  tr_producer_shm_scrape_exit(&s, &q, (const uint32_t[]){1, 2}, 2);
  drain(&q);
  tr_producer_shm_free(&s);
  tr_chunkq_free(&q);
  perfetto__protos__commit_data_request__free_unpacked(req, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3)
    return 0;
  unsigned method = data[0] % 12;
  size_t len = (size_t)data[1] | (size_t)data[2] << 8;
  data += 3;
  size -= 3;
  if (len > size)
    len = size;
  if (method == 3) {
    commit(data, len, data + len, size - len);
    return 0;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(kRequests[method], NULL, len, data);
  if (m && tr_pb_tags_valid(m)) { /* the port refuses the others (producer_port.c decode) */
    /* What the port keeps of a descriptor must re-encode (unknown fields included) into
     * bytes that decode again: the agent forwards descriptors to the service. */
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *again = protobuf_c_message_unpack(kRequests[method], NULL, n, buf);
    if (!again)
      abort();
    protobuf_c_message_free_unpacked(again, NULL);
    free(buf);
  }
  if (m)
    protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
