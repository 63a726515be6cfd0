/* SPDX-License-Identifier: MIT */
/* handoff.h: the tenant's table of same-tenant handoffs without the daemon (issue 28;
 * the argument is docs/architecture.md, "Next: tenant-local recycling"). Private header,
 * pure code on memory the caller mapped: no I/O, no allocation, no logging.
 *
 * shmrefd makes one per uid (daemon/tenantdir.c) and libshmref leases, publishes, takes
 * and gives through it (client-lib/localhold.c).
 *
 * The table is one per uid: a header (the size classes, a free-list head per class), an
 * entry per buffer slot, and a metadata record per slot. Every process of the uid maps it read-write; so does the daemon, which
 * made it. Each connection also has a JOURNAL: a 32-bit count per slot of the holds that
 * connection has, written by its client only, read by the daemon when the connection ends.
 *
 * One owner per fact: an entry's WORD (one 64-bit atomic, changed only by compare-and-
 * swap) holds the generation (seq), every hold of the buffer (count: local holds and the
 * daemon's), the state (FREE, LEASED, PUBLISHED) and the flags (OUT: the daemon has the
 * buffer back, no local lease may have it). The journals only say what each connection
 * contributed, and the invariant ties them to the word:
 *
 *     count >= sum of the live journals' counts of the slot + the daemon's own holds
 *
 * with equality whenever no client is between the two stores of a step. Take stores the
 * word first, then the journal; give stores the journal first, then the word; so a process
 * killed between the two leaves the word too HIGH (a leaked hold, repaired when the tenant
 * is quiet), never too low (an early recycle). Every loop is bounded by `tries` (a table
 * another process of the uid scribbled on may refuse, never hang): a refusal sends the
 * caller to the daemon (the slow path). */
#ifndef SHMREF_HANDOFF_H
#define SHMREF_HANDOFF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

#define HANDOFF_MAGIC   0x3146464f444e4148ull /* "HANDOFF1" little endian */
#define HANDOFF_VERSION 1u
#define HANDOFF_CLASSES 64u             /* free lists: the tenant's size classes in use */
#define HANDOFF_HEADER  4096u           /* bytes before the first entry */
#define HANDOFF_NO_SLOT 0xffffffffu
#define HANDOFF_TRIES   64u             /* the bound callers pass for one step */
#define HANDOFF_MAX_SLOTS 65536u        /* entries of a table (the pool's slots, HANDOFF_MAX_SLOTS) */
#define HANDOFF_META_MAX 248u           /* metadata kept beside an entry; longer: the daemon's path */

/* The word: state (bits 0-3), flags (4-7), count (8-31), seq (32-63). */
enum handoff_state { HANDOFF_FREE = 0, HANDOFF_LEASED = 1, HANDOFF_PUBLISHED = 2 };
#define HANDOFF_OUT        0x10u        /* flag: the daemon's; a last give tells the daemon */
#define HANDOFF_LISTED     0x20u        /* flag: FREE and on its class's free list (set by a
                                         * push before it links the entry, cleared by the pop
                                         * that unlinks it): a slot is granted again only
                                         * without it, so no entry is ever on a list twice */
#define HANDOFF_RETAINED   0x40u        /* flag (with OUT): the daemon retains it; clients'
                                         * takes ask the daemon (its retention counts them) */
#define HANDOFF_COUNT_MAX  0xffffffu

static inline uint32_t handoff_state_of(uint64_t w) { return (uint32_t)(w & 0xfu); }
static inline uint32_t handoff_flags_of(uint64_t w) { return (uint32_t)(w & 0xf0u); }
static inline uint32_t handoff_count_of(uint64_t w) { return (uint32_t)((w >> 8) & HANDOFF_COUNT_MAX); }
static inline uint32_t handoff_seq_of(uint64_t w) { return (uint32_t)(w >> 32); }
static inline uint64_t handoff_word(uint32_t seq, uint32_t count, uint32_t flags, uint32_t state)
{
    return (uint64_t)seq << 32 | (uint64_t)(count & HANDOFF_COUNT_MAX) << 8 | (flags & 0xf0u) | (state & 0xfu);
}

