/* session_unmatched.c: what a session's TraceConfig asked for and found nowhere: data sources
 * no producer on any host has matched, and machine names (machine_name_filter) no host of the
 * session has. The service logs them when the session starts, and the trace's stats carry them
 * (trace_output.c), so that a misspelled name is never a silent, empty trace. */
#include <string.h>

#include "relay/base/log.h"
#include "service/session_priv.h"

static bool listed(const char **names, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0)
      return true;
  return false;
}

size_t tr_session_unmatched_data_sources(const tr_session *s, const char **out, size_t cap) {
  size_t n = 0;
  for (size_t c = 0; c < s->cfg->n_data_sources && n < cap; c++) {
    bool matched = false;
    for (size_t i = 0; i < s->num_instances && !matched; i++)
      matched = s->instances[i].cfg_index == c;
    const char *name = s->cfg->data_sources[c]->config->name;
    if (!matched && !listed(out, n, name))
      out[n++] = name;
  }
  return n;
}

size_t tr_session_unmatched_machines(const tr_session *s, const char **out, size_t cap) {
  size_t n = 0;
  for (size_t c = 0; c < s->cfg->n_data_sources; c++) {
    const Perfetto__Protos__TraceConfig__DataSource *ds = s->cfg->data_sources[c];
    for (size_t f = 0; f < ds->n_machine_name_filter && n < cap; f++) {
      const char *name = ds->machine_name_filter[f];
      bool seen = false;
      for (size_t h = 0; h < s->num_hosts && !seen; h++)
        seen = strcmp(s->hosts[h].host->name, name) == 0;
      if (!seen && !listed(out, n, name))
        out[n++] = name;
    }
  }
  return n;
}

void tr_session_unmatched_log(const tr_session *s) {
  const char *names[TR_SESSION_MAX_UNMATCHED];
  size_t n = tr_session_unmatched_data_sources(s, names, TR_SESSION_MAX_UNMATCHED);
  for (size_t i = 0; i < n; i++)
    TR_WARN("session", "session %llu: data source '%.128s' matched no producer on any connected "
            "host: nothing will be recorded from it unless such a producer connects",
            (unsigned long long)s->id, names[i]);
  n = tr_session_unmatched_machines(s, names, TR_SESSION_MAX_UNMATCHED);
  for (size_t i = 0; i < n; i++)
    TR_WARN("session", "session %llu: machine '%.128s' of machine_name_filter is not connected",
            (unsigned long long)s->id, names[i]);
}
