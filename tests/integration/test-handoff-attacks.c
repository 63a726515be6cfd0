/* SPDX-License-Identifier: MIT */
/* test-handoff-attacks.c: issue 28's attacks on handoffs, at the level of real processes,
 * the public API (libshmref) and the raw protocol, against the uid's TABLE (proto/handoff.h,
 * daemon/tenantdir.c, client-lib/localhold.c): (1) a uid that scribbles on every shared
 * mapping it has (its uid's table: header, every entry word, the metadata; its journals;
 * its buffers) while it floods acquire/map/giveback/adopt/forget never makes another uid
 * read a byte not its own, slow it past a ratio of its own baseline, change its charges or
 * crash or stall the daemon, and pins only buffers its own uid is charged for; (2)
 * consumers racing a producer's recycles for 10 s never read another generation under a
 * token (every page names its generation), through the table (local takes) and through
 * the daemon (a consumer that does not map the buffer yet); (3) a SIGKILL between any two
 * steps of a handoff (table leases and takes held) is reclaimed within 10 ms (median), by
 * the daemon's state; (4) a flood of each message kind (map, giveback and adopt of valid,
 * invalid and another uid's buffer ids; the retired took and nudge, answered EOPNOTSUPP on
 * a connection that stays open) costs only its sender (another uid's latency within a
 * ratio of its baseline, the daemon's anonymous memory bounded); (5) so does a flood of
 * status (or of lease, acquire and status mixed) beside a daemon holding 12,000 leases,
 * where a status costs 100 us. Each assertion says what in the daemon or the library
 * would break it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <setjmp.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "handoff.h"
#include "proto.h"
#include "rawclient.h"

#define OTHER_UID 65534
#define PAGE 4096u
#define RT_SIZE (16 * PAGE)        /* a victim's round trip: 16 pages, every one checked */
#define VICTIM_MAGIC 0x4d4954434956ull /* "VICTIM" */

/* Sanitized builds (SHMREF_SANITIZE): the daemon is several times slower; the ratios are
 * the same, the absolute bound of (3) is stated for an unsanitized daemon. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

static void init(void)
{
    signal(SIGPIPE, SIG_IGN);
}

TestSuite(handoff_attacks, .init = init, .fini = reap_children);

/* ---- small helpers ------------------------------------------------------------------ */

static long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* pct: the p-th percentile (0..100) of n samples (sorted in place). */
static long pct(long *v, size_t n, int p)
{
    qsort(v, n, sizeof(*v), cmp_long);
    size_t i = (n - 1) * (size_t)p / 100;
    return v[i];
}

static int become(uid_t uid)
{
    return setgroups(0, NULL) == 0 && setresgid(uid, uid, uid) == 0 && setresuid(uid, uid, uid) == 0 ? 0 : -1;
}



static bool daemon_alive(const struct daemon *d)
{
    return waitpid(d->pid, NULL, WNOHANG) == 0;
}

/* tenant_u64: status tenants[] entry of uid, field key; 0 when the uid has no entry
 * (nothing charged). */
static uint64_t tenant_u64(const shmref_status *st, unsigned uid, const char *key)
{
    int n = shmref_status_count(st, "tenants");
    char path[64];
    for (int i = 0; i < n; i++) {
        uint64_t u = 0, v = 0;
        snprintf(path, sizeof(path), "tenants.%d.uid", i);
        if (shmref_status_u64(st, path, &u) != 0 || u != uid)
            continue;
        snprintf(path, sizeof(path), "tenants.%d.%s", i, key);
        cr_assert_eq(shmref_status_u64(st, path, &v), 0, "status has no %s", path);
        return v;
    }
    return 0;
}

struct charge {
    uint64_t bytes, pinned, buffers;
};

static struct charge charge_of(shmref_conn *c, unsigned uid)
{
    shmref_status *st;
    cr_assert_eq(shmref_status_get(c, &st), 0, "status: %s", shmref_errmsg(c));
    struct charge ch = { tenant_u64(st, uid, "bytes"), tenant_u64(st, uid, "pinned"), tenant_u64(st, uid, "buffers") };
    shmref_status_free(st);
    return ch;
}


/* ---- the victim: round trips of its own, every page checked ------------------------- */

/* Every page of round trip `iter` starts with (VICTIM_MAGIC, iter, page) and continues
 * with bytes from a seed of both: a page of another round trip, another buffer or another
 * uid fails the check. */
static void victim_fill(uint8_t *p, uint64_t iter)
{
    for (uint64_t pg = 0; pg < RT_SIZE / PAGE; pg++) {
        uint64_t h[3] = { VICTIM_MAGIC, iter, pg };
        memcpy(p + pg * PAGE, h, sizeof(h));
        fill_pattern(p + pg * PAGE + sizeof(h), PAGE - sizeof(h), (uint32_t)(iter * 131 + pg + 1));
    }
}

/* victim_check: the first page that is not round trip iter's, or -1. */
static long victim_check(const uint8_t *p, uint64_t iter)
{
    for (uint64_t pg = 0; pg < RT_SIZE / PAGE; pg++) {
        uint64_t h[3];
        memcpy(h, p + pg * PAGE, sizeof(h));
        if (h[0] != VICTIM_MAGIC || h[1] != iter || h[2] != pg ||
            check_pattern(p + pg * PAGE + sizeof(h), PAGE - sizeof(h), (uint32_t)(iter * 131 + pg + 1)) != -1)
            return (long)pg;
    }
    return -1;
}

/* The victim: a producer and a consumer whose handoffs are the table's (lease, publish
 * and take with no message to the daemon), and a consumer without the table
 * ($SHMREF_TABLE=0), whose acquire of the same publish is the daemon's (the daemon takes
 * a hold in root's table): a round trip's time includes one daemon round trip, so a
 * daemon the attacker slows or stalls shows in it. */
struct victim {
    shmref_conn *prod, *cons, *dcons;
    uint64_t iter;
};

static void victim_open(struct victim *v, const struct daemon *d)
{
    v->prod = connect_ok(d);
    v->cons = connect_ok(d);
    setenv("SHMREF_TABLE", "0", 1);
    v->dcons = connect_ok(d);
    unsetenv("SHMREF_TABLE");
    cr_assert_eq(shmref_set_stock(v->prod, 0), 0); /* its charge is what it holds, nothing more */
    cr_assert_eq(shmref_set_stock(v->cons, 0), 0);
    cr_assert_eq(shmref_set_stock(v->dcons, 0), 0);
}

static void victim_close(struct victim *v)
{
    shmref_close(v->dcons);
    shmref_close(v->cons);
    shmref_close(v->prod);
}

/* victim_rt: one round trip (lease, fill, publish, the second connection acquires and
 * checks every page, both release); returns its time in microseconds. */
static long victim_rt(struct victim *v)
{
    long t0 = now_us();
    uint64_t it = ++v->iter;
    shmref_buf *b, *r;
    shmref_desc desc;
    cr_assert_eq(shmref_lease(v->prod, RT_SIZE, &b), 0, "victim lease %llu: %s", (unsigned long long)it,
                 shmref_errmsg(v->prod));
    victim_fill(shmref_buf_data(b), it);
    cr_assert_eq(shmref_publish(b, RT_SIZE, 0, NULL, 0, &desc), 0, "victim publish: %s", shmref_errmsg(v->prod));
    cr_assert_eq(shmref_acquire(v->cons, &desc, &r), 0, "victim acquire %llu: %s", (unsigned long long)it,
                 shmref_errmsg(v->cons));
    cr_assert_eq(shmref_buf_size(r), RT_SIZE);
    shmref_buf *q;
    cr_assert_eq(shmref_acquire(v->dcons, &desc, &q), 0, "victim acquire %llu through the daemon: %s",
                 (unsigned long long)it, shmref_errmsg(v->dcons));
    cr_assert_eq(shmref_buf_size(q), RT_SIZE);
    long badd = victim_check(shmref_buf_data(q), it);
    cr_assert_eq(badd, -1, "round trip %llu: page %ld of what the victim acquired through the daemon is not its own",
                 (unsigned long long)it, badd);
    shmref_release(q);
    /* Breaks when the victim is given a buffer another uid maps writable (the attacker's
     * table member ended to the pool while its clients still map it, a giveback or a
     * journal count of the attacker dropping a hold of root's member), or when root's own
     * table recycles a slot under the consumer's hold. */
    long bad = victim_check(shmref_buf_data(r), it);
    cr_assert_eq(bad, -1, "round trip %llu: page %ld of what the victim acquired is not its own",
                 (unsigned long long)it, bad);
    shmref_release(r);
    shmref_release(b);
    return now_us() - t0;
}

/* ---- (1) a uid that scribbles on everything it can write ----------------------------- */

/* What the test and its children share (MAP_SHARED anonymous, made before the fork; the
 * scribbler skips it: it is /dev/zero in its maps). */
struct ctl {
    _Atomic int stop;
    _Atomic int armed;              /* the attacker finished a whole pass */
    _Atomic uint64_t passes, regions, tables, journals, msgs, api_ok, api_err, reconnects;
    _Atomic uint64_t mapped, adopted, errors, eopnotsupp, local_leases; /* what its raw requests got */
    _Atomic uint64_t bus_faults;    /* regions it could not write: emptied under its stale mapping */
    /* root's table members (another uid's buffer ids, for map/giveback/adopt) */
    uint32_t nvictim;
    uint64_t victim_ids[16];
    /* the attacker's newest publish, held until its next (the victim acquires it) */
    _Atomic uint32_t dlock;
    shmref_desc desc;
};

/* ctl_stop: tells the children of ctl to stop and waits up to 20 s for pid; then
 * SIGKILL (a child blocked for good: the test fails instead of hanging). Returns its exit
 * status, or 128 + the signal. */
static int ctl_stop(struct ctl *ctl, pid_t pid)
{
    atomic_store(&ctl->stop, 1);
    long end = now_ms() + 20000;
    int status;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now_ms() < end)
        usleep(5000);
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static struct ctl *ctl_new(void)
{
    struct ctl *c = mmap(NULL, sizeof(*c), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(c, MAP_FAILED);
    memset(c, 0, sizeof(*c));
    return c;
}

#define TABLE_BYTES handoff_size(HANDOFF_MAX_SLOTS)
#define JOURNAL_BYTES HANDOFF_JOURNAL_SIZE
#define LOW_SLOTS 4096u             /* where a small daemon's pool slots are */

/* A raw connection with the uid's table and its journal (the hello's two fds), mapped
 * read-write as a hostile client keeps them; what its replies said, counted. */
struct raw {
    int sock;
    uint32_t id;
    uint64_t features;              /* the hello reply's */
    void *tab;
    _Atomic uint32_t *journal;
    uint64_t mapped, adopted, errors, eopnotsupp;
    uint64_t leased_ids[16];        /* buffers its leases for the table got (members at their release) */
    unsigned nleased;
    bool keep_maps;                 /* maps every fd a reply brings, writes into it, keeps it (the attacker) */
};

/* A buffer the attacker no longer holds may have been emptied under its stale mapping (a
 * buffer another uid acquired is retired at its end and its pages freed: pool.c): a write
 * there is SIGBUS in the attacker, its own loss. The scribbler skips such a region. */
static sigjmp_buf bus_jmp;
static volatile sig_atomic_t bus_armed;
static uint64_t bus_faults;

static void on_bus(int sig)
{
    if (!bus_armed) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    siglongjmp(bus_jmp, 1);
}

static void write_over(uint8_t *p, size_t len)
{
    if (sigsetjmp(bus_jmp, 1) == 0) {
        bus_armed = 1;
        for (size_t off = 0; off < len; off += PAGE / 2)
            memset(p + off, 0x5a, 64);
    }
    bus_armed = 0;
}

/* keep_fd: a hostile client's use of an fd a reply brought: mapped read-write if it can
 * be (else read-only), written over at once if writable, and kept (the newest 64), so
 * that its later scribbles (scribble_maps) write there too. */
static void keep_fd(int fd)
{
    static struct { void *p; size_t len; } kept[64];
    static unsigned next;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || sb.st_size <= 0)
        return;
    size_t len = (size_t)sb.st_size;
    bool rw = true;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rw = false;
        p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    }
    if (p == MAP_FAILED)
        return;
    if (rw)
        write_over(p, len);
    unsigned i = next++ % 64;
    if (kept[i].p)
        munmap(kept[i].p, kept[i].len);
    kept[i].p = p;
    kept[i].len = len;
}

static int raw_send(struct raw *c, struct proto_msg *m)
{
    uint8_t buf[1024];
    m->id = ++c->id;
    int n = proto_encode(m, buf, sizeof(buf));
    return n < 0 ? n : rawclient_send(c->sock, buf, (size_t)n);
}

/* raw_send_retired: took (11: [op, id, buf_id, token]) or nudge (12: [op, id, buf_id]) as
 * the ledger's clients sent them; proto/ no longer encodes either, so the bytes are
 * msgpack written here. */
static int raw_send_retired(struct raw *c, uint32_t op, uint64_t buf_id, const uint8_t *token)
{
    uint8_t b[64];
    size_t n = 0;
    uint32_t id = ++c->id;
    b[n++] = op == PROTO_OP_TOOK ? 0x94 : 0x93;
    b[n++] = (uint8_t)op;
    b[n++] = 0xce;
    for (int i = 3; i >= 0; i--)
        b[n++] = (uint8_t)(id >> (8 * i));
    b[n++] = 0xcf;
    for (int i = 7; i >= 0; i--)
        b[n++] = (uint8_t)(buf_id >> (8 * i));
    if (op == PROTO_OP_TOOK) {
        b[n++] = 0xc4;
        b[n++] = PROTO_TOKEN_LEN;
        memcpy(b + n, token, PROTO_TOKEN_LEN);
        n += PROTO_TOKEN_LEN;
    }
    return rawclient_send(c->sock, b, n);
}

