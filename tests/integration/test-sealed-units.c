/* SPDX-License-Identifier: MIT */
/* test-sealed-units.c: units of work across uids (issue 17 item 6). A hostile producer of
 * another uid (65534) publishes a unit, keeps an O_RDWR fd of its buffer, and rewrites
 * every byte (offsets buffers included) after the consumer (root) has checked the
 * manifest. Sealed: every way to write fails at the producer (EPERM) and the consumer
 * reads the original values. Not sealed: the consumer refuses the unit (-EPERM) unless it
 * says it trusts the producer, and then the rewrite does reach its mapping (why the
 * refusal exists). A unit of the consumer's own uid is taken unsealed; a consumer may ask
 * for sealed; libshmref's own sealed publish of a unit, and a forked child's writable
 * copy of the mapping (EBUSY). */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "arrow-data.h"
#include "harness.h"
#include "proto.h"
#include "rawclient.h"

#define ROWS 37
#define OTHER_UID 65534
#define WAIT_MS 5000

static struct daemon d;

static void start(void) { daemon_start(&d, "--memfd", "--socket-mode", "0666", NULL); }
static void stop(void)
{
    reap_children(); /* a hostile producer still waiting for its go, after a failed assertion */
    daemon_stop(&d);
}

TestSuite(sealed_units, .init = start, .fini = stop, .timeout = 120);

/* ---- the hostile producer (a child process of another uid) ---- */

/* raw_call: send m, wait for its reply (decoded into *rep from buf); its fd to *ret_fd. */
static int raw_call(int sock, const struct proto_msg *m, uint8_t *buf, size_t cap, struct proto_msg *rep, int *ret_fd)
{
    const char *why = "";
    int len = proto_encode(m, buf, cap);
    if (len <= 0 || rawclient_send(sock, buf, (size_t)len) < 0)
        return -1;
    struct pollfd p = { .fd = sock, .events = POLLIN };
    if (poll(&p, 1, WAIT_MS) <= 0)
        return -1;
    ssize_t n = rawclient_recv(sock, buf, cap, ret_fd);
    if (n <= 0 || proto_decode(buf, (size_t)n, PROTO_MAX_REPLY, rep, &why) < 0)
        return -1;
    return rep->op == PROTO_OP_ERROR ? -(int)rep->u.error.code : 0;
}

enum { WROTE = 1, MAPPED_RW = 2, MPROTECTED = 4 };

struct hostile {
    bool sealed;    /* publish with PROTO_PUBLISH_SEALED */
    int out;        /* the descriptor's text goes here */
    int go;         /* a byte here: rewrite now */
};

/* rewrite: every way a holder of an O_RDWR fd changes the bytes; the mask of those that
 * worked. Each one that fails must fail with EPERM (the seal), else 64 is added. */
static int rewrite(int fd, size_t size)
{
    int done = 0;
    uint8_t *junk = malloc(size);
    memset(junk, 0xff, size); /* offsets of 2^32-1: far outside any mapping */
    if (pwrite(fd, junk, size, 0) == (ssize_t)size)
        done |= WROTE;
    else if (errno != EPERM)
        done |= 64;
    free(junk);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
        done |= MAPPED_RW;
        munmap(p, size);
    } else if (errno != EPERM) {
        done |= 64;
    }
    p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return done | 64;
    if (mprotect(p, size, PROT_READ | PROT_WRITE) == 0)
        done |= MPROTECTED; /* (EACCES when the mapping may not become writable) */
    munmap(p, size);
    return done;
}

/* hostile_producer: builds a unit with libshmref (published plainly, acquired back for
 * its bytes and metadata), copies it into a raw lease whose O_RDWR fd it keeps, publishes
 * that (sealed or not), hands out the descriptor, and on "go" rewrites the buffer.
 * Returns the rewrite's mask, or 100+ for a failure of its own. */
