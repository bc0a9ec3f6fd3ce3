/* loadgen_stats.c: see loadgen_stats.h. */
#include "tests/integration/loadgen_stats.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

uint64_t loadgen_stats_total(const char *path, const char *key) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char json[65536];
  size_t n = fread(json, 1, sizeof(json) - 1, f);
  fclose(f);
  json[n] = 0;
  const char *total = strstr(json, "\"total\"");
  assert_non_null(total);
  const char *p = strstr(total, key);
  assert_non_null(p);
  return strtoull(p + strlen(key) + 1, NULL, 10); /* after the colon */
}
