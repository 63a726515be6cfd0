/* SPDX-License-Identifier: MIT */
/* broker.c: see broker.h. What each request means, and whose module does it: a lease is
 * one attempt (lease.c: the pipeline single leases and lease_many items share), batches
 * are batch.c's, requests that wait are waits.c's (parked in bk->waiters and in their
 * peer's own list), an acquire of a published buffer is acquire.c's. Here: the request
 * checks, publish, retain, release, and a disconnect's reclaim. */
#include "broker.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "acquire.h"
#include "batch.h"
#include "lease.h"
#include "ledgers.h"
#include "units.h"
#include "waits.h"

static void do_lease(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    uint64_t size = m->u.lease.size;
    char msg[PROTO_MAX_ERRMSG], a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX];

    if (size == 0) {
        peer_fail(p, m->id, EINVAL, "lease size must be at least 1 byte");
        return;
    }
    if (size > bk->opt->max_lease_size) {
        snprintf(msg, sizeof(msg), "lease of %s (%llu bytes) exceeds the maximum lease size %s (%llu bytes)",
                 units_format(size, a), (unsigned long long)size,
                 units_format(bk->opt->max_lease_size, b), (unsigned long long)bk->opt->max_lease_size);
        peer_refuse(bk, p, m->id, EFBIG, "lease", msg);
        return;
    }
    if (!peer_leases_left(bk, p, m->id, "lease"))
        return;
    bool stock = (m->u.lease.flags & PROTO_LEASE_STOCK) != 0;
    uint32_t wait = bk->loop && !stock ? m->u.lease.wait_ms : 0; /* a stock lease never waits */
    if (wait > PROTO_MAX_LEASE_WAIT_MS)
        wait = PROTO_MAX_LEASE_WAIT_MS;
    if (wait && lease_beyond_all(bk, p, m->id, &size, 1, "lease"))
        return;
    /* FIFO within a tenant: a waiting lease never overtakes its tenant's earlier waiters. */
    struct waiters_queue *q = wait ? waiters_tenant(&bk->waiters, p->uid) : NULL;
    if (q && waits_park_lease(bk, p, m->id, size, m->u.lease.flags, q->tail->blocked, wait) != -ENOMEM)
        return; /* parked, or refused at --max-parked-per-uid */
    int r = lease_one(bk, p, m->id, size, wait != 0, m->u.lease.flags & (PROTO_LEASE_STOCK | PROTO_LEASE_TABLE), msg,
                      sizeof(msg));
    if (r == 0)
        return;
    if (wait && waits_park_lease(bk, p, m->id, size, m->u.lease.flags, -r, wait) != -ENOMEM)
        return;
    peer_refuse(bk, p, m->id, -r, "lease", msg);
}

/* publish_seal: a sealed publish: F_SEAL_WRITE on the buffer before it gets a token.
 * Returns false after refusing. */
static bool publish_seal(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b)
{
    if (!pool_sealable(bk->pool)) {
        peer_fail(p, id, EOPNOTSUPP, "a sealed publish needs a memfd pool (shmrefd --memfd); this pool is %s, "
             "whose files cannot be sealed", pool_kind(bk->pool));
        return false;
    }
    int r = pool_seal(bk->pool, b->pb);
    if (r == -EBUSY) {
        peer_fail(p, id, EBUSY, "buffer %llu is still mapped writable (by its producer, or cached by a process "
             "that leased it before): it cannot be sealed; unmap it first", (unsigned long long)b->pb->id);
        return false;
    }
    if (r < 0) {
        peer_fail(p, id, -r, "sealing buffer %llu failed: %s", (unsigned long long)b->pb->id, strerror(-r));
        return false;
    }
    return true;
}

