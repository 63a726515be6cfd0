/* SPDX-License-Identifier: MIT */
/* test-acquire.c: an acquire of a published buffer (daemon/acquire.c) through a fake
 * session (a struct broker_peer that records its replies) over a real pool under
 * /dev/shm, a real quota ledger and a real registry: the consumer gets a read-only fd of
 * the producer's bytes and a handle; another tenant's acquire marks the buffer foreign
 * (never recycled to its producer); max-leases and a tenant past its quota with pinned
 * bytes are refused with nothing held. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uv.h>

#include "acquire.h"
#include "broker-fixture.h"
#include "core-hold.h"
#include "fake-peer.h"
#include "handoff.h"
#include "ledgers.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    BROKER_FIXTURE_FIELDS;
    struct fake prod, same, other;   /* uid 1000 twice, uid 1001 */
};

static void fx_open(struct fx *f)
{
    broker_fixture_open(f, "acquire", 64 * MiB, 16 * MiB);
    f->opt.max_lease_size = 32 * MiB;
    f->opt.max_leases = 4;
    f->opt.max_parked_per_uid = 16;
    fake_init(&f->prod, 1, 1000);
    fake_init(&f->same, 2, 1000);
    fake_init(&f->other, 3, 1001);
}

static void fx_close(struct fx *f)
{
    registry_release_all(f->bk.reg, &f->prod.peer.holder);
    registry_release_all(f->bk.reg, &f->same.peer.holder);
    registry_release_all(f->bk.reg, &f->other.peer.holder);
    ledgers_check(&f->bk);
    cr_assert_eq(quota_total(f->bk.quota), 0, "a charge outlived every lease");
    core_close(&f->core, &f->loop);
}

/* lease_buf: what a lease does, by hand (core_hold): a buffer of p's uid, its class
 * charged, held writable by p. */
static struct registry_buf *lease_buf(struct fx *f, struct fake *p, uint64_t size, uint64_t *ret_handle)
{
    return core_hold(&f->core, &f->loop, p->peer.uid, size, &p->peer.holder, ret_handle);
}

/* produce: a lease (lease_buf) filled with byte and published at size with metadata. */
static struct registry_buf *produce(struct fx *f, struct fake *p, uint64_t size, uint8_t byte, uint64_t *ret_handle)
{
    struct registry_buf *b = lease_buf(f, p, size, ret_handle);
    uint8_t chunk[4096];
    memset(chunk, byte, sizeof(chunk));
    for (uint64_t off = 0; off < size; off += sizeof(chunk)) {
        size_t n = size - off < sizeof(chunk) ? (size_t)(size - off) : sizeof(chunk);
        cr_assert_eq(pwrite(b->pb->fd, chunk, n, (off_t)off), (ssize_t)n);
    }
    cr_assert_eq(registry_publish(f->bk.reg, b, size, 0, (const uint8_t *)"i4", 2), 0);
    ledgers_check(&f->bk);
    return b;
}

/* The consumer of the producer's uid: an acquire reply with a handle on the buffer and a
 * read-only fd that reads the producer's bytes and cannot be mapped for writing. */
Test(acquire, serves_a_read_only_fd_of_the_bytes)
{
    struct fx f;
    fx_open(&f);
    uint64_t hp;
    struct registry_buf *b = produce(&f, &f.prod, 6000, 0x5a, &hp);
    acquire_serve(&f.bk, &f.same.peer, 21, b);
    ledgers_check(&f.bk);
    cr_assert_eq(f.same.refusals, 0, "%s", f.same.msg);
    cr_assert_eq(f.same.replies, 1);
    cr_assert_eq(f.same.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert_eq(f.same.last.id, 21);
    cr_assert_eq(f.same.last.u.acquire_reply.buf_id, b->pb->id);
    cr_assert_eq(f.same.last.u.acquire_reply.size, 6000);
    cr_assert_eq(f.same.last.u.acquire_reply.meta_len, 2);
    cr_assert_eq(f.same.last.u.acquire_reply.flags, 0, "its own tenant's buffer");

    uint64_t h = f.same.last.u.acquire_reply.handle;
    struct registry_lease *l = registry_lease_of(&f.same.peer.holder, h);
    cr_assert_not_null(l, "the reply's handle is not held");
    cr_assert_eq(l->buf, b);
    cr_assert_not(l->writable, "an acquire holds writable");
    cr_assert_eq(b->refs, 2, "the producer's handle and the consumer's");

    int fd = f.same.last_fd;
    cr_assert_geq(fd, 0);
    cr_assert_neq(fd, b->pb->fd, "the producer's writable fd went to a consumer");
    cr_assert_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    cr_assert_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), MAP_FAILED,
                 "the consumer's fd maps writable");
    cr_assert_eq(errno, EACCES);
    uint8_t got[6000];
    cr_assert_eq(pread(fd, got, sizeof(got), 0), (ssize_t)sizeof(got));
    for (size_t i = 0; i < sizeof(got); i++)
        cr_assert_eq(got[i], 0x5a, "byte %zu", i);

    cr_assert_eq(f.counters.acquires, 1);
    cr_assert_eq(b->acquires, 1);
    cr_assert_not(b->pb->foreign, "its own tenant's acquire made it foreign");

    /* both go: back warm to its tenant, the charge credited */
    cr_assert_eq(registry_release(f.bk.reg, &f.same.peer.holder, h), 0);
    cr_assert_eq(registry_release(f.bk.reg, &f.prod.peer.holder, hp), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 8 * KiB, "a same-tenant buffer was not recycled");
    fx_close(&f);
}