/* map_fd: fd mapped read-write if it has exactly len bytes, else NULL. */
static void *map_fd(int fd, size_t len)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0 || (size_t)sb.st_size != len)
        return NULL;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* raw_open: hello with PROTO_FEAT_TABLE | PROTO_FEAT_FD_ONCE (and noreply releases); the
 * reply's two fds (the uid's table, this connection's journal) are mapped read-write.
 * -ENOTSUP when the daemon did not agree the table or sent no mappable fds. */
static int raw_open(struct raw *c, const char *socket)
{
    *c = (struct raw){ .sock = rawclient_connect(socket) };
    if (c->sock < 0)
        return c->sock;
    struct proto_msg m = { .op = PROTO_OP_HELLO }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_TABLE;
    m.u.hello.name = "attacker";
    m.u.hello.name_len = 8;
    int e = raw_send(c, &m);
    if (e < 0)
        return e;
    uint8_t rep[PROTO_MAX_REPLY];
    int fds[2] = { -1, -1 };
    unsigned n = 0;
    ssize_t len = rawclient_recv_fds(c->sock, rep, sizeof(rep), fds, 2, &n, 10000);
    const char *why;
    if (len <= 0 || proto_decode(rep, (size_t)len, sizeof(rep), &r, &why) < 0 ||
        r.op != PROTO_OP_HELLO + PROTO_OP_REPLY) {
        for (unsigned i = 0; i < n; i++)
            close(fds[i]);
        return -EPROTO;
    }
    c->features = r.u.hello_reply.features;
    if (n == 2) {
        c->tab = map_fd(fds[0], TABLE_BYTES);
        c->journal = map_fd(fds[1], JOURNAL_BYTES);
    }
    for (unsigned i = 0; i < n; i++)
        close(fds[i]);
    return (c->features & PROTO_FEAT_TABLE) && c->tab && c->journal ? 0 : -ENOTSUP;
}

static void raw_close(struct raw *c)
{
    if (c->tab)
        munmap(c->tab, TABLE_BYTES);
    if (c->journal)
        munmap((void *)c->journal, JOURNAL_BYTES);
    if (c->sock >= 0)
        close(c->sock);
    *c = (struct raw){ .sock = -1 };
}

/* raw_drain: reads replies until the ping with id want is answered (want 0: until none
 * comes for 20 ms), fds closed, then releases every handle those replies granted (lease,
 * acquire, adopt). Not before: the daemon stops reading a connection whose replies with
 * fds are unread, so a client that sends while it has not read everything can block
 * itself forever. Returns 0, or -EPIPE when the daemon closed. */
static int raw_drain(struct raw *c, uint32_t want)
{
    static uint8_t rep[PROTO_MAX_REPLY];
    uint64_t handles[256];
    unsigned nh = 0;
    for (;;) {
        int fd = -1;
        unsigned n = 0;
        ssize_t len = rawclient_recv_fds(c->sock, rep, sizeof(rep), &fd, 1, &n, want ? 10000 : 20);
        if (n && c->keep_maps)
            keep_fd(fd);
        if (n)
            close(fd);
        if (len == -ETIMEDOUT && !want)
            break;
        if (len <= 0)
            return -EPIPE;
        struct proto_msg r;
        const char *why;
        if (proto_decode(rep, (size_t)len, sizeof(rep), &r, &why) < 0)
            continue;
        if ((r.op == PROTO_OP_LEASE + PROTO_OP_REPLY || r.op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY ||
             r.op == PROTO_OP_ADOPT + PROTO_OP_REPLY) && nh < 256 && r.u.lease_reply.handle)
            handles[nh++] = r.u.lease_reply.handle;
        if (r.op == PROTO_OP_LEASE + PROTO_OP_REPLY)
            c->leased_ids[c->nleased++ % 16] = r.u.lease_reply.buf_id;
        c->mapped += r.op == PROTO_OP_MAP + PROTO_OP_REPLY;
        c->adopted += r.op == PROTO_OP_ADOPT + PROTO_OP_REPLY;
        if (r.op == PROTO_OP_ERROR) {
            c->errors++;
            c->eopnotsupp += r.u.error.code == EOPNOTSUPP;
        }
        if (r.op == PROTO_OP_PING + PROTO_OP_REPLY && r.id == want)
            break;
    }
    for (unsigned i = 0; i < nh; i++) {
        struct proto_msg rel = { .op = PROTO_OP_RELEASE };
        rel.u.release.handle = handles[i];
        rel.u.release.flags = PROTO_RELEASE_NOREPLY;
        raw_send(c, &rel);
    }
    return 0;
}

/* raw_count: what c's replies said since the last call, added to ctl. */
static void raw_count(struct raw *c, struct ctl *ctl)
{
    atomic_fetch_add(&ctl->mapped, c->mapped);
    atomic_fetch_add(&ctl->adopted, c->adopted);
    atomic_fetch_add(&ctl->errors, c->errors);
    atomic_fetch_add(&ctl->eopnotsupp, c->eopnotsupp);
    c->mapped = c->adopted = c->errors = c->eopnotsupp = 0;
}

static int raw_ping_drain(struct raw *c)
{
    struct proto_msg m = { .op = PROTO_OP_PING };
    int e = raw_send(c, &m);
    return e < 0 ? e : raw_drain(c, m.id);
}

static void rand_token(uint8_t *t, uint32_t *s, uint32_t slot)
{
    for (int i = 0; i < PROTO_TOKEN_LEN; i++)
        t[i] = (uint8_t)xorshift(s);
    handoff_set_slot(t, slot);
}

/* table_members: buffer ids the entries of slots below LOW_SLOTS name (a table's
 * members, where nobody scribbled), at most max. */
static unsigned table_members(void *tab, uint64_t *ids, unsigned max, uint32_t *slots)
{
    unsigned n = 0;
    for (uint32_t i = 0; i < LOW_SLOTS && n < max; i++) {
        uint64_t id = atomic_load(&handoff_entry_at(tab, i)->buf_id);
        if (id && id < (UINT64_C(1) << 40)) {
            if (slots)
                slots[n] = i;
            ids[n++] = id;
        }
    }
    return n;
}

/* scribble_table: garbage in the uid's table as proto/handoff.h lays it out, a different
 * kind per entry and pass: words with any count, LISTED/OUT flags, states out of range,
 * "free" words under holders, counts at the maximum, other buffers' ids published under
 * random hashes, metadata lengths past HANDOFF_META_MAX, links out of range and cycles;
 * in the header: nslots, the key, class caps/lo, heads pointing out of range and into
 * cycles; a third of the passes restore the header first (so the uid's own library keeps
 * using the table and the daemon keeps granting into it), one in eight wrecks it whole. */
static void scribble_table(void *tab, uint32_t *s, uint64_t pass, const uint8_t *hdr_copy)
{
    static const uint32_t bad_next[3] = { 0xffffffffu, HANDOFF_MAX_SLOTS + 1, HANDOFF_MAX_SLOTS };
    static const uint64_t bad_cap[4] = { 0, 1, UINT64_MAX, RT_SIZE / 2 };
    struct handoff_header *h = tab;
    if (pass % 3 == 0 && hdr_copy)
        memcpy(tab, hdr_copy, HANDOFF_HEADER);
    uint32_t from = pass % 8 == 0 ? 0 : xorshift(s) % HANDOFF_MAX_SLOTS, n = pass % 8 == 0 ? HANDOFF_MAX_SLOTS : 2048;
    for (uint32_t k = 0; k < n + LOW_SLOTS; k++) {
        uint32_t i = k < LOW_SLOTS ? k : from + (k - LOW_SLOTS);
        if (i >= HANDOFF_MAX_SLOTS)
            break;
        struct handoff_entry *e = handoff_entry_at(tab, i);
        struct handoff_meta *m = handoff_meta_at(tab, i);
        uint64_t w = atomic_load(&e->word);
        switch ((i + pass) % 9) {
        case 0: /* any word at all */
            atomic_store(&e->word, (uint64_t)xorshift(s) << 32 | xorshift(s));
            break;
        case 1: /* free with no holds and not listed, same seq: recycle it under its holders */
            atomic_store(&e->word, handoff_word(handoff_seq_of(w), 0, 0, HANDOFF_FREE));
            break;
        case 2: /* the count at its maximum, published, OUT and LISTED */
            atomic_store(&e->word, handoff_word(xorshift(s), HANDOFF_COUNT_MAX, HANDOFF_OUT | HANDOFF_LISTED,
                                                HANDOFF_PUBLISHED));
            break;
        case 3: /* states 3..15, random flags */
            atomic_store(&e->word, handoff_word(xorshift(s), xorshift(s), xorshift(s) & 0xf0u, 3 + xorshift(s) % 13));
            break;
        case 4: /* another buffer's id, published under a random hash, metadata too long */
            atomic_store(&e->buf_id, 1 + xorshift(s) % 4096);
            atomic_store(&e->tokhash, (uint64_t)xorshift(s) << 32 | xorshift(s));
            atomic_store(&e->size, RT_SIZE);
            atomic_store(&m->len, HANDOFF_META_MAX + 1 + xorshift(s) % 64);
            atomic_store(&e->word, handoff_word(xorshift(s), 1 + xorshift(s) % 3, 0, HANDOFF_PUBLISHED));
            break;
        case 5: /* links and class out of range, the OUT flag cleared */
            atomic_store(&e->next, bad_next[xorshift(s) % 3]);
            atomic_store(&e->cls, HANDOFF_CLASSES + xorshift(s) % 1000);
            atomic_store(&e->word, w & ~(uint64_t)HANDOFF_OUT);
            break;
        case 6: /* a free, listed entry linked to itself (a cycle of one), metadata max */
            atomic_store(&e->next, i + 1);
            atomic_store(&m->len, 0xffffffffu);
            atomic_store(&e->word, handoff_word(handoff_seq_of(w) + 1, 0, HANDOFF_LISTED, HANDOFF_FREE));
            break;
        case 7: /* a count 0xff.. below what the journals say: count 1, LEASED */
            atomic_store(&e->word, handoff_word(handoff_seq_of(w), 1, 0, HANDOFF_LEASED));
            break;
        default:
            memset((void *)e, 0xff, sizeof(*e));
            memset((void *)m, 0xff, 8);
            break;
        }
    }
    /* the header */
    for (uint32_t c = 0; c < HANDOFF_CLASSES; c++) {
        switch ((c + pass) % 5) {
        case 0: { /* a two-entry cycle of free listed entries */
            uint32_t a = xorshift(s) % LOW_SLOTS, b = xorshift(s) % LOW_SLOTS;
            atomic_store(&handoff_entry_at(tab, a)->next, b + 1);
            atomic_store(&handoff_entry_at(tab, b)->next, a + 1);
            atomic_store(&handoff_entry_at(tab, a)->word, handoff_word(xorshift(s), 0, HANDOFF_LISTED, HANDOFF_FREE));
            atomic_store(&handoff_entry_at(tab, b)->word, handoff_word(xorshift(s), 0, HANDOFF_LISTED, HANDOFF_FREE));
            atomic_store(&h->head[c], (uint64_t)xorshift(s) << 32 | (a + 1));
            break;
        }
        case 1: /* out of range */
            atomic_store(&h->head[c], (uint64_t)xorshift(s) << 32 | (HANDOFF_MAX_SLOTS + 1 + xorshift(s) % 1000));
            break;
        case 2: /* caps: none, tiny, huge; lo above cap */
            atomic_store(&h->cap[c], bad_cap[xorshift(s) % 4]);
            atomic_store(&h->lo[c], UINT64_MAX - (xorshift(s) & 0xff));
            break;
        case 3: /* a class that claims every size */
            atomic_store(&h->cap[c], UINT64_MAX);
            atomic_store(&h->lo[c], 0);
            break;
        default:
            break;
        }
    }
    if (pass % 4 == 1) {
        h->nslots = (uint32_t[]){ 0, 1, 0xffffffffu, HANDOFF_MAX_SLOTS + 1 }[xorshift(s) % 4];
        for (int i = 0; i < 16; i++)
            h->key[i] = (uint8_t)xorshift(s);
        atomic_store(&h->closed, xorshift(s) & 1);
    }
    if (pass % 8 == 7)
        for (size_t off = 0; off + 4 <= HANDOFF_HEADER; off += 4) {
            uint32_t x = xorshift(s);
            memcpy((uint8_t *)tab + off, &x, 4);
        }
}

/* scribble_journal: every count 0xffffffff (the connection claims every hold of every
 * slot) or random, and its CLOSED flag set or cleared. */
static void scribble_journal(_Atomic uint32_t *j, uint32_t *s, uint64_t pass)
{
    if (pass % 2 == 0)
        memset((void *)j, 0xff, (size_t)HANDOFF_MAX_SLOTS * sizeof(uint32_t));
    else
        for (uint32_t i = 0; i < LOW_SLOTS; i++)
            atomic_store(&j[i], xorshift(s) % 3 == 0 ? 0xffffffffu : xorshift(s) % 5);
    atomic_store(handoff_journal_flag(j), (pass / 2) % 3 == 0 ? 1u : 0u);
}

