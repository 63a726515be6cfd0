/* SPDX-License-Identifier: MIT */
/* localhold.c: see localhold.h. The handshake and its memory ordering are ledger.c's
 * (proto/ledger.h); what is here is when the client may use it: only on a buffer it
 * already maps read-only through an acquire reply (the daemon knows that mapping, so it
 * reads this connection's count of that slot before it recycles the buffer), only for a
 * plain acquire (a sealed one needs the daemon's word on the seals), and never on the
 * ledger of another process (a forked child unmaps its inherited copies at adoption). */
#include "localhold.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ledger.h"
#include "mapcache.h"
#include "transport.h"

bool localhold_wanted(void)
{
    const char *e = getenv("SHMREF_LEDGER");
    return !(e && strcmp(e, "0") == 0);
}

/* map_checked: fd mapped read-write if it is a regular file of exactly len bytes that
 * cannot shrink or grow (a lying peer gets a refusal, never a SIGBUS); else NULL. */
static void *map_checked(int fd, size_t len)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size != len)
        return NULL;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW))
        return NULL;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

void localhold_setup(shmref_conn *conn, const int *fds, unsigned nfds)
{
    localhold_unmap(conn);
    if (nfds < 2) {
        conn->counters.ledger_refused++;
        return;
    }
    void *dir = map_checked(fds[0], LEDGER_DIR_SIZE);
    void *counts = map_checked(fds[1], LEDGER_COUNTS_SIZE);
    if (!dir || !counts || ledger_dir_check(dir, LEDGER_DIR_SIZE) < 0) {
        if (dir)
            munmap(dir, LEDGER_DIR_SIZE);
        if (counts)
            munmap(counts, LEDGER_COUNTS_SIZE);
        conn->counters.ledger_refused++;
        return;
    }
    conn->lh.dir = dir;
    conn->lh.counts = counts;
}

void localhold_unmap(shmref_conn *conn)
{
    if (conn->lh.dir)
        munmap(conn->lh.dir, LEDGER_DIR_SIZE);
    if (conn->lh.counts)
        munmap((void *)conn->lh.counts, LEDGER_COUNTS_SIZE);
    conn->lh.dir = NULL;
    conn->lh.counts = NULL;
}

void localhold_publish(shmref_buf *buf, size_t len, const void *meta, size_t meta_len)
{
    shmref_conn *conn = buf->conn;
    /* With max_acquires too: each local take's TOOK counts toward it when the daemon reads
     * it, and the daemon withdraws the entry (LENT) when the retention ends; consumers that
     * take before it has read the TOOKs may exceed the cap (each already maps the buffer). */
    if (!conn->lh.dir || meta_len > LEDGER_META_MAX)
        return;
    uint32_t slot = ledger_slot_of(buf->token);
    if (slot >= LEDGER_SLOTS)
        return;
    ledger_publish(conn->lh.dir, slot, buf->buf_id, buf->token, len, meta, (uint32_t)meta_len);
}

/* send_one_way: a TOOK or NUDGE (no reply, ever); a failure shows at the next call. */
static void send_one_way(shmref_conn *conn, struct proto_msg *req)
{
    if (transport_ok(conn) < 0)
        return;
    char keep[sizeof(conn->errmsg)];
    memcpy(keep, conn->errmsg, sizeof(keep));
    client_send(conn, req);
    memcpy(conn->errmsg, keep, sizeof(keep));
}

static void nudge(shmref_conn *conn, uint64_t buf_id)
{
    struct proto_msg req = { .op = PROTO_OP_NUDGE };
    req.u.nudge.buf_id = buf_id;
    send_one_way(conn, &req);
}

int localhold_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf)
{
    if (!conn->lh.dir || (flags & (SHMREF_ACQUIRE_SEALED | SHMREF_ACQUIRE_PRIVATE)))
        return -EAGAIN;
    uint32_t slot = ledger_slot_of(desc->token);
    uint64_t buf_id = ledger_buf_of(conn->lh.dir, slot, desc->token);
    size_t len = 0;
    void *data = buf_id ? mapcache_find_ro(&conn->cache, buf_id, desc->size, &len) : NULL;
    if (!data) {
        conn->counters.ledger_fallbacks++;
        return -EAGAIN;
    }
    uint8_t meta[LEDGER_META_MAX];
    uint32_t meta_len = 0;
    shmref_buf *b = calloc(1, sizeof(*b));
    int r = b ? ledger_take(conn->lh.dir, conn->lh.counts, slot, desc->token, desc->size, buf_id, meta, &meta_len)
              : -ENOMEM;
    if (r == 0 && meta_len && !(b->meta = malloc(meta_len))) {
        if (ledger_give(conn->lh.dir, conn->lh.counts, slot))
            nudge(conn, buf_id);
        r = -ENOMEM;
    }
    if (r < 0) {
        if (r == -ESTALE) /* undone after the daemon marked it: it waits for that decrement */
            nudge(conn, buf_id);
        mapcache_put(&conn->cache, data);
        free(b);
        conn->counters.ledger_fallbacks++;
        return -EAGAIN;
    }
    if (meta_len)
        memcpy(b->meta, meta, meta_len);
    b->meta_len = meta_len;
    b->ledger = true;
    b->slot = slot;
    b->buf_id = buf_id;
    b->data = data;
    b->size = desc->size;
    b->capacity = len;
    memcpy(b->token, desc->token, PROTO_TOKEN_LEN);
    b->conn = conn;
    conn->counters.ledger_acquires++;
    struct proto_msg req = { .op = PROTO_OP_TOOK };
    req.u.took.buf_id = buf_id;
    memcpy(req.u.took.token, desc->token, PROTO_TOKEN_LEN);
    send_one_way(conn, &req);
    *ret_buf = b;
    return 0;
}

int localhold_again(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    if (!buf->ledger || buf->inherited || !conn->lh.counts || buf->slot >= LEDGER_SLOTS)
        return -EAGAIN;
    /* buf's own hold keeps the count above 0, so the daemon cannot have recycled it: one
     * more needs no re-check of the entry (which may be withdrawn, LENT, by now). */
    atomic_fetch_add(&conn->lh.counts[buf->slot], 1u);
    conn->counters.ledger_acquires++;
    return 0;
}

void localhold_give(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    /* A forked child's inherited hold is its parent's count (and the child has unmapped
     * the parent's ledger); a connection that lost its ledger lost the holds with it. */
    if (buf->inherited || !conn->lh.dir)
        return;
    if (ledger_give(conn->lh.dir, conn->lh.counts, buf->slot))
        nudge(conn, buf->buf_id);
}
