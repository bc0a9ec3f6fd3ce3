/* fuzz_smb_chunk.c: libFuzzer target for the SMB ABI decoders a producer controls: the chunk
 * header, fragment parsing (iterator and whole-chunk pass), the scraping rule, patching, and
 * the page word + chunk state machine of an SMB whose memory is the fuzzer's input.
 * It checks that every fragment lies inside the payload, that the iterator and the one-pass
 * parser agree, and that patches land inside the payload; ASan/UBSan catch the rest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "relay/trace/chunk.h"
#include "relay/producer/smb.h"

#define MAX_PAGE TR_SMB_MAX_PAGE_SIZE

static void check_chunk(const uint8_t *chunk, size_t len) {
  tr_chunk_header h;
  if (len < TR_CHUNK_HEADER_SIZE)
    return;
  tr_chunk_header_decode(chunk, len, &h);
  const uint8_t *payload = chunk + TR_CHUNK_HEADER_SIZE;
  size_t plen = len - TR_CHUNK_HEADER_SIZE;

  tr_chunk_iter it;
  tr_chunk_fragment f;
  int rc;
  size_t n = 0;
  tr_chunk_iter_init(&it, payload, plen, h.count, h.flags);
  while ((rc = tr_chunk_iter_next(&it, &f)) == 1) {
    if (f.data < payload || f.len > plen || (size_t)(f.data - payload) > plen - f.len)
      abort();
    n++;
  }
  tr_chunk_info info;
  int prc = tr_chunk_parse(payload, plen, h.count, &info);
  if (prc != rc || info.fragments != n || info.used != it.off || info.used > plen ||
      n > h.count || info.redundant_varints > n)
    abort();

  tr_chunk_header scraped = h;
  if (tr_chunk_scrape_rule(&scraped)) {
    tr_chunk_info s;
    tr_chunk_parse(payload, plen, scraped.count, &s);
    if (s.fragments > info.fragments || s.used > plen || (scraped.flags & 0x06))
      abort();
  }
}

static void check_patch(const uint8_t *data, size_t size) {
  if (size < 8)
    return;
  uint32_t offset;
  memcpy(&offset, data, 4);
  size_t plen = size - 8;
  uint8_t *payload = malloc(plen ? plen : 1);
  if (!payload)
    return;
  memcpy(payload, data + 8, plen);
  size_t dlen = data[4] % 6; /* exercise wrong patch lengths too */
  if (tr_chunk_apply_patch(payload, plen, offset % (plen + 8), data + 4, dlen) == 0 &&
      (dlen != 4 || (size_t)(offset % (plen + 8)) + 4 > plen))
    abort();
  free(payload);
}

static void check_smb(const uint8_t *data, size_t size) {
  static _Alignas(4096) uint8_t mem[2 * MAX_PAGE];
  static uint8_t dst[MAX_PAGE];
  if (size < 1)
    return;
  size_t page_size = (size_t)TR_SMB_MIN_PAGE_SIZE << (data[0] % 4);
  size_t smb_size = 2 * page_size;
  size_t copied = size - 1 < smb_size ? size - 1 : smb_size;
  memcpy(mem, data + 1, copied);
  memset(mem + copied, 0, smb_size - copied);
  tr_smb smb;
  if (tr_smb_init_view(&smb, mem, smb_size, page_size) != 0)
    abort();

  tr_smb_scrape_iter it;
  tr_smb_scraped s;
  tr_smb_scrape_init(&it);
  unsigned visited = 0;
  while (tr_smb_scrape_next(&smb, &it, dst, sizeof(dst), &s) == 1) {
    if (s.len > page_size - TR_SMB_PAGE_HEADER_SIZE || ++visited > 2 * TR_SMB_MAX_CHUNKS)
      abort();
    if (!s.complete) /* a complete chunk is read below, the same bytes, and checked then */
      check_chunk(dst, s.len);
  }
  for (size_t page = 0; page <= smb.num_pages; page++) {
    for (size_t chunk = 0; chunk <= TR_SMB_MAX_CHUNKS; chunk++) {
      int n = tr_smb_read_chunk(&smb, page, chunk, dst, sizeof(dst));
      if (n > (int)(page_size - TR_SMB_PAGE_HEADER_SIZE))
        abort();
      if (n > 0)
        check_chunk(dst, (size_t)n);
    }
  }
  tr_smb_close(&smb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_chunk(data, size);
  check_patch(data, size);
  check_smb(data, size);
  return 0;
}
