/* SPDX-License-Identifier: MIT */
/* test-handoff.c: proto/handoff.c, the tenant's table of same-tenant handoffs (not yet
 * used by the daemon or the library; docs/architecture.md, "Next: tenant-local
 * recycling"). The life of an entry; OUT and LISTED; bounded steps on a scribbled table;
 * a producer recycling under two racing consumers, every hold checked against the
 * generation it took; and a process SIGKILLed between the two stores of every step,
 * which must leave at worst a count too high (a leak), never one too low. */
#define HANDOFF_STEP(n) step_hook(n)
static void step_hook(int n);
#include "handoff.c"

#include "handoff-cases.h"

#include <pthread.h>
#include <time.h>

Test(handoff, an_entry_lives_lease_publish_take_give)
{
    setup(4);
    uint32_t slot, seq, got;
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
    cr_assert_eq(slot, 3u, "the last granted is on top");
    cr_assert_eq(seq, 1u);
    cr_assert_eq(atomic_load(&sh->parent[3]), 1u);
    cr_assert_eq(handoff_state_of(word(3)), HANDOFF_LEASED);
    cr_assert_eq(handoff_take(tab, sh->child, 3, 77, 4096, HANDOFF_TRIES, &got), -EAGAIN, "not published yet");
    cr_assert_eq(handoff_publish(tab, 3, seq + 1, 77, 4096), -ESTALE, "another generation's publish");
    cr_assert_eq(handoff_publish(tab, 3, seq, 77, 4096), 0);
    cr_assert_eq(handoff_take(tab, sh->child, 3, 78, 4096, HANDOFF_TRIES, &got), -EAGAIN, "another token");
    cr_assert_eq(handoff_take(tab, sh->child, 3, 77, 4095, HANDOFF_TRIES, &got), -EAGAIN, "another size");
    cr_assert_eq(handoff_take(tab, sh->child, 3, 77, 4096, HANDOFF_TRIES, &got), 0);
    cr_assert_eq(got, seq);
    cr_assert_eq(handoff_count_of(word(3)), 2u);
    cr_assert_eq(handoff_give(tab, sh->parent, 3, HANDOFF_TRIES), HANDOFF_HELD);
    cr_assert_eq(handoff_give(tab, sh->parent, 3, HANDOFF_TRIES), HANDOFF_BAD, "the journal has no hold left");
    cr_assert_eq(handoff_give(tab, sh->child, 3, HANDOFF_TRIES), HANDOFF_FREED);
    cr_assert_eq(word(3), handoff_word(1, 0, HANDOFF_LISTED, HANDOFF_FREE));
    /* recycled: the old token names nothing, whatever the entry holds now */
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
    cr_assert_eq(slot, 3u);
    cr_assert_eq(seq, 2u);
    cr_assert_eq(handoff_take(tab, sh->child, 3, 77, 4096, HANDOFF_TRIES, &got), -EAGAIN);
    cr_assert_eq(handoff_publish(tab, 3, seq, 99, 4096), 0);
    cr_assert_eq(handoff_take(tab, sh->child, 3, 77, 4096, HANDOFF_TRIES, &got), -EAGAIN);
    /* the daemon's own hold: no journal */
    cr_assert_eq(handoff_take(tab, NULL, 3, 99, 4096, HANDOFF_TRIES, &got), 0);
    cr_assert_eq(handoff_give(tab, sh->parent, 3, HANDOFF_TRIES), HANDOFF_HELD);
    cr_assert_eq(handoff_give(tab, NULL, 3, HANDOFF_TRIES), HANDOFF_FREED);
    /* all four are free again */
    for (unsigned i = 0; i < 4; i++)
        cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), -EAGAIN);
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS + 1, HANDOFF_TRIES, &slot, &seq), -EAGAIN, "another class");
}

