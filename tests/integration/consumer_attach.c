/* consumer_attach.c: a consumer for the access tests (test_consumer_access.sh).
 *   consumer_attach --socket PATH --detach KEY   starts a session (1 MiB buffer, data source
 *                                                track_event) and detaches it under KEY;
 *   consumer_attach --socket PATH --attach KEY   tries to attach the session detached under KEY
 *                                                and to read its buffers.
 * Exit 0 when the step succeeded, 3 when the service refused it, 1 when the connection
 * failed (e.g. refused by the socket's permissions or the peer-credential check), 2 on bad
 * usage. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_client.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"
#include "tests/integration/test_consumer.h"

#define WAIT_MS 3000

static int call(tr_ipc_client *c, const char *method, const ProtobufCMessage *m) {
  uint64_t id;
  int rc = test_consumer_invoke(c, method, m, &id);
  while (rc == 0) {
    Perfetto__Protos__IPCFrame *f = NULL;
    rc = tr_ipc_client_recv(c, WAIT_MS, &f, NULL);
    if (rc < 0)
      return rc;
    if (f->request_id == id &&
        f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY) {
      bool ok = f->msg_invoke_method_reply->success;
      bool more = f->msg_invoke_method_reply->has_more;
      tr_ipc_frame_free(f);
      if (!ok)
        return TR_ERR_PERM;
      if (!more)
        return 0;
      continue;
    }
    tr_ipc_frame_free(f);
  }
  return rc;
}

int main(int argc, char **argv) {
  const char *sock = NULL, *detach_key = NULL, *attach_key = NULL;
  static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                       {"detach", required_argument, NULL, 'd'},
                                       {"attach", required_argument, NULL, 'a'},
                                       {NULL, 0, NULL, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 's': sock = optarg; break;
    case 'd': detach_key = optarg; break;
    case 'a': attach_key = optarg; break;
    default: return 2;
    }
  }
  if (!sock || !detach_key == !attach_key) {
    fprintf(stderr, "usage: consumer_attach --socket PATH (--detach KEY | --attach KEY)\n");
    return 2;
  }
  tr_ipc_client *c = NULL;
  int rc = tr_ipc_client_connect(sock, WAIT_MS, &c);
  if (rc == 0)
    rc = tr_ipc_client_bind(c, "ConsumerPort", WAIT_MS);
  if (rc < 0) {
    fprintf(stderr, "consumer_attach: cannot use %s: %s\n", sock, tr_strerror(rc));
    tr_ipc_client_close(c);
    return 1;
  }
  if (detach_key) {
    test_enable en;
    test_enable_init(&en, "track_event", 1024);
    uint64_t id;
    rc = test_consumer_invoke(c, "EnableTracing", &en.request.base, &id); /* held reply */
    Perfetto__Protos__DetachRequest d = PERFETTO__PROTOS__DETACH_REQUEST__INIT;
    d.key = (char *)detach_key;
    if (rc == 0)
      rc = call(c, "Detach", &d.base);
  } else {
    Perfetto__Protos__AttachRequest a = PERFETTO__PROTOS__ATTACH_REQUEST__INIT;
    a.key = (char *)attach_key;
    rc = call(c, "Attach", &a.base);
    Perfetto__Protos__ReadBuffersRequest r = PERFETTO__PROTOS__READ_BUFFERS_REQUEST__INIT;
    if (rc == 0)
      rc = call(c, "ReadBuffers", &r.base);
  }
  tr_ipc_client_close(c);
  printf("consumer_attach: %s %s: %s\n", detach_key ? "detach" : "attach",
         detach_key ? detach_key : attach_key, rc == 0 ? "ok" : tr_strerror(rc));
  return rc == 0 ? 0 : rc == TR_ERR_PERM ? 3 : 1;
}
