/* SPDX-License-Identifier: MIT */
/* handoff.c: see handoff.h. SipHash-2-4 is written here rather than taken from a library:
 * one 64-bit PRF per publish and take did not justify a new runtime dependency (libsodium
 * or OpenSSL) in the wheel and the .deb; it is tested against the SipHash paper's reference
 * vectors (test-handoff). Every access is seq_cst (the default of <stdatomic.h>): the
 * argument (docs/architecture.md) is made in the single total order, and the cost is a
 * locked instruction per step, as the CAS is anyway.
 *
 * HANDOFF_STEP(n) marks the points between two stores of a step; it is empty here, and a
 * test that compiles this file itself defines it to stop (and be killed) exactly there.
 * HANDOFF_BROKEN_ORDER (tests only) stores the journal before the word at take: the order
 * the argument forbids, which test-handoff-broken.c shows recycling under a live hold. */
#include "handoff.h"

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

uint64_t handoff_siphash(const uint8_t key[16], const void *in, size_t len)
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

/* Tokens ------------------------------------------------------------------------------ */

uint32_t handoff_slot_of(const uint8_t token[PROTO_TOKEN_LEN])
{
    return (uint32_t)token[0] | (uint32_t)token[1] << 8 | (uint32_t)token[2] << 16 | (uint32_t)token[3] << 24;
}

void handoff_set_slot(uint8_t token[PROTO_TOKEN_LEN], uint32_t slot)
{
    for (int i = 0; i < 4; i++)
        token[i] = (uint8_t)(slot >> (8 * i));
}

#ifndef HANDOFF_STEP
#define HANDOFF_STEP(n) ((void)0)
#endif

size_t handoff_size(uint32_t nslots)
{
    return (size_t)HANDOFF_HEADER + (size_t)nslots * (sizeof(struct handoff_entry) + sizeof(struct handoff_meta));
}

void handoff_init(void *tab, uint32_t nslots, uint32_t uid, const uint8_t key[16])
{
    struct handoff_header *h = tab;
    h->magic = HANDOFF_MAGIC;
    h->version = HANDOFF_VERSION;
    h->nslots = nslots;
    h->uid = uid;
    h->entry_size = sizeof(struct handoff_entry);
    memcpy(h->key, key, sizeof(h->key));
    for (unsigned c = 0; c < HANDOFF_CLASSES; c++) {
        atomic_store(&h->head[c], 0);
        atomic_store(&h->cap[c], 0);
        atomic_store(&h->lo[c], 0);
    }
}

void handoff_close(void *tab)
{
    atomic_store(&((struct handoff_header *)tab)->closed, 1u);
}

int handoff_check(const void *tab, size_t len)
{
    const struct handoff_header *h = tab;
    if (len < HANDOFF_HEADER || h->magic != HANDOFF_MAGIC || h->version != HANDOFF_VERSION ||
        h->entry_size != sizeof(struct handoff_entry) || h->nslots > HANDOFF_MAX_SLOTS ||
        handoff_size(h->nslots) != len)
        return -EPROTO;
    return 0;
}

struct handoff_entry *handoff_entry_at(void *tab, uint32_t slot)
{
    return (struct handoff_entry *)((char *)tab + HANDOFF_HEADER) + slot;
}

/* nslots: the table's size, capped: the header is the tenant's to scribble on, and every
 * table the daemon makes has HANDOFF_MAX_SLOTS entries (handoff_size), so no scribbled
 * value sends a step past the mapping; a smaller one only refuses the uid's own steps. */
static uint32_t cap_slots(const void *tab)
{
    uint32_t n = atomic_load((const _Atomic uint32_t *)&((const struct handoff_header *)tab)->nslots);
    return n < HANDOFF_MAX_SLOTS ? n : HANDOFF_MAX_SLOTS;
}

/* nslots: 0 once the daemon took the table back (every step refuses). */
static uint32_t nslots(const void *tab)
{
    return atomic_load(&((const struct handoff_header *)tab)->closed) ? 0 : cap_slots(tab);
}

struct handoff_meta *handoff_meta_at(void *tab, uint32_t slot)
{
    /* after the entries of the table as made (the header's nslots at init is the size the
     * maker used; callers pass slots below nslots(), so this stays inside the mapping) */
    char *entries = (char *)tab + HANDOFF_HEADER;
    return (struct handoff_meta *)(entries + (size_t)cap_slots(tab) * sizeof(struct handoff_entry)) + slot;
}

int handoff_class(const void *tab, uint64_t size)
{
    const struct handoff_header *h = tab;
    for (unsigned c = 0; c < HANDOFF_CLASSES; c++) {
        uint64_t cap = atomic_load(&h->cap[c]);
        if (cap == 0)
            return -1; /* classes are recorded in order: the first unused ends them */
        if (atomic_load(&h->lo[c]) <= size && size <= cap)
            return (int)c;
    }
    return -1;
}

