/* SPDX-License-Identifier: MIT */
/* test-ledger-daemon.c: the daemon's half of same-tenant handoffs (PROTO_FEAT_LEDGER,
 * proto/ledger.h, daemon/tenantdir.c) against a real shmrefd, spoken raw (proto_encode
 * over SOCK_SEQPACKET), with the directory and ledgers mapped here from the fds the hello
 * reply carries, so it depends on nothing of libshmref's ledger code. Hostile clients
 * (garbage in every ledger slot, other uids, wrong tokens) must not keep a buffer from its
 * recycling or hold one they have no fd for; a real hold keeps a buffer LENT until its
 * count drops and a nudge comes, or its holder dies. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <msgpack.h>

#include "harness.h"
#include "ledger.h"
#include "proto.h"
#include "rawclient.h"

#define WAIT_MS 5000
#define SIZE 65536
#define OTHER_UID 65534
#define LEDGER_FEATURES (PROTO_FEAT_FD_ONCE | PROTO_FEAT_LEDGER)

TestSuite(ledger_daemon, .fini = reap_children);

/* ---- a raw ledger client (no Criterion asserts: children use it too) -------------- */

struct lc {
    int sock;
    uint32_t id;
    uint64_t features;          /* agreed */
    int dir_fd, led_fd;         /* -1 without a ledger */
    void *dir;
    _Atomic uint32_t *counts;
};

struct lbuf {
    uint64_t handle, buf_id, size;
    uint8_t token[PROTO_TOKEN_LEN];
    int fd;                     /* -1 when fd-once left it off */
    uint32_t flags;
};

static int send_msg(struct lc *c, struct proto_msg *m)
{
    uint8_t buf[1024];
    m->id = ++c->id;
    int n = proto_encode(m, buf, sizeof(buf));
    if (n < 0)
        return n;
    return rawclient_send(c->sock, buf, (size_t)n);
}

/* recv_reply: the next message, decoded into *ret (its bytes in rep); fds (up to max)
 * into fds. Returns 0, or -ETIMEDOUT, -EPIPE (closed), -EPROTO, or -code of an error reply. */
static int recv_reply(struct lc *c, uint8_t *rep, size_t cap, struct proto_msg *ret, int *fds, unsigned max,
                      unsigned *ret_n)
{
    unsigned n = 0;
    ssize_t len = rawclient_recv_fds(c->sock, rep, cap, fds, max, &n, WAIT_MS);
    if (ret_n)
        *ret_n = n;
    if (len == 0)
        return -EPIPE;
    if (len < 0)
        return (int)len;
    const char *why;
    if (proto_decode(rep, (size_t)len, PROTO_MAX_REPLY, ret, &why) < 0)
        return -EPROTO;
    if (ret->op == PROTO_OP_ERROR)
        return -ret->u.error.code;
    return 0;
}

static int call(struct lc *c, struct proto_msg *m, struct proto_msg *ret, int *fds, unsigned max, unsigned *ret_n)
{
    static uint8_t rep[PROTO_MAX_REPLY];
    int r = send_msg(c, m);
    if (r < 0)
        return r;
    r = recv_reply(c, rep, sizeof(rep), ret, fds, max, ret_n);
    if (r == 0 && (ret->op != m->op + PROTO_OP_REPLY || ret->id != m->id))
        return -EPROTO;
    return r;
}

static int lc_open(struct lc *c, const char *socket, uint64_t features)
{
    *c = (struct lc){ .dir_fd = -1, .led_fd = -1 };
    if ((c->sock = rawclient_connect(socket)) < 0)
        return c->sock;
    struct proto_msg m = { .op = PROTO_OP_HELLO }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = features;
    m.u.hello.name = "ledger-test";
    m.u.hello.name_len = 11;
    int fds[2] = { -1, -1 };
    unsigned n = 0;
    int e = call(c, &m, &r, fds, 2, &n);
    if (e < 0)
        return e;
    c->features = r.u.hello_reply.features;
    if (!(c->features & PROTO_FEAT_LEDGER))
        return n == 0 ? 0 : -EPROTO;
    if (n != 2)
        return -EPROTO;
    c->dir_fd = fds[0];
    c->led_fd = fds[1];
    c->dir = mmap(NULL, LEDGER_DIR_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, c->dir_fd, 0);
    c->counts = mmap(NULL, LEDGER_COUNTS_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, c->led_fd, 0);
    if (c->dir == MAP_FAILED || c->counts == MAP_FAILED)
        return -errno;
    return ledger_dir_check(c->dir, LEDGER_DIR_SIZE);
}

static void lc_close(struct lc *c)
{
    if (c->dir && c->dir != MAP_FAILED)
        munmap(c->dir, LEDGER_DIR_SIZE);
    if (c->counts && (void *)c->counts != MAP_FAILED)
        munmap((void *)c->counts, LEDGER_COUNTS_SIZE);
    if (c->dir_fd >= 0)
        close(c->dir_fd);
    if (c->led_fd >= 0)
        close(c->led_fd);
    close(c->sock);
    *c = (struct lc){ .sock = -1, .dir_fd = -1, .led_fd = -1 };
}

static int buf_reply(const struct proto_msg *r, int fd, unsigned n, struct lbuf *ret)
{
    *ret = (struct lbuf){ .handle = r->u.lease_reply.handle, .buf_id = r->u.lease_reply.buf_id,
                          .size = r->u.lease_reply.size, .fd = n ? fd : -1, .flags = r->u.lease_reply.flags };
    memcpy(ret->token, r->u.lease_reply.token, PROTO_TOKEN_LEN);
    return 0;
}

static int lc_lease(struct lc *c, uint64_t size, struct lbuf *ret)
{
    struct proto_msg m = { .op = PROTO_OP_LEASE }, r;
    m.u.lease.size = size;
    int fd = -1;
    unsigned n = 0;
    int e = call(c, &m, &r, &fd, 1, &n);
    return e < 0 ? e : buf_reply(&r, fd, n, ret);
}

