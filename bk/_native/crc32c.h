/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78): the one C implementation
 * shared by the bk byte kernels. Values equal google_crc32c.value / .extend.
 *
 *   uint32_t bk_crc32c_extend(uint32_t crc, const void *data, size_t len);
 *       `crc` is a finished CRC of the bytes before `data` (0 for none), exactly
 *       like google_crc32c.extend(crc, data). Safe to call without the GIL.
 *   void bk_crc32c_init(void);
 *       builds the fallback tables and probes the CPU; call once at module
 *       import (calling the extend function first also works: it initialises
 *       lazily, and a concurrent first call only writes identical values).
 *
 * Paths, fastest first:
 *   x86-64: SSE4.2 crc32 instruction (8 bytes per step), chosen at run time with
 *           __builtin_cpu_supports, compiled per function with
 *           __attribute__((target("sse4.2"))) so no global -msse4.2 is needed.
 *           The instruction's latency is three times its issue interval, so long
 *           inputs run three independent streams over three adjacent blocks and
 *           join them (see "joining streams" below): ~3x one stream's rate;
 *   aarch64 with __ARM_FEATURE_CRC32: the ARMv8 crc32c instructions;
 *   otherwise: slicing-by-8 tables (about 1 byte/cycle).
 */
#ifndef BK_CRC32C_H
#define BK_CRC32C_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define BK_CRC32C_X86 1
#include <nmmintrin.h>
#endif

#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define BK_CRC32C_ARM 1
#include <arm_acle.h>
#endif

#define BK_CRC32C_POLY 0x82F63B78u

static uint32_t bk_crc32c_table[8][256];
/* 0 = not initialised, 1 = tables only, 2 = tables + hardware path available */
static volatile int bk_crc32c_state = 0;

/*
 * Joining streams. On the raw register (no pre/post inversion) the CRC is linear:
 *   raw(r, A || B) = zeros_|B|(raw(r, A)) ^ raw(0, B)
 * where zeros_n(r) is the register after n zero bytes, a linear map of r's 32
 * bits. It is applied with four byte-indexed tables built from the images of
 * the 32 single-bit registers: one table set per block size the streams use.
 */
#define BK_CRC32C_LONG 8192
#define BK_CRC32C_SHORT 256
static uint32_t bk_crc32c_zeros_long[4][256];
static uint32_t bk_crc32c_zeros_short[4][256];

static void bk_crc32c_zeros_table(uint32_t tab[4][256], size_t len)
{
    uint32_t image[32];
    for (int i = 0; i < 32; i++) {
        uint32_t c = 1u << i;
        for (size_t k = 0; k < len; k++)
            c = bk_crc32c_table[0][c & 0xff] ^ (c >> 8);
        image[i] = c;
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if ((b >> j) & 1)
                    v ^= image[8 * k + j];
            tab[k][b] = v;
        }
}

static inline uint32_t bk_crc32c_zeros(uint32_t tab[4][256], uint32_t c)
{
    return tab[0][c & 0xff] ^ tab[1][(c >> 8) & 0xff] ^ tab[2][(c >> 16) & 0xff] ^ tab[3][c >> 24];
}

static void bk_crc32c_init(void)
{
    if (bk_crc32c_state)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ BK_CRC32C_POLY : c >> 1;
        bk_crc32c_table[0][i] = c;
    }
    /* table[k][i] = CRC of byte i followed by k zero bytes */
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = bk_crc32c_table[0][i];
        for (int k = 1; k < 8; k++) {
            c = bk_crc32c_table[0][c & 0xff] ^ (c >> 8);
            bk_crc32c_table[k][i] = c;
        }
    }
    bk_crc32c_zeros_table(bk_crc32c_zeros_long, BK_CRC32C_LONG);
    bk_crc32c_zeros_table(bk_crc32c_zeros_short, BK_CRC32C_SHORT);
    int hw = 0;