struct handoff_header {
    uint64_t magic;                 /* HANDOFF_MAGIC */
    uint32_t version;               /* HANDOFF_VERSION */
    uint32_t nslots;                /* entries after the header */
    uint32_t uid;                   /* the tenant */
    uint32_t entry_size;            /* sizeof(struct handoff_entry) */
    uint8_t key[16];                /* SipHash key of the token hashes (handoff_siphash) */
    _Atomic uint32_t closed;        /* the daemon took the table back: no step succeeds */
    uint8_t pad[20];
    /* per class: slot + 1 of the first free entry (0: empty) in bits 0-31, an ABA tag in
     * bits 32-63 that every successful pop and push increments */
    _Atomic uint64_t head[HANDOFF_CLASSES];
    /* per class (the daemon's, written before its first grant of the class): its buffers
     * have cap[c] bytes and serve leases of lo[c]..cap[c] bytes (what the daemon's own
     * lease of such a size would give); cap 0: unused. A client checks the capacity of
     * what it maps, never trusts these for it. */
    _Atomic uint64_t cap[HANDOFF_CLASSES];
    _Atomic uint64_t lo[HANDOFF_CLASSES];
};

/* A slot's metadata (the publish's, written by the producer between lease and publish,
 * read by a consumer after its take: its hold keeps it from changing). */
struct handoff_meta {
    _Atomic uint32_t len;           /* <= HANDOFF_META_MAX */
    uint32_t pad;
    uint8_t data[HANDOFF_META_MAX];
};

/* One slot: 64 bytes, one cache line. */
struct handoff_entry {
    _Atomic uint64_t word;          /* see above: the one owner of count, state, seq */
    _Atomic uint32_t next;          /* on a free list: slot + 1 of the next entry, 0: last */
    _Atomic uint32_t cls;           /* its free list (the daemon's, at grant) */
    _Atomic uint64_t buf_id;        /* the buffer (backing file) of the slot (the daemon's) */
    _Atomic uint64_t tokhash;       /* the producer's, between lease and publish */
    _Atomic uint64_t size;          /* the producer's, between lease and publish */
    uint8_t pad[24];
};

_Static_assert(sizeof(struct handoff_entry) == 64, "a handoff entry is one cache line");
_Static_assert(sizeof(struct handoff_header) <= HANDOFF_HEADER, "the handoff header fits its page");
_Static_assert(sizeof(struct handoff_meta) == 256, "a metadata record is 256 bytes");

/* A journal: HANDOFF_MAX_SLOTS 32-bit counts, then a page whose first word is CLOSED:
 * the daemon sets it when it stops reading the journal (its connection ends, or it is
 * about to close it for idleness). Both sides change a count only atomically: the client
 * by increment and by a decrement that never goes below 0, the daemon by exchanging it
 * with 0 when it takes the connection's holds over (handoff_journal_take), so each hold
 * is dropped by exactly one of them. A client checks CLOSED after each hold it takes
 * (handoff_journal_closed) and gives the hold back if it is set: its connection no longer
 * counts (the daemon read the journal, or is about to). */
#define HANDOFF_JOURNAL_SIZE ((size_t)HANDOFF_MAX_SLOTS * sizeof(uint32_t) + 4096u)
static inline _Atomic uint32_t *handoff_journal_flag(_Atomic uint32_t *journal)
{
    return &journal[HANDOFF_MAX_SLOTS];
}
static inline bool handoff_journal_closed(_Atomic uint32_t *journal)
{
    return atomic_load(handoff_journal_flag(journal)) != 0;
}
/* handoff_journal_take: the daemon takes slot's count over (0 left): the holds it drops. */
static inline uint32_t handoff_journal_take(_Atomic uint32_t *journal, uint32_t slot)
{
    return atomic_exchange(&journal[slot], 0u);
}

/* Tokens: bytes 0..3 are the buffer's pool slot (little endian; HANDOFF_NO_SLOT for a
 * buffer beyond the table's slots), bytes 4..15 random. The table keeps a keyed hash of
 * a publish's token (handoff_siphash under the header's key), never the token. */