static int hostile_producer(void *arg)
{
    struct hostile *h = arg;
    shmref_conn *c;
    shmref_unit *u;
    shmref_buf *b;
    shmref_desc d1, desc;
    struct ArrowSchema s;
    struct ArrowArray a;
    uint8_t buf[PROTO_MAX_REPLY];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 }, rep;
    int fd = -1;
    if (setgid(OTHER_UID) < 0 || setuid(OTHER_UID) < 0)
        return 100;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    t_batch(ROWS, 0, 0, 0, &s, &a);
    if (shmref_unit_import_array(c, &s, &a, &u) < 0 || shmref_unit_publish(u, 0, &d1) < 0)
        return 102;
    a.release(&a);
    s.release(&s);
    if (shmref_acquire(c, &d1, &b) < 0) /* the unit's bytes and metadata */
        return 103;
    size_t mlen;
    const void *meta = shmref_buf_meta(b, &mlen);

    int sock = rawclient_connect(d.socket);
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.name = "hostile";
    m.u.hello.name_len = 7;
    if (sock < 0 || raw_call(sock, &m, buf, sizeof(buf), &rep, NULL) < 0)
        return 104;
    m = (struct proto_msg){ .op = PROTO_OP_LEASE, .id = 2 };
    m.u.lease.size = d1.size;
    if (raw_call(sock, &m, buf, sizeof(buf), &rep, &fd) < 0 || fd < 0)
        return 105;
    uint64_t handle = rep.u.lease_reply.handle;
    if (pwrite(fd, shmref_buf_data(b), d1.size, 0) != (ssize_t)d1.size)
        return 106;
    m = (struct proto_msg){ .op = PROTO_OP_PUBLISH, .id = 3 };
    m.u.publish.handle = handle;
    m.u.publish.size = d1.size;
    m.u.publish.keep_ms = 60000;
    m.u.publish.meta = meta;
    m.u.publish.meta_len = (uint32_t)mlen;
    m.u.publish.flags = h->sealed ? PROTO_PUBLISH_SEALED : 0;
    if (raw_call(sock, &m, buf, sizeof(buf), &rep, NULL) < 0)
        return 107;
    memcpy(desc.token, rep.u.publish_reply.token, SHMREF_TOKEN_LEN);
    desc.size = rep.u.publish_reply.size;
    char text[SHMREF_DESC_TEXT_MAX];
    shmref_desc_to_text(&desc, text, sizeof(text));
    if (write(h->out, text, strlen(text) + 1) < 0)
        return 108;
    char go;
    struct pollfd pf = { .fd = h->go, .events = POLLIN };
    if (poll(&pf, 1, 60000) != 1 || read(h->go, &go, 1) != 1)
        return 109;
    int done = rewrite(fd, (size_t)d1.size);
    close(fd);
    close(sock);
    shmref_release(b);
    shmref_unit_release(u);
    shmref_close(c);
    return done;
}

struct running {
    pid_t pid;
    int go;
    shmref_desc desc;
};

static struct running hostile_start(bool sealed)
{
    int out[2], go[2];
    char text[SHMREF_DESC_TEXT_MAX] = "";
    cr_assert_eq(pipe(out), 0);
    cr_assert_eq(pipe(go), 0);
    struct hostile h = { sealed, out[1], go[0] };
    struct running r = { .pid = child_run(hostile_producer, &h), .go = go[1] };
    close(out[1]);
    close(go[0]);
    ssize_t n = read(out[0], text, sizeof(text) - 1);
    close(out[0]);
    if (n <= 0)
        cr_assert_fail("the hostile producer failed: exit %d", child_wait(r.pid));
    cr_assert_eq(shmref_desc_from_text(text, &r.desc), 0);
    return r;
}

/* hostile_rewrite: tell the producer to rewrite now; the mask of what worked. */
static int hostile_rewrite(struct running *r)
{
    cr_assert_eq(write(r->go, "g", 1), 1);
    close(r->go);
    return child_wait(r->pid);
}