#if defined(BK_CRC32C_X86)
    __builtin_cpu_init();
    hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#elif defined(BK_CRC32C_ARM)
    hw = 1;
#endif
    bk_crc32c_state = hw ? 2 : 1;
}

/* Works on the inverted register (no pre/post xor): the callers do that. */
static inline uint32_t bk_crc32c_sw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = bk_crc32c_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
        uint32_t lo = (uint32_t)w ^ c;
        uint32_t hi = (uint32_t)(w >> 32);
        c = bk_crc32c_table[7][lo & 0xff] ^ bk_crc32c_table[6][(lo >> 8) & 0xff] ^
            bk_crc32c_table[5][(lo >> 16) & 0xff] ^ bk_crc32c_table[4][lo >> 24] ^
            bk_crc32c_table[3][hi & 0xff] ^ bk_crc32c_table[2][(hi >> 8) & 0xff] ^
            bk_crc32c_table[1][(hi >> 16) & 0xff] ^ bk_crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = bk_crc32c_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(BK_CRC32C_X86)
/* Three streams over the three adjacent blocks of `block` bytes at p, joined into c. */
#define BK_CRC32C_X86_3WAY(block, zeros)                                       \
    while (n >= 3 * (block)) {                                                 \
        uint64_t c1 = 0, c2 = 0, w0, w1, w2;                                   \
        const unsigned char *end = p + (block);                                \
        do {                                                                   \
            memcpy(&w0, p, 8);                                                 \
            memcpy(&w1, p + (block), 8);                                       \
            memcpy(&w2, p + 2 * (block), 8);                                   \
            c64 = _mm_crc32_u64(c64, w0);                                      \
            c1 = _mm_crc32_u64(c1, w1);                                        \
            c2 = _mm_crc32_u64(c2, w2);                                        \
            p += 8;                                                            \
        } while (p < end);                                                     \
        c64 = bk_crc32c_zeros(zeros, (uint32_t)c64) ^ (uint32_t)c1;            \
        c64 = bk_crc32c_zeros(zeros, (uint32_t)c64) ^ (uint32_t)c2;            \
        p += 2 * (block);                                                      \
        n -= 3 * (block);                                                      \
    }

__attribute__((target("sse4.2")))
static uint32_t bk_crc32c_hw(uint32_t c, const unsigned char *p, size_t n)
{
    uint64_t c64 = c;
    while (n && ((uintptr_t)p & 7)) {
        c64 = _mm_crc32_u8((uint32_t)c64, *p++);
        n--;
    }
    BK_CRC32C_X86_3WAY(BK_CRC32C_LONG, bk_crc32c_zeros_long)
    BK_CRC32C_X86_3WAY(BK_CRC32C_SHORT, bk_crc32c_zeros_short)
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c64;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}
#elif defined(BK_CRC32C_ARM)
static uint32_t bk_crc32c_hw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) {
        c = __crc32cb(c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __crc32cd(c, w);
        p += 8;
        n -= 8;
    }
    while (n--)
        c = __crc32cb(c, *p++);
    return c;
}
#endif

static inline uint32_t bk_crc32c_extend(uint32_t crc, const void *data, size_t len)
{
    if (!bk_crc32c_state)
        bk_crc32c_init();
    uint32_t c = ~crc;
#if defined(BK_CRC32C_X86) || defined(BK_CRC32C_ARM)
    if (bk_crc32c_state == 2)
        return ~bk_crc32c_hw(c, (const unsigned char *)data, len);
#endif
    return ~bk_crc32c_sw(c, (const unsigned char *)data, len);
}

/* Test hook: force the table path (to check it against the hardware path). */
static inline uint32_t bk_crc32c_extend_sw(uint32_t crc, const void *data, size_t len)
{
    if (!bk_crc32c_state)
        bk_crc32c_init();
    return ~bk_crc32c_sw(~crc, (const unsigned char *)data, len);
}

#endif /* BK_CRC32C_H */
