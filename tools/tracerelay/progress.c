/* progress.c: the in-place status line of `tracerelay record` (see progress.h). */
#include "tools/tracerelay/progress.h"

#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define REDRAW_MS 200
#define LINE_MS 1000     /* --progress */
#define LOG_LINE_MS 5000 /* stderr is not a terminal */

int64_t progress_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void progress_start(progress *p, bool lines) {
  bool tty = isatty(STDERR_FILENO);
  p->lines = lines || !tty;
  p->line_period_ms = lines ? LINE_MS : LOG_LINE_MS;
  p->drawn = false;
  p->hosts[0] = '\0';
  p->start_ms = progress_now_ms();
  p->last_draw_ms = 0;
}

void progress_update(progress *p, const char *phase, uint64_t bytes) {
  int64_t now = progress_now_ms();
  if (now - p->last_draw_ms < (p->lines ? p->line_period_ms : REDRAW_MS))
    return;
  p->last_draw_ms = now;
  char line[1200];
  int n = snprintf(line, sizeof line, "%-9s %7.1f s  %8.1f MB%s%s", phase,
                   (double)(now - p->start_ms) / 1000.0, (double)bytes / (1024.0 * 1024.0),
                   p->hosts[0] ? "  " : "", p->hosts);
  if (p->lines) {
    fprintf(stderr, "tracerelay record: %s\n", line);
    fflush(stderr);
    return;
  }
  /* One terminal row, or the in-place redraw would scroll: cut at the width. */
  struct winsize ws;
  size_t width = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 ? ws.ws_col - 1 : 79;
  if (n > 0 && (size_t)n > width && width < sizeof line)
    line[width] = '\0';
  p->drawn = true;
  /* \r and "erase line" redraw in place. */
  fprintf(stderr, "\r\033[K%s", line);
  fflush(stderr);
}

void progress_refresh(progress *p) {
  if (!p->lines) /* lines keep their period: a log gets one every few seconds, not per reply */
    p->last_draw_ms = 0;
}

void progress_clear(progress *p) {
  if (!p->drawn)
    return;
  fputs("\r\033[K", stderr);
  fflush(stderr);
  p->drawn = false;
}
