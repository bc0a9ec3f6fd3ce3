/* log.c: the structured stderr logger behind log.h. Safe to call from any thread: each
 * line is formatted into one buffer and written with a single write(). */
#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum tr_log_level current_level = TR_LOG_INFO;
static const char *const level_names[] = {"debug", "info", "warn", "error", "off"};

void tr_log_set_level(enum tr_log_level level) { current_level = level; }
enum tr_log_level tr_log_get_level(void) { return current_level; }

int tr_log_parse_level(const char *name, enum tr_log_level *out) {
  for (int i = TR_LOG_DEBUG; i <= TR_LOG_OFF; i++) {
    if (strcmp(name, level_names[i]) == 0) {
      *out = (enum tr_log_level)i;
      return 0;
    }
  }
  return TR_ERR_INVAL;
}

void tr_log(enum tr_log_level level, const char *comp, const char *fmt, ...) {
  if (level < current_level || level >= TR_LOG_OFF)
    return;
  char line[1024];
  struct timespec now;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &now);
  gmtime_r(&now.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s comp=%s msg=\"",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   now.tv_nsec / 1000000, level_names[level], comp);
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 2, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 3)
    len = sizeof line - 3;
  line[len++] = '"';
  line[len++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, len);
  (void)ignored;
}
