/* SPDX-License-Identifier: MIT */
/* test-arrow.c: units of work and the Arrow C Data Interface against a real shmrefd:
 * every type round-trips from a producer process (another uid) to a consumer process,
 * value by value; slices; streams; zero-copy (every exported buffer lies in the
 * consumer's mapping); the last release drops the consumer's reference (buffers.leases: the producer's
 * retention, which now fans out, may keep the buffer live until keep_ms), also after
 * shmref_close; in-place producers; 10,000 columns (manifest in the buffer); every
 * hostile-manifest check refused with -EBADMSG and its message; the example of docs/arrow.md. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arrow-data.h"
#include "harness.h"
#include "manifest.h"

#include "arrow-example.c"

#define ROWS 37

static struct daemon d;

static void start(void) { daemon_start(&d, "--socket-mode", "0666", NULL); }
static void stop(void) { daemon_stop(&d); }

TestSuite(arrow, .init = start, .fini = stop, .timeout = 120);

/* ---- a test stream over batches of t_batch ---- */

struct tstream {
    int next, n;
};

static int ts_schema(struct ArrowArrayStream *st, struct ArrowSchema *out)
{
    struct ArrowArray a;
    (void)st;
    t_batch(ROWS, 0, 0, 0, out, &a);
    a.release(&a);
    return 0;
}

static int ts_next(struct ArrowArrayStream *st, struct ArrowArray *out)
{
    struct tstream *p = st->private_data;
    struct ArrowSchema s;
    if (p->next == p->n) {
        memset(out, 0, sizeof(*out));
        return 0;
    }
    t_batch(ROWS, 9 * p->next, 1, 100 * p->next, &s, out); /* each batch sliced differently */
    s.release(&s);
    p->next++;
    return 0;
}

static const char *ts_error(struct ArrowArrayStream *st) { (void)st; return NULL; }

static void ts_release(struct ArrowArrayStream *st)
{
    free(st->private_data);
    st->release = NULL;
}

static void t_stream(int n, struct ArrowArrayStream *out)
{
    struct tstream *p = calloc(1, sizeof(*p));
    p->n = n;
    *out = (struct ArrowArrayStream){ ts_schema, ts_next, ts_error, ts_release, p };
}

/* ---- the producer process ---- */

enum kind { BATCH, SLICED, STREAM };

struct prod {
    enum kind kind;
    uid_t uid;
    int fd;           /* the descriptor's text goes here */
};

static int producer(void *p)
{
    struct prod *a = p;
    shmref_conn *c;
    shmref_unit *u;
    shmref_desc desc;
    struct ArrowSchema s;
    struct ArrowArray arr;
    struct ArrowArrayStream st;
    char text[SHMREF_DESC_TEXT_MAX];
    int r;
    if (a->uid && (setgid(a->uid) < 0 || setuid(a->uid) < 0))
        return 20;
    if (shmref_connect(d.socket, &c) < 0)
        return 10;
    switch (a->kind) {
    case BATCH:
    case SLICED:
        if (a->kind == BATCH)
            t_batch(ROWS, 0, 0, 0, &s, &arr);
        else
            t_batch(ROWS, 3, 2, 0, &s, &arr);
        r = shmref_unit_import_array(c, &s, &arr, &u);
        arr.release(&arr);
        s.release(&s);
        break;
    default:
        t_stream(3, &st);
        r = shmref_unit_import_stream(c, &st, &u);
        st.release(&st);
        break;
    }
    if (r < 0) {
        fprintf(stderr, "import: %s\n", shmref_errmsg(c));
        return 11;
    }
    if ((r = shmref_unit_publish(u, 30000, &desc)) < 0) {
        fprintf(stderr, "publish: %s\n", shmref_errmsg(c));
        return 12;
    }
    shmref_desc_to_text(&desc, text, sizeof(text));
    if (write(a->fd, text, strlen(text) + 1) < 0)
        return 13;
    shmref_unit_release(u);
    shmref_close(c);
    return 0;
}

/* produce: run a producer process (as uid), return its descriptor once it has exited. */
static shmref_desc produce(enum kind kind, uid_t uid)
{
    int fds[2];
    char text[SHMREF_DESC_TEXT_MAX] = "";
    cr_assert_eq(pipe(fds), 0);
    struct prod a = { kind, uid, fds[1] };
    pid_t pid = child_run(producer, &a);
    close(fds[1]);
    ssize_t n = read(fds[0], text, sizeof(text) - 1);
    close(fds[0]);
    cr_assert_eq(child_wait(pid), 0, "the producer failed");
    cr_assert_gt(n, 0);
    shmref_desc desc;
    cr_assert_eq(shmref_desc_from_text(text, &desc), 0);
    return desc;
}

