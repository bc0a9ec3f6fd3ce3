/* test_agent_producer.c: the producer port against real producer processes. Two
 * tracerelay-loadgen processes (2 writers each) connect over a real socket to a producer port
 * running in this test's loop; their data sources are registered, set up, started, flushed
 * while they write, and stopped. The chunk queue is drained as the relay link would, into one
 * central buffer (relay/trace/trace_buffer.h), which reassembles the packets. Every packet must be
 * accounted for, per producer: the loadgen's packets_written (--stats-json) = packets
 * reassembled + packets the agent dropped (none here: the queue is large, and its drop
 * counters must say 0), with no loss reported by the central buffer.
 *
 * On a starved machine two preconditions of that run may not hold, and the test says so
 * instead of failing: a loadgen's shared memory fills while this loop cannot drain it, so the
 * loadgen drops packets as the SDK does (counted by it as packets_dropped; a packet abandoned
 * halfway shows in the buffer as a writer abort, nothing else may), and the stop may come
 * before a loadgen wrote all its --packets. What it wrote is accounted for all the same.
 *
 * A second test kills a loadgen with SIGKILL in the middle of a packet (--hang-after) while
 * its data source runs: the port scrapes its shared memory at the disconnect, as traced does,
 * so every packet it completed is in the buffer, and its unfinished packets are counted lost. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "relay/producer/producer_port.h"
#include "relay/trace/trace_buffer.h"
#include "relay/base/tr_error.h"
#include "tests/integration/loadgen_stats.h"

#define NUM_LOADGENS 2
#define FLUSH_ID_BASE 100

typedef struct lg {
  pid_t pid;
  int status;
  bool exited;
  char json[160];
  uint32_t producer_id; /* 0 until its data source was set up */
  bool started, stopped, flush_acked, gone;
  uint64_t packets_read;
  uint64_t packets_after_loss; /* read with previous_packet_dropped set */
  uint32_t loss_bits;          /* their previous_packet_dropped bits, together */
} lg;

typedef struct env {
  uv_loop_t loop;
  tr_chunkq queue;
  tr_producer_port *port;
  tr_tbuf *tbuf;
  char dir[64];
  char path[128];
  lg lgs[NUM_LOADGENS];
  int count; /* loadgens in this test */
  bool queue_has_data;
  uint64_t flush_acks_in_queue;
  uint64_t patches_applied;
  bool closed;
} env;

static lg *lg_of(env *e, uint32_t producer_id) {
  for (int i = 0; i < e->count; i++)
    if (e->lgs[i].producer_id == producer_id)
      return &e->lgs[i];
  return NULL;
}

/* As the service would: a registered track_event gets instance id 1 into a buffer of its own. */
static void on_ds_changed(tr_producer_port *port, const tr_producer_info *p) {
  env *e = tr_producer_port_data(port);
  if (lg_of(e, p->id) || p->num_data_sources != 1)
    return;
  assert_string_equal(p->data_sources[0]->name, "track_event");
  lg *l = NULL;
  for (int i = 0; i < e->count; i++)
    if (e->lgs[i].pid == p->pid) /* SO_PEERCRED names the process */
      l = &e->lgs[i];
  assert_non_null(l);
  l->producer_id = p->id;
  Perfetto__Protos__DataSourceConfig cfg = PERFETTO__PROTOS__DATA_SOURCE_CONFIG__INIT;
  cfg.name = "track_event";
  cfg.has_target_buffer = true;
  cfg.target_buffer = p->id;
  assert_int_equal(tr_producer_port_setup_data_source(port, p->id, 1, &cfg), 0);
  assert_int_equal(tr_producer_port_start_data_source(port, p->id, 1), 0);
}

static void on_started(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id) {
  env *e = tr_producer_port_data(port);
  assert_int_equal(instance_id, 1);
  lg_of(e, producer_id)->started = true;
}

static void on_stopped(tr_producer_port *port, uint32_t producer_id, uint64_t instance_id,
                       bool timed_out) {
  env *e = tr_producer_port_data(port);
  assert_int_equal(instance_id, 1);
  assert_false(timed_out);
  lg_of(e, producer_id)->stopped = true;
}

static void on_flush_acked(tr_producer_port *port, uint32_t producer_id, uint64_t id) {
  env *e = tr_producer_port_data(port);
  assert_int_equal(id, FLUSH_ID_BASE + producer_id);
  lg_of(e, producer_id)->flush_acked = true;
}

static void on_disconnected(tr_producer_port *port, const tr_producer_info *p) {
  env *e = tr_producer_port_data(port);
  lg *l = lg_of(e, p->id);
  if (l)
    l->gone = true;
}

static void on_queue(tr_producer_port *port) {
  env *e = tr_producer_port_data(port);
  e->queue_has_data = true;
}