Test(handoff, out_sends_the_last_give_to_the_daemon)
{
    setup(1);
    uint32_t slot = parent_publishes(5), seq;
    cr_assert_neq(handoff_set_out(tab, slot, HANDOFF_TRIES), 0u);
    cr_assert_eq(handoff_take(tab, sh->child, slot, 5, 4096, HANDOFF_TRIES, &seq), 0, "a publish is still served");
    cr_assert_eq(handoff_give(tab, sh->parent, slot, HANDOFF_TRIES), HANDOFF_HELD);
    cr_assert_eq(handoff_give(tab, sh->child, slot, HANDOFF_TRIES), HANDOFF_TO_DAEMON);
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), -EAGAIN, "never leased locally");
    cr_assert_eq(word(0) & HANDOFF_LISTED, 0u);
    cr_assert_eq(handoff_grant(tab, 0, CLS, 100, HANDOFF_TRIES), 0, "the daemon may give it again");
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
}

Test(handoff, a_linked_entry_taken_out_is_granted_again_only_once_unlinked)
{
    setup(2);
    cr_assert_neq(handoff_set_out(tab, 1, HANDOFF_TRIES), 0u);
    cr_assert_eq(handoff_grant(tab, 1, CLS, 101, HANDOFF_TRIES), -EBUSY, "still on the list");
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
    cr_assert_eq(slot, 0u, "the OUT entry on top was skipped");
    cr_assert_eq(word(1), handoff_word(0, 0, HANDOFF_OUT, HANDOFF_FREE), "unlinked by the pop, the daemon's");
    cr_assert_eq(handoff_grant(tab, 1, CLS, 101, HANDOFF_TRIES), 0);
    cr_assert_eq(handoff_grant(tab, 1, CLS, 101, HANDOFF_TRIES), -EBUSY, "never on a list twice");
}

Test(handoff, a_scribbled_table_refuses_and_never_hangs)
{
    setup(4);
    struct handoff_header *h = tab;
    uint32_t slot, seq, got;
    /* a cycle: 3 -> 2 -> 3 -> ... with LISTED words that a pop keeps finding not free */
    atomic_store(&handoff_entry_at(tab, 2)->next, 4);
    for (unsigned s = 0; s < 4; s++)
        atomic_store(&handoff_entry_at(tab, s)->word, handoff_word(9, 1, HANDOFF_LISTED, HANDOFF_LEASED));
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), -EAGAIN);
    atomic_store(&h->head[CLS], 0xffffffull); /* beyond the table */
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), -EAGAIN);
    cr_assert_eq(handoff_take(tab, sh->child, NSLOTS, 1, 1, HANDOFF_TRIES, &got), -EAGAIN);
    cr_assert_eq(handoff_give(tab, sh->child, NSLOTS, HANDOFF_TRIES), HANDOFF_BAD);
    cr_assert_eq(handoff_reclaim(tab, NSLOTS, 1, HANDOFF_TRIES), HANDOFF_BAD);
    cr_assert_eq(handoff_grant(tab, NSLOTS, CLS, 1, HANDOFF_TRIES), -EINVAL);
    cr_assert_eq(handoff_grant(tab, 0, HANDOFF_CLASSES, 1, HANDOFF_TRIES), -EINVAL);
    /* a count at its maximum is not wrapped by one more take */
    atomic_store(&handoff_entry_at(tab, 5)->word, handoff_word(1, HANDOFF_COUNT_MAX, 0, HANDOFF_PUBLISHED));
    atomic_store(&handoff_entry_at(tab, 5)->tokhash, 1);
    atomic_store(&handoff_entry_at(tab, 5)->size, 1);
    cr_assert_eq(handoff_take(tab, sh->child, 5, 1, 1, HANDOFF_TRIES, &got), -EAGAIN);
    /* a reclaim never takes more than the word counts */
    atomic_store(&handoff_entry_at(tab, 6)->word, handoff_word(1, 2, 0, HANDOFF_PUBLISHED));
    atomic_store(&handoff_entry_at(tab, 6)->cls, CLS);
    atomic_store(&h->head[CLS], 0);
    cr_assert_eq(handoff_reclaim(tab, 6, 0xffffffffu, HANDOFF_TRIES), HANDOFF_FREED);
    cr_assert_eq(handoff_count_of(word(6)), 0u);
}