/* acquire_ok: this suite's pool is a tmpfile one, where units cannot be sealed: the
 * consumer trusts its producers of another uid (test-sealed-units covers the refusal). */
static shmref_unit *acquire_ok(shmref_conn *c, const shmref_desc *desc)
{
    shmref_unit *u;
    int r = shmref_unit_acquire_ex(c, desc, SHMREF_ACQUIRE_TRUST_PRODUCER, &u);
    cr_assert_eq(r, 0, "unit_acquire: %s: %s", strerror(-r), shmref_errmsg(c));
    return u;
}

/* expect_batch: the exported batch b equals the original batch (rebuilt here). */
static void expect_batch(const void *base, size_t size, const struct ArrowSchema *bs, const struct ArrowArray *b, int64_t boff,
                         int64_t bcut, int seed)
{
    struct ArrowSchema s;
    struct ArrowArray a;
    int n = t_batch(ROWS, boff, bcut, seed, &s, &a);
    cr_assert_str_eq(bs->format, "+s");
    cr_assert(t_metadata_eq(s.metadata, bs->metadata), "the schema's metadata");
    cr_assert_eq(bs->n_children, n);
    cr_assert_eq(b->n_children, n);
    cr_assert_eq(b->length, a.length);
    for (int i = 0; i < n; i++)
        t_expect_column(s.children[i], a.children[i], a.offset, a.length, bs->children[i], b->children[i]);
    cr_assert_gt(t_inside(bs, b, base, size), 60, "zero-copy: buffers in the mapping");
    a.release(&a);
    s.release(&s);
}

Test(arrow, every_type_round_trips_between_processes_of_two_uids)
{
    shmref_desc desc = produce(BATCH, 65534);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    struct ArrowSchema s;
    struct ArrowArray a;
    int n = t_batch(ROWS, 0, 0, 0, &s, &a);
    cr_assert_eq(shmref_unit_n_batches(u), 1);
    cr_assert_eq(shmref_unit_n_columns(u), n);
    cr_assert_eq(shmref_unit_batch_length(u, 0), ROWS);
    /* by name and by index */
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(shmref_unit_column_name(u, i), s.children[i]->name);
        cr_assert_eq(shmref_unit_column_index(u, s.children[i]->name), i);
        struct ArrowSchema cs;
        struct ArrowArray ca;
        cr_assert_eq(shmref_unit_export_array(u, 0, i, &cs, &ca), 0, "%s", shmref_errmsg(c));
        t_expect_column(s.children[i], a.children[i], 0, ROWS, &cs, &ca);
        t_inside(&cs, &ca, shmref_unit_data(u), shmref_unit_size(u));
        ca.release(&ca);
        cs.release(&cs);
    }
    cr_assert_eq(shmref_unit_column_index(u, "nope"), -ENOENT);
    cr_assert_eq(shmref_unit_export_array(u, 1, 0, &s, &a), -EINVAL);
    /* the whole batch */
    struct ArrowSchema bs;
    struct ArrowArray b;
    cr_assert_eq(shmref_unit_export_batch(u, 0, &bs, &b), 0);
    expect_batch(shmref_unit_data(u), shmref_unit_size(u), &bs, &b, 0, 0, 0);
    /* time zones, decimals and flags travel in the schema */
    int ts = shmref_unit_column_index(u, "ts_ns_ny"), dec = shmref_unit_column_index(u, "dec256");
    cr_expect_str_eq(bs.children[ts]->format, "tsn:America/New_York");
    cr_expect_str_eq(bs.children[dec]->format, "d:76,20,256");
    cr_expect_eq(bs.children[0]->flags, ARROW_FLAG_NULLABLE);
    cr_expect_str_eq(bs.children[shmref_unit_column_index(u, "map")]->children[0]->children[0]->name, "key");
    b.release(&b);
    bs.release(&bs);
    a.release(&a);
    s.release(&s);
    shmref_unit_release(u);
    shmref_close(c);
}

/* max_offset: the largest array offset in the tree of a (children, dictionaries). */
static int64_t max_offset(const struct ArrowArray *a)
{
    int64_t m = a->offset;
    for (int64_t i = 0; i < a->n_children; i++) {
        int64_t c = max_offset(a->children[i]);
        m = c > m ? c : m;
    }
    if (a->dictionary) {
        int64_t c = max_offset(a->dictionary);
        m = c > m ? c : m;
    }
    return m;
}

