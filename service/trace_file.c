/* trace_file.c: write_into_file in steps, written by the file's own thread (trace_file.h).
 *
 * A pass: gather a step's records into a buffer on the loop, queue it for the writer's
 * thread, and gather the next step in the next loop iteration (next_step), or once the
 * writer made room if its queue was full (on_written). When the read pass has no packet left
 * the pass is gathered; it is done once the writer has written everything. With the config's
 * compression a step is one group of about TR_PACKET_COMPRESS_FILE_GROUP bytes of packets,
 * written as one compressed packet, as traced compresses each of its write_into_file reads. */
#include "service/trace_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "relay/base/log.h"
#include "relay/base/tr_error.h"
#include "relay/trace/packet_compress.h"
#include "service/file_writer.h"

#define COMP "output"
#define FIRST_CAP (TR_TRACE_FILE_STEP_BYTES + 64u * 1024u) /* a step and a record past it */

struct tr_trace_file {
  uv_idle_t next_step; /* the next step, in the next loop iteration (a 0 ms timer would run
                        * again in the same iteration's timer phase) */
  tr_file_writer *writer;
  uint64_t session_id;
  uint64_t max_bytes; /* max_file_size_bytes, 0: none */
  uint64_t bytes;     /* records gathered so far, over all passes */
  bool full;
  bool writing;      /* a pass is under way */
  bool waiting;      /* for the writer: room in its queue, or the end of its writes */
  bool gathered_all; /* its read pass has ended */
  int pass_rc;       /* 0, or what ended it early (TR_ERR_FULL, an error) */
  tr_trace_file_source src;
  size_t budget;
  void (*done)(void *ud, int rc);
  void *done_ud;
  uint8_t *held; /* a gathered step the writer refused (its queue was full) */
  size_t held_len;
  tr_packet_compress *compress; /* the config's compression, NULL: none */
};

static int open_fd(const Perfetto__Protos__TraceConfig *cfg, int output_fd, int *out, char *err,
                   size_t err_len) {
  if (cfg->output_path && cfg->output_path[0]) {
    /* O_EXCL, as traced: a service writing where a consumer names must not clobber a file. */
    int fd = open(cfg->output_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      snprintf(err, err_len, "cannot create output_path %s: %s%s", cfg->output_path,
               strerror(e), e == EEXIST ? " (it is never overwritten: remove it or name another)"
                                        : "");
      return TR_ERR_SYS(e);
    }
    *out = fd;
    return 0;
  }
  if (output_fd < 0) {
    snprintf(err, err_len, "write_into_file needs an output file: pass an fd with EnableTracing "
                           "or set output_path");
    return TR_ERR_CONFIG;
  }
  *out = output_fd;
  return 0;
}

static void step(tr_trace_file *f);

static void on_next_step(uv_idle_t *idle) {
  uv_idle_stop(idle);
  step(idle->data);
}

/* The writer made room, or wrote everything: a pass waiting for it goes on. */
static void on_written(void *ud) {
  tr_trace_file *f = ud;
  if (f->waiting)
    step(f);
}

