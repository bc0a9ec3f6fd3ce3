/* consumer_port.h: Perfetto's ConsumerPort (reference section 3) on a UNIX socket, served by
 * tr_ipc_host and backed by the service's sessions (session.h).
 *
 * Each connection may own one session, as with traced. EnableTracing's reply is held until the
 * session ends; ReadBuffers streams replies of about 32 KiB of packet data each (as traced
 * does), waiting for the socket to drain between them; a disconnect frees the consumer's
 * session unless it was detached (Detach/Attach by key, same uid only). */
#ifndef TR_CONSUMER_PORT_H
#define TR_CONSUMER_PORT_H

#include <sys/types.h>

#include "relay/ipc_host.h"
#include "service/session.h"

#define TR_CONSUMER_DEFAULT_MODE 0660

typedef struct tr_consumer_port tr_consumer_port;
typedef void (*tr_consumer_port_close_cb)(tr_consumer_port *port);

struct tr_consumer_port {
  tr_ipc_host ipc;
  tr_service *svc;
  tr_consumer_port_close_cb close_cb;
  bool ipc_ready; /* tr_ipc_host_init succeeded: the host must be closed */
};

/* Listens on path with the given mode. 0, or the tr_ipc_host_start error (e.g.
 * TR_ERR_SYS(EADDRINUSE) when another service runs there). Whatever the result, end with
 * tr_consumer_port_close. */
int tr_consumer_port_start(tr_consumer_port *port, tr_service *svc, const char *path,
                           mode_t mode);
/* Ends every session with `error` told to its consumer (EnableTracing reply), for shutdown. */
void tr_consumer_port_end_sessions(tr_consumer_port *port, const char *error);
/* Closes every connection (freeing their sessions) and the socket; cb once done. */
void tr_consumer_port_close(tr_consumer_port *port, tr_consumer_port_close_cb cb);

/* The request decoders, exposed for the fuzz target: decode args as method `method_id`
 * (1..15) and validate what the handler would. 0 or TR_ERR_DECODE / TR_ERR_CONFIG. */
int tr_consumer_check_request(unsigned method_id, const uint8_t *args, size_t len);

#endif
