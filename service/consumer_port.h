/* consumer_port.h: Perfetto's ConsumerPort (reference section 3) on a UNIX socket, served by
 * tr_ipc_host and backed by the service's sessions (session.h).
 *
 * Each connection may own one session, as with traced. EnableTracing's reply is held until the
 * session ends; ReadBuffers streams replies of about 32 KiB of packet data each (as traced
 * does), waiting for the socket to drain between them; a disconnect frees the consumer's
 * session unless it was detached (Detach/Attach by key, same uid only).
 *
 * Who may connect: the socket file's mode first (the kernel's check), then, if an allow-list
 * was given (tr_consumer_port_allow), the peer's SO_PEERCRED: uid 0, the service's own uid, a
 * listed uid, or a listed gid as the peer's primary or supplementary group. Anyone else is
 * closed at once, with a log line naming uid, gid and pid. Without a list, the file mode
 * alone decides (as with traced). A session is bound to the connection that made it: no
 * other connection can read, flush, stop or free it, and a detached one can be attached only
 * by a consumer with the uid that made it. */
#ifndef TR_CONSUMER_PORT_H
#define TR_CONSUMER_PORT_H

#include <sys/types.h>

#include "relay/producer/ipc_host.h"
#include "service/session.h"

#define TR_CONSUMER_DEFAULT_MODE 0660
#define TR_CONSUMER_MAX_ALLOW 32

/* Extra uids and gids allowed on the consumer socket; both empty: no peer-credential check. */
typedef struct tr_consumer_access {
  uid_t uids[TR_CONSUMER_MAX_ALLOW];
  size_t num_uids;
  gid_t gids[TR_CONSUMER_MAX_ALLOW];
  size_t num_gids;
} tr_consumer_access;

typedef struct tr_consumer_port tr_consumer_port;
typedef void (*tr_consumer_port_close_cb)(tr_consumer_port *port);

struct tr_consumer_port {
  tr_ipc_host ipc;
  tr_service *svc;
  tr_consumer_port_close_cb close_cb;
  bool ipc_ready; /* tr_ipc_host_init succeeded: the host must be closed */
  tr_consumer_access access;
};

/* Listens on path with the given mode. 0, or the tr_ipc_host_start error (e.g.
 * TR_ERR_SYS(EADDRINUSE) when another service runs there). Whatever the result, end with
 * tr_consumer_port_close. */
int tr_consumer_port_start(tr_consumer_port *port, tr_service *svc, const char *path,
                           mode_t mode);
/* Sets the allow-list for connections accepted from now on (call right after start). */
void tr_consumer_port_allow(tr_consumer_port *port, const tr_consumer_access *access);
/* Ends every session with `error` told to its consumer (EnableTracing reply), for shutdown. */
void tr_consumer_port_end_sessions(tr_consumer_port *port, const char *error);
/* Closes every connection (freeing their sessions) and the socket; cb once done. */
void tr_consumer_port_close(tr_consumer_port *port, tr_consumer_port_close_cb cb);

/* The request decoders, exposed for the fuzz target: decode args as method `method_id`
 * (1..15) and validate what the handler would. 0 or TR_ERR_DECODE / TR_ERR_CONFIG. */
int tr_consumer_port_check_request(unsigned method_id, const uint8_t *args, size_t len);

#endif