Test(arrow, slices_are_copied_as_the_slice)
{
    shmref_desc desc = produce(SLICED, 0);
    shmref_desc whole = produce(BATCH, 0);
    cr_expect_lt(desc.size, whole.size, "a slice of %d of %d rows takes %llu bytes, the whole %llu", ROWS - 5, ROWS,
                 (unsigned long long)desc.size, (unsigned long long)whole.size);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    struct ArrowSchema bs;
    struct ArrowArray b;
    cr_assert_eq(shmref_unit_export_batch(u, 0, &bs, &b), 0);
    cr_assert_eq(b.length, ROWS - 5);
    expect_batch(shmref_unit_data(u), shmref_unit_size(u), &bs, &b, 3, 2, 0);
    for (int64_t i = 0; i < b.n_children; i++)
        cr_expect_lt(max_offset(b.children[i]), 8, "%s: a copied slice keeps only its bit offset", bs.children[i]->name);
    b.release(&b);
    bs.release(&bs);
    shmref_unit_release(u);
    shmref_close(c);
}

Test(arrow, a_stream_round_trips_batch_by_batch)
{
    shmref_desc desc = produce(STREAM, 65534);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    cr_assert_eq(shmref_unit_n_batches(u), 3);
    struct ArrowArrayStream st;
    struct ArrowSchema s;
    cr_assert_eq(shmref_unit_export_stream(u, &st), 0);
    shmref_unit_release(u); /* the stream holds the unit */
    cr_assert_eq(st.get_schema(&st, &s), 0);
    for (int i = 0; i < 3; i++) {
        struct ArrowArray b;
        cr_assert_eq(st.get_next(&st, &b), 0);
        cr_assert_not_null(b.release, "batch %d", i);
        struct ArrowSchema one;
        struct ArrowArray orig;
        t_batch(ROWS, 9 * i, 1, 100 * i, &one, &orig);
        cr_assert_eq(b.length, orig.length);
        for (int64_t k = 0; k < s.n_children; k++) {
            t_expect_column(one.children[k], orig.children[k], orig.offset, orig.length, s.children[k], b.children[k]);
            cr_expect_lt(max_offset(b.children[k]), 8, "batch %d %s: only the slice was copied", i, s.children[k]->name);
        }
        orig.release(&orig);
        one.release(&one);
        b.release(&b);
    }
    struct ArrowArray end;
    cr_assert_eq(st.get_next(&st, &end), 0);
    cr_assert_null(end.release, "the stream ends after 3 batches");
    cr_assert_null(st.get_last_error(&st));
    s.release(&s);
    st.release(&st);
    shmref_close(c);
}

Test(arrow, the_last_release_returns_the_buffer_even_after_close)
{
    shmref_desc desc = produce(BATCH, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1);
    struct ArrowSchema bs, cs;
    struct ArrowArray b, col, moved, fromstream;
    struct ArrowArrayStream st;
    cr_assert_eq(shmref_unit_export_batch(u, 0, &bs, &b), 0);
    cr_assert_eq(shmref_unit_export_array(u, 0, 10, &cs, &col), 0);
    cr_assert_eq(shmref_unit_export_stream(u, &st), 0);
    cr_assert_eq(st.get_next(&st, &fromstream), 0);
    /* a consumer may move a child out and release it on its own */
    moved = *b.children[3];
    b.children[3]->release = NULL;
    const void *base = shmref_unit_data(u);
    size_t size = shmref_unit_size(u);
    shmref_unit_release(u);
    shmref_close(c);
    /* the daemon still holds the buffer for the exported structures: live and a lease */
    usleep(50000);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1, "closing the connection kept the buffer");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 1);
    /* and the bytes are still mapped and right */
    expect_batch(base, size, &bs, &fromstream, 0, 0, 0);
    b.release(&b);
    st.release(&st);
    col.release(&col);
    fromstream.release(&fromstream);
    usleep(50000);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1, "the moved child still holds it");
    moved.release(&moved);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0, "the last release gave the buffer back");
    cr_assert_eq(wait_status(&d, "clients_total", 1, 3000), 1, "the consumer's connection is closed (only status's own)");
    cs.release(&cs);
    bs.release(&bs);
}

/* A forked child that releases the last export it inherited (after the parent's
 * shmref_close) must not drop the parent's handle through the shared socket. */
