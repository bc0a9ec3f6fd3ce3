/* sequence_ids.h: trusted_packet_sequence_id allocation for one tracing session (module
 * tr_tbuf; reference 4.8). Each (host, producer, writer) gets its own id, from 2 upward in
 * order of first use (1 is the service's own sequence), so sequences of different hosts never
 * share an id even when their producer and writer ids coincide, and the sequence-scoped state
 * hanging off the id (interned data, clocks 64..127) stays per host.
 * Open-addressing hash table: O(1) expected per lookup, 16 bytes per slot, at most half full. */
#ifndef TR_SEQUENCE_IDS_H
#define TR_SEQUENCE_IDS_H

#include <stdint.h>

#define TR_TBUF_FIRST_SEQUENCE_ID 2u

typedef struct tr_tbuf_seqids tr_tbuf_seqids;

/* A map that hands out at most `max_sequences` ids (>= 1). TR_ERR_INVAL, TR_ERR_NOMEM. */
int tr_tbuf_seqids_new(uint32_t max_sequences, tr_tbuf_seqids **out);
void tr_tbuf_seqids_free(tr_tbuf_seqids *m);

/* The id of (host, producer, writer), allocating the next one on first use. Returns 0,
 * TR_ERR_FULL once `max_sequences` ids are out, or TR_ERR_NOMEM. */
int tr_tbuf_seqids_get(tr_tbuf_seqids *m, uint32_t host_id, uint32_t producer_id,
                       uint16_t writer_id, uint32_t *out);

#endif
