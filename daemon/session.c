/* SPDX-License-Identifier: MIT */
/* session.c: see session.h. Decoding happens here (the transport hands over whole
 * messages); a malformed conversation (garbage, no hello first, a version mismatch)
 * gets an EPROTO-class reply and closes the session; everything else is a reply. */
#include "session.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "text.h"

#define FEATURES                                                                                          \
    (PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_SEALED | PROTO_FEAT_FOREIGN | PROTO_FEAT_BYE | \
     PROTO_FEAT_PRIVATE | PROTO_FEAT_RETAIN)

static uint8_t wbuf[PROTO_MAX_REPLY];              /* one encoded reply (one loop thread) */
static uint8_t status_body[PROTO_MAX_REPLY - 64];  /* a status map, before its envelope */

static void on_message(void *ctx, const uint8_t *data, size_t len);
static void on_close(void *ctx, enum transport_end end, const char *why);
static void on_room(void *ctx);
static const struct transport_ops transport_ops = { on_message, on_close, on_room };

/* A reply held back for room for its fds, rebuilt from its handles when it goes: a lease
 * or acquire reply (n == 0: handle, buf_id), or a lease_many reply of n items; or an
 * error reply (len > 0: its encoded bytes), held back behind the others or for room in
 * the transport's queue, so that many answers at once (waiting requests refused when
 * their buffer goes or their wait runs out) go as the client reads, never past the
 * queue's bound (which would close a client that reads as slow). Each answers one request
 * the client made, and the transport reads none while it cannot send: bounded by what
 * the connection may have parked (max-leases) plus one read batch. The
 * transport could queue it instead, but only with dups of its fds: replies made off the
 * loop (buffers made in the thread pool) would then hold a second fd per buffer beyond
 * the pool's fd budget, and the daemon could run out of fds (EMFILE) at a dup. */
struct session_owed {
    struct session_owed *next;
    uint32_t id, n, len;
    uint64_t handle, buf_id;
    struct proto_item items[]; /* n items; or, with len, the encoded reply's bytes */
};

static void owed_append(struct session *s, struct session_owed *o)
{
    if (s->owed_tail) s->owed_tail->next = o; else s->owed_head = o;
    s->owed_tail = o;
}

static void owed_free(struct session *s)
{
    while (s->owed_head) {
        struct session_owed *o = s->owed_head;
        s->owed_head = o->next;
        free(o);
    }
    s->owed_tail = NULL;
}

static void session_ref(struct session *s)
{
    s->refs++;
}

static void session_unref(struct session *s)
{
    if (--s->refs > 0)
        return;
    owed_free(s);
    idset_free(&s->known);
    idset_free(&s->private_ids);
    if (s->pidfd >= 0)
        close(s->pidfd);
    free(s);
}

/* ---- the broker's view of a session ------------------------------------------------ */

/* fd_to_send: the fd to attach, or -1 when this client already has the buffer mapped
 * as needed (a writable mapping also serves reading). always: send it anyway (a sealed
 * buffer, whose seals the client checks on its fd); the mapping is counted all the same.
 * *ret_counted: false when the fd goes but this mapping is not in the fd-once set (full,
 * or out of memory). The set is the one record of what this connection maps, which the
 * ledger's recycle check reads (tenantdir.c): a mapping not in it must not serve a ledger
 * hold, so its reply tells the client not to cache it (PROTO_BUF_RETIRE); the client's
 * next acquire of that buffer then goes to the daemon, which counts it as a lease. */
static int fd_to_send(struct session *s, uint64_t buf_id, bool writable, bool always, int fd, bool *ret_counted)
{
    *ret_counted = true;
    /* Without fd-once a client says nothing of what it unmaps: its mappings are not
     * counted, since retirement empties a buffer's file (pool.c). A sealed buffer's cannot
     * be emptied: its mappings are counted all the same, until the connection closes and,
     * after that, until its process exits (session_disconnected). */
    if ((!s->fd_once && !always) || fd < 0)
        return fd;
    uint64_t rw = buf_id << 1 | 1, ro = buf_id << 1;
    if (idset_has(&s->known, rw) || (!writable && idset_has(&s->known, ro)))
        return always || !s->fd_once ? fd : -1;
    /* Bounded by what a client that forgets properly can hold mapped (its handles plus its
     * idle cache); past it the fd goes uncounted, and is sent again next time. */
    uint32_t max_leases = s->env->opt->max_leases;
    uint32_t max = max_leases > (UINT32_MAX - PROTO_MAX_IDLE_MAPPINGS) / 2 ? UINT32_MAX
                                                                       : max_leases * 2 + PROTO_MAX_IDLE_MAPPINGS;
    if (idset_add(&s->known, writable ? rw : ro, max) == 0)
        broker_mapped(s->env->broker, &s->peer, buf_id);
    else
        *ret_counted = false;
    return fd;
}

