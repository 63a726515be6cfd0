/* SPDX-License-Identifier: MIT */
/* quota.c: see quota.h. Tenants are few (one per uid using the daemon), so a flat array
 * searched linearly is the simplest thing that is fast enough. */
#include "quota.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "units.h"

struct entry {
    struct quota_tenant t;
    bool own_limit;
};

struct quota {
    uint64_t default_quota;
    struct entry *v;
    unsigned n, cap;
};

static char advice[320]; /* quota_set_advice's; "": the operator's flags */

void quota_set_advice(const char *text)
{
    snprintf(advice, sizeof(advice), "%s", text ? text : "");
}

int quota_new(uint64_t default_quota, struct quota **ret)
{
    struct quota *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->default_quota = default_quota;
    *ret = q;
    return 0;
}

void quota_free(struct quota *q)
{
    if (!q)
        return;
    free(q->v);
    free(q);
}

static struct entry *find(const struct quota *q, uint32_t uid)
{
    for (unsigned i = 0; i < q->n; i++)
        if (q->v[i].t.uid == uid)
            return &q->v[i];
    return NULL;
}

static struct entry *get(struct quota *q, uint32_t uid)
{
    struct entry *e = find(q, uid);
    if (e)
        return e;
    if (q->n == q->cap) {
        unsigned cap = q->cap ? q->cap * 2 : 8;
        struct entry *v = realloc(q->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        q->v = v;
        q->cap = cap;
    }
    e = &q->v[q->n++];
    *e = (struct entry){ .t = { .uid = uid, .quota = q->default_quota } };
    return e;
}

uint32_t quota_buffers(const struct quota *q, uint32_t uid)
{
    const struct entry *e = find(q, uid);
    return e ? e->t.buffers : 0;
}

static bool refused_any(const struct entry *e)
{
    return e->t.refused_quota || e->t.refused_space || e->t.refused_limit || e->t.refused_access ||
           e->t.refused_other;
}

/* Drop entries that hold nothing, have no limit of their own and no refusals to show. */
static void prune(struct quota *q, struct entry *e)
{
    if (e->t.bytes || e->t.buffers || e->t.pinned || e->t.stock || e->own_limit || refused_any(e))
        return;
    *e = q->v[--q->n];
}

void quota_set_default(struct quota *q, uint64_t bytes)
{
    q->default_quota = bytes;
    for (unsigned i = 0; i < q->n; i++)
        if (!q->v[i].own_limit)
            q->v[i].t.quota = bytes;
}

int quota_set(struct quota *q, uint32_t uid, uint64_t bytes)
{
    struct entry *e = get(q, uid);
    if (!e)
        return -ENOMEM;
    e->t.quota = bytes;
    e->own_limit = true;
    return 0;
}

void quota_clear_limits(struct quota *q)
{
    for (unsigned i = 0; i < q->n;) {
        struct entry *e = &q->v[i];
        e->own_limit = false;
        e->t.quota = q->default_quota;
        if (!e->t.bytes && !e->t.buffers && !e->t.pinned && !e->t.stock && !refused_any(e))
            *e = q->v[--q->n]; /* the moved entry is examined next */
        else
            i++;
    }
}

uint64_t quota_limit(const struct quota *q, uint32_t uid)
{
    const struct entry *e = find(q, uid);
    return e ? e->t.quota : q->default_quota;
}

int quota_charge(struct quota *q, uint32_t uid, uint64_t bytes, char *why, size_t why_len)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    struct entry *e = get(q, uid);
    if (!e) {
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    uint64_t held = e->t.bytes + e->t.pinned;
    if (bytes > e->t.quota || held > e->t.quota - bytes) {
        char d[UNITS_TEXT_MAX], pinned[160] = "";
        if (e->t.pinned)
            snprintf(pinned, sizeof(pinned), " (of which %s (%llu bytes) pinned: retired buffers its processes "
                     "still map)", units_format(e->t.pinned, d), (unsigned long long)e->t.pinned);
        char f[UNITS_TEXT_MAX], retained[240] = "";
        if (e->t.retained)
            snprintf(retained, sizeof(retained), " (of which %s (%llu bytes) retained: published with keep_ms, "
                     "as shmrefctl put does, and kept for consumers until they get them or the time runs out)",
                     units_format(e->t.retained, f), (unsigned long long)e->t.retained);
        char raise[sizeof(advice)];
        if (advice[0])
            snprintf(raise, sizeof(raise), "%s", advice);
        else
            snprintf(raise, sizeof(raise), "raise it with --tenant-quota, or per uid in the config file's [quota] "
                     "section (%u = SIZE)", uid);
        snprintf(why, why_len,
                 "quota exceeded for uid %u: holds %s (%llu bytes)%s%s, asks %s (%llu bytes), quota %s (%llu bytes); %s",
                 uid, units_format(held, a), (unsigned long long)held, retained, pinned,
                 units_format(bytes, b), (unsigned long long)bytes,
                 units_format(e->t.quota, c), (unsigned long long)e->t.quota, raise);
        prune(q, e);
        return -EDQUOT;
    }
    e->t.bytes += bytes;
    e->t.buffers++;
    return 0;
}

int quota_credit(struct quota *q, uint32_t uid, uint64_t bytes)
{
    struct entry *e = find(q, uid);
    if (!e)
        return bytes ? -ENOENT : 0;
    int r = e->t.bytes >= bytes && e->t.buffers ? 0 : -EINVAL;
    e->t.bytes = e->t.bytes >= bytes ? e->t.bytes - bytes : 0;
    if (e->t.buffers)
        e->t.buffers--;
    prune(q, e);
    return r;
}

int quota_take(struct quota *q, uint32_t uid, uint64_t bytes, struct quota_ticket *ret, char *why,
               size_t why_len)
{
    int r = quota_charge(q, uid, bytes, why, why_len);
    if (r == 0)
        *ret = (struct quota_ticket){ .uid = uid, .bytes = bytes };
    return r;
}

int quota_return(struct quota *q, struct quota_ticket *t)
{
    if (!t->bytes)
        return 0;
    int r = quota_credit(q, t->uid, t->bytes);
    t->bytes = 0;
    return r;
}

int quota_pin(struct quota *q, uint32_t uid, int64_t delta)
{
    struct entry *e = get(q, uid);
    if (!e)
        return -ENOMEM;
    if (delta >= 0)
        e->t.pinned += (uint64_t)delta;
    else
        e->t.pinned = e->t.pinned >= (uint64_t)-delta ? e->t.pinned - (uint64_t)-delta : 0;
    prune(q, e);
    return 0;
}

void quota_retained(struct quota *q, uint32_t uid, int64_t delta)
{
    struct entry *e = delta > 0 ? get(q, uid) : find(q, uid);
    if (!e)
        return;
    if (delta >= 0)
        e->t.retained += (uint64_t)delta;
    else
        e->t.retained = e->t.retained >= (uint64_t)-delta ? e->t.retained - (uint64_t)-delta : 0;
}

int quota_stock(struct quota *q, uint32_t uid, int64_t delta)
{
    struct entry *e = get(q, uid);
    if (!e)
        return -ENOMEM;
    if (delta >= 0)
        e->t.stock += (uint64_t)delta;
    else
        e->t.stock = e->t.stock >= (uint64_t)-delta ? e->t.stock - (uint64_t)-delta : 0;
    prune(q, e);
    return 0;
}

uint64_t quota_stock_held(const struct quota *q, uint32_t uid)
{
    const struct entry *e = find(q, uid);
    return e ? e->t.stock : 0;
}

int quota_check_pinned(const struct quota *q, uint32_t uid, char *why, size_t why_len)
{
    char a[UNITS_TEXT_MAX], b[UNITS_TEXT_MAX], c[UNITS_TEXT_MAX];
    const struct entry *e = find(q, uid);
    if (!e || !e->t.pinned || e->t.bytes + e->t.pinned <= e->t.quota)
        return 0;
    snprintf(why, why_len,
             "quota exceeded for uid %u: holds %s (%llu bytes) and pins %s (%llu bytes) of buffers no lease "
             "holds that its processes still map, quota %s (%llu bytes); unmap them (release, or drop cached "
             "mappings) before acquiring more",
             uid, units_format(e->t.bytes, a), (unsigned long long)e->t.bytes, units_format(e->t.pinned, b),
             (unsigned long long)e->t.pinned, units_format(e->t.quota, c), (unsigned long long)e->t.quota);
    return -EDQUOT;
}

uint64_t quota_held(const struct quota *q, uint32_t uid)
{
    const struct entry *e = find(q, uid);
    return e ? e->t.bytes + e->t.pinned : 0;
}

uint64_t quota_total(const struct quota *q)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < q->n; i++)
        n += q->v[i].t.bytes;
    return n;
}

void quota_note_refusal(struct quota *q, uint32_t uid, int code)
{
    struct entry *e = get(q, uid);
    if (!e)
        return;
    switch (code) {
    case EDQUOT: e->t.refused_quota++; break;
    case ENOSPC: e->t.refused_space++; break;
    case EMFILE: case EFBIG: case EUSERS: e->t.refused_limit++; break;
    case EACCES: e->t.refused_access++; break;
    default: e->t.refused_other++; break;
    }
}

unsigned quota_tenants(const struct quota *q, struct quota_tenant *ret, unsigned max)
{
    unsigned n = 0;
    for (; n < q->n && n < max; n++)
        ret[n] = q->v[n].t;
    return n;
}

unsigned quota_count(const struct quota *q) { return q->n; }
