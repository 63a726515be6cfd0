/* SPDX-License-Identifier: MIT */
/* ledger.c: the directory and ledger of same-tenant handoffs (see ledger.h for the layout
 * and the handshake). Pure code on memory the caller mapped: every access to a shared
 * field is a seq_cst atomic, because the other side is another process that may be
 * racing (or lying); nothing here trusts what it reads beyond the slot it was asked for.
 *
 * SipHash-2-4 is written here rather than taken from a library: one 64-bit PRF per local
 * acquire did not justify a new runtime dependency (libsodium or OpenSSL) in the wheel and
 * the .deb. It is tested against the SipHash paper's reference vectors (test-ledger). */
#include "ledger.h"

#include <errno.h>
#include <string.h>

/* SipHash-2-4 ---------------------------------------------------------------------- */

static uint64_t rotl64(uint64_t x, unsigned b)
{
    return (x << b) | (x >> (64 - b));
}

static uint64_t load_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

#define SIPROUND                                                                                \
    do {                                                                                        \
        v0 += v1; v1 = rotl64(v1, 13); v1 ^= v0; v0 = rotl64(v0, 32);                          \
        v2 += v3; v3 = rotl64(v3, 16); v3 ^= v2;                                                \
        v0 += v3; v3 = rotl64(v3, 21); v3 ^= v0;                                                \
        v2 += v1; v1 = rotl64(v1, 17); v1 ^= v2; v2 = rotl64(v2, 32);                          \
    } while (0)

