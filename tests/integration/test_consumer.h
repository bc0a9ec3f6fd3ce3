/* test_consumer.h: what the test consumers (consumer_attach.c, consumer_probe.c) share: sending
 * a ConsumerPort request, and an EnableTracing request for one buffer and one data source. */
#ifndef TR_TEST_CONSUMER_H
#define TR_TEST_CONSUMER_H

#include <stdint.h>
#include <stdlib.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_client.h"
#include "relay/base/tr_error.h"

/* Packs m and invokes method with it; *id gets the request id. 0, or < 0. */
static inline int test_consumer_invoke(tr_ipc_client *c, const char *method,
                                       const ProtobufCMessage *m, uint64_t *id) {
  size_t len = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf)
    return TR_ERR_NOMEM;
  protobuf_c_message_pack(m, buf);
  int rc = tr_ipc_client_invoke(c, method, buf, len, false, -1, id);
  free(buf);
  return rc;
}

/* EnableTracing for one buffer of size_kb and one data source; `request` points into the
 * struct, which must outlive its use. */
typedef struct test_enable {
  Perfetto__Protos__TraceConfig__BufferConfig buf, *bufs[1];
  Perfetto__Protos__DataSourceConfig dsc;
  Perfetto__Protos__TraceConfig__DataSource ds, *dss[1];
  Perfetto__Protos__TraceConfig cfg;
  Perfetto__Protos__EnableTracingRequest request;
} test_enable;

static inline void test_enable_init(test_enable *e, const char *data_source, uint32_t size_kb) {
  perfetto__protos__trace_config__buffer_config__init(&e->buf);
  e->buf.has_size_kb = 1;
  e->buf.size_kb = size_kb;
  e->bufs[0] = &e->buf;
  perfetto__protos__data_source_config__init(&e->dsc);
  e->dsc.name = (char *)data_source;
  perfetto__protos__trace_config__data_source__init(&e->ds);
  e->ds.config = &e->dsc;
  e->dss[0] = &e->ds;
  perfetto__protos__trace_config__init(&e->cfg);
  e->cfg.n_buffers = 1;
  e->cfg.buffers = e->bufs;
  e->cfg.n_data_sources = 1;
  e->cfg.data_sources = e->dss;
  perfetto__protos__enable_tracing_request__init(&e->request);
  e->request.trace_config = &e->cfg;
}

#endif