static void do_publish(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_lease *l = registry_lease_of(&p->holder, m->u.publish.handle);
    if (!l) {
        peer_fail(p, m->id, ENOENT, "no lease with handle %llu on this connection",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    struct registry_buf *b = l->buf;
    if (!l->writable) {
        peer_fail(p, m->id, EPERM, "handle %llu is an acquired (read-only) lease; only its producer publishes",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if (m->u.publish.size > b->size) {
        peer_fail(p, m->id, EINVAL, "publish of %llu bytes exceeds the leased size %llu",
             (unsigned long long)m->u.publish.size, (unsigned long long)b->size);
        return;
    }
    if (b->published) {
        peer_fail(p, m->id, EALREADY, "buffer of handle %llu is already published",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if ((m->u.publish.flags & PROTO_PUBLISH_SEALED) && !publish_seal(bk, p, m->id, b))
        return;
    b->max_acquires = m->u.publish.max_acquires;
    int r = registry_publish(bk->reg, b, m->u.publish.size, m->u.publish.keep_ms, m->u.publish.meta,
                             m->u.publish.meta_len);
    if (r == -EALREADY) {
        peer_fail(p, m->id, EALREADY, "buffer of handle %llu is already published",
             (unsigned long long)m->u.publish.handle);
        return;
    }
    if (r < 0) {
        peer_fail(p, m->id, -r, "publish failed: %s", strerror(-r));
        return;
    }
    bk->counters->publishes++;
    pool_unstock(bk->pool, b->pb); /* a stock lease in use now: counted in the cap if it fits */
    /* NOREPLY: the producer knows the token from the lease reply */
    if (!(m->u.publish.flags & PROTO_PUBLISH_NOREPLY)) {
        struct proto_msg rep = { .op = PROTO_OP_PUBLISH + PROTO_OP_REPLY, .id = m->id };
        memcpy(rep.u.publish_reply.token, b->token, PROTO_TOKEN_LEN);
        rep.u.publish_reply.size = b->size;
        p->ops->reply(p, &rep, -1);
    }
    waits_serve_acquires(bk, b); /* after sealing, for a sealed publish */
}

static void do_acquire(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_buf *b = registry_find(bk->reg, m->u.acquire.token);
    if (b) {
        acquire_serve(bk, p, m->id, b);
        return;
    }
    /* A publish made in its tenant's table: the daemon holds it there (one hold while it
     * has references), and a refused acquire gives that hold back at once. */
    if ((b = registry_find_table(bk->reg, m->u.acquire.token))) {
        acquire_serve(bk, p, m->id, b);
        if (b->refs == 0)
            registry_buf_drop(bk->reg, b);
        return;
    }
    uint32_t wait = bk->loop ? m->u.acquire.wait_ms : 0;
    if (wait > PROTO_MAX_ACQUIRE_WAIT_MS)
        wait = PROTO_MAX_ACQUIRE_WAIT_MS;
    /* Leased under this token, not published yet: wait for its publish (the consumer may
     * have the descriptor before the producer's one-way publish reached us). */
    b = wait ? registry_find_writing(bk->reg, m->u.acquire.token) : NULL;
    if (!b) {
        peer_fail(p, m->id, ENOENT,
                  "no published buffer for this descriptor (never published, released by every "
                  "holder, or its retention ran out)");
        return;
    }
    waits_park_acquire(bk, p, m->id, b, wait);
}

/* retain_holder: whether p holds b: a handle on it, or a hold in its journal. Only a
 * holder may extend a buffer's life: it could have kept it alive itself. */
static bool retain_holder(struct broker_peer *p, const struct registry_buf *b)
{
    return registry_holds(&p->holder, b) || (p->ops->table_holds && p->ops->table_holds(p, b));
}

/* do_retain: PROTO_OP_RETAIN. The retention is its tenant's charge (the buffer's, as at
 * its publish): only that uid may add one, and only on a buffer it holds, so a flood of
 * retains keeps alive nothing but what the flooder's own quota pays for (and a lease of
 * its that would fail for quota reclaims them first: registry_reclaim_retained). */
static void do_retain(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    struct registry_buf *b = registry_find(bk->reg, m->u.retain.token);
    /* a publish made in its tenant's table: held there by the daemon from here (the
     * retention is that hold), given back below if the retain is refused */
    bool taken = !b && (b = registry_find_table(bk->reg, m->u.retain.token)) != NULL;
    const char *refusal = NULL;
    int code = 0;
    if (!b) {
        peer_fail(p, m->id, ENOENT,
                  "retain: no published buffer for this descriptor (never published, released by every "
                  "holder, or its retention ran out)");
        return;
    }
    if (p->uid != b->tenant) {
        code = EPERM;
        refusal = "retain: the buffer is another uid's (its retention would be charged to that uid): only "
                  "its producer's uid may retain it";
    } else if (m->u.retain.keep_ms == 0) {
        code = EINVAL;
        refusal = "retain: keep_ms must be at least 1";
    } else if (!retain_holder(p, b)) {
        code = EPERM;
        refusal = "retain: this connection does not hold the buffer (acquire it first)";
    } else if (registry_retain(bk->reg, b, m->u.retain.keep_ms) < 0) {
        code = ENOMEM;
        refusal = "daemon out of memory";
    }
    if (taken && b->refs == 0)
        registry_buf_drop(bk->reg, b); /* the table's again */
    if (code == EPERM)
        peer_refuse(bk, p, m->id, code, "retain", refusal);
    else if (code)
        peer_fail(p, m->id, code, "%s", refusal);
    else {
        struct proto_msg r = { .op = PROTO_OP_RETAIN + PROTO_OP_REPLY, .id = m->id };
        p->ops->reply(p, &r, -1);
    }
}

static void do_release(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    if (registry_release(bk->reg, &p->holder, m->u.release.handle) < 0) {
        peer_fail(p, m->id, ENOENT, "no lease with handle %llu on this connection",
             (unsigned long long)m->u.release.handle);
        return;
    }
    bk->counters->releases++;
    if (m->u.release.flags & PROTO_RELEASE_NOREPLY)
        return;
    struct proto_msg r = { .op = PROTO_OP_RELEASE + PROTO_OP_REPLY, .id = m->id };
    p->ops->reply(p, &r, -1);
}

void broker_start(struct broker *bk, uv_loop_t *loop)
{
    waits_start(bk, loop);
}

void broker_stop(struct broker *bk)
{
    waits_stop(bk);
}

void broker_kick(struct broker *bk)
{
    waits_kick(bk);
}

bool broker_handle(struct broker *bk, struct broker_peer *p, const struct proto_msg *m)
{
    switch (m->op) {
    case PROTO_OP_LEASE: do_lease(bk, p, m); return true;
    case PROTO_OP_PUBLISH: do_publish(bk, p, m); return true;
    case PROTO_OP_ACQUIRE: do_acquire(bk, p, m); return true;
    case PROTO_OP_RELEASE: do_release(bk, p, m); return true;
    case PROTO_OP_LEASE_MANY: batch_lease_many(bk, p, m); return true;
    case PROTO_OP_RELEASE_MANY: batch_release_many(bk, p, m); return true;
    case PROTO_OP_RETAIN: do_retain(bk, p, m); return true;
    default: return false;
    }
}

void broker_mapped(struct broker *bk, struct broker_peer *p, uint64_t buf_id)
{
    pool_mapped(bk->pool, buf_id, p->uid);
}

void broker_unmapped(struct broker *bk, struct broker_peer *p, uint64_t buf_id)
{
    pool_unmapped(bk->pool, buf_id, p->uid);
}

/* lease_named: p's lease of handle if it still names buffer buf_id, else NULL. */
static struct registry_lease *lease_named(struct broker_peer *p, uint64_t handle, uint64_t buf_id)
{
    struct registry_lease *l = registry_lease_of(&p->holder, handle);
    return l && l->buf->pb->id == buf_id ? l : NULL;
}

static int lease_fd(struct broker *bk, const struct registry_lease *l)
{
    return l->writable ? l->buf->pb->fd : pool_ro_fd(bk->pool, l->buf->pb);
}

int broker_lease_fd(struct broker *bk, struct broker_peer *p, uint64_t handle, uint64_t buf_id)
{
    struct registry_lease *l = lease_named(p, handle, buf_id);
    return l ? lease_fd(bk, l) : -ESTALE;
}

void broker_resend(struct broker *bk, struct broker_peer *p, uint32_t id, uint64_t handle, uint64_t buf_id)
{
    struct registry_lease *l = lease_named(p, handle, buf_id);
    if (!l) {
        peer_fail(p, id, EINVAL, "handle %llu was released before its reply was sent", (unsigned long long)handle);
        return;
    }
    int fd = lease_fd(bk, l);
    if (fd < 0) {
        peer_fail(p, id, -fd, "cannot open the buffer read-only: %s", strerror(-fd));
        return;
    }
    peer_send_buffer(p, id, handle, l->buf, fd);
}

bool broker_pins_after_close(struct broker *bk, uint64_t buf_id)
{
    return pool_pins_after_close(bk->pool, buf_id);
}

void broker_hold_until_exit(struct broker *bk, struct broker_peer *p, int pidfd, const uint64_t *ids, unsigned n)
{
    if (pool_hold_until_exit(bk->pool, p->uid, p->pid, pidfd, ids, n) < 0)
        log_warning("client %llu pid=%d uid=%u: out of memory: its mappings of %u sealed buffer%s are no longer "
                    "charged to it", (unsigned long long)p->id, (int)p->pid, (unsigned)p->uid, n, n == 1 ? "" : "s");
}

uint32_t broker_disconnect(struct broker *bk, struct broker_peer *p)
{
    waits_drop_peer(bk, p); /* first, silently: nothing was charged for them */
    uint32_t n = registry_release_all(bk->reg, &p->holder);
    if (n) {
        bk->counters->reclaimed_leases += n;
        bk->counters->reclaimed_clients++;
    }
    return n;
}

void broker_check(struct broker *bk)
{
    ledgers_check(bk);
}