Test(arrow, a_forked_child_releasing_inherited_exports_keeps_the_parents_buffer)
{
    shmref_desc desc = produce(BATCH, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    struct ArrowSchema cs;
    struct ArrowArray col;
    cr_assert_eq(shmref_unit_export_array(u, 0, 0, &cs, &col), 0);
    shmref_unit_release(u);
    shmref_close(c); /* the export alone keeps the buffer now */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        col.release(&col); /* the child's copy: its last export */
        cs.release(&cs);
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    usleep(50000);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1, "the child's release dropped the parent's buffer");
    cr_assert_eq(status_u64(&d, "buffers.leases"), 1);
    col.release(&col);
    cs.release(&cs);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0, "the parent's last release gave it back");
}

Test(arrow, on_an_open_connection_the_buffer_goes_back_after_unit_and_exports)
{
    shmref_desc desc = produce(BATCH, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    struct ArrowArray a;
    cr_assert_eq(shmref_unit_export_array(u, 0, 0, NULL, &a), 0);
    shmref_unit_release(u);
    cr_assert_eq(shmref_ping(c), 0);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1, "the exported array holds the buffer");
    a.release(&a);
    cr_assert_eq(shmref_ping(c), 0); /* releases are one-way: a round trip makes it done */
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    shmref_close(c);
}

static void no_release(struct ArrowArray *a) { a->release = NULL; }
static void no_release_schema(struct ArrowSchema *s) { s->release = NULL; }

