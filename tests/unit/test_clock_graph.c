/* test_clock_graph.c: the resolver against hand-computed conversions: BFS over several hops, the
 * latest-snapshot-at-or-below rule and its first-snapshot fallback, target-only clocks, machine
 * qualification, incremental sequence clocks, overflow, and remote_clock_sync edges (trace_processor's
 * formula on the recorded traced-relay capture, and the estimator's breakpoints round-tripped). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay/reading/clock_graph.h"
#include "relay/clock/clocksync.h"
#include "relay/base/tr_error.h"

enum { REALTIME = 1, REALTIME_COARSE = 2, MONOTONIC = 3, MONOTONIC_COARSE = 4, MONOTONIC_RAW = 5,
       BOOTTIME = 6, TSC = 9 };

#define C(id, ts) {.clock_id = (id), .timestamp = (ts)}
#define SNAP(g, machine, seq, ...)                                                           \
  tr_clockgraph_add_snapshot((g), (machine), (seq), (struct tr_clockgraph_clock[]){__VA_ARGS__}, \
                             sizeof((struct tr_clockgraph_clock[]){__VA_ARGS__}) /             \
                                 sizeof(struct tr_clockgraph_clock))

static int64_t conv(struct tr_clockgraph *g, uint32_t machine, uint32_t clock, uint32_t seq,
                    uint64_t ts) {
  int64_t out = -1;
  assert_int_equal(tr_clockgraph_convert(g, machine, clock, seq, ts, &out), 0);
  return out;
}

static int conv_rc(struct tr_clockgraph *g, uint32_t machine, uint32_t clock, uint32_t seq,
                   uint64_t ts) {
  int64_t out;
  return tr_clockgraph_convert(g, machine, clock, seq, ts, &out);
}

static void test_multi_hop_bfs(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  const uint32_t global = 0x80000abc;
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1000), C(MONOTONIC, 400)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(MONOTONIC, 500), C(REALTIME, 90000)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(REALTIME, 90100), C(global, 7)), 0);
  /* global 10 -> REALTIME 90103 -> MONOTONIC 603 -> BOOTTIME 1203 */
  assert_int_equal(conv(g, 0, global, 0, 10), 1203);
  assert_int_equal(conv(g, 0, REALTIME, 0, 90000), 1100);
  assert_int_equal(conv(g, 0, BOOTTIME, 0, 123), 123); /* the trace clock itself */
  /* a shorter path appears: the cached path is dropped and the new one used */
  assert_int_equal(SNAP(g, 0, 0, C(global, 7), C(BOOTTIME, 5000)), 0);
  assert_int_equal(conv(g, 0, global, 0, 10), 5003);
  /* unknown clocks are unresolvable */
  assert_int_equal(conv_rc(g, 0, TSC, 0, 5), TR_ERR_NOT_FOUND);
  assert_int_equal(conv_rc(g, 3, MONOTONIC, 0, 5), TR_ERR_NOT_FOUND);
  /* more than TP's 4 hops: unresolvable */
  assert_int_equal(SNAP(g, 0, 0, C(0x80000001, 0), C(global, 100)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(0x80000002, 0), C(0x80000001, 100)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(0x80000003, 0), C(0x80000002, 100)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(0x80000004, 0), C(0x80000003, 100)), 0);
  /* 0x80000003 0 -> 0x80000002 100 -> 0x80000001 200 -> global 300 -> BOOTTIME 300 - 7 + 5000 */
  assert_int_equal(conv(g, 0, 0x80000003, 0, 0), 5293);
  assert_int_equal(conv_rc(g, 0, 0x80000004, 0, 0), TR_ERR_NOT_FOUND);
  tr_clockgraph_free(g);
}

/* Found by fuzz_trace_reader (fuzz/corpus/trace_reader/crash-hop-offset-overflow): a hop's
 * offset added to a value past int64 was signed overflow (UB); it is now refused. */
static void test_hop_overflow_is_refused(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 9223368739607598528ull), C(REALTIME, 0)), 0);
  assert_int_equal(conv(g, 0, REALTIME, 0, 1000), 9223368739607599528ll);
  assert_int_equal(conv_rc(g, 0, REALTIME, 0, 1795238717850464985ull), TR_ERR_INVAL);
  tr_clockgraph_free(g);
}

