/* test_file_writer.c: service/file_writer.h on a real loop and real files.
 *
 * Buffers land in the file in the order pushed; a push beyond TR_FILE_WRITER_MAX_QUEUED is
 * refused (buffer not taken) while an empty writer takes any size; on_written follows the
 * writes; a write error (/dev/full: ENOSPC) is kept and returned by every later call; close
 * writes what is still queued before the file is closed; a sync (fflush_post_write) runs after
 * the writes queued before it, and a file that cannot be synced is no error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/base/tr_error.h"
#include "service/file_writer.h"

static void count_written(void *ud) { ++*(int *)ud; }

static uint8_t *filled(size_t n, uint8_t byte) {
  uint8_t *b = malloc(n);
  assert_non_null(b);
  memset(b, byte, n);
  return b;
}

static void test_writes_in_order(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  int written = 0;
  tr_file_writer *w;
  assert_int_equal(tr_file_writer_new(&loop, dup(fileno(tmp)), count_written, &written, &w), 0);
  for (uint8_t i = 1; i <= 100; i++)
    assert_int_equal(tr_file_writer_push(w, filled(1000, i), 1000), 0);
  assert_int_equal(tr_file_writer_wait(w), 0);
  assert_true(tr_file_writer_idle(w));
  while (written == 0) /* the thread's signal reaches the loop */
    uv_run(&loop, UV_RUN_ONCE);
  tr_file_writer_close(w);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  uint8_t got[1000];
  rewind(tmp);
  for (uint8_t i = 1; i <= 100; i++) {
    assert_int_equal(fread(got, 1, sizeof got, tmp), sizeof got);
    assert_int_equal(got[0], i);
    assert_int_equal(got[999], i);
  }
  assert_int_equal(fread(got, 1, 1, tmp), 0);
  fclose(tmp);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* A pipe nobody reads holds the first buffer in the thread's write: the queue fills. */
static void test_full_queue_refuses(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  int fds[2], written = 0;
  assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
  tr_file_writer *w;
  assert_int_equal(tr_file_writer_new(&loop, fds[1], count_written, &written, &w), 0);
  size_t big = TR_FILE_WRITER_MAX_QUEUED + 1;
  assert_int_equal(tr_file_writer_push(w, filled(big, 1), big), 0); /* an empty writer: taken */
  uint8_t *refused = filled(16, 2);
  assert_int_equal(tr_file_writer_push(w, refused, 16), TR_ERR_FULL);
  assert_false(tr_file_writer_idle(w));
  free(refused); /* not taken */
  tr_file_writer_close(w);
  /* The thread writes the rest before it closes the file: read it all. */
  size_t got = 0;
  uint8_t buf[65536];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0)
    got += (size_t)n;
  assert_int_equal(got, big);
  close(fds[0]);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_write_error_is_kept(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  int fd = open("/dev/full", O_WRONLY | O_CLOEXEC), written = 0;
  assert_true(fd >= 0);
  tr_file_writer *w;
  assert_int_equal(tr_file_writer_new(&loop, fd, count_written, &written, &w), 0);
  assert_int_equal(tr_file_writer_push(w, filled(100, 1), 100), 0);
  assert_int_equal(tr_file_writer_wait(w), TR_ERR_SYS(ENOSPC));
  assert_int_equal(tr_file_writer_error(w), TR_ERR_SYS(ENOSPC));
  assert_int_equal(tr_file_writer_push(w, filled(100, 2), 100), TR_ERR_SYS(ENOSPC));
  tr_file_writer_close(w);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* fflush_post_write's sync: done in order after the writes before it, counted; a pipe, which
 * cannot be synced, is no error. */
static void test_sync(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  FILE *tmp = tmpfile();
  assert_non_null(tmp);
  int written = 0, fds[2];
  tr_file_writer *w, *p;
  assert_int_equal(tr_file_writer_new(&loop, dup(fileno(tmp)), count_written, &written, &w), 0);
  assert_int_equal(tr_file_writer_push(w, filled(1000, 7), 1000), 0);
  assert_int_equal(tr_file_writer_sync(w), 0);
  assert_int_equal(tr_file_writer_wait(w), 0); /* waits for the sync too */
  assert_int_equal(tr_file_writer_syncs(w), 1);
  assert_true(tr_file_writer_idle(w));
  assert_int_equal(pipe(fds), 0);
  assert_int_equal(tr_file_writer_new(&loop, fds[1], count_written, &written, &p), 0);
  assert_int_equal(tr_file_writer_sync(p), 0);
  assert_int_equal(tr_file_writer_wait(p), 0);
  assert_int_equal(tr_file_writer_syncs(p), 1);
  tr_file_writer_close(w);
  tr_file_writer_close(p);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
  close(fds[0]);
  fclose(tmp);
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_writes_in_order),
      cmocka_unit_test(test_sync),
      cmocka_unit_test(test_full_queue_refuses),
      cmocka_unit_test(test_write_error_is_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
