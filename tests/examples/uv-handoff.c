/* SPDX-License-Identifier: MIT */
/* uv-handoff: a producer and a consumer on one libuv loop, each on its own shmrefd
 * connection, doing N lease/publish/acquire/release handoffs and a status without
 * calling a blocking function. Usage: uv-handoff SOCKET [N] */
#include <shmref/shmref.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define SIZE 65536

struct side {
    shmref_conn *conn;
    uv_poll_t poll;
    void (*on_done)(struct side *, shmref_completion *);
};

static struct side prod, cons;
static int n_total = 100, n_leased, n_checked, status_seen, failed;

static void rearm(struct side *s);

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct side *s = h->data;
    shmref_completion c[16];
    int n;
    (void)status;
    if (events & UV_WRITABLE)
        shmref_flush(s->conn);
    while ((n = shmref_complete(s->conn, c, 16)) > 0)
        for (int i = 0; i < n; i++)
            s->on_done(s, &c[i]);
    if (n < 0) {
        fprintf(stderr, "connection failed: %s\n", shmref_errmsg(s->conn));
        failed = 1;
    }
    rearm(s);
}

/* rearm: poll for what the connection asks; stop when it asks nothing. */
static void rearm(struct side *s)
{
    int ev = shmref_conn_events(s->conn), uv = 0;
    if (ev & SHMREF_READY) { /* completions that needed no daemon: collect them now */
        on_poll(&s->poll, 0, 0);
        return;
    }
    if (ev & SHMREF_WANT_READ)
        uv |= UV_READABLE;
    if (ev & SHMREF_WANT_WRITE)
        uv |= UV_WRITABLE;
    if (uv && !failed)
        uv_poll_start(&s->poll, uv, on_poll);
    else
        uv_poll_stop(&s->poll);
}

static void fill(unsigned char *p, int i)
{
    for (int k = 0; k < SIZE; k++)
        p[k] = (unsigned char)(i * 31 + k);
}

static int check(const unsigned char *p, int i)
{
    for (int k = 0; k < SIZE; k++)
        if (p[k] != (unsigned char)(i * 31 + k))
            return -1;
    return 0;
}

static void lease_next(void)
{
    if (n_leased < n_total && shmref_lease_submit(prod.conn, SIZE, 0, 0, (void *)(intptr_t)n_leased++) < 0)
        failed = 1;
    rearm(&prod);
}

static void producer_done(struct side *s, shmref_completion *c)
{
    int i = (int)(intptr_t)c->user;
    if (c->result < 0) {
        fprintf(stderr, "op %d of handoff %d: %s\n", c->op, i, c->errmsg);
        failed = 1;
        return;
    }
    if (c->op == SHMREF_OP_LEASE) {
        fill(shmref_buf_data(c->buf), i);
        /* Retained for 5 s or until its one consumer comes: the lease can go at once. */
        if (shmref_publish_submit(c->buf, SIZE, 5000, 1, 0, NULL, 0, c->user) < 0)
            failed = 1;
    } else if (c->op == SHMREF_OP_PUBLISH) {
        /* Hand the descriptor over (here: in memory) and let go of the lease. */
        if (shmref_acquire_submit(cons.conn, &c->desc, 0, c->user) < 0)
            failed = 1;
        shmref_release(c->buf);
        rearm(&cons);
        lease_next();
    } else if (c->op == SHMREF_OP_STATUS) {
        uint64_t clients = 0;
        shmref_status_u64(c->status, "daemon.clients", &clients);
        printf("status: %llu clients\n", (unsigned long long)clients);
        status_seen = clients >= 2;
        shmref_status_free(c->status);
    }
    (void)s;
}

static void consumer_done(struct side *s, shmref_completion *c)
{
    int i = (int)(intptr_t)c->user;
    if (c->result < 0 || check(shmref_buf_data(c->buf), i) < 0) {
        fprintf(stderr, "handoff %d: %s\n", i, c->result < 0 ? c->errmsg : "wrong bytes");
        failed = 1;
        return;
    }
    shmref_release(c->buf);
    if (++n_checked == n_total && shmref_status_submit(prod.conn, NULL) < 0)
        failed = 1;
    rearm(&prod);
    (void)s;
}

static int open_side(uv_loop_t *loop, struct side *s, const char *path,
                     void (*on_done)(struct side *, shmref_completion *))
{
    if (shmref_connect(path, &s->conn) < 0) {
        fprintf(stderr, "%s\n", shmref_errmsg(NULL));
        return -1;
    }
    s->on_done = on_done;
    uv_poll_init(loop, &s->poll, shmref_conn_fd(s->conn));
    s->poll.data = s;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (argc > 2)
        n_total = atoi(argv[2]);
    uv_loop_t *loop = uv_default_loop();
    if (open_side(loop, &prod, argv[1], producer_done) < 0 || open_side(loop, &cons, argv[1], consumer_done) < 0)
        return 1;
    lease_next(); /* one handoff in flight at a time; each publish starts the next lease */
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&prod.poll, NULL);
    uv_close((uv_handle_t *)&cons.poll, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    shmref_close(prod.conn);
    shmref_close(cons.conn);
    printf("%d handoffs checked\n", n_checked);
    return failed || n_checked != n_total || !status_seen;
}
