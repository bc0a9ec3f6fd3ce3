/* fuzz_frames.h: what the targets that read relay frames share: CHECK, which aborts when a
 * promise is broken (libFuzzer reports it as a crash), and the input format of their frame
 * streams, each frame a uint32 LE length and that many bytes of RelayFrame, as on the link. */
#ifndef TR_FUZZ_FRAMES_H
#define TR_FUZZ_FRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define CHECK(c)                                                                                  \
  do {                                                                                            \
    if (!(c))                                                                                     \
      abort();                                                                                    \
  } while (0)

/* The next frame of the stream (*data, *size), which moves past it: true with its payload and
 * length; false at the end, or when the rest is shorter than its length says. */
static inline bool fuzz_next_frame(const uint8_t **data, size_t *size, const uint8_t **payload,
                                   size_t *len) {
  if (*size < 4)
    return false;
  const uint8_t *d = *data;
  size_t n = (size_t)d[0] | (size_t)d[1] << 8 | (size_t)d[2] << 16 | (size_t)d[3] << 24;
  if (n > *size - 4)
    return false;
  *payload = d + 4;
  *len = n;
  *data += 4 + n;
  *size -= 4 + n;
  return true;
}

#endif