/* The race: one producer recycles NPROD buffers as fast as it can, two consumers take
 * whatever it last published and check, while they hold it, that every word of the
 * buffer is still the generation they took. */
#define RACE_SLOTS 4u
#define WORDS 64u
static _Atomic uint64_t payload[RACE_SLOTS][WORDS];
static _Atomic uint64_t mailbox; /* slot << 32 | seq of the last publish, 0: none */
static _Atomic bool race_stop;
static _Atomic uint64_t holds_checked, wrong_words, recycles;

static uint64_t tokhash_of(uint32_t slot, uint32_t seq)
{
    return ((uint64_t)slot << 40 ^ (uint64_t)seq * 0x9e3779b97f4a7c15ull) | 1;
}

static void *producer(void *arg)
{
    (void)arg;
    while (!atomic_load(&race_stop)) {
        uint32_t slot, seq;
        if (handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq) != 0)
            continue; /* all held: the consumers give them back */
        for (unsigned w = 0; w < WORDS; w++)
            atomic_store_explicit(&payload[slot][w], seq, memory_order_relaxed);
        if (handoff_publish(tab, slot, seq, tokhash_of(slot, seq), 4096) != 0)
            atomic_fetch_add(&wrong_words, 1000000); /* its own lease, changed under it */
        atomic_store(&mailbox, (uint64_t)slot << 32 | seq);
        handoff_give(tab, sh->parent, slot, HANDOFF_TRIES);
        atomic_fetch_add(&recycles, 1);
    }
    return NULL;
}

static void *consumer(void *arg)
{
    _Atomic uint32_t *journal = arg;
    while (!atomic_load(&race_stop)) {
        uint64_t m = atomic_load(&mailbox);
        if (!m)
            continue;
        uint32_t slot = (uint32_t)(m >> 32), seq = (uint32_t)m, got;
        if (handoff_take(tab, journal, slot, tokhash_of(slot, seq), 4096, HANDOFF_TRIES, &got) != 0)
            continue;
        if (got != seq)
            atomic_fetch_add(&wrong_words, 1000000); /* a hold of another generation */
        for (unsigned pass = 0; pass < 3; pass++)
            for (unsigned w = 0; w < WORDS; w++)
                if (atomic_load_explicit(&payload[slot][w], memory_order_relaxed) != got)
                    atomic_fetch_add(&wrong_words, 1);
        atomic_fetch_add(&holds_checked, 1);
        if (handoff_give(tab, journal, slot, HANDOFF_TRIES) < 0)
            atomic_fetch_add(&wrong_words, 1000000); /* a hold it had, not counted */
    }
    return NULL;
}

Test(handoff, consumers_racing_recycles_never_hold_another_generation, .timeout = 60)
{
    setup(RACE_SLOTS);
    pthread_t p, c1, c2;
    cr_assert_eq(pthread_create(&c1, NULL, consumer, sh->child), 0);
    cr_assert_eq(pthread_create(&c2, NULL, consumer, sh->child + 0), 0);
    cr_assert_eq(pthread_create(&p, NULL, producer, NULL), 0);
    struct timespec t = { .tv_sec = 3 };
    nanosleep(&t, NULL);
    atomic_store(&race_stop, true);
    pthread_join(p, NULL);
    pthread_join(c1, NULL);
    pthread_join(c2, NULL);
    cr_log_info("%llu recycles, %llu holds checked", (unsigned long long)atomic_load(&recycles),
                (unsigned long long)atomic_load(&holds_checked));
    cr_assert_gt(atomic_load(&recycles), 1000u, "the producer recycled");
    cr_assert_gt(atomic_load(&holds_checked), 1000u, "the consumers held");
    cr_assert_eq(atomic_load(&wrong_words), 0u, "words of another generation under a hold");
    for (uint32_t s = 0; s < RACE_SLOTS; s++) {
        cr_assert_eq(atomic_load(&sh->parent[s]) + atomic_load(&sh->child[s]), 0u);
        cr_assert_eq(word(s) & 0xffffff0full, (uint64_t)HANDOFF_FREE, "slot %u ends free", s);
    }
    uint32_t slot, seq;
    for (unsigned i = 0; i < RACE_SLOTS; i++)
        cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0, "every buffer is back");
}

