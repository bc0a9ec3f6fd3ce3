/* test_link_instances.c: the data source instances a service set up on the agent
 * (agent/link_instances.h): setups are remembered and stops forget them, a producer that is gone
 * takes all of its instances along, other commands pass, and clearing forgets everything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/link_instances.h"

static void command(tr_link_instances *t, bool setup, uint32_t producer_id,
                    uint64_t instance_id) {
  Tracerelay__Command__SetupDataSource su = TRACERELAY__COMMAND__SETUP_DATA_SOURCE__INIT;
  Tracerelay__Command__StopDataSource st = TRACERELAY__COMMAND__STOP_DATA_SOURCE__INIT;
  Tracerelay__Command cmd = TRACERELAY__COMMAND__INIT;
  cmd.producer_id = producer_id;
  if (setup) {
    su.instance_id = instance_id;
    cmd.cmd_case = TRACERELAY__COMMAND__CMD_SETUP_DATA_SOURCE;
    cmd.setup_data_source = &su;
  } else {
    st.instance_id = instance_id;
    cmd.cmd_case = TRACERELAY__COMMAND__CMD_STOP_DATA_SOURCE;
    cmd.stop_data_source = &st;
  }
  tr_link_instances_track(t, &cmd);
}

static void sum(void *data, uint32_t producer_id, uint64_t instance_id) {
  *(uint64_t *)data += producer_id * 1000 + instance_id;
}

static void test_setups_stops_and_producers_gone(void **state) {
  (void)state;
  tr_link_instances t = {0};
  for (uint64_t i = 1; i <= 40; i++) /* past the first allocation */
    command(&t, true, 1, i);
  command(&t, true, 2, 7);
  command(&t, true, 2, 8);
  assert_int_equal(tr_link_instances_each(&t, NULL, NULL), 42);
  command(&t, false, 1, 5);
  command(&t, false, 2, 5); /* not producer 2's: nothing happens */
  assert_int_equal(tr_link_instances_each(&t, NULL, NULL), 41);
  Tracerelay__Command flush = TRACERELAY__COMMAND__INIT;
  flush.cmd_case = TRACERELAY__COMMAND__CMD_FLUSH;
  tr_link_instances_track(&t, &flush);
  assert_int_equal(tr_link_instances_each(&t, NULL, NULL), 41);
  tr_link_instances_forget_producer(&t, 1);
  uint64_t total = 0;
  assert_int_equal(tr_link_instances_each(&t, sum, &total), 2);
  assert_int_equal(total, 2007 + 2008);
  tr_link_instances_clear(&t);
  assert_int_equal(tr_link_instances_each(&t, sum, &total), 0);
  tr_link_instances_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_setups_stops_and_producers_gone),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
