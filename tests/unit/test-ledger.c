/* SPDX-License-Identifier: MIT */
/* test-ledger.c: proto/ledger.c, the directory and ledgers of same-tenant handoffs.
 * SipHash-2-4 against the reference vectors of the SipHash paper (key 00..0f, message
 * 00 01 .. of every length 0..63; the paper's Appendix A example is length 15); the
 * entry's life (publish, take, give, mark, unmark) on a real memfd mapping; and the
 * handshake raced by two threads, which must never let a take succeed on a slot the
 * "daemon" found unheld. */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ledger.h"

static const uint64_t sip_vectors[64] = {
    0x726fdb47dd0e0e31ull, 0x74f839c593dc67fdull, 0x0d6c8009d9a94f5aull, 0x85676696d7fb7e2dull,
    0xcf2794e0277187b7ull, 0x18765564cd99a68dull, 0xcbc9466e58fee3ceull, 0xab0200f58b01d137ull,
    0x93f5f5799a932462ull, 0x9e0082df0ba9e4b0ull, 0x7a5dbbc594ddb9f3ull, 0xf4b32f46226bada7ull,
    0x751e8fbc860ee5fbull, 0x14ea5627c0843d90ull, 0xf723ca908e7af2eeull, 0xa129ca6149be45e5ull,
    0x3f2acc7f57c29bdbull, 0x699ae9f52cbe4794ull, 0x4bc1b3f0968dd39cull, 0xbb6dc91da77961bdull,
    0xbed65cf21aa2ee98ull, 0xd0f2cbb02e3b67c7ull, 0x93536795e3a33e88ull, 0xa80c038ccd5ccec8ull,
    0xb8ad50c6f649af94ull, 0xbce192de8a85b8eaull, 0x17d835b85bbb15f3ull, 0x2f2e6163076bcfadull,
    0xde4daaaca71dc9a5ull, 0xa6a2506687956571ull, 0xad87a3535c49ef28ull, 0x32d892fad841c342ull,
    0x7127512f72f27cceull, 0xa7f32346f95978e3ull, 0x12e0b01abb051238ull, 0x15e034d40fa197aeull,
    0x314dffbe0815a3b4ull, 0x027990f029623981ull, 0xcadcd4e59ef40c4dull, 0x9abfd8766a33735cull,
    0x0e3ea96b5304a7d0ull, 0xad0c42d6fc585992ull, 0x187306c89bc215a9ull, 0xd4a60abcf3792b95ull,
    0xf935451de4f21df2ull, 0xa9538f0419755787ull, 0xdb9acddff56ca510ull, 0xd06c98cd5c0975ebull,
    0xe612a3cb9ecba951ull, 0xc766e62cfcadaf96ull, 0xee64435a9752fe72ull, 0xa192d576b245165aull,
    0x0a8787bf8ecb74b2ull, 0x81b3e73d20b49b6full, 0x7fa8220ba3b2eceaull, 0x245731c13ca42499ull,
    0xb78dbfaf3a8d83bdull, 0xea1ad565322a1a0bull, 0x60e61c23a3795013ull, 0x6606d7e446282b93ull,
    0x6ca4ecb15c5f91e1ull, 0x9f626da15c9625f3ull, 0xe51b38608ef25f57ull, 0x958a324ceb064572ull,
};

Test(ledger, siphash_reference_vectors)
{
    uint8_t key[16], in[64];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        in[i] = (uint8_t)i;
    for (size_t len = 0; len < 64; len++)
        cr_expect_eq(ledger_siphash(key, in, len), sip_vectors[len], "length %zu: %016llx", len,
                     (unsigned long long)ledger_siphash(key, in, len));
    /* the paper's worked example (Appendix A): 15 bytes */
    cr_assert_eq(ledger_siphash(key, in, 15), 0xa129ca6149be45e5ull);
}

Test(ledger, slot_in_token)
{
    uint8_t t[PROTO_TOKEN_LEN];
    memset(t, 0xab, sizeof(t));
    ledger_set_slot(t, 0x01020304u);
    cr_assert_eq(t[0], 4);
    cr_assert_eq(t[3], 1);
    cr_assert_eq(t[4], 0xab, "token[4..15] untouched");
    cr_assert_eq(ledger_slot_of(t), 0x01020304u);
    ledger_set_slot(t, LEDGER_NO_SLOT);
    cr_assert_eq(ledger_slot_of(t), LEDGER_NO_SLOT);
}

/* A directory and a ledger on real memfds of the documented sizes. */
static void *dir;
static _Atomic uint32_t *counts;
static const uint8_t key[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static void *map_memfd(size_t size)
{
    int fd = memfd_create("test-ledger", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)size), 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    cr_assert_neq(p, MAP_FAILED);
    close(fd);
    return p;
}

static void setup(void)
{
    dir = map_memfd(LEDGER_DIR_SIZE);
    counts = map_memfd(LEDGER_COUNTS_SIZE);
    ledger_dir_init(dir, 1000, key);
}

static void teardown(void)
{
    munmap(dir, LEDGER_DIR_SIZE);
    munmap((void *)counts, LEDGER_COUNTS_SIZE);
}

