/* tls.h: mutually-authenticated TLS 1.2 sessions over any byte transport (mbedTLS 2.28).
 *
 * A session knows nothing of sockets. The caller moves ciphertext in and out of it:
 *
 *   received bytes --tr_tls_feed_cipher--> [session] --tr_tls_take_cipher--> bytes to send
 *                       tr_tls_write(plaintext) -->      --> tr_tls_read(plaintext)
 *
 * and calls tr_tls_handshake() until it returns 0. Both directions use bounded buffers
 * (TR_TLS_CIPHER_BUFFER bytes each): feed accepts only what fits, and write refuses with
 * TR_ERR_AGAIN until the pending ciphertext has been taken.
 *
 * What a completed handshake guarantees:
 * - server side: the client presented a certificate that chains to the configured CA, is
 *   within its validity period and carries the clientAuth extended key usage (a certificate
 *   without the extension is refused too). tr_tls_peer_name() is the client's machine name:
 *   its first SAN dNSName, else its CN, and it is 1..64 characters of [A-Za-z0-9._-].
 * - client side: the server's certificate chains to the CA, is valid, carries serverAuth (or no
 *   EKU) and names the expected server name in its SAN (or CN).
 * - ciphersuites are ECDHE-ECDSA / ECDHE-RSA with one of the AEAD ciphers of tls_ciphers.h
 *   (AES-CCM, ChaCha20-Poly1305, AES-GCM) that both sides' lists name; the server's order wins.
 * - both sides: ECDHE over X25519, P-256 or P-384, signatures with SHA-256 or stronger, and a
 *   peer certificate signed with SHA-256+ on a P-256/P-384 or RSA >= 2048 key
 *   (tr_tls_ciphers_restrict).
 *
 * Every failure is TR_ERR_TLS (or TR_ERR_CLOSED for a clean close_notify); tr_tls_last_error()
 * then says why in words an operator can act on. Errors are sticky: after one, every call
 * returns the same code. Ciphertext the session produced while failing (a fatal alert for the
 * peer) can still be taken and sent.
 *
 * Threads: a config is made, referenced and freed on one thread (the event loop), and so are
 * sessions; a session may be driven by another thread as long as one thread at a time touches
 * it, and sessions of one config may run on several threads at once (tls.c says why that is
 * safe: mbedTLS is built with MBEDTLS_THREADING_C, shared tables are made up front).
 * Ownership: a config is reference-counted. tr_tls_config_new() returns one reference; every
 * session holds its own. Reloading certificates (SIGHUP) is: build a new config, use it for
 * new sessions, drop the old reference; existing sessions keep the old config alive until
 * they are freed. */
#ifndef TR_TLS_H
#define TR_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Plaintext bytes one TLS record carries (the default 16 KiB; max_fragment_length is not
 * negotiated). Batch writes up to this size: each tr_tls_write() call makes at most one record. */
#define TR_TLS_RECORD_PLAINTEXT 16384
/* Capacity of each ciphertext buffer of a session: two full records. */
#define TR_TLS_CIPHER_BUFFER (2 * (TR_TLS_RECORD_PLAINTEXT + 512))
/* Longest machine name a peer certificate may carry. */
#define TR_TLS_MAX_NAME 64

typedef struct tr_tls_config tr_tls_config;
typedef struct tr_tls_session tr_tls_session;

enum tr_tls_role { TR_TLS_SERVER, TR_TLS_CLIENT };

struct tr_tls_config_opts {
  enum tr_tls_role role;
  const char *ca_path;   /* PEM CA certificate(s) that peer certificates must chain to */
  const char *cert_path; /* PEM certificate of this side (may be followed by intermediates) */
  const char *key_path;  /* PEM private key matching cert_path */
  /* --cipher: comma-separated cipher names (tls_ciphers.h), preferred first; NULL for the
   * default (all, cheapest first). A client offers only these; a server accepts only these,
   * and its order decides. A bad name is TR_ERR_CONFIG. */
  const char *ciphers;
  /* --crl: PEM or DER X.509 CRL(s) of the CA; NULL for none. A peer certificate it lists is
   * refused at the handshake (and tr_tls_peer_refusal finds it on live sessions). mbedTLS
   * also refuses every peer of a CRL past its nextUpdate: make-certs.sh --revoke rewrites it. */
  const char *crl_path;
  /* --deny: machine names refused whatever their certificate (num_deny of them). */
  const char *const *deny;
  size_t num_deny;
};

/* Loads the CA, certificate and key and seeds a CTR-DRBG from the system entropy. On failure
 * returns TR_ERR_CONFIG (unreadable or invalid file, key not matching the certificate, a key
 * file others can read, or its group when it is our own user's, as OpenSSH refuses one; a key
 * not on P-256/P-384 nor RSA >= 2048),
 * TR_ERR_NOMEM or TR_ERR_TLS, and writes a reason naming the file and the fix into err
 * (err_len bytes, may be 0). */
int tr_tls_config_new(const struct tr_tls_config_opts *opts, tr_tls_config **out, char *err,
                      size_t err_len);
