/* log.h: structured log lines for the daemons and tools.
 *
 * One line per event on stderr: `2026-11-21T06:40:00.123Z level=warn comp=agent msg="..."`.
 * Library code logs only what an operator must see (a producer disconnected and why, a
 * refused certificate); everything else is returned as an error code. */
#ifndef TR_LOG_H
#define TR_LOG_H

enum tr_log_level { TR_LOG_DEBUG = 0, TR_LOG_INFO, TR_LOG_WARN, TR_LOG_ERROR, TR_LOG_OFF };

void tr_log_set_level(enum tr_log_level level);
enum tr_log_level tr_log_get_level(void);
/* Parses "debug", "info", "warn", "error" or "off"; returns 0 or TR_ERR_INVAL. */
int tr_log_parse_level(const char *name, enum tr_log_level *out);

void tr_log(enum tr_log_level level, const char *comp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define TR_DEBUG(comp, ...) tr_log(TR_LOG_DEBUG, comp, __VA_ARGS__)
#define TR_INFO(comp, ...) tr_log(TR_LOG_INFO, comp, __VA_ARGS__)
#define TR_WARN(comp, ...) tr_log(TR_LOG_WARN, comp, __VA_ARGS__)
#define TR_ERROR(comp, ...) tr_log(TR_LOG_ERROR, comp, __VA_ARGS__)

#endif
