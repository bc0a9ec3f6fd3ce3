/* loadgen_stats.h: reading tracerelay-loadgen's --stats-json file in the tests that run it. */
#ifndef TR_TEST_LOADGEN_STATS_H
#define TR_TEST_LOADGEN_STATS_H

#include <stdint.h>

/* The total's count named key (with its quotes: "\"packets_written\""); the test fails if the
 * file or the key is missing. */
uint64_t loadgen_stats_total(const char *path, const char *key);

#endif
