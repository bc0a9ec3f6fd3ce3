/* port_thread.c: the producer port's thread and the two ends of its handoff (see port_thread.h).
 * On the port's side the port's callbacks become events and commands are run on the port; on
 * the link's side the events are put back among the outbox's entries and become callbacks.
 *
 * Closing: a close command closes the port on its thread; once closed, its last event (CLOSED,
 * made at start so that no allocation can lose it) tells the link's side, which joins the
 * thread and frees everything when the handles on the link's loop are closed (with the port
 * on the link's loop, that is both async handles). */
#include "agent/port_thread.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent/port_msgs.h"
#include "relay/base/log.h"
#include "relay/base/tr_error.h"

#define LOG_COMP "port-thread"
/* The time slice the port's thread asks for: it runs a few microseconds per wake-up. */
#define PORT_SLICE_NS 100000u
/* Chunks without an event wait this long in the outbox for the link's loop (port_handoff.h),
 * unless they pass URGE_BYTES (or a quarter of the outbox) first. */
#define TAKE_MS 5u
#define URGE_BYTES (256u << 10)

struct tr_port_thread {
  bool own_thread;
  uv_loop_t *port_loop; /* &own_loop, or the link's */
  uv_loop_t own_loop;
  uv_thread_t thread;
  tr_port_handoff handoff;
  uv_async_t wake_link, wake_port;
  uv_timer_t take_timer;                             /* on the link's loop */
  bool has_wake_link, has_wake_port, has_take_timer; /* initialised */
  unsigned link_handles_open;        /* handles whose close frees pt, on the link's loop */
  /* The port thread's: */
  tr_producer_port *port;
  bool port_closing;
  struct port_event *closed_event;
  /* The link loop's: */
  tr_chunkq *queue;
  struct tr_port_thread_callbacks cb;
  struct port_command *close_command; /* NULL once posted */
  void (*close_cb)(void *data);
  void *close_data;
};

/* ---- the port's side ---- */

static tr_port_thread *pt_of(tr_producer_port *port) { return tr_producer_port_data(port); }

static void post(tr_port_thread *pt, struct port_event *e) {
  if (e == NULL) {
    TR_ERROR(LOG_COMP, "out of memory: a producer event is lost");
    return;
  }
  tr_port_handoff_post_event(&pt->handoff, &e->msg);
}

static void on_connected(tr_producer_port *port, const tr_producer_info *p) {
  post(pt_of(port), tr_port_msgs_event_with_info(PORT_EV_CONNECTED, p));
}

static void on_data_sources(tr_producer_port *port, const tr_producer_info *p) {
  post(pt_of(port), tr_port_msgs_event_with_info(PORT_EV_DATA_SOURCES, p));
}

static void on_disconnected(tr_producer_port *port, const tr_producer_info *p) {
  post(pt_of(port), tr_port_msgs_event_with_info(PORT_EV_DISCONNECTED, p));
}

static void post_id(tr_producer_port *port, enum port_event_kind kind, uint32_t producer_id,
                    uint64_t id, bool timed_out) {
  struct port_event *e = tr_port_msgs_event_new(kind, producer_id);
  if (e != NULL) {
    e->id = id;
    e->timed_out = timed_out;
  }
  post(pt_of(port), e);
}

static void on_started(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id) {
  post_id(port, PORT_EV_STARTED, producer_id, instance_id, false);
}

static void on_stopped(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id,
                       bool timed_out) {
  post_id(port, PORT_EV_STOPPED, producer_id, instance_id, timed_out);
}

static void on_flush_acked(tr_producer_port *port, uint32_t producer_id, uint64_t request_id) {
  post_id(port, PORT_EV_FLUSH_ACKED, producer_id, request_id, false);
}

static void on_guest_changed(tr_producer_port *port, const tr_guest *g, bool gone) {
  post(pt_of(port), tr_port_msgs_event_guest(g, gone));
}