static int lc_acquire(struct lc *c, const uint8_t *token, struct lbuf *ret)
{
    struct proto_msg m = { .op = PROTO_OP_ACQUIRE }, r;
    memcpy(m.u.acquire.token, token, PROTO_TOKEN_LEN);
    int fd = -1;
    unsigned n = 0;
    int e = call(c, &m, &r, &fd, 1, &n);
    return e < 0 ? e : buf_reply(&r, fd, n, ret);
}

static int lc_publish(struct lc *c, uint64_t handle, uint64_t size, uint32_t keep_ms, uint32_t max_acquires)
{
    struct proto_msg m = { .op = PROTO_OP_PUBLISH }, r;
    m.u.publish.handle = handle;
    m.u.publish.size = size;
    m.u.publish.keep_ms = keep_ms;
    m.u.publish.max_acquires = max_acquires;
    return call(c, &m, &r, NULL, 0, NULL);
}

static int lc_release(struct lc *c, uint64_t handle)
{
    struct proto_msg m = { .op = PROTO_OP_RELEASE }, r;
    m.u.release.handle = handle;
    return call(c, &m, &r, NULL, 0, NULL);
}

static int lc_ping(struct lc *c)
{
    struct proto_msg m = { .op = PROTO_OP_PING }, r;
    return call(c, &m, &r, NULL, 0, NULL);
}

static int lc_took(struct lc *c, uint64_t buf_id, const uint8_t *token)
{
    struct proto_msg m = { .op = PROTO_OP_TOOK };
    m.u.took.buf_id = buf_id;
    memcpy(m.u.took.token, token, PROTO_TOKEN_LEN);
    return send_msg(c, &m);
}

static int lc_nudge(struct lc *c, uint64_t buf_id)
{
    struct proto_msg m = { .op = PROTO_OP_NUDGE };
    m.u.nudge.buf_id = buf_id;
    return send_msg(c, &m);
}

/* lc_give: c gives back its ledger hold on the buffer published under token, as
 * libshmref does: the decrement, and a nudge if the daemon marked the buffer LENT. 0 or
 * the nudge's send error. */
static int lc_give(struct lc *c, const uint8_t *token, uint64_t buf_id)
{
    return ledger_give(c->dir, c->counts, ledger_slot_of(token)) ? lc_nudge(c, buf_id) : 0;
}

static int lc_forget(struct lc *c, uint64_t buf_id, bool writable)
{
    struct proto_msg m = { .op = PROTO_OP_FORGET };
    m.u.forget.buf_id = buf_id;
    m.u.forget.writable = writable;
    return send_msg(c, &m);
}

/* lc_publish_dir: what a producer's libshmref does before it hands the descriptor on. */
static int lc_publish_dir(struct lc *c, const struct lbuf *b, uint64_t size)
{
    return ledger_publish(c->dir, ledger_slot_of(b->token), b->buf_id, b->token, size, NULL, 0);
}

/* lc_take: a consumer's hold without the daemon (it maps b: it was sent b's fd). */
static int lc_take(struct lc *c, const uint8_t *token, uint64_t size, uint64_t buf_id)
{
    uint8_t meta[LEDGER_META_MAX];
    uint32_t mlen;
    return ledger_take(c->dir, c->counts, ledger_slot_of(token), token, size, buf_id, meta, &mlen);
}

static void open_ok(struct lc *c, const struct daemon *d)
{
    int r = lc_open(c, d->socket, LEDGER_FEATURES);
    cr_assert_eq(r, 0, "ledger hello: %s", strerror(-r));
    cr_assert(c->features & PROTO_FEAT_LEDGER, "the daemon did not agree PROTO_FEAT_LEDGER");
}

static void lease_ok(struct lc *c, uint64_t size, struct lbuf *b)
{
    int r = lc_lease(c, size, b);
    cr_assert_eq(r, 0, "lease: %s", strerror(-r));
}

static void acquire_ok(struct lc *c, const uint8_t *token, struct lbuf *b)
{
    int r = lc_acquire(c, token, b);
    cr_assert_eq(r, 0, "acquire: %s", strerror(-r));
}

/* st: one number of the status map ("ledger.lent"), asked over a raw connection without
 * a ledger (a libshmref connection may have one, and would count in ledger.ledgers). */
static uint64_t st(const struct daemon *d, const char *path)
{
    struct lc c;
    struct proto_msg m = { .op = PROTO_OP_STATUS }, r;
    cr_assert_eq(lc_open(&c, d->socket, 0), 0);
    cr_assert_eq(call(&c, &m, &r, NULL, 0, NULL), 0, "status");
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    cr_assert_eq(msgpack_unpack_next(&up, (const char *)r.u.status_reply.body, r.u.status_reply.body_len, NULL),
                 MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *o = &up.data;
    char part[64];
    for (const char *p = path; o && *p;) {
        size_t n = strcspn(p, ".");
        snprintf(part, sizeof(part), "%.*s", (int)n, p);
        p += n + (p[n] == '.');
        const msgpack_object *next = NULL;
        for (uint32_t i = 0; o->type == MSGPACK_OBJECT_MAP && i < o->via.map.size && !next; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(part) &&
                memcmp(k->via.str.ptr, part, k->via.str.size) == 0)
                next = &o->via.map.ptr[i].val;
        }
        o = next;
    }
    cr_assert(o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER, "status has no number at %s", path);
    uint64_t v = o->via.u64;
    msgpack_unpacked_destroy(&up);
    lc_close(&c);
    return v;
}

static uint64_t wait_st(const struct daemon *d, const char *path, uint64_t want, int ms)
{
    long deadline = now_ms() + ms;
    uint64_t v;
    while ((v = st(d, path)) != want && now_ms() < deadline)
        usleep(1000);
    return v;
}

