/* byte_size.h: a size in bytes as an operator types it in a flag (`--max-buffer-memory 12G`)
 * and as an error message or log line shows it back ("40 GiB"), in one place so both read the
 * same units. Units are binary (K = KiB = 1024). Pure. */
#ifndef TR_BYTE_SIZE_H
#define TR_BYTE_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* "N" (bytes) or "N" followed by K, M, G or T, optionally with "iB" or "B" after it (12G, 12GiB,
 * 512MB: all binary). 0, or TR_ERR_CONFIG for anything else, 0 bytes, or more than 2^63. */
int tr_byte_size_parse(const char *s, uint64_t *out);

/* v in the largest unit it has at least one of: exact ("512 MiB", "40 GiB", "3 bytes") or with
 * one decimal ("1.5 GiB") when it is not a whole number of that unit. Always NUL-ended. */
#define TR_BYTE_SIZE_TEXT 24
void tr_byte_size_format(uint64_t v, char out[TR_BYTE_SIZE_TEXT]);

#endif
