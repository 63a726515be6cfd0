/* SPDX-License-Identifier: MIT */
/* registry.c: see registry.h. Every live buffer (writing or published) is in a chained
 * hash keyed by its token's bytes 4..11 (random; bytes 0..3 are its pool slot, for the
 * ledger: handoff_set_slot), so that is a good hash: a
 * buffer gets its token when it is leased, so the producer knows its descriptor before
 * publishing. Tokens come from a stock refilled by one getrandom per TOKEN_STOCK leases.
 * A handle is (slot generation << 32 | slot index), with generations starting at 1, so 0
 * is never a handle. */
#include "registry.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "desc.h"
#include "handoff.h"

#define NO_SLOT UINT32_MAX
#define TOKEN_STOCK 64 /* tokens drawn by one getrandom */
#define TENANT_BUCKETS 64

/* The retained buffers of one uid, in the order their retentions started: what
 * registry_reclaimable and registry_reclaim_retained read, so that their work is bounded
 * by the tenant's own retained buffers, never by every live buffer (a lease refused for
 * quota asks both). Made at the uid's first retention, freed with its last. */
struct registry_tenant {
    uint32_t uid;
    struct registry_buf *head, *tail;
    struct registry_tenant *next; /* bucket chain */
};

struct registry {
    uv_loop_t *loop;
    struct pool *pool;
    struct quota *quota;
    struct registry_buf **buckets;
    uint32_t nbuckets, nhashed;
    struct registry_stats st;
    struct registry_events ev;
    uint8_t stock[TOKEN_STOCK * PROTO_TOKEN_LEN]; /* random bytes not yet handed out */
    unsigned stock_left;                          /* tokens left in stock */
    struct registry_lender lender;
    uint8_t hash_key[16];   /* bucket_of's: tokens of the tenants' tables are the clients' */
    struct registry_tenant *tenants[TENANT_BUCKETS];
};

static struct registry_tenant **tenant_slot(struct registry *r, uint32_t uid)
{
    struct registry_tenant **t = &r->tenants[uid % TENANT_BUCKETS];
    while (*t && (*t)->uid != uid)
        t = &(*t)->next;
    return t;
}

/* retained_link: b's retention started: at the tail of its tenant's list. -ENOMEM. */
static int retained_link(struct registry *r, struct registry_buf *b)
{
    struct registry_tenant **slot = tenant_slot(r, b->tenant), *t = *slot;
    if (!t) {
        if (!(t = calloc(1, sizeof(*t))))
            return -ENOMEM;
        t->uid = b->tenant;
        *slot = t;
    }
    b->ret_next = NULL;
    b->ret_prev = t->tail;
    if (t->tail)
        t->tail->ret_next = b;
    else
        t->head = b;
    t->tail = b;
    return 0;
}

static void retained_unlink(struct registry *r, struct registry_buf *b)
{
    struct registry_tenant **slot = tenant_slot(r, b->tenant), *t = *slot;
    if (!t)
        return;
    if (b->ret_prev)
        b->ret_prev->ret_next = b->ret_next;
    else
        t->head = b->ret_next;
    if (b->ret_next)
        b->ret_next->ret_prev = b->ret_prev;
    else
        t->tail = b->ret_prev;
    b->ret_prev = b->ret_next = NULL;
    if (!t->head) {
        *slot = t->next;
        free(t);
    }
}

/* on_pin: bytes a tenant's mappings keep alive after their buffer's end count against
 * that tenant's quota (never as a charge of a live buffer: the ledgers stay as they are). */
static void on_pin(void *arg, uint32_t uid, int64_t delta)
{
    struct registry *r = arg;
    quota_pin(r->quota, uid, delta);
    if (delta < 0 && r->ev.freed)
        r->ev.freed(r->ev.arg, NULL);
}

void registry_set_events(struct registry *r, const struct registry_events *ev)
{
    r->ev = ev ? *ev : (struct registry_events){ 0 };
}

int registry_new(uv_loop_t *loop, struct pool *pool, struct quota *quota, struct registry **ret)
{
    struct registry *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->nbuckets = 64;
    r->buckets = calloc(r->nbuckets, sizeof(*r->buckets));
    if (!r->buckets) {
        free(r);
        return -ENOMEM;
    }
    if (getrandom(r->hash_key, sizeof(r->hash_key), GRND_NONBLOCK) != (ssize_t)sizeof(r->hash_key)) {
        free(r->buckets);
        free(r);
        return -EIO;
    }
    r->loop = loop;
    r->pool = pool;
    r->quota = quota;
    pool_set_pin_cb(pool, on_pin, r);
    *ret = r;
    return 0;
}