/* ---- (1) the hello and its two files ---------------------------------------------- */

static void expect_sealed(int fd, size_t size, const char *what)
{
    struct stat sb;
    cr_assert_eq(fstat(fd, &sb), 0);
    cr_assert_eq((size_t)sb.st_size, size, "%s is %lld bytes, not %zu", what, (long long)sb.st_size, size);
    cr_assert_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR, "%s is not O_RDWR", what);
    int seals = fcntl(fd, F_GET_SEALS);
    cr_assert_eq(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, "%s seals %#x", what, seals);
    cr_assert_eq(ftruncate(fd, (off_t)size / 2), -1, "%s shrinks", what);
    cr_assert_eq(errno, EPERM);
    cr_assert_eq(ftruncate(fd, (off_t)size * 2), -1, "%s grows", what);
    cr_assert_eq(errno, EPERM);
    cr_assert_eq(fallocate(fd, 0, 0, (off_t)size + 4096), -1, "%s grows by fallocate", what);
    cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1, "%s takes more seals", what);
    cr_assert_eq(errno, EPERM);
    char byte = 1;
    cr_assert_eq(pwrite(fd, &byte, 1, (off_t)size), -1, "%s written past its end", what);
}

Test(ledger_daemon, hello_sends_two_sealed_files, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc a, b, plain, noonce;
    open_ok(&a, &d);
    expect_sealed(a.dir_fd, LEDGER_DIR_SIZE, "the directory");
    expect_sealed(a.led_fd, LEDGER_COUNTS_SIZE, "the ledger");
    const struct ledger_header *h = a.dir;
    cr_assert_eq(h->uid, getuid());
    cr_assert_eq(h->nslots, LEDGER_SLOTS);

    /* a second connection of the uid: the same directory, its own ledger */
    open_ok(&b, &d);
    struct stat s1, s2;
    fstat(a.dir_fd, &s1);
    fstat(b.dir_fd, &s2);
    cr_assert_eq(s1.st_ino, s2.st_ino, "one directory per uid");
    fstat(a.led_fd, &s1);
    fstat(b.led_fd, &s2);
    cr_assert_neq(s1.st_ino, s2.st_ino, "one ledger per connection");
    cr_assert_eq(st(&d, "ledger.directories"), 1);
    cr_assert_eq(st(&d, "ledger.ledgers"), 2);

    /* not asked, or asked without fd-once: not agreed, no fds */
    cr_assert_eq(lc_open(&plain, d.socket, PROTO_FEAT_FD_ONCE), 0);
    cr_assert_not(plain.features & PROTO_FEAT_LEDGER);
    cr_assert_eq(lc_open(&noonce, d.socket, PROTO_FEAT_LEDGER), 0, "a ledger without fd-once came with fds");
    cr_assert_not(noonce.features & PROTO_FEAT_LEDGER);
    cr_assert_eq(st(&d, "ledger.ledgers"), 2);

    /* the uid's last ledger connection takes its directory along */
    lc_close(&a);
    lc_close(&b);
    cr_assert_eq(wait_st(&d, "ledger.directories", 0, WAIT_MS), 0);
    cr_assert_eq(st(&d, "ledger.ledgers"), 0);
    lc_close(&plain);
    lc_close(&noonce);
    daemon_stop(&d);
}

/* ---- (2) hostile ledgers ---------------------------------------------------------- */

/* A child of OTHER_UID with a ledger full of 0xffffffff; when told (token given), it
 * acquires that buffer (so it maps it) and releases its handle, keeping the mapping. */
struct hostile_arg {
    const char *socket;
    int ready[2], go[2];
    uint8_t token[PROTO_TOKEN_LEN];
    bool acquire;
};

static int become(uid_t uid)
{
    return setgroups(0, NULL) == 0 && setgid(uid) == 0 && setuid(uid) == 0 ? 0 : -1;
}

