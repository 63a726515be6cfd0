/* SPDX-License-Identifier: MIT */
/* peer.c: see peer.h. The replies every broker module makes, in one place, so a refusal
 * is counted and logged the same way whichever module refused. */
#include "peer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void peer_fail(struct broker_peer *p, uint32_t id, int code, const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    p->ops->refuse(p, id, code, msg);
}

void peer_refuse(struct broker *bk, struct broker_peer *p, uint32_t id, int code, const char *what,
                 const char *msg)
{
    struct counters *k = bk->counters;
    switch (code) {
    case EDQUOT: k->refused_quota++; break;
    case ENOSPC: k->refused_space++; break;
    case EMFILE: case EFBIG: k->refused_limit++; break;
    default: k->refused_other++; break;
    }
    quota_note_refusal(bk->quota, p->uid, code);
    unsigned held_back;
    bool ok = log_rate_take(&p->log_rate, &held_back);
    if (held_back)
        log_notice("client %llu pid=%d uid=%u: suppressed %u refusal line%s in the last second",
                   (unsigned long long)p->id, (int)p->pid, (unsigned)p->uid, held_back, held_back == 1 ? "" : "s");
    if (ok)
        log_notice("refused %s for client %llu pid=%d uid=%u: %s", what, (unsigned long long)p->id,
                   (int)p->pid, (unsigned)p->uid, msg);
    p->ops->refuse(p, id, code, msg);
}

void peer_send_buffer(struct broker_peer *p, uint32_t id, uint64_t handle, struct registry_buf *b, int fd)
{
    struct proto_msg r = { .op = PROTO_OP_LEASE + PROTO_OP_REPLY, .id = id };
    r.u.lease_reply.handle = handle;
    r.u.lease_reply.buf_id = b->pb->id;
    memcpy(r.u.lease_reply.token, b->token, PROTO_TOKEN_LEN); /* given at lease, kept at publish */
    r.u.lease_reply.size = b->size;
    r.u.lease_reply.capacity = b->pb->size;
    if (b->published) {
        r.op = PROTO_OP_ACQUIRE + PROTO_OP_REPLY;
        r.u.acquire_reply.meta = b->meta;
        r.u.acquire_reply.meta_len = b->meta_len;
        r.u.acquire_reply.flags = (b->pb->sealed ? PROTO_BUF_SEALED : 0) |
                                  (p->uid != b->tenant ? PROTO_BUF_FOREIGN : 0);
        /* Retired at its last release (pool_put): the client should not cache it. */
        if (b->pb->sealed || b->pb->foreign)
            r.u.acquire_reply.flags |= PROTO_BUF_RETIRE;
    }
    p->ops->reply(p, &r, fd);
}

bool peer_leases_left(struct broker *bk, struct broker_peer *p, uint32_t id, const char *what)
{
    unsigned n = p->holder.leases + p->pending + p->parked.places;
    if (n < bk->opt->max_leases)
        return true;
    char msg[PROTO_MAX_ERRMSG], parked[64] = "";
    if (p->parked.places)
        snprintf(parked, sizeof(parked), " (%u of them waiting)", p->parked.places);
    snprintf(msg, sizeof(msg), "too many leases on this connection: %u held%s, limit %u", n, parked,
             bk->opt->max_leases);
    peer_refuse(bk, p, id, EMFILE, what, msg);
    return false;
}

bool peer_park_left(struct broker *bk, struct broker_peer *p, uint32_t id, uint32_t n, const char *what)
{
    unsigned mine = p->parked.group ? *p->parked.group : p->parked.places, cap = bk->opt->max_parked_per_uid;
    if (mine + n <= cap)
        return true;
    char msg[PROTO_MAX_ERRMSG];
    snprintf(msg, sizeof(msg), "too many waiting requests for uid %u: %u wait on its connections (%u on this one), "
             "%u more asked, limit %u (--max-parked-per-uid)", (unsigned)p->uid, mine, p->parked.places,
             (unsigned)n, cap);
    peer_refuse(bk, p, id, EMFILE, what, msg);
    return false;
}
