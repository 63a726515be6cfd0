/* SPDX-License-Identifier: MIT */
/* test-peer.c: the replies every broker module makes (daemon/peer.c), through a fake
 * session (a struct broker_peer that records what it is sent) over a real pool under
 * /dev/shm, a real quota ledger and a real registry: refusals counted by cause and per
 * tenant, their log lines limited per peer but never their replies, buffer replies as
 * lease or acquire replies with the right flags, and the max-leases and parked caps. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <uv.h>

#include "broker-fixture.h"
#include "core-hold.h"
#include "fake-peer.h"
#include "peer.h"

#define KiB (UINT64_C(1) << 10)
#define MiB (UINT64_C(1) << 20)

struct fx {
    BROKER_FIXTURE_FIELDS;
    struct fake a, b;            /* uid 1000 and uid 1001 */
};

static void fx_open(struct fx *f)
{
    broker_fixture_open(f, "peer", 64 * MiB, 16 * MiB);
    f->opt.max_lease_size = 32 * MiB;
    f->opt.max_leases = 4;
    f->opt.max_parked_per_uid = 16;
    fake_init(&f->a, 1, 1000);
    fake_init(&f->b, 2, 1001);
}

static void fx_close(struct fx *f)
{
    registry_release_all(f->bk.reg, &f->a.peer.holder);
    registry_release_all(f->bk.reg, &f->b.peer.holder);
    cr_assert_eq(quota_total(f->bk.quota), 0, "a charge outlived every lease");
    core_close(&f->core, &f->loop);
}

static uint64_t tenant_refusals(struct fx *f, uint32_t uid, int which)
{
    struct quota_tenant t[8];
    unsigned n = quota_tenants(f->bk.quota, t, 8);
    for (unsigned i = 0; i < n; i++)
        if (t[i].uid == uid)
            switch (which) {
            case EDQUOT: return t[i].refused_quota;
            case ENOSPC: return t[i].refused_space;
            case EMFILE: return t[i].refused_limit;
            default: return t[i].refused_other;
            }
    return 0;
}

/* peer_fail: a bad request's error reply, formatted, cut at PROTO_MAX_ERRMSG, counted
 * nowhere. */
Test(peer, fail_replies_uncounted)
{
    struct fx f;
    fx_open(&f);
    peer_fail(&f.a.peer, 17, ENOENT, "no lease with handle %llu on this connection", 99ULL);
    cr_assert_eq(f.a.refusals, 1);
    cr_assert_eq(f.a.code, ENOENT);
    cr_assert_eq(f.a.refused_id, 17);
    cr_assert_str_eq(f.a.msg, "no lease with handle 99 on this connection");
    cr_assert_eq(f.counters.refused_other + f.counters.refused_quota + f.counters.refused_space +
                 f.counters.refused_limit, 0, "a bad request counted as a refusal");
    cr_assert_eq(tenant_refusals(&f, 1000, ENOENT), 0);

    char longer[2 * PROTO_MAX_ERRMSG];
    memset(longer, 'x', sizeof(longer) - 1);
    longer[sizeof(longer) - 1] = 0;
    peer_fail(&f.a.peer, 18, EINVAL, "%s", longer);
    cr_assert_eq(strlen(f.a.msg), PROTO_MAX_ERRMSG, "an error message longer than the protocol's");
    fx_close(&f);
}

/* peer_refuse: counted by cause in the daemon's counters and in the tenant's own, and
 * replied with the code and message as given. */
Test(peer, refusals_counted_by_cause_and_tenant)
{
    struct fx f;
    fx_open(&f);
    const int codes[] = { EDQUOT, ENOSPC, EMFILE, EFBIG, EINVAL, EDQUOT };
    for (unsigned i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
        char msg[64];
        snprintf(msg, sizeof(msg), "refusal %u", i);
        peer_refuse(&f.bk, &f.a.peer, 100 + i, codes[i], "lease", msg);
        cr_assert_eq(f.a.refusals, i + 1);
        cr_assert_eq(f.a.code, codes[i]);
        cr_assert_eq(f.a.refused_id, 100 + i);
        cr_assert_str_eq(f.a.msg, msg);
    }
    cr_assert_eq(f.counters.refused_quota, 2);
    cr_assert_eq(f.counters.refused_space, 1);
    cr_assert_eq(f.counters.refused_limit, 2, "EMFILE and EFBIG are limits");
    cr_assert_eq(f.counters.refused_other, 1);
    cr_assert_eq(tenant_refusals(&f, 1000, EDQUOT), 2);
    cr_assert_eq(tenant_refusals(&f, 1000, ENOSPC), 1);
    cr_assert_eq(tenant_refusals(&f, 1000, EMFILE), 2);
    cr_assert_eq(tenant_refusals(&f, 1000, EINVAL), 1);
    cr_assert_eq(tenant_refusals(&f, 1001, EDQUOT), 0, "another tenant's count moved");
    cr_assert_eq(f.b.refusals, 0);
    fx_close(&f);
}

