/* test_inspect_cli.c: `tracerelay inspect` as a script uses it: --json on a recorded two-machine
 * trace gives the key numbers, --packets gives one line per timestamp, a truncated file exits 1
 * naming the file and the byte offset after summarising what precedes the cut, and bad usage
 * exits 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TRACE TR_VECTORS_DIR "/traces/traced-relay-2machines.pftrace"

/* Runs `tracerelay ARGS` (stderr into stdout); returns the exit status and the output. */
static int run(const char *args, char **output) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "'%s/tracerelay' %s 2>&1", TR_BIN_DIR, args);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  assert_non_null(out);
  size_t n;
  while ((n = fread(out + len, 1, cap - len - 1, p)) > 0) {
    len += n;
    if (cap - len < 4096) {
      cap *= 2;
      out = realloc(out, cap);
      assert_non_null(out);
    }
  }
  out[len] = 0;
  int status = pclose(p);
  *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_json(void **state) {
  (void)state;
  char *out;
  assert_int_equal(run("inspect '" TRACE "' --json", &out), 0);
  const char *want[] = {
      "\"packets\":1645",
      "\"trace_clock_name\":\"BOOTTIME\"",
      "\"remote_clock_syncs\":1",
      "{\"machine_id\":0,\"domain\":0,\"name\":\"Linux 6.18.44-fc-v595 x86_64\",\"packets\":1029",
      "\"sequences\":{\"1\":15,\"2\":1014}",
      "{\"machine_id\":1969531059,\"domain\":0,",
      "\"packets\":616",
      "\"sequences\":{\"0\":1,\"1\":1,\"3\":614}",
      "\"remote_sync_offset_ns\":-16866,\"remote_sync_round_trip_ns\":75460}",
  };
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
    if (!strstr(out, want[i]))
      fail_msg("missing %s in:\n%s", want[i], out);
  /* nothing unresolved on either machine */
  const char *u = out;
  int hosts = 0;
  while ((u = strstr(u, "\"unresolved\":"))) {
    assert_true(strncmp(u, "\"unresolved\":0,", 15) == 0);
    u++;
    hosts++;
  }
  assert_int_equal(hosts, 2);
  free(out);
}

static void test_packets(void **state) {
  (void)state;
  char *out;
  assert_int_equal(run("inspect '" TRACE "' --packets", &out), 0);
  size_t lines = 0;
  for (const char *p = out; (p = strchr(p, '\n')); p++)
    lines++;
  /* header + one line per timestamp, then the summary; no line says an error */
  assert_true(lines > 1600);
  assert_null(strstr(out, "(no such"));
  assert_non_null(strstr(out, "1969531059 3      seq:64"));
  free(out);
}

static void test_malformed_and_usage(void **state) {
  (void)state;
  char tmp[] = "/tmp/test_inspect_cli.XXXXXX";
  int fd = mkstemp(tmp);
  assert_true(fd >= 0);
  FILE *in = fopen(TRACE, "rb");
  assert_non_null(in);
  char buf[4096];
  size_t n, total = 0;
  while ((n = fread(buf, 1, sizeof(buf), in)) > 0 && total < 20000) {
    assert_int_equal(write(fd, buf, n), (ssize_t)n);
    total += n;
  }
  fclose(in);
  close(fd);
  char args[256], *out;
  snprintf(args, sizeof(args), "inspect %s --json", tmp);
  assert_int_equal(run(args, &out), 1);
  assert_non_null(strstr(out, tmp));
  assert_non_null(strstr(out, "truncated trace at byte "));
  assert_non_null(strstr(out, "\"hosts\":")); /* the summary of the whole records before the cut */
  free(out);
  unlink(tmp);

  assert_int_equal(run("inspect /nonexistent/trace", &out), 1);
  assert_non_null(strstr(out, "/nonexistent/trace"));
  free(out);
  assert_int_equal(run("inspect", &out), 2);
  free(out);
  assert_int_equal(run("inspect --bogus x", &out), 2);
  free(out);
  assert_int_equal(run("inspect --help", &out), 0);
  assert_non_null(strstr(out, "usage: tracerelay inspect"));
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_packets),
      cmocka_unit_test(test_malformed_and_usage),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