void handoff_set_class(void *tab, uint32_t cls, uint64_t cap, uint64_t lo)
{
    struct handoff_header *h = tab;
    if (cls >= HANDOFF_CLASSES)
        return;
    atomic_store(&h->lo[cls], lo);
    atomic_store(&h->cap[cls], cap);
}

/* push: slot (FREE, not LISTED, so off every list) onto its class's list: LISTED first,
 * then the link. A push that cannot link within `tries` clears LISTED again. */
static bool push(void *tab, uint32_t slot, unsigned tries)
{
    struct handoff_header *h = tab;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    uint32_t cls = atomic_load(&e->cls);
    if (cls >= HANDOFF_CLASSES)
        return false;
    uint64_t w = atomic_load(&e->word);
    if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || (w & (HANDOFF_LISTED | HANDOFF_OUT)) ||
        !atomic_compare_exchange_strong(&e->word, &w, w | HANDOFF_LISTED))
        return false;
    HANDOFF_STEP(6); /* LISTED, not linked: killed here, the buffer is leaked */
    for (unsigned i = 0; i < tries; i++) {
        uint64_t old = atomic_load(&h->head[cls]);
        atomic_store(&e->next, (uint32_t)old);
        uint64_t neu = (old >> 32 << 32) + (1ull << 32) + (uint64_t)slot + 1;
        if (atomic_compare_exchange_strong(&h->head[cls], &old, neu))
            return true;
    }
    for (unsigned i = 0; i < tries; i++) { /* not linked: not LISTED (only the daemon's OUT may come) */
        w = atomic_load(&e->word);
        if (atomic_compare_exchange_strong(&e->word, &w, w & ~(uint64_t)HANDOFF_LISTED))
            break;
    }
    return false;
}

int handoff_grant(void *tab, uint32_t slot, uint32_t cls, uint64_t buf_id, unsigned tries)
{
    if (slot >= nslots(tab) || cls >= HANDOFF_CLASSES)
        return -EINVAL;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    uint64_t w = atomic_load(&e->word);
    if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || (w & HANDOFF_LISTED))
        return -EBUSY;
    /* The daemon's own entry (OUT, or never used): the class and buffer first, then the
     * word without OUT (the tenant's from here), then the link. */
    atomic_store(&e->cls, cls);
    atomic_store(&e->buf_id, buf_id);
    if (!atomic_compare_exchange_strong(&e->word, &w, handoff_word(handoff_seq_of(w), 0, 0, HANDOFF_FREE)))
        return -EBUSY;
    if (push(tab, slot, tries))
        return 0;
    handoff_set_out(tab, slot, tries);
    return -EAGAIN;
}

int handoff_join_published(void *tab, uint32_t slot, uint32_t cls, uint64_t buf_id, uint64_t tokhash, uint64_t size,
                           const void *meta, uint32_t meta_len)
{
    if (slot >= nslots(tab) || cls >= HANDOFF_CLASSES)
        return -EINVAL;
    if (meta_len > HANDOFF_META_MAX)
        return -EMSGSIZE;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    uint64_t w = atomic_load(&e->word);
    if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || (w & HANDOFF_LISTED))
        return -EBUSY;
    /* the daemon's own entry (OUT, or never used): everything a taker compares first, then
     * the word that makes it visible (release order, as a client's publish) */
    struct handoff_meta *m = handoff_meta_at(tab, slot);
    if (meta_len)
        memcpy(m->data, meta, meta_len);
    atomic_store(&m->len, meta_len);
    atomic_store(&e->cls, cls);
    atomic_store(&e->buf_id, buf_id);
    atomic_store(&e->tokhash, tokhash);
    atomic_store(&e->size, size);
    if (!atomic_compare_exchange_strong(&e->word, &w, handoff_word(handoff_seq_of(w) + 1, 1, 0, HANDOFF_PUBLISHED)))
        return -EBUSY;
    return 0;
}

/* unlink_head: one try at unlinking the first entry of cls's list: 1 and *ret_slot (off
 * the list, still LISTED), 0 when the head moved under the CAS (try again), -1 when the
 * list is empty or names no slot of the table. The tag in the head's high half makes a pop
 * that raced a pop and a push of the same slot fail here. */
static int unlink_head(void *tab, uint32_t cls, uint32_t n, uint32_t *ret_slot)
{
    struct handoff_header *h = tab;
    uint64_t old = atomic_load(&h->head[cls]);
    uint32_t first = (uint32_t)old;
    if (first == 0 || first > n)
        return -1;
    uint32_t slot = first - 1;
    uint64_t neu = (old >> 32 << 32) + (1ull << 32) + atomic_load(&handoff_entry_at(tab, slot)->next);
    if (!atomic_compare_exchange_strong(&h->head[cls], &old, neu))
        return 0;
    *ret_slot = slot;
    return 1;
}

