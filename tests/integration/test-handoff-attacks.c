/* SPDX-License-Identifier: MIT */
/* test-handoff-attacks.c: issue 28's attacks on handoffs, at the level of real processes,
 * the public API (libshmref) and the raw protocol, so that they hold for today's ledger
 * fast path and for whatever replaces it: (1) a uid that scribbles on every shared
 * mapping it has (its directory and ledger today) while it floods acquire/took/nudge/
 * forget never makes another uid read a byte not its own, slow it past a ratio of its
 * own baseline or charge it anything; (2) consumers racing a producer's recycles for 10 s
 * never read another generation under a token (every page names its generation); (3) a
 * SIGKILL between any two steps of a handoff is reclaimed within 10 ms (median); (4) a
 * flood of each message kind costs only its sender (another uid's latency within a ratio
 * of its baseline, the daemon's anonymous memory bounded); (5) so does a flood of status
 * (or of lease, acquire and status mixed) beside a daemon holding 12,000 leases, where a
 * status costs 100 us. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
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
#include "ledger.h"
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

struct victim {
    shmref_conn *prod, *cons;
    uint64_t iter;
};

static void victim_open(struct victim *v, const struct daemon *d)
{
    v->prod = connect_ok(d);
    v->cons = connect_ok(d);
    cr_assert_eq(shmref_set_stock(v->prod, 0), 0); /* its charge is what it holds, nothing more */
    cr_assert_eq(shmref_set_stock(v->cons, 0), 0);
}

static void victim_close(struct victim *v)
{
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
    _Atomic uint64_t passes, regions, scribbled_dirs, msgs, api_ok, api_err, reconnects;
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

/* A raw connection of the attacker, with whatever shared files its hello brought. */
struct raw {
    int sock;
    uint32_t id;
    void *shared[2];                /* mapped read-write: the hello's fds (today: directory, ledger) */
    size_t shared_len[2];
};

static int raw_send(struct raw *c, struct proto_msg *m)
{
    uint8_t buf[1024];
    m->id = ++c->id;
    int n = proto_encode(m, buf, sizeof(buf));
    return n < 0 ? n : rawclient_send(c->sock, buf, (size_t)n);
}

/* raw_open: hello asking for every feature this build speaks; every fd the reply carries
 * is mapped read-write if it can be (a hostile client keeps what it is sent). */
static int raw_open(struct raw *c, const char *socket)
{
    *c = (struct raw){ .sock = rawclient_connect(socket) };
    if (c->sock < 0)
        return c->sock;
    struct proto_msg m = { .op = PROTO_OP_HELLO }, r;
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.features = PROTO_FEAT_NOREPLY_RELEASE | PROTO_FEAT_FD_ONCE | PROTO_FEAT_LEDGER;
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
        r.op != PROTO_OP_HELLO + PROTO_OP_REPLY)
        return -EPROTO;
    for (unsigned i = 0; i < n; i++) {
        struct stat sb;
        if (fstat(fds[i], &sb) == 0 && sb.st_size > 0) {
            void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
            if (p != MAP_FAILED) {
                c->shared[i] = p;
                c->shared_len[i] = (size_t)sb.st_size;
            }
        }
        close(fds[i]);
    }
    return 0;
}

static void raw_close(struct raw *c)
{
    for (int i = 0; i < 2; i++)
        if (c->shared[i])
            munmap(c->shared[i], c->shared_len[i]);
    if (c->sock >= 0)
        close(c->sock);
    *c = (struct raw){ .sock = -1 };
}

/* raw_drain: reads replies until the ping with id want is answered (want 0: until none
 * comes for 20 ms), fds closed, then releases every handle those replies granted. Not
 * before: the daemon stops reading a connection whose replies with fds are unread, so a
 * client that sends while it has not read everything can block itself forever. Returns
 * 0, or -EPIPE when the daemon closed. */