static void test_latest_snapshot_at_or_below(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1000), C(MONOTONIC, 100)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 2000), C(MONOTONIC, 1150)), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 3000), C(MONOTONIC, 2100)), 0);
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 1149), 1149 + 900);  /* the first */
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 1150), 2000);        /* at: the second */
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 2099), 2099 + 850);  /* still the second */
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 99999), 99999 + 900); /* the last */
  /* below every snapshot: the first one */
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 50), 950);
  /* same clocks in another order: another series; equally short paths go by the first seen */
  assert_int_equal(SNAP(g, 0, 0, C(MONOTONIC, 5000), C(BOOTTIME, 5000)), 0);
  assert_int_equal(conv(g, 0, MONOTONIC, 0, 6000), 6000 + 900);
  tr_clockgraph_free(g);
}

static void test_backwards_clock_is_target_only(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1000), C(MONOTONIC_RAW, 100), C(REALTIME, 5000)), 0);
  assert_int_equal(conv(g, 0, REALTIME, 0, 5001), 1001);
  /* REALTIME jumps back (a DST-like step): it can no longer be a source */
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 2000), C(MONOTONIC_RAW, 1100), C(REALTIME, 4000)), 0);
  assert_int_equal(conv_rc(g, 0, REALTIME, 0, 5001), TR_ERR_NOT_FOUND);
  assert_int_equal(conv(g, 0, MONOTONIC_RAW, 0, 1200), 2100);
  /* nor an intermediate hop: MONOTONIC reaches BOOTTIME only through REALTIME */
  assert_int_equal(SNAP(g, 0, 0, C(MONOTONIC, 7), C(REALTIME, 4500)), 0);
  assert_int_equal(conv_rc(g, 0, MONOTONIC, 0, 7), TR_ERR_NOT_FOUND);
  /* the trace clock going backwards rejects the snapshot, and nothing of it is kept */
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1500), C(MONOTONIC_RAW, 1600), C(REALTIME, 9000)),
                   TR_ERR_INVAL);
  assert_int_equal(conv(g, 0, MONOTONIC_RAW, 0, 1600), 2500);
  tr_clockgraph_free(g);
}

static void test_machine_qualification(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  const uint32_t global = 0x9234abcd;
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1000), C(global, 10)), 0);
  assert_int_equal(SNAP(g, 7, 0, C(BOOTTIME, 90000), C(global, 10)), 0);
  assert_int_equal(SNAP(g, 9, 0, C(BOOTTIME, 50000), C(global, 20)), 0);
  assert_int_equal(conv(g, 0, global, 0, 15), 1005);
  /* the same global id under machines 7 and 9 are other nodes, linked only to their own
   * BOOTTIME, which nothing links to machine 0's */
  assert_int_equal(conv_rc(g, 7, global, 0, 15), TR_ERR_NOT_FOUND);
  assert_int_equal(conv_rc(g, 9, global, 0, 15), TR_ERR_NOT_FOUND);
  assert_int_equal(conv_rc(g, 7, BOOTTIME, 0, 15), TR_ERR_NOT_FOUND);
  tr_clockgraph_free(g);
}