static void token_for(uint8_t t[PROTO_TOKEN_LEN], uint32_t slot, uint8_t fill)
{
    memset(t, fill, PROTO_TOKEN_LEN);
    ledger_set_slot(t, slot);
}

Test(ledger, header_checked, .init = setup, .fini = teardown)
{
    struct ledger_header *h = dir;
    cr_assert_eq(ledger_dir_check(dir, LEDGER_DIR_SIZE), 0);
    cr_assert_eq(h->uid, 1000u);
    cr_assert_eq(memcmp(h->key, key, 16), 0);
    cr_assert_eq(ledger_dir_check(dir, LEDGER_DIR_SIZE - 1), -EPROTO, "short mapping");
    cr_assert_eq(ledger_dir_check(NULL, LEDGER_DIR_SIZE), -EPROTO);
    h->version = 2;
    cr_assert_eq(ledger_dir_check(dir, LEDGER_DIR_SIZE), -EPROTO, "other version");
    h->version = LEDGER_VERSION;
    h->magic ^= 1;
    cr_assert_eq(ledger_dir_check(dir, LEDGER_DIR_SIZE), -EPROTO, "bad magic");
    h->magic ^= 1;
    h->nslots = 7;
    cr_assert_eq(ledger_dir_check(dir, LEDGER_DIR_SIZE), -EPROTO, "other slot count");
    cr_assert_eq(ledger_entry_at(dir, 1), (struct ledger_entry *)((uint8_t *)dir + LEDGER_HEADER + 256));
}

Test(ledger, publish_take_give, .init = setup, .fini = teardown)
{
    uint8_t t[PROTO_TOKEN_LEN], other[PROTO_TOKEN_LEN], meta[LEDGER_META_MAX];
    uint32_t mlen = 99;
    token_for(t, 7, 0x5a);
    token_for(other, 7, 0x5b);

    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 42, meta, &mlen), -EAGAIN, "nothing published");
    cr_assert_eq(ledger_buf_of(dir, 7, t), 0);
    cr_assert_eq(ledger_publish(dir, 7, 42, t, 100, "abc", 3), 0);
    struct ledger_entry *e = ledger_entry_at(dir, 7);
    cr_assert_eq(atomic_load(&e->state), LEDGER_PUBLISHED);
    cr_assert_eq(atomic_load(&e->seq) & 1u, 0u);
    cr_assert_eq(atomic_load(&e->tokhash), ledger_tokhash(dir, t), "the hash, not the token");
    cr_assert_eq(ledger_buf_of(dir, 7, t), 42);
    cr_assert_eq(ledger_buf_of(dir, 7, other), 0, "another token of the slot");

    cr_assert_eq(ledger_take(dir, counts, 7, other, 100, 42, meta, &mlen), -EAGAIN, "wrong token");
    cr_assert_eq(ledger_take(dir, counts, 7, t, 101, 42, meta, &mlen), -EAGAIN, "wrong size");
    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 43, meta, &mlen), -EAGAIN, "another buffer");
    cr_assert_eq(ledger_take(dir, counts, LEDGER_SLOTS, t, 100, 42, meta, &mlen), -EAGAIN, "no such slot");
    cr_assert_eq(mlen, 99, "ret_meta_len written only on success");
    cr_assert_eq(ledger_held(counts, 7), 0);

    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 42, meta, &mlen), 0);
    cr_assert_eq(mlen, 3);
    cr_assert_eq(memcmp(meta, "abc", 3), 0);
    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 42, meta, &mlen), 0);
    cr_assert_eq(ledger_held(counts, 7), 2);
    cr_assert_not(ledger_give(dir, counts, 7), "nobody waits");
    cr_assert_eq(ledger_held(counts, 7), 1);

    /* the daemon wants it back: no new take; the last give says to nudge */
    ledger_mark(dir, 7);
    cr_assert_eq(atomic_load(&e->state), LEDGER_LENT);
    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 42, meta, &mlen), -EAGAIN);
    cr_assert_eq(ledger_buf_of(dir, 7, t), 0);
    cr_assert_eq(ledger_held(counts, 7), 1);
    cr_assert(ledger_give(dir, counts, 7), "the daemon waits: nudge");
    cr_assert_eq(ledger_held(counts, 7), 0);
    ledger_unmark(dir, 7);
    cr_assert_eq(atomic_load(&e->state), LEDGER_FREE);
    cr_assert_eq(ledger_take(dir, counts, 7, t, 100, 42, meta, &mlen), -EAGAIN, "an old token after recycling");

    cr_assert_eq(ledger_held(counts, LEDGER_SLOTS), 0, "no slot beyond the ledger");
    cr_assert_not(ledger_give(dir, counts, LEDGER_NO_SLOT));
}

