/* flows.h: cross-host flows for timeline tests (--flow-send / --flow-recv). A sending loadgen
 * puts a flow id (TrackEvent.flow_ids) on a slice of its first writer and, right after that
 * event is written, writes the id into a FIFO; a receiving loadgen (on another host) reads ids
 * from the same FIFO and ends each flow (terminating_flow_ids) on a slice whose timestamp it
 * reads after the id arrived. So every departure truly happens before its arrival, and a trace
 * that orders an arrival before its departure got the hosts' clocks wrong (`tracerelay inspect
 * --check-order`). Ids are 8 bytes in host order per write (atomic on a pipe); a full pipe drops
 * the id (that flow then has no arrival, which no check counts against anyone). */
#ifndef LG_FLOWS_H
#define LG_FLOWS_H

#include <stdint.h>

typedef struct lg_flows {
  int send_fd, recv_fd; /* -1: not used */
  uint64_t next_id;     /* the sender's next id */
  uint64_t pending[64]; /* ids read but not yet ended, oldest first */
  unsigned n_pending;
} lg_flows;

/* Opens the FIFOs (either path may be NULL). 0 or a negative TR_ERR_*, logged. */
int lg_flows_open(lg_flows *f, const char *send_path, const char *recv_path);
void lg_flows_close(lg_flows *f);
/* The id to put on the next departure, or 0 when not sending. */
uint64_t lg_flows_departure(lg_flows *f);
/* The departure with this id was written: tell the receiver. */
void lg_flows_sent(lg_flows *f, uint64_t id);
/* Reads what arrived; returns the id to end on the next slice (then taken), or 0. */
uint64_t lg_flows_arrival(lg_flows *f);

#endif