/* ---- log lines ---------------------------------------------------------------------- */

/* capture: stderr (log.c writes plain lines to fd 2 without log_init) into a memfd. */
static int capture_start(int *ret_saved)
{
    fflush(stderr);
    int fd = memfd_create("peer-log", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    *ret_saved = dup(STDERR_FILENO);
    cr_assert_geq(*ret_saved, 0);
    cr_assert_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    return fd;
}

/* capture_end: stderr back; what was written, NUL-terminated (the caller frees it). */
static char *capture_end(int fd, int saved)
{
    cr_assert_eq(dup2(saved, STDERR_FILENO), STDERR_FILENO);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *s = calloc(1, (size_t)n + 1);
    cr_assert_not_null(s);
    cr_assert_eq(pread(fd, s, (size_t)n, 0), n);
    close(fd);
    return s;
}

static unsigned count_of(const char *s, const char *needle)
{
    unsigned n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* A peer's refusal lines are limited to LOG_RATE_LINES a second, its own: its refusals
 * past them still reply and count, another peer's still log, and the next second's first
 * line says how many were held back. */
Test(peer, refusal_lines_limited_per_peer_replies_never)
{
    struct fx f;
    fx_open(&f);
    char *out = NULL;
    /* All LOG_RATE_LINES + 1 refusals must fall in one of the peer's seconds: on a busy
     * machine a second may start between them; then the round is done again. */
    for (int round = 0; round < 50; round++) {
        free(out);
        f.a.peer.log_rate = (struct log_rate){ 0 };
        int saved, fd = capture_start(&saved);
        uint64_t start = 0;
        for (unsigned i = 0; i <= LOG_RATE_LINES; i++) {
            peer_refuse(&f.bk, &f.a.peer, 200 + i, EDQUOT, "lease", "quota exceeded for uid 1000");
            if (i == 0)
                start = f.a.peer.log_rate.start_ms;
        }
        peer_refuse(&f.bk, &f.b.peer, 300, ENOSPC, "lease", "pool full");
        out = capture_end(fd, saved);
        if (f.a.peer.log_rate.start_ms == start)
            break;
    }
    cr_assert_eq(f.a.peer.log_rate.suppressed, 1, "%s", out);
    cr_assert_eq(count_of(out, "refused lease for client 1 pid=4242 uid=1000: quota exceeded for uid 1000\n"),
                 LOG_RATE_LINES, "%s", out);
    cr_assert_eq(count_of(out, "refused lease for client 2 pid=4242 uid=1001: pool full\n"), 1,
                 "another peer's line was held back: %s", out);
    cr_assert_eq(f.a.refused_id, 200 + LOG_RATE_LINES, "a refusal past the log limit was not replied");
    cr_assert_geq(f.a.refusals, LOG_RATE_LINES + 1);
    cr_assert_geq(f.counters.refused_quota, LOG_RATE_LINES + 1);
    free(out);

    /* the peer's next second (its window moved back by one): the held-back count first */
    f.a.peer.log_rate.start_ms -= 1000;
    int saved, fd = capture_start(&saved);
    peer_refuse(&f.bk, &f.a.peer, 400, EMFILE, "acquire", "too many leases");
    out = capture_end(fd, saved);
    const char *sup = strstr(out, "client 1 pid=4242 uid=1000: suppressed 1 refusal line in the last second\n");
    const char *line = strstr(out, "refused acquire for client 1 pid=4242 uid=1000: too many leases\n");
    cr_assert(sup && line && sup < line, "%s", out);
    cr_assert_eq(f.a.refused_id, 400);
    free(out);
    fx_close(&f);
}

/* ---- buffer replies ----------------------------------------------------------------- */

/* A writing buffer is a lease reply; published, an acquire reply with its metadata. Its
 * token is the lease's, kept at publish; the fd passed is the one the peer gets. */
Test(peer, send_buffer_lease_then_acquire_reply)
{
    struct fx f;
    fx_open(&f);
    uint64_t h;
    struct registry_buf *b = core_hold(&f.core, &f.loop, 1000, 5000, &f.a.peer.holder, &h);
    uint8_t token[PROTO_TOKEN_LEN];
    memcpy(token, b->token, sizeof(token));
    peer_send_buffer(&f.a.peer, 7, h, b, b->pb->fd);
    cr_assert_eq(f.a.replies, 1);
    cr_assert_eq(f.a.last.op, PROTO_OP_LEASE + PROTO_OP_REPLY);
    cr_assert_eq(f.a.last.id, 7);
    cr_assert_eq(f.a.last.u.lease_reply.handle, h);
    cr_assert_eq(f.a.last.u.lease_reply.buf_id, b->pb->id);
    cr_assert_eq(f.a.last.u.lease_reply.size, 5000);
    cr_assert_eq(f.a.last.u.lease_reply.capacity, 8 * KiB, "the class of 5000 bytes");
    cr_assert_eq(memcmp(f.a.last.u.lease_reply.token, token, PROTO_TOKEN_LEN), 0);
    cr_assert_eq(f.a.last_fd, b->pb->fd);

    cr_assert_eq(registry_publish(f.bk.reg, b, 4000, 0, (const uint8_t *)"u8[4000]", 8), 0);
    uint64_t hb;
    cr_assert_eq(registry_hold(f.bk.reg, &f.a.peer.holder, b, false, &hb), 0);
    int ro = pool_ro_fd(f.bk.pool, b->pb);
    cr_assert_geq(ro, 0);
    peer_send_buffer(&f.a.peer, 8, hb, b, ro);
    cr_assert_eq(f.a.replies, 2);
    cr_assert_eq(f.a.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert_eq(f.a.last.id, 8);
    cr_assert_eq(f.a.last.u.acquire_reply.handle, hb);
    cr_assert_eq(f.a.last.u.acquire_reply.size, 4000);
    cr_assert_eq(f.a.last.u.acquire_reply.capacity, 8 * KiB);
    cr_assert_eq(memcmp(f.a.last.u.acquire_reply.token, token, PROTO_TOKEN_LEN), 0, "the token changed at publish");
    cr_assert_eq(f.a.last.u.acquire_reply.meta_len, 8);
    cr_assert_eq(memcmp(f.a.last.u.acquire_reply.meta, "u8[4000]", 8), 0);
    cr_assert_eq(f.a.last.u.acquire_reply.flags, 0, "its own tenant's, unsealed: no flag");
    cr_assert_eq(f.a.last_fd, ro);

    /* another tenant's view of the same buffer: foreign; once marked foreign, retire too */
    peer_send_buffer(&f.b.peer, 9, 77, b, ro);
    cr_assert_eq(f.b.last.u.acquire_reply.flags, PROTO_BUF_FOREIGN);
    b->pb->foreign = true; /* what acquire_serve marks for another tenant's acquire */
    peer_send_buffer(&f.b.peer, 10, 77, b, ro);
    cr_assert_eq(f.b.last.u.acquire_reply.flags, PROTO_BUF_FOREIGN | PROTO_BUF_RETIRE);
    peer_send_buffer(&f.a.peer, 11, hb, b, ro);
    cr_assert_eq(f.a.last.u.acquire_reply.flags, PROTO_BUF_RETIRE, "a buffer to be retired, told its own tenant");
    fx_close(&f);
}

/* A sealed publish (a memfd pool) is SEALED and RETIRE in every acquire reply. */
Test(peer, send_buffer_sealed_flags)
{
    struct fx f;
    const char *why = NULL;
    fx_open(&f);
    /* a memfd pool and a registry of its own, on the fixture's quota */
    struct core mc = { .quota = f.bk.quota };
    cr_assert_eq(pool_new(&f.loop, f.core.dir, 16 * MiB, true, &mc.pool, &why), 0, "%s", why ? why : "");
    cr_assert(pool_sealable(mc.pool));
    cr_assert_eq(registry_new(&f.loop, mc.pool, mc.quota, &mc.reg), 0);
    uint64_t h;
    struct registry_holder holder = { 0 };
    struct registry_buf *b = core_hold(&mc, &f.loop, 1000, 4096, &holder, &h);
    cr_assert_eq(pool_seal(mc.pool, b->pb), 0);
    cr_assert_eq(registry_publish(mc.reg, b, 10, 0, NULL, 0), 0);
    peer_send_buffer(&f.a.peer, 5, h, b, b->pb->fd);
    cr_assert_eq(f.a.last.op, PROTO_OP_ACQUIRE + PROTO_OP_REPLY);
    cr_assert_eq(f.a.last.u.acquire_reply.flags, PROTO_BUF_SEALED | PROTO_BUF_RETIRE);
    peer_send_buffer(&f.b.peer, 6, h, b, b->pb->fd);
    cr_assert_eq(f.b.last.u.acquire_reply.flags, PROTO_BUF_SEALED | PROTO_BUF_FOREIGN | PROTO_BUF_RETIRE);
    registry_release_all(mc.reg, &holder);
    registry_free(mc.reg);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    pool_free(mc.pool);
    uv_run(&f.loop, UV_RUN_DEFAULT);
    fx_close(&f);
}

/* ---- caps --------------------------------------------------------------------------- */

/* max-leases counts held handles, leases waiting for a new buffer and parked places. */
Test(peer, leases_left_counts_held_pending_and_parked)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_leases = 3;
    uint64_t h;
    core_hold(&f.core, &f.loop, 1000, 4096, &f.a.peer.holder, &h);
    core_hold(&f.core, &f.loop, 1000, 4096, &f.a.peer.holder, &h);
    cr_assert_eq(f.a.peer.holder.leases, 2);
    cr_assert(peer_leases_left(&f.bk, &f.a.peer, 1, "lease"), "%s", f.a.msg);
    cr_assert_eq(f.a.refusals, 0);

    f.a.peer.pending = 1; /* a third lease waits for its buffer */
    cr_assert_not(peer_leases_left(&f.bk, &f.a.peer, 2, "lease"));
    cr_assert_eq(f.a.code, EMFILE);
    cr_assert_eq(f.a.refused_id, 2);
    cr_assert_str_eq(f.a.msg, "too many leases on this connection: 3 held, limit 3");
    cr_assert_eq(f.counters.refused_limit, 1);

    f.a.peer.pending = 0;
    f.a.peer.parked.places = 1; /* or is parked */
    cr_assert_not(peer_leases_left(&f.bk, &f.a.peer, 3, "acquire"));
    cr_assert_str_eq(f.a.msg, "too many leases on this connection: 3 held (1 of them waiting), limit 3");
    cr_assert_eq(f.counters.refused_limit, 2);
    f.a.peer.parked.places = 0;

    /* the limit is read at each call, and is per peer */
    f.opt.max_leases = 4;
    cr_assert(peer_leases_left(&f.bk, &f.a.peer, 4, "lease"));
    f.opt.max_leases = 2;
    cr_assert_not(peer_leases_left(&f.bk, &f.a.peer, 5, "lease"));
    cr_assert(peer_leases_left(&f.bk, &f.b.peer, 6, "lease"), "another peer's leases counted");
    cr_assert_eq(f.b.refusals, 0);
    fx_close(&f);
}

/* --max-parked-per-uid caps the uid's waiting requests over all its connections (the
 * shared group count), or this connection's when it has no group. */
Test(peer, park_left_counts_the_uids_connections)
{
    struct fx f;
    fx_open(&f);
    f.opt.max_parked_per_uid = 4;
    unsigned group = 3;             /* waiting on all uid 1000's connections */
    f.a.peer.parked.places = 1;     /* of which this one's */
    f.a.peer.parked.group = &group;
    cr_assert(peer_park_left(&f.bk, &f.a.peer, 1, 1, "lease"));
    cr_assert_not(peer_park_left(&f.bk, &f.a.peer, 2, 2, "lease_many"));
    cr_assert_eq(f.a.code, EMFILE);
    cr_assert_str_eq(f.a.msg, "too many waiting requests for uid 1000: 3 wait on its connections (1 on this one), "
                     "2 more asked, limit 4 (--max-parked-per-uid)");
    cr_assert_eq(f.counters.refused_limit, 1);
    cr_assert_eq(tenant_refusals(&f, 1000, EMFILE), 1);

    /* no group: this connection's own places */
    f.a.peer.parked.group = NULL;
    cr_assert(peer_park_left(&f.bk, &f.a.peer, 3, 3, "lease_many"));
    cr_assert_not(peer_park_left(&f.bk, &f.a.peer, 4, 4, "lease_many"));
    cr_assert(strstr(f.a.msg, ": 1 wait on its connections (1 on this one), 4 more asked, limit 4"), "%s", f.a.msg);
    f.a.peer.parked.places = 0;
    fx_close(&f);
}