/* bucket_of: keyed (SipHash under a random key): a table publish's token is drawn by the
 * client, which could otherwise choose tokens that all fall in one bucket. */
static uint32_t bucket_of(const struct registry *r, const uint8_t *token)
{
    return (uint32_t)(handoff_siphash(r->hash_key, token, PROTO_TOKEN_LEN) & (r->nbuckets - 1));
}

static void hash_grow(struct registry *r)
{
    uint32_t n = r->nbuckets * 2;
    struct registry_buf **nb = calloc(n, sizeof(*nb));
    if (!nb)
        return; /* keep the old table: chains get longer, nothing breaks */
    struct registry_buf **old = r->buckets;
    uint32_t oldn = r->nbuckets;
    r->buckets = nb;
    r->nbuckets = n;
    for (uint32_t i = 0; i < oldn; i++) {
        while (old[i]) {
            struct registry_buf *b = old[i];
            old[i] = b->hnext;
            uint32_t k = bucket_of(r, b->token);
            b->hnext = nb[k];
            nb[k] = b;
        }
    }
    free(old);
}

static void hash_add(struct registry *r, struct registry_buf *b)
{
    if (r->nhashed >= r->nbuckets)
        hash_grow(r);
    uint32_t k = bucket_of(r, b->token);
    b->hnext = r->buckets[k];
    r->buckets[k] = b;
    r->nhashed++;
}

/* token_new: a fresh random token. Never blocks the loop: main waited once for the
 * kernel's generator at start, and after that getrandom does not block (GRND_NONBLOCK
 * only makes sure of it). A used token is wiped from the stock. */
static int token_new(struct registry *r, uint8_t *token)
{
    if (!r->stock_left) {
        ssize_t got = getrandom(r->stock, sizeof(r->stock), GRND_NONBLOCK);
        if (got != (ssize_t)sizeof(r->stock))
            return got < 0 && errno == EAGAIN ? -EAGAIN : -EIO;
        r->stock_left = TOKEN_STOCK;
    }
    uint8_t *t = r->stock + --r->stock_left * PROTO_TOKEN_LEN;
    memcpy(token, t, PROTO_TOKEN_LEN);
    memset(t, 0, PROTO_TOKEN_LEN);
    return 0;
}

static void hash_remove(struct registry *r, struct registry_buf *b)
{
    struct registry_buf **p = &r->buckets[bucket_of(r, b->token)];
    while (*p && *p != b)
        p = &(*p)->hnext;
    if (*p) {
        *p = b->hnext;
        r->nhashed--;
    }
}

struct registry_buf *registry_buf_charged(struct registry *r, struct pool_buf *pb,
                                          struct quota_ticket *charge, uint64_t size)
{
    if (charge->bytes != pb->size)
        r->st.drift++; /* the class was computed twice, differently: a bug */
    struct registry_buf *b = calloc(1, sizeof(*b));
    if (!b) {
        errno = ENOMEM;
        return NULL;
    }
    int e = token_new(r, b->token);
    if (e < 0) {
        free(b);
        errno = -e;
        return NULL;
    }
    handoff_set_slot(b->token, pb->slot); /* a client finds its directory entry by its token */
    hash_add(r, b);
    b->pb = pb;
    b->tenant = charge->uid;
    charge->bytes = 0; /* the registry's now: given back in buf_gone */
    b->size = size;
    b->reg = r;
    b->created_ms = uv_now(r->loop);
    r->st.buffers++;
    r->st.bytes += pb->size;
    return b;
}

struct registry_buf *registry_buf_new(struct registry *r, struct pool_buf *pb, uint32_t tenant,
                                      uint64_t size)
{
    struct quota_ticket t = { .uid = tenant, .bytes = pb->size };
    return registry_buf_charged(r, pb, &t, size);
}

/* give_back: the one place a charge is credited: at a buffer's end, or for a lease that
 * never became one. The buffer, if any, goes back to the pool. */
static void give_back(struct registry *r, struct quota_ticket *charge, struct pool_buf *pb)
{
    if (quota_return(r->quota, charge) < 0)
        r->st.drift++;
    if (pb)
        pool_put(r->pool, pb);
    if (r->ev.freed)
        r->ev.freed(r->ev.arg, NULL);
}

