/* trace_file.h: write_into_file, a session's trace written into a file by read passes of its
 * trace output (trace_output.h).
 *
 * Nothing here makes the service's event loop wait for long. A pass over large central
 * buffers is gathered in steps of about TR_TRACE_FILE_STEP_BYTES, one per loop iteration
 * (between two steps the buffers go on filling, as between the replies of a consumer's
 * ReadBuffers), and each step's bytes are written by a thread of the file's own
 * (file_writer.h): a write can block for seconds when the kernel throttles writeback, which on
 * the loop would be seconds without acks, clock probes or flushes, and agents dropping their
 * links. At most TR_FILE_WRITER_MAX_QUEUED bytes wait for the disk; gathering pauses until
 * there is room.
 *
 * The file is the one the config names (output_path: created, never overwritten, readable by
 * the service's user only, as traced does) or else the one the consumer passed. A pass stops at
 * max_file_size_bytes, and every later pass is refused at once. */
#ifndef TR_TRACE_FILE_H
#define TR_TRACE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "perfetto/config/trace_config.pb-c.h"
#include "service/packet_list.h"

#define TR_TRACE_FILE_STEP_BYTES (1u << 20) /* about 1 ms of gathering on an idle machine */

typedef struct tr_trace_file tr_trace_file;

/* Where a pass's packets come from: the session's trace output (trace_output.h). */
typedef struct tr_trace_file_source {
  int (*begin)(void *ud);                       /* a new pass: 0 or an error */
  int (*next)(void *ud, tr_output_packet *out); /* 1, 0 at the pass's end, or an error */
  void (*reset)(void *ud);                      /* drops the pass's state */
  void *ud;
} tr_trace_file_source;

/* Opens the file of a write_into_file config; *out is NULL when cfg does not ask for one.
 * output_fd (or -1) is taken in every case: closed unless it is the file written. Returns 0,
 * TR_ERR_CONFIG (write_into_file without a file) or TR_ERR_SYS(errno) for output_path, with
 * err filled, or TR_ERR_NOMEM. session_id is for the log. */
int tr_trace_file_open(uv_loop_t *loop, const Perfetto__Protos__TraceConfig *cfg,
                       uint64_t session_id, int output_fd, tr_trace_file **out, char *err,
                       size_t err_len);
/* Stops any pass (no done callback follows), lets the file's thread write what is queued and
 * close the file; the memory goes once its handles are closed. NULL is ignored. */
void tr_trace_file_close(tr_trace_file *f);

/* Begins a pass of src into the file, gathered `budget` bytes per loop iteration; when it is in
 * the file, done(ud, rc) runs with rc 0, TR_ERR_FULL (max_file_size_bytes reached: the pass
 * stopped there) or the error that ended it (logged); done may be NULL. Refused with
 * TR_ERR_STATE while a pass is under way, TR_ERR_FULL once the file is full. The first step
 * runs in the next loop iteration: done never runs from this call. src (copied) must stay
 * valid for the pass. */
int tr_trace_file_pass(tr_trace_file *f, const tr_trace_file_source *src, size_t budget,
                       void (*done)(void *ud, int rc), void *ud);
/* Syncs the file to disk once what is queued is written (file_writer.h): 0, or an error. */
int tr_trace_file_sync(tr_trace_file *f);
/* True from tr_trace_file_pass to its done callback. */
bool tr_trace_file_writing(const tr_trace_file *f);
/* Writes the rest of the pass under way, if any, now, blocking until it is in the file (the
 * end of a session freed at once); its done callback does not run. */
void tr_trace_file_complete_now(tr_trace_file *f);

#endif
