/* trigger.c: `tracerelay trigger NAME...`: raises triggers on the service's own host, with no
 * agent there, through the service's consumer socket (TracerelayPort.ActivateTriggers, a
 * service of tracerelay's own beside Perfetto's ConsumerPort). Each name acts on every session
 * whose trigger_config names it, across the cluster, as a producer's ActivateTriggers would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "perfetto/ipc/producer_port.pb-c.h"
#include "relay/base/tr_error.h"
#include "relay/producer/ipc_client.h"
#include "relay/producer/ipc_frame.h"
#include "tools/tracerelay/commands.h"

#define DEFAULT_SOCKET "/run/tracerelay/consumer.sock"
#define TIMEOUT_MS 5000

void cmd_trigger_usage(FILE *out) {
  fputs("usage: tracerelay trigger [--socket PATH] NAME [NAME...]\n"
        "\n"
        "Activates the named triggers from the service's own host, as a producer's\n"
        "ActivateTriggers would on any host's agent: every session whose trigger_config\n"
        "lists a NAME starts (START_TRACING) or stops (STOP_TRACING) on every host, or is\n"
        "cloned by its consumer (CLONE_SNAPSHOT), after that trigger's stop_delay_ms. The\n"
        "trace's `trigger` packet names the producer \"tracerelay trigger (pid N)\" on the\n"
        "service's machine, with your uid.\n"
        "On any other host, an app calls perfetto::Tracing::ActivateTriggers, or:\n"
        "  echo 'activate_triggers: \"NAME\"' | perfetto --txt -c -\n"
        "with PERFETTO_PRODUCER_SOCK_NAME naming that host's agent's producer socket.\n"
        "\n"
        "options:\n"
        "  --socket PATH  the service's consumer socket (default: $TRACERELAY_CONSUMER_SOCK,\n"
        "                 $PERFETTO_CONSUMER_SOCK_NAME, else " DEFAULT_SOCKET ")\n"
        "exit status: 0 when the service took the triggers (whether or not a session\n"
        "matched: the service logs what each did), 1 otherwise, 2 for bad arguments.\n",
        out);
}

static int wait_reply(tr_ipc_client *c, uint64_t id, const char *path) {
  for (;;) {
    Perfetto__Protos__IPCFrame *f = NULL;
    int rc = tr_ipc_client_recv(c, TIMEOUT_MS, &f, NULL);
    if (rc < 0) {
      fprintf(stderr, "tracerelay trigger: no answer from %s: %s\n", path, tr_strerror(rc));
      return 1;
    }
    bool ours = f->msg_case == PERFETTO__PROTOS__IPCFRAME__MSG_MSG_INVOKE_METHOD_REPLY &&
                f->request_id == id;
    bool ok = ours && f->msg_invoke_method_reply->success;
    tr_ipc_frame_free(f);
    if (!ours)
      continue;
    if (!ok)
      fprintf(stderr, "tracerelay trigger: %s refused the triggers (see its log)\n", path);
    return ok ? 0 : 1;
  }
}

int cmd_trigger(int argc, char **argv) {
  const char *path = getenv("TRACERELAY_CONSUMER_SOCK");
  Perfetto__Protos__ActivateTriggersRequest req = PERFETTO__PROTOS__ACTIVATE_TRIGGERS_REQUEST__INIT;
  char **names = calloc((size_t)argc, sizeof *names);
  int status = 1;
  if (!path || !*path)
    path = getenv("PERFETTO_CONSUMER_SOCK_NAME");
  if (!path || !*path)
    path = DEFAULT_SOCKET;
  if (!names)
    return 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      cmd_trigger_usage(stdout);
      free(names);
      return 0;
    } else if (!strcmp(argv[i], "--socket") && i + 1 < argc) {
      path = argv[++i];
    } else if (!strncmp(argv[i], "--socket=", 9)) {
      path = argv[i] + 9;
    } else if (argv[i][0] == '-' || argv[i][0] == '\0') {
      fprintf(stderr, "tracerelay trigger: unknown or incomplete option '%s' (see --help)\n",
              argv[i]);
      free(names);
      return 2;
    } else {
      names[req.n_trigger_names++] = argv[i];
    }
  }
  if (req.n_trigger_names == 0) {
    fprintf(stderr, "tracerelay trigger: name at least one trigger (see --help)\n");
    free(names);
    return 2;
  }
  req.trigger_names = names;
  size_t len = perfetto__protos__activate_triggers_request__get_packed_size(&req);
  uint8_t *args = malloc(len + 1);
  tr_ipc_client *c = NULL;
  uint64_t id;
  int rc = args ? tr_ipc_client_connect(path, TIMEOUT_MS, &c) : TR_ERR_NOMEM;
  if (rc < 0) {
    fprintf(stderr, "tracerelay trigger: cannot connect to %s: %s\n", path, tr_strerror(rc));
    goto out;
  }
  perfetto__protos__activate_triggers_request__pack(&req, args);
  rc = tr_ipc_client_bind(c, "TracerelayPort", TIMEOUT_MS);
  if (rc == TR_ERR_NOT_FOUND) {
    fprintf(stderr,
            "tracerelay trigger: %s takes no triggers on its consumer socket (Perfetto's "
            "traced does not: raise them on its producer socket, see --help)\n",
            path);
    goto out;
  }
  if (rc == 0)
    rc = tr_ipc_client_invoke(c, "ActivateTriggers", args, len, false, -1, &id);
  if (rc < 0) {
    fprintf(stderr, "tracerelay trigger: cannot send to %s: %s\n", path, tr_strerror(rc));
    goto out;
  }
  status = wait_reply(c, id, path);
out:
  tr_ipc_client_close(c);
  free(args);
  free(names);
  return status;
}
