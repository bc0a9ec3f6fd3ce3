/* test_byte_size.c: sizes typed in flags and shown in messages (relay/base/byte_size.h):
 * every unit and suffix, binary units, and refusal of empty, zero, unknown units, trailing
 * text and overflow; formatting exact and fractional values in the largest unit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "relay/base/byte_size.h"
#include "relay/base/tr_error.h"

static uint64_t parsed(const char *s) {
  uint64_t v = 0;
  assert_int_equal(tr_byte_size_parse(s, &v), 0);
  return v;
}

static void test_parse(void **state) {
  uint64_t v;
  (void)state;
  assert_int_equal(parsed("4096"), 4096);
  assert_int_equal(parsed("64K"), 64u << 10);
  assert_int_equal(parsed("512M"), 512u << 20);
  assert_int_equal(parsed("512MiB"), 512u << 20);
  assert_int_equal(parsed("12G"), UINT64_C(12) << 30);
  assert_int_equal(parsed("12GB"), UINT64_C(12) << 30);
  assert_int_equal(parsed("2T"), UINT64_C(2) << 40);
  const char *bad[] = {"", "0", "0G", "G", "-1", "12X", "12Gi", "12GiBx", "1 G", " 1",
                       "99999999999999999999", "17179869185G", "9223372036854775809"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    assert_int_equal(tr_byte_size_parse(bad[i], &v), TR_ERR_CONFIG);
}

static void test_format(void **state) {
  char t[TR_BYTE_SIZE_TEXT];
  (void)state;
  tr_byte_size_format(1, t);
  assert_string_equal(t, "1 byte");
  tr_byte_size_format(1000, t);
  assert_string_equal(t, "1000 bytes");
  tr_byte_size_format(512u << 20, t);
  assert_string_equal(t, "512 MiB");
  tr_byte_size_format(UINT64_C(40) << 30, t);
  assert_string_equal(t, "40 GiB");
  tr_byte_size_format(UINT64_C(3) << 29, t);
  assert_string_equal(t, "1.5 GiB");
  tr_byte_size_format(UINT64_MAX, t);
  assert_string_equal(t, "16.0 EiB");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_format),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
