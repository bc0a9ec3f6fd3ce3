/* test_config_file.c: the daemons' config file format (relay/daemon/config_file.h): entries, comments,
 * quotes, errors with line numbers, limits, and the argv it builds for getopt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "relay/daemon/config_file.h"
#include "relay/base/tr_error.h"

static int parse(const char *text, tr_config_file *cf, char *err) {
  return tr_config_file_parse(text, strlen(text), cf, err, 256);
}

static void test_entries(void **state) {
  (void)state;
  tr_config_file cf;
  char err[256];
  const char *text = "# agent of web-1\n"
                     "\n"
                     "service = relay.example.net:7393\r\n"
                     "  cert=/etc/pki/agent.crt   \n"
                     "\t# indented comment\n"
                     "no-compress\n"
                     "service-name = \" spaced name \"\n"
                     "producer-socket = \"\"\n"
                     "log-level = debug # not a comment: part of the value";
  assert_int_equal(parse(text, &cf, err), 0);
  assert_int_equal(cf.num_entries, 6);
  assert_string_equal(cf.entries[0].key, "service");
  assert_string_equal(cf.entries[0].value, "relay.example.net:7393");
  assert_int_equal(cf.entries[0].line, 3);
  assert_string_equal(cf.entries[1].key, "cert");
  assert_string_equal(cf.entries[1].value, "/etc/pki/agent.crt");
  assert_string_equal(cf.entries[2].key, "no-compress");
  assert_null(cf.entries[2].value);
  assert_int_equal(cf.entries[2].line, 6);
  assert_string_equal(cf.entries[3].value, " spaced name ");
  assert_string_equal(cf.entries[4].value, "");
  assert_string_equal(cf.entries[5].value, "debug # not a comment: part of the value");
  assert_int_equal(cf.entries[5].line, 9);
  tr_config_file_free(&cf);

  assert_int_equal(parse("", &cf, err), 0);
  assert_int_equal(cf.num_entries, 0);
  tr_config_file_free(&cf);
}

static void expect_error(const char *text, const char *needle) {
  tr_config_file cf;
  char err[256] = "";
  assert_int_equal(parse(text, &cf, err), TR_ERR_CONFIG);
  assert_null(cf.entries);
  if (!strstr(err, needle))
    fail_msg("error '%s' lacks '%s'", err, needle);
}

static void test_errors(void **state) {
  (void)state;
  expect_error("cert = a\n--cert = b\n", "line 2");
  expect_error("Cert = a\n", "line 1");
  expect_error("cert a\n", "expected '='");
  expect_error("cert =\n", "no value");
  expect_error("cert = \"a\n", "unbalanced");
  expect_error("config = other.conf\n", "cannot be set");
  expect_error("help\n", "cannot be set");
  expect_error("cert = a\x01\n", "control character");
  tr_config_file cf;
  char err[256];
  assert_int_equal(tr_config_file_parse("cert = a\0b", 10, &cf, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "control character"));
  expect_error("= a\n", "line 1");
  char key[80];
  memset(key, 'k', 70);
  strcpy(key + 70, " = v");
  expect_error(key, "longer than");
}

static void test_limits(void **state) {
  (void)state;
  tr_config_file cf;
  char err[256];
  size_t n = TR_CONFIG_MAX_ENTRIES + 1;
  char *text = malloc(n * 2 + 1);
  for (size_t i = 0; i < n; i++) {
    text[2 * i] = 'a';
    text[2 * i + 1] = '\n';
  }
  assert_int_equal(tr_config_file_parse(text, n * 2 - 2, &cf, err, sizeof err), 0);
  assert_int_equal(cf.num_entries, TR_CONFIG_MAX_ENTRIES);
  tr_config_file_free(&cf);
  assert_int_equal(tr_config_file_parse(text, n * 2, &cf, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "more than"));
  free(text);

  char *line = malloc(TR_CONFIG_MAX_LINE + 16);
  memcpy(line, "a = ", 4);
  memset(line + 4, 'x', TR_CONFIG_MAX_LINE);
  assert_int_equal(tr_config_file_parse(line, TR_CONFIG_MAX_LINE, &cf, err, sizeof err), 0);
  tr_config_file_free(&cf);
  assert_int_equal(tr_config_file_parse(line, TR_CONFIG_MAX_LINE + 1, &cf, err, sizeof err),
                   TR_ERR_CONFIG);
  free(line);
  assert_int_equal(tr_config_file_parse("", TR_CONFIG_MAX_BYTES + 1u, &cf, err, sizeof err),
                   TR_ERR_CONFIG);
}

static void test_argv(void **state) {
  (void)state;
  tr_config_file cf;
  char err[256];
  char *argv[] = {"tracerelay-agent", "--config", "x.conf", "--cert", "/cmdline.crt", NULL};
  int argc = 5, out_argc, first;
  char **av;
  assert_int_equal(parse("cert = /file.crt\nno-compress\n", &cf, err), 0);
  assert_int_equal(tr_config_file_argv(&cf, argc, argv, &out_argc, &av, &first), 0);
  tr_config_file_free(&cf); /* the strings were copied */
  assert_int_equal(out_argc, 7);
  assert_int_equal(first, 3);
  assert_string_equal(av[0], "tracerelay-agent");
  assert_string_equal(av[1], "--cert=/file.crt");
  assert_string_equal(av[2], "--no-compress");
  assert_string_equal(av[3], "--config");
  assert_string_equal(av[6], "/cmdline.crt"); /* after the file's: getopt's last one wins */
  assert_null(av[7]);
  free(av);
}