static int raw_drain(struct raw *c, uint32_t want)
{
    static uint8_t rep[PROTO_MAX_REPLY];
    uint64_t handles[256];
    unsigned nh = 0;
    for (;;) {
        int fd = -1;
        unsigned n = 0;
        ssize_t len = rawclient_recv_fds(c->sock, rep, sizeof(rep), &fd, 1, &n, want ? 10000 : 20);
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
        if ((r.op == PROTO_OP_LEASE + PROTO_OP_REPLY || r.op == PROTO_OP_ACQUIRE + PROTO_OP_REPLY) && nh < 256)
            handles[nh++] = r.u.lease_reply.handle;
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
    ledger_set_slot(t, slot);
}

/* scribble_dir: garbage in every entry of a directory laid out as proto/ledger.h says,
 * a different kind of garbage per entry and pass: random bytes, seq odd, states out of
 * range, huge sizes and meta_len, other buffers' ids under a PUBLISHED state. */
static void scribble_dir(uint8_t *dir, size_t len, uint32_t *s, uint64_t pass)
{
    if (len < LEDGER_DIR_SIZE)
        return;
    uint32_t from = pass % 8 == 0 ? 0 : xorshift(s) % LEDGER_SLOTS, n = pass % 8 == 0 ? LEDGER_SLOTS : 2048;
    for (uint32_t i = from; i < from + n && i < LEDGER_SLOTS; i++) {
        struct ledger_entry *e = (struct ledger_entry *)(dir + LEDGER_HEADER + (size_t)i * sizeof(*e));
        switch ((i + pass) % 6) {
        case 0:
            for (size_t k = 0; k < sizeof(*e); k += 4) {
                uint32_t x = xorshift(s);
                memcpy((uint8_t *)e + k, &x, 4);
            }
            break;
        case 1:
            atomic_store(&e->seq, xorshift(s) | 1); /* a writer forever */
            break;
        case 2:
            atomic_store(&e->state, 3 + xorshift(s) % 0xfffffff0u);
            atomic_store(&e->seq, xorshift(s) & ~1u);
            break;
        case 3:
            atomic_store(&e->size, UINT64_MAX - (xorshift(s) & 0xff));
            atomic_store(&e->meta_len, 0xffffffffu - (xorshift(s) & 0xff));
            atomic_store(&e->state, LEDGER_PUBLISHED);
            break;
        case 4: /* another buffer's id, published under a random hash, even seq */
            atomic_store(&e->buf_id, 1 + xorshift(s) % 4096);
            atomic_store(&e->tokhash, (uint64_t)xorshift(s) << 32 | xorshift(s));
            atomic_store(&e->size, RT_SIZE);
            atomic_store(&e->meta_len, xorshift(s) % (LEDGER_META_MAX + 64));
            atomic_store(&e->state, LEDGER_PUBLISHED);
            atomic_store(&e->seq, xorshift(s) & ~1u);
            break;
        default:
            memset(e, 0xff, sizeof(*e));
            break;
        }
    }
    if (pass % 3 == 2)
        memset(dir, (int)(xorshift(s) & 0xff), LEDGER_HEADER); /* the header too, now and then */
}

/* scribble_region: a shared writable mapping the attacker has: a directory gets
 * scribble_dir, a ledger of counts 0xffffffff everywhere, anything else random bytes
 * over every page (so a redesign's files get garbage too). */
static void scribble_region(uint8_t *p, size_t len, uint32_t *s, uint64_t pass)
{
    if (len == LEDGER_DIR_SIZE) {
        scribble_dir(p, len, s, pass);
    } else if (len == LEDGER_COUNTS_SIZE) {
        memset(p, 0xff, len);
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
 * own control blocks): whatever libshmref mapped (today the directory, the ledger and
 * its buffers). Returns how many. */
static unsigned scribble_maps(uint32_t *s, uint64_t pass, unsigned *ret_dirs)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return 0;
    static struct { uintptr_t a, b; } r[8192];
    unsigned n = 0, dirs = 0;
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
        dirs += len == LEDGER_DIR_SIZE;
        scribble_region((uint8_t *)r[i].a, len, s, pass);
    }
    *ret_dirs = dirs;
    return n;
}