/* SIGKILL between the two stores of each step. */
static void child_leases(void)
{
    uint32_t slot, seq;
    if (handoff_lease(tab, sh->child, CLS, HANDOFF_TRIES, &slot, &seq) != 0)
        _exit(4);
}

static void child_gives(void)
{
    if (handoff_give(tab, sh->child, 0, HANDOFF_TRIES) == HANDOFF_BAD)
        _exit(4);
}

Test(handoff, killed_inside_a_lease_leaks_the_buffer_never_lends_it_twice)
{
    for (int at = 1; at <= 2; at++) {
        setup(1);
        cr_assert(killed_at(at, child_leases), "the lease passed step %d", at);
        reclaim_child();
        assert_no_count_too_low();
        uint32_t slot, seq;
        cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), -EAGAIN,
                     "step %d: the half-leased buffer was leased again", at);
    }
}

Test(handoff, killed_inside_a_take_leaves_a_count_too_high)
{
    cr_assert_not(take_killed_then_recycled(), "the parent's buffer was recycled under its hold");
    assert_no_count_too_low();
    cr_assert_eq(handoff_count_of(word(0)), 2u, "the child's half-take is a leaked hold");
    cr_assert_eq(handoff_give(tab, sh->parent, 0, HANDOFF_TRIES), HANDOFF_HELD);
}

Test(handoff, killed_inside_a_give_leaves_a_count_too_high)
{
    setup(1);
    uint32_t slot = parent_publishes(77), seq;
    cr_assert_eq(handoff_take(tab, sh->child, slot, 77, 4096, HANDOFF_TRIES, &seq), 0);
    cr_assert(killed_at(4, child_gives), "the give passed step 4");
    reclaim_child();
    assert_no_count_too_low();
    cr_assert_eq(handoff_count_of(word(0)), 2u);
    cr_assert_eq(handoff_give(tab, sh->parent, 0, HANDOFF_TRIES), HANDOFF_HELD, "a leaked hold, never a recycle");
}

Test(handoff, killed_inside_the_last_give_leaks_the_buffer)
{
    for (int at = 5; at <= 6; at++) {
        setup(1);
        uint32_t slot = parent_publishes(77), seq;
        cr_assert_eq(handoff_take(tab, sh->child, slot, 77, 4096, HANDOFF_TRIES, &seq), 0);
        cr_assert_eq(handoff_give(tab, sh->parent, 0, HANDOFF_TRIES), HANDOFF_HELD);
        cr_assert(killed_at(at, child_gives), "the last give passed step %d", at);
        reclaim_child();
        assert_no_count_too_low();
        cr_assert_eq(handoff_count_of(word(0)), 0u);
        uint32_t s2, q2;
        cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &s2, &q2), -EAGAIN,
                     "step %d: a buffer half-pushed was leased", at);
        cr_assert_eq(handoff_grant(tab, 0, CLS, 100, HANDOFF_TRIES), at == 5 ? 0 : -EBUSY,
                     "step %d: LISTED says whether it may still be linked", at);
    }
}

Test(handoff, a_dead_holders_reclaim_frees_what_only_it_held)
{
    setup(1);
    uint32_t slot = parent_publishes(77), seq;
    cr_assert_eq(handoff_take(tab, sh->child, slot, 77, 4096, HANDOFF_TRIES, &seq), 0);
    cr_assert_eq(handoff_take(tab, sh->child, slot, 77, 4096, HANDOFF_TRIES, &seq), 0);
    cr_assert_eq(handoff_give(tab, sh->parent, 0, HANDOFF_TRIES), HANDOFF_HELD);
    cr_assert_eq(handoff_count_of(word(0)), 2u);
    reclaim_child(); /* the child "died" holding twice */
    cr_assert_eq(word(0), handoff_word(1, 0, HANDOFF_LISTED, HANDOFF_FREE));
    uint32_t s2, q2;
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &s2, &q2), 0);
    cr_assert_eq(q2, 2u);
}
