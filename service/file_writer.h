/* file_writer.h: buffers written to a file, in order, by a thread of its own, so that the
 * event loop never waits on the disk.
 *
 * A write into a file can block for seconds: when the kernel holds too many dirty pages it
 * makes writers wait (writeback throttling), and a slow or remote disk is slower still. On the
 * loop that is seconds without acks, probes or flushes, long enough for agents to drop their
 * links. So the loop queues buffers and the writer's thread writes them.
 *
 * Bounded: at most TR_FILE_WRITER_MAX_QUEUED bytes wait at once; a push beyond is refused and
 * on_written says when there is room again. The first write error is kept and returned by
 * every later call (the file is useless past a hole). Threads: every function runs on the
 * loop's thread; on_written runs there too (through a uv_async_t). */
#ifndef TR_FILE_WRITER_H
#define TR_FILE_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define TR_FILE_WRITER_MAX_QUEUED (16u << 20)

typedef struct tr_file_writer tr_file_writer;

/* Starts a writer of fd (taken: closed by tr_file_writer_close). on_written(ud) runs on the
 * loop after buffers were written: room may be back, or everything is written. Returns 0,
 * TR_ERR_NOMEM or a libuv error as TR_ERR_SYS (fd then closed). */
int tr_file_writer_new(uv_loop_t *loop, int fd, void (*on_written)(void *ud), void *ud,
                       tr_file_writer **out);
/* Queues n bytes of buf (taken: freed once written, or now on a refusal other than FULL); a
 * NULL buf (n 0) queues a sync instead (tr_file_writer_sync).
 * Returns 0, TR_ERR_FULL when it would pass TR_FILE_WRITER_MAX_QUEUED (buf not taken; an
 * empty writer takes any size), or the first write error. */
int tr_file_writer_push(tr_file_writer *w, uint8_t *buf, size_t n);
/* Queues a sync of the file to disk (fdatasync) after what is queued so far: fflush_post_write.
 * A file that cannot be synced (a pipe, a socket) is not an error; a failed sync is, as a failed
 * write. 0, TR_ERR_NOMEM, or the first write error. */
int tr_file_writer_sync(tr_file_writer *w);
/* How many syncs the thread has done. */
uint64_t tr_file_writer_syncs(tr_file_writer *w);
/* 0 while every write so far went well, else the first write error. */
int tr_file_writer_error(tr_file_writer *w);
/* True when nothing waits to be written. */
bool tr_file_writer_idle(tr_file_writer *w);
/* Blocks the caller until everything queued is written; returns tr_file_writer_error(). For
 * the end of a daemon or a session freed at once, where no loop iteration follows. */
int tr_file_writer_wait(tr_file_writer *w);
/* Writes what is queued, then closes the file; on_written is not called any more. The memory
 * goes once both the thread and the loop's handle are done with it. */
void tr_file_writer_close(tr_file_writer *w);

#endif