/* scribble_region: a shared writable mapping the attacker has: its uid's table gets
 * scribble_table, a journal scribble_journal, anything else (its buffers) random bytes
 * over every page. */
static void scribble_region(uint8_t *p, size_t len, uint32_t *s, uint64_t pass, const uint8_t *hdr_copy)
{
    if (len == TABLE_BYTES) {
        scribble_table(p, s, pass, hdr_copy);
    } else if (len == JOURNAL_BYTES) {
        scribble_journal((_Atomic uint32_t *)(void *)p, s, pass);
    } else {
        for (size_t off = 0; off + 64 <= len; off += PAGE / 4) {
            uint32_t x[16];
            for (int k = 0; k < 16; k++)
                x[k] = (pass & 1) ? 0xffffffffu : xorshift(s);
            memcpy(p + off, x, sizeof(x));
        }
    }
}

/* scribble_maps: every shared writable mapping in this process but /dev/zero (the test's
 * own control blocks): whatever libshmref and the raw connection mapped (tables,
 * journals, buffers). Returns how many; *ret_tables, *ret_journals: of which kind. */
static unsigned scribble_maps(uint32_t *s, uint64_t pass, const uint8_t *hdr_copy, unsigned *ret_tables,
                              unsigned *ret_journals)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    static struct { uintptr_t a, b; } r[8192];
    unsigned n = 0, tables = 0, journals = 0;
    char line[512];
    while (n < 8192 && fgets(line, sizeof(line), f)) {
        uintptr_t a, b;
        char perms[8], path[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255[^\n]", &a, &b, perms, path) < 3)
            continue;
        if (strcmp(perms, "rw-s") != 0 || strstr(path, "/dev/zero"))
            continue;
        r[n].a = a;
        r[n++].b = b;
    }
    fclose(f);
    for (unsigned i = 0; i < n; i++) {
        size_t len = r[i].b - r[i].a;
        tables += len == TABLE_BYTES;
        journals += len == JOURNAL_BYTES;
        if (sigsetjmp(bus_jmp, 1) == 0) {
            bus_armed = 1;
            scribble_region((uint8_t *)r[i].a, len, s, pass, hdr_copy);
        } else {
            bus_faults++;
        }
        bus_armed = 0;
    }
    *ret_tables = tables;
    *ret_journals = journals;
    return n;
}

/* unmap_inherited: a forked child keeps its parent's shared mappings (the victim's own
 * table, journals and buffers, mapped by the test's libshmref before the fork); a process
 * of another uid would have none of them, so the attacker drops them first. */
static void unmap_inherited(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    static struct { uintptr_t a, b; } r[8192];
    unsigned n = 0;
    char line[512];
    while (f && n < 8192 && fgets(line, sizeof(line), f)) {
        uintptr_t a, b;
        char perms[8], path[256] = "";
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255[^\n]", &a, &b, perms, path) >= 3 && perms[3] == 's' &&
            !strstr(path, "/dev/zero")) {
            r[n].a = a;
            r[n++].b = b;
        }
    }
    if (f)
        fclose(f);
    for (unsigned i = 0; i < n; i++)
        munmap((void *)r[i].a, r[i].b - r[i].a);
}

struct attack_arg {
    const char *socket;
    struct ctl *ctl;
};

/* api_round: the attacker's own handoffs through libshmref (table leases, publishes and
 * takes on its scribbled table, or the daemon's path when the table refuses): lease,
 * fill, publish, acquire, release; the publish is held until the next round and offered
 * to the victim (ctl->desc). Errors (its own scribbles confuse its own library; its quota
 * runs out) are counted; after one, both connections are made again. */
static void api_round(const char *socket, shmref_conn **a, shmref_conn **b, shmref_buf **held, struct ctl *ctl,
                      shmref_desc *ret)
{
    if (!*a && shmref_connect(socket, a) < 0)
        *a = NULL;
    if (!*b && shmref_connect(socket, b) < 0)
        *b = NULL;
    shmref_buf *x = NULL, *y = NULL;
    bool ok = *a && *b && shmref_lease(*a, RT_SIZE, &x) == 0;
    if (ok) {
        memset(shmref_buf_data(x), 0xa5, RT_SIZE);
        ok = shmref_publish(x, RT_SIZE, 0, NULL, 0, ret) == 0 && shmref_acquire(*b, ret, &y) == 0;
    }
    if (y)
        shmref_release(y);
    if (*held)
        shmref_release(*held);
    *held = NULL;
    if (ok) {
        *held = x;
        atomic_fetch_add(&ctl->dlock, 1);
        ctl->desc = *ret;
        atomic_fetch_add(&ctl->dlock, 1);
        atomic_fetch_add(&ctl->api_ok, 1);
        return;
    }
    if (x)
        shmref_release(x);
    atomic_fetch_add(&ctl->api_err, 1);
    if (*a)
        shmref_close(*a);
    if (*b)
        shmref_close(*b);
    *a = *b = NULL;
}

/* pick_id: a buffer id for map/giveback/adopt: one of the uid's own members (as its
 * table said before this pass's scribbles), another uid's (root's members), a guess, or
 * nonsense. */
static uint64_t pick_id(uint32_t *s, const uint64_t *own, unsigned nown, const struct ctl *ctl)
{
    switch (xorshift(s) % 4) {
    case 0:
        return nown ? own[xorshift(s) % nown] : 1;
    case 1:
        return ctl->nvictim ? ctl->victim_ids[xorshift(s) % ctl->nvictim] : 2;
    case 2:
        return 1 + xorshift(s) % 256;
    default:
        return (uint64_t[]){ 0, UINT64_MAX, UINT64_C(1) << 63, (uint64_t)xorshift(s) << 32 }[xorshift(s) % 4];
    }
}

/* raw_burst: a local lease of its own table adopted (a valid adopt), then acquires of
 * random tokens and of its own; map, giveback and adopt of its own members, of root's and
 * of guesses (adopt under the current seq of its own, or any); forget; the retired took and
 * nudge; then a ping, whose answer drains the rest, and the local lease's hold given. */
static int raw_burst(struct raw *c, uint32_t *s, const shmref_desc *own, const uint64_t *ids, const uint32_t *slots,
                     unsigned nids, struct ctl *ctl)
{
    uint32_t lslot = HANDOFF_NO_SLOT, lseq = 0;
    int cls = c->tab ? handoff_class(c->tab, RT_SIZE) : -1;
    if (cls >= 0 && handoff_lease(c->tab, c->journal, (uint32_t)cls, HANDOFF_TRIES, &lslot, &lseq) == 0) {
        atomic_fetch_add(&ctl->local_leases, 1);
        struct proto_msg m = { .op = PROTO_OP_ADOPT };
        m.u.adopt.buf_id = atomic_load(&handoff_entry_at(c->tab, lslot)->buf_id);
        m.u.adopt.seq = lseq;
        raw_send(c, &m);
    } else {
        lslot = HANDOFF_NO_SLOT;
    }
    struct proto_msg tl = { .op = PROTO_OP_LEASE }; /* a lease for the table: a member at its release */
    tl.u.lease.size = RT_SIZE;
    tl.u.lease.flags = PROTO_LEASE_TABLE;
    raw_send(c, &tl);
    for (int i = 0; i < 16; i++) {
        struct proto_msg m = { .op = PROTO_OP_ACQUIRE };
        if (i == 0 && own->size)
            memcpy(m.u.acquire.token, own->token, PROTO_TOKEN_LEN);
        else
            rand_token(m.u.acquire.token, s, xorshift(s) % 64);
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_MAP };
        m.u.map.buf_id = pick_id(s, ids, nids, ctl);
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_GIVEBACK };
        m.u.giveback.buf_id = pick_id(s, ids, nids, ctl);
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_ADOPT };
        m.u.adopt.buf_id = pick_id(s, ids, nids, ctl);
        m.u.adopt.seq = xorshift(s);
        if (i % 4 == 0 && nids) {
            uint32_t k = xorshift(s) % nids;
            m.u.adopt.buf_id = ids[k];
            m.u.adopt.seq = handoff_seq_of(atomic_load(&handoff_entry_at(c->tab, slots[k])->word));
        }
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_FORGET };
        m.u.forget.buf_id = pick_id(s, ids, nids, ctl);
        m.u.forget.writable = xorshift(s) & 1;
        raw_send(c, &m);
    }
    uint8_t tok[PROTO_TOKEN_LEN];
    rand_token(tok, s, xorshift(s) % 64);
    raw_send_retired(c, PROTO_OP_TOOK, pick_id(s, ids, nids, ctl), tok);
    raw_send_retired(c, PROTO_OP_NUDGE, pick_id(s, ids, nids, ctl), NULL);
    int e = raw_ping_drain(c);
    if (lslot != HANDOFF_NO_SLOT && handoff_give(c->tab, c->journal, lslot, HANDOFF_TRIES) == HANDOFF_TO_DAEMON) {
        struct proto_msg m = { .op = PROTO_OP_GIVEBACK };
        m.u.giveback.buf_id = atomic_load(&handoff_entry_at(c->tab, lslot)->buf_id);
        raw_send(c, &m);
    }
    return e;
}

static int attacker(void *p)
{
    struct sigaction sa = { .sa_handler = on_bus };
    sigaction(SIGBUS, &sa, NULL);
    struct attack_arg *a = p;
    struct ctl *ctl = a->ctl;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* The test measures the daemon's fairness, not the scheduler's: the attacker runs
     * niced, so that on a 2-CPU machine it does not simply take the victim's CPU. */
    unmap_inherited();
    if (setpriority(PRIO_PROCESS, 0, 10) < 0 || become(OTHER_UID) < 0)
        return 10;
    uint32_t s = (uint32_t)getpid() * 2654435761u | 1;
    struct raw c;
    if (raw_open(&c, a->socket) < 0)
        return 11;
    c.keep_maps = true;
    static uint8_t hdr[HANDOFF_HEADER]; /* the header as the daemon made it */
    memcpy(hdr, c.tab, HANDOFF_HEADER);
    shmref_conn *ca = NULL, *cb = NULL;
    shmref_buf *held = NULL;
    for (uint64_t pass = 0; !atomic_load(&ctl->stop); pass++) {
        shmref_desc own = { .size = 0 };
        api_round(a->socket, &ca, &cb, &held, ctl, &own);
        uint64_t ids[64];
        uint32_t slots[64];
        unsigned nids = table_members(c.tab, ids, 48, slots);
        for (unsigned i = 0; i < 16 && i < c.nleased; i++) { /* ids the daemon named (the table's may be garbage) */
            slots[nids] = 0;
            ids[nids++] = c.leased_ids[i];
        }
        unsigned tables = 0, journals = 0;
        unsigned n = scribble_maps(&s, pass, hdr, &tables, &journals);
        atomic_store(&ctl->regions, n);
        atomic_store(&ctl->tables, tables);
        atomic_store(&ctl->journals, journals);
        atomic_store(&ctl->bus_faults, bus_faults);
        int e = raw_burst(&c, &s, &own, ids, slots, nids, ctl);
        raw_count(&c, ctl);
        if (e < 0) {
            raw_close(&c);
            atomic_fetch_add(&ctl->reconnects, 1);
            if (raw_open(&c, a->socket) < 0)
                return 12;
            c.keep_maps = true;
        }
        atomic_fetch_add(&ctl->msgs, 16 * 5 + 6);
        atomic_fetch_add(&ctl->passes, 1);
        if (pass >= 2)
            atomic_store(&ctl->armed, 1);
    }
    if (held)
        shmref_release(held);
    if (ca)
        shmref_close(ca);
    if (cb)
        shmref_close(cb);
    raw_close(&c);
    return 0;
}

#define RT_WARM 50
#define RT_N 300
#define RT_MAX 200000
/* The victim's median round trip under attack <= 5x its own baseline. Breaks when a step
 * of the daemon on the attacker's table is unbounded (a cyclic free list popped without
 * the member bound of tenantdir.c's reclaim, a CAS retried without HANDOFF_TRIES): the
 * daemon's one thread spins and the victim's round trip stalls. */
#define ATTACK_RATIO 5

/* victim_series: round trips for at least ms and at least min of them (at most max);
 * their times (us) into t; returns how many. Every 50, the victim's charge (nothing held
 * between round trips) must read as `quiet` again: a victim charged for a buffer the
 * attacker pins or holds (a giveback or adopt of root's buffer id taken as the
 * attacker's, a journal of 0xffffffff counts dropping holds of root's members, a member
 * of root's table granted into the attacker's) reads more bytes or buffers, or fewer
 * (its own hold dropped by another uid's journal). In (1), every 100th round trip also
 * acquires the attacker's newest publish (another uid's buffer, through the daemon) and
 * releases it: the daemon retires such a buffer at its end; one recycled into the pool
 * instead could come back as the victim's lease while the attacker still maps and
 * scribbles it, and the victim's page check fails. */
static uint64_t attacker_charged_max; /* the most uid OTHER_UID was charged at a check */
static struct ctl *foreign_src;       /* (1): the attacker's publishes */
static uint64_t foreign_ok, foreign_gone, foreign_err;

static void victim_foreign(struct victim *v)
{
    uint32_t l = atomic_load(&foreign_src->dlock);
    shmref_desc desc = foreign_src->desc;
    if ((l & 1) || atomic_load(&foreign_src->dlock) != l || desc.size == 0)
        return;
    shmref_buf *b;
    int e = shmref_acquire(v->cons, &desc, &b);
    if (e < 0) {
        if (e == -ENOENT)
            foreign_gone++;
        else
            foreign_err++;
        return;
    }
    cr_assert_eq(shmref_buf_size(b), RT_SIZE, "the attacker's publish came with %zu bytes", shmref_buf_size(b));
    volatile const uint8_t *p = shmref_buf_data(b);
    uint8_t x = 0;
    for (size_t off = 0; off < RT_SIZE; off += PAGE) /* every page is there (no SIGBUS) */
        x ^= p[off];
    (void)x;
    foreign_ok++;
    shmref_release(b);
}

