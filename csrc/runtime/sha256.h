/* Runtime, hashing: SHA-256 (FIPS 180-4) for disk-cache keys and .so checksums.
 * In: bytes, fed in any number of pieces. Out: a 32-byte digest or 64 hex digits. */
#ifndef FC_SHA256_H
#define FC_SHA256_H

#include <stddef.h>
#include <stdint.h>
#include "../core/ir.h"

typedef struct {
    uint32_t h[8];      /* chaining state */
    uint64_t nbytes;    /* message length so far */
    uint8_t block[64];  /* pending bytes of the current block */
    size_t nblock;      /* how many of them */
} FcSha256;

FC_INTERNAL void fc_sha256_init(FcSha256 *s);
FC_INTERNAL void fc_sha256_update(FcSha256 *s, const void *data, size_t n);
/* Pads, writes the digest to out and leaves s unusable until the next init. */
FC_INTERNAL void fc_sha256_final(FcSha256 *s, uint8_t out[32]);
/* Lower-case hex of a digest, NUL-terminated. */
FC_INTERNAL void fc_sha256_hex(const uint8_t digest[32], char out[65]);
/* One-shot: hex digest of n bytes. */
FC_INTERNAL void fc_sha256_hex_of(const void *data, size_t n, char out[65]);

#endif