Test(arrow, a_producer_writing_in_place_copies_nothing)
{
    enum { N = 100 };
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    cr_assert_eq(shmref_unit_begin(c, 1 << 20, &u), 0);
    uint64_t xo, oo, so;
    double *x;
    int32_t *offs;
    char *str;
    cr_assert_eq(shmref_unit_claim(u, N * 8, &xo, (void **)&x), 0);
    cr_assert_eq(shmref_unit_claim(u, (N + 1) * 4, &oo, (void **)&offs), 0);
    cr_assert_eq(shmref_unit_claim(u, N, &so, (void **)&str), 0);
    cr_assert_eq(xo % 64 + oo % 64 + so % 64, 0);
    for (int i = 0; i < N; i++) {
        x[i] = i * 1.5;
        offs[i] = i;
        str[i] = (char)('A' + i % 26);
    }
    offs[N] = N;
    uint64_t o2[2] = { 0, xo }, l2[2] = { 0, N * 8 };
    cr_assert_eq(shmref_unit_add_buffers(u, "x", "g", 0, N, 0, 2, o2, l2), 0, "%s", shmref_errmsg(c));
    /* an ArrowArray over the claimed ranges, as an Arrow-aware producer would build it */
    const void *bufs[3] = { NULL, offs, str };
    struct ArrowArray sa = { .length = N, .null_count = 0, .n_buffers = 3, .buffers = bufs, .release = no_release };
    struct ArrowSchema ss = { .format = "u", .name = "s", .release = no_release_schema };
    cr_assert_eq(shmref_unit_add_array(u, &ss, &sa), 0, "%s", shmref_errmsg(c));
    uint64_t bad_o[2] = { 0, 8 }, bad_l[2] = { 0, 8 };
    cr_assert_eq(shmref_unit_add_buffers(u, "y", "g", 0, 1, 0, 2, bad_o, bad_l), -EINVAL, "unaligned range refused");
    cr_assert_eq(shmref_unit_add_buffers(u, "y", "g", 0, 1, 0, 3, o2, l2), -EINVAL, "3 buffers for \"g\" refused");
    shmref_desc desc;
    cr_assert_eq(shmref_unit_publish(u, 0, &desc), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(desc.size, so + N, "published exactly the claims: nothing was copied");
    cr_assert_eq(shmref_unit_publish(u, 0, &desc), -EALREADY);

    shmref_conn *c2 = connect_ok(&d);
    shmref_unit *v = acquire_ok(c2, &desc);
    struct ArrowArray a;
    struct ArrowSchema s;
    cr_assert_eq(shmref_unit_export_array(v, 0, 1, &s, &a), 0);
    const uint8_t *base = shmref_unit_data(v);
    cr_assert_eq((const uint8_t *)a.buffers[1], base + oo, "offsets referenced where they were written");
    cr_assert_eq((const uint8_t *)a.buffers[2], base + so);
    cr_assert_eq(memcmp(a.buffers[2], "ABCDEFGHIJ", 10), 0);
    a.release(&a);
    s.release(&s);
    cr_assert_eq(shmref_unit_export_array(v, 0, 0, NULL, &a), 0);
    cr_assert_eq((const uint8_t *)a.buffers[1], base + xo);
    cr_assert(((const double *)a.buffers[1])[99] == 148.5);
    a.release(&a);
    shmref_unit_release(v);
    shmref_unit_release(u);
    shmref_close(c2);
    shmref_close(c);
}

Test(arrow, later_batches_must_match_the_first)
{
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u;
    uint64_t off;
    cr_assert_eq(shmref_unit_begin(c, 4096, &u), 0);
    cr_assert_eq(shmref_unit_claim(u, 64, &off, NULL), 0);
    uint64_t o[2] = { 0, off }, l[2] = { 0, 64 };
    cr_assert_eq(shmref_unit_add_buffers(u, "a", "l", 0, 8, 0, 2, o, l), 0);
    cr_assert_eq(shmref_unit_next_batch(u), 0);
    cr_assert_eq(shmref_unit_add_buffers(u, "a", "d:10,2,64", 0, 8, 0, 2, o, l), -EINVAL);
    cr_assert(strstr(shmref_errmsg(c), "is not the first batch's"), "%s", shmref_errmsg(c));
    shmref_desc desc;
    cr_assert_eq(shmref_unit_publish(u, 0, &desc), -EINVAL, "batch 1 has no columns");
    shmref_unit_release(u);
    cr_assert_eq(shmref_unit_claim(NULL, 1, NULL, NULL), -EINVAL);
    shmref_close(c);
}

static double secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

Test(arrow, ten_thousand_columns_keep_the_manifest_in_the_buffer)
{
    enum { N = 10000, R = 100 };
    struct ArrowSchema *cs[N];
    struct ArrowArray *ca[N];
    static struct ArrowSchema *csp[N];
    static struct ArrowArray *cap[N];
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "c%d", i);
        struct tcol col = t_fixed(name, "g", 8, R, 0, i);
        cs[i] = col.s;
        ca[i] = col.a;
    }
    memcpy(csp, cs, sizeof(cs));
    memcpy(cap, ca, sizeof(ca));
    struct ArrowSchema *s = t_schema("+s", "", 0, N, csp, NULL);
    struct ArrowArray *a = t_array(R, 0, 0, 1, NULL, NULL, NULL, N, cap, NULL);
    shmref_conn *c = connect_ok(&d), *c2 = connect_ok(&d);
    shmref_unit *u, *v;
    shmref_desc desc;
    double t0 = secs();
    cr_assert_eq(shmref_unit_import_array(c, s, a, &u), 0, "%s", shmref_errmsg(c));
    cr_assert_eq(shmref_unit_publish(u, 0, &desc), 0, "%s", shmref_errmsg(c));
    double t1 = secs();
    shmref_buf *raw;
    cr_assert_eq(shmref_acquire(c2, &desc, &raw), 0);
    size_t mlen;
    const char *meta = shmref_buf_meta(raw, &mlen);
    cr_assert(mlen < 100 && memmem(meta, mlen, "manifest_at", 11), "the manifest is in the buffer (%zu bytes of metadata)", mlen);
    shmref_release(raw);
    double t2 = secs();
    v = acquire_ok(c2, &desc);
    double t3 = secs();
    fprintf(stderr, "10,000 float64 columns of %d rows: import + publish %.1f ms, acquire (decode + check) %.1f ms, "
            "%llu bytes published\n", R, (t1 - t0) * 1e3, (t3 - t2) * 1e3, (unsigned long long)desc.size);
    cr_assert_eq(shmref_unit_n_columns(v), N);
    int k = shmref_unit_column_index(v, "c9999");
    cr_assert_eq(k, 9999);
    struct ArrowSchema es;
    struct ArrowArray ea;
    cr_assert_eq(shmref_unit_export_array(v, 0, k, &es, &ea), 0);
    t_expect_column(cs[9999], ca[9999], 0, R, &es, &ea);
    ea.release(&ea);
    es.release(&es);
    shmref_unit_release(v);
    shmref_unit_release(u);
    a->release(a);
    s->release(s);
    free(a);
    free(s);
    shmref_close(c2);
    shmref_close(c);
}

Test(arrow, the_readme_example_runs)
{
    char text[SHMREF_DESC_TEXT_MAX];
    cr_assert_eq(example_producer(d.socket, text, sizeof(text)), 0);
    cr_assert_eq(wait_status(&d, "buffers.retained", 1, 2000), 1);
    pid_t pid = fork();
    if (pid == 0) {
        double sum = example_consumer(d.socket, text);
        _exit(sum == 999 * 1000 / 4.0 ? 0 : 1); /* 0.5 * (0 + ... + 999) */
    }
    cr_assert_eq(child_wait(pid), 0);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0);
    /* and docs/arrow.md shows this very code */
    FILE *f = fopen(PROJECT_SOURCE_DIR "/docs/arrow.md", "r");
    FILE *g = fopen(PROJECT_SOURCE_DIR "/tests/integration/arrow-example.c", "r");
    cr_assert(f && g);
    static char readme[1 << 20], example[1 << 16];
    size_t rn = fread(readme, 1, sizeof(readme) - 1, f), en = fread(example, 1, sizeof(example) - 1, g);
    fclose(f);
    fclose(g);
    readme[rn] = example[en] = '\0';
    const char *from = strstr(example, "/* Producer:");
    cr_assert_not_null(from);
    cr_assert(strstr(readme, from), "docs/arrow.md must show tests/integration/arrow-example.c from \"/* Producer:\" on");
}