/* The relay link's job, done here: every queue entry into the central buffer. */
static void drain(env *e) {
  tr_chunkq_entry *en;
  while ((en = tr_chunkq_pop(&e->queue)) != NULL) {
    if (en->kind == TR_CHUNKQ_CHUNK) {
      const tr_chunkq_chunk *c = &en->u.chunk;
      assert_int_equal(c->target_buffer, c->producer_id);
      assert_int_equal(c->trusted_uid, getuid());
      assert_non_null(lg_of(e, c->producer_id));
      assert_int_equal(c->trusted_pid, lg_of(e, c->producer_id)->pid);
      tr_tbuf_chunk tc = {.producer_id = c->producer_id,
                          .writer_id = c->header.writer_id,
                          .chunk_id = c->header.chunk_id,
                          .fragments = c->header.count,
                          .flags = c->header.flags,
                          .incomplete = c->incomplete,
                          .uid = (int32_t)c->trusted_uid,
                          .pid = c->trusted_pid,
                          .payload = en->data,
                          .payload_len = en->len};
      assert_int_equal(tr_tbuf_write_chunk(e->tbuf, &tc), 0);
    } else if (en->kind == TR_CHUNKQ_PATCH) {
      const tr_chunkq_patch *p = &en->u.patch;
      tr_tbuf_patch patch = {.offset = p->offset};
      memcpy(patch.data, p->data, 4);
      assert_int_equal(tr_tbuf_patch_chunk(e->tbuf, p->producer_id, p->writer_id, p->chunk_id,
                                           &patch, 1, p->has_more), 0);
      e->patches_applied++;
    } else {
      e->flush_acks_in_queue++;
    }
    tr_chunkq_entry_free(en);
  }
  e->queue_has_data = false;
}