uint32_t handoff_slot_of(const uint8_t token[PROTO_TOKEN_LEN]);
void handoff_set_slot(uint8_t token[PROTO_TOKEN_LEN], uint32_t slot);
/* handoff_siphash: SipHash-2-4 of in[0..len) under key (64-bit output). */
uint64_t handoff_siphash(const uint8_t key[16], const void *in, size_t len);

/* handoff_size: bytes of a table of nslots entries (and their metadata records). Every
 * step reads nslots from the header capped at HANDOFF_MAX_SLOTS: a table has exactly
 * handoff_size(HANDOFF_MAX_SLOTS) bytes wherever it is shared, so a scribbled header
 * cannot send a step past the mapping. (Smaller tables are for tests and the bench.) */
size_t handoff_size(uint32_t nslots);
/* HANDOFF_TABLE_SIZE: the bytes of every shared table (the daemon's and each client's
 * mapping of it). */
#define HANDOFF_TABLE_SIZE handoff_size(HANDOFF_MAX_SLOTS)
/* handoff_init: the daemon fills a fresh (zeroed) table: header, every list empty. */
void handoff_init(void *tab, uint32_t nslots, uint32_t uid, const uint8_t key[16]);
/* handoff_close: the daemon takes the table back (its uid's last connection ended): every
 * later step of a process that still maps it refuses (-EAGAIN, HANDOFF_BAD). */
void handoff_close(void *tab);
/* handoff_check: whether a mapped table of len bytes has a header this code speaks (a
 * client, before it trusts it). 0 or -EPROTO. */
int handoff_check(const void *tab, size_t len);
struct handoff_entry *handoff_entry_at(void *tab, uint32_t slot);
struct handoff_meta *handoff_meta_at(void *tab, uint32_t slot);

/* handoff_class: the class whose leases size bytes fall in (the header's, which the uid
 * may have scribbled: the caller checks what it maps), or -1. */
int handoff_class(const void *tab, uint64_t size);
/* handoff_set_class: the daemon records class cls (cap, lo) before it grants into it. */
void handoff_set_class(void *tab, uint32_t cls, uint64_t cap, uint64_t lo);

/* Daemon: handoff_grant gives the tenant a buffer: slot's entry becomes FREE with class
 * cls and buf_id, and is pushed on its free list. 0, -EINVAL (slot or class out of
 * range), -EBUSY (the entry is not FREE with count 0, or may still be on a list:
 * LISTED), -EAGAIN (the list changed `tries` times under the push: the buffer stays the
 * daemon's, OUT). */
int handoff_grant(void *tab, uint32_t slot, uint32_t cls, uint64_t buf_id, unsigned tries);

/* Daemon: handoff_join_published: slot's entry (FREE, no hold, not LISTED) becomes the
 * daemon's publish of buffer buf_id (class cls): its metadata, token hash and size, then
 * the word PUBLISHED under the next seq with one hold, the daemon's (a buffer published
 * through the daemon, so that a consumer that maps it takes it in the table). 0, -EINVAL,
 * -EBUSY (the entry is not free), -EMSGSIZE (metadata over HANDOFF_META_MAX). */
int handoff_join_published(void *tab, uint32_t slot, uint32_t cls, uint64_t buf_id, uint64_t tokhash, uint64_t size,
                           const void *meta, uint32_t meta_len);

/* Producer: handoff_lease takes a free buffer of class cls: pops it, makes it LEASED with
 * the next seq and count 1, then counts the hold in journal. *ret_slot, *ret_seq.
 * -EAGAIN: the list is empty, or kept changing, or gave only entries the daemon took back
 * (OUT) or that are not FREE: ask the daemon. */
int handoff_lease(void *tab, _Atomic uint32_t *journal, uint32_t cls, unsigned tries, uint32_t *ret_slot,
                  uint32_t *ret_seq);

/* Producer: handoff_publish records (tokhash, size) and makes slot PUBLISHED, if it is
 * still LEASED under seq (release order: whatever the producer wrote before is visible to
 * whoever sees PUBLISHED). 0 or -ESTALE. */
