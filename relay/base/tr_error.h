/* tr_error.h: the one set of error codes for all of tracerelay.
 *
 * Functions return 0 (or a non-negative count) on success and a negative code on failure,
 * as libuv does. Codes from -1 to -4095 are negated errno values (TR_ERR_SYS(errno));
 * codes at or below -10000 are ours. tr_strerror() names either kind. */
#ifndef TR_ERROR_H
#define TR_ERROR_H

#define TR_ERR_SYS(e) (-(e))

enum tr_error {
  TR_OK = 0,
  TR_ERR_NOMEM = -10000,     /* allocation failed or a memory budget is exhausted */
  TR_ERR_INVAL = -10001,     /* an argument or a field is out of range */
  TR_ERR_TOO_BIG = -10002,   /* a declared size exceeds its limit */
  TR_ERR_AGAIN = -10003,     /* not enough input yet: call again with more bytes */
  TR_ERR_PROTO = -10004,     /* the peer broke the protocol */
  TR_ERR_FULL = -10005,      /* a bounded queue or buffer is full */
  TR_ERR_NOT_FOUND = -10006, /* no such id, name or entry */
  TR_ERR_PERM = -10007,      /* the caller may not do this */
  TR_ERR_TLS = -10008,       /* TLS handshake, certificate or record failure */
  TR_ERR_CLOSED = -10009,    /* the connection or object is closed */
  TR_ERR_TIMEOUT = -10010,   /* a deadline passed */
  TR_ERR_STATE = -10011,     /* the call is not valid in the current state */
  TR_ERR_UNSUPPORTED = -10012, /* a method or feature this side does not offer */
  TR_ERR_DECODE = -10013,    /* bytes that do not parse as the expected message */
  TR_ERR_CONFIG = -10014,    /* a configuration file or flag is invalid */
  TR_ERR_BUSY = -10015,      /* the peer is busy and refused us: come back later */
};

/* A short English description of any code this project returns (never NULL). */
const char *tr_strerror(int code);

#endif
