/* fuzz_config_file.c: libFuzzer target for the daemons' config file parser
 * (relay/daemon/config_file.h). Besides memory safety it checks the contract: every entry has a
 * well-formed key, a line number within the input, and survives the argv it builds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/daemon/config_file.h"
#include "relay/base/tr_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tr_config_file cf;
  char err[256];
  unsigned lines = 1;
  int rc = tr_config_file_parse((const char *)data, size, &cf, err, sizeof err);
  if (rc < 0) {
    if (rc != TR_ERR_CONFIG && rc != TR_ERR_NOMEM)
      abort();
    return 0;
  }
  for (size_t i = 0; i < size; i++)
    lines += data[i] == '\n';
  if (cf.num_entries > TR_CONFIG_MAX_ENTRIES)
    abort();
  for (size_t i = 0; i < cf.num_entries; i++) {
    const tr_config_entry *e = &cf.entries[i];
    size_t klen = strlen(e->key);
    if (klen == 0 || klen > TR_CONFIG_MAX_KEY || e->key[0] == '-' || e->line == 0 ||
        e->line > lines || (i > 0 && e->line <= cf.entries[i - 1].line))
      abort();
    if (e->value && strlen(e->value) > TR_CONFIG_MAX_LINE)
      abort();
  }
  char *argv[] = {"daemon", "--flag", NULL};
  int argc, first;
  char **av;
  if (tr_config_file_argv(&cf, 2, argv, &argc, &av, &first) == 0) {
    if (argc != (int)cf.num_entries + 2 || first != (int)cf.num_entries + 1 ||
        strcmp(av[argc - 1], "--flag") != 0 || av[argc] != NULL)
      abort();
    for (int i = 1; i < first; i++)
      if (strncmp(av[i], "--", 2) != 0 || strncmp(av[i] + 2, cf.entries[i - 1].key,
                                                   strlen(cf.entries[i - 1].key)) != 0)
        abort();
    free(av);
  }
  tr_config_file_free(&cf);
  return 0;
}