/* Adds a reference; returns cfg. */
tr_tls_config *tr_tls_config_ref(tr_tls_config *cfg);
/* Drops a reference; the last one frees the config. NULL is ignored. */
void tr_tls_config_unref(tr_tls_config *cfg);
enum tr_tls_role tr_tls_config_role(const tr_tls_config *cfg);
/* The name in this side's own certificate (--cert), by the same rule that makes the peer name
 * on the other end: the first SAN dNSName, else the CN. For an agent it is the machine name the
 * service will give it. Copies it into out (cap >= TR_TLS_MAX_NAME + 1) and returns 0, or
 * TR_ERR_CONFIG if the certificate carries no valid machine name (out then holds it made
 * printable, for the error message). */
int tr_tls_config_own_name(const tr_tls_config *cfg, char *out, size_t cap);

/* When certificates stop being valid, as Unix time (seconds): this side's own (--cert), and
 * the earliest of the CA certificates'. */
int64_t tr_tls_config_cert_expiry(const tr_tls_config *cfg);
int64_t tr_tls_config_ca_expiry(const tr_tls_config *cfg);
/* The earliest nextUpdate of its --crl (past it, mbedTLS refuses every peer), or 0 without. */
int64_t tr_tls_config_crl_next_update(const tr_tls_config *cfg);
/* True if cfg's --deny names name. */
bool tr_tls_config_denies(const tr_tls_config *cfg, const char *name);

/* A session using cfg (which it references). server_name is required for a client: the name the
 * server certificate must carry; servers pass NULL. Returns 0, TR_ERR_INVAL, TR_ERR_NOMEM or
 * TR_ERR_TLS. */
int tr_tls_session_new(tr_tls_config *cfg, const char *server_name, tr_tls_session **out);
/* Frees the session (no close_notify is sent; see tr_tls_close_notify). NULL is ignored. */
void tr_tls_session_free(tr_tls_session *s);

/* Hands received ciphertext to the session. Returns how many bytes it accepted (0..len): less
 * than len when its input buffer is full; drive the session (handshake/read) and feed the rest.
 * If its buffer cannot be allocated it takes nothing, and the next handshake, read or write
 * fails with TR_ERR_NOMEM. */
size_t tr_tls_feed_cipher(tr_tls_session *s, const void *data, size_t len);
/* Ciphertext waiting to be sent, in bytes. */
size_t tr_tls_cipher_pending(const tr_tls_session *s);
/* Moves up to cap bytes of ciphertext to send into buf; returns how many. */
size_t tr_tls_take_cipher(tr_tls_session *s, void *buf, size_t cap);

/* Advances the handshake: 0 once it is complete (also on later calls), TR_ERR_AGAIN while it
 * waits for the peer (take and send pending ciphertext, feed what arrives, call again),
 * TR_ERR_TLS on failure, TR_ERR_CLOSED if the peer closed. */
int tr_tls_handshake(tr_tls_session *s);
bool tr_tls_handshake_done(const tr_tls_session *s);

/* Encrypts up to TR_TLS_RECORD_PLAINTEXT bytes of buf as one record. Returns the number of
 * plaintext bytes consumed (> 0 when len > 0), TR_ERR_AGAIN when the output buffer has no
 * room for a full record (take the pending ciphertext first), TR_ERR_STATE before the
 * handshake is done, TR_ERR_TLS after a failure. */
int tr_tls_write(tr_tls_session *s, const void *buf, size_t len);
/* Decrypts into buf. Returns the number of bytes (> 0), TR_ERR_AGAIN when more ciphertext is
 * needed, TR_ERR_CLOSED once the peer sent close_notify, TR_ERR_STATE before the handshake is
 * done, TR_ERR_TLS on failure. */
int tr_tls_read(tr_tls_session *s, void *buf, size_t cap);
/* Queues a close_notify alert (take and send it). Returns 0, TR_ERR_AGAIN when the output
 * buffer is full (take ciphertext, call again) or TR_ERR_TLS. */
int tr_tls_close_notify(tr_tls_session *s);

/* The peer's machine name (see the top of this file), or NULL before the handshake is done.
 * On a client: the server certificate's name if it is a valid machine name, else NULL. */
const char *tr_tls_peer_name(const tr_tls_session *s);
/* Name of the negotiated ciphersuite ("TLS-ECDHE-ECDSA-WITH-AES-128-GCM-SHA256"), or NULL. */
const char *tr_tls_ciphersuite(const tr_tls_session *s);
/* Why the last call failed, for operators: e.g. "certificate verify failed: peer certificate
 * 'web-1' expired on 2026-11-20; issue a new one with certs/make-certs.sh". "" if none. */
const char *tr_tls_last_error(const tr_tls_session *s);

/* The peer certificate's notAfter as Unix time (seconds), or 0 before the handshake. */
int64_t tr_tls_peer_expiry(const tr_tls_session *s);
/* Whether an established session's peer would be refused by cfg (a config loaded later, on
 * SIGHUP): its certificate is on cfg's CRL, or its name is denied. Writes why into why (cap
 * bytes) and returns true; false for a peer cfg still accepts (or before the handshake). */
bool tr_tls_peer_refusal(const tr_tls_session *s, const tr_tls_config *cfg, char *why,
                         size_t cap);

/* True if name is a valid machine name: 1..TR_TLS_MAX_NAME characters of [A-Za-z0-9._-]. */
bool tr_tls_valid_machine_name(const char *name, size_t len);

#endif