void registry_abandon(struct registry *r, struct quota_ticket *charge, struct pool_buf *pb)
{
    give_back(r, charge, pb);
}

void registry_set_lender(struct registry *r, const struct registry_lender *lender)
{
    r->lender = lender ? *lender : (struct registry_lender){ 0 };
}

/* buf_end: credit the producer, recycle the buffer. */
static void buf_end(struct registry *r, struct registry_buf *b)
{
    r->st.buffers--;
    r->st.bytes -= b->pb->size;
    struct quota_ticket charge = { .uid = b->tenant, .bytes = b->pb->size };
    give_back(r, &charge, b->pb);
    free(b->meta);
    free(b);
}

/* buf_gone: the last reference went: its token is forgotten, and unless its tenant's
 * table keeps it (the lender's, LENT), the producer is credited and the buffer recycled. */
static void buf_gone(struct registry *r, struct registry_buf *b)
{
    if (b->waiting && r->ev.gone_waited)
        r->ev.gone_waited(r->ev.arg, b);
    if (b->published)
        r->st.published--;
    hash_remove(r, b); /* its token is forgotten: a recycled buffer gets a new one */
    b->published = false;
    free(b->meta);
    b->meta = NULL;
    b->meta_len = 0;
    if (r->lender.lend && r->lender.lend(r->lender.arg, b)) {
        /* no daemon reference is left to send its read-only fd: a member holds one fd,
         * as a warm buffer does (else every member once acquired through the daemon
         * kept two, and acquires failed EMFILE at half the buffers the fds allow) */
        pool_ro_close(r->pool, b->pb);
        b->lent = true;
        r->st.lent++;
        r->st.lent_bytes += b->pb->size;
        if (r->ev.freed) /* free in its table: a waiting lease may reclaim it */
            r->ev.freed(r->ev.arg, NULL);
        return;
    }
    buf_end(r, b);
}

void registry_lent_end(struct registry *r, struct registry_buf *b)
{
    if (!b->lent)
        return;
    b->lent = false;
    r->st.lent--;
    r->st.lent_bytes -= b->pb->size;
    buf_end(r, b);
}

int registry_lent_revive(struct registry *r, struct registry_buf *b, const uint8_t *token, uint64_t size,
                         const uint8_t *meta, uint32_t meta_len)
{
    if (!b->lent)
        return -EINVAL;
    uint8_t *m = NULL;
    if (meta_len && !(m = malloc(meta_len)))
        return -ENOMEM;
    if (meta_len)
        memcpy(m, meta, meta_len);
    if (token)
        memcpy(b->token, token, PROTO_TOKEN_LEN);
    else if (token_new(r, b->token) < 0) {
        free(m);
        return -EAGAIN;
    } else
        handoff_set_slot(b->token, b->pb->slot);
    b->lent = false;
    r->st.lent--;
    r->st.lent_bytes -= b->pb->size;
    b->meta = m;
    b->meta_len = meta_len;
    b->size = size;
    b->acquires = b->max_acquires = 0;
    b->published = token != NULL;
    r->st.published += b->published;
    hash_add(r, b);
    return 0;
}

struct registry_buf *registry_find_table(struct registry *r, const uint8_t *token)
{
    return r->lender.take ? r->lender.take(r->lender.arg, token) : NULL;
}

uint64_t registry_reclaim_table(struct registry *r, uint32_t tenant, uint64_t bytes)
{
    return r->lender.reclaim ? r->lender.reclaim(r->lender.arg, tenant, bytes) : 0;
}

void registry_buf_drop(struct registry *r, struct registry_buf *b)
{
    buf_gone(r, b);
}

static void unref(struct registry *r, struct registry_buf *b)
{
    if (--b->refs == 0)
        buf_gone(r, b);
}

