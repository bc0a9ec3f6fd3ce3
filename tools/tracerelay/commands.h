/* commands.h: the `tracerelay` subcommands. Each lives in its own file and is listed in the
 * table in main.c; adding one is a new file, a declaration here and a row there. */
#ifndef TRACERELAY_COMMANDS_H
#define TRACERELAY_COMMANDS_H

#include <stdio.h>

/* argv[0] is the subcommand's name. Returns the process exit status. */
int cmd_record(int argc, char **argv);
void cmd_record_usage(FILE *out);
int cmd_inspect(int argc, char **argv);
void cmd_inspect_usage(FILE *out);
int cmd_status(int argc, char **argv);
void cmd_status_usage(FILE *out);
int cmd_trigger(int argc, char **argv);
void cmd_trigger_usage(FILE *out);

#endif