int handoff_publish(void *tab, uint32_t slot, uint32_t seq, uint64_t tokhash, uint64_t size);
/* (At most HANDOFF_TRIES attempts: under a lease only the daemon's OUT flag and the
 * producer's own holds change the word, so more failures mean a scribbled table.) */

/* Consumer: handoff_take takes a hold of slot's buffer if it is PUBLISHED under tokhash
 * with that size: the word's count first (one CAS that fails if anything changed since
 * the checks), then journal (NULL: the daemon's own hold, which it keeps in its memory).
 * 0 and *ret_seq (the generation held), or -EAGAIN (not this publish, or busy `tries`
 * times, or the count is at its maximum, or, for a client's take (journal not NULL),
 * RETAINED: the daemon's retention counts its acquires): ask the daemon. */
int handoff_take(void *tab, _Atomic uint32_t *journal, uint32_t slot, uint64_t tokhash, uint64_t size,
                 unsigned tries, uint32_t *ret_seq);

/* What a give (or the daemon's reclaim) left. */
enum handoff_end {
    HANDOFF_HELD = 0,       /* others still hold it */
    HANDOFF_FREED = 1,      /* it was the last hold: the buffer is on its free list */
    HANDOFF_TO_DAEMON = 2,  /* the last hold of a buffer the daemon must take: OUT, or the
                             * push failed `tries` times (it is FREE and off the list) */
    HANDOFF_BAD = -1,       /* nothing to give: the journal (or the word) had no hold */
    HANDOFF_BUSY = -2,      /* the word changed `tries` times: nothing was given (the
                             * hold is still counted, and in the journal): give it later */
};

/* Holder: handoff_give drops one hold: the journal first (NULL: a daemon hold), then the
 * word; the one that takes count to 0 makes it FREE and pushes it. A journal count of 0
 * (the daemon took the connection's holds over) gives nothing: HANDOFF_BAD. */
enum handoff_end handoff_give(void *tab, _Atomic uint32_t *journal, uint32_t slot, unsigned tries);

/* Daemon: handoff_hold takes a hold of its own on slot's buffer while it is LEASED or
 * PUBLISHED under seq (a lease the client hands over to the daemon's path: its producer's
 * hold keeps the count above 0 meanwhile). 0, -ESTALE (not that lease), -EAGAIN (busy
 * `tries` times, or the count is at its maximum). */
int handoff_hold(void *tab, uint32_t slot, uint32_t seq, unsigned tries);

/* Daemon: handoff_pop takes a free buffer of class cls back from the tenant (its quota or
 * the pool wants the space): popped from the list, OUT, not LISTED: the daemon's. 0 and
 * *ret_slot, or -EAGAIN (the list is empty, or changed `tries` times). Entries that are
 * not FREE are left unlinked (a scribbled list). */
int handoff_pop(void *tab, uint32_t cls, unsigned tries, uint32_t *ret_slot);

/* Daemon: handoff_reclaim drops n holds of a connection that ended (what its journal said
 * of slot), never more than the word counts. */
enum handoff_end handoff_reclaim(void *tab, uint32_t slot, uint32_t n, unsigned tries);

/* Daemon: handoff_set_out marks slot OUT (another uid acquires it, or the daemon wants it
 * back): no local lease takes it again; its last give says HANDOFF_TO_DAEMON. Returns the
 * word it left, or 0 when the word changed `tries` times (call again). Count 0, FREE and
 * not LISTED: the daemon has it now. FREE and LISTED: it is still linked, and is the
 * daemon's once a pop unlinks it (the pop clears LISTED and leaves it). */
uint64_t handoff_set_out(void *tab, uint32_t slot, unsigned tries);
/* Daemon: handoff_set_retained: OUT (as handoff_set_out), and RETAINED: the daemon holds a
 * retention of it, which counts acquires, so a client's take asks the daemon. */
uint64_t handoff_set_retained(void *tab, uint32_t slot, unsigned tries);

#endif
