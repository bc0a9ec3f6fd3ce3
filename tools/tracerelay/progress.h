/* progress.h: one status line on a terminal ("recording  12.4 s  3.2 MB  web-1 1.1 MB ..."),
 * redrawn in place at most a few times a second and cut to the terminal's width; when stderr is
 * not a terminal, the same as a full line every 5 s (logs), or every second in lines mode
 * (--progress, terminal or not). */
#ifndef TRACERELAY_PROGRESS_H
#define TRACERELAY_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct progress {
  bool lines;            /* full lines on stderr instead of the in-place line */
  int64_t line_period_ms; /* between two lines */
  bool drawn;
  char hosts[1024]; /* per-host text shown after the bytes (host_progress_format) */
  int64_t start_ms;
  int64_t last_draw_ms;
} progress;

void progress_start(progress *p, bool lines);
/* phase: "recording", "stopping", "reading"; bytes: received or written so far. */
void progress_update(progress *p, const char *phase, uint64_t bytes);
/* New figures arrived: the next progress_update draws at once (in-place mode). */
void progress_refresh(progress *p);
/* Clears the line so messages that follow start on a clean one. */
void progress_clear(progress *p);
int64_t progress_now_ms(void);

#endif
