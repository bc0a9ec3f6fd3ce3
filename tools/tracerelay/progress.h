/* progress.h: one status line on a terminal ("recording  12.4 s  3.2 MB"), redrawn in place
 * at most a few times a second; silent when stderr is not a terminal. */
#ifndef TRACERELAY_PROGRESS_H
#define TRACERELAY_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct progress {
  bool enabled;
  bool drawn;
  int64_t start_ms;
  int64_t last_draw_ms;
} progress;

void progress_start(progress *p);
/* phase: "recording", "stopping", "reading"; bytes: received or written so far. */
void progress_update(progress *p, const char *phase, uint64_t bytes);
/* Clears the line so messages that follow start on a clean one. */
void progress_clear(progress *p);
int64_t progress_now_ms(void);

#endif