static int victim_series(struct victim *v, shmref_conn *st, long *t, int min, int max, long ms, struct charge quiet,
                         const char *when)
{
    long end_ms = now_ms() + ms;
    int i;
    for (i = 0; i < max && (i < min || now_ms() < end_ms); i++) {
        t[i] = victim_rt(v);
        if (foreign_src && i % 100 == 5)
            victim_foreign(v);
        if (i % 50 == 49) {
            struct charge ch = charge_of(st, OTHER_UID);
            if (ch.bytes > attacker_charged_max)
                attacker_charged_max = ch.bytes;
            long end = now_ms() + 5000;
            do /* a release the daemon has not read yet: wait for the state, not for time */
                ch = charge_of(st, getuid());
            while ((ch.bytes != quiet.bytes || ch.pinned != quiet.pinned || ch.buffers != quiet.buffers) &&
                   now_ms() < end && (usleep(1000), true));
            cr_assert(ch.bytes == quiet.bytes && ch.pinned == quiet.pinned && ch.buffers == quiet.buffers,
                      "%s: uid %u between round trips is charged %llu bytes, %llu pinned, %llu buffers "
                      "(without the attacker: %llu, %llu, %llu)", when, (unsigned)getuid(),
                      (unsigned long long)ch.bytes, (unsigned long long)ch.pinned, (unsigned long long)ch.buffers,
                      (unsigned long long)quiet.bytes, (unsigned long long)quiet.pinned,
                      (unsigned long long)quiet.buffers);
        }
    }
    return i;
}

/* ping_us: one ping of root's raw connection (us); the daemon must answer within 10 s. */
static long ping_us(int fd)
{
    uint8_t msg[64], rep[256];
    struct proto_msg m = { .op = PROTO_OP_PING, .id = 7 };
    int len = proto_encode(&m, msg, sizeof(msg));
    long t0 = now_us();
    ssize_t got = rawclient_call(fd, msg, (size_t)len, rep, sizeof(rep), 10000);
    cr_assert_gt(got, 0, "the daemon did not answer a ping within 10 s (stalled)");
    return now_us() - t0;
}

Test(handoff_attacks, a_uid_scribbling_on_everything_it_shares_harms_only_itself, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *st = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(st, 0), 0);
    struct victim v = { 0 };
    victim_open(&v, &d);
    cr_assert_eq(shmref_set_acquire_wait(v.cons, 0), 0); /* the attacker's recycled publish: ENOENT at once */
    static long base[RT_MAX], hit[RT_MAX];
    for (int i = 0; i < RT_WARM; i++)
        victim_rt(&v);
    /* the victim's own handoffs go through its table (else this test attacks nothing of it) */
    uint64_t vlocal = 0;
    cr_assert_eq(shmref_conn_counter(v.cons, "table_acquires", &vlocal), 0);
    cr_assert_gt(vlocal, RT_WARM / 2, "the victim's acquires did not go through its table (%llu)",
                 (unsigned long long)vlocal);
    struct charge quiet = charge_of(st, getuid());
    /* the baseline: the least median of three series alone */
    long b50 = LONG_MAX, b99 = 0;
    int nb = 0;
    for (int i = 0; i < 3; i++) {
        nb = victim_series(&v, st, base, RT_N, RT_MAX, 700, quiet, "baseline");
        long m = pct(base, nb, 50);
        if (m < b50) {
            b50 = m;
            b99 = pct(base, nb, 99);
        }
    }

    struct ctl *ctl = ctl_new();
    struct raw mine; /* root's table: its members' ids, for the attacker's map/giveback/adopt */
    cr_assert_eq(raw_open(&mine, d.socket), 0, "no table for a raw hello of root");
    ctl->nvictim = table_members(mine.tab, ctl->victim_ids, 16, NULL);
    cr_assert_gt(ctl->nvictim, 0, "root's table has no members");
    struct attack_arg a = { .socket = d.socket, .ctl = ctl };
    pid_t pid = child_run(attacker, &a);
    long end = now_ms() + 60000;
    while (!atomic_load(&ctl->armed) && now_ms() < end && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(2000);
    cr_assert(atomic_load(&ctl->armed), "the attacker never finished a pass (passes %llu)",
              (unsigned long long)atomic_load(&ctl->passes));
    uint64_t passes0 = atomic_load(&ctl->passes);
    foreign_src = ctl;
    int nh = victim_series(&v, st, hit, RT_N, RT_MAX, 4000, quiet, "under attack");
    foreign_src = NULL;
    long ping = ping_us(mine.sock);
    /* One status, so that the pool's pins and the tenants' charges are of one moment (the
     * attacker still maps and unmaps: three snapshots disagreed by a buffer under ASan). */
    struct charge att, vic;
    uint64_t pool_pinned = 0;
    {
        shmref_status *ps;
        cr_assert_eq(shmref_status_get(st, &ps), 0);
        att = (struct charge){ tenant_u64(ps, OTHER_UID, "bytes"), tenant_u64(ps, OTHER_UID, "pinned"),
                               tenant_u64(ps, OTHER_UID, "buffers") };
        vic = (struct charge){ tenant_u64(ps, getuid(), "bytes"), tenant_u64(ps, getuid(), "pinned"),
                               tenant_u64(ps, getuid(), "buffers") };
        cr_assert_eq(shmref_status_u64(ps, "pool.bytes_pinned", &pool_pinned), 0);
        shmref_status_free(ps);
    }
    uint64_t passes = atomic_load(&ctl->passes) - passes0;
    cr_assert(daemon_alive(&d), "the daemon died");

    long h50 = pct(hit, nh, 50), h99 = pct(hit, nh, 99);
    printf("scribbler: victim round trip of %u KiB median %ld us (p99 %ld, %d of them; the least of 3 series) alone, %ld us (p99 %ld, %d) "
           "under attack (%.2fx; charged %llu bytes, %llu pinned, %llu buffers between round trips); the victim "
           "acquired %llu of the attacker's publishes (%llu gone, %llu other errors); the attacker made %llu passes "
           "meanwhile over %llu shared mappings (%llu tables, %llu journals), %llu raw messages in all (%llu maps "
           "and %llu adopts answered, %llu local leases of its own, %llu errors, %llu EOPNOTSUPP), %llu own "
           "handoffs (%llu failed), %llu reconnects, %llu regions emptied under it (SIGBUS); uid %u charged %llu bytes, %llu buffers, %llu pinned at the end, "
           "at most %llu bytes at a check; pool.bytes_pinned %llu; a ping after it %ld us\n",
           RT_SIZE / 1024, b50, b99, nb, h50, h99, nh, (double)h50 / (double)b50, (unsigned long long)quiet.bytes,
           (unsigned long long)quiet.pinned, (unsigned long long)quiet.buffers, (unsigned long long)foreign_ok,
           (unsigned long long)foreign_gone, (unsigned long long)foreign_err, (unsigned long long)passes,
           (unsigned long long)atomic_load(&ctl->regions), (unsigned long long)atomic_load(&ctl->tables),
           (unsigned long long)atomic_load(&ctl->journals), (unsigned long long)atomic_load(&ctl->msgs),
           (unsigned long long)atomic_load(&ctl->mapped), (unsigned long long)atomic_load(&ctl->adopted),
           (unsigned long long)atomic_load(&ctl->local_leases), (unsigned long long)atomic_load(&ctl->errors),
           (unsigned long long)atomic_load(&ctl->eopnotsupp), (unsigned long long)atomic_load(&ctl->api_ok),
           (unsigned long long)atomic_load(&ctl->api_err), (unsigned long long)atomic_load(&ctl->reconnects),
           (unsigned long long)atomic_load(&ctl->bus_faults), OTHER_UID, (unsigned long long)att.bytes,
           (unsigned long long)att.buffers, (unsigned long long)att.pinned, (unsigned long long)attacker_charged_max,
           (unsigned long long)pool_pinned, ping);
    int ex = ctl_stop(ctl, pid);
    cr_assert_eq(ex, 0, "the attacker failed: %d (10-12: setup, 128+: a signal; 137 it did not stop within 20 s)",
                 ex);
    cr_assert_geq(passes, 20, "the attacker made only %llu passes during the victim's round trips",
                  (unsigned long long)passes);
    /* An attacker whose holds and pins the registry charged to nobody (a table member
     * uncharged at its grant) would read 0 here. */
    cr_assert_gt(attacker_charged_max, 0, "what the attacker held and pinned was charged to nobody");
    /* Every pinned byte (a buffer no lease holds that clients still map) is charged to a
     * mapping uid: the attacker pins only what its uid is charged for, never a buffer
     * charged to nobody or to the victim (whose charge is checked in victim_series). */
    cr_assert_leq(pool_pinned, att.pinned + vic.pinned, "the pool has %llu bytes pinned, its tenants are charged "
                  "%llu (uid %u) and %llu (uid %u)", (unsigned long long)pool_pinned, (unsigned long long)att.pinned,
                  OTHER_UID, (unsigned long long)vic.pinned, (unsigned)getuid());
    cr_assert_geq(atomic_load(&ctl->tables), 1, "the attacker found no table to scribble on");
    cr_assert_geq(atomic_load(&ctl->journals), 1, "the attacker found no journal to scribble on");
    cr_assert_gt(foreign_ok, 0, "the victim never acquired one of the attacker's publishes");
    cr_assert_leq(h50, ATTACK_RATIO * b50, "under attack the victim's median round trip took %ld us, %.1fx its "
                  "least %ld us alone (bound %dx)", h50, (double)h50 / (double)b50, b50, ATTACK_RATIO);

    /* the attacker's raw requests did reach the table's paths: some maps and adopts of its
     * own buffers were served, and the retired took and nudge were refused, not dropped */
    cr_assert_gt(atomic_load(&ctl->mapped), 0, "no map of the attacker's own members was answered");
    cr_assert_gt(atomic_load(&ctl->eopnotsupp), 0, "took and nudge were not answered EOPNOTSUPP");
    /* what the attacker held or pinned was its own, and goes with it (a hold its journal
     * claimed that the daemon never drops would keep it charged) */
    long t0 = now_ms();
    struct charge after;
    while ((after = charge_of(st, OTHER_UID)).bytes != 0 && now_ms() - t0 < 5000)
        usleep(2000);
    cr_assert_eq(after.bytes, 0, "uid %u still charged %llu bytes after it exited", OTHER_UID,
                 (unsigned long long)after.bytes);
    victim_series(&v, st, hit, 50, 50, 0, quiet, "after the attack");
    raw_close(&mine);
    victim_close(&v);
    shmref_close(st);
    munmap(ctl, sizeof(*ctl));
    daemon_stop(&d);
}

/* ---- (2) consumers racing a producer's recycles for 10 s ----------------------------- */

#define RACE_SIZE (16 * PAGE)
#define RING 16
#define NCONS 2

/* Shared by the producer and the consumers: the descriptors published so far, each with
 * its generation. */
struct ring {
    _Atomic uint64_t head;
    struct { _Atomic uint32_t lock; shmref_desc desc; uint64_t gen; } e[RING];
    _Atomic int stop;
    _Atomic uint64_t prod_local, acquired, local, via_daemon, refused, bad_pages, bad_local, bad_daemon, rechecked, failed;
};

static void ring_put(struct ring *r, const shmref_desc *desc, uint64_t gen)
{
    uint64_t h = atomic_load(&r->head);
    unsigned i = (unsigned)(h % RING);
    atomic_fetch_add(&r->e[i].lock, 1); /* odd: writing */
    r->e[i].desc = *desc;
    r->e[i].gen = gen;
    atomic_fetch_add(&r->e[i].lock, 1);
    atomic_store(&r->head, h + 1);
}

static bool ring_get(struct ring *r, unsigned back, shmref_desc *desc, uint64_t *gen)
{
    uint64_t h = atomic_load(&r->head);
    if (h <= back)
        return false;
    unsigned i = (unsigned)((h - 1 - back) % RING);
    uint32_t l = atomic_load(&r->e[i].lock);
    if (l & 1)
        return false;
    *desc = r->e[i].desc;
    *gen = r->e[i].gen;
    return atomic_load(&r->e[i].lock) == l;
}

/* Every page of generation gen: (gen, page) then bytes from a seed of both. */
static void gen_fill(uint8_t *p, uint64_t gen)
{
    for (uint64_t pg = 0; pg < RACE_SIZE / PAGE; pg++) {
        uint64_t h[2] = { gen, pg };
        memcpy(p + pg * PAGE, h, sizeof(h));
        fill_pattern(p + pg * PAGE + sizeof(h), PAGE - sizeof(h), (uint32_t)(gen * 257 + pg + 1));
    }
}

/* gen_bad: how many pages of p are not generation gen's. */
static unsigned gen_bad(const uint8_t *p, uint64_t gen, uint64_t *ret_seen)
{
    unsigned bad = 0;
    for (uint64_t pg = 0; pg < RACE_SIZE / PAGE; pg++) {
        uint64_t h[2];
        memcpy(h, p + pg * PAGE, sizeof(h));
        if (h[0] != gen || h[1] != pg ||
            check_pattern(p + pg * PAGE + sizeof(h), PAGE - sizeof(h), (uint32_t)(gen * 257 + pg + 1)) != -1) {
            bad++;
            *ret_seen = h[0];
        }
    }
    return bad;
}