/* Another tenant's acquire marks the buffer foreign: the reply says FOREIGN and RETIRE,
 * and at its last release it is retired, never its producer's next lease. */
Test(acquire, another_tenant_marks_it_foreign)
{
    struct fx f;
    fx_open(&f);
    uint64_t hp;
    struct registry_buf *b = produce(&f, &f.prod, 6000, 0x11, &hp);
    uint64_t id = b->pb->id;
    acquire_serve(&f.bk, &f.other.peer, 22, b);
    ledgers_check(&f.bk);
    cr_assert_eq(f.other.replies, 1, "%s", f.other.msg);
    cr_assert_eq(f.other.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert(b->pb->foreign);
    cr_assert_eq(f.other.last.u.acquire_reply.flags, PROTO_BUF_FOREIGN | PROTO_BUF_RETIRE);
    cr_assert_eq(fcntl(f.other.last_fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    cr_assert_eq(f.counters.acquires, 1);
    cr_assert_eq(quota_held(f.bk.quota, 1001), 0, "the consumer was charged for the producer's buffer");

    /* the producer's own later acquire is told it is to be retired too */
    acquire_serve(&f.bk, &f.same.peer, 23, b);
    cr_assert_eq(f.same.last.u.acquire_reply.flags, PROTO_BUF_RETIRE);
    cr_assert_eq(f.counters.acquires, 2);
    cr_assert_eq(b->acquires, 2);

    registry_release_all(f.bk.reg, &f.other.peer.holder);
    registry_release_all(f.bk.reg, &f.same.peer.holder);
    cr_assert_eq(registry_release(f.bk.reg, &f.prod.peer.holder, hp), 0);
    cr_assert_eq(pool_bytes_warm(f.bk.pool), 0, "a buffer another tenant mapped went back warm");
    cr_assert_eq(pool_slot_of(f.bk.pool, id, 1000), HANDOFF_NO_SLOT, "a foreign buffer still exists");
    fx_close(&f);
}

/* An acquire counts under max-leases like a lease: past it, EMFILE and nothing held. */
Test(acquire, refused_past_max_leases_holding_nothing)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_leases = 2;
    uint64_t hp;
    struct registry_buf *b = produce(&f, &f.prod, 4096, 1, &hp);
    acquire_serve(&f.bk, &f.other.peer, 31, b);
    acquire_serve(&f.bk, &f.other.peer, 32, b);
    cr_assert_eq(f.other.replies, 2, "%s", f.other.msg);
    acquire_serve(&f.bk, &f.other.peer, 33, b);
    ledgers_check(&f.bk);
    cr_assert_eq(f.other.replies, 2);
    cr_assert_eq(f.other.refusals, 1);
    cr_assert_eq(f.other.code, EMFILE);
    cr_assert(strstr(f.other.msg, "2 held, limit 2"), "%s", f.other.msg);
    cr_assert_eq(f.other.peer.holder.leases, 2);
    cr_assert_eq(b->refs, 3);
    cr_assert_eq(b->acquires, 2, "a refused acquire was counted");
    cr_assert_eq(f.counters.acquires, 2);
    cr_assert_eq(f.counters.refused_limit, 1);

    /* a refused acquire of another tenant's buffer does not mark it foreign */
    uint64_t hp2;
    struct registry_buf *b2 = produce(&f, &f.prod, 4096, 2, &hp2);
    acquire_serve(&f.bk, &f.other.peer, 34, b2);
    cr_assert_eq(f.other.code, EMFILE);
    cr_assert_not(b2->pb->foreign, "a refused acquire marked the buffer foreign");
    fx_close(&f);
}

/* A tenant whose charges and pinned bytes are past its quota may not acquire another
 * tenant's buffer (it would pin it once retired): EDQUOT with the numbers. Its own
 * tenant's buffers it still acquires. */
Test(acquire, pinned_past_quota_refuses_only_foreign)
{
    struct fx f;
    fx_open(&f);
    uint64_t hp, hp2, hx, hy;
    struct registry_buf *b = produce(&f, &f.prod, 4096, 3, &hp);
    struct registry_buf *b2 = produce(&f, &f.prod, 4096, 3, &hp2);
    /* uid 1001: two 8 KiB buffers; it keeps mapping x after releasing it: x is warm and
     * pinned, charged to uid 1001 */
    struct registry_buf *x = produce(&f, &f.other, 8 * KiB, 4, &hx);
    struct registry_buf *y = produce(&f, &f.other, 8 * KiB, 5, &hy);
    uint64_t xid = x->pb->id;
    cr_assert_eq(pool_mapped(f.bk.pool, xid, 1001), 0);
    cr_assert_eq(registry_release(f.bk.reg, &f.other.peer.holder, hx), 0);
    cr_assert_eq(pool_bytes_pinned(f.bk.pool), 8 * KiB);
    cr_assert_eq(quota_held(f.bk.quota, 1001), 16 * KiB);
    /* at its quota it may still acquire another tenant's buffer: not past it */
    quota_set(f.bk.quota, 1001, 16 * KiB);
    acquire_serve(&f.bk, &f.other.peer, 41, b);
    cr_assert_eq(f.other.refusals, 0, "%s", f.other.msg);
    cr_assert_eq(f.other.replies, 1);
    cr_assert_eq(registry_release(f.bk.reg, &f.other.peer.holder, f.other.last.u.acquire_reply.handle), 0);

    /* a lowered limit: past it now */
    quota_set(f.bk.quota, 1001, 8 * KiB);
    uint32_t refs = b2->refs;
    acquire_serve(&f.bk, &f.other.peer, 42, b2);
    ledgers_check(&f.bk);
    cr_assert_eq(f.other.refusals, 1);
    cr_assert_eq(f.other.code, EDQUOT);
    cr_assert(strstr(f.other.msg, "quota exceeded for uid 1001"), "%s", f.other.msg);
    cr_assert(strstr(f.other.msg, "(8192 bytes) of buffers no lease holds"), "%s", f.other.msg);
    cr_assert_eq(b2->refs, refs, "a refused acquire holds the buffer");
    cr_assert_not(b2->pb->foreign, "a refused acquire marked the buffer foreign");
    cr_assert_eq(b2->acquires, 0);
    cr_assert_eq(f.counters.refused_quota, 1);

    /* its own buffer: served all the same */
    acquire_serve(&f.bk, &f.other.peer, 43, y);
    cr_assert_eq(f.other.refusals, 1, "%s", f.other.msg);
    cr_assert_eq(f.other.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert_eq(f.other.last.id, 43);
    pool_unmapped(f.bk.pool, xid, 1001);
    fx_close(&f);
}

/* Each acquire is counted for the buffer's retention: max_acquires 2 ends it at the
 * second, and the buffer then lives only as long as its handles. */
Test(acquire, counts_toward_max_acquires)
{
    struct fx f;
    fx_open(&f);
    uint64_t hp;
    struct registry_buf *b = lease_buf(&f, &f.prod, 4096, &hp);
    b->max_acquires = 2;
    cr_assert_eq(registry_publish(f.bk.reg, b, 4096, 60000, NULL, 0), 0);
    cr_assert_eq(registry_release(f.bk.reg, &f.prod.peer.holder, hp), 0);
    cr_assert(b->retained);

    acquire_serve(&f.bk, &f.same.peer, 51, b);
    cr_assert(b->retained, "ended at the first of two acquires");
    acquire_serve(&f.bk, &f.other.peer, 52, b);
    cr_assert_eq(f.same.replies + f.other.replies, 2);
    cr_assert_not(b->retained, "the retention outlived its max_acquires");
    cr_assert_eq(registry_stats(f.bk.reg).retained, 0);
    cr_assert_eq(registry_stats(f.bk.reg).buffers, 1, "held by the two consumers");
    fx_close(&f);
}