int handoff_lease(void *tab, _Atomic uint32_t *journal, uint32_t cls, unsigned tries, uint32_t *ret_slot,
                  uint32_t *ret_seq)
{
    if (cls >= HANDOFF_CLASSES)
        return -EAGAIN;
    uint32_t n = nslots(tab), slot;
    for (unsigned i = 0; i < tries; i++) {
        int u = unlink_head(tab, cls, n, &slot);
        if (u < 0)
            return -EAGAIN;
        if (u == 0)
            continue;
        HANDOFF_STEP(1); /* unlinked, still LISTED: killed here, the buffer is leaked */
        struct handoff_entry *e = handoff_entry_at(tab, slot);
        uint64_t w = atomic_load(&e->word);
        if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || !(w & HANDOFF_LISTED) ||
            (w & HANDOFF_OUT)) {
            /* The daemon's (OUT): unlinked now, so no longer LISTED; anything else is a
             * scribbled entry, left as it is (off the list). */
            if ((w & HANDOFF_OUT) && (w & HANDOFF_LISTED))
                atomic_compare_exchange_strong(&e->word, &w, w & ~(uint64_t)HANDOFF_LISTED);
            continue;
        }
        uint32_t seq = handoff_seq_of(w) + 1;
        if (!atomic_compare_exchange_strong(&e->word, &w, handoff_word(seq, 1, 0, HANDOFF_LEASED))) {
            /* only the daemon's OUT changes a linked FREE word: it is the daemon's now */
            w = atomic_load(&e->word);
            atomic_compare_exchange_strong(&e->word, &w, w & ~(uint64_t)HANDOFF_LISTED);
            continue;
        }
        HANDOFF_STEP(2); /* leased, not in the journal yet: killed here, count 1 is leaked */
        atomic_fetch_add(&journal[slot], 1u);
        *ret_slot = slot;
        *ret_seq = seq;
        return 0;
    }
    return -EAGAIN;
}

int handoff_publish(void *tab, uint32_t slot, uint32_t seq, uint64_t tokhash, uint64_t size)
{
    if (slot >= nslots(tab))
        return -ESTALE;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    atomic_store(&e->tokhash, tokhash);
    atomic_store(&e->size, size);
    for (unsigned i = 0; i < HANDOFF_TRIES; i++) {
        uint64_t w = atomic_load(&e->word);
        if (handoff_seq_of(w) != seq || handoff_state_of(w) != HANDOFF_LEASED)
            return -ESTALE;
        uint64_t neu = (w & ~(uint64_t)0xf) | HANDOFF_PUBLISHED;
        if (atomic_compare_exchange_strong(&e->word, &w, neu))
            return 0;
    }
    return -ESTALE; /* only the daemon's flag changes a leased word: a scribbler's table */
}

int handoff_take(void *tab, _Atomic uint32_t *journal, uint32_t slot, uint64_t tokhash, uint64_t size,
                 unsigned tries, uint32_t *ret_seq)
{
    if (slot >= nslots(tab))
        return -EAGAIN;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    for (unsigned i = 0; i < tries; i++) {
        uint64_t w = atomic_load(&e->word);
        if (handoff_state_of(w) != HANDOFF_PUBLISHED || handoff_count_of(w) == 0 ||
            handoff_count_of(w) == HANDOFF_COUNT_MAX || (journal && (w & HANDOFF_RETAINED)))
            return -EAGAIN;
        /* Read between the load and the CAS: the CAS fails if the word changed, so what
         * was compared belongs to the generation the hold is of. */
        if (atomic_load(&e->tokhash) != tokhash || atomic_load(&e->size) != size)
            return -EAGAIN;
#ifdef HANDOFF_BROKEN_ORDER
        if (journal)
            atomic_fetch_add(&journal[slot], 1u);
        HANDOFF_STEP(3);
        if (!atomic_compare_exchange_strong(&e->word, &w, w + (1ull << 8))) {
            if (journal)
                atomic_fetch_sub(&journal[slot], 1u);
            continue;
        }
#else
        if (!atomic_compare_exchange_strong(&e->word, &w, w + (1ull << 8)))
            continue;
        HANDOFF_STEP(3); /* counted, not in the journal yet: killed here, a leaked hold */
        if (journal)
            atomic_fetch_add(&journal[slot], 1u);
#endif
        *ret_seq = handoff_seq_of(w);
        return 0;
    }
    return -EAGAIN;
}