int registry_hold(struct registry *r, struct registry_holder *h, struct registry_buf *b,
                  bool writable, uint64_t *ret_handle)
{
    if (h->slots == NULL || h->free_head == NO_SLOT) {
        if (h->slots == NULL)
            h->free_head = NO_SLOT;
        uint32_t n = h->nslots ? h->nslots * 2 : 8;
        struct registry_lease *s = realloc(h->slots, n * sizeof(*s));
        if (!s)
            return -ENOMEM;
        for (uint32_t i = h->nslots; i < n; i++)
            s[i] = (struct registry_lease){ .buf = NULL, .gen = 0,
                                            .next_free = i + 1 < n ? i + 1 : NO_SLOT };
        h->free_head = h->nslots;
        h->slots = s;
        h->nslots = n;
    }
    uint32_t i = h->free_head;
    struct registry_lease *l = &h->slots[i];
    h->free_head = l->next_free;
    l->buf = b;
    l->gen++;
    if (l->gen == 0)
        l->gen = 1;
    l->writable = writable;
    b->refs++;
    r->st.handles++;
    h->leases++;
    h->bytes += b->pb->size;
    *ret_handle = (uint64_t)l->gen << 32 | i;
    return 0;
}

struct registry_lease *registry_lease_of(struct registry_holder *h, uint64_t handle)
{
    uint32_t i = (uint32_t)handle, gen = (uint32_t)(handle >> 32);
    if (i >= h->nslots || !h->slots[i].buf || h->slots[i].gen != gen)
        return NULL;
    return &h->slots[i];
}

static void drop_slot(struct registry *r, struct registry_holder *h, uint32_t i)
{
    struct registry_lease *l = &h->slots[i];
    struct registry_buf *b = l->buf;
    l->buf = NULL;
    r->st.handles--;
    l->next_free = h->free_head;
    h->free_head = i;
    h->leases--;
    h->bytes -= b->pb->size;
    unref(r, b);
}

int registry_release(struct registry *r, struct registry_holder *h, uint64_t handle)
{
    if (!registry_lease_of(h, handle))
        return -ENOENT;
    drop_slot(r, h, (uint32_t)handle);
    return 0;
}

uint32_t registry_release_all(struct registry *r, struct registry_holder *h)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < h->nslots; i++)
        if (h->slots[i].buf) {
            drop_slot(r, h, i);
            n++;
        }
    free(h->slots);
    *h = (struct registry_holder){ .free_head = NO_SLOT };
    return n;
}

static void timer_closed(uv_handle_t *t)
{
    free(t);
}

static void stop_timer(struct registry_buf *b)
{
    if (b->timer) {
        uv_close((uv_handle_t *)b->timer, timer_closed);
        b->timer = NULL;
    }
}

void registry_end_retention(struct registry *r, struct registry_buf *b)
{
    if (!b->retained)
        return;
    b->retained = false;
    retained_unlink(r, b);
    stop_timer(b);
    r->st.retained--;
    r->st.retained_bytes -= b->pb->size;
    quota_retained(r->quota, b->tenant, -(int64_t)b->pb->size);
    unref(r, b);
}

void registry_acquired(struct registry *r, struct registry_buf *b)
{
    if (b->acquires < UINT32_MAX)
        b->acquires++;
    if (b->max_acquires && b->acquires >= b->max_acquires)
        registry_end_retention(r, b);
}

static void retention_expired(uv_timer_t *t)
{
    struct registry_buf *b = t->data;
    b->reg->st.expired++;
    registry_end_retention(b->reg, b);
}

/* retention_start: b (not retained) gets the retention reference, ending at now + keep_ms.
 * Returns 0 or -ENOMEM. */
static int retention_start(struct registry *r, struct registry_buf *b, uint32_t keep_ms)
{
    uv_timer_t *t = malloc(sizeof(*t));
    if (!t || retained_link(r, b) < 0) {
        free(t);
        return -ENOMEM;
    }
    uv_timer_init(r->loop, t);
    t->data = b;
    uv_timer_start(t, retention_expired, keep_ms, 0);
    b->timer = t;
    b->retained = true;
    b->deadline = uv_now(r->loop) + keep_ms;
    b->refs++;
    r->st.retained++;
    r->st.retained_bytes += b->pb->size;
    quota_retained(r->quota, b->tenant, (int64_t)b->pb->size);
    return 0;
}

int registry_publish(struct registry *r, struct registry_buf *b, uint64_t size, uint32_t keep_ms,
                     const uint8_t *meta, uint32_t meta_len)
{
    if (b->published)
        return -EALREADY;
    uint8_t *m = NULL;
    if (meta_len) {
        if (!(m = malloc(meta_len)))
            return -ENOMEM;
        memcpy(m, meta, meta_len);
    }
    if (keep_ms && retention_start(r, b, keep_ms) < 0) {
        free(m);
        return -ENOMEM;
    }
    b->meta = m;
    b->meta_len = meta_len;
    b->size = size;
    b->published = true; /* under the token it got at its lease */
    r->st.published++;
    /* acquires counted before the publish (registry_acquired of a buffer not yet published) */
    if (b->max_acquires && b->acquires >= b->max_acquires)
        registry_end_retention(r, b);
    /* a plain publish of a lease for the table: its consumers may take it there */
    if (b->for_table && !b->table && !keep_ms && !b->max_acquires && r->lender.published)
        r->lender.published(r->lender.arg, b);
    return 0;
}

