/* CRC-32C (Castagnoli) of raw memory with the SSE4.2 crc32 instruction, for the codec's
 * per-batch CRC check (native/_crecords.pyx).
 *
 * Written here, not taken from the crc32c package, because of what a call to that package
 * costs per fetched batch: a memoryview made over the batch, a Python call and its argument
 * parsing, ~2,000 instructions for a 5.8 KB batch before the first byte is read (callgrind,
 * benchmarks/engine/hotpath_micro.py): as much again as the CRC itself. The method is the
 * package's own (Mark Adler's crc32c_hw): three independent streams per round, so the crc32
 * instruction's latency is hidden, joined by shifting a stream's CRC over the bytes of the next
 * with precomputed tables. The tables come from the codec's shift-by-zeros code (_crecords.pyx,
 * which the tests check against a full CRC); sm_crc32c_hw_ready() says whether this CPU has the
 * instruction (else the package is used, as before).
 */
#ifndef SM_CRC32C_HW_H
#define SM_CRC32C_HW_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SM_CRC32C_LONG 8192
#define SM_CRC32C_SHORT 256

/* Shift a stream's CRC register over LONG (SHORT) zero bytes: one entry per byte of it. */
static uint32_t sm_crc32c_long[4][256];
static uint32_t sm_crc32c_short[4][256];
static int sm_crc32c_have_hw = 0;

static inline uint32_t sm_crc32c_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff]
           ^ zeros[3][crc >> 24];
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

static int sm_crc32c_cpu_has_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

static inline uint64_t sm_load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);                 /* unaligned-safe; one mov */
    return v;
}

/* The CRC-32C of ``len`` bytes at ``buf`` continuing from ``crc`` (0 to start). */
__attribute__((target("sse4.2")))
static uint32_t sm_crc32c_hw(uint32_t crc, const unsigned char *next, size_t len) {
    uint64_t crc0 = crc ^ 0xffffffffu, crc1, crc2;
    const unsigned char *end;
    while (len && ((uintptr_t)next & 7) != 0) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    while (len >= SM_CRC32C_LONG * 3) {
        crc1 = crc2 = 0;
        end = next + SM_CRC32C_LONG;
        do {
            crc0 = _mm_crc32_u64(crc0, sm_load64(next));
            crc1 = _mm_crc32_u64(crc1, sm_load64(next + SM_CRC32C_LONG));
            crc2 = _mm_crc32_u64(crc2, sm_load64(next + 2 * SM_CRC32C_LONG));
            next += 8;
        } while (next < end);
        crc0 = sm_crc32c_shift(sm_crc32c_long, (uint32_t)crc0) ^ crc1;
        crc0 = sm_crc32c_shift(sm_crc32c_long, (uint32_t)crc0) ^ crc2;
        next += SM_CRC32C_LONG * 2;
        len -= SM_CRC32C_LONG * 3;
    }
    while (len >= SM_CRC32C_SHORT * 3) {
        crc1 = crc2 = 0;
        end = next + SM_CRC32C_SHORT;
        do {
            crc0 = _mm_crc32_u64(crc0, sm_load64(next));
            crc1 = _mm_crc32_u64(crc1, sm_load64(next + SM_CRC32C_SHORT));
            crc2 = _mm_crc32_u64(crc2, sm_load64(next + 2 * SM_CRC32C_SHORT));
            next += 8;
        } while (next < end);
        crc0 = sm_crc32c_shift(sm_crc32c_short, (uint32_t)crc0) ^ crc1;
        crc0 = sm_crc32c_shift(sm_crc32c_short, (uint32_t)crc0) ^ crc2;
        next += SM_CRC32C_SHORT * 2;
        len -= SM_CRC32C_SHORT * 3;
    }
    end = next + (len - (len & 7));
    while (next < end) {
        crc0 = _mm_crc32_u64(crc0, sm_load64(next));
        next += 8;
    }
    len &= 7;
    while (len) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    return (uint32_t)crc0 ^ 0xffffffffu;
}

#else   /* no SSE4.2 build: never used (sm_crc32c_have_hw stays 0) */

static int sm_crc32c_cpu_has_hw(void) { return 0; }

static uint32_t sm_crc32c_hw(uint32_t crc, const unsigned char *next, size_t len) {
    (void)next; (void)len;
    return crc;
}

#endif

#endif