struct race_arg {
    const char *socket;
    struct ring *r;
};

/* race_producer: lease, stamp every page with the generation, publish, keep the two
 * newest published (so daemon acquires find them), release the older, a short random
 * pause: the same few buffers recycled as fast as the daemon goes. */
static int race_producer(void *p)
{
    struct race_arg *a = p;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    shmref_conn *c;
    if (shmref_connect(a->socket, &c) < 0)
        return 101;
    uint32_t s = (uint32_t)getpid() | 1;
    shmref_buf *held[2] = { NULL, NULL };
    uint64_t gen = 0;
    while (!atomic_load(&a->r->stop)) {
        shmref_buf *b;
        if (shmref_lease(c, RACE_SIZE, &b) < 0) {
            fprintf(stderr, "producer lease: %s\n", shmref_errmsg(c));
            return 102;
        }
        gen_fill(shmref_buf_data(b), ++gen);
        shmref_desc desc;
        if (shmref_publish(b, RACE_SIZE, 0, NULL, 0, &desc) < 0)
            return 103;
        ring_put(a->r, &desc, gen);
        if (held[gen % 2])
            shmref_release(held[gen % 2]);
        held[gen % 2] = b;
        usleep(xorshift(&s) % 200);
    }
    uint64_t tl = 0;
    shmref_conn_counter(c, "table_leases", &tl);
    atomic_store(&a->r->prod_local, tl);
    shmref_close(c);
    return 0;
}

/* race_consumer: acquires the newest and older descriptors at random (some already
 * recycled: ENOENT), checks every page while it holds the buffer, and holds one in eight
 * a little longer and checks again at the end of the hold. A consumer that maps the
 * buffers (it keeps its connection) takes them in the table (a hold in the word, no
 * message); a fresh one (fresh != 0: a new connection every `fresh` acquires) maps nothing
 * yet, so its take in the table is given back and the daemon acquires the publish for it
 * (a hold of the daemon's in the word, tenantdir.c). Each acquire is counted as one or the
 * other by the connection's table_acquires counter. */
static int race_consume(struct race_arg *a, unsigned fresh)
{
    struct ring *r = a->r;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    shmref_conn *c = NULL;
    uint32_t s = (uint32_t)getpid() | 1;
    unsigned uses = 0;
    while (!atomic_load(&r->stop)) {
        if (!c || (fresh && uses >= fresh)) {
            if (c)
                shmref_close(c);
            if (shmref_connect(a->socket, &c) < 0)
                return 101;
            shmref_set_acquire_wait(c, 0); /* a descriptor whose buffer went is ENOENT at once */
            uses = 0;
        }
        shmref_desc desc;
        uint64_t gen, seen = 0;
        if (!ring_get(r, xorshift(&s) % 4, &desc, &gen))
            continue;
        shmref_buf *b;
        uint64_t l0 = 0, l1 = 0;
        shmref_conn_counter(c, "table_acquires", &l0);
        int e = shmref_acquire(c, &desc, &b);
        if (e == -ENOENT) {
            atomic_fetch_add(&r->refused, 1);
            continue;
        }
        if (e < 0) {
            fprintf(stderr, "consumer acquire: %d %s\n", e, shmref_errmsg(c));
            atomic_fetch_add(&r->failed, 1);
            return 102;
        }
        uses++;
        shmref_conn_counter(c, "table_acquires", &l1);
        atomic_fetch_add(&r->acquired, 1);
        atomic_fetch_add(l1 > l0 ? &r->local : &r->via_daemon, 1);
        unsigned bad = shmref_buf_size(b) == RACE_SIZE ? gen_bad(shmref_buf_data(b), gen, &seen) : RACE_SIZE / PAGE;
        if ((xorshift(&s) & 7) == 0) {
            usleep(300);
            bad += gen_bad(shmref_buf_data(b), gen, &seen);
            atomic_fetch_add(&r->rechecked, 1);
        }
        if (bad) {
            fprintf(stderr, "consumer (%s): %u pages under the token of generation %llu are not its own (one is of "
                    "generation %llu)\n", l1 > l0 ? "table" : "daemon", bad, (unsigned long long)gen,
                    (unsigned long long)seen);
            atomic_fetch_add(l1 > l0 ? &r->bad_local : &r->bad_daemon, bad);
            atomic_fetch_add(&r->bad_pages, bad);
        }
        shmref_release(b);
    }
    if (c)
        shmref_close(c);
    return 0;
}

static int race_consumer(void *p)
{
    return race_consume(p, 0);
}

static int race_consumer_fresh(void *p)
{
    return race_consume(p, 4);
}

Test(handoff_attacks, consumers_racing_recycles_for_10s_never_read_another_generation, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct ring *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(r, MAP_FAILED);
    memset(r, 0, sizeof(*r));
    struct race_arg a = { .socket = d.socket, .r = r };
    pid_t prod = child_run(race_producer, &a), cons[NCONS + 1];
    for (int i = 0; i < NCONS; i++)
        cons[i] = child_run(race_consumer, &a);
    cons[NCONS] = child_run(race_consumer_fresh, &a);
    const char *e = getenv("SHMREF_RACE_SECONDS");
    long secs = e && *e ? atol(e) : 10;
    long end = now_ms() + secs * 1000;
    while (now_ms() < end && atomic_load(&r->bad_pages) == 0 && atomic_load(&r->failed) == 0)
        usleep(10000);
    uint64_t takes = status_u64(&d, "table.takes");
    atomic_store(&r->stop, 1);
    cr_assert_eq(child_wait(prod), 0, "the producer failed");
    for (int i = 0; i <= NCONS; i++)
        cr_assert_eq(child_wait(cons[i]), 0, "a consumer failed");
    uint64_t acquired = atomic_load(&r->acquired), local = atomic_load(&r->local), via = atomic_load(&r->via_daemon);
    printf("race, %ld s: %llu generations published (%llu table leases); %llu acquires (%llu taken in the table, "
           "%llu through the daemon; the daemon's table takes %llu), %llu refused (ENOENT), %llu held longer and "
           "checked again; %llu pages of another generation (%llu in table takes, %llu in the daemon's)\n", secs,
           (unsigned long long)atomic_load(&r->head), (unsigned long long)atomic_load(&r->prod_local),
           (unsigned long long)acquired, (unsigned long long)local, (unsigned long long)via,
           (unsigned long long)takes, (unsigned long long)atomic_load(&r->refused),
           (unsigned long long)atomic_load(&r->rechecked), (unsigned long long)atomic_load(&r->bad_pages),
           (unsigned long long)atomic_load(&r->bad_local), (unsigned long long)atomic_load(&r->bad_daemon));
    /* Breaks when a recycle and a take can both succeed on one word (handoff_take checking
     * the hash and size outside its CAS, a give pushing a slot its count still holds), or
     * when the daemon's acquire of a table publish holds the buffer without a count in the
     * word (tenantdir.c's take: the producer's next local lease recycles it under the
     * daemon's consumer). */
    cr_assert_eq(atomic_load(&r->bad_pages), 0, "%llu pages read under a token were of another generation",
                 (unsigned long long)atomic_load(&r->bad_pages));
    cr_assert_gt(atomic_load(&r->head), 1000, "the producer published only %llu generations",
                 (unsigned long long)atomic_load(&r->head));
    cr_assert_gt(atomic_load(&r->prod_local), 1000, "only %llu of the producer's leases came from the table",
                 (unsigned long long)atomic_load(&r->prod_local));
    cr_assert_gt(acquired, 1000, "only %llu acquires: the race was not run", (unsigned long long)acquired);
    cr_assert_gt(local, 500, "only %llu acquires were taken in the table", (unsigned long long)local);
    cr_assert_gt(via, 200, "only %llu acquires went through the daemon", (unsigned long long)via);
    cr_assert_gt(takes, 0, "the daemon never acquired a publish made in the table");
    cr_assert_gt(atomic_load(&r->refused), 0, "no acquire met a recycled buffer: the race was not run");
    munmap(r, sizeof(*r));
    daemon_stop(&d);
}

/* ---- (3) SIGKILL between any two steps of a handoff ---------------------------------- */

/* A step child (the producer or the consumer of one handoff) does one step per command
 * and answers when it is done, then waits for the next command on its pipe: killed
 * there, it dies exactly after that step. */
struct step_cmd {
    char op;                /* l lease, f fill, p publish, h take the descriptor, a acquire, r release */
    shmref_desc desc;
};

struct step_ack {
    int rc;
    shmref_desc desc;       /* p: the descriptor published */
    uint64_t local;         /* l, a: 1 if the lease or the acquire was the table's (counters table_leases,
                             * table_acquires: a hold in the word and the journal, no daemon) */
};

struct stepper {
    const char *socket;
    int cmd[2], ack[2];
    pid_t pid;
};

