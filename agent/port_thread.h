/* port_thread.h: the agent's producer port (relay/producer/producer_port.h) on a thread and a
 * libuv loop of its own, so that a producer's CommitData is read, its chunks copied out of the
 * shared memory and their slots freed whatever the link's loop is doing (building a batch,
 * encrypting, writing): a producer waits on this thread alone. Everything after the copy-out
 * (the chunk queue, batching, zstd, the cipher, the link) stays on the link's loop.
 *
 * The two threads share only a tr_port_handoff (agent/port_handoff.h): the port copies chunks
 * into its bounded outbox and posts producer events; this module moves the outbox's entries
 * into the caller's chunk queue on the link's loop, each event in its place among them (so a
 * reply or a producer's end still follows the data committed before it, as link_client.h
 * requires), and calls the callbacks there. Commands go the other way and are run on the
 * port's thread (struct tr_port_command, port_msgs.h); each comes back as a command_done. A
 * chunk that finds the outbox full is dropped and counted by the outbox, and the counts join
 * the chunk queue's.
 *
 * Every function and callback runs on the link's loop thread. With own_thread false the port
 * runs on the link's loop itself (bench/many_agents: thousands of agents in one process), through
 * the same handoff. */
#ifndef TR_PORT_THREAD_H
#define TR_PORT_THREAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/port_msgs.h"
#include "relay/producer/chunk_queue.h"
#include "relay/producer/producer_port.h"

typedef struct tr_port_thread tr_port_thread;

/* As tr_producer_port_callbacks, on the link's loop, with cb.data for the port. */
struct tr_port_thread_callbacks {
  void *data;
  void (*producer_connected)(void *data, const tr_producer_info *p);
  void (*data_sources_changed)(void *data, const tr_producer_info *p);
  void (*producer_disconnected)(void *data, const tr_producer_info *p);
  void (*data_source_started)(void *data, uint32_t producer_id, uint64_t instance_id);
  void (*data_source_stopped)(void *data, uint32_t producer_id, uint64_t instance_id,
                              bool timed_out);
  void (*flush_acked)(void *data, uint32_t producer_id, uint64_t flush_request_id);
  /* The producer activated a trigger (ActivateTriggers: once per name). */
  void (*trigger)(void *data, uint32_t producer_id, const char *name);
  /* The relay endpoint's guest machines (producer_port.h), valid during the call. */
  void (*guest_changed)(void *data, const tr_guest *g, bool gone);
  void (*guest_clock)(void *data, uint32_t guest_id, const struct tr_guest_exchange *x);
  /* Entries were moved into the chunk queue. */
  void (*queue_has_data)(void *data);
  /* Every command's result, in its place among the events. */
  void (*command_done)(void *data, const struct tr_port_result *r);
};

struct tr_port_thread_config {
  const char *socket_path;
  mode_t mode;
  const char *relay_listen; /* the relay endpoint's address (producer_port.h), or NULL: none */
  uint32_t smb_size; /* as tr_producer_port_config */
  size_t max_producers;
  const char *max_producers_flag;
  tr_chunkq *queue;    /* the link's, owned by the caller; must outlive the port thread */
  size_t outbox_bytes; /* the outbox's bound */
  bool own_thread;     /* false: the port runs on the link's loop */
  struct tr_port_thread_callbacks cb;
};

/* Listens on the producer socket and starts the port's thread. On failure (the socket's error,
 * as tr_producer_port_start; TR_ERR_NOMEM; libuv's) nothing is left for the caller: what was
 * made is freed, from the link's loop if it needs the loop. */
int tr_port_thread_start(uv_loop_t *loop, const struct tr_port_thread_config *cfg,
                         tr_port_thread **out);
/* Posts a command (copied). 0, TR_ERR_NOMEM, or TR_ERR_CLOSED once the port is closing. */
int tr_port_thread_command(tr_port_thread *pt, const struct tr_port_command *cmd);
/* Bytes the port copied out of shared memory that the link's loop has not taken yet. */
size_t tr_port_thread_outbox_bytes(tr_port_thread *pt);
/* Disconnects the producers (producer_disconnected for each, after the data before it), stops
 * listening, ends the thread; cb(data) runs on the link's loop once pt is freed. */
void tr_port_thread_close(tr_port_thread *pt, void (*cb)(void *data), void *data);

#endif