int tr_trace_file_open(uv_loop_t *loop, const Perfetto__Protos__TraceConfig *cfg,
                       uint64_t session_id, int output_fd, tr_trace_file **out, char *err,
                       size_t err_len) {
  int fd = -1, rc;
  *out = NULL;
  if (!cfg->write_into_file) {
    if (output_fd >= 0)
      close(output_fd);
    return 0;
  }
  if ((rc = open_fd(cfg, output_fd, &fd, err, err_len)) != 0) {
    if (output_fd >= 0)
      close(output_fd);
    return rc;
  }
  if (output_fd >= 0 && fd != output_fd)
    close(output_fd); /* output_path wins over a passed fd */
  tr_trace_file *f = calloc(1, sizeof *f);
  if (!f) {
    close(fd);
    snprintf(err, err_len, "out of memory");
    return TR_ERR_NOMEM;
  }
  int level;
  enum tr_packet_codec codec = tr_packet_compress_codec(cfg, &level);
  if (codec != TR_PACKET_CODEC_NONE &&
      (rc = tr_packet_compress_new(codec, level, TR_PACKET_COMPRESS_FILE_GROUP, &f->compress))) {
    close(fd);
    free(f);
    snprintf(err, err_len, "cannot start the trace's compression: %s", tr_strerror(rc));
    return rc;
  }
  if ((rc = tr_file_writer_new(loop, fd, on_written, f, &f->writer)) != 0) {
    tr_packet_compress_free(f->compress);
    free(f);
    snprintf(err, err_len, "cannot start the file's writer: %s", tr_strerror(rc));
    return rc;
  }
  uv_idle_init(loop, &f->next_step);
  f->next_step.data = f;
  f->session_id = session_id;
  f->max_bytes = cfg->max_file_size_bytes;
  *out = f;
  return 0;
}

int tr_trace_file_sync(tr_trace_file *f) { return tr_file_writer_sync(f->writer); }

static void on_idle_closed(uv_handle_t *h) { free(h->data); }

void tr_trace_file_close(tr_trace_file *f) {
  if (f == NULL)
    return;
  if (f->writing && !f->gathered_all)
    f->src.reset(f->src.ud);
  free(f->held);
  tr_packet_compress_free(f->compress);
  tr_file_writer_close(f->writer);
  uv_close((uv_handle_t *)&f->next_step, on_idle_closed);
}

/* Appends one packet as a TracePacket record (0x0A, varint length, bytes) to buf. */
static int put_record(tr_trace_file *f, const tr_output_packet *pkt, uint8_t **buf,
                      size_t *len, size_t *cap) {
  uint8_t head[TR_TRACE_WRITER_RECORD_HEADER_MAX];
  size_t hl = tr_trace_writer_record_header(pkt->len + pkt->trusted_len, head);
  size_t rec = hl + pkt->len + pkt->trusted_len;
  if (f->max_bytes && f->bytes + rec > f->max_bytes) {
    TR_WARN(COMP, "session %llu: max_file_size_bytes %llu reached, stopping the session",
            (unsigned long long)f->session_id, (unsigned long long)f->max_bytes);
    f->full = true;
    return TR_ERR_FULL;
  }
  if (*len + rec > *cap) {
    /* A step's buffer is made once at about its size, not doubled up to it. */
    size_t want = *cap ? *cap : f->budget < FIRST_CAP ? f->budget : FIRST_CAP;
    while (want < *len + rec)
      want *= 2;
    uint8_t *grown = realloc(*buf, want);
    if (!grown)
      return TR_ERR_NOMEM;
    *buf = grown;
    *cap = want;
  }
  memcpy(*buf + *len, head, hl);
  memcpy(*buf + *len + hl, pkt->data, pkt->len);
  memcpy(*buf + *len + hl + pkt->len, pkt->trusted, pkt->trusted_len);
  *len += rec;
  f->bytes += rec;
  return 0;
}

/* The pass's read ended: at its end (rc 0) or early (TR_ERR_FULL, an error: logged). */
static void end_gathering(tr_trace_file *f, int rc) {
  if (!f->gathered_all) {
    f->gathered_all = true;
    f->src.reset(f->src.ud);
  }
  if (rc == 0 || f->pass_rc != 0)
    return;
  f->pass_rc = rc;
  if (rc != TR_ERR_FULL)
    TR_ERROR(COMP, "session %llu: writing the trace file failed: %s",
             (unsigned long long)f->session_id, tr_strerror(rc));
}

/* Compressed: the pass's next group as one record into f->held. 1 while the pass may have
 * more, 0 at its end, or the error that ended it. */
