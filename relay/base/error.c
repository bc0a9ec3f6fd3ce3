/* error.c: names for the codes in tr_error.h. */
#include "relay/base/tr_error.h"

#include <string.h>

const char *tr_strerror(int code) {
  switch (code) {
  case TR_OK: return "success";
  case TR_ERR_NOMEM: return "out of memory or over a memory budget";
  case TR_ERR_INVAL: return "invalid argument or field out of range";
  case TR_ERR_TOO_BIG: return "declared size over the limit";
  case TR_ERR_AGAIN: return "incomplete input";
  case TR_ERR_PROTO: return "protocol violation by the peer";
  case TR_ERR_FULL: return "queue or buffer full";
  case TR_ERR_NOT_FOUND: return "not found";
  case TR_ERR_PERM: return "permission denied";
  case TR_ERR_TLS: return "TLS failure";
  case TR_ERR_CLOSED: return "closed";
  case TR_ERR_TIMEOUT: return "timed out";
  case TR_ERR_STATE: return "not valid in the current state";
  case TR_ERR_UNSUPPORTED: return "not supported";
  case TR_ERR_DECODE: return "malformed message";
  case TR_ERR_CONFIG: return "invalid configuration";
  case TR_ERR_BUSY: return "busy: try again later";
  }
  if (code < 0 && code > -4096)
    return strerror(-code);
  return "unknown error";
}