static void test_incremental_sequence_clock(void **state) {
  (void)state;
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  /* an SDK sequence: {BOOTTIME, 64 incremental in us}, then deltas */
  struct tr_clockgraph_clock snap[] = {
      C(BOOTTIME, 5000000), {.clock_id = 64, .timestamp = 5000, .unit_multiplier_ns = 1000,
                             .is_incremental = true}};
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 5, snap, 2), 0);
  assert_int_equal(conv(g, 0, 64, 5, 2), 5002000);
  assert_int_equal(conv(g, 0, 64, 5, 3), 5005000);
  assert_int_equal(conv(g, 0, 64, 5, 0), 5005000);
  /* a new snapshot resets the base */
  snap[0].timestamp = 9000000;
  snap[1].timestamp = 9000;
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 5, snap, 2), 0);
  assert_int_equal(conv(g, 0, 64, 5, 1), 9001000);
  /* clock 64 of another sequence is another clock */
  assert_int_equal(conv_rc(g, 0, 64, 6, 1), TR_ERR_NOT_FOUND);
  assert_int_equal(conv_rc(g, 0, 64, 0, 1), TR_ERR_INVAL);
  /* rules: no incremental global clock, no change of unit, trace clock in ns, no duplicates */
  struct tr_clockgraph_clock bad[] = {C(BOOTTIME, 1),
                                      {.clock_id = 200, .timestamp = 1, .is_incremental = true}};
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 5, bad, 2), TR_ERR_INVAL);
  snap[1].unit_multiplier_ns = 1;
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 5, snap, 2), TR_ERR_INVAL);
  struct tr_clockgraph_clock us_boot[] = {{.clock_id = BOOTTIME, .timestamp = 1,
                                           .unit_multiplier_ns = 1000},
                                          C(MONOTONIC, 1)};
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 0, us_boot, 2), TR_ERR_INVAL);
  assert_int_equal(SNAP(g, 0, 0, C(MONOTONIC, 1), C(MONOTONIC, 2)), TR_ERR_INVAL);
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 0, snap, 2), TR_ERR_INVAL); /* seq 0 */
  struct tr_clockgraph_clock huge[] = {C(BOOTTIME, 1), {.clock_id = 3, .timestamp = UINT64_MAX / 2,
                                                        .unit_multiplier_ns = 4}};
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 0, huge, 2), TR_ERR_INVAL);
  assert_int_equal(tr_clockgraph_add_snapshot(g, 0, 0, huge, 0), TR_ERR_TOO_BIG);
  /* the base was not moved by any rejected snapshot */
  assert_int_equal(conv(g, 0, 64, 5, 1), 9002000);
  /* the trace clock can change until a conversion used it */
  assert_int_equal(tr_clockgraph_set_trace_clock(g, MONOTONIC), TR_ERR_STATE);
  assert_int_equal(tr_clockgraph_set_trace_clock(g, BOOTTIME), 0);
  tr_clockgraph_free(g);

  assert_int_equal(tr_clockgraph_init(&g), 0);
  assert_int_equal(SNAP(g, 0, 0, C(BOOTTIME, 1000), C(MONOTONIC, 100)), 0);
  assert_int_equal(tr_clockgraph_set_trace_clock(g, 70), TR_ERR_INVAL);
  assert_int_equal(tr_clockgraph_set_trace_clock(g, MONOTONIC), 0);
  assert_int_equal(conv(g, 0, BOOTTIME, 0, 1500), 600);
  tr_clockgraph_free(g);
}

/* The remote_clock_sync packet of tests/vectors/traces/traced-relay-2machines.txt (packet 14,
 * machine_id 1969531059): one PING and one UPDATE, seven clocks each. */
static const struct tr_clockgraph_clock ping_client[] = {
    C(6, 3323303485893), C(2, 1795242041150708044u), C(4, 3323298159135),
    C(1, 1795242041156034938u), C(3, 3323303486056), C(5, 3323213488198), C(9, 8973030965826)};
static const struct tr_clockgraph_clock ping_host[] = {
    C(6, 3323303573282), C(2, 1795242041150708044u), C(4, 3323298159135),
    C(1, 1795242041156122314u), C(3, 3323303573427), C(5, 3323213575498), C(9, 8973031201442)};
static const struct tr_clockgraph_clock update_client[] = {
    C(6, 3323303594146), C(2, 1795242041150708044u), C(4, 3323298159135),
    C(1, 1795242041156143148u), C(3, 3323303594265), C(5, 3323213596258), C(9, 8973031257286)};
static const struct tr_clockgraph_clock update_host[] = {
    C(6, 3323303615949), C(2, 1795242041150708044u), C(4, 3323298159135),
    C(1, 1795242041156164912u), C(3, 3323303616029), C(5, 3323213618004), C(9, 8973031315460)};