/* owe: a buffer reply that must wait for room for its fd (behind those already waiting,
 * so the client gets a buffer's fd before any reply that leaves it off). Returns false
 * when it can go now. */
static bool owe(struct session *s, const struct proto_msg *m, int fd)
{
    if (fd < 0 || s->resending || !s->transport || (!s->owed_head && transport_fd_room(s->transport, 1)))
        return false;
    struct session_owed *o = malloc(sizeof(*o));
    if (!o)
        return false; /* sent now: the transport queues it */
    *o = (struct session_owed){ .id = m->id, .handle = m->u.lease_reply.handle, .buf_id = m->u.lease_reply.buf_id };
    owed_append(s, o);
    return true;
}

/* owe_many: a lease_many reply that must wait for room for its fds, like owe. */
static bool owe_many(struct session *s, const struct proto_msg *m)
{
    uint32_t n = m->u.lease_many_reply.n;
    if (s->resending || !s->transport || n == 0 || n > PROTO_MAX_BATCH ||
        (!s->owed_head && transport_fd_room(s->transport, n)))
        return false;
    struct session_owed *o = malloc(sizeof(*o) + n * sizeof(o->items[0]));
    if (!o)
        return false; /* sent now: the transport queues it */
    *o = (struct session_owed){ .id = m->id, .n = n };
    memcpy(o->items, m->u.lease_many_reply.items, n * sizeof(o->items[0]));
    owed_append(s, o);
    return true;
}

static void as_peer_reply_many(struct broker_peer *p, const struct proto_msg *m, const int *fds);

/* resend_many: an owed lease_many reply goes, each item's fd looked up again from its
 * handle; if the client released one meanwhile, an EINVAL error goes instead. */
static void resend_many(struct session *s, const struct session_owed *o)
{
    static struct proto_msg r; /* one loop thread */
    int fds[PROTO_MAX_BATCH];
    r = (struct proto_msg){ .op = PROTO_OP_LEASE_MANY + PROTO_OP_REPLY, .id = o->id };
    r.u.lease_many_reply.n = o->n;
    memcpy(r.u.lease_many_reply.items, o->items, o->n * sizeof(o->items[0]));
    for (uint32_t i = 0; i < o->n; i++) {
        fds[i] = broker_lease_fd(s->env->broker, &s->peer, o->items[i].handle, o->items[i].buf_id);
        if (fds[i] < 0) {
            session_fail(s, o->id, EINVAL, "handle %llu was released before its reply was sent",
                         (unsigned long long)o->items[i].handle);
            return;
        }
    }
    as_peer_reply_many(&s->peer, &r, fds);
}

/* on_room: the client read: held replies go while there is room. */
static void on_room(void *ctx)
{
    struct session *s = ctx;
    s->resending = true;
    while (s->owed_head && s->transport && !s->peer.closing &&
           transport_fd_room(s->transport, s->owed_head->len ? 0 : s->owed_head->n ? s->owed_head->n : 1)) {
        struct session_owed *o = s->owed_head;
        if (!(s->owed_head = o->next))
            s->owed_tail = NULL;
        if (o->len)
            transport_send(s->transport, (const uint8_t *)o->items, o->len, -1);
        else if (o->n)
            resend_many(s, o);
        else
            broker_resend(s->env->broker, &s->peer, o->id, o->handle, o->buf_id);
        free(o);
    }
    s->resending = false;
}