static int hostile_child(void *p)
{
    struct hostile_arg *a = p;
    struct lc c;
    close(a->go[1]); /* the parent's ends: EOF on go when the parent is done */
    close(a->ready[0]);
    if (become(OTHER_UID) < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
        return 10;
    if (lc_open(&c, a->socket, LEDGER_FEATURES) < 0 || !(c.features & PROTO_FEAT_LEDGER))
        return 11;
    memset((void *)c.counts, 0xff, LEDGER_COUNTS_SIZE);
    if (a->acquire) {
        struct lbuf b;
        if (lc_acquire(&c, a->token, &b) < 0 || b.fd < 0)
            return 12;
        if (lc_release(&c, b.handle) < 0)
            return 13;
        /* and a took and a nudge of a buffer of another uid: ignored */
        lc_took(&c, b.buf_id, a->token);
        lc_nudge(&c, b.buf_id);
        if (lc_ping(&c) < 0)
            return 14;
    }
    char x = 1;
    if (write(a->ready[1], &x, 1) != 1)
        return 15;
    if (read(a->go[0], &x, 1) < 0) /* EOF: the parent is done */
        return 16;
    lc_close(&c);
    return 0;
}

static pid_t hostile_start(struct hostile_arg *a)
{
    cr_assert_eq(pipe(a->ready), 0);
    cr_assert_eq(pipe(a->go), 0);
    pid_t pid = child_run(hostile_child, a);
    close(a->ready[1]);
    close(a->go[0]);
    char x;
    cr_assert_eq(read(a->ready[0], &x, 1), 1, "the hostile child failed: exit %d", child_wait(pid));
    return pid;
}

static void hostile_stop(struct hostile_arg *a, pid_t pid)
{
    close(a->go[1]);
    cr_assert_eq(child_wait(pid), 0);
    close(a->ready[0]);
}

Test(ledger_daemon, garbage_ledgers_hold_nothing, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    struct lc prod, liar;
    open_ok(&prod, &d);
    /* a liar of the producer's own uid with every count at 0xffffffff, and no fd */
    open_ok(&liar, &d);
    memset((void *)liar.counts, 0xff, LEDGER_COUNTS_SIZE);
    /* and one of another uid */
    struct hostile_arg ha = { .socket = d.socket };
    pid_t other = hostile_start(&ha);

    struct lbuf x, again;
    lease_ok(&prod, SIZE, &x);
    cr_assert_lt(ledger_slot_of(x.token), LEDGER_SLOTS, "the token names the buffer's slot");
    cr_assert_eq(lc_publish_dir(&prod, &x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    /* the liar never got its fd: a took is ignored, and its counts keep nothing */
    cr_assert_eq(lc_took(&liar, x.buf_id, x.token), 0);
    cr_assert_eq(lc_ping(&liar), 0, "the liar is still served");
    cr_assert_eq(st(&d, "ledger.took"), 0);
    cr_assert_geq(st(&d, "ledger.ignored"), 1);
    uint64_t recycled = st(&d, "counters.buffers_recycled");
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 0, "garbage in ledgers that may not hold it kept the buffer");
    cr_assert_eq(st(&d, "ledger.recycle_waits"), 0);
    lease_ok(&prod, SIZE, &again);
    cr_assert_eq(again.buf_id, x.buf_id, "the same buffer is leased again (recycled)");
    cr_assert_eq(st(&d, "counters.buffers_recycled"), recycled + 1);
    cr_assert_eq(ledger_slot_of(again.token), ledger_slot_of(x.token));
    cr_assert_neq(memcmp(again.token + 4, x.token + 4, PROTO_TOKEN_LEN - 4), 0, "a new token");
    cr_assert_eq(lc_release(&prod, again.handle), 0);
    hostile_stop(&ha, other);

    /* another uid that maps the buffer (a cross-tenant acquire) with garbage counts: the
     * buffer goes (retired, as any buffer another uid mapped) at its last release */
    lease_ok(&prod, SIZE, &x);
    cr_assert_eq(lc_publish_dir(&prod, &x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    struct hostile_arg hb = { .socket = d.socket, .acquire = true };
    memcpy(hb.token, x.token, PROTO_TOKEN_LEN);
    other = hostile_start(&hb);
    uint64_t retired = st(&d, "counters.buffers_retired");
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 0, "another uid's ledger kept the buffer");
    cr_assert_eq(st(&d, "buffers.live"), 0);
    cr_assert_eq(st(&d, "counters.buffers_retired"), retired + 1);
    lease_ok(&prod, SIZE, &again);
    cr_assert_neq(again.buf_id, x.buf_id, "a buffer another uid mapped is never leased again");
    cr_assert_eq(lc_release(&prod, again.handle), 0);
    cr_assert_eq(st(&d, "ledger.took"), 0, "another uid's took counted");
    hostile_stop(&hb, other);
    cr_assert_eq(st(&d, "ledger.recycle_waits"), 0);
    lc_close(&liar);
    lc_close(&prod);
    daemon_stop(&d);
}

/* ---- (3) a real hold keeps the buffer LENT ---------------------------------------- */

/* consumer_ready: cons was sent b's fd (a daemon acquire, released: the mapping stays,
 * as libshmref's cache keeps it) and takes a ledger hold on the publish. */
static void consumer_holds(struct lc *cons, const struct lbuf *x)
{
    struct lbuf a;
    acquire_ok(cons, x->token, &a);
    cr_assert_eq(a.buf_id, x->buf_id);
    cr_assert_geq(a.fd, 0, "the first acquire carries the fd");
    close(a.fd);
    cr_assert_eq(lc_release(cons, a.handle), 0);
    cr_assert_eq(lc_take(cons, x->token, SIZE, x->buf_id), 0, "the ledger take");
    cr_assert_eq(lc_took(cons, x->buf_id, x->token), 0);
}

Test(ledger_daemon, hold_keeps_buffer_lent_until_nudge, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod, cons;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    struct lbuf x, y, z;
    lease_ok(&prod, SIZE, &x);
    cr_assert_eq(lc_publish_dir(&prod, &x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    consumer_holds(&cons, &x);
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1, "a held buffer was not kept");
    cr_assert_eq(st(&d, "ledger.recycle_waits"), 1);
    cr_assert_eq(st(&d, "ledger.took"), 1);
    cr_assert_eq(st(&d, "buffers.live"), 1, "LENT is still charged");
    cr_assert_eq(atomic_load(&ledger_entry_at(cons.dir, ledger_slot_of(x.token))->state), LEDGER_LENT);

    /* LENT: not leased again (a daemon acquire would revive it: revive_* below) */
    lease_ok(&prod, SIZE, &y);
    cr_assert_neq(y.buf_id, x.buf_id, "a LENT buffer was leased again");

    /* the hold drops; until the nudge the daemon does not know */
    cr_assert(ledger_give(cons.dir, cons.counts, ledger_slot_of(x.token)), "ledger_give did not see LENT");
    usleep(100 * 1000);
    cr_assert_eq(st(&d, "ledger.lent"), 1);
    cr_assert_eq(lc_nudge(&cons, x.buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0, "a nudge did not end it");
    cr_assert_eq(st(&d, "ledger.nudges"), 1);
    cr_assert_eq(atomic_load(&ledger_entry_at(cons.dir, ledger_slot_of(x.token))->state), LEDGER_FREE);
    lease_ok(&prod, SIZE, &z);
    cr_assert_eq(z.buf_id, x.buf_id, "recycled after the nudge");
    cr_assert_eq(lc_release(&prod, y.handle), 0);

    /* a forget while holding: its count is read no more (the liar harms only itself) */
    cr_assert_eq(lc_publish_dir(&prod, &z, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, z.handle, SIZE, 0, 0), 0);
    cr_assert_eq(lc_take(&cons, z.token, SIZE, z.buf_id), 0, "a take on the cached mapping");
    cr_assert_eq(lc_release(&prod, z.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1);
    cr_assert_eq(lc_forget(&cons, z.buf_id, false), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0, "a forget did not end it");
    cr_assert_eq(st(&d, "buffers.live"), 0);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* A daemon acquire of a LENT buffer's descriptor revives it, as the daemon handles of
 * the consumers whose ledger holds keep it would have kept its publish findable: the same
 * buffer with the producer's bytes (for another uid too), its directory entry FREE (later
 * takes ask the daemon), LENT again when that handle goes while the hold lives, and never
 * recycled under either. */
Test(ledger_daemon, a_daemon_acquire_revives_a_lent_buffer, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    struct lc prod, cons;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    struct lbuf x, r, y;
    lease_ok(&prod, SIZE, &x);
    cr_assert_geq(x.fd, 0);
    uint8_t *p = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, x.fd, 0);
    cr_assert_neq(p, MAP_FAILED);
    memset(p, 0x5a, SIZE);
    munmap(p, SIZE);
    cr_assert_eq(lc_publish_dir(&prod, &x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    consumer_holds(&cons, &x);
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1);

    /* OTHER_UID, through the daemon: the same buffer, the producer's bytes */
    pid_t pid = fork();
    if (pid == 0) {
        struct lc o;
        struct lbuf b;
        if (become(OTHER_UID) < 0)
            _exit(10);
        if (lc_open(&o, d.socket, 0) < 0)
            _exit(15);
        if (lc_acquire(&o, x.token, &b) < 0 || b.buf_id != x.buf_id || b.fd < 0)
            _exit(11);
        uint8_t *q = mmap(NULL, SIZE, PROT_READ, MAP_SHARED, b.fd, 0);
        if (q == MAP_FAILED)
            _exit(12);
        for (size_t i = 0; i < SIZE; i++)
            if (q[i] != 0x5a)
                _exit(13);
        _exit(lc_release(&o, b.handle) == 0 ? 0 : 14);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the other uid's acquire: exit %d",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    cr_assert_eq(wait_st(&d, "ledger.lent", 1, WAIT_MS), 1, "LENT again once that handle went");

    /* the producer's uid: revived, the entry FREE while the handle lives */
    acquire_ok(&prod, x.token, &r);
    cr_assert_eq(r.buf_id, x.buf_id);
    if (r.fd >= 0)
        close(r.fd);
    cr_assert_eq(st(&d, "ledger.lent"), 0, "an acquired buffer is still LENT");
    cr_assert_eq(atomic_load(&ledger_entry_at(cons.dir, ledger_slot_of(x.token))->state), LEDGER_FREE);
    cr_assert_eq(st(&d, "buffers.live"), 1);
    lease_ok(&prod, SIZE, &y);
    cr_assert_neq(y.buf_id, x.buf_id, "a revived buffer was leased again");
    cr_assert_eq(lc_release(&prod, r.handle), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 1, WAIT_MS), 1, "the ledger hold no longer keeps it");

    /* the hold goes: it ends */
    cr_assert_eq(lc_give(&cons, x.token, x.buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0);
    cr_assert_eq(lc_release(&prod, y.handle), 0);
    cr_assert_eq(wait_st(&d, "buffers.live", 0, WAIT_MS), 0);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* A holder that is SIGKILLed: its ledger is read no more, the buffer ends at once. */
struct holder_arg {
    const char *socket;
    struct lbuf x;
    int ready[2];
};

static int holder_child(void *p)
{
    struct holder_arg *a = p;
    struct lc c;
    struct lbuf b;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (lc_open(&c, a->socket, LEDGER_FEATURES) < 0 || !(c.features & PROTO_FEAT_LEDGER))
        return 11;
    if (lc_acquire(&c, a->x.token, &b) < 0 || b.fd < 0 || lc_release(&c, b.handle) < 0)
        return 12;
    if (lc_take(&c, a->x.token, SIZE, a->x.buf_id) != 0)
        return 13;
    char x = 1;
    if (write(a->ready[1], &x, 1) != 1)
        return 14;
    for (;;)
        pause();
}

Test(ledger_daemon, killed_holder_is_reclaimed, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod;
    open_ok(&prod, &d);
    struct holder_arg a = { .socket = d.socket };
    lease_ok(&prod, SIZE, &a.x);
    cr_assert_eq(lc_publish_dir(&prod, &a.x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, a.x.handle, SIZE, 0, 0), 0);
    cr_assert_eq(pipe(a.ready), 0);
    pid_t pid = child_run(holder_child, &a);
    close(a.ready[1]);
    char c;
    cr_assert_eq(read(a.ready[0], &c, 1), 1, "the holder failed: exit %d", child_wait(pid));
    cr_assert_eq(lc_release(&prod, a.x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1);
    long t0 = now_ms();
    kill(pid, SIGKILL);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0, "a dead holder's ledger kept the buffer");
    long ms = now_ms() - t0;
    cr_log_info("LENT buffer of a SIGKILLed holder reclaimed in %ld ms", ms);
    cr_assert_lt(ms, 1000, "reclaimed after %ld ms", ms);
    child_wait(pid);
    struct lbuf again;
    lease_ok(&prod, SIZE, &again);
    cr_assert_eq(again.buf_id, a.x.buf_id, "recycled after its holder died");
    close(a.ready[0]);
    lc_close(&prod);
    daemon_stop(&d);
}

/* ---- (4) took and nudge that mean nothing ----------------------------------------- */

/* no_reply: nothing comes back within 100 ms (took and nudge never have a reply). */
static void no_reply(struct lc *c)
{
    uint8_t rep[4096];
    cr_assert_eq(rawclient_recv_wait(c->sock, rep, sizeof(rep), 100), -ETIMEDOUT, "a reply to a took or nudge");
}

Test(ledger_daemon, bad_took_and_nudge_are_ignored, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod, cons, plain;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    cr_assert_eq(lc_open(&plain, d.socket, PROTO_FEAT_FD_ONCE), 0);
    struct lbuf x, a;
    lease_ok(&prod, SIZE, &x);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    acquire_ok(&cons, x.token, &a);
    close(a.fd);
    uint64_t acquires = st(&d, "counters.acquires");

    uint8_t wrong[PROTO_TOKEN_LEN];
    memcpy(wrong, x.token, PROTO_TOKEN_LEN);
    wrong[PROTO_TOKEN_LEN - 1] ^= 1;
    cr_assert_eq(lc_took(&cons, x.buf_id, wrong), 0);           /* wrong token */
    cr_assert_eq(lc_took(&cons, x.buf_id + 1000, x.token), 0);  /* unknown buf_id */
    cr_assert_eq(lc_took(&cons, 0, x.token), 0);
    cr_assert_eq(lc_took(&cons, UINT64_MAX, x.token), 0);
    cr_assert_eq(lc_nudge(&cons, x.buf_id + 1000), 0);          /* nothing LENT */
    cr_assert_eq(lc_nudge(&cons, UINT64_MAX), 0);
    no_reply(&cons);
    cr_assert_eq(lc_ping(&cons), 0, "the session is still served");
    cr_assert_eq(lc_took(&plain, x.buf_id, x.token), 0);         /* no ledger */
    cr_assert_eq(lc_nudge(&plain, x.buf_id), 0);
    no_reply(&plain);
    cr_assert_eq(lc_ping(&plain), 0);
    cr_assert_eq(st(&d, "ledger.took"), 0);
    cr_assert_eq(st(&d, "ledger.ignored"), 6);
    cr_assert_eq(st(&d, "counters.acquires"), acquires, "an ignored took counted as an acquire");
    cr_assert_eq(st(&d, "counters.protocol_errors"), 0);

    /* the right one counts */
    cr_assert_eq(lc_took(&cons, x.buf_id, x.token), 0);
    cr_assert_eq(lc_ping(&cons), 0);
    cr_assert_eq(st(&d, "ledger.took"), 1);
    cr_assert_eq(st(&d, "counters.acquires"), acquires + 1);
    cr_assert_eq(lc_release(&cons, a.handle), 0);
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    lc_close(&plain);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* consumer_maps: cons is sent the fd of a fresh buffer of prod's (a plain publish it
 * acquires through the daemon and releases: the mapping stays, as libshmref's cache keeps
 * it); prod's next lease of SIZE gets that same buffer, in *y. */
static void consumer_maps(struct lc *prod, struct lc *cons, struct lbuf *y)
{
    struct lbuf x, a;
    lease_ok(prod, SIZE, &x);
    cr_assert_eq(lc_publish(prod, x.handle, SIZE, 0, 0), 0);
    acquire_ok(cons, x.token, &a);
    cr_assert_geq(a.fd, 0);
    close(a.fd);
    cr_assert_eq(lc_release(cons, a.handle), 0);
    cr_assert_eq(lc_release(prod, x.handle), 0);
    lease_ok(prod, SIZE, y);
    cr_assert_eq(y->buf_id, x.buf_id);
}

/* ---- (5) a took counts toward max_acquires ---------------------------------------- */

Test(ledger_daemon, took_ends_retention_at_max_acquires, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod, cons;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    /* the consumer maps the buffer; the same buffer again, retained for 60 s or one acquire */
    struct lbuf y;
    consumer_maps(&prod, &cons, &y);
    cr_assert_eq(lc_publish_dir(&prod, &y, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, y.handle, SIZE, 60000, 1), 0);
    cr_assert_eq(lc_release(&prod, y.handle), 0);
    cr_assert_eq(st(&d, "buffers.retained"), 1);
    cr_assert_eq(lc_take(&cons, y.token, SIZE, y.buf_id), 0);
    cr_assert_eq(lc_took(&cons, y.buf_id, y.token), 0);
    cr_assert_eq(wait_st(&d, "buffers.retained", 0, WAIT_MS), 0, "the took did not end the retention");
    cr_assert_eq(st(&d, "ledger.took"), 1);
    cr_assert_eq(st(&d, "ledger.lent"), 1, "held by the ledger after its retention");
    /* As in the daemon's own path, where the consumer's handle would keep the publish
     * findable after its retention: a daemon acquire of it is served (revived). */
    struct lbuf again;
    acquire_ok(&prod, y.token, &again);
    cr_assert_eq(again.buf_id, y.buf_id);
    cr_assert_eq(st(&d, "ledger.lent"), 0, "an acquired buffer is still LENT");
    if (again.fd >= 0)
        close(again.fd);
    cr_assert_eq(lc_release(&prod, again.handle), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 1, WAIT_MS), 1, "the ledger hold no longer keeps it");
    cr_assert_eq(lc_give(&cons, y.token, y.buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0);
    cr_assert_eq(st(&d, "buffers.live"), 0);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* A took that overtakes the producer's publish (the producer writes the directory, then
 * sends its one-way publish on its own connection; the daemon may read the consumer's
 * note first) counts at the publish: a max_acquires retention ends there, not at its
 * keep deadline 60 s later. */
Test(ledger_daemon, took_before_the_publish_counts_at_the_publish, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod, cons;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    struct lbuf y;
    consumer_maps(&prod, &cons, &y);
    cr_assert_eq(lc_publish_dir(&prod, &y, SIZE), 0);
    cr_assert_eq(lc_take(&cons, y.token, SIZE, y.buf_id), 0);
    cr_assert_eq(lc_took(&cons, y.buf_id, y.token), 0);
    cr_assert_eq(lc_ping(&cons), 0, "the took is handled before this ping");
    cr_assert_eq(st(&d, "ledger.took"), 1, "a took before the publish was not counted");
    cr_assert_eq(st(&d, "ledger.ignored"), 0);
    cr_assert_eq(lc_publish(&prod, y.handle, SIZE, 60000, 1), 0);
    cr_assert_eq(st(&d, "buffers.retained"), 0, "the early took did not end the retention at the publish");
    cr_assert_eq(lc_release(&prod, y.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1, "held by the ledger");
    cr_assert_eq(lc_give(&cons, y.token, y.buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0);
    cr_assert_eq(st(&d, "buffers.live"), 0);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* ---- a ledger hold is not idleness ------------------------------------------------- */

Test(ledger_daemon, ledger_hold_keeps_connection_from_idling, .timeout = 60)
{
    struct daemon d;
    daemon_start(&d, "--idle-timeout", "1", NULL);
    struct lc prod, cons, idle;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    open_ok(&idle, &d);
    struct lbuf x;
    lease_ok(&prod, SIZE, &x);
    cr_assert_eq(lc_publish_dir(&prod, &x, SIZE), 0);
    cr_assert_eq(lc_publish(&prod, x.handle, SIZE, 0, 0), 0);
    consumer_holds(&cons, &x); /* no daemon handle left: only the ledger hold */
    /* the producer keeps its lease (not idle); the consumer says nothing for 2.5 s */
    usleep(2500 * 1000);
    cr_assert(raw_closed(idle.sock, 3000), "a ledger connection holding nothing did not idle out");
    cr_assert_eq(lc_ping(&cons), 0, "a connection with a ledger hold was closed as idle");
    cr_assert_eq(lc_release(&prod, x.handle), 0);
    cr_assert_eq(st(&d, "ledger.lent"), 1);
    cr_assert_eq(lc_give(&cons, x.token, x.buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0);
    lc_close(&idle);
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}

/* ---- the handshake raced through a real daemon ------------------------------------ */

/* A producer recycles buffers as fast as it can (lease, stamp every page with the
 * generation, ledger_publish, publish, release); a consumer process takes each current
 * publish in its ledger and checks every page while it holds it. The daemon must keep a
 * held buffer LENT, so the producer can never lease it again and overwrite it under the
 * consumer: a page with another generation than the one taken is a failure. */
#define RACE_SIZE (16 * 4096)
#define RACE_MAPS 64

struct race {
    _Atomic uint32_t seq;          /* odd while the producer writes the current publish */
    uint8_t token[PROTO_TOKEN_LEN];
    uint64_t buf_id, gen;
    _Atomic int stop;
    _Atomic uint64_t takes, stale, unmapped, bad;
};

struct race_map {
    uint64_t buf_id;
    uint8_t *p;
};

static uint8_t *race_find(struct race_map *m, uint64_t buf_id)
{
    for (int i = 0; i < RACE_MAPS; i++)
        if (m[i].buf_id == buf_id)
            return m[i].p;
    return NULL;
}

static void race_add(struct race_map *m, uint64_t buf_id, int fd, int prot)
{
    for (int i = 0; i < RACE_MAPS; i++)
        if (!m[i].buf_id) {
            void *p = mmap(NULL, RACE_SIZE, prot, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED)
                m[i] = (struct race_map){ .buf_id = buf_id, .p = p };
            return;
        }
}

struct race_arg {
    const char *socket;
    struct race *r;
};

static int race_consumer(void *p)
{
    struct race_arg *a = p;
    struct race *r = a->r;
    struct lc c;
    static struct race_map maps[RACE_MAPS];
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (lc_open(&c, a->socket, LEDGER_FEATURES) < 0 || !(c.features & PROTO_FEAT_LEDGER))
        return 11;
    while (!atomic_load(&r->stop)) {
        uint8_t token[PROTO_TOKEN_LEN];
        uint32_t s = atomic_load(&r->seq);
        if (s & 1)
            continue;
        memcpy(token, r->token, sizeof(token));
        uint64_t buf_id = r->buf_id, gen = r->gen;
        if (atomic_load(&r->seq) != s || !buf_id)
            continue;
        uint8_t *m = race_find(maps, buf_id);
        if (!m) { /* first sight of this buffer: an acquire through the daemon maps it */
            struct lbuf b;
            if (lc_acquire(&c, token, &b) == 0) {
                if (b.fd >= 0) {
                    race_add(maps, b.buf_id, b.fd, PROT_READ);
                    close(b.fd);
                }
                lc_release(&c, b.handle);
            }
            atomic_fetch_add(&r->unmapped, 1);
            continue;
        }
        int e = lc_take(&c, token, RACE_SIZE, buf_id);
        if (e == -ESTALE)
            lc_nudge(&c, buf_id);
        if (e)
            continue;
        atomic_fetch_add(&r->takes, 1);
        for (size_t off = 0; off < RACE_SIZE; off += 4096) {
            uint64_t head, tail;
            memcpy(&head, m + off, 8);
            memcpy(&tail, m + off + 4096 - 8, 8);
            if (head != gen || tail != gen)
                atomic_fetch_add(&r->bad, 1);
        }
        (void)lc_give(&c, token, buf_id);
    }
    lc_close(&c);
    return 0;
}

Test(ledger_daemon, consumer_racing_recycles_never_sees_a_new_generation, .timeout = 120)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct race *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(r, MAP_FAILED);
    struct race_arg a = { .socket = d.socket, .r = r };
    struct lc prod;
    open_ok(&prod, &d);
    pid_t pid = child_run(race_consumer, &a);
    static struct race_map maps[RACE_MAPS];
    uint64_t gen = 0;
    long end = now_ms() + 3000;
    while (now_ms() < end) {
        struct lbuf b;
        lease_ok(&prod, RACE_SIZE, &b);
        if (b.fd >= 0) {
            race_add(maps, b.buf_id, b.fd, PROT_READ | PROT_WRITE);
            close(b.fd);
        }
        uint8_t *m = race_find(maps, b.buf_id);
        cr_assert_not_null(m, "more than %d buffers", RACE_MAPS);
        gen++;
        for (size_t off = 0; off < RACE_SIZE; off += 4096) {
            memcpy(m + off, &gen, 8);
            memcpy(m + off + 4096 - 8, &gen, 8);
        }
        cr_assert_eq(lc_publish_dir(&prod, &b, RACE_SIZE), 0);
        cr_assert_eq(lc_publish(&prod, b.handle, RACE_SIZE, 0, 0), 0);
        atomic_fetch_add(&r->seq, 1);
        memcpy(r->token, b.token, PROTO_TOKEN_LEN);
        r->buf_id = b.buf_id;
        r->gen = gen;
        atomic_fetch_add(&r->seq, 1);
        cr_assert_eq(lc_release(&prod, b.handle), 0);
    }
    atomic_store(&r->stop, 1);
    cr_assert_eq(child_wait(pid), 0);
    uint64_t waits = st(&d, "ledger.recycle_waits");
    cr_log_info("race: %llu generations, %llu ledger takes, %llu buffer ends waited for a hold, %llu pages of "
                "another generation", (unsigned long long)gen, (unsigned long long)r->takes,
                (unsigned long long)waits, (unsigned long long)r->bad);
    cr_assert_eq(r->bad, 0, "%llu pages changed under a ledger hold", (unsigned long long)r->bad);
    cr_assert_gt(r->takes, 100, "only %llu takes: the race was not run", (unsigned long long)r->takes);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0);
    lc_close(&prod);
    munmap(r, sizeof(*r));
    daemon_stop(&d);
}

/* ---- a flood of nudges costs per nudge, not per LENT buffer ---- */

/* daemon_cpu_ticks: the daemon's user + system time so far, in clock ticks. */
static long daemon_cpu_ticks(const struct daemon *d)
{
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    cr_assert_not_null(fgets(line, sizeof(line), f));
    fclose(f);
    const char *p = strrchr(line, ')'); /* the name may hold spaces */
    long ut = 0, stt = 0;
    cr_assert_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &stt), 2);
    return ut + stt;
}

/* nudge_cpu: the daemon's CPU ticks for n nudges of buf_id from c (answered once a ping
 * after them is). */
static long nudge_cpu(const struct daemon *d, struct lc *c, uint64_t buf_id, unsigned n)
{
    cr_assert_eq(lc_ping(c), 0);
    long t0 = daemon_cpu_ticks(d);
    for (unsigned i = 0; i < n; i++)
        cr_assert_eq(lc_nudge(c, buf_id), 0);
    cr_assert_eq(lc_ping(c), 0);
    return daemon_cpu_ticks(d) - t0;
}

#define FLOOD_LENT 4000
#define FLOOD_SIZE 4096
#define FLOOD_NUDGES 200000

/* A nudge names a buffer; the daemon looked it up by walking its uid's LENT list, newest
 * first, so nudges of the oldest of 4,000 LENT buffers each walked all 4,000 (a client
 * chose the length of a loop in the daemon). The daemon's CPU time for a flood of nudges
 * of the oldest is compared with one of the newest (first on the list either way): the
 * same within noise now, not a multiple. */
Test(ledger_daemon, a_nudge_flood_costs_per_nudge_not_per_lent_buffer, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct lc prod, cons;
    open_ok(&prod, &d);
    open_ok(&cons, &d);
    static struct lbuf x[FLOOD_LENT];
    for (unsigned i = 0; i < FLOOD_LENT; i++) {
        struct lbuf a;
        lease_ok(&prod, FLOOD_SIZE, &x[i]);
        if (x[i].fd >= 0)
            close(x[i].fd);
        cr_assert_eq(lc_publish_dir(&prod, &x[i], FLOOD_SIZE), 0);
        cr_assert_eq(lc_publish(&prod, x[i].handle, FLOOD_SIZE, 0, 0), 0);
        acquire_ok(&cons, x[i].token, &a); /* the consumer is sent the fd, then holds in its ledger */
        if (a.fd >= 0)
            close(a.fd);
        cr_assert_eq(lc_release(&cons, a.handle), 0);
        cr_assert_eq(lc_take(&cons, x[i].token, FLOOD_SIZE, x[i].buf_id), 0, "take %u", i);
        cr_assert_eq(lc_release(&prod, x[i].handle), 0);
    }
    cr_assert_eq(wait_st(&d, "ledger.lent", FLOOD_LENT, WAIT_MS), FLOOD_LENT);
    /* the newest LENT first, then the oldest, then the newest again: each flood as long */
    long newest = nudge_cpu(&d, &cons, x[FLOOD_LENT - 1].buf_id, FLOOD_NUDGES);
    long oldest = nudge_cpu(&d, &cons, x[0].buf_id, FLOOD_NUDGES);
    newest = (newest + nudge_cpu(&d, &cons, x[FLOOD_LENT - 1].buf_id, FLOOD_NUDGES)) / 2;
    printf("nudge flood, %d LENT: %d nudges of the newest took the daemon %ld ticks, of the oldest %ld\n", FLOOD_LENT,
           FLOOD_NUDGES, newest, oldest);
    cr_assert_leq(oldest, 2 * newest + 10, "nudges of the oldest of %d LENT buffers cost %ld ticks, of the newest %ld",
                  FLOOD_LENT, oldest, newest);
    cr_assert_eq(st(&d, "ledger.lent"), FLOOD_LENT, "a nudge of a held buffer ended it");
    for (unsigned i = 0; i < FLOOD_LENT; i++)
        cr_assert_eq(lc_give(&cons, x[i].token, x[i].buf_id), 0);
    cr_assert_eq(wait_st(&d, "ledger.lent", 0, WAIT_MS), 0, "the gives did not end every loan");
    lc_close(&cons);
    lc_close(&prod);
    daemon_stop(&d);
}