static void on_guest_clock(tr_producer_port *port, uint32_t guest_id,
                           const struct tr_guest_exchange *x) {
  struct port_event *e = tr_port_msgs_event_new(PORT_EV_GUEST_CLOCK, 0);
  if (e != NULL) {
    e->info.guest_id = guest_id;
    e->clock = *x;
  }
  post(pt_of(port), e);
}

/* A producer's ActivateTriggers: at most MAX_TRIGGERS_PER_CALL names go on (a call names one
 * or a few; thousands in one frame would only flood the link and the service's matching). */
#define MAX_TRIGGERS_PER_CALL 32u
static void on_triggers(tr_producer_port *port, uint32_t producer_id, const char *const *names,
                        size_t num_names) {
  if (num_names > MAX_TRIGGERS_PER_CALL) {
    TR_WARN(LOG_COMP, "producer %u activated %zu triggers in one call: the first %u go on",
            producer_id, num_names, MAX_TRIGGERS_PER_CALL);
    num_names = MAX_TRIGGERS_PER_CALL;
  }
  for (size_t i = 0; i < num_names; i++)
    post(pt_of(port), tr_port_msgs_event_trigger(producer_id, names[i]));
}

static void on_queue_has_data(tr_producer_port *port) {
  tr_port_handoff_wake_link(&pt_of(port)->handoff);
}

static int run_command(tr_producer_port *port, const struct tr_port_command *c,
                       tr_producer_stats *stats) {
  switch (c->kind) {
  case TR_PORT_SETUP:
    return tr_producer_port_setup_data_source(port, c->producer_id, c->instance_id, c->config);
  case TR_PORT_START:
    return tr_producer_port_start_data_source(port, c->producer_id, c->instance_id);
  case TR_PORT_STOP:
    return tr_producer_port_stop_data_source(port, c->producer_id, c->instance_id,
                                             c->timeout_ms);
  case TR_PORT_FLUSH:
    return tr_producer_port_flush(port, c->producer_id, c->flush_request_id, c->instance_ids,
                                  c->num_instance_ids, c->flags);
  case TR_PORT_CLEAR:
    return tr_producer_port_clear_incremental_state(port, c->producer_id, c->instance_ids,
                                                    c->num_instance_ids);
  case TR_PORT_STATS:
    return tr_producer_port_stats(port, c->producer_id, stats);
  }
  return TR_ERR_INVAL;
}

static void on_wake_port_closed(uv_handle_t *h);

static void on_port_closed(void *data) {
  tr_port_thread *pt = data;
  pt->port = NULL;
  struct port_event *e = pt->closed_event;
  pt->closed_event = NULL;
  post(pt, e);
  tr_port_handoff_closing(&pt->handoff, &pt->wake_port);
  uv_close((uv_handle_t *)&pt->wake_port, on_wake_port_closed);
}

/* Runs each command in order; its result is an event after those the command caused. */
static void on_wake_port(uv_async_t *h) {
  tr_port_thread *pt = h->data;
  tr_port_msg *m = tr_port_handoff_take_commands(&pt->handoff);
  while (m != NULL) {
    struct port_command *cmd = (struct port_command *)m;
    m = m->next;
    if (cmd->close) {
      tr_port_msgs_command_free(cmd);
      if (!pt->port_closing)
        tr_producer_port_close(pt->port, on_port_closed, pt);
      pt->port_closing = true;
      continue;
    }
    struct port_event *e = tr_port_msgs_event_new(PORT_EV_COMMAND_DONE, cmd->c.producer_id);
    if (e == NULL) {
      TR_ERROR(LOG_COMP, "out of memory: a command for producer %u is not run",
               cmd->c.producer_id);
      tr_port_msgs_command_free(cmd);
      continue;
    }
    e->cmd = cmd;
    e->result.cmd = &cmd->c;
    e->result.rc = pt->port_closing ? TR_ERR_CLOSED
                                    : run_command(pt->port, &cmd->c, &e->result.stats);
    post(pt, e);
  }
}

/* Asks the kernel for a short slice for this thread (EEVDF, Linux 6.12 and later: a fair
 * thread's sched_runtime), so that its wake-ups are served ahead of the threads that run long
 * (the link's loop, zstd, the producers' writers). Nice and policy stay as they are. Another
 * kernel keeps its default slice: this only makes the wake-ups sooner. */
