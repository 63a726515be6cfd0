/* SPDX-License-Identifier: MIT */
/* payload.c: the arrays that travel and how the client checks what comes back.
 * The client writes every word of its input, fresh per iteration; every server writes its
 * own output, each word its input's plus one (payload_transform: the server reads all of
 * the input and writes all of an output of the same size); the client reads one word per
 * 4 KiB page of the output in the timed part and compares every word outside it
 * (payload_check). The pub/sub rows (iceoryx's work) write and transform one word per
 * page only, and the -notouch rows the first word. */
#include "bench.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define WORDS_PER_PAGE (BENCH_PAGE / sizeof(uint64_t))

uint64_t payload_stamp(uint64_t iter, size_t page)
{
    return 0x5348524546000000ull ^ (iter << 28) ^ (uint64_t)page;
}

/* word: the value of word i in a fully filled array (smoke mode). */
static uint64_t word(uint64_t iter, size_t i)
{
    if (i % WORDS_PER_PAGE == 0)
        return payload_stamp(iter, i / WORDS_PER_PAGE);
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + iter;
    return x ^ (x >> 29);
}

void payload_stamp_pages(void *buf, size_t size, uint64_t iter)
{
    uint64_t *w = buf;
    size_t n = size / sizeof(uint64_t);
    for (size_t i = 0; i < n; i += WORDS_PER_PAGE)
        w[i] = payload_stamp(iter, i / WORDS_PER_PAGE);
}

void payload_fill(void *buf, size_t size, uint64_t iter)
{
    uint64_t *w = buf;
    size_t n = size / sizeof(uint64_t);
    for (size_t i = 0; i < n; i++)
        w[i] = word(iter, i);
    /* A tail shorter than a word (sizes here are multiples of 8, but be exact). */
    memset((char *)buf + n * sizeof(uint64_t), 0xa5, size % sizeof(uint64_t));
}

void payload_transform(void *dst, const void *src, size_t size, size_t step)
{
    const volatile uint64_t *s = src;
    uint64_t *d = dst;
    size_t n = size / sizeof(uint64_t);
    if (step == 0)
        step = n ? n : 1;
    for (size_t i = 0; i < n; i += step)
        d[i] = s[i] + 1;
    if (step == 1)
        for (size_t i = n * sizeof(uint64_t); i < size; i++)
            ((unsigned char *)dst)[i] = (unsigned char)(((const unsigned char *)src)[i] + 1);
}

uint64_t payload_out_word(uint64_t iter, size_t i)
{
    return word(iter, i) + 1;
}

/* check: compare with the input's words plus add (0: an input, 1: an output). */
static size_t check(const void *buf, size_t size, uint64_t iter, bool full, unsigned add)
{
    const uint64_t *w = buf;
    size_t n = size / sizeof(uint64_t), bad = 0;
    size_t step = full ? 1 : WORDS_PER_PAGE;
    for (size_t i = 0; i < n; i += step)
        bad += w[i] != word(iter, i) + add;
    if (full)
        for (size_t i = n * sizeof(uint64_t); i < size; i++)
            bad += ((const unsigned char *)buf)[i] != 0xa5 + add;
    return bad;
}

size_t payload_check(const void *buf, size_t size, uint64_t iter, bool full)
{
    return check(buf, size, iter, full, 1);
}

size_t payload_check_input(const void *buf, size_t size, uint64_t iter)
{
    return check(buf, size, iter, true, 0);
}

uint64_t payload_touch(const void *buf, size_t size)
{
    const volatile uint64_t *w = buf;
    uint64_t x = 0;
    for (size_t i = 0; i < size / sizeof(uint64_t); i += WORDS_PER_PAGE)
        x ^= w[i];
    return x;
}

void *payload_alloc_warm(size_t size)
{
    /* mmap rather than malloc: page aligned, and returned to the system at free. */
    void *p = mmap(NULL, size ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    memset(p, 0, size);
    return p;
}

void payload_free(void *buf, size_t size)
{
    if (buf)
        munmap(buf, size ? size : 1);
}