int registry_retain(struct registry *r, struct registry_buf *b, uint32_t keep_ms)
{
    /* a table's member: an acquire taken in the table would not count against it */
    if (b->table && r->lender.retained)
        r->lender.retained(r->lender.arg, b);
    if (!b->retained) {
        int e = retention_start(r, b, keep_ms);
        if (e < 0)
            return e;
        /* the acquires counted so far are the holders' own: it serves the next one */
        b->max_acquires = b->acquires < UINT32_MAX ? b->acquires + 1 : UINT32_MAX;
        return 0;
    }
    if (b->max_acquires && b->max_acquires < UINT32_MAX)
        b->max_acquires++;
    uint64_t now = uv_now(r->loop), until = now + keep_ms;
    if (until > b->deadline) {
        b->deadline = until;
        uv_timer_start(b->timer, retention_expired, keep_ms, 0); /* restarts it */
    }
    return 0;
}

static struct registry_buf *lookup(const struct registry *r, const uint8_t *token)
{
    struct registry_buf *b = r->buckets[bucket_of(r, token)];
    while (b && !desc_token_equal(b->token, token))
        b = b->hnext;
    return b;
}

bool registry_holds(const struct registry_holder *h, const struct registry_buf *b)
{
    for (uint32_t i = 0; i < h->nslots; i++)
        if (h->slots[i].buf == b)
            return true;
    return false;
}

struct registry_buf *registry_find_writing(struct registry *r, const uint8_t *token)
{
    struct registry_buf *b = lookup(r, token);
    return b && !b->published && !b->lent ? b : NULL;
}

struct registry_buf *registry_find(struct registry *r, const uint8_t *token)
{
    struct registry_buf *b = lookup(r, token);
    if (!b || !b->published || b->lent)
        return NULL;
    if (b->retained && uv_now(r->loop) >= b->deadline && b->refs == 1) {
        /* Only the retention holds it and its time is up: it is gone. */
        r->st.expired++;
        registry_end_retention(r, b);
        return NULL;
    }
    return b;
}

uint64_t registry_reclaimable(const struct registry *r, uint32_t tenant)
{
    uint64_t bytes = 0;
    const struct registry_tenant *t = *tenant_slot((struct registry *)r, tenant);
    for (const struct registry_buf *b = t ? t->head : NULL; b; b = b->ret_next)
        if (b->refs == 1)
            bytes += b->pb->size;
    return bytes;
}

uint64_t registry_reclaim_retained(struct registry *r, uint32_t tenant)
{
    struct registry_tenant *t = *tenant_slot(r, tenant);
    struct registry_buf *oldest = t ? t->head : NULL;
    while (oldest && oldest->refs != 1)
        oldest = oldest->ret_next;
    if (!oldest)
        return 0;
    uint64_t bytes = oldest->pb->size;
    r->st.reclaimed++;
    registry_end_retention(r, oldest); /* only the retention held it: it goes */
    return bytes;
}

void registry_end_retentions(struct registry *r)
{
    for (uint32_t i = 0; i < r->nbuckets; i++) {
        struct registry_buf *b = r->buckets[i];
        while (b) {
            struct registry_buf *next = b->hnext;
            registry_end_retention(r, b); /* may free b */
            b = next;
        }
    }
}

void registry_free(struct registry *r)
{
    if (!r)
        return;
    registry_end_retentions(r);
    pool_set_pin_cb(r->pool, NULL, NULL);
    free(r->buckets);
    free(r);
}

struct registry_stats registry_stats(const struct registry *r)
{
    return r->st;
}

unsigned registry_published(const struct registry *r, const struct registry_buf **ret, unsigned max)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < r->nbuckets && n < max; i++)
        for (const struct registry_buf *b = r->buckets[i]; b && n < max; b = b->hnext)
            if (b->published && !b->lent)
                ret[n++] = b;
    return n;
}