static void ask_short_slice(void) {
  struct { /* the kernel's struct sched_attr, first version (glibc 2.36 has no wrapper) */
    uint32_t size, sched_policy;
    uint64_t sched_flags;
    int32_t sched_nice;
    uint32_t sched_priority;
    uint64_t sched_runtime, sched_deadline, sched_period;
  } attr = {0};
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0)
    return;
  attr.size = sizeof(attr);
  attr.sched_runtime = PORT_SLICE_NS;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0)
    TR_DEBUG(LOG_COMP, "the kernel keeps the port thread's default time slice");
}

static void run_port_loop(void *arg) {
  tr_port_thread *pt = arg;
  pthread_setname_np(pthread_self(), "tr-producers"); /* as ps -L and top -H show it */
  ask_short_slice();
  uv_run(pt->port_loop, UV_RUN_DEFAULT);
}

/* ---- the link's side ---- */

static void free_event_msg(tr_port_msg *m) { tr_port_msgs_event_free((struct port_event *)m); }
static void free_command_msg(tr_port_msg *m) {
  tr_port_msgs_command_free((struct port_command *)m);
}

/* Frees pt once no handle on the link's loop is left open. */
static void release(tr_port_thread *pt) {
  if (pt->link_handles_open > 0 && --pt->link_handles_open > 0)
    return;
  void (*cb)(void *) = pt->close_cb;
  void *data = pt->close_data;
  if (pt->own_thread && uv_loop_close(&pt->own_loop) != 0)
    TR_ERROR(LOG_COMP, "the producer port's loop still had handles at exit");
  tr_port_handoff_free(&pt->handoff, free_event_msg, free_command_msg);
  tr_port_msgs_event_free(pt->closed_event);
  tr_port_msgs_command_free(pt->close_command);
  free(pt);
  if (cb != NULL)
    cb(data);
}

static void on_link_handle_closed(uv_handle_t *h) { release(h->data); }

/* On the port's thread when it has one: that loop is closed after the join. */
static void on_wake_port_closed(uv_handle_t *h) {
  tr_port_thread *pt = h->data;
  if (!pt->own_thread)
    release(pt);
}

static void dispatch(tr_port_thread *pt, const struct port_event *e) {
  const struct tr_port_thread_callbacks *cb = &pt->cb;
  switch (e->kind) {
  case PORT_EV_CONNECTED:
    if (cb->producer_connected)
      cb->producer_connected(cb->data, &e->info);
    break;
  case PORT_EV_DATA_SOURCES:
    if (cb->data_sources_changed)
      cb->data_sources_changed(cb->data, &e->info);
    break;
  case PORT_EV_DISCONNECTED:
    if (cb->producer_disconnected)
      cb->producer_disconnected(cb->data, &e->info);
    break;
  case PORT_EV_STARTED:
    if (cb->data_source_started)
      cb->data_source_started(cb->data, e->info.id, e->id);
    break;
  case PORT_EV_STOPPED:
    if (cb->data_source_stopped)
      cb->data_source_stopped(cb->data, e->info.id, e->id, e->timed_out);
    break;
  case PORT_EV_FLUSH_ACKED:
    if (cb->flush_acked)
      cb->flush_acked(cb->data, e->info.id, e->id);
    break;
  case PORT_EV_COMMAND_DONE:
    if (cb->command_done)
      cb->command_done(cb->data, &e->result);
    break;
  case PORT_EV_TRIGGER:
    if (cb->trigger)
      cb->trigger(cb->data, e->info.id, e->trigger_name);
    break;
  case PORT_EV_GUEST:
    if (cb->guest_changed)
      cb->guest_changed(cb->data, &e->guest, e->guest_gone);
    break;
  case PORT_EV_GUEST_CLOCK:
    if (cb->guest_clock)
      cb->guest_clock(cb->data, e->info.guest_id, &e->clock);
    break;
  case PORT_EV_CLOSED:
    break;
  }
}

