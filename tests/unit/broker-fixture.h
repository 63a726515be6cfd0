/* SPDX-License-Identifier: MIT */
/* broker-fixture.h: what the unit tests of the broker's modules (broker, acquire, lease,
 * peer, ledgers) hold them in: the test's loop, a core on it (core-fixture.h) and a
 * struct broker over the core with options and counters of its own. Test code only. */
#ifndef SHMREF_TEST_BROKER_FIXTURE_H
#define SHMREF_TEST_BROKER_FIXTURE_H

#include <string.h>

#include <uv.h>

#include "core-fixture.h"
#include "peer.h"

/* BROKER_FIXTURE_FIELDS: the first fields of such a test's struct fx, its peers after
 * them (as libuv's UV_HANDLE_FIELDS open its handles), so that the tests keep writing
 * f.bk, f.opt, f.counters, f.loop. */
#define BROKER_FIXTURE_FIELDS                                                                   \
    uv_loop_t loop;                                                                             \
    struct core core;                                                                           \
    struct options opt;                                                                         \
    struct counters counters;                                                                   \
    struct broker bk

/* broker_fixture_open: f (a struct fx opening with BROKER_FIXTURE_FIELDS) zeroed, its core
 * opened as core_open(name, pool_cap, default_quota) does, and its broker set over it.
 * The options are left 0: each test sets those its module reads. */
#define broker_fixture_open(f, name, pool_cap, default_quota)                                   \
    do {                                                                                        \
        memset((f), 0, sizeof(*(f)));                                                           \
        core_open(&(f)->core, &(f)->loop, (name), (pool_cap), (default_quota));                 \
        (f)->bk = (struct broker){ .opt = &(f)->opt, .pool = (f)->core.pool, .quota = (f)->core.quota, \
                                   .reg = (f)->core.reg, .counters = &(f)->counters };          \
    } while (0)

#endif