/* unmap_inherited: a forked child keeps its parent's shared mappings (the victim's own
 * ledger and buffers, mapped by the test's libshmref before the fork); a process of
 * another uid would have none of them, so the attacker drops them first. */
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

/* api_round: the attacker's own handoffs through libshmref (its consumer maps its
 * buffers, so its garbage ledger claims them): lease, fill, publish, acquire, release.
 * Errors (its own scribbles confuse its own library; its quota runs out) are counted;
 * after one, both connections are made again. Returns the descriptor published. */
static void api_round(const char *socket, shmref_conn **a, shmref_conn **b, struct ctl *ctl, shmref_desc *ret)
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
    if (x)
        shmref_release(x);
    if (ok) {
        atomic_fetch_add(&ctl->api_ok, 1);
        return;
    }
    atomic_fetch_add(&ctl->api_err, 1);
    if (*a)
        shmref_close(*a);
    if (*b)
        shmref_close(*b);
    *a = *b = NULL;
}

/* raw_burst: acquires of random tokens (slots of any buffer) and of the attacker's own,
 * took, nudge and forget of buffer ids it guesses and of its own; then a ping, whose
 * answer drains the rest. */
static int raw_burst(struct raw *c, uint32_t *s, const shmref_desc *own)
{
    for (int i = 0; i < 16; i++) {
        struct proto_msg m = { .op = PROTO_OP_ACQUIRE };
        if (i == 0 && own->size)
            memcpy(m.u.acquire.token, own->token, PROTO_TOKEN_LEN);
        else
            rand_token(m.u.acquire.token, s, xorshift(s) % 64);
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_TOOK };
        m.u.took.buf_id = 1 + xorshift(s) % 256;
        if (i == 1 && own->size)
            memcpy(m.u.took.token, own->token, PROTO_TOKEN_LEN);
        else
            rand_token(m.u.took.token, s, xorshift(s) % 64);
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_NUDGE };
        m.u.nudge.buf_id = 1 + xorshift(s) % 256;
        raw_send(c, &m);
        m = (struct proto_msg){ .op = PROTO_OP_FORGET };
        m.u.forget.buf_id = 1 + xorshift(s) % 256;
        m.u.forget.writable = xorshift(s) & 1;
        raw_send(c, &m);
    }
    return raw_ping_drain(c);
}

