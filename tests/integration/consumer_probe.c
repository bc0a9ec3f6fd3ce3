/* consumer_probe.c: a liveness probe for the fault tests (test_overload.sh). It starts a
 * session of its own for one data source on a consumer socket, then for --rounds rounds sends
 * Flush on that session and QueryServiceState on a second connection, and measures how long
 * each takes to be answered. Prints one JSON object:
 *   {"rounds":N,"flush_ms_max":..,"flush_ms_median":..,"flushes_ok":..,"query_ms_max":..,
 *    "query_ms_median":..,"over_bound":K}
 * over_bound counts answers slower than --bound-ms (or never received). Exit 0 when every
 * request got an answer (of any outcome) within --bound-ms, 1 otherwise, 2 on bad usage.
 * It is a liveness check, not a benchmark: the bound is loose.
 * Usage: consumer_probe --socket PATH --data-source NAME [--rounds N] [--interval-ms MS]
 *                       [--bound-ms MS] [--flush-timeout-ms MS] */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "perfetto/ipc/consumer_port.pb-c.h"
#include "relay/producer/ipc_client.h"
#include "relay/producer/ipc_frame.h"
#include "relay/base/tr_error.h"
#include "tests/integration/test_consumer.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Waits up to wait_ms for the reply to id; *success from the reply. 0, or < 0. */
static int await_reply(tr_ipc_client *c, uint64_t id, int wait_ms, bool *success) {
  double deadline = now_ms() + wait_ms;
  for (;;) {
    int left = (int)(deadline - now_ms());
    if (left <= 0)
      return TR_ERR_TIMEOUT;
    Perfetto__Protos__IPCFrame *f = NULL;
    int rc = tr_ipc_client_recv(c, left, &f, NULL);
    if (rc < 0)
      return rc;
    bool match = f->request_id == id &&
                 f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY;
    if (match)
      *success = f->msg_invoke_method_reply->success;
    tr_ipc_frame_free(f);
    if (match)
      return 0;
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *socket_path = NULL, *ds_name = NULL;
  int rounds = 10, interval_ms = 300, bound_ms = 1000, flush_timeout_ms = 800;
  static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                       {"data-source", required_argument, NULL, 'd'},
                                       {"rounds", required_argument, NULL, 'r'},
                                       {"interval-ms", required_argument, NULL, 'i'},
                                       {"bound-ms", required_argument, NULL, 'b'},
                                       {"flush-timeout-ms", required_argument, NULL, 'f'},
                                       {NULL, 0, NULL, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 's': socket_path = optarg; break;
    case 'd': ds_name = optarg; break;
    case 'r': rounds = atoi(optarg); break;
    case 'i': interval_ms = atoi(optarg); break;
    case 'b': bound_ms = atoi(optarg); break;
    case 'f': flush_timeout_ms = atoi(optarg); break;
    default: return 2;
    }
  }
  if (!socket_path || !ds_name || rounds < 1 || rounds > 1000 || bound_ms < 1) {
    fprintf(stderr, "usage: consumer_probe --socket PATH --data-source NAME [--rounds N] "
                    "[--interval-ms MS] [--bound-ms MS] [--flush-timeout-ms MS]\n");
    return 2;
  }

  tr_ipc_client *session = NULL, *query = NULL;
  double t0 = now_ms();
  int rc = tr_ipc_client_connect(socket_path, bound_ms, &session);
  const char *step = "connect";
  if (rc == 0 && (rc = tr_ipc_client_bind(session, "ConsumerPort", bound_ms)) < 0)
    step = "BindService";
  if (rc == 0 && (rc = tr_ipc_client_connect(socket_path, bound_ms, &query)) < 0)
    step = "connect";
  if (rc == 0 && (rc = tr_ipc_client_bind(query, "ConsumerPort", bound_ms)) < 0)
    step = "BindService";
  if (rc < 0) {
    fprintf(stderr, "consumer_probe: %s on %s failed after %.0f ms: %s\n", step, socket_path,
            now_ms() - t0, tr_strerror(rc));
    tr_ipc_client_close(session);
    tr_ipc_client_close(query);
    return 1;
  }

  test_enable en;
  test_enable_init(&en, ds_name, 1024);
  uint64_t enable_id;
  if (test_consumer_invoke(session, "EnableTracing", &en.request.base, &enable_id) < 0) {
    fprintf(stderr, "consumer_probe: EnableTracing failed\n");
    return 1;
  }
  usleep(500 * 1000); /* the data source starts on its host */

  double *flush_ms = calloc((size_t)rounds, sizeof *flush_ms);
  double *query_ms = calloc((size_t)rounds, sizeof *query_ms);
  int over = 0, flushes_ok = 0;
  for (int i = 0; i < rounds && flush_ms && query_ms; i++) {
    Perfetto__Protos__FlushRequest fr = PERFETTO__PROTOS__FLUSH_REQUEST__INIT;
    fr.has_timeout_ms = 1;
    fr.timeout_ms = (uint32_t)flush_timeout_ms;
    uint64_t id;
    bool ok = false;
    t0 = now_ms();
    rc = test_consumer_invoke(session, "Flush", &fr.base, &id);
    if (rc == 0)
      rc = await_reply(session, id, bound_ms * 5, &ok);
    flush_ms[i] = now_ms() - t0;
    if (rc < 0)
      flush_ms[i] = 1e9;
    flushes_ok += rc == 0 && ok;
    over += flush_ms[i] > bound_ms;

    Perfetto__Protos__QueryServiceStateRequest qr = PERFETTO__PROTOS__QUERY_SERVICE_STATE_REQUEST__INIT;
    t0 = now_ms();
    rc = test_consumer_invoke(query, "QueryServiceState", &qr.base, &id);
    if (rc == 0)
      rc = await_reply(query, id, bound_ms * 5, &ok);
    query_ms[i] = rc < 0 ? 1e9 : now_ms() - t0;
    over += query_ms[i] > bound_ms;
    usleep((useconds_t)interval_ms * 1000);
  }
  if (!flush_ms || !query_ms)
    return 1;
  qsort(flush_ms, (size_t)rounds, sizeof *flush_ms, cmp_double);
  qsort(query_ms, (size_t)rounds, sizeof *query_ms, cmp_double);
  printf("{\"rounds\":%d,\"flush_ms_max\":%.1f,\"flush_ms_median\":%.1f,\"flushes_ok\":%d,"
         "\"query_ms_max\":%.1f,\"query_ms_median\":%.1f,\"over_bound\":%d}\n",
         rounds, flush_ms[rounds - 1], flush_ms[rounds / 2], flushes_ok, query_ms[rounds - 1],
         query_ms[rounds / 2], over);
  free(flush_ms);
  free(query_ms);
  tr_ipc_client_close(query);
  tr_ipc_client_close(session); /* the service frees the probe's session */
  return over ? 1 : 0;
}