static void move_entries(tr_port_thread *pt, tr_chunkq *entries, uint64_t up_to_seq) {
  uint64_t next = pt->queue->next_seq;
  tr_chunkq_move(entries, pt->queue, up_to_seq);
  if (pt->queue->next_seq != next && pt->cb.queue_has_data)
    pt->cb.queue_has_data(pt->cb.data);
}

/* The port is closed and its thread has ended (or is ending: joined here). */
static void finish_close(tr_port_thread *pt) {
  if (pt->own_thread)
    uv_thread_join(&pt->thread);
  tr_port_handoff_closing(&pt->handoff, &pt->wake_link);
  uv_close((uv_handle_t *)&pt->wake_link, on_link_handle_closed);
  uv_close((uv_handle_t *)&pt->take_timer, on_link_handle_closed);
}

static void take(tr_port_thread *pt) {
  uv_timer_stop(&pt->take_timer);
  tr_chunkq entries;
  tr_port_msg *m = tr_port_handoff_take_events(&pt->handoff, &entries);
  bool closed = false;
  while (m != NULL) {
    struct port_event *e = (struct port_event *)m;
    m = m->next;
    move_entries(pt, &entries, e->msg.after_qseq);
    dispatch(pt, e);
    closed |= e->kind == PORT_EV_CLOSED;
    tr_port_msgs_event_free(e);
  }
  move_entries(pt, &entries, UINT64_MAX);
  tr_chunkq_move_drops(&entries, pt->queue);
  tr_chunkq_free(&entries);
  const tr_chunkq *q = pt->queue; /* the outbox admits what q can take */
  size_t room = q->bytes < q->max_bytes ? q->max_bytes - q->bytes : 0;
  tr_port_handoff_set_room(&pt->handoff, room);
  if (closed)
    finish_close(pt);
}

static void on_take_timer(uv_timer_t *t) { take(t->data); }

/* Events go on at once; chunks alone wait for the timer, unless they are many. */
static void on_wake_link(uv_async_t *h) {
  tr_port_thread *pt = h->data;
  if (tr_port_handoff_urgent(&pt->handoff))
    take(pt);
  else if (!uv_is_active((uv_handle_t *)&pt->take_timer))
    uv_timer_start(&pt->take_timer, on_take_timer, TAKE_MS, 0);
}

/* ---- start and close ---- */

/* A start that failed: closes what is open and frees pt (from the link's loop if a handle
 * there must close first). */
static void abandon(tr_port_thread *pt) {
  if (pt->port != NULL)
    tr_producer_port_close(pt->port, NULL, NULL);
  pt->port = NULL;
  if (pt->has_wake_port)
    uv_close((uv_handle_t *)&pt->wake_port, on_wake_port_closed);
  if (pt->own_thread) /* its thread never ran: close its handles here */
    uv_run(&pt->own_loop, UV_RUN_DEFAULT);
  if (pt->has_take_timer)
    uv_close((uv_handle_t *)&pt->take_timer, on_link_handle_closed);
  if (pt->has_wake_link)
    uv_close((uv_handle_t *)&pt->wake_link, on_link_handle_closed);
  if (!pt->has_take_timer && !pt->has_wake_link)
    release(pt);
}

static int init_wakes(tr_port_thread *pt, uv_loop_t *link_loop) {
  int rc = uv_timer_init(link_loop, &pt->take_timer);
  if (rc < 0)
    return rc;
  pt->has_take_timer = true;
  pt->link_handles_open++;
  pt->take_timer.data = pt;
  rc = uv_async_init(link_loop, &pt->wake_link, on_wake_link);
  if (rc < 0)
    return rc;
  pt->has_wake_link = true;
  pt->link_handles_open++;
  pt->wake_link.data = pt;
  pt->handoff.wake_link = &pt->wake_link;
  rc = uv_async_init(pt->port_loop, &pt->wake_port, on_wake_port);
  if (rc < 0)
    return rc;
  pt->has_wake_port = true;
  pt->link_handles_open += !pt->own_thread;
  pt->wake_port.data = pt;
  pt->handoff.wake_port = &pt->wake_port;
  return 0;
}

