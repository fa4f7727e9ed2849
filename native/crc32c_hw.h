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
 * which the tests check against a full CRC); sm_crc32c_cpu_has_hw() says whether this CPU has
 * the instruction (else the package is used, as before).
 *
 * The stamp's CRC update (a changed header over an unchanged tail) uses the same instruction
 * and one carry-less multiply per non-zero byte of the tail's length where the CPU has PCLMUL
 * (sm_crc32c_delta_hw), else the codec's table code.
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
/* x**(8 k 256**j - 33) mod P at [j][k], for the carry-less shift below (which adds x**33). */
static uint32_t sm_crc32c_x8n_33[4][256];
static int sm_crc32c_have_clmul = 0;

static inline uint32_t sm_crc32c_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff]
           ^ zeros[3][crc >> 24];
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

#include <wmmintrin.h>

static inline uint64_t sm_load64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);                 /* unaligned-safe; one mov */
    return v;
}

static int sm_crc32c_cpu_has_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}

static int sm_crc32c_cpu_has_clmul(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
}

/* a * b * x**33 mod P (bit-reflected): one carry-less product, reduced by the crc32
 * instruction. The x**33 is checked by the tests (and cancelled by the tables' x**-33). */
__attribute__((target("sse4.2,pclmul")))
static inline uint32_t sm_crc32c_mul_x33(uint32_t a, uint32_t b) {
    __m128i product = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)a),
                                           _mm_cvtsi32_si128((int)b), 0);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(product));
}

/* The stamp's CRC change: L(old_head ^ new_head, then tail_size zero bytes), the register of
 * the covered bytes' difference shifted over the unchanged tail. The same number as the
 * codec's table code (_updated_crc in _crecords.pyx) in ~30 instructions instead of ~700. */
__attribute__((target("sse4.2,pclmul")))
static uint32_t sm_crc32c_delta_hw(const unsigned char *old_head, const unsigned char *new_head,
                                   size_t head_size, uint64_t tail_size) {
    uint64_t crc = 0;
    size_t i = 0;
    int j;
    for (; i + 8 <= head_size; i += 8)
        crc = _mm_crc32_u64(crc, sm_load64(old_head + i) ^ sm_load64(new_head + i));
    for (; i < head_size; i++)
        crc = _mm_crc32_u8((uint32_t)crc, old_head[i] ^ new_head[i]);
    if (crc == 0)
        return 0;
    for (j = 0; j < 4; j++) {
        unsigned byte = (unsigned)(tail_size >> (8 * j)) & 0xff;
        if (byte)
            crc = sm_crc32c_mul_x33((uint32_t)crc, sm_crc32c_x8n_33[j][byte]);
    }
    return (uint32_t)crc;
}

/* Rounds of three ``stream``-byte streams while three are left: each stream's crc32 chain
 * runs beside the others (the instruction's latency hidden), then the first is shifted over
 * the second's bytes and joined to it, and again to the third (``zeros``: that shift). */
__attribute__((target("sse4.2"), always_inline))
static inline uint64_t sm_crc32c_rounds(uint64_t crc0, const unsigned char **next, size_t *len,
                                        size_t stream, uint32_t zeros[4][256]) {
    while (*len >= stream * 3) {
        uint64_t crc1 = 0, crc2 = 0;
        const unsigned char *p = *next, *end = p + stream;
        do {
            crc0 = _mm_crc32_u64(crc0, sm_load64(p));
            crc1 = _mm_crc32_u64(crc1, sm_load64(p + stream));
            crc2 = _mm_crc32_u64(crc2, sm_load64(p + 2 * stream));
            p += 8;
        } while (p < end);
        crc0 = sm_crc32c_shift(zeros, (uint32_t)crc0) ^ crc1;
        crc0 = sm_crc32c_shift(zeros, (uint32_t)crc0) ^ crc2;
        *next = p + 2 * stream;
        *len -= 3 * stream;
    }
    return crc0;
}

/* The CRC-32C of ``len`` bytes at ``buf`` continuing from ``crc`` (0 to start). */
__attribute__((target("sse4.2")))
static uint32_t sm_crc32c_hw(uint32_t crc, const unsigned char *next, size_t len) {
    uint64_t crc0 = crc ^ 0xffffffffu;
    const unsigned char *end;
    while (len && ((uintptr_t)next & 7) != 0) {
        crc0 = _mm_crc32_u8((uint32_t)crc0, *next++);
        len--;
    }
    crc0 = sm_crc32c_rounds(crc0, &next, &len, SM_CRC32C_LONG, sm_crc32c_long);
    crc0 = sm_crc32c_rounds(crc0, &next, &len, SM_CRC32C_SHORT, sm_crc32c_short);
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
static int sm_crc32c_cpu_has_clmul(void) { return 0; }

static uint32_t sm_crc32c_delta_hw(const unsigned char *old_head, const unsigned char *new_head,
                                   size_t head_size, uint64_t tail_size) {
    (void)old_head; (void)new_head; (void)head_size; (void)tail_size;
    return 0;
}

static uint32_t sm_crc32c_hw(uint32_t crc, const unsigned char *next, size_t len) {
    (void)next; (void)len;
    return crc;
}

#endif

#endif
