/* main.c: `tracerelay SUBCOMMAND ...`: finds the subcommand in a table and runs it. */
#include <stdio.h>
#include <string.h>

#include "tools/tracerelay/commands.h"

struct command {
  const char *name;
  const char *summary;
  int (*run)(int argc, char **argv);
  void (*usage)(FILE *out);
};

static const struct command commands[] = {
    {"record", "record a trace through a tracerelay service (or traced)", cmd_record,
     cmd_record_usage},
    {"inspect", "resolve every timestamp of a trace and summarise it per host", cmd_inspect,
     cmd_inspect_usage},
    {"status", "one line per host of a running service: links, sessions, losses, clocks",
     cmd_status, cmd_status_usage},
    {"trigger", "activate triggers from the service's host: start, stop or snapshot sessions",
     cmd_trigger, cmd_trigger_usage},
};
#define NUM_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
  fputs("usage: tracerelay SUBCOMMAND [OPTIONS]\n"
        "\n"
        "One Perfetto trace of a whole cluster: drives a tracerelay-service (or Perfetto's\n"
        "traced) through its consumer socket.\n"
        "\n"
        "subcommands:\n",
        out);
  for (size_t i = 0; i < NUM_COMMANDS; i++)
    fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fputs("\n"
        "`tracerelay SUBCOMMAND --help` describes each one, or `tracerelay help SUBCOMMAND`;\n"
        "`tracerelay --version` prints the version.\n"
        "example:\n"
        "  tracerelay record -c config.pbtxt -o cluster.pftrace\n",
        out);
}

static const struct command *find(const char *name) {
  for (size_t i = 0; i < NUM_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *name = argv[1];
  if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(name, "--version")) {
    printf("tracerelay %s\n", TR_VERSION);
    return 0;
  }
  if (!strcmp(name, "help")) {
    const struct command *c = argc > 2 ? find(argv[2]) : NULL;
    if (c)
      c->usage(stdout);
    else
      usage(stdout);
    return 0;
  }
  const struct command *c = find(name);
  if (!c) {
    fprintf(stderr, "tracerelay: unknown subcommand '%s' (run `tracerelay --help` for the list)\n",
            name);
    return 2;
  }
  return c->run(argc - 1, argv + 1);
}