static void as_peer_reply(struct broker_peer *p, const struct proto_msg *m, int fd)
{
    struct session *s = (struct session *)p;
    if ((m->op == PROTO_OP_LEASE + PROTO_OP_REPLY || m->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY) && owe(s, m, fd))
        return;
    /* A sealed buffer always carries its fd: the consumer checks its seals on it. A
     * private acquire's always does too, and that mapping is not counted (the client maps
     * it MAP_PRIVATE, never caches it, never forgets it), so it is left out of fd_to_send
     * altogether: the fd-once set records only the connection's shared mappings. */
    bool counted = true;
    if (m->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY && idset_has(&s->private_ids, (uint64_t)m->id + 1))
        idset_del(&s->private_ids, (uint64_t)m->id + 1);
    else if (m->op == PROTO_OP_LEASE + PROTO_OP_REPLY || m->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY)
        fd = fd_to_send(s, m->u.lease_reply.buf_id, m->op == PROTO_OP_LEASE + PROTO_OP_REPLY,
                        (m->u.lease_reply.flags & PROTO_BUF_SEALED) != 0, fd, &counted);
    /* An uncounted read-only mapping must not be cached (fd_to_send). A writable one may:
     * ledger holds are taken only on read-only mappings, and the client makes one of those
     * only from an acquire reply, which says whether it is counted. */
    if (!counted && m->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY) {
        static struct proto_msg r; /* one loop thread */
        r = *m;
        r.u.acquire_reply.flags |= PROTO_BUF_RETIRE;
        m = &r;
    }
    /* A client of the previous version is sent only the flags it knew: it caches every
     * mapping (it has no ledger for an uncached one to matter to) and forgets it later. */
    if (s->version == PROTO_VERSION_PREV && (m->u.lease_reply.flags & ~(uint32_t)PROTO_BUF_PREV) &&
        (m->op == PROTO_OP_LEASE + PROTO_OP_REPLY || m->op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY)) {
        static struct proto_msg r2; /* one loop thread */
        r2 = *m;
        r2.u.lease_reply.flags &= PROTO_BUF_PREV;
        m = &r2;
    }
    session_send(s, m, fd);
}

static void as_peer_reply_many(struct broker_peer *p, const struct proto_msg *m, const int *fds)
{
    struct session *s = (struct session *)p;
    static struct proto_msg r; /* one loop thread; too large for the stack of every call */
    int out[PROTO_MAX_BATCH];
    unsigned n = 0;
    if (owe_many(s, m))
        return;
    r = *m;
    for (uint32_t i = 0; i < r.u.lease_many_reply.n && i < PROTO_MAX_BATCH; i++) {
        struct proto_item *it = &r.u.lease_many_reply.items[i];
        bool counted; /* writable: may be cached uncounted (as_peer_reply) */
        int fd = fd_to_send(s, it->buf_id, true, false, fds[i], &counted);
        it->has_fd = fd >= 0;
        if (fd >= 0)
            out[n++] = fd;
    }
    session_send_fds(s, &r, out, n);
}

static void as_peer_refuse(struct broker_peer *p, uint32_t id, int code, const char *msg)
{
    session_fail((struct session *)p, id, code, "%s", msg);
}

static void as_peer_ref(struct broker_peer *p)
{
    session_ref((struct session *)p);
}

static void as_peer_unref(struct broker_peer *p)
{
    session_unref((struct session *)p);
}

static bool as_peer_table_holds(struct broker_peer *p, const struct registry_buf *b)
{
    struct session *s = (struct session *)p;
    return tenantdir_holds_buf(s->env->tenantdirs, &s->journal, b);
}

static const struct broker_peer_ops as_peer_ops = { as_peer_reply, as_peer_refuse, as_peer_ref, as_peer_unref,
                                                   as_peer_reply_many, as_peer_table_holds };

/* ---- tenants: what one uid's sessions share ----------------------------------------- */

static struct session_tenant *tenant_get(struct session_env *env, uint32_t uid)
{
    for (struct session_tenant *t = env->tenants; t; t = t->next)
        if (t->uid == uid)
            return t;
    struct session_tenant *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->uid = uid;
    t->next = env->tenants;
    env->tenants = t;
    return t;
}