static int step_child(void *p)
{
    struct stepper *k = p;
    close(k->cmd[1]);
    close(k->ack[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    shmref_conn *c;
    struct step_ack ack = { 0 };
    if (shmref_connect(k->socket, &c) < 0 || shmref_set_stock(c, 0) < 0)
        ack.rc = -1;
    if (write(k->ack[1], &ack, sizeof(ack)) != sizeof(ack) || ack.rc < 0)
        return 100;
    shmref_buf *b = NULL;
    shmref_desc desc = { .size = 0 };
    struct step_cmd m;
    while (read_full(k->cmd[0], &m, sizeof(m))) {
        ack = (struct step_ack){ 0 };
        uint64_t before = 0, after = 0;
        switch (m.op) {
        case 'l':
            shmref_conn_counter(c, "table_leases", &before);
            ack.rc = shmref_lease(c, RT_SIZE, &b);
            shmref_conn_counter(c, "table_leases", &after);
            ack.local = after - before;
            break;
        case 'f':
            victim_fill(shmref_buf_data(b), 7);
            break;
        case 'p':
            ack.rc = shmref_publish(b, RT_SIZE, 0, NULL, 0, &ack.desc);
            break;
        case 'h':
            desc = m.desc;
            break;
        case 'a':
            shmref_conn_counter(c, "table_acquires", &before);
            ack.rc = shmref_acquire(c, &desc, &b);
            if (ack.rc == 0 && victim_check(shmref_buf_data(b), 7) != -1)
                ack.rc = -EBADMSG;
            shmref_conn_counter(c, "table_acquires", &after);
            ack.local = after - before;
            break;
        case 'r':
            shmref_release(b);
            b = NULL;
            break;
        default:
            ack.rc = -EINVAL;
        }
        if (write(k->ack[1], &ack, sizeof(ack)) != sizeof(ack))
            return 101;
    }
    shmref_close(c);
    return 0;
}

static void stepper_start(struct stepper *k, const char *socket)
{
    k->socket = socket;
    cr_assert_eq(pipe(k->cmd), 0);
    cr_assert_eq(pipe(k->ack), 0);
    k->pid = child_run(step_child, k);
    close(k->cmd[0]);
    close(k->ack[1]);
    struct step_ack ack;
    cr_assert(read_full(k->ack[0], &ack, sizeof(ack)) && ack.rc == 0, "a step child did not connect");
}

static struct step_ack step(struct stepper *k, char op, const shmref_desc *desc)
{
    struct step_cmd m = { .op = op };
    if (desc)
        m.desc = *desc;
    struct step_ack ack;
    cr_assert_eq(write(k->cmd[1], &m, sizeof(m)), (ssize_t)sizeof(m));
    cr_assert(read_full(k->ack[0], &ack, sizeof(ack)), "step child %d died at step %c", (int)k->pid, op);
    cr_assert_eq(ack.rc, 0, "step %c failed: %d", op, ack.rc);
    return ack;
}

static void stepper_end(struct stepper *k, bool killed)
{
    close(k->cmd[1]);
    close(k->ack[0]);
    if (!killed)
        cr_assert_eq(child_wait(k->pid), 0, "a step child failed");
}

/* The daemon's state of a handoff's buffer: what it holds itself (pool.bytes_leased, the
 * members it references: table.members - table.lent) and, for the table's holds, the
 * words of the uid's table (root's own mapping of it: a raw hello with the table), which
 * the daemon repairs at a connection's end from its journal (tenantdir_leave). */
struct held {
    uint64_t leased, daemon_members;
    uint32_t count, busy;   /* holds in the words of the slots watched, and slots not FREE */
};

static struct held held_of(shmref_conn *st, void *tab, const uint32_t *slots, unsigned nslots)
{
    shmref_status *s;
    uint64_t members = 0, lent = 0;
    struct held h = { 0 };
    cr_assert_eq(shmref_status_get(st, &s), 0, "status: %s", shmref_errmsg(st));
    cr_assert_eq(shmref_status_u64(s, "pool.bytes_leased", &h.leased), 0);
    cr_assert_eq(shmref_status_u64(s, "table.members", &members), 0);
    cr_assert_eq(shmref_status_u64(s, "table.lent", &lent), 0);
    shmref_status_free(s);
    h.daemon_members = members - lent;
    for (unsigned i = 0; i < nslots; i++) {
        uint64_t w = atomic_load(&handoff_entry_at(tab, slots[i])->word);
        h.count += handoff_count_of(w);
        h.busy += handoff_state_of(w) != HANDOFF_FREE;
    }
    return h;
}

static bool held_none(struct held h)
{
    return h.leased == 0 && h.daemon_members == 0 && h.count == 0 && h.busy == 0;
}

/* A scenario: the steps of one handoff up to a boundary, who is killed there (P the
 * producer, C the consumer, B both), then what the survivor still does (release what it
 * holds: a normal step). P: l lease (popped from the table: a hold in the word and in
 * P's journal), f fill, p publish (in the table); C: h gets the descriptor, a acquires
 * (taken in the table: it maps the buffer since the warm-up); r releases. */
struct scenario {
    const char *steps;      /* pairs: who, op */
    char kill;
    const char *after;      /* pairs, by the survivor */
};

static const struct scenario scenarios[] = {
    { "Pl", 'P', "" },                          /* leased */
    { "PlPf", 'P', "" },                        /* filled */
    { "PlPfPp", 'P', "" },                      /* published */
    { "PlPfPpCh", 'P', "" },                    /* descriptor handed on */
    { "PlPfPpChCa", 'C', "Pr" },                /* consumer acquired, producer holds */
    { "PlPfPpChCa", 'P', "Cr" },                /* producer killed while the consumer holds */
    { "PlPfPpChCaPr", 'C', "" },                /* producer released: only the consumer's hold */
    { "PlPfPpChCaCr", 'P', "" },                /* consumer released, producer holds */
    { "PlPfPpChCa", 'B', "" },                  /* both at once */
};

#define NSCEN (sizeof(scenarios) / sizeof(scenarios[0]))
#define REPEAT 3
#define RECLAIM_MEDIAN_MS 10
#define WATCH_MAX 64

/* one_scenario: returns the microseconds from the kill (the child reaped, and the
 * survivor's own release done) to the buffer free again by the daemon's state (nothing
 * leased, no member the daemon references, every watched word FREE with count 0);
 * *ret_local: leases and acquires that were the table's. slots: the table slots seen so
 * far (from the tokens published), watched. */
static long one_scenario(const struct daemon *d, shmref_conn *st, void *tab, uint32_t *slots, unsigned *nslots,
                         const struct scenario *sc, uint64_t *ret_local)
{
    struct stepper P, C;
    stepper_start(&P, d->socket);
    stepper_start(&C, d->socket);
    /* warm-up: one whole handoff, so the consumer maps the buffer the producer leases next */
    struct step_ack pub;
    step(&P, 'l', NULL);
    step(&P, 'f', NULL);
    pub = step(&P, 'p', NULL);
    step(&C, 'h', &pub.desc);
    step(&C, 'a', NULL);
    step(&C, 'r', NULL);
    step(&P, 'r', NULL);
    uint32_t slot = handoff_slot_of(pub.desc.token);
    bool seen = false;
    for (unsigned i = 0; i < *nslots; i++)
        seen |= slots[i] == slot;
    if (!seen && slot < HANDOFF_MAX_SLOTS && *nslots < WATCH_MAX)
        slots[(*nslots)++] = slot;
    long end = now_ms() + 5000;
    while (!held_none(held_of(st, tab, slots, *nslots)) && now_ms() < end)
        usleep(500);
    struct held h = held_of(st, tab, slots, *nslots);
    cr_assert(held_none(h), "the warm-up's buffer did not come back (leased %llu, daemon members %llu, count %u)",
              (unsigned long long)h.leased, (unsigned long long)h.daemon_members, h.count);
    for (const char *s = sc->steps; *s; s += 2) {
        struct stepper *k = s[0] == 'P' ? &P : &C;
        struct step_ack a = step(k, s[1], s[1] == 'h' ? &pub.desc : NULL);
        if (s[1] == 'p') {
            pub = a;
            slot = handoff_slot_of(pub.desc.token);
            seen = false;
            for (unsigned i = 0; i < *nslots; i++)
                seen |= slots[i] == slot;
            if (!seen && slot < HANDOFF_MAX_SLOTS && *nslots < WATCH_MAX)
                slots[(*nslots)++] = slot;
        }
        *ret_local += a.local;
    }
    cr_assert(!held_none(held_of(st, tab, slots, *nslots)), "scenario %s: the buffer was back before the kill",
              sc->steps);
    bool kp = sc->kill == 'P' || sc->kill == 'B', kc = sc->kill == 'C' || sc->kill == 'B';
    if (kp)
        kill(P.pid, SIGKILL);
    if (kc)
        kill(C.pid, SIGKILL);
    if (kp)
        child_wait(P.pid);
    if (kc)
        child_wait(C.pid);
    long t0 = now_us();
    for (const char *s = sc->after; *s; s += 2) {
        step(s[0] == 'P' ? &P : &C, s[1], NULL);
        t0 = now_us();
    }
    long t1;
    while (!held_none(h = held_of(st, tab, slots, *nslots)) && (t1 = now_us()) - t0 < 2000000)
        ;
    t1 = now_us();
    /* Breaks when a connection's end does not drop the holds its journal counts
     * (tenantdir_leave: the word keeps a count, the buffer is never FREE again), or drops
     * them only at an idle sweep (the median is then that sweep's period). */
    cr_assert(held_none(h), "scenario %s, %c killed: after %ld ms still leased %llu bytes, %llu members the daemon "
              "holds, %u holds in the words, %u slots not FREE", sc->steps, sc->kill, (t1 - t0) / 1000,
              (unsigned long long)h.leased, (unsigned long long)h.daemon_members, h.count, h.busy);
    stepper_end(&P, kp);
    stepper_end(&C, kc);
    return t1 - t0;
}

Test(handoff_attacks, sigkill_between_any_two_steps_of_a_handoff_is_reclaimed_within_10ms, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    shmref_conn *st = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(st, 0), 0);
    struct raw mine; /* root's table, read (never written) to see its words */
    cr_assert_eq(raw_open(&mine, d.socket), 0, "no table for a raw hello of root");
    static long t[NSCEN * REPEAT];
    long worst[NSCEN] = { 0 };
    uint64_t local = 0, holds0 = status_u64(&d, "table.crash_holds");
    uint32_t slots[WATCH_MAX];
    unsigned nslots = 0;
    for (int r = 0; r < REPEAT; r++)
        for (unsigned i = 0; i < NSCEN; i++) {
            long us = one_scenario(&d, st, mine.tab, slots, &nslots, &scenarios[i], &local);
            t[r * NSCEN + i] = us;
            worst[i] = us > worst[i] ? us : worst[i];
        }
    uint64_t holds = status_u64(&d, "table.crash_holds") - holds0;
    for (unsigned i = 0; i < NSCEN; i++)
        printf("reclaim after SIGKILL of %c after %-12s (then %-2s): worst of %d %6.2f ms\n", scenarios[i].kill,
               scenarios[i].steps, scenarios[i].after, REPEAT, worst[i] / 1000.0);
    long med = pct(t, NSCEN * REPEAT, 50), max = pct(t, NSCEN * REPEAT, 100);
    printf("reclaim after SIGKILL: median %.2f ms, max %.2f ms over %zu kills; %llu of the steps' leases and "
           "acquires were the table's; the daemon dropped %llu holds from the journals of killed connections "
           "(table.crash_holds), %u slots watched\n", med / 1000.0, max / 1000.0, NSCEN * REPEAT,
           (unsigned long long)local, (unsigned long long)holds, nslots);
    /* every scenario's lease was the table's (the warm-up made the member), and each kill
     * left holds in a journal that the daemon dropped: the table's crash path was run */
    cr_assert_geq(local, NSCEN * REPEAT, "only %llu of the steps' leases and acquires were the table's",
                  (unsigned long long)local);
    cr_assert_geq(holds, NSCEN * REPEAT, "the daemon dropped only %llu holds from killed connections' journals",
                  (unsigned long long)holds);
    cr_assert_leq(med, RECLAIM_MEDIAN_MS * 1000 * (SANITIZED ? 3 : 1),
                  "the median time from a SIGKILL to the buffer back was %.2f ms (bound %d ms)", med / 1000.0,
                  RECLAIM_MEDIAN_MS * (SANITIZED ? 3 : 1));
    raw_close(&mine);
    shmref_close(st);
    daemon_stop(&d);
}

/* ---- (4) a flood of each message kind costs only the flooder ------------------------- */

/* rss_anon_kb: the daemon's anonymous resident memory (its heap; the buffers it maps are
 * shared memory, counted elsewhere). */
static long rss_anon_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "the daemon is gone");
    long kb = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* F_MIX (past the kinds of (4)): lease, acquire of a bad token and status, one picked at
 * random per message ((5)). map, giveback and adopt name the flooder's own table members,
 * root's, guesses and nonsense (adopt: the flooder's own local lease under its seq once per
 * burst, valid; the rest under any seq); took and nudge are the ledger's retired ops. */
enum flood_kind {
    F_LEASE, F_ACQUIRE, F_RELEASE, F_MAP, F_GIVEBACK, F_ADOPT, F_TOOK, F_NUDGE, F_FORGET, F_STATUS, F_PING, F_KINDS,
    F_MIX = F_KINDS
};

static const char *const flood_name[F_KINDS] = {
    "lease", "acquire of a bad token", "release of an unknown handle", "map", "giveback", "adopt",
    "took (retired)", "nudge (retired)", "forget", "status", "ping",
};

struct flood_arg {
    const char *socket;
    struct ctl *ctl;
    enum flood_kind kind;
    bool unniced;           /* keeps the test's priority (a niced flooder may barely run) */
};

/* What a flooder knows of buffer ids: its own members (its table, read at its connect),
 * root's (ctl), and the local lease of the current burst (adopt). */
struct flood_ids {
    uint64_t own[64];
    uint32_t slots[64];
    unsigned nown;
    uint64_t lease_id;
    uint32_t lease_seq;
    bool lease_sent;
};

/* flood_send: one request of kind k, its fields random where the daemon must not trust
 * them. */
static int flood_send(struct raw *c, enum flood_kind k, uint32_t *s, struct flood_ids *ids, const struct ctl *ctl)
{
    static const uint32_t op[F_KINDS] = { PROTO_OP_LEASE, PROTO_OP_ACQUIRE, PROTO_OP_RELEASE, PROTO_OP_MAP,
                                          PROTO_OP_GIVEBACK, PROTO_OP_ADOPT, PROTO_OP_TOOK, PROTO_OP_NUDGE,
                                          PROTO_OP_FORGET, PROTO_OP_STATUS, PROTO_OP_PING };
    static const enum flood_kind mix[] = { F_LEASE, F_ACQUIRE, F_STATUS };
    if (k == F_MIX)
        k = mix[xorshift(s) % 3];
    uint8_t tok[PROTO_TOKEN_LEN];
    if (k == F_TOOK || k == F_NUDGE) {
        rand_token(tok, s, xorshift(s) % 128);
        return raw_send_retired(c, op[k], pick_id(s, ids->own, ids->nown, ctl), tok);
    }
    struct proto_msg m = { .op = op[k] };
    switch (k) {
    case F_LEASE:
        m.u.lease.size = PAGE << (xorshift(s) % 5);
        break;
    case F_ACQUIRE:
        rand_token(m.u.acquire.token, s, xorshift(s) % 128);
        break;
    case F_RELEASE:
        m.u.release.handle = (uint64_t)xorshift(s) << 32 | xorshift(s);
        break;
    case F_MAP:
        m.u.map.buf_id = pick_id(s, ids->own, ids->nown, ctl);
        break;
    case F_GIVEBACK:
        m.u.giveback.buf_id = pick_id(s, ids->own, ids->nown, ctl);
        break;
    case F_ADOPT:
        if (ids->lease_id && !ids->lease_sent) {
            m.u.adopt.buf_id = ids->lease_id;
            m.u.adopt.seq = ids->lease_seq;
            ids->lease_sent = true;
        } else {
            m.u.adopt.buf_id = pick_id(s, ids->own, ids->nown, ctl);
            m.u.adopt.seq = xorshift(s) % 4;
        }
        break;
    case F_FORGET:
        m.u.forget.buf_id = pick_id(s, ids->own, ids->nown, ctl);
        m.u.forget.writable = xorshift(s) & 1;
        break;
    default:
        break;
    }
    return raw_send(c, &m);
}

/* flood_members: the flooder's own uid gets members in its table: four leases at once
 * through libshmref (its table's free list empty: the daemon's leases for the table),
 * released (they join the table). The connection stays open (as the raw one does). */
static shmref_conn *flood_members(const char *socket)
{
    shmref_conn *c;
    if (shmref_connect(socket, &c) < 0)
        return NULL;
    shmref_set_stock(c, 0);
    shmref_buf *b[4] = { NULL };
    for (int i = 0; i < 4; i++)
        if (shmref_lease(c, RT_SIZE, &b[i]) < 0)
            b[i] = NULL;
    for (int i = 0; i < 4; i++)
        if (b[i])
            shmref_release(b[i]);
    return c;
}

/* flooder: uid OTHER_UID sends its kind in bursts of 64, each closed by a ping, keeping
 * two bursts in flight (the daemon always has the next one to read while the flooder
 * reads the answers to the last), as fast as the daemon answers. Its sends never block:
 * a send the daemon is not reading for (it stops reading a connection whose replies with
 * fds are unread) ends the burst, and the flooder reads. Leases and adopts it is granted
 * it releases once it read everything before them; its local lease of a burst (adopt) it
 * gives once that burst is answered; it connects again if the daemon closes it. */
