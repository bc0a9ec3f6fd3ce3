/* byte_buf.c: a growable run of bytes (see byte_buf.h). */
#include "relay/base/byte_buf.h"

#include <stdlib.h>
#include <string.h>

#include "relay/base/tr_error.h"

int tr_byte_buf_append(tr_byte_buf *b, const void *data, size_t len, size_t first_cap) {
  if (len > SIZE_MAX / 2 - b->len)
    return TR_ERR_NOMEM;
  if (b->len + len > b->cap) {
    size_t cap = b->cap ? b->cap : first_cap ? first_cap : 64;
    while (cap < b->len + len)
      cap *= 2;
    uint8_t *grown = realloc(b->data, cap);
    if (grown == NULL)
      return TR_ERR_NOMEM;
    b->data = grown;
    b->cap = cap;
  }
  memcpy(b->data + b->len, data, len);
  b->len += len;
  return 0;
}

void tr_byte_buf_free(tr_byte_buf *b) {
  free(b->data);
  *b = (tr_byte_buf){0};
}
