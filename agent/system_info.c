/* system_info.c: this host's SystemInfo for the agent's Hello (see system_info.h). */
#include "agent/system_info.h"

#include <time.h>
#include <unistd.h>

void tr_system_info_read(struct tr_system_info *info) {
  Perfetto__Protos__SystemInfo *si = &info->msg;
  perfetto__protos__system_info__init(si);
  perfetto__protos__utsname__init(&info->uts_msg);
  if (uname(&info->uts) == 0) {
    info->uts_msg.sysname = info->uts.sysname;
    info->uts_msg.version = info->uts.version;
    info->uts_msg.release = info->uts.release;
    info->uts_msg.machine = info->uts.machine;
    si->utsname = &info->uts_msg;
  }
  long cpus = sysconf(_SC_NPROCESSORS_CONF), page = sysconf(_SC_PAGESIZE);
  long pages = sysconf(_SC_PHYS_PAGES), hz = sysconf(_SC_CLK_TCK);
  if (cpus > 0) {
    si->has_num_cpus = 1;
    si->num_cpus = (uint32_t)cpus;
  }
  if (page > 0) {
    si->has_page_size = 1;
    si->page_size = (uint32_t)page;
  }
  if (page > 0 && pages > 0) {
    si->has_system_ram_bytes = 1;
    si->system_ram_bytes = (uint64_t)pages * (uint64_t)page;
  }
  if (hz > 0) {
    si->has_hz = 1;
    si->hz = hz;
  }
  time_t now = time(NULL);
  struct tm tm;
  if (localtime_r(&now, &tm) != NULL) {
    si->has_timezone_off_mins = 1;
    si->timezone_off_mins = (int32_t)(tm.tm_gmtoff / 60);
  }
}