static int flooder(void *p)
{
    struct flood_arg *a = p;
    struct ctl *ctl = a->ctl;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    unmap_inherited();
    if ((!a->unniced && setpriority(PRIO_PROCESS, 0, 10) < 0) || become(OTHER_UID) < 0) /* as the attacker of (1) */
        return 10;
    uint32_t s = (uint32_t)getpid() * 2654435761u | 1;
    shmref_conn *keep = flood_members(a->socket);
    struct raw c = { .sock = -1 };
    struct flood_ids ids = { .nown = 0 };
    uint32_t inflight[2], lslot[2] = { HANDOFF_NO_SLOT, HANDOFF_NO_SLOT }, pend = HANDOFF_NO_SLOT;
    unsigned n = 0;
    while (!atomic_load(&ctl->stop)) {
        if (n == 0 && c.sock < 0) {
            if (raw_open(&c, a->socket) < 0)
                return 11;
            ids.nown = table_members(c.tab, ids.own, 64, ids.slots);
            fcntl(c.sock, F_SETFL, fcntl(c.sock, F_GETFL) | O_NONBLOCK);
        }
        uint32_t slot = HANDOFF_NO_SLOT;
        ids.lease_id = 0;
        ids.lease_sent = false;
        int cls = a->kind == F_ADOPT ? handoff_class(c.tab, RT_SIZE) : -1;
        if (cls >= 0 && handoff_lease(c.tab, c.journal, (uint32_t)cls, HANDOFF_TRIES, &slot, &ids.lease_seq) == 0)
            ids.lease_id = atomic_load(&handoff_entry_at(c.tab, slot)->buf_id);
        else
            slot = HANDOFF_NO_SLOT;
        int sent = 0, e = 0;
        while (sent < 64 && e == 0)
            if ((e = flood_send(&c, a->kind, &s, &ids, ctl)) == 0)
                sent++;
        struct proto_msg ping = { .op = PROTO_OP_PING };
        if (e == 0 && raw_send(&c, &ping) == 0) {
            lslot[n] = slot;
            inflight[n++] = ping.id;
        } else if (slot != HANDOFF_NO_SLOT) {
            pend = slot; /* its burst has no ping: given after the drain below */
        }
        atomic_fetch_add(&ctl->msgs, (uint64_t)sent);
        bool closed = false;
        if (n == 2 || (n == 1 && e != 0)) {
            closed = raw_drain(&c, inflight[0]) < 0;
            if (!closed) {
                if (lslot[0] != HANDOFF_NO_SLOT)
                    handoff_give(c.tab, c.journal, lslot[0], HANDOFF_TRIES);
                inflight[0] = inflight[1];
                lslot[0] = lslot[1];
                lslot[1] = HANDOFF_NO_SLOT;
                n--;
            }
        } else if (n == 0 && e != 0) { /* no ping went: read what came */
            closed = raw_drain(&c, 0) < 0;
        }
        if (!closed && pend != HANDOFF_NO_SLOT)
            handoff_give(c.tab, c.journal, pend, HANDOFF_TRIES);
        pend = HANDOFF_NO_SLOT;
        raw_count(&c, ctl);
        if (closed) {
            raw_close(&c); /* its journal's holds are the daemon's to drop now */
            n = 0;
            lslot[0] = lslot[1] = HANDOFF_NO_SLOT;
            atomic_fetch_add(&ctl->reconnects, 1);
            continue;
        }
        atomic_fetch_add(&ctl->passes, 1);
        atomic_store(&ctl->armed, 1);
    }
    raw_close(&c);
    if (keep)
        shmref_close(keep);
    return 0;
}

/* pings: n pings of root's raw connection, their times (us) into t. */
static void pings(int fd, long *t, int n)
{
    uint8_t msg[64], rep[256];
    for (int i = 0; i < n; i++) {
        struct proto_msg m = { .op = PROTO_OP_PING, .id = (uint32_t)i + 100 };
        int len = proto_encode(&m, msg, sizeof(msg));
        long t0 = now_us();
        ssize_t got = rawclient_call(fd, msg, (size_t)len, rep, sizeof(rep), 10000);
        t[i] = now_us() - t0;
        cr_assert_gt(got, 0, "root's ping %d was not answered", i);
    }
}

#define PINGS 400
/* Another uid's median ping and round trip under a flood <= 15x its least baseline of the
 * test. The daemon bounds the time one connection gets per wake-up (transport.c), so a
 * ping (13 us alone) waits for about one of the flooder's requests: measured 0.8-1.4x for
 * every kind but status, whose requests cost the daemon 50-100 us (up to 9.8x against the
 * least baseline, 2.9x against the one just before); the round trip (table handoffs plus
 * one daemon acquire) 0.8-1.1x. What breaks it is a request that costs the daemon far
 * more than a ping: a giveback made to spin 300 us in tenantdir_giveback gave a ping
 * median of 24x the least baseline (9x the one just before it, which passed a bound of
 * 10x against its own baseline: hence the least) and a round trip of 2.9x; a request
 * that stalls the daemon for milliseconds fails both. */
#define FLOOD_RATIO 15
#define FLOOD_MS 2000
/* The daemon's heap during the floods over before them: 0.3 MB measured; sanitized,
 * ASan's quarantine of freed memory (256 MiB by default) comes on top. */
#define RSS_GROWTH_KB ((SANITIZED ? 512 : 32) * 1024)

/* What one flood of one kind did to root: its medians just before (no flood) and during. */
struct flood_result {
    long p50, r50;          /* root's ping and round trip alone, just before (us) */
    long f50, f99, g50;     /* ping (and its p99) and round trip during the flood */
    int nf;
    long ms, rss;
    uint64_t sent, reconnects, mapped, adopted, errors, eopnotsupp;
};

static struct ctl flood_victim; /* root's table members, copied into each flooder's ctl */

static bool flood_ok(const struct flood_result *r)
{
    return r->f50 <= FLOOD_RATIO * r->p50 && r->g50 <= FLOOD_RATIO * r->r50;
}

/* flood_once: root's baseline (pings and round trips, no flood), then a flood of kind k
 * from uid OTHER_UID with root's pings and round trips during it. The baseline is taken
 * just before, so that the load of the machine is the same for both. */
static struct flood_result flood_once(const struct daemon *d, int fd, struct victim *v, shmref_conn *st,
                                      struct charge quiet, enum flood_kind k)
{
    static long pb[PINGS], pf[PINGS], rb[RT_MAX], rf[RT_MAX];
    struct flood_result r = { 0 };
    pings(fd, pb, PINGS);
    int nb = victim_series(v, st, rb, RT_N, RT_MAX, 300, quiet, "baseline");
    r.p50 = pct(pb, PINGS, 50);
    r.r50 = pct(rb, nb, 50);
    struct ctl *ctl = ctl_new();
    ctl->nvictim = flood_victim.nvictim;
    memcpy(ctl->victim_ids, flood_victim.victim_ids, sizeof(ctl->victim_ids));
    struct flood_arg a = { .socket = d->socket, .ctl = ctl, .kind = k };
    pid_t pid = child_run(flooder, &a);
    long end = now_ms() + 30000;
    while (!atomic_load(&ctl->armed) && now_ms() < end && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(2000);
    cr_assert(atomic_load(&ctl->armed), "the %s flooder never finished a burst", flood_name[k]);
    long t0 = now_ms();
    uint64_t m0 = atomic_load(&ctl->msgs);
    pings(fd, pf, PINGS);
    r.nf = victim_series(v, st, rf, RT_N, RT_MAX, FLOOD_MS - (now_ms() - t0), quiet, flood_name[k]);
    r.ms = now_ms() - t0;
    r.sent = atomic_load(&ctl->msgs) - m0;
    r.reconnects = atomic_load(&ctl->reconnects);
    r.rss = rss_anon_kb(d->pid);
    int ex = ctl_stop(ctl, pid);
    cr_assert_eq(ex, 0, "the %s flooder failed: %d (10-12: setup; 137: it did not stop within 20 s)", flood_name[k],
                 ex);
    r.mapped = atomic_load(&ctl->mapped);
    r.adopted = atomic_load(&ctl->adopted);
    r.errors = atomic_load(&ctl->errors);
    r.eopnotsupp = atomic_load(&ctl->eopnotsupp);
    munmap(ctl, sizeof(*ctl));
    r.f50 = pct(pf, PINGS, 50);
    r.f99 = pct(pf, PINGS, 99);
    r.g50 = pct(rf, r.nf, 50);
    printf("flood of %-28s %8llu messages in %ld ms (%llu reconnects): root's ping median %ld us against %ld "
           "(%.2fx, p99 %ld), round trip median %ld us against %ld (%.2fx, %d of them); RssAnon %ld kB; answered: %llu "
           "maps, %llu adopts, %llu errors (%llu EOPNOTSUPP)\n",
           flood_name[k], (unsigned long long)r.sent, r.ms, (unsigned long long)r.reconnects, r.f50, r.p50,
           (double)r.f50 / (double)r.p50, r.f99, r.g50, r.r50, (double)r.g50 / (double)r.r50, r.nf, r.rss,
           (unsigned long long)r.mapped, (unsigned long long)r.adopted, (unsigned long long)r.errors,
           (unsigned long long)r.eopnotsupp);
    cr_assert(daemon_alive(d), "the daemon died under a flood of %s", flood_name[k]);
    cr_assert_gt(r.sent, 1000, "the %s flooder sent only %llu messages", flood_name[k], (unsigned long long)r.sent);
    return r;
}

Test(handoff_attacks, a_flood_of_each_message_kind_costs_only_the_flooder, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *st = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(st, 0), 0);
    struct victim v = { 0 };
    victim_open(&v, &d);
    int fd = raw_connect(&d);
    raw_hello(fd);
    for (int i = 0; i < RT_WARM; i++)
        victim_rt(&v);
    struct charge quiet = charge_of(st, getuid());
    struct raw mine; /* root's table: its members' ids, which the flooders name too */
    cr_assert_eq(raw_open(&mine, d.socket), 0, "no table for a raw hello of root");
    flood_victim.nvictim = table_members(mine.tab, flood_victim.victim_ids, 16, NULL);
    cr_assert_gt(flood_victim.nvictim, 0, "root's table has no members");
    long rss0 = rss_anon_kb(d.pid), rss_max = rss0;
    /* The baselines are the least of those measured so far in this test (each flood's is
     * taken just before it): a noisy moment before one flood does not loosen its bound. */
    long bp = LONG_MAX, br = LONG_MAX;
    for (int k = 0; k < F_KINDS; k++) {
        struct flood_result r = flood_once(&d, fd, &v, st, quiet, (enum flood_kind)k);
        bp = r.p50 < bp ? r.p50 : bp;
        br = r.r50 < br ? r.r50 : br;
        r.p50 = bp;
        r.r50 = br;
        if (!flood_ok(&r)) { /* past the bound once: measured again before it counts (a busy machine) */
            printf("flood of %s: past %dx the least baselines (%ld us, %ld us) once; again\n", flood_name[k],
                   FLOOD_RATIO, bp, br);
            r = flood_once(&d, fd, &v, st, quiet, (enum flood_kind)k);
            bp = r.p50 < bp ? r.p50 : bp;
            br = r.r50 < br ? r.r50 : br;
            r.p50 = bp;
            r.r50 = br;
        }
        rss_max = r.rss > rss_max ? r.rss : rss_max;
        cr_assert_leq(r.f50, FLOOD_RATIO * r.p50, "under a flood of %s root's median ping took %ld us, %.1fx its "
                      "least %ld us alone (bound %dx), twice", flood_name[k], r.f50, (double)r.f50 / (double)r.p50, r.p50,
                      FLOOD_RATIO);
        cr_assert_leq(r.g50, FLOOD_RATIO * r.r50, "under a flood of %s root's median round trip took %ld us, %.1fx "
                      "its least %ld us alone (bound %dx), twice", flood_name[k], r.g50, (double)r.g50 / (double)r.r50,
                      r.r50, FLOOD_RATIO);
        /* The valid requests among the flood were served (the flood ran the table's paths,
         * not only their refusals): a map of its own member sends its fd; its own local
         * lease adopted under its seq becomes a lease. */
        if (k == F_MAP)
            cr_assert_gt(r.mapped, 0, "no map of the flooder's own members was answered");
        if (k == F_ADOPT)
            cr_assert_gt(r.adopted, 0, "no adopt of the flooder's own local lease was answered");
        /* The retired took and nudge are unknown ops: answered EOPNOTSUPP, the connection
         * kept (a daemon that took them as malformed would close it: reconnects). */
        if (k == F_TOOK || k == F_NUDGE) {
            cr_assert_geq(r.eopnotsupp, r.sent / 2, "a flood of %s: %llu sent, only %llu answered EOPNOTSUPP",
                          flood_name[k], (unsigned long long)r.sent, (unsigned long long)r.eopnotsupp);
            cr_assert_eq(r.reconnects, 0, "a flood of %s: the daemon closed the connection %llu times",
                         flood_name[k], (unsigned long long)r.reconnects);
        }
    }
    raw_close(&mine);
    long rss1 = rss_anon_kb(d.pid);
    printf("flood: the daemon's RssAnon %ld kB before, at most %ld kB during, %ld kB after the floods\n", rss0,
           rss_max, rss1);
    cr_assert_leq(rss_max - rss0, RSS_GROWTH_KB, "the daemon's heap grew by %ld kB under the floods (bound %d kB)",
                  rss_max - rss0, RSS_GROWTH_KB);
    close(fd);
    victim_close(&v);
    shmref_close(st);
    daemon_stop(&d);
}

/* ---- (5) a flood of expensive requests beside a daemon holding thousands of leases --- */

