/* byte_buf.h: a growable run of bytes, appended to and taken whole (a link's held input, a
 * carrier's gathered output). Capacity doubles from a first size; nothing is shrunk but by
 * tr_byte_buf_free. */
#ifndef TR_BYTE_BUF_H
#define TR_BYTE_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct tr_byte_buf {
  uint8_t *data;
  size_t len, cap;
} tr_byte_buf;

/* Appends len bytes, growing to at least first_cap and then by doubling. 0, or TR_ERR_NOMEM
 * with b unchanged. */
int tr_byte_buf_append(tr_byte_buf *b, const void *data, size_t len, size_t first_cap);
/* Frees the bytes; b is empty and may be used again. */
void tr_byte_buf_free(tr_byte_buf *b);

#endif