static void reap(env *e) {
  for (int i = 0; i < e->count; i++)
    if (!e->lgs[i].exited && waitpid(e->lgs[i].pid, &e->lgs[i].status, WNOHANG) == e->lgs[i].pid)
      e->lgs[i].exited = true;
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Runs the loop (draining the queue as entries arrive) until done(e) or timeout. */
static bool run_until(env *e, bool (*done)(env *), int timeout_ms) {
  uint64_t end = now_ms() + (uint64_t)timeout_ms;
  while (!done(e)) {
    if (now_ms() > end)
      return false;
    uv_run(&e->loop, UV_RUN_NOWAIT);
    if (e->queue_has_data)
      drain(e);
    reap(e);
    usleep(500);
  }
  return true;
}

static bool all_started(env *e) {
  for (int i = 0; i < e->count; i++)
    if (!e->lgs[i].producer_id || !e->lgs[i].started)
      return false;
  return true;
}

static bool all_flushed(env *e) {
  for (int i = 0; i < e->count; i++)
    if (!e->lgs[i].flush_acked)
      return false;
  return true;
}

static bool all_stopped_and_exited(env *e) {
  for (int i = 0; i < e->count; i++)
    if (!e->lgs[i].stopped || !e->lgs[i].exited)
      return false;
  return true;
}

static void on_port_closed(void *data) { ((env *)data)->closed = true; }

/* A port for `count` loadgens on a loop of its own, listening in a new directory, its queue
 * drained into one central buffer. */
static env *env_new(int count) {
  env *e = calloc(1, sizeof(*e));
  e->count = count;
  assert_int_equal(uv_loop_init(&e->loop), 0);
  tr_chunkq_init(&e->queue, 64u << 20);
  assert_int_equal(tr_tbuf_new(64u << 20, TR_TBUF_RING_BUFFER, &e->tbuf), 0);
  strcpy(e->dir, "/tmp/tr-agent-producer-XXXXXX");
  assert_non_null(mkdtemp(e->dir));
  print_message("files in %s (removed when the test passes, kept when it fails)\n", e->dir);
  snprintf(e->path, sizeof(e->path), "%s/producer.sock", e->dir);
  tr_producer_port_config cfg = {.queue = &e->queue,
                                 .cb = {.data = e,
                                        .data_sources_changed = on_ds_changed,
                                        .data_source_started = on_started,
                                        .data_source_stopped = on_stopped,
                                        .producer_disconnected = on_disconnected,
                                        .flush_acked = on_flush_acked,
                                        .queue_has_data = on_queue}};
  assert_int_equal(tr_producer_port_new(&e->loop, &cfg, &e->port), 0);
  assert_int_equal(tr_producer_port_start(e->port, e->path, TR_PRODUCER_PORT_DEFAULT_MODE), 0);
  return e;
}

static void env_free(env *e) {
  tr_producer_port_close(e->port, on_port_closed, e);
  while (!e->closed)
    uv_run(&e->loop, UV_RUN_ONCE);
  assert_int_equal(uv_loop_close(&e->loop), 0);
  tr_tbuf_free(e->tbuf);
  tr_chunkq_free(&e->queue);
  rmdir(e->dir);
  free(e);
}

static void test_two_loadgens(void **state) {
  (void)state;
  env *e = env_new(NUM_LOADGENS);

  for (int i = 0; i < NUM_LOADGENS; i++) {
    lg *l = &e->lgs[i];
    snprintf(l->json, sizeof(l->json), "%s/stats%d.json", e->dir, i);
    char name[32];
    snprintf(name, sizeof(name), "loadgen-%d", i);
    l->pid = fork();
    if (l->pid == 0) {
      /* Packets spanning chunks (patches) on the second one; 4 chunks per page on both. */
      execl(TR_BIN_DIR "/tracerelay-loadgen", "tracerelay-loadgen", "--socket", e->path,
            "--name", name, "--writers", "2", "--packets", "1500", "--rate", "5000",
            "--packet-size", i == 0 ? "0" : "1500", "--chunks-per-page", "4", "--smb-size",
            "2048", "--stats-json", l->json, (char *)NULL);
      _exit(127);
    }
    assert_true(l->pid > 0);
  }
  assert_true(run_until(e, all_started, 10000));
  /* A flush while they write: scrape, flush command, ack after their data. */
  run_until(e, all_flushed, 150);
  for (int i = 0; i < NUM_LOADGENS; i++) {
    uint32_t id = e->lgs[i].producer_id;
    uint64_t ids[1] = {1};
    assert_int_equal(tr_producer_port_flush(e->port, id, FLUSH_ID_BASE + id, ids, 1, 0x24), 0);
  }
  assert_true(run_until(e, all_flushed, 5000));
  run_until(e, all_stopped_and_exited, 300); /* let them reach --packets */
  for (int i = 0; i < NUM_LOADGENS; i++)
    assert_int_equal(tr_producer_port_stop_data_source(e->port, e->lgs[i].producer_id, 1, 5000), 0);
  assert_true(run_until(e, all_stopped_and_exited, 15000));
  drain(e);
  assert_int_equal(e->flush_acks_in_queue, NUM_LOADGENS);

  /* Every producer's counters, read before the connections go. */
  tr_producer_stats st[NUM_LOADGENS];
  for (int i = 0; i < NUM_LOADGENS; i++) {
    /* The loadgen may already be gone (and its producer with it). */
    if (tr_producer_port_stats(e->port, e->lgs[i].producer_id, &st[i]) == 0) {
      assert_int_equal(st[i].abi_violations, 0);
      assert_int_equal(st[i].chunks_dropped, 0);
    }
  }
  tr_chunkq_drops drops = e->queue.total;
  assert_int_equal(drops.chunks + drops.patches + drops.flush_acks, 0);

  tr_tbuf_packet pkt;
  int rc;
  while ((rc = tr_tbuf_read_packet(e->tbuf, true, &pkt)) == 1) {
    lg *l = lg_of(e, pkt.producer_id);
    l->packets_read++;
    l->packets_after_loss += pkt.previous_packet_dropped != 0;
    l->loss_bits |= pkt.previous_packet_dropped;
  }
  assert_int_equal(rc, 0);
  tr_tbuf_stats ts;
  tr_tbuf_get_stats(e->tbuf, &ts);
  assert_int_equal(ts.abi_violations, 0);
  assert_int_equal(ts.packets_lost_in_gaps, 0);
  assert_int_equal(ts.invalid_packets, 0);
  assert_int_equal(ts.unpatched_chunks_dropped, 0);
  assert_int_equal(ts.patches_failed, 0);
  uint64_t all_dropped = 0;
  for (int i = 0; i < NUM_LOADGENS; i++) {
    lg *l = &e->lgs[i];
    assert_true(WIFEXITED(l->status));
    assert_int_equal(WEXITSTATUS(l->status), 0);
    uint64_t written = loadgen_stats_total(l->json, "\"packets_written\"");
    uint64_t dropped = loadgen_stats_total(l->json, "\"packets_dropped\"");
    uint64_t events = loadgen_stats_total(l->json, "\"events_written\"") +
                      loadgen_stats_total(l->json, "\"events_dropped\"");
    all_dropped += dropped;
    print_message("loadgen %d (producer %u): %llu packets written, %llu reassembled, "
                  "%llu dropped by the loadgen (SMB full)\n", i, l->producer_id,
                  (unsigned long long)written, (unsigned long long)l->packets_read,
                  (unsigned long long)dropped);
    assert_true(written > 0);
    if (events < 2 * 1500)
      print_message("loadgen %d: stopped after %llu of its 2 x 1500 events (a busy machine); "
                    "what it wrote is accounted for all the same\n",
                    i, (unsigned long long)events);
    if (dropped == 0) {
      assert_int_equal(l->packets_after_loss, 0);
    } else {
      print_message("loadgen %d: its shared memory filled while this machine was too busy to "
                    "drain it; the buffer marked the loss on %llu packets (bits 0x%x)\n", i,
                    (unsigned long long)l->packets_after_loss, l->loss_bits);
      assert_true(l->packets_after_loss <= dropped);
      assert_int_equal(l->loss_bits & ~(uint32_t)(TR_TBUF_LOSS_PRESENT | TR_TBUF_LOSS_WRITER_ABORT),
                       0);
    }
    /* agent drops are 0 (asserted above): everything written was reassembled */
    assert_int_equal(l->packets_read, written);
    unlink(l->json);
  }
  assert_true(ts.trace_writer_packet_loss <= all_dropped);
  print_message("chunks written %llu, rewritten %llu, patches %llu\n",
                (unsigned long long)ts.chunks_written, (unsigned long long)ts.chunks_rewritten,
                (unsigned long long)e->patches_applied);
  assert_true(e->patches_applied > 0);

  env_free(e);
}

static bool stats_written(env *e) { return access(e->lgs[0].json, F_OK) == 0; }
static bool gone(env *e) { return e->lgs[0].gone; }

static void test_killed_mid_write(void **state) {
  (void)state;
  enum { WRITERS = 2 };
  env *e = env_new(1);
  lg *l = &e->lgs[0];
  snprintf(l->json, sizeof(l->json), "%s/stats.json", e->dir);
  l->pid = fork();
  if (l->pid == 0) {
    /* 7 chunks a page: each writer's last chunk holds several packets when it stops. */
    execl(TR_BIN_DIR "/tracerelay-loadgen", "tracerelay-loadgen", "--socket", e->path,
          "--name", "doomed", "--writers", "2", "--hang-after", "700", "--rate", "5000",
          "--chunks-per-page", "7", "--smb-size", "2048", "--stats-json", l->json,
          (char *)NULL);
    _exit(127);
  }
  assert_true(l->pid > 0);
  assert_true(run_until(e, all_started, 10000));
  /* Its counts are written once every writer stopped inside a packet: then it dies. */
  assert_true(run_until(e, stats_written, 60000));
  assert_int_equal(kill(l->pid, SIGKILL), 0);
  assert_true(run_until(e, gone, 10000));
  drain(e);
  if (!l->exited) /* run_until may have reaped it */
    assert_int_equal(waitpid(l->pid, &l->status, 0), l->pid);
  assert_true(WIFSIGNALED(l->status) && WTERMSIG(l->status) == SIGKILL);

  tr_chunkq_drops drops = tr_chunkq_drops_of(&e->queue, l->producer_id);
  assert_int_equal(drops.chunks + drops.patches, 0);
  assert_int_equal(drops.closed_why, 0); /* it died: the agent closed nothing */
  tr_tbuf_packet pkt;
  int rc;
  while ((rc = tr_tbuf_read_packet(e->tbuf, true, &pkt)) == 1) {
    assert_int_equal(pkt.producer_id, l->producer_id);
    l->packets_read++;
  }
  assert_int_equal(rc, 0);
  tr_tbuf_stats ts;
  tr_tbuf_get_stats(e->tbuf, &ts);
  uint64_t written = loadgen_stats_total(l->json, "\"packets_written\"");
  uint64_t dropped = loadgen_stats_total(l->json, "\"packets_dropped\"");
  print_message("killed mid-write: %llu packets complete, %llu in the buffer; unfinished packets "
                "counted: %llu lost in gaps, %llu chunks left unscraped; %llu dropped by the "
                "loadgen (SMB full)\n",
                (unsigned long long)written, (unsigned long long)l->packets_read,
                (unsigned long long)ts.packets_lost_in_gaps,
                (unsigned long long)drops.unscraped_chunks, (unsigned long long)dropped);
  assert_true(written >= WRITERS * 700);
  /* Every packet up to the last complete one of each writer, nothing more. */
  assert_int_equal(l->packets_read, written);
  assert_int_equal(ts.abi_violations, 0);
  assert_int_equal(ts.invalid_packets, 0);
  /* Each writer's unfinished packet is counted: left out of its scraped chunk at the final
   * read, or its chunk (one packet begun) left unscraped (then also lost in gaps if it began
   * in the chunk before). */
  assert_true(ts.packets_lost_in_gaps + drops.unscraped_chunks >= WRITERS);
  assert_true(ts.packets_lost_in_gaps <= WRITERS && drops.unscraped_chunks <= WRITERS);

  unlink(l->json);
  env_free(e);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_two_loadgens),
      cmocka_unit_test(test_killed_mid_write),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