static void tenant_put(struct session_env *env, struct session_tenant *t)
{
    if (--t->conns > 0)
        return;
    for (struct session_tenant **pp = &env->tenants; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    free(t);
}

uint32_t session_uid_conns(const struct session_env *env, uint32_t uid)
{
    for (const struct session_tenant *t = env->tenants; t; t = t->next)
        if (t->uid == uid)
            return t->conns;
    return 0;
}

void session_free_env(struct session_env *env)
{
    while (env->tenants) {
        struct session_tenant *t = env->tenants;
        env->tenants = t->next;
        free(t);
    }
}

/* ---- lifecycle --------------------------------------------------------------------- */

int session_new(struct session_env *env, int fd, const struct ucred *cred, struct session **ret)
{
    struct session *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    s->peer.ops = &as_peer_ops;
    s->peer.id = ++env->next_id;
    s->peer.pid = cred->pid;
    s->peer.uid = cred->uid;
    s->gid = cred->gid;
    s->env = env;
    s->refs = 1; /* the transport's, dropped in session_disconnected */
    s->pidfd = -1;
    s->accepted_ms = s->last_ms = uv_now(env->loop);
    if (!(s->tenant = tenant_get(env, cred->uid))) {
        free(s);
        return -ENOMEM;
    }
    s->tenant->conns++;
    s->peer.parked.group = &s->tenant->parked;
    int r = transport_new(env->loop, fd, PROTO_MAX_REQUEST, &transport_ops, s, &s->transport);
    if (r < 0) {
        tenant_put(env, s->tenant);
        free(s);
        return r;
    }
    transport_set_fd_limits(s->transport, env->fd_cap_conn, &s->tenant->fds_unread, env->fd_cap_uid);
    s->next = env->head;
    if (env->head)
        env->head->prev = s;
    env->head = s;
    env->n++;
    *ret = s;
    return 0;
}

void session_close(struct session *s, const char *why)
{
    if (!s->transport || s->peer.closing)
        return;
    s->peer.closing = true;
    transport_close(s->transport, why);
}

/* The reason session_close_all gives: its disconnects are logged at debug level, once in
 * sum, and counted neither as clean closes nor as deaths. */
static const char stopping_why[] = "shmrefd is stopping";

/* session_disconnected: the one place a session ends: whatever closed it (the peer, a
 * fault, the daemon), its socket is gone and nothing else is using it. Releases every
 * handle it held, logs the disconnect, and drops the transport's reference. */
static void session_disconnected(struct session *s, enum transport_end end, const char *why)
{
    struct session_env *env = s->env;
    s->peer.closing = true;
    s->transport = NULL;
    if (end == TRANSPORT_END_SLOW)
        env->counters->slow_clients++;
    else if (end == TRANSPORT_END_FRAMING)
        env->counters->protocol_errors++;
    uint32_t held = s->peer.holder.leases;
    if (s->peer.log_rate.suppressed)
        log_notice("client %llu pid=%d uid=%u: suppressed %u refusal line%s before it left",
                   (unsigned long long)s->peer.id, (int)s->peer.pid, (unsigned)s->peer.uid,
                   s->peer.log_rate.suppressed, s->peer.log_rate.suppressed == 1 ? "" : "s");
    /* Its journal's holds end first, then its handles: a dead connection holds nothing. */
    if (!s->bye)
        tenantdir_repair(env->tenantdirs, &s->journal);
    tenantdir_leave(env->tenantdirs, &s->journal);
    /* Its process's mappings went with it, or it closed (libshmref unmaps first), or its
     * process lives on with them: those of buffers whose pages the pool cannot free stay
     * charged to it until its process exits (its pidfd). */
    uint64_t *keep = s->pidfd >= 0 && s->known.cap ? malloc(s->known.cap * sizeof(*keep)) : NULL;
    unsigned nkeep = 0;
    for (uint32_t i = 0; i < s->known.cap; i++) {
        uint64_t id = s->known.slots[i] >> 1;
        if (!s->known.slots[i])
            continue;
        if (keep && broker_pins_after_close(env->broker, id))
            keep[nkeep++] = id;
        else
            broker_unmapped(env->broker, &s->peer, id);
    }
    if (nkeep) {
        broker_hold_until_exit(env->broker, &s->peer, s->pidfd, keep, nkeep);
        s->pidfd = -1;
    }
    free(keep);
    uint32_t n = broker_disconnect(env->broker, &s->peer);
    broker_check(env->broker);
    tenantdir_check(env->tenantdirs);
    /* The peer went away (why == NULL): with nothing held, or having said bye, it closed
     * cleanly (libshmref releases before closing, then says bye: what it still held were
     * leases on their way to it, its stock's refills); holding leases without a bye, it
     * died, or closed without releasing. The socket cannot tell which signal, if any,
     * ended it. */
    if (!why && (!n || s->bye))
        env->counters->clients_closed++;
    else if (!why)
        env->counters->clients_died++;
    if (why && strcmp(why, stopping_why) == 0)
        log_debug("client %llu pid=%d uid=%u closed: %s; released %u lease%s", (unsigned long long)s->peer.id,
                  (int)s->peer.pid, (unsigned)s->peer.uid, why, held, held == 1 ? "" : "s");
    else if (why)
        log_info("client %llu pid=%d uid=%u disconnected: %s; reclaimed %u lease%s",
                 (unsigned long long)s->peer.id, (int)s->peer.pid, (unsigned)s->peer.uid, why, held,
                 held == 1 ? "" : "s");
    else if (n && s->bye)
        log_debug("client %llu pid=%d uid=%u closed; reclaimed %u lease%s on their way to it",
                  (unsigned long long)s->peer.id, (int)s->peer.pid, (unsigned)s->peer.uid, held,
                  held == 1 ? "" : "s");
    else if (n)
        log_info("client %llu pid=%d uid=%u died holding %u lease%s (or closed without releasing); reclaimed",
                 (unsigned long long)s->peer.id, (int)s->peer.pid, (unsigned)s->peer.uid, held,
                 held == 1 ? "" : "s");
    else
        log_debug("client %llu pid=%d uid=%u closed", (unsigned long long)s->peer.id, (int)s->peer.pid,
                  (unsigned)s->peer.uid);
    if (s->prev) s->prev->next = s->next; else env->head = s->next;
    if (s->next) s->next->prev = s->prev;
    env->n--;
    tenant_put(env, s->tenant); /* the transport has taken its unread fds off the count */
    s->tenant = NULL;
    session_unref(s);
}

static void on_close(void *ctx, enum transport_end end, const char *why)
{
    session_disconnected(ctx, end, why);
}

void session_expire_hello(struct session_env *env, uint64_t now_ms)
{
    for (struct session *s = env->head; s; s = s->next) {
        if (!s->hello && !s->peer.closing && now_ms - s->accepted_ms >= SESSION_HELLO_MS) {
            env->counters->protocol_errors++;
            session_fail(s, 0, ETIMEDOUT, "no hello within %d ms", SESSION_HELLO_MS);
            session_close(s, "no hello within 10 s");
        }
    }
}

void session_expire_idle(struct session_env *env, uint64_t now_ms, uint64_t idle_ms)
{
    if (!idle_ms)
        return;
    uint64_t visits = 0;
    for (struct session *s = env->head; s && visits < SESSION_IDLE_VISITS; s = s->next) {
        uint64_t since = s->last_ms > s->idle_checked_ms ? s->last_ms : s->idle_checked_ms;
        if (!s->hello || s->peer.closing || s->peer.holder.leases || s->peer.pending || s->peer.parked.n ||
            now_ms - since < idle_ms)
            continue;
        if (tenantdir_holds(env->tenantdirs, &s->journal, &visits)) {
            s->idle_checked_ms = now_ms;
            continue;
        }
        session_fail(s, 0, ETIMEDOUT, "idle for %llu s holding nothing (idle-timeout %llu s): closed",
                     (unsigned long long)((now_ms - s->last_ms) / 1000), (unsigned long long)(idle_ms / 1000));
        session_close(s, "idle, holding nothing");
    }
}

uint32_t session_count_open(const struct session_env *env)
{
    uint32_t n = 0;
    for (const struct session *s = env->head; s; s = s->next)
        n += !s->peer.closing && s->transport && !transport_closing(s->transport);
    return n;
}

void session_close_all(struct session_env *env)
{
    unsigned clients = 0, leases = 0;
    for (struct session *s = env->head; s; s = s->next)
        if (s->transport && !s->peer.closing) {
            clients++;
            leases += s->peer.holder.leases;
        }
    if (clients)
        log_info("stopping: closing %u client%s, releasing the %u lease%s they held", clients,
                 clients == 1 ? "" : "s", leases, leases == 1 ? "" : "s");
    for (struct session *s = env->head; s; s = s->next)
        session_close(s, stopping_why);
}

/* ---- sending ----------------------------------------------------------------------- */

int session_send(struct session *s, const struct proto_msg *m, int fd)
{
    return session_send_fds(s, m, &fd, fd >= 0 ? 1 : 0);
}

/* encode: m into wbuf; its length, or < 0 after an error reply. */
static int encode(struct session *s, const struct proto_msg *m)
{
    int len = proto_encode(m, wbuf, sizeof(wbuf));
    if (len < 0) {
        log_error("reply %s to client %llu does not fit in %zu bytes", proto_op_name(m->op),
                  (unsigned long long)s->peer.id, sizeof(wbuf));
        session_fail(s, m->id, EMSGSIZE, "reply too large");
    }
    return len;
}

int session_send_fds(struct session *s, const struct proto_msg *m, const int *fds, unsigned nfds)
{
    if (!s->transport)
        return -EPIPE;
    int len = encode(s, m);
    return len < 0 ? len : transport_send_fds(s->transport, wbuf, (size_t)len, fds, nfds);
}

int session_send_fds_now(struct session *s, const struct proto_msg *m, const int *fds, unsigned nfds)
{
    if (!s->transport)
        return -EPIPE;
    int len = encode(s, m);
    return len < 0 ? len : transport_send_fds_now(s->transport, wbuf, (size_t)len, fds, nfds);
}

void session_fail(struct session *s, uint32_t id, int code, const char *fmt, ...)
{
    char msg[PROTO_MAX_ERRMSG + 1];
    va_list ap;
    if (!s->transport)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    idset_del(&s->private_ids, (uint64_t)id + 1); /* that request is answered */
    int len = proto_encode_error(id, code, wbuf, sizeof(wbuf), "%s", msg);
    if (len <= 0)
        return;
    /* Behind held replies, or with the queue not empty: held too (session_owed). */
    if (!s->resending && !s->peer.closing && (s->owed_head || !transport_fd_room(s->transport, 0))) {
        struct session_owed *o = malloc(sizeof(*o) + (size_t)len);
        if (o) {
            *o = (struct session_owed){ .id = id, .len = (uint32_t)len };
            memcpy(o->items, wbuf, (size_t)len);
            owed_append(s, o);
            return;
        }
    }
    transport_send(s->transport, wbuf, (size_t)len, -1);
}

static void protocol_error(struct session *s, uint32_t id, const char *why)
{
    s->env->counters->protocol_errors++;
    session_fail(s, id, EPROTO, "protocol error: %s", why);
    session_close(s, why);
}

/* ---- requests the session answers itself ------------------------------------------ */

static void do_hello(struct session *s, const struct proto_msg *m)
{
    const struct options *opt = s->env->opt;
    uint32_t v = m->u.hello.version;
    /* "speaks version N" is what a library of another version reads (PROTOCOL.md). */
    if (v != PROTO_VERSION && v != PROTO_VERSION_PREV) {
        s->env->counters->protocol_errors++;
        session_fail(s, m->id, EPROTONOSUPPORT,
                     "protocol version %u is not supported: this shmrefd speaks version %d (and %d); use a "
                     "libshmref of either protocol version",
                     (unsigned)v, PROTO_VERSION, PROTO_VERSION_PREV);
        session_close(s, "protocol version mismatch");
        return;
    }
    /* A client of the previous version is answered in it: only the features it knew (no
     * table), and as_peer_reply keeps newer flags from it. */
    uint64_t known = v == PROTO_VERSION ? FEATURES | PROTO_FEAT_TABLE : PROTO_FEAT_PREV;
    /* valid UTF-8 without control or bidi characters, for status, JSON and log lines */
    text_clean(s->name, m->u.hello.name ? m->u.hello.name : "", m->u.hello.name_len);
    s->hello = true;
    s->version = v;
    s->fd_once = (m->u.hello.features & PROTO_FEAT_FD_ONCE) != 0;
    /* The table, only with fd-once (a client that maps what it is sent once). Its two fds
     * travel with the reply. */
    int fds[2] = { -1, -1 };
    bool table = s->fd_once && (m->u.hello.features & known & PROTO_FEAT_TABLE) && s->env->tenantdirs &&
                 tenantdir_join(s->env->tenantdirs, s->peer.uid, &s->journal, fds) == 0;
    log_debug("client %llu pid=%d uid=%u said hello as '%s' (protocol %u)", (unsigned long long)s->peer.id,
              (int)s->peer.pid, (unsigned)s->peer.uid, s->name, (unsigned)v);
    struct proto_msg r = { .op = PROTO_OP_HELLO + PROTO_OP_REPLY, .id = m->id };
    r.u.hello_reply.version = v;
    r.u.hello_reply.features = FEATURES & known & (m->u.hello.features | PROTO_FEAT_NOREPLY_RELEASE);
    r.u.hello_reply.max_request = PROTO_MAX_REQUEST;
    r.u.hello_reply.max_lease = opt->max_lease_size;
    r.u.hello_reply.max_leases = opt->max_leases;
    r.u.hello_reply.max_meta = PROTO_MAX_META;
    r.u.hello_reply.pid = (uint64_t)getpid();
    if (table) {
        /* Only if it can go now: a hello never waits for room for optional fds (a daemon
         * at its fds in flight answers without the table, and the client asks the daemon). */
        r.u.hello_reply.features |= PROTO_FEAT_TABLE;
        int e = session_send_fds_now(s, &r, fds, 2);
        close(fds[1]); /* the connection's journal: ours is the read-only mapping */
        if (e != -EAGAIN)
            return;
        tenantdir_leave(s->env->tenantdirs, &s->journal);
        r.u.hello_reply.features &= ~(uint64_t)PROTO_FEAT_TABLE;
        log_debug("client %llu pid=%d uid=%u: no room for the table's fds now; hello without them",
                  (unsigned long long)s->peer.id, (int)s->peer.pid, (unsigned)s->peer.uid);
    }
    session_send(s, &r, -1);
}

static void do_status(struct session *s, const struct proto_msg *m)
{
    int n = s->env->status(s->env->status_arg, s->peer.uid, status_body, sizeof(status_body));
    if (n < 0) {
        session_fail(s, m->id, EMSGSIZE, "status does not fit in one reply");
        return;
    }
    struct proto_msg r = { .op = PROTO_OP_STATUS + PROTO_OP_REPLY, .id = m->id };
    r.u.status_reply.body = status_body;
    r.u.status_reply.body_len = (uint32_t)n;
    session_send(s, &r, -1);
}

/* table_reply: a map or adopt reply (shaped as a lease reply) of member b. */
static struct proto_msg table_reply(const struct proto_msg *m, const struct registry_buf *b, uint64_t handle)
{
    struct proto_msg r = { .op = m->op + PROTO_OP_REPLY, .id = m->id };
    r.u.lease_reply.handle = handle;
    r.u.lease_reply.buf_id = b->pb->id;
    r.u.lease_reply.size = b->pb->size;
    r.u.lease_reply.capacity = b->pb->size;
    if (handle)
        memcpy(r.u.lease_reply.token, b->token, PROTO_TOKEN_LEN);
    return r;
}

/* do_map: PROTO_OP_MAP: the fd (read-write) of a member of this connection's uid's table,
 * which the client popped from a free list and does not map. Always attached; counted in
 * the fd-once set when there is room (else the reply says PROTO_BUF_RETIRE: do not cache). */
static void do_map(struct session *s, const struct proto_msg *m)
{
    struct registry_buf *b = tenantdir_member(s->env->tenantdirs, &s->journal, m->u.map.buf_id);
    if (!b || b->pb->foreign) {
        s->env->tenantdirs->st.ignored += s->journal.dir != NULL;
        session_fail(s, m->id, ESTALE, "map: buffer %llu is not in this uid's table",
                     (unsigned long long)m->u.map.buf_id);
        return;
    }
    s->env->tenantdirs->st.maps++;
    struct proto_msg r = table_reply(m, b, 0);
    bool counted;
    int fd = fd_to_send(s, b->pb->id, true, true, b->pb->fd, &counted);
    if (!counted)
        r.u.lease_reply.flags |= PROTO_BUF_RETIRE;
    session_send(s, &r, fd);
}

/* do_adopt: PROTO_OP_ADOPT: a local lease becomes a lease of this connection (a handle),
 * for a publish that needs the daemon (a retention, seals, metadata too long for the
 * table). */
static void do_adopt(struct session *s, const struct proto_msg *m)
{
    struct tenantdirs *t = s->env->tenantdirs;
    struct registry_buf *b;
    uint64_t handle;
    if (!peer_leases_left(s->env->broker, &s->peer, m->id, "adopt"))
        return;
    int r = tenantdir_adopt(t, &s->journal, m->u.adopt.buf_id, m->u.adopt.seq, &b);
    if (r < 0) {
        session_fail(s, m->id, -r, "adopt: buffer %llu is not this connection's local lease under that generation",
                     (unsigned long long)m->u.adopt.buf_id);
        return;
    }
    if (registry_hold(t->reg, &s->peer.holder, b, true, &handle) < 0) {
        registry_buf_drop(t->reg, b); /* its end, as before the adopt */
        session_fail(s, m->id, ENOMEM, "daemon out of memory");
        return;
    }
    b->producer_pid = (int32_t)s->peer.pid;
    struct proto_msg rep = table_reply(m, b, handle);
    session_send(s, &rep, -1);
}

/* note_private: remember a private acquire's request id until its reply goes (as_peer_reply)
 * or it is refused (session_fail). Bounded by max-leases: past it, or on a version-2
 * connection, or out of memory, the flag is ignored and the acquire answered as a plain
 * one (the client then says EOPNOTSUPP if it gets no fd). */
static void note_private(struct session *s, const struct proto_msg *m)
{
    if (!(m->u.acquire.flags & PROTO_ACQUIRE_PRIVATE) || s->version == PROTO_VERSION_PREV)
        return;
    uint32_t max = s->env->opt->max_leases ? s->env->opt->max_leases : 1;
    (void)idset_add(&s->private_ids, (uint64_t)m->id + 1, max);
}

/* dispatch: one decoded request, after the hello rule. */
static void dispatch(struct session *s, const struct proto_msg *m)
{
    switch (m->op) {
    case PROTO_OP_HELLO:
        if (s->hello)
            protocol_error(s, m->id, "hello was already said");
        else
            do_hello(s, m);
        return;
    case PROTO_OP_STATUS:
        do_status(s, m);
        return;
    case PROTO_OP_FORGET: {
        uint64_t key = m->u.forget.buf_id << 1 | (m->u.forget.writable ? 1 : 0);
        if (m->u.forget.buf_id && m->u.forget.buf_id < (UINT64_C(1) << 63) && idset_has(&s->known, key)) {
            idset_del(&s->known, key);
            broker_unmapped(s->env->broker, &s->peer, m->u.forget.buf_id);
        }
        return;
    }
    case PROTO_OP_MAP:
        do_map(s, m);
        return;
    case PROTO_OP_GIVEBACK: /* never a reply */
        tenantdir_giveback(s->env->tenantdirs, &s->journal, m->u.giveback.buf_id);
        return;
    case PROTO_OP_ADOPT:
        do_adopt(s, m);
        return;
    case PROTO_OP_BYE: /* never a reply; the last message (on_message) */
        s->bye = true;
        return;
    case PROTO_OP_PING: {
        struct proto_msg r = { .op = PROTO_OP_PING + PROTO_OP_REPLY, .id = m->id };
        session_send(s, &r, -1);
        return;
    }
    default:
        if (!broker_handle(s->env->broker, &s->peer, m))
            session_fail(s, m->id, EOPNOTSUPP, "unknown op %u", (unsigned)m->op);
        return;
    }
}

static void on_message(void *ctx, const uint8_t *data, size_t len)
{
    struct session *s = ctx;
    struct proto_msg m;
    const char *why = NULL;
    if (s->peer.closing)
        return;
    s->last_ms = uv_now(s->env->loop);
    s->env->counters->messages++;
    int r = proto_decode(data, len, PROTO_MAX_REQUEST, &m, &why);
    if (!s->hello && (r == -EOPNOTSUPP || (r == 0 && m.op != PROTO_OP_HELLO))) {
        protocol_error(s, m.id, "the first message must be hello");
        return;
    }
    if (r == -EOPNOTSUPP || (r == 0 && (m.op >= PROTO_OP_REPLY))) {
        /* Well-formed but not a request we know: refuse it, keep the client. */
        session_fail(s, m.id, EOPNOTSUPP, "unknown op %u", (unsigned)m.op);
        return;
    }
    if (r < 0) {
        protocol_error(s, m.id, why ? why : "malformed message");
        return;
    }
    if (s->bye) { /* a liar about its close: no clean close for it */
        char what[64];
        snprintf(what, sizeof(what), "%s after bye (bye must be the last message)", proto_op_name(m.op));
        protocol_error(s, m.id, what); /* its end is no clean close: it has a reason */
        return;
    }
    if (m.op == PROTO_OP_ACQUIRE)
        note_private(s, &m);
    dispatch(s, &m);
    broker_check(s->env->broker);
    tenantdir_check(s->env->tenantdirs);
}