static int attacker(void *p)
{
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
    shmref_conn *ca = NULL, *cb = NULL;
    for (uint64_t pass = 0; !atomic_load(&ctl->stop); pass++) {
        shmref_desc own = { .size = 0 };
        api_round(a->socket, &ca, &cb, ctl, &own);
        for (int i = 0; i < 2; i++)
            if (c.shared[i])
                scribble_region(c.shared[i], c.shared_len[i], &s, pass);
        unsigned dirs = 0;
        unsigned n = scribble_maps(&s, pass, &dirs);
        atomic_store(&ctl->regions, n);
        atomic_store(&ctl->scribbled_dirs, dirs);
        if (raw_burst(&c, &s, &own) < 0) {
            raw_close(&c);
            atomic_fetch_add(&ctl->reconnects, 1);
            if (raw_open(&c, a->socket) < 0)
                return 12;
        }
        atomic_fetch_add(&ctl->msgs, 65);
        atomic_fetch_add(&ctl->passes, 1);
        if (pass >= 2)
            atomic_store(&ctl->armed, 1);
    }
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
#define ATTACK_RATIO 5          /* the victim's median round trip under attack <= 5x its own baseline */

/* victim_series: round trips for at least ms and at least min of them (at most max);
 * their times (us) into t; returns how many. Every 50, the victim's charge (nothing held
 * between round trips) must read as `quiet` again. */
static uint64_t attacker_charged_max; /* the most uid OTHER_UID was charged at a check */

static int victim_series(struct victim *v, shmref_conn *st, long *t, int min, int max, long ms, struct charge quiet,
                         const char *when)
{
    long end_ms = now_ms() + ms;
    int i;
    for (i = 0; i < max && (i < min || now_ms() < end_ms); i++) {
        t[i] = victim_rt(v);
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

Test(handoff_attacks, a_uid_scribbling_on_everything_it_shares_harms_only_itself, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, "--socket-mode", "0666", NULL);
    shmref_conn *st = connect_ok(&d);
    cr_assert_eq(shmref_set_stock(st, 0), 0);
    struct victim v = { 0 };
    victim_open(&v, &d);
    static long base[RT_MAX], hit[RT_MAX];
    for (int i = 0; i < RT_WARM; i++)
        victim_rt(&v);
    struct charge quiet = charge_of(st, getuid());
    int nb = victim_series(&v, st, base, RT_N, RT_MAX, 2000, quiet, "baseline");

    struct ctl *ctl = ctl_new();
    struct attack_arg a = { .socket = d.socket, .ctl = ctl };
    pid_t pid = child_run(attacker, &a);
    long end = now_ms() + 60000;
    while (!atomic_load(&ctl->armed) && now_ms() < end && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(2000);
    cr_assert(atomic_load(&ctl->armed), "the attacker never finished a pass (passes %llu)",
              (unsigned long long)atomic_load(&ctl->passes));
    uint64_t passes0 = atomic_load(&ctl->passes);
    int nh = victim_series(&v, st, hit, RT_N, RT_MAX, 4000, quiet, "under attack");
    struct charge att = charge_of(st, OTHER_UID);
    uint64_t passes = atomic_load(&ctl->passes) - passes0;
    cr_assert(daemon_alive(&d), "the daemon died");

    long b50 = pct(base, nb, 50), b99 = pct(base, nb, 99), h50 = pct(hit, nh, 50), h99 = pct(hit, nh, 99);
    printf("scribbler: victim round trip of %u KiB median %ld us (p99 %ld, %d of them) alone, %ld us (p99 %ld, %d) "
           "under attack (%.2fx; charged %llu bytes, %llu pinned, %llu buffers between round trips); the attacker "
           "made %llu passes meanwhile over %llu shared mappings (%llu directories), "
           "%llu raw messages in all, %llu own handoffs (%llu failed), %llu reconnects; uid %u charged %llu bytes, "
           "%llu buffers, %llu pinned at the end, at most %llu bytes at a check\n",
           RT_SIZE / 1024, b50, b99, nb, h50, h99, nh, (double)h50 / (double)b50, (unsigned long long)quiet.bytes,
           (unsigned long long)quiet.pinned, (unsigned long long)quiet.buffers, (unsigned long long)passes,
           (unsigned long long)atomic_load(&ctl->regions), (unsigned long long)atomic_load(&ctl->scribbled_dirs),
           (unsigned long long)atomic_load(&ctl->msgs), (unsigned long long)atomic_load(&ctl->api_ok),
           (unsigned long long)atomic_load(&ctl->api_err), (unsigned long long)atomic_load(&ctl->reconnects),
           OTHER_UID, (unsigned long long)att.bytes, (unsigned long long)att.buffers,
           (unsigned long long)att.pinned, (unsigned long long)attacker_charged_max);
    cr_assert_geq(passes, 20, "the attacker made only %llu passes during the victim's round trips",
                  (unsigned long long)passes);
    cr_assert_gt(attacker_charged_max, 0, "what the attacker held and pinned was charged to nobody");
    cr_assert_geq(atomic_load(&ctl->scribbled_dirs), 1, "the attacker found no shared directory to scribble on");
    cr_assert_leq(h50, ATTACK_RATIO * b50, "under attack the victim's median round trip took %ld us, %.1fx its "
                  "%ld us alone (bound %dx)", h50, (double)h50 / (double)b50, b50, ATTACK_RATIO);

    int ex = ctl_stop(ctl, pid);
    cr_assert_eq(ex, 0, "the attacker failed: %d (10-12: setup, 128+: a signal; 137 it did not stop within 20 s)",
                 ex);
    /* what the attacker held or pinned was its own, and goes with it */
    long t0 = now_ms();
    struct charge after;
    while ((after = charge_of(st, OTHER_UID)).bytes != 0 && now_ms() - t0 < 5000)
        usleep(2000);
    cr_assert_eq(after.bytes, 0, "uid %u still charged %llu bytes after it exited", OTHER_UID,
                 (unsigned long long)after.bytes);
    victim_series(&v, st, hit, 50, 50, 0, quiet, "after the attack");
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
    _Atomic uint64_t acquired, local, refused, bad_pages, rechecked, failed;
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
    shmref_close(c);
    return 0;
}

/* race_consumer: acquires the newest and older descriptors at random (some already
 * recycled: ENOENT), checks every page while it holds the buffer, and holds one in eight
 * a little longer and checks again at the end of the hold. */
static int race_consumer(void *p)
{
    struct race_arg *a = p;
    struct ring *r = a->r;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    shmref_conn *c;
    if (shmref_connect(a->socket, &c) < 0)
        return 101;
    shmref_set_acquire_wait(c, 0); /* a descriptor whose buffer went is ENOENT at once */
    uint32_t s = (uint32_t)getpid() | 1;
    while (!atomic_load(&r->stop)) {
        shmref_desc desc;
        uint64_t gen, seen = 0;
        if (!ring_get(r, xorshift(&s) % 4, &desc, &gen))
            continue;
        shmref_buf *b;
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
        atomic_fetch_add(&r->acquired, 1);
        unsigned bad = shmref_buf_size(b) == RACE_SIZE ? gen_bad(shmref_buf_data(b), gen, &seen) : RACE_SIZE / PAGE;
        if ((xorshift(&s) & 7) == 0) {
            usleep(300);
            bad += gen_bad(shmref_buf_data(b), gen, &seen);
            atomic_fetch_add(&r->rechecked, 1);
        }
        if (bad) {
            fprintf(stderr, "consumer: %u pages under the token of generation %llu are not its own (one is of "
                    "generation %llu)\n", bad, (unsigned long long)gen, (unsigned long long)seen);
            atomic_fetch_add(&r->bad_pages, bad);
        }
        shmref_release(b);
    }
    uint64_t local = 0;
    if (shmref_conn_counter(c, "ledger_acquires", &local) == 0)
        atomic_fetch_add(&r->local, local);
    shmref_close(c);
    return 0;
}

Test(handoff_attacks, consumers_racing_recycles_for_10s_never_read_another_generation, .timeout = 300)
{
    struct daemon d;
    daemon_start(&d, NULL);
    struct ring *r = mmap(NULL, sizeof(*r), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(r, MAP_FAILED);
    memset(r, 0, sizeof(*r));
    struct race_arg a = { .socket = d.socket, .r = r };
    pid_t prod = child_run(race_producer, &a), cons[NCONS];
    for (int i = 0; i < NCONS; i++)
        cons[i] = child_run(race_consumer, &a);
    const char *e = getenv("SHMREF_RACE_SECONDS");
    long secs = e && *e ? atol(e) : 10;
    long end = now_ms() + secs * 1000;
    while (now_ms() < end && atomic_load(&r->bad_pages) == 0 && atomic_load(&r->failed) == 0)
        usleep(10000);
    atomic_store(&r->stop, 1);
    cr_assert_eq(child_wait(prod), 0, "the producer failed");
    for (int i = 0; i < NCONS; i++)
        cr_assert_eq(child_wait(cons[i]), 0, "a consumer failed");
    uint64_t acquired = atomic_load(&r->acquired), local = atomic_load(&r->local);
    printf("race, %ld s: %llu generations published; %llu acquires (%llu of them local), %llu refused (ENOENT), "
           "%llu held longer and checked again; %llu pages of another generation\n", secs,
           (unsigned long long)atomic_load(&r->head), (unsigned long long)acquired, (unsigned long long)local,
           (unsigned long long)atomic_load(&r->refused), (unsigned long long)atomic_load(&r->rechecked),
           (unsigned long long)atomic_load(&r->bad_pages));
    cr_assert_eq(atomic_load(&r->bad_pages), 0, "%llu pages read under a token were of another generation",
                 (unsigned long long)atomic_load(&r->bad_pages));
    cr_assert_gt(atomic_load(&r->head), 1000, "the producer published only %llu generations",
                 (unsigned long long)atomic_load(&r->head));
    cr_assert_gt(acquired, 1000, "only %llu acquires: the race was not run", (unsigned long long)acquired);
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
    uint64_t local;         /* a: 1 if the acquire went through the ledger (counter ledger_acquires) */
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
            ack.rc = shmref_lease(c, RT_SIZE, &b);
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
            shmref_conn_counter(c, "ledger_acquires", &before);
            ack.rc = shmref_acquire(c, &desc, &b);
            if (ack.rc == 0 && victim_check(shmref_buf_data(b), 7) != -1)
                ack.rc = -EBADMSG;
            shmref_conn_counter(c, "ledger_acquires", &after);
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

/* leased: the pool's bytes held by anyone (leases, retention, buffers the daemon waits
 * to get back from same-tenant holders). */
static uint64_t leased(shmref_conn *st)
{
    shmref_status *s;
    uint64_t v = 0;
    cr_assert_eq(shmref_status_get(st, &s), 0, "status: %s", shmref_errmsg(st));
    cr_assert_eq(shmref_status_u64(s, "pool.bytes_leased", &v), 0);
    shmref_status_free(s);
    return v;
}

/* A scenario: the steps of one handoff up to a boundary, who is killed there (P the
 * producer, C the consumer, B both), then what the survivor still does (release what it
 * holds: a normal step). P: l lease, f fill, p publish; C: h gets the descriptor, a
 * acquires (through the ledger: it maps the buffer since the warm-up); r releases. */
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

/* one_scenario: returns the microseconds from the kill (the child reaped, and the
 * survivor's own release answered) to the buffer back in the pool; *ret_local: acquires
 * that went through the ledger. */
static long one_scenario(const struct daemon *d, shmref_conn *st, const struct scenario *sc, uint64_t *ret_local)
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
    long end = now_ms() + 5000;
    while (leased(st) != 0 && now_ms() < end)
        usleep(500);
    cr_assert_eq(leased(st), 0, "the warm-up's buffer did not come back");
    for (const char *s = sc->steps; *s; s += 2) {
        struct stepper *k = s[0] == 'P' ? &P : &C;
        struct step_ack a = step(k, s[1], s[1] == 'h' ? &pub.desc : NULL);
        if (s[1] == 'p')
            pub = a;
        *ret_local += a.local;
    }
    cr_assert_gt(leased(st), 0, "scenario %s: the buffer was back before the kill", sc->steps);
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
    uint64_t v;
    long t1;
    while ((v = leased(st)) != 0 && (t1 = now_us()) - t0 < 2000000)
        ;
    t1 = now_us();
    cr_assert_eq(v, 0, "scenario %s, %c killed: %llu bytes still held after %ld ms", sc->steps, sc->kill,
                 (unsigned long long)v, (t1 - t0) / 1000);
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
    static long t[NSCEN * REPEAT];
    long worst[NSCEN] = { 0 };
    uint64_t local = 0;
    for (int r = 0; r < REPEAT; r++)
        for (unsigned i = 0; i < NSCEN; i++) {
            long us = one_scenario(&d, st, &scenarios[i], &local);
            t[r * NSCEN + i] = us;
            worst[i] = us > worst[i] ? us : worst[i];
        }
    for (unsigned i = 0; i < NSCEN; i++)
        printf("reclaim after SIGKILL of %c after %-12s (then %-2s): worst of %d %6.2f ms\n", scenarios[i].kill,
               scenarios[i].steps, scenarios[i].after, REPEAT, worst[i] / 1000.0);
    long med = pct(t, NSCEN * REPEAT, 50), max = pct(t, NSCEN * REPEAT, 100);
    printf("reclaim after SIGKILL: median %.2f ms, max %.2f ms over %zu kills; %llu of the consumers' acquires "
           "went through the ledger\n", med / 1000.0, max / 1000.0, NSCEN * REPEAT, (unsigned long long)local);
    cr_assert_leq(med, RECLAIM_MEDIAN_MS * 1000 * (SANITIZED ? 3 : 1),
                  "the median time from a SIGKILL to the buffer back was %.2f ms (bound %d ms)", med / 1000.0,
                  RECLAIM_MEDIAN_MS * (SANITIZED ? 3 : 1));
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
 * random per message ((5)). */
enum flood_kind { F_LEASE, F_ACQUIRE, F_RELEASE, F_TOOK, F_NUDGE, F_FORGET, F_STATUS, F_PING, F_KINDS, F_MIX = F_KINDS };

static const char *const flood_name[F_KINDS] = {
    "lease", "acquire of a bad token", "release of an unknown handle", "took", "nudge", "forget", "status", "ping",
};

struct flood_arg {
    const char *socket;
    struct ctl *ctl;
    enum flood_kind kind;
    bool unniced;           /* keeps the test's priority (a niced flooder may barely run) */
};

/* flood_msg: one request of kind k, its fields random where the daemon must not trust
 * them. */
static void flood_msg(struct proto_msg *m, enum flood_kind k, uint32_t *s)
{
    static const uint32_t op[F_KINDS] = { PROTO_OP_LEASE, PROTO_OP_ACQUIRE, PROTO_OP_RELEASE, PROTO_OP_TOOK,
                                          PROTO_OP_NUDGE, PROTO_OP_FORGET, PROTO_OP_STATUS, PROTO_OP_PING };
    static const enum flood_kind mix[] = { F_LEASE, F_ACQUIRE, F_STATUS };
    if (k == F_MIX)
        k = mix[xorshift(s) % 3];
    *m = (struct proto_msg){ .op = op[k] };
    switch (k) {
    case F_LEASE:
        m->u.lease.size = PAGE << (xorshift(s) % 5);
        break;
    case F_ACQUIRE:
        rand_token(m->u.acquire.token, s, xorshift(s) % 128);
        break;
    case F_RELEASE:
        m->u.release.handle = (uint64_t)xorshift(s) << 32 | xorshift(s);
        break;
    case F_TOOK:
        m->u.took.buf_id = 1 + xorshift(s) % 256;
        rand_token(m->u.took.token, s, xorshift(s) % 128);
        break;
    case F_NUDGE:
        m->u.nudge.buf_id = 1 + xorshift(s) % 256;
        break;
    case F_FORGET:
        m->u.forget.buf_id = 1 + xorshift(s) % 256;
        m->u.forget.writable = xorshift(s) & 1;
        break;
    default:
        break;
    }
}

/* flooder: uid OTHER_UID sends its kind in bursts of 64, each closed by a ping, keeping
 * two bursts in flight (the daemon always has the next one to read while the flooder
 * reads the answers to the last), as fast as the daemon answers. Its sends never block:
 * a send the daemon is not reading for (it stops reading a connection whose replies with
 * fds are unread) ends the burst, and the flooder reads. Leases it is granted it releases
 * once it read everything before them; it connects again if the daemon closes it. */
static int flooder(void *p)
{
    struct flood_arg *a = p;
    struct ctl *ctl = a->ctl;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    unmap_inherited();
    if ((!a->unniced && setpriority(PRIO_PROCESS, 0, 10) < 0) || become(OTHER_UID) < 0) /* as the attacker of (1) */
        return 10;
    uint32_t s = (uint32_t)getpid() * 2654435761u | 1;
    struct raw c = { .sock = -1 };
    uint32_t inflight[2];
    unsigned n = 0;
    while (!atomic_load(&ctl->stop)) {
        if (n == 0 && c.sock < 0) {
            if (raw_open(&c, a->socket) < 0)
                return 11;
            fcntl(c.sock, F_SETFL, fcntl(c.sock, F_GETFL) | O_NONBLOCK);
        }
        int sent = 0, e = 0;
        while (sent < 64 && e == 0) {
            struct proto_msg m;
            flood_msg(&m, a->kind, &s);
            if ((e = raw_send(&c, &m)) == 0)
                sent++;
        }
        struct proto_msg ping = { .op = PROTO_OP_PING };
        if (e == 0 && raw_send(&c, &ping) == 0)
            inflight[n++] = ping.id;
        atomic_fetch_add(&ctl->msgs, (uint64_t)sent);
        if (n == 2 || (n == 1 && e != 0)) {
            if (raw_drain(&c, inflight[0]) < 0) {
                raw_close(&c);
                n = 0;
                atomic_fetch_add(&ctl->reconnects, 1);
                continue;
            }
            inflight[0] = inflight[1];
            n--;
        } else if (n == 0 && e != 0 && raw_drain(&c, 0) < 0) { /* no ping went: read what came */
            raw_close(&c);
            atomic_fetch_add(&ctl->reconnects, 1);
            continue;
        }
        atomic_fetch_add(&ctl->passes, 1);
        atomic_store(&ctl->armed, 1);
    }
    raw_close(&c);
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
/* Another uid's median ping and round trip under a flood <= 10x its own baseline. The
 * daemon serves up to 64 messages of one connection per turn (transport.c), so a ping
 * (13 us alone) may wait for a turn of the flooder's kind: measured 0.9-3.1x for every
 * kind, 8x once for a flood of status (about 30 us each) with a flooder that kept one
 * burst in flight; a nudge made to cost the daemon 100 us: 1,650x. */
#define FLOOD_RATIO 10
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
    uint64_t sent, reconnects;
};

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
    munmap(ctl, sizeof(*ctl));
    r.f50 = pct(pf, PINGS, 50);
    r.f99 = pct(pf, PINGS, 99);
    r.g50 = pct(rf, r.nf, 50);
    printf("flood of %-28s %8llu messages in %ld ms (%llu reconnects): root's ping median %ld us against %ld "
           "(%.2fx, p99 %ld), round trip median %ld us against %ld (%.2fx, %d of them); RssAnon %ld kB\n",
           flood_name[k], (unsigned long long)r.sent, r.ms, (unsigned long long)r.reconnects, r.f50, r.p50,
           (double)r.f50 / (double)r.p50, r.f99, r.g50, r.r50, (double)r.g50 / (double)r.r50, r.nf, r.rss);
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
    long rss0 = rss_anon_kb(d.pid), rss_max = rss0;
    for (int k = 0; k < F_KINDS; k++) {
        struct flood_result r = flood_once(&d, fd, &v, st, quiet, (enum flood_kind)k);
        if (!flood_ok(&r)) { /* past the bound once: measured again before it counts (a busy machine) */
            printf("flood of %s: past %dx once; again\n", flood_name[k], FLOOD_RATIO);
            r = flood_once(&d, fd, &v, st, quiet, (enum flood_kind)k);
        }
        rss_max = r.rss > rss_max ? r.rss : rss_max;
        cr_assert_leq(r.f50, FLOOD_RATIO * r.p50, "under a flood of %s root's median ping took %ld us, %.1fx its "
                      "%ld us alone (bound %dx), twice", flood_name[k], r.f50, (double)r.f50 / (double)r.p50, r.p50,
                      FLOOD_RATIO);
        cr_assert_leq(r.g50, FLOOD_RATIO * r.r50, "under a flood of %s root's median round trip took %ld us, %.1fx "
                      "its %ld us alone (bound %dx), twice", flood_name[k], r.g50, (double)r.g50 / (double)r.r50,
                      r.r50, FLOOD_RATIO);
    }
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