Test(ledger, meta_too_long_writes_nothing, .init = setup, .fini = teardown)
{
    uint8_t t[PROTO_TOKEN_LEN], meta[LEDGER_META_MAX + 1] = {0};
    token_for(t, 3, 1);
    uint32_t seq = atomic_load(&ledger_entry_at(dir, 3)->seq);
    cr_assert_eq(ledger_publish(dir, 3, 9, t, 10, meta, LEDGER_META_MAX + 1), -EMSGSIZE);
    cr_assert_eq(atomic_load(&ledger_entry_at(dir, 3)->seq), seq);
    cr_assert_eq(atomic_load(&ledger_entry_at(dir, 3)->state), LEDGER_FREE);
    cr_assert_eq(ledger_publish(dir, 3, 9, t, 10, meta, LEDGER_META_MAX), 0);
    uint32_t mlen;
    cr_assert_eq(ledger_take(dir, counts, 3, t, 10, 9, meta, &mlen), 0);
    cr_assert_eq(mlen, LEDGER_META_MAX);
}

Test(ledger, odd_seq_and_hostile_entry, .init = setup, .fini = teardown)
{
    uint8_t t[PROTO_TOKEN_LEN], meta[LEDGER_META_MAX];
    uint32_t mlen;
    token_for(t, 5, 2);
    cr_assert_eq(ledger_publish(dir, 5, 11, t, 64, NULL, 0), 0);
    struct ledger_entry *e = ledger_entry_at(dir, 5);

    /* a producer killed mid-write: odd seq, readers ask the daemon */
    atomic_fetch_add(&e->seq, 1u);
    cr_assert_eq(ledger_take(dir, counts, 5, t, 64, 11, meta, &mlen), -EAGAIN);
    cr_assert_eq(ledger_buf_of(dir, 5, t), 0);
    uint32_t odd = atomic_load(&e->seq);
    ledger_mark(dir, 5);
    cr_assert_eq(atomic_load(&e->seq), odd + 1, "repaired: even and changed");
    ledger_unmark(dir, 5);

    /* a scribbled meta_len never overflows the reader's buffer */
    cr_assert_eq(ledger_publish(dir, 5, 11, t, 64, NULL, 0), 0);
    atomic_store(&e->meta_len, 0xffffffffu);
    cr_assert_eq(ledger_take(dir, counts, 5, t, 64, 11, meta, &mlen), -EAGAIN);
    cr_assert_eq(ledger_held(counts, 5), 0);
}

/* The handshake raced: a consumer thread takes and gives slot 1 as fast as it can; the
 * "daemon" thread marks, reads the count, and when it reads 0 unmarks and republishes
 * under a new token (a new generation). A take that succeeded while the daemon believed
 * the slot unheld would show as the consumer holding a token of a generation the daemon
 * already recycled: the consumer checks, while holding, that the generation it took is
 * the current one. */
static _Atomic uint32_t generation;
static _Atomic int stop;
static _Atomic uint64_t takes, recycles, stale;

static void gen_token(uint8_t t[PROTO_TOKEN_LEN], uint32_t gen)
{
    memset(t, 0, PROTO_TOKEN_LEN);
    ledger_set_slot(t, 1);
    memcpy(t + 4, &gen, sizeof(gen));
}

static void *consumer(void *arg)
{
    (void)arg;
    uint8_t t[PROTO_TOKEN_LEN], meta[LEDGER_META_MAX];
    uint32_t mlen;
    while (!atomic_load(&stop)) {
        uint32_t g = atomic_load(&generation);
        gen_token(t, g);
        int r = ledger_take(dir, counts, 1, t, g, 77, meta, &mlen);
        if (r == -ESTALE) /* nothing taken but the daemon may wait: as after a give */
            continue;
        if (r)
            continue;
        atomic_fetch_add(&takes, 1);
        /* while we hold it, the daemon must not have moved to another generation */
        if (atomic_load(&generation) != g)
            atomic_fetch_add(&stale, 1);
        ledger_give(dir, counts, 1);
    }
    return NULL;
}

Test(ledger, handshake_race, .init = setup, .fini = teardown)
{
    uint8_t t[PROTO_TOKEN_LEN];
    pthread_t th;
    atomic_store(&generation, 1);
    gen_token(t, 1);
    ledger_publish(dir, 1, 77, t, 1, NULL, 0);
    cr_assert_eq(pthread_create(&th, NULL, consumer, NULL), 0);
    /* until the consumer got in often enough, or 3 s */
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (atomic_load(&takes) >= 100000 || now.tv_sec - t0.tv_sec >= 3)
            break;
        ledger_mark(dir, 1);
        if (ledger_held(counts, 1) != 0) {
            /* held: wait for the count to drop (a real daemon waits for a nudge) */
            while (ledger_held(counts, 1) != 0)
                ;
        }
        uint32_t g = atomic_load(&generation) + 1;
        atomic_store(&generation, g);
        ledger_unmark(dir, 1);
        gen_token(t, g);
        ledger_publish(dir, 1, 77, t, g, NULL, 0);
        atomic_fetch_add(&recycles, 1);
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    cr_log_info("%llu takes over %llu recycles", (unsigned long long)takes, (unsigned long long)recycles);
    cr_assert_eq(stale, 0, "a take survived a recycle %llu times", (unsigned long long)stale);
    cr_assert_gt(takes, 0, "the consumer never got in: the race was not run");
    cr_assert_eq(ledger_held(counts, 1), 0);
}
