/* producer_port_priv.h: the producer port's state, shared by producer_port.c (connections and
 * the 12 methods) and producer_commands.c (commands to producers, stop timeouts). Not for
 * other modules: they use producer_port.h. */
#ifndef TR_PRODUCER_PORT_PRIV_H
#define TR_PRODUCER_PORT_PRIV_H

#include <sys/types.h>

#include "relay/producer/guests.h"
#include "relay/producer/ipc_host.h"
#include "relay/producer/producer_port.h"

typedef enum pp_instance_state {
  PP_SETUP = 1,
  PP_STARTING, /* start sent, waiting for NotifyDataSourceStarted */
  PP_STARTED,
  PP_STOPPING, /* stop sent, waiting for NotifyDataSourceStopped until stop_deadline_ms */
} pp_instance_state;

typedef struct pp_instance {
  uint64_t id;
  pp_instance_state state;
  uint32_t target_buffer;  /* its config's: the session's buffer it writes into */
  bool notify_on_start; /* from the descriptor at setup time */
  bool notify_on_stop;
  uint32_t stop_timeout_ms;  /* its config's stop_timeout_ms, or the default if it gave none */
  uint64_t stop_deadline_ms; /* uv_now() time */
  uint8_t *start_cmd;        /* packed GetAsyncCommandResponse{start_data_source} */
  size_t start_cmd_len;
} pp_instance;

typedef struct pp_producer {
  tr_producer_port *port;
  tr_ipc_conn *conn;
  struct pp_producer *prev, *next;
  tr_ipc_peer peer;
  char *name;
  char *sdk_version;
  bool initialized;
  bool has_async; /* GetAsyncCommand received: commands go on its stream */
  uint64_t async_request_id;
  bool tracing_set_up; /* setup_tracing was sent */
  bool smb_provided;   /* the SMB is the producer's own: setup_tracing carries no fd */
  bool remote;       /* came through the relay endpoint: its shared memory is emulated */
  uint32_t guest_id; /* remote: the guest machine it belongs to (0 until identified) */
  uint32_t smb_size_hint;
  uint32_t smb_page_hint;
  Perfetto__Protos__DataSourceDescriptor **data_sources;
  size_t num_data_sources, cap_data_sources;
  pp_instance *instances;
  size_t num_instances, cap_instances;
  tr_producer_shm shm; /* id, credentials, SMB, writers, buffers, stats */
} pp_producer;

struct tr_producer_port {
  uv_loop_t *loop;
  tr_ipc_host host;
  tr_ipc_host relay_host; /* the relay endpoint (relay_port.c), once started */
  bool relay_inited;
  tr_ipc_service relay_services[2];
  tr_guests guests;       /* the machines behind the relay endpoint */
  uv_timer_t stop_timer;
  tr_producer_port_config cfg;
  pp_producer *producers;
  uint32_t next_id; /* 0 once ids ran out: connections are then refused */
  unsigned handles_open;
  void (*close_cb)(void *data);
  void *close_data;
};

/* The ProducerPort service (producer_port.c), served on the producer socket and the relay
 * endpoint alike; the connection callbacks both use. */
extern const tr_ipc_service pp_producer_service;
int pp_on_connect(tr_ipc_conn *conn);
void pp_on_disconnect(tr_ipc_conn *conn);
/* Part of the port's close: releases its guest (relay_port.c), telling the caller when that
 * was the guest's last connection. */
void pp_relay_leave(pp_producer *p);
/* Counts one handle of the port closed; frees it with the last (producer_port.c). */
void pp_handle_closed(tr_producer_port *port);

pp_producer *pp_find_producer(const tr_producer_port *port, uint32_t producer_id);
/* Index of the registered data source / instance, or -1. */
ssize_t pp_find_data_source(const pp_producer *p, const char *name);
ssize_t pp_find_instance(const pp_producer *p, uint64_t id);
tr_producer_info pp_info(const pp_producer *p);
/* Counts an ABI violation, logs it (the first few per producer) and disconnects the producer
 * once it reached TR_PRODUCER_PORT_MAX_VIOLATIONS. */
void pp_violation(pp_producer *p, const char *what, const char *why);
/* Drops instance i (it must exist), keeping the others in order. */
void pp_remove_instance(pp_producer *p, size_t i);
/* Re-arms the port's stop timer for the earliest stop deadline. */
void pp_arm_stop_timer(tr_producer_port *port);
/* Take and give back cfg.queue_lock (if any) around every use of cfg.queue. */
void pp_lock_queue(const tr_producer_port *port);
void pp_unlock_queue(const tr_producer_port *port);
/* Calls queue_has_data if `queued` entries were added. */
void pp_queue_changed(tr_producer_port *port, size_t queued);

#endif
