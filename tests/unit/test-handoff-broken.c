/* SPDX-License-Identifier: MIT */
/* test-handoff-broken.c: proto/handoff.c compiled with the order the argument forbids
 * (HANDOFF_BROKEN_ORDER: the journal stored before the word at take). A consumer killed
 * between the two leaves a journal hold the word never counted; the daemon's reclaim of
 * it then takes the producer's hold off the word, and the buffer is free while the
 * producer holds it. test-handoff.c's killed_inside_a_take_leaves_a_count_too_high is
 * the same case with the right order; this file shows that case can fail. */
#define HANDOFF_BROKEN_ORDER 1
#define HANDOFF_STEP(n) step_hook(n)
static void step_hook(int n);
#include "handoff.c"

#include "handoff-cases.h"

Test(handoff_broken, journal_before_word_at_take_recycles_under_a_live_hold)
{
    cr_assert(take_killed_then_recycled(), "the wrong order should have recycled the held buffer");
    cr_assert_eq(atomic_load(&sh->parent[0]), 1u, "while the parent's journal still holds it");
}