static void test_remote_clock_sync_recorded(void **state) {
  (void)state;
  /* the numbers above are the recorded ones */
  FILE *f = fopen(TR_VECTORS_DIR "/traces/traced-relay-2machines.txt", "r");
  assert_non_null(f);
  static char text[1 << 20];
  size_t len = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[len] = '\0';
  assert_non_null(strstr(text, "remote_clock_sync"));
  const uint64_t samples[] = {3323303485893, 3323303573282, 3323303594146, 3323303615949,
                              1795242041156164912u};
  for (size_t i = 0; i < 5; i++) {
    char needle[64];
    snprintf(needle, sizeof(needle), "timestamp: %llu\n", (unsigned long long)samples[i]);
    assert_non_null(strstr(text, needle));
  }

  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  const uint32_t machine = 1969531059;
  /* the service's own snapshot, packet 0 */
  assert_int_equal(SNAP(g, 0, 1, C(6, 3326310769092), C(2, 1795242044158707909u),
                        C(4, 3326306159000), C(1, 1795242044163318074u), C(3, 3326310769187),
                        C(5, 3326220771177), C(9, 8981150630858)),
                   0);
  struct tr_clockgraph_sync syncs[] = {{ping_client, 7, ping_host, 7},
                                       {update_client, 7, update_host, 7}};
  int64_t off = 0;
  /* one edge per clock, TSC too; the coarse clocks did not tick, their offset is 0 */
  assert_int_equal(tr_clockgraph_add_remote_sync(g, machine, syncs, 2, &off), 7);
  /* By hand, BOOTTIME: o1 = (3323303485893 + 3323303594146)/2 - 3323303573282
   *                       = 3323303540019 - 3323303573282 = -33263
   *                   o2 = 3323303594146 - (3323303573282 + 3323303615949)/2
   *                       = 3323303594146 - 3323303594615 = -469
   *                   offset = (-33263 - 469)/2 = -16866 (client minus host). */
  assert_int_equal(off, -16866);
  /* the edge: host BOOTTIME 3323303615949 (last host reading) <-> remote 3323303599083 */
  assert_int_equal(conv(g, machine, BOOTTIME, 0, 3323303599083), 3323303615949);
  assert_int_equal(conv(g, machine, BOOTTIME, 0, 3323400000000), 3323400000000 + 16866);
  /* below the edge: the first (only) snapshot still applies */
  assert_int_equal(conv(g, machine, BOOTTIME, 0, 3323000000000), 3323000000000 + 16866);
  /* the remote's other clocks reach the trace clock too (own edge or own snapshot) */
  assert_int_equal(conv_rc(g, machine, MONOTONIC_RAW, 0, 3323213600000), 0);
  assert_int_equal(conv_rc(g, machine, 0x80000001, 0, 1), TR_ERR_NOT_FOUND);
  /* machine 0 is the trace machine: it has no remote sync */
  assert_int_equal(tr_clockgraph_add_remote_sync(g, 0, syncs, 2, NULL), TR_ERR_INVAL);
  tr_clockgraph_free(g);

  /* entries 30 s apart (client BOOTTIME) are different rounds: no offset, no edge */
  assert_int_equal(tr_clockgraph_init(&g), 0);
  struct tr_clockgraph_clock late[] = {C(6, 3323303485893 + 30000000000)};
  struct tr_clockgraph_sync far[] = {{ping_client, 1, ping_host, 1}, {late, 1, update_host, 1}};
  off = 0;
  assert_int_equal(tr_clockgraph_add_remote_sync(g, machine, far, 2, &off), 0);
  assert_int_equal(off, 0);
  tr_clockgraph_free(g);
}

static void test_remote_clock_sync_follows_drift(void **state) {
  (void)state;
  /* Two packets 10 s apart, offsets 4.000 s and 4.001 s: events are placed by each in turn. */
  struct tr_clockgraph *g;
  assert_int_equal(tr_clockgraph_init(&g), 0);
  assert_int_equal(SNAP(g, 0, 1, C(BOOTTIME, 100000000000), C(MONOTONIC, 1)), 0);
  const int64_t h1 = 200000000000, h2 = 210000000000; /* service times of the two edges */
  const int64_t offs[] = {4000000000, 4001000000};
  for (int i = 0; i < 2; i++) {
    struct tr_clocksync_breakpoint bp = {.host_ts = (i ? h2 : h1) + offs[i],
                                         .service_ts = i ? h2 : h1};
    struct tr_clocksync_sync_pair p;
    tr_clocksync_pair_from_breakpoint(&bp, &p);
    struct tr_clockgraph_clock pc[] = {C(BOOTTIME, (uint64_t)p.ping_remote)};
    struct tr_clockgraph_clock ph[] = {C(BOOTTIME, (uint64_t)p.ping_service)};
    struct tr_clockgraph_clock uc[] = {C(BOOTTIME, (uint64_t)p.update_remote)};
    struct tr_clockgraph_clock uh[] = {C(BOOTTIME, (uint64_t)p.update_service)};
    struct tr_clockgraph_sync s[] = {{pc, 1, ph, 1}, {uc, 1, uh, 1}};
    int64_t off;
    assert_int_equal(tr_clockgraph_add_remote_sync(g, 42, s, 2, &off), 1);
    assert_int_equal(off, offs[i]);
  }
  assert_int_equal(conv(g, 42, BOOTTIME, 0, h1 + offs[0] + 5), h1 + 5);
  assert_int_equal(conv(g, 42, BOOTTIME, 0, h2 + offs[1] - 1), h2 + offs[1] - 1 - offs[0]);
  assert_int_equal(conv(g, 42, BOOTTIME, 0, h2 + offs[1]), h2);
  assert_int_equal(conv(g, 42, BOOTTIME, 0, h2 + offs[1] + 7000), h2 + 7000);
  tr_clockgraph_free(g);
}