static int gather_group(tr_trace_file *f, size_t *len, size_t *cap) {
  tr_output_packet group = {0};
  int more = 1, rc;
  while (more == 1 && !tr_packet_compress_full(f->compress)) {
    tr_output_packet pkt;
    if ((more = f->src.next(f->src.ud, &pkt)) == 1 &&
        (rc = tr_packet_compress_add(f->compress, pkt.data, pkt.len, pkt.trusted,
                                     pkt.trusted_len)) != 0)
      more = rc;
  }
  if (more < 0) {
    tr_packet_compress_reset(f->compress);
    return more;
  }
  if (tr_packet_compress_count(f->compress) == 0)
    return more;
  if ((rc = tr_packet_compress_finish(f->compress, &group.data, &group.len)) != 0 ||
      (rc = put_record(f, &group, &f->held, len, cap)) != 0)
    return rc;
  return more;
}

/* Gathers the pass's next records, up to the budget (compressed: one group), into f->held. */
static void gather(tr_trace_file *f) {
  size_t len = 0, cap = 0;
  tr_output_packet pkt;
  int rc = 1;
  if (f->compress)
    rc = gather_group(f, &len, &cap);
  else
    while (len < f->budget && (rc = f->src.next(f->src.ud, &pkt)) == 1) {
      if ((rc = put_record(f, &pkt, &f->held, &len, &cap)) != 0)
        break;
      rc = 1; /* the pass may have more */
    }
  f->held_len = len;
  if (len == 0) {
    free(f->held);
    f->held = NULL;
  }
  if (rc != 1)
    end_gathering(f, rc);
}

/* Moves the pass on. Without blocking: one gathering per call, then next_step or the
 * writer (on_written) calls again. Blocking: until the pass is in the file. Returns true once
 * the pass is in the file. */
static bool advance(tr_trace_file *f, bool blocking) {
  bool gathered = false;
  for (;;) {
    if (f->held) {
      int rc = tr_file_writer_push(f->writer, f->held, f->held_len);
      if (rc == TR_ERR_FULL) {
        f->waiting = !blocking;
        if (!blocking)
          return false;
        tr_file_writer_wait(f->writer);
        continue;
      }
      f->held = NULL; /* taken, or freed with an error */
      if (rc != 0)
        end_gathering(f, rc);
    }
    if (!f->gathered_all) {
      if (gathered && !blocking) {
        uv_idle_start(&f->next_step, on_next_step);
        return false;
      }
      gather(f);
      gathered = true;
      continue;
    }
    if (blocking)
      tr_file_writer_wait(f->writer);
    f->waiting = !tr_file_writer_idle(f->writer);
    return !f->waiting;
  }
}

static int pass_result(tr_trace_file *f) {
  f->writing = false;
  return f->pass_rc != 0 ? f->pass_rc : tr_file_writer_error(f->writer);
}

static void step(tr_trace_file *f) {
  f->waiting = false;
  if (!f->writing || !advance(f, false))
    return;
  int rc = pass_result(f);
  if (f->done)
    f->done(f->done_ud, rc);
}

static int begin_pass(tr_trace_file *f, const tr_trace_file_source *src, size_t budget) {
  int rc;
  if (f->full)
    return TR_ERR_FULL;
  if ((rc = src->begin(src->ud)) != 0)
    return rc;
  f->src = *src;
  f->budget = budget;
  f->writing = true;
  f->gathered_all = false;
  f->pass_rc = 0;
  return 0;
}

int tr_trace_file_pass(tr_trace_file *f, const tr_trace_file_source *src, size_t budget,
                       void (*done)(void *ud, int rc), void *ud) {
  int rc;
  if (f->writing)
    return TR_ERR_STATE;
  if ((rc = begin_pass(f, src, budget)) != 0)
    return rc;
  f->done = done;
  f->done_ud = ud;
  uv_idle_start(&f->next_step, on_next_step); /* done never runs from here */
  return 0;
}

bool tr_trace_file_writing(const tr_trace_file *f) { return f->writing; }

void tr_trace_file_complete_now(tr_trace_file *f) {
  uv_idle_stop(&f->next_step);
  if (!f->writing)
    return;
  advance(f, true);
  pass_result(f);
}