static void test_check(void **state) {
  (void)state;
  static const struct option opts[] = {{"cert", required_argument, NULL, 1},
                                       {"no-compress", no_argument, NULL, 2},
                                       {NULL, 0, NULL, 0}};
  tr_config_file cf;
  char err[256];
  assert_int_equal(parse("cert = a\nno-compress\n", &cf, err), 0);
  assert_int_equal(tr_config_file_check(&cf, opts, err, sizeof err), 0);
  tr_config_file_free(&cf);
  assert_int_equal(parse("cert = a\n\ncert\n", &cf, err), 0);
  assert_int_equal(tr_config_file_check(&cf, opts, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "line 3: 'cert' needs a value"));
  tr_config_file_free(&cf);
  assert_int_equal(parse("no-compress = yes\n", &cf, err), 0);
  assert_int_equal(tr_config_file_check(&cf, opts, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "takes no value"));
  tr_config_file_free(&cf);
  assert_int_equal(parse("# x\ncerts = a\n", &cf, err), 0);
  assert_int_equal(tr_config_file_check(&cf, opts, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, "line 2: unknown key 'certs'"));
  tr_config_file_free(&cf);
}

static void test_find_arg(void **state) {
  (void)state;
  const char *path;
  char *a1[] = {"d", "--cert", "c", "--config", "a.conf", "--config=b.conf", NULL};
  assert_int_equal(tr_config_file_find_arg(6, a1, &path), 0);
  assert_string_equal(path, "b.conf");
  char *a2[] = {"d", "--", "--config", "a.conf", NULL};
  assert_int_equal(tr_config_file_find_arg(4, a2, &path), 0);
  assert_null(path);
  char *a3[] = {"d", "--config", NULL};
  assert_int_equal(tr_config_file_find_arg(2, a3, &path), TR_ERR_INVAL);
}

static void test_load(void **state) {
  (void)state;
  char path[] = "/tmp/test_config_file.XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char *text = "listen = 127.0.0.1:0\nbogus line\n";
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  tr_config_file cf;
  char err[512];
  assert_int_equal(tr_config_file_load(path, &cf, err, sizeof err), TR_ERR_CONFIG);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "line 2"));
  unlink(path);
  assert_true(tr_config_file_load(path, &cf, err, sizeof err) == TR_ERR_SYS(2));
  assert_non_null(strstr(err, "cannot read"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_entries),  cmocka_unit_test(test_errors),
      cmocka_unit_test(test_limits),   cmocka_unit_test(test_argv), cmocka_unit_test(test_check),
      cmocka_unit_test(test_find_arg), cmocka_unit_test(test_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