/* The estimator's breakpoints, written both ways, resolve to the estimator's mapping. */
static void test_estimator_breakpoints_round_trip(void **state) {
  (void)state;
  struct tr_clocksync *est;
  assert_int_equal(tr_clocksync_init(&est, NULL), 0);
  /* host = service + 2 h, drifting +150 ppm, a clean 100 us round trip, probes every second */
  const int64_t sec = 1000000000;
  for (int64_t t = 100 * sec; t < 160 * sec; t += sec) {
    int64_t h2 = t + 50000 + 7200 * sec + (t + 50000) * 150 / 1000000;
    int64_t h3 = h2 + 10000;
    struct tr_clocksync_probe p = {.t1 = t, .t2 = h2, .t3 = h3, .t4 = t + 110000};
    assert_int_equal(tr_clocksync_add_probe(est, &p), 0);
  }
  int64_t from = 7300 * sec, to = tr_clocksync_frontier(est);
  static struct tr_clocksync_breakpoint bp[20000];
  int n = tr_clocksync_export(est, from, to, 1000, bp, 20000);
  assert_true(n > 0);

  struct tr_clockgraph *snaps, *syncs;
  assert_int_equal(tr_clockgraph_init(&snaps), 0);
  assert_int_equal(tr_clockgraph_init(&syncs), 0);
  const uint32_t host_boot = 0x8abcdef0; /* global-clocks: the host's global BOOTTIME id */
  for (int i = 0; i < n; i++) {
    assert_int_equal(SNAP(snaps, 0, 1, C(BOOTTIME, (uint64_t)bp[i].service_ts),
                          C(host_boot, (uint64_t)bp[i].host_ts)),
                     0);
    struct tr_clocksync_sync_pair p;
    tr_clocksync_pair_from_breakpoint(&bp[i], &p);
    struct tr_clockgraph_clock pc[] = {C(BOOTTIME, (uint64_t)p.ping_remote)};
    struct tr_clockgraph_clock ph[] = {C(BOOTTIME, (uint64_t)p.ping_service)};
    struct tr_clockgraph_clock uc[] = {C(BOOTTIME, (uint64_t)p.update_remote)};
    struct tr_clockgraph_clock uh[] = {C(BOOTTIME, (uint64_t)p.update_service)};
    struct tr_clockgraph_sync s[] = {{pc, 1, ph, 1}, {uc, 1, uh, 1}};
    assert_int_equal(tr_clockgraph_add_remote_sync(syncs, 42, s, 2, NULL), 1);
  }
  for (int64_t h = from; h <= to; h += 997 * 1000) {
    int64_t m;
    assert_int_equal(tr_clocksync_map(est, h, &m), 0);
    int64_t a = conv(snaps, 0, host_boot, 0, (uint64_t)h);
    int64_t b = conv(syncs, 42, BOOTTIME, 0, (uint64_t)h);
    assert_true(llabs(a - m) <= 1002);
    assert_int_equal(a, b); /* both encodings land every event on the same instant */
  }
  tr_clockgraph_free(syncs);
  tr_clockgraph_free(snaps);
  tr_clocksync_free(est);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_multi_hop_bfs),
      cmocka_unit_test(test_hop_overflow_is_refused),
      cmocka_unit_test(test_latest_snapshot_at_or_below),
      cmocka_unit_test(test_backwards_clock_is_target_only),
      cmocka_unit_test(test_machine_qualification),
      cmocka_unit_test(test_incremental_sequence_clock),
      cmocka_unit_test(test_remote_clock_sync_recorded),
      cmocka_unit_test(test_remote_clock_sync_follows_drift),
      cmocka_unit_test(test_estimator_breakpoints_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