/* ---- hostile manifests ---- */

static struct manifest_field *hf(struct manifest *m, const char *name, const char *format, uint32_t nch,
                                 struct manifest_field *c0, struct manifest_field *c1)
{
    struct manifest_field *f = manifest_alloc(m, sizeof(*f));
    f->name = manifest_strndup(m, name, strlen(name));
    f->format = manifest_strndup(m, format, strlen(format));
    cr_assert_eq(manifest_type_parse(format, &f->type), 0);
    f->n_children = nch;
    f->children = manifest_alloc(m, 2 * sizeof(*f->children));
    f->children[0] = c0;
    f->children[1] = c1;
    return f;
}

static struct manifest_array *ha(struct manifest *m, int64_t len, int64_t nulls)
{
    struct manifest_array *a = manifest_alloc(m, sizeof(*a));
    a->length = len;
    a->null_count = nulls;
    a->children = manifest_alloc(m, 2 * sizeof(*a->children));
    return a;
}

static void hb(struct manifest_array *a, unsigned i, uint64_t off, uint64_t len)
{
    a->buffers[i] = (struct manifest_range){ off, len };
}

/* one column f/a in a batch of a->length rows */
static struct manifest *h1(struct manifest *m, struct manifest_field *f, struct manifest_array *a)
{
    m->n_columns = 1;
    m->columns = manifest_alloc(m, sizeof(*m->columns));
    m->columns[0] = f;
    manifest_add_batch(m, a->length)->columns[0] = a;
    return m;
}

struct hostile {
    shmref_conn *p, *c;
    shmref_buf *b;
    uint8_t *mem;
};

static void h_begin(struct hostile *h)
{
    cr_assert_eq(shmref_lease(h->p, 8192, &h->b), 0);
    h->mem = shmref_buf_data(h->b);
    memset(h->mem, 0, 8192);
}

/* h_expect: publish (meta, or m's inline envelope) and acquire: -EBADMSG with text. */
static void h_expect(struct hostile *h, struct manifest *m, const void *meta, size_t mlen, const char *text)
{
    uint8_t *bytes = NULL, *env = NULL;
    size_t blen, elen = mlen;
    if (m) {
        cr_assert_eq(manifest_encode(m, &bytes, &blen), 0);
        cr_assert_eq(manifest_envelope_inline(bytes, blen, &env, &elen), 0);
        meta = env;
        manifest_free(m);
    }
    shmref_desc desc;
    cr_assert_eq(shmref_publish(h->b, 8192, 0, meta, elen, &desc), 0, "%s", shmref_errmsg(h->p));
    shmref_unit *u = NULL;
    int r = shmref_unit_acquire(h->c, &desc, &u);
    cr_expect_eq(r, -EBADMSG, "acquire gave %d, wanted -EBADMSG for: %s", r, text);
    cr_expect(strstr(shmref_errmsg(h->c), text), "message \"%s\" lacks \"%s\"", shmref_errmsg(h->c), text);
    cr_expect_null(u);
    free(bytes);
    free(env);
    shmref_release(h->b);
}

