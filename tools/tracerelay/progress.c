/* progress.c: the in-place status line of `tracerelay record` (see progress.h). */
#include "tools/tracerelay/progress.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define REDRAW_MS 200

int64_t progress_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void progress_start(progress *p) {
  p->enabled = isatty(STDERR_FILENO);
  p->drawn = false;
  p->start_ms = progress_now_ms();
  p->last_draw_ms = 0;
}

void progress_update(progress *p, const char *phase, uint64_t bytes) {
  int64_t now = progress_now_ms();
  if (!p->enabled || now - p->last_draw_ms < REDRAW_MS)
    return;
  p->last_draw_ms = now;
  p->drawn = true;
  /* \r and "erase line" redraw in place; the line stays short for narrow terminals. */
  fprintf(stderr, "\r\033[K%-9s %7.1f s  %8.1f MB", phase, (double)(now - p->start_ms) / 1000.0,
          (double)bytes / (1024.0 * 1024.0));
  fflush(stderr);
}

void progress_clear(progress *p) {
  if (!p->drawn)
    return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  p->drawn = false;
}
