/* flows.c: the loadgen's cross-host flows over a FIFO (see flows.h). */
#include "tools/loadgen/flows.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"

/* O_RDWR: opening a FIFO so never waits for the other end (Linux). */
static int open_fifo(const char *path) {
  int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    TR_ERROR("loadgen", "cannot open flow FIFO %s: %s", path, strerror(errno));
  return fd;
}

int lg_flows_open(lg_flows *f, const char *send_path, const char *recv_path) {
  memset(f, 0, sizeof *f);
  f->send_fd = f->recv_fd = -1;
  /* Unique across the hosts of one machine's test: pids are (network namespaces share them). */
  f->next_id = (uint64_t)getpid() << 32 | 1;
  if (send_path && (f->send_fd = open_fifo(send_path)) < 0)
    return TR_ERR_CONFIG;
  if (recv_path && (f->recv_fd = open_fifo(recv_path)) < 0) {
    lg_flows_close(f);
    return TR_ERR_CONFIG;
  }
  return 0;
}

void lg_flows_close(lg_flows *f) {
  if (f->send_fd >= 0)
    close(f->send_fd);
  if (f->recv_fd >= 0)
    close(f->recv_fd);
  f->send_fd = f->recv_fd = -1;
}

uint64_t lg_flows_departure(lg_flows *f) { return f->send_fd >= 0 ? f->next_id : 0; }

void lg_flows_sent(lg_flows *f, uint64_t id) {
  if (f->send_fd < 0 || id != f->next_id)
    return;
  f->next_id++;
  ssize_t n = write(f->send_fd, &id, sizeof id);
  (void)n; /* a full pipe drops the id: see flows.h */
}

uint64_t lg_flows_arrival(lg_flows *f) {
  if (f->recv_fd < 0)
    return 0;
  while (f->n_pending < sizeof f->pending / sizeof f->pending[0]) {
    uint64_t id;
    if (read(f->recv_fd, &id, sizeof id) != (ssize_t)sizeof id)
      break;
    if (id != 0)
      f->pending[f->n_pending++] = id;
  }
  if (f->n_pending == 0)
    return 0;
  uint64_t id = f->pending[0];
  memmove(f->pending, f->pending + 1, --f->n_pending * sizeof f->pending[0]);
  return id;
}