/* drop: n holds off slot's word; the last makes it FREE and pushes it. */
static enum handoff_end drop(void *tab, uint32_t slot, uint32_t n, unsigned tries)
{
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    for (unsigned i = 0; i < tries; i++) {
        uint64_t w = atomic_load(&e->word);
        uint32_t c = handoff_count_of(w);
        if (c == 0)
            return HANDOFF_BAD;
        uint32_t take = n < c ? n : c;
        uint64_t neu = c > take ? w - ((uint64_t)take << 8)
                                : handoff_word(handoff_seq_of(w), 0, handoff_flags_of(w), HANDOFF_FREE);
        if (!atomic_compare_exchange_strong(&e->word, &w, neu))
            continue;
        if (c > take)
            return HANDOFF_HELD;
        HANDOFF_STEP(5); /* FREE, not on the list yet: killed here, the buffer is leaked */
        if (w & HANDOFF_OUT)
            return HANDOFF_TO_DAEMON;
        return push(tab, slot, tries) ? HANDOFF_FREED : HANDOFF_TO_DAEMON;
    }
    return HANDOFF_BUSY;
}

enum handoff_end handoff_give(void *tab, _Atomic uint32_t *journal, uint32_t slot, unsigned tries)
{
    if (slot >= nslots(tab))
        return HANDOFF_BAD;
    if (journal) {
        /* never below 0: a count the daemon took over (exchanged with 0) is its to drop */
        uint32_t j = atomic_load(&journal[slot]);
        do {
            if (j == 0)
                return HANDOFF_BAD;
        } while (!atomic_compare_exchange_weak(&journal[slot], &j, j - 1));
    }
    HANDOFF_STEP(4); /* out of the journal, still counted: killed here, a leaked hold */
    enum handoff_end r = drop(tab, slot, 1, tries);
    if (r == HANDOFF_BUSY && journal) /* still counted: back in the journal, to give later */
        atomic_fetch_add(&journal[slot], 1u);
    return r;
}

enum handoff_end handoff_reclaim(void *tab, uint32_t slot, uint32_t n, unsigned tries)
{
    if (slot >= nslots(tab) || n == 0)
        return HANDOFF_BAD;
    return drop(tab, slot, n, tries);
}

int handoff_hold(void *tab, uint32_t slot, uint32_t seq, unsigned tries)
{
    if (slot >= nslots(tab))
        return -ESTALE;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    for (unsigned i = 0; i < tries; i++) {
        uint64_t w = atomic_load(&e->word);
        uint32_t st = handoff_state_of(w), c = handoff_count_of(w);
        if (handoff_seq_of(w) != seq || (st != HANDOFF_LEASED && st != HANDOFF_PUBLISHED) || c == 0)
            return -ESTALE;
        if (c == HANDOFF_COUNT_MAX)
            return -EAGAIN;
        if (atomic_compare_exchange_strong(&e->word, &w, w + (1ull << 8)))
            return 0;
    }
    return -EAGAIN;
}

int handoff_pop(void *tab, uint32_t cls, unsigned tries, uint32_t *ret_slot)
{
    if (cls >= HANDOFF_CLASSES)
        return -EAGAIN;
    uint32_t n = nslots(tab), slot;
    for (unsigned i = 0; i < tries; i++) {
        int u = unlink_head(tab, cls, n, &slot);
        if (u < 0)
            return -EAGAIN;
        if (u == 0)
            continue;
        struct handoff_entry *e = handoff_entry_at(tab, slot);
        uint64_t w = atomic_load(&e->word);
        if (handoff_state_of(w) != HANDOFF_FREE || handoff_count_of(w) || !(w & HANDOFF_LISTED))
            continue; /* scribbled: left off the list as it is */
        uint64_t out = (w & ~(uint64_t)HANDOFF_LISTED) | HANDOFF_OUT;
        if (!atomic_compare_exchange_strong(&e->word, &w, out))
            continue; /* a scribbler's write came between: left as it is */
        *ret_slot = slot;
        return 0;
    }
    return -EAGAIN;
}

static uint64_t set_flags(void *tab, uint32_t slot, uint32_t flags, unsigned tries)
{
    if (slot >= nslots(tab))
        return 0;
    struct handoff_entry *e = handoff_entry_at(tab, slot);
    for (unsigned i = 0; i < tries; i++) {
        uint64_t w = atomic_load(&e->word);
        if (atomic_compare_exchange_strong(&e->word, &w, w | flags))
            return w | flags;
    }
    return 0;
}

uint64_t handoff_set_out(void *tab, uint32_t slot, unsigned tries)
{
    return set_flags(tab, slot, HANDOFF_OUT, tries);
}

uint64_t handoff_set_retained(void *tab, uint32_t slot, unsigned tries)
{
    return set_flags(tab, slot, HANDOFF_OUT | HANDOFF_RETAINED, tries);
}