static int start_port(tr_port_thread *pt, const struct tr_port_thread_config *cfg) {
  tr_producer_port_config pc = {.queue = &pt->handoff.outbox,
                                .queue_lock = &pt->handoff.lock,
                                .smb_size = cfg->smb_size,
                                .max_producers = cfg->max_producers,
                                .max_producers_flag = cfg->max_producers_flag,
                                .cb = {.data = pt,
                                       .producer_connected = on_connected,
                                       .data_sources_changed = on_data_sources,
                                       .producer_disconnected = on_disconnected,
                                       .data_source_started = on_started,
                                       .data_source_stopped = on_stopped,
                                       .flush_acked = on_flush_acked,
                                       .triggers = on_triggers,
                                       .guest_changed = on_guest_changed,
                                       .guest_clock = on_guest_clock,
                                       .queue_has_data = on_queue_has_data}};
  int rc = tr_producer_port_new(pt->port_loop, &pc, &pt->port);
  if (rc < 0) {
    pt->port = NULL; /* it frees itself on its loop */
    return rc;
  }
  rc = tr_producer_port_start(pt->port, cfg->socket_path, cfg->mode);
  if (rc == 0 && cfg->relay_listen != NULL)
    rc = tr_producer_port_start_relay(pt->port, cfg->relay_listen);
  return rc;
}

int tr_port_thread_start(uv_loop_t *loop, const struct tr_port_thread_config *cfg,
                         tr_port_thread **out) {
  tr_port_thread *pt = calloc(1, sizeof(*pt));
  if (pt == NULL)
    return TR_ERR_NOMEM;
  pt->own_thread = cfg->own_thread;
  pt->queue = cfg->queue;
  pt->cb = cfg->cb;
  pt->port_loop = loop;
  size_t urge = cfg->outbox_bytes / 4 < URGE_BYTES ? cfg->outbox_bytes / 4 : URGE_BYTES;
  int rc = tr_port_handoff_init(&pt->handoff, cfg->outbox_bytes, urge);
  if (rc < 0) {
    free(pt);
    return rc;
  }
  pt->closed_event = tr_port_msgs_event_new(PORT_EV_CLOSED, 0);
  pt->close_command = calloc(1, sizeof(*pt->close_command));
  if (pt->close_command != NULL)
    pt->close_command->close = true;
  if (pt->own_thread && (rc = uv_loop_init(&pt->own_loop)) < 0) {
    pt->own_thread = false; /* no loop to close: release frees the rest */
    release(pt);
    return rc;
  }
  if (pt->own_thread)
    pt->port_loop = &pt->own_loop;
  if (pt->closed_event == NULL || pt->close_command == NULL)
    rc = TR_ERR_NOMEM;
  if (rc == 0)
    rc = init_wakes(pt, loop);
  if (rc == 0)
    rc = start_port(pt, cfg);
  if (rc == 0 && pt->own_thread)
    rc = uv_thread_create(&pt->thread, run_port_loop, pt);
  if (rc < 0) {
    abandon(pt);
    return rc;
  }
  *out = pt;
  return 0;
}

int tr_port_thread_command(tr_port_thread *pt, const struct tr_port_command *cmd) {
  if (pt->close_command == NULL)
    return TR_ERR_CLOSED;
  struct port_command *m = tr_port_msgs_command_new(cmd);
  if (m == NULL)
    return TR_ERR_NOMEM;
  tr_port_handoff_post_command(&pt->handoff, &m->msg);
  return 0;
}

size_t tr_port_thread_outbox_bytes(tr_port_thread *pt) {
  return tr_port_handoff_outbox_bytes(&pt->handoff);
}

void tr_port_thread_close(tr_port_thread *pt, void (*cb)(void *data), void *data) {
  if (pt->close_command == NULL)
    return;
  pt->close_cb = cb;
  pt->close_data = data;
  struct port_command *m = pt->close_command;
  pt->close_command = NULL;
  tr_port_handoff_post_command(&pt->handoff, &m->msg);
}