uint64_t ledger_siphash(const uint8_t key[16], const void *in, size_t len)
{
    const uint8_t *p = in;
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0;
    uint64_t v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0;
    uint64_t v3 = 0x7465646279746573ull ^ k1;
    size_t full = len & ~(size_t)7;

    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(p + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t i = 0; i < (len & 7); i++)
        b |= (uint64_t)p[full + i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* Tokens and the header ------------------------------------------------------------ */

uint32_t ledger_slot_of(const uint8_t token[PROTO_TOKEN_LEN])
{
    return (uint32_t)token[0] | (uint32_t)token[1] << 8 | (uint32_t)token[2] << 16 | (uint32_t)token[3] << 24;
}

void ledger_set_slot(uint8_t token[PROTO_TOKEN_LEN], uint32_t slot)
{
    for (int i = 0; i < 4; i++)
        token[i] = (uint8_t)(slot >> (8 * i));
}

uint64_t ledger_tokhash(const struct ledger_header *hdr, const uint8_t token[PROTO_TOKEN_LEN])
{
    return ledger_siphash(hdr->key, token, PROTO_TOKEN_LEN);
}

void ledger_dir_init(void *dir, uint32_t uid, const uint8_t key[16])
{
    struct ledger_header *h = dir;
    memset(h, 0, LEDGER_HEADER);
    h->magic = LEDGER_MAGIC;
    h->version = LEDGER_VERSION;
    h->nslots = LEDGER_SLOTS;
    h->uid = uid;
    h->entry_size = (uint32_t)sizeof(struct ledger_entry);
    memcpy(h->key, key, sizeof(h->key));
}

int ledger_dir_check(const void *dir, size_t dir_len)
{
    const struct ledger_header *h = dir;
    if (!dir || dir_len < LEDGER_DIR_SIZE)
        return -EPROTO;
    if (h->magic != LEDGER_MAGIC || h->version != LEDGER_VERSION || h->nslots != LEDGER_SLOTS ||
        h->entry_size != sizeof(struct ledger_entry))
        return -EPROTO;
    return 0;
}

struct ledger_entry *ledger_entry_at(void *dir, uint32_t slot)
{
    return (struct ledger_entry *)((uint8_t *)dir + LEDGER_HEADER) + slot;
}

/* Producer ------------------------------------------------------------------------- */

int ledger_publish(void *dir, uint32_t slot, uint64_t buf_id, const uint8_t token[PROTO_TOKEN_LEN],
                   uint64_t size, const void *meta, uint32_t meta_len)
{
    if (meta_len > LEDGER_META_MAX)
        return -EMSGSIZE;
    if (slot >= LEDGER_SLOTS)
        return -EINVAL;
    struct ledger_entry *e = ledger_entry_at(dir, slot);
    uint32_t s = atomic_load(&e->seq) | 1u; /* odd: writing (an odd seq left behind stays odd) */
    atomic_store(&e->seq, s);
    atomic_store(&e->state, (uint32_t)LEDGER_FREE);
    atomic_store(&e->buf_id, buf_id);
    atomic_store(&e->tokhash, ledger_tokhash(dir, token));
    atomic_store(&e->size, size);
    atomic_store(&e->meta_len, meta_len);
    atomic_store(&e->flags, 0u);
    if (meta_len)
        memcpy(e->meta, meta, meta_len);
    atomic_thread_fence(memory_order_seq_cst); /* the bytes of meta before the state says so */
    atomic_store(&e->state, (uint32_t)LEDGER_PUBLISHED);
    atomic_store(&e->seq, s + 1);
    return 0;
}

/* Consumer ------------------------------------------------------------------------- */

/* entry_matches: whether e, read under seq s, is PUBLISHED with these fields. */
static bool entry_matches(struct ledger_entry *e, uint32_t s, uint64_t tokhash, uint64_t size, uint64_t buf_id)
{
    return (s & 1u) == 0 && atomic_load(&e->state) == LEDGER_PUBLISHED && atomic_load(&e->tokhash) == tokhash &&
           atomic_load(&e->size) == size && atomic_load(&e->buf_id) == buf_id;
}

int ledger_take(void *dir, _Atomic uint32_t *counts, uint32_t slot, const uint8_t token[PROTO_TOKEN_LEN],
                uint64_t size, uint64_t expect_buf_id, void *meta, uint32_t *ret_meta_len)
{
    if (slot >= LEDGER_SLOTS || expect_buf_id == 0)
        return -EAGAIN;
    struct ledger_entry *e = ledger_entry_at(dir, slot);
    uint64_t h = ledger_tokhash(dir, token);
    uint32_t s = atomic_load(&e->seq);
    if (!entry_matches(e, s, h, size, expect_buf_id))
        return -EAGAIN;
    uint32_t mlen = atomic_load(&e->meta_len); /* read once: a racing writer cannot overflow meta */
    if (mlen > LEDGER_META_MAX)
        return -EAGAIN;
    if (mlen)
        memcpy(meta, e->meta, mlen); /* validated by the seq check below */
    atomic_fetch_add(&counts[slot], 1u);
    if (atomic_load(&e->seq) != s) {
        /* Changed under us: undo. If the daemon read the increment, it waits (LENT) for
         * this decrement and must be told, as after ledger_give. */
        atomic_fetch_sub(&counts[slot], 1u);
        return atomic_load(&e->state) == LEDGER_LENT ? -ESTALE : -EAGAIN;
    }
    *ret_meta_len = mlen;
    return 0;
}

uint64_t ledger_buf_of(void *dir, uint32_t slot, const uint8_t token[PROTO_TOKEN_LEN])
{
    if (slot >= LEDGER_SLOTS)
        return 0;
    struct ledger_entry *e = ledger_entry_at(dir, slot);
    uint32_t s = atomic_load(&e->seq);
    if ((s & 1u) || atomic_load(&e->state) != LEDGER_PUBLISHED ||
        atomic_load(&e->tokhash) != ledger_tokhash(dir, token))
        return 0;
    uint64_t buf_id = atomic_load(&e->buf_id);
    return atomic_load(&e->seq) == s ? buf_id : 0;
}

bool ledger_give(void *dir, _Atomic uint32_t *counts, uint32_t slot)
{
    if (slot >= LEDGER_SLOTS)
        return false;
    atomic_fetch_sub(&counts[slot], 1u);
    return atomic_load(&ledger_entry_at(dir, slot)->state) == LEDGER_LENT;
}

/* Daemon --------------------------------------------------------------------------- */

void ledger_mark(void *dir, uint32_t slot)
{
    if (slot >= LEDGER_SLOTS)
        return;
    struct ledger_entry *e = ledger_entry_at(dir, slot);
    atomic_store(&e->state, (uint32_t)LEDGER_LENT);
    /* even -> +2; odd (a producer died writing) -> +1: changed and even either way */
    atomic_store(&e->seq, (atomic_load(&e->seq) | 1u) + 1u);
}

void ledger_unmark(void *dir, uint32_t slot)
{
    if (slot >= LEDGER_SLOTS)
        return;
    atomic_store(&ledger_entry_at(dir, slot)->state, (uint32_t)LEDGER_FREE);
}

uint32_t ledger_held(const _Atomic uint32_t *counts, uint32_t slot)
{
    if (slot >= LEDGER_SLOTS)
        return 0;
    return atomic_load((_Atomic uint32_t *)&counts[slot]);
}
