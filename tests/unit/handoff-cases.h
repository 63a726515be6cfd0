/* SPDX-License-Identifier: MIT */
/* handoff-cases.h: what test-handoff.c and test-handoff-broken.c share. Each compiles
 * proto/handoff.c itself (so HANDOFF_STEP can stop a process between two stores, and the
 * broken one with HANDOFF_BROKEN_ORDER); this header is included after it. */
#ifndef HANDOFF_CASES_H
#define HANDOFF_CASES_H

#include <criterion/criterion.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NSLOTS 16u
#define CLS 3u

/* Everything two processes share: the table, then each "connection"'s journal. */
struct shared {
    _Atomic uint32_t parent[NSLOTS];
    _Atomic uint32_t child[NSLOTS];
};

static void *tab;
static struct shared *sh;

static void setup(unsigned granted)
{
    size_t len = handoff_size(NSLOTS) + sizeof(struct shared);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    uint8_t key[16] = { 1, 2, 3 };
    handoff_init(p, NSLOTS, 1000, key);
    tab = p;
    sh = (struct shared *)((char *)p + handoff_size(NSLOTS));
    for (unsigned s = 0; s < granted; s++)
        cr_assert_eq(handoff_grant(tab, s, CLS, 100 + s, HANDOFF_TRIES), 0);
}

static uint64_t word(uint32_t slot)
{
    return atomic_load(&handoff_entry_at(tab, slot)->word);
}

/* The stop point: a child stops at step_stop (tells the parent, then waits to be killed). */
static int step_stop;
static int step_pipe = -1;

static void step_hook(int n)
{
    if (n != step_stop || step_pipe < 0)
        return;
    char c = (char)n;
    if (write(step_pipe, &c, 1) != 1)
        _exit(3);
    for (;;)
        pause();
}

/* killed_at: runs fn in a child that stops at step `at`; SIGKILLs it there. Returns
 * whether it reached the step (false: fn finished without passing it). */
static bool killed_at(int at, void (*fn)(void))
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        step_stop = at;
        step_pipe = p[1];
        fn();
        _exit(0);
    }
    close(p[1]);
    char c;
    ssize_t n = read(p[0], &c, 1);
    close(p[0]);
    if (n == 1)
        kill(pid, SIGKILL);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return n == 1;
}

/* The daemon's part of a connection's end: each slot its journal names loses that many
 * holds (handoff_reclaim never takes more than the word counts). */
static void reclaim_child(void)
{
    for (uint32_t s = 0; s < NSLOTS; s++) {
        uint32_t n = atomic_load(&sh->child[s]);
        if (n)
            handoff_reclaim(tab, s, n, HANDOFF_TRIES);
        atomic_store(&sh->child[s], 0);
    }
}

/* The invariant: no slot counts fewer holds than its live journals say. */
static inline void assert_no_count_too_low(void)
{
    for (uint32_t s = 0; s < NSLOTS; s++)
        cr_assert_geq(handoff_count_of(word(s)), atomic_load(&sh->parent[s]),
                      "slot %u counts %u holds, its live journal %u: a hold the word does not count", s,
                      handoff_count_of(word(s)), atomic_load(&sh->parent[s]));
}

/* The parent publishes slot 0 (its hold in its journal). */
static uint32_t parent_publishes(uint64_t tokhash)
{
    uint32_t slot, seq;
    cr_assert_eq(handoff_lease(tab, sh->parent, CLS, HANDOFF_TRIES, &slot, &seq), 0);
    cr_assert_eq(handoff_publish(tab, slot, seq, tokhash, 4096), 0);
    return slot;
}

static void child_takes(void)
{
    uint32_t seq;
    if (handoff_take(tab, sh->child, 0, 77, 4096, HANDOFF_TRIES, &seq) != 0)
        _exit(4);
}

/* A child killed between the two stores of its take, while the parent holds the buffer:
 * after the daemon's reclaim, the parent's hold must still count. Returns whether the
 * parent's buffer was free to lease again while the parent held it (an early recycle). */
static bool take_killed_then_recycled(void)
{
    setup(1);
    uint32_t slot = parent_publishes(77);
    cr_assert_eq(slot, 0u);
    cr_assert(killed_at(3, child_takes), "the take passed step 3");
    reclaim_child();
    uint32_t s2, seq2;
    /* The parent still holds slot 0: leasing it now would be an early recycle. */
    return handoff_lease(tab, sh->child, CLS, HANDOFF_TRIES, &s2, &seq2) == 0;
}

#endif