/* Root holds FAIR_LEASES leases (FAIR_CONNS connections): a status then walks every one
 * of them (status.c lists the buffers being written, session by session), so each status
 * of the flooder costs the daemon about 100 us, however little its reply says (the
 * flooder sees nothing of root's). Root's pings alone, then under the flood: the daemon
 * bounds the time one connection gets per wake-up (transport.c), so a ping waits for that
 * bound and one request, not for a turn of 64 requests. */
#define FAIR_LEASES 12000
#define FAIR_CONNS 4           /* each under --max-leases (4096) */
#define FAIR_CHUNK 250
#define FAIR_TRIES 3
#define FAIR_MSGS 20000        /* the flood's messages while root pings, at least */
#define FAIR_PINGS_MAX 200000
/* Root's ping under the flood against alone (13 us): the median <= 40x, the p99 <= 100x
 * the median alone (or 3x the p99 alone, when the machine's own noise is larger), the
 * least of FAIR_TRIES. A ping may wait for the flooder's turn (100 us and the status that
 * passes it, about 100 us here) and, the flooder's socket being ahead of root's in epoll's
 * ready list, for one more: measured 14x and 22x (with a turn of 64 statuses, before:
 * 460x and 850x; a p99 on a busy 2-core machine is the scheduler's as much as the
 * daemon's, hence its generous bound). Sanitized, a status costs several times more and
 * a ping less so: 12x and 39x measured, bounds 3x. */
#define FAIR_MEDIAN_RATIO (SANITIZED ? 120 : 40)
#define FAIR_P99_RATIO (SANITIZED ? 300 : 100)
#define FAIR_P99_NOISE 3

struct fair_result {
    int n;
    long ms;
    long p50, b99;                      /* root's pings alone (us) */
    long f50, f90, f99, fmax, fmean;    /* under the flood */
    uint64_t sent;
};

/* fair_once: root's pings alone, then under a flood of kind k by uid OTHER_UID (waited for
 * until the flooder has a burst answered). */
static struct fair_result fair_once(const struct daemon *d, int fd, enum flood_kind k)
{
    static long pb[PINGS], pf[FAIR_PINGS_MAX];
    struct fair_result r = { 0 };
    pings(fd, pb, PINGS);
    r.p50 = pct(pb, PINGS, 50);
    r.b99 = pct(pb, PINGS, 99);
    struct ctl *ctl = ctl_new();
    struct flood_arg a = { .socket = d->socket, .ctl = ctl, .kind = k, .unniced = true };
    pid_t pid = child_run(flooder, &a);
    long end = now_ms() + 30000;
    while (!atomic_load(&ctl->armed) && now_ms() < end && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(2000);
    cr_assert(atomic_load(&ctl->armed), "the flooder never finished a burst");
    long t0 = now_ms();
    /* Pings, in rounds of PINGS, until the flooder has sent FAIR_MSGS during them. */
    uint64_t m0 = atomic_load(&ctl->msgs);
    int n = 0;
    do {
        pings(fd, pf + n, PINGS);
        n += PINGS;
    } while (atomic_load(&ctl->msgs) - m0 < FAIR_MSGS && n + PINGS <= FAIR_PINGS_MAX);
    r.sent = atomic_load(&ctl->msgs) - m0;
    r.ms = now_ms() - t0;
    int ex = ctl_stop(ctl, pid);
    cr_assert_eq(ex, 0, "the flooder failed: %d", ex);
    munmap(ctl, sizeof(*ctl));
    cr_assert_geq(r.sent, FAIR_MSGS, "the flooder sent only %llu messages during %d pings",
                  (unsigned long long)r.sent, n);
    r.n = n;
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += pf[i];
    r.fmean = sum / n;
    r.f50 = pct(pf, (size_t)n, 50);
    r.f90 = pct(pf, (size_t)n, 90);
    r.f99 = pct(pf, (size_t)n, 99);
    r.fmax = pct(pf, (size_t)n, 100);
    cr_assert(daemon_alive(d), "the daemon died under the flood");
    return r;
}

Test(handoff_attacks, an_expensive_flood_beside_thousands_of_leases_costs_only_the_flooder, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *held[FAIR_CONNS];
    for (int i = 0; i < FAIR_CONNS; i++)
        held[i] = connect_ok(&d);
    static shmref_buf *bufs[FAIR_LEASES];
    static size_t sizes[FAIR_CHUNK];
    for (int i = 0; i < FAIR_CHUNK; i++)
        sizes[i] = PAGE;
    for (int i = 0; i < FAIR_LEASES; i += FAIR_CHUNK)
        cr_assert_eq(shmref_lease_many(held[i / FAIR_CHUNK % FAIR_CONNS], sizes, FAIR_CHUNK, &bufs[i]), 0, "lease_many: %s",
                     shmref_errmsg(held[i / FAIR_CHUNK % FAIR_CONNS]));
    cr_assert_geq(wait_status(&d, "buffers.leases", FAIR_LEASES, 10000), FAIR_LEASES);
    int fd = raw_connect(&d);
    raw_hello(fd);
    static const enum flood_kind kinds[] = { F_STATUS, F_MIX };
    static const char *const names[] = { "status", "lease/acquire/status" };
    for (unsigned k = 0; k < 2; k++) {
        double med = 1e9, p99 = 1e9;
        for (int i = 0; i < FAIR_TRIES && (med > FAIR_MEDIAN_RATIO || p99 > FAIR_P99_RATIO); i++) {
            struct fair_result r = fair_once(&d, fd, kinds[k]);
            long noise = FAIR_P99_NOISE * r.b99 / FAIR_P99_RATIO; /* the p99's bound, over FAIR_P99_RATIO */
            double m = (double)r.f50 / (double)r.p50, q = (double)r.f99 / (double)(r.p50 > noise ? r.p50 : noise);
            printf("flood of %s beside %d leases (try %d): %llu messages during %d pings (%ld ms); root's ping "
                   "median %ld us against %ld alone (%.2fx), mean %ld, p90 %ld, p99 %ld us (%.2fx the median alone, or 1/%d of %dx the "
                   "p99 alone if more; that p99 %ld), max %ld\n", names[k], FAIR_LEASES, i + 1, (unsigned long long)r.sent, r.n, r.ms,
                   r.f50, r.p50, m, r.fmean, r.f90, r.f99, q, FAIR_P99_RATIO, FAIR_P99_NOISE, r.b99, r.fmax);
            med = m < med ? m : med;
            p99 = q < p99 ? q : p99;
        }
        cr_assert_leq(med, FAIR_MEDIAN_RATIO, "under a flood of %s root's median ping was %.1fx its baseline at best "
                      "of %d (bound %dx)", names[k], med, FAIR_TRIES, FAIR_MEDIAN_RATIO);
        cr_assert_leq(p99, FAIR_P99_RATIO, "under a flood of %s root's p99 ping was %.1fx its baseline median (or "
                      "1/%d of %dx its p99 alone) at best of %d (bound %dx)", names[k], p99, FAIR_P99_RATIO,
                      FAIR_P99_NOISE, FAIR_TRIES, FAIR_P99_RATIO);
    }
    close(fd);
    shmref_release_many(bufs, FAIR_LEASES);
    for (int i = 0; i < FAIR_CONNS; i++)
        shmref_close(held[i]);
    daemon_stop(&d);
}

/* ---- (6) idle connections that hold in the table cost the idle sweep O(1) each -------- */

/* A connection that only hands off in its table sends the daemon nothing, so past
 * --idle-timeout each housekeeping sweep (one a second) asks its journal whether it holds
 * anything before it may close it. That walked the uid's members for every such
 * connection, every sweep: with 128 connections holding the member walked last among
 * 4,096, 524,288 members a second, for as long as they stayed (up to 512 connections of
 * 65,536 members: tens of millions, every second, stalling every other uid). Now a sweep
 * looks first at the member a connection was last found holding, looks at one found
 * holding again only an idle timeout later, and walks at most SESSION_IDLE_VISITS (65,536)
 * members plus one walk. The attacker (uid 65534) makes 4,096 members (its share of the
 * daemon's fd budget allows no more here), then 128 connections whose journals count a
 * hold on the oldest (the walk's last); root watches table.idle_visits: it must stop
 * growing once each connection was walked once (at most 8 sweeps), and grow by less than
 * one walk over the next 5 s. Before: it grew by 524,288 a second for as long as the
 * connections stayed. Root's pings are printed beside it. */
#define IDLE_MEMBERS 4096
#define IDLE_CONNS 128

struct idle_arg {
    const char *socket;
    int ready; /* write end: one byte once every journal counts its hold */
};

static int idle_holder(void *p)
{
    struct idle_arg *a = p;
    if (become(OTHER_UID) < 0)
        return 2;
    shmref_conn *c;
    if (shmref_connect(a->socket, &c) < 0)
        return 3;
    static shmref_buf *b[IDLE_MEMBERS];
    for (int i = 0; i < IDLE_MEMBERS; i++)
        if (shmref_lease(c, PAGE, &b[i]) < 0) {
            fprintf(stderr, "idle_holder: lease %d: %s\n", i, shmref_errmsg(c));
            return 4;
        }
    struct raw look;
    if (raw_open(&look, a->socket) < 0)
        return 5;
    /* The first released joins the table first: the members list is newest first, so
     * its walk reaches this one last. Its slot: the only member's, once it joined. */
    shmref_release(b[0]);
    if (shmref_ping(c) < 0)
        return 6;
    int64_t slot = -1;
    for (uint32_t i = 0; i < HANDOFF_MAX_SLOTS && slot < 0; i++)
        if (atomic_load(&handoff_entry_at(look.tab, i)->buf_id))
            slot = i;
    if (slot < 0)
        return 7;
    for (int i = 1; i < IDLE_MEMBERS; i++)
        shmref_release(b[i]);
    if (shmref_ping(c) < 0)
        return 8;
    static struct raw conns[IDLE_CONNS];
    for (int i = 0; i < IDLE_CONNS; i++) {
        if (raw_open(&conns[i], a->socket) < 0)
            return 9;
        atomic_store(&conns[i].journal[slot], 1u); /* "holds" the walk's last member */
    }
    char one = 1;
    if (write(a->ready, &one, 1) != 1)
        return 10;
    for (;;)
        pause(); /* idle, holding: killed by the test */
}

Test(handoff_attacks, idle_connections_holding_in_the_table_cost_the_sweep_o1_each, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", "--idle-timeout", "1", "--max-leases", "16384", NULL);
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    struct idle_arg a = { .socket = d.socket, .ready = pfd[1] };
    pid_t pid = child_run(idle_holder, &a);
    close(pfd[1]);
    char one;
    struct pollfd pf = { .fd = pfd[0], .events = POLLIN };
    int pr = poll(&pf, 1, 120000);
    if (pr != 1 || read(pfd[0], &one, 1) != 1) {
        kill(pid, SIGKILL);
        cr_assert_fail("the attacker did not get ready (exit %d)", child_wait(pid));
    }
    close(pfd[0]);
    cr_assert_eq(wait_status(&d, "table.members", IDLE_MEMBERS, 30000), IDLE_MEMBERS);
    int fd = raw_connect(&d);
    raw_hello(fd);
    /* until idle_visits stood still for 2.5 s (at least two sweeps): each connection walked
     * once (the budget spreads 128 walks of 4,096 over 8 sweeps), or 60 s */
    uint64_t v = status_u64(&d, "table.idle_visits"), last = v;
    long still_since = now_us(), deadline = now_us() + 60000000L, worst = 0;
    while (now_us() < deadline && now_us() - still_since < 2500000L) {
        long t = ping_us(fd);
        worst = t > worst ? t : worst;
        usleep(100000);
        v = status_u64(&d, "table.idle_visits");
        if (v != last) {
            last = v;
            still_since = now_us();
        }
    }
    uint64_t first = v;
    printf("idle sweeps: %llu members walked until the checks settled (one walk of each of %d connections: %d, "
           "and of the attacker's two that hold nothing)\n", (unsigned long long)first, IDLE_CONNS, IDLE_CONNS * IDLE_MEMBERS);
    cr_assert_lt(now_us(), deadline, "table.idle_visits never stopped growing (%llu): every sweep walks the members",
                 (unsigned long long)v);
    cr_assert_geq(first, (uint64_t)IDLE_CONNS * IDLE_MEMBERS, "the connections were not each walked once: %llu",
                  (unsigned long long)first);
    long t0 = now_us(), n = 0, sum = 0;
    while (now_us() - t0 < 5000000L) {
        long t = ping_us(fd);
        worst = t > worst ? t : worst;
        sum += t;
        n++;
        usleep(20000);
    }
    uint64_t after = status_u64(&d, "table.idle_visits");
    printf("over the next 5 s: %llu more members walked (%ld root pings, mean %ld us, worst of the test %ld us)\n",
           (unsigned long long)(after - first), n, n ? sum / n : 0, worst);
    cr_assert_lt(after - first, (uint64_t)IDLE_MEMBERS,
                 "idle checks walked %llu members in 5 s after every connection was found holding",
                 (unsigned long long)(after - first));
    /* the attacker's two others (its library's, its look at the table) held nothing: closed;
     * the status request's own connection has a journal too */
    uint64_t journals = wait_status(&d, "table.journals", IDLE_CONNS + 1, 5000); /* earlier status connections end */
    cr_assert_eq(journals, IDLE_CONNS + 1, "%llu journals: a holding connection was closed as idle, or one holding "
                 "nothing was not", (unsigned long long)journals);
    close(fd);
    kill(pid, SIGKILL);
    child_wait(pid);
    daemon_stop(&d);
}