Test(arrow, hostile_manifests_are_refused_naming_array_and_field)
{
    struct hostile h = { connect_ok(&d), connect_ok(&d), NULL, NULL };
    struct manifest *m;
    struct manifest_array *a;

    /* a buffer range outside the published bytes, misaligned, too short */
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 10, 0);
    hb(a, 1, 8192 - 64, 80);
    h_expect(&h, h1(m, hf(m, "x", "g", 0, NULL, NULL), a), NULL, 0,
             "batch 0 col0 (\"x\", format \"g\"): data buffer [8128, +80) lies outside the 8192 published bytes");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 10, 0);
    hb(a, 1, 96, 80);
    h_expect(&h, h1(m, hf(m, "x", "g", 0, NULL, NULL), a), NULL, 0, "data buffer offset 96 is not a multiple of 64");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 10, 0);
    a->offset = 2;
    hb(a, 1, 64, 80);
    h_expect(&h, h1(m, hf(m, "x", "g", 0, NULL, NULL), a), NULL, 0, "data buffer holds 80 bytes, offset + length need 96");

    /* validity: nulls without a bitmap, a bitmap too short */
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 10, 2);
    hb(a, 1, 0, 40);
    h_expect(&h, h1(m, hf(m, "x", "i", 0, NULL, NULL), a), NULL, 0, "null_count 2 without a validity bitmap");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 100, 2);
    hb(a, 0, 0, 12);
    hb(a, 1, 64, 400);
    h_expect(&h, h1(m, hf(m, "x", "i", 0, NULL, NULL), a), NULL, 0, "validity bitmap holds 12 bytes, offset + length need 13");

    /* offsets: negative first, not monotonic, beyond the data */
    static const int32_t neg[] = { -4, 1, 2 }, down[] = { 0, 9, 3 }, over[] = { 0, 4, 65 };
    const int32_t *bad[] = { neg, down, over };
    const char *why[] = { "first value -4 (at index 0) is negative", "value 3 at index 2 is below the previous 9 (not monotonic)",
                          "last value 65 exceeds the data buffer's length (64)" };
    for (int i = 0; i < 3; i++) {
        h_begin(&h);
        memcpy(h.mem, bad[i], 12);
        m = manifest_new();
        a = ha(m, 2, 0);
        hb(a, 1, 0, 12);
        hb(a, 2, 64, 64);
        h_expect(&h, h1(m, hf(m, "s", "u", 0, NULL, NULL), a), NULL, 0, why[i]);
    }

    /* a list whose offsets go past its child; a struct child shorter than its parent; a
     * fixed-size list's child too short; a child's own buffer, named by its path */
    static const int32_t loffs[] = { 0, 3, 9 };
    h_begin(&h);
    memcpy(h.mem, loffs, 12);
    m = manifest_new();
    a = ha(m, 2, 0);
    hb(a, 1, 0, 12);
    a->children[0] = ha(m, 8, 0);
    hb(a->children[0], 1, 64, 64);
    h_expect(&h, h1(m, hf(m, "l", "+l", 1, hf(m, "item", "l", 0, NULL, NULL), NULL), a), NULL, 0,
             "batch 0 col0 (\"l\", format \"+l\"): offsets buffer: last value 9 exceeds the child's length (8)");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 4, 0);
    a->children[0] = ha(m, 4, 0);
    hb(a->children[0], 1, 0, 16);
    a->children[1] = ha(m, 3, 0);
    hb(a->children[1], 1, 64, 12);
    h_expect(&h, h1(m, hf(m, "st", "+s", 2, hf(m, "a", "i", 0, NULL, NULL), hf(m, "b", "i", 0, NULL, NULL)), a), NULL, 0,
             "child 1's length 3 is below offset + length (4)");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 4, 0);
    a->children[0] = ha(m, 7, 0);
    hb(a->children[0], 1, 0, 28);
    h_expect(&h, h1(m, hf(m, "v", "+w:2", 1, hf(m, "x", "f", 0, NULL, NULL), NULL), a), NULL, 0,
             "child length 7 is below (offset + length) * 2");
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 4, 0);
    a->children[0] = ha(m, 4, 0);
    hb(a->children[0], 1, 0, 16);
    a->children[1] = ha(m, 4, 0);
    hb(a->children[1], 1, 8190, 16);
    h_expect(&h, h1(m, hf(m, "st", "+s", 2, hf(m, "a", "i", 0, NULL, NULL), hf(m, "b", "i", 0, NULL, NULL)), a), NULL, 0,
             "batch 0 col0.child1 (\"b\", format \"i\"): data buffer [8190, +16) lies outside");

    /* a dictionary index past the dictionary */
    h_begin(&h);
    h.mem[0] = 1;
    h.mem[1] = 3;
    m = manifest_new();
    a = ha(m, 2, 0);
    hb(a, 1, 0, 2);
    a->dictionary = ha(m, 3, 0);
    hb(a->dictionary, 1, 64, 24);
    struct manifest_field *df = hf(m, "k", "C", 0, NULL, NULL);
    df->dictionary = hf(m, "", "l", 0, NULL, NULL);
    h_expect(&h, h1(m, df, a), NULL, 0, "dictionary index 3 at slot 1 is outside the dictionary's 3 values");

    /* a format and its buffer count disagree (an encoder that lies about the type) */
    h_begin(&h);
    m = manifest_new();
    a = ha(m, 1, 0);
    struct manifest_field *lie = hf(m, "g", "g", 0, NULL, NULL);
    cr_assert_eq(manifest_type_parse("u", &lie->type), 0);
    h_expect(&h, h1(m, lie, a), NULL, 0, "3 buffers, format \"g\" has 2");

    /* the envelope itself: manifest_at outside the buffer, not a unit, no metadata */
    uint8_t *env;
    size_t elen;
    h_begin(&h);
    cr_assert_eq(manifest_envelope_at(8000, 1000, &env, &elen), 0);
    h_expect(&h, NULL, env, elen, "manifest_at [8000, +1000) lies outside the 8192 published bytes");
    free(env);
    h_begin(&h);
    h_expect(&h, NULL, "f8", 2, "malformed msgpack");
    h_begin(&h);
    h_expect(&h, NULL, NULL, 0, "not a unit of work: the buffer has no metadata");

    /* nothing leaked: every refused acquire released its handle */
    cr_assert_eq(shmref_ping(h.c), 0);
    cr_assert_eq(status_u64(&d, "buffers.leases"), 0);
    shmref_close(h.p);
    shmref_close(h.c);
}