/* expect_values: the unit's batch, exported, holds t_batch's values. */
static void expect_values(shmref_unit *u)
{
    struct ArrowSchema s, bs;
    struct ArrowArray a, b;
    int n = t_batch(ROWS, 0, 0, 0, &s, &a);
    cr_assert_eq(shmref_unit_export_batch(u, 0, &bs, &b), 0);
    cr_assert_eq(b.n_children, n);
    for (int i = 0; i < n; i++)
        t_expect_column(s.children[i], a.children[i], 0, ROWS, bs.children[i], b.children[i]);
    cr_assert_gt(t_inside(&bs, &b, shmref_unit_data(u), shmref_unit_size(u)), 0, "zero-copy from the mapping");
    b.release(&b);
    bs.release(&bs);
    a.release(&a);
    s.release(&s);
}

Test(sealed_units, a_sealed_unit_cannot_be_rewritten_by_its_producer)
{
    struct running r = hostile_start(true);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    int rc = shmref_unit_acquire(c, &r.desc, &u);
    cr_assert_eq(rc, 0, "another uid's sealed unit is taken without any flag: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_sealed(u), 1);
    size_t size = shmref_unit_size(u);
    uint8_t *before = malloc(size);
    memcpy(before, shmref_unit_data(u), size);
    expect_values(u);

    int done = hostile_rewrite(&r);
    cr_assert_eq(done, 0, "the producer changed its sealed unit (mask %d: 1 pwrite, 2 writable mmap, 4 mprotect, "
                 "64 a failure other than EPERM, 100+ setup)", done);
    cr_assert_eq(memcmp(before, shmref_unit_data(u), size), 0, "the consumer's bytes changed");
    expect_values(u);
    free(before);
    shmref_unit_release(u);
    shmref_close(c);
}

Test(sealed_units, another_uids_unsealed_unit_is_refused_unless_trusted)
{
    struct running r = hostile_start(false);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = NULL;
    cr_assert_eq(shmref_unit_acquire(c, &r.desc, &u), -EPERM, "another uid's unsealed unit is refused");
    cr_assert_null(u);
    cr_assert(strstr(shmref_errmsg(c), "not sealed") && strstr(shmref_errmsg(c), "SHMREF_ACQUIRE_TRUST_PRODUCER"),
              "the message says why and what to do: %s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_acquire_ex(c, &r.desc, SHMREF_ACQUIRE_SEALED, &u), -EPERM);
    cr_assert_eq(shmref_ping(c), 0, "the connection stays usable");

    cr_assert_eq(shmref_unit_acquire_ex(c, &r.desc, SHMREF_ACQUIRE_TRUST_PRODUCER, &u), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_sealed(u), 0);
    expect_values(u);
    size_t size = shmref_unit_size(u);
    uint8_t *before = malloc(size);
    memcpy(before, shmref_unit_data(u), size);
    /* What trusting means: the producer can still rewrite what was checked. */
    int done = hostile_rewrite(&r);
    cr_assert_eq(done & WROTE, WROTE, "an unsealed unit's producer can write it (mask %d)", done);
    cr_assert_neq(memcmp(before, shmref_unit_data(u), size), 0, "and the consumer's mapping sees it");
    free(before);
    shmref_unit_release(u);
    shmref_close(c);
}

/* ---- producers through libshmref ---- */

struct plain_prod {
    uid_t uid;
    unsigned flags;
    int out;
};

static int libshmref_producer(void *arg)
{
    struct plain_prod *p = arg;
    shmref_conn *c;
    shmref_unit *u;
    shmref_desc desc;
    struct ArrowSchema s;
    struct ArrowArray a;
    if (p->uid && (setgid(p->uid) < 0 || setuid(p->uid) < 0))
        return 100;
    if (shmref_connect(d.socket, &c) < 0)
        return 101;
    t_batch(ROWS, 0, 0, 0, &s, &a);
    if (shmref_unit_import_array(c, &s, &a, &u) < 0)
        return 102;
    a.release(&a);
    s.release(&s);
    if (shmref_unit_publish_ex(u, 60000, 0, p->flags, &desc) < 0) {
        fprintf(stderr, "publish: %s\n", shmref_errmsg(c));
        return 103;
    }
    if (shmref_unit_sealed(u) != !!(p->flags & SHMREF_PUBLISH_SEALED))
        return 104;
    if ((p->flags & SHMREF_PUBLISH_SEALED) && shmref_unit_data(u) != NULL)
        return 105; /* the writable mapping is gone */
    char text[SHMREF_DESC_TEXT_MAX];
    shmref_desc_to_text(&desc, text, sizeof(text));
    if (write(p->out, text, strlen(text) + 1) < 0)
        return 106;
    shmref_unit_release(u);
    shmref_close(c);
    return 0;
}

static shmref_desc produce(uid_t uid, unsigned flags)
{
    int fds[2];
    char text[SHMREF_DESC_TEXT_MAX] = "";
    cr_assert_eq(pipe(fds), 0);
    struct plain_prod p = { uid, flags, fds[1] };
    pid_t pid = child_run(libshmref_producer, &p);
    close(fds[1]);
    ssize_t n = read(fds[0], text, sizeof(text) - 1);
    close(fds[0]);
    cr_assert_eq(child_wait(pid), 0, "the producer failed");
    cr_assert_gt(n, 0);
    shmref_desc desc;
    cr_assert_eq(shmref_desc_from_text(text, &desc), 0);
    return desc;
}

Test(sealed_units, libshmref_publishes_a_unit_sealed_for_another_uid)
{
    shmref_desc desc = produce(OTHER_UID, SHMREF_PUBLISH_SEALED);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    cr_assert_eq(shmref_unit_acquire_ex(c, &desc, SHMREF_ACQUIRE_SEALED, &u), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_sealed(u), 1);
    expect_values(u);
    shmref_unit_release(u);
    shmref_close(c);
}

Test(sealed_units, same_uid_unsealed_units_stay_allowed)
{
    shmref_desc desc = produce(0, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    cr_assert_eq(shmref_unit_acquire(c, &desc, &u), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_sealed(u), 0);
    expect_values(u);
    shmref_unit_release(u);
    /* a consumer that asks for sealed refuses it all the same */
    u = NULL;
    cr_assert_eq(shmref_unit_acquire_ex(c, &desc, SHMREF_ACQUIRE_SEALED, &u), -EPERM);
    cr_assert_null(u);
    cr_assert_eq(shmref_unit_acquire_ex(c, &desc, 1u << 7, &u), -EINVAL, "unknown flags");
    shmref_close(c);
}

/* A forked child keeps a writable copy of the producer's mapping: the seal cannot hold
 * (EBUSY), and the unit can only be released afterwards. */
Test(sealed_units, a_writable_mapping_left_in_a_child_makes_the_sealed_publish_ebusy)
{
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    shmref_desc desc;
    void *p;
    cr_assert_eq(shmref_unit_begin(c, 4096, &u), 0);
    cr_assert_eq(shmref_unit_claim(u, 64, NULL, &p), 0);
    int hold[2];
    cr_assert_eq(pipe(hold), 0);
    pid_t pid = fork();
    if (pid == 0) { /* keeps the MAP_SHARED writable mapping until the pipe closes */
        char x;
        close(hold[1]);
        _exit(read(hold[0], &x, 1) < 0);
    }
    close(hold[0]);
    cr_assert_eq(shmref_unit_add_buffers(u, "x", "l", 0, 8, 0, 2, (uint64_t[]){ 0, 0 }, (uint64_t[]){ 0, 64 }), 0,
                 "%s", shmref_errmsg(c));
    int r = shmref_unit_publish_ex(u, 0, 0, SHMREF_PUBLISH_SEALED, &desc);
    close(hold[1]);
    waitpid(pid, NULL, 0);
    cr_assert_eq(r, -EBUSY, "%d: %s", r, shmref_errmsg(c));
    cr_assert_null(shmref_unit_data(u));
    cr_assert_eq(shmref_unit_claim(u, 64, NULL, &p), -EPERM, "nothing is written into a mapping that is gone");
    cr_assert_eq(shmref_unit_publish_ex(u, 0, 0, SHMREF_PUBLISH_SEALED, &desc), -EPERM);
    cr_assert_eq(shmref_unit_release(u), 0);
    cr_assert_eq(shmref_ping(c), 0);
    shmref_close(c);
}