Test(arrow, an_empty_stream_keeps_its_schema)
{
    shmref_conn *c = connect_ok(&d), *c2 = connect_ok(&d);
    struct ArrowArrayStream st, out;
    shmref_unit *u;
    shmref_desc desc;
    t_stream(0, &st);
    cr_assert_eq(shmref_unit_import_stream(c, &st, &u), 0, "%s", shmref_errmsg(c));
    st.release(&st);
    cr_assert_eq(shmref_unit_publish(u, 0, &desc), 0, "%s", shmref_errmsg(c));
    shmref_unit *v = acquire_ok(c2, &desc);
    struct ArrowSchema s, want;
    struct ArrowArray a;
    int n = t_batch(ROWS, 0, 0, 0, &want, &a);
    a.release(&a);
    cr_assert_eq(shmref_unit_n_batches(v), 0);
    cr_assert_eq(shmref_unit_n_columns(v), n);
    cr_assert_eq(shmref_unit_export_stream(v, &out), 0);
    cr_assert_eq(out.get_schema(&out, &s), 0);
    cr_assert_eq(s.n_children, n);
    for (int i = 0; i < n; i++)
        cr_assert_str_eq(s.children[i]->format, want.children[i]->format);
    cr_assert_eq(out.get_next(&out, &a), 0);
    cr_assert_null(a.release);
    s.release(&s);
    want.release(&want);
    out.release(&out);
    shmref_unit_release(v);
    shmref_unit_release(u);
    shmref_close(c2);
    shmref_close(c);
}

/* After shmref_close, release callbacks may run on any thread, all at once. */
struct releaser {
    struct ArrowArray a;
    int go;
};

static void *release_on_thread(void *p)
{
    struct releaser *r = p;
    while (!__atomic_load_n(&r->go, __ATOMIC_ACQUIRE))
        ;
    r->a.release(&r->a);
    return NULL;
}

Test(arrow, exports_released_from_many_threads_after_close)
{
    enum { T = 8 };
    shmref_desc one = produce(BATCH, 0), two = produce(STREAM, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &one), *v = acquire_ok(c, &two);
    static struct releaser rs[T];
    pthread_t th[T];
    for (int i = 0; i < T; i++) {
        rs[i].go = 0;
        cr_assert_eq(shmref_unit_export_array(i % 2 ? u : v, 0, i, NULL, &rs[i].a), 0);
        cr_assert_eq(pthread_create(&th[i], NULL, release_on_thread, &rs[i]), 0);
    }
    shmref_unit_release(u);
    shmref_unit_release(v);
    shmref_close(c);
    cr_assert_eq(status_u64(&d, "buffers.live"), 2);
    for (int i = 0; i < T; i++)
        __atomic_store_n(&rs[i].go, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0);
    cr_assert_eq(wait_status(&d, "clients_total", 1, 3000), 1);
}

Test(arrow, a_consumer_unit_handle_outlives_its_connection)
{
    shmref_desc desc = produce(BATCH, 0);
    shmref_conn *c = connect_ok(&d);
    shmref_unit *u = acquire_ok(c, &desc);
    shmref_close(c);
    struct ArrowSchema s;
    struct ArrowArray a;
    cr_assert_eq(shmref_unit_export_batch(u, 0, &s, &a), 0);
    expect_batch(shmref_unit_data(u), shmref_unit_size(u), &s, &a, 0, 0, 0);
    shmref_unit_release(u);
    cr_assert_eq(status_u64(&d, "buffers.live"), 1, "the exported batch still holds it");
    a.release(&a);
    s.release(&s);
    cr_assert_eq(wait_status(&d, "buffers.leases", 0, 3000), 0);
}
