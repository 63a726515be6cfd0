/* SPDX-License-Identifier: MIT */
/* localhold.c: see localhold.h. The steps and their memory order are proto/handoff.c's;
 * what is here is when the client may take them: only on a buffer it maps (the mapping
 * cache's, checked against what it asks), a plain publish (a sealed one, a retention or
 * long metadata are the daemon's: lease.c adopts the lease first), a plain acquire, and
 * never in the table of another process (a forked child unmaps its inherited copies at
 * adoption and holds only through its own connection). */
#include "localhold.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "handoff.h"
#include "handoff.h"
#include "mapcache.h"
#include "transport.h"


bool localhold_wanted(void)
{
    const char *e = getenv("SHMREF_TABLE");
    return !(e && strcmp(e, "0") == 0);
}

bool localhold_on(const shmref_conn *conn)
{
    return conn->lh.tab != NULL;
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
    void *tab = nfds >= 2 ? map_checked(fds[0], HANDOFF_TABLE_SIZE) : NULL;
    void *journal = nfds >= 2 ? map_checked(fds[1], HANDOFF_JOURNAL_SIZE) : NULL;
    /* the key of this connection's tokens: drawn once, a counter under it after that (no
     * system call per publish) */
    if (!tab || !journal || handoff_check(tab, HANDOFF_TABLE_SIZE) < 0 ||
        getrandom(conn->lh.key, sizeof(conn->lh.key), GRND_NONBLOCK) != (ssize_t)sizeof(conn->lh.key)) {
        if (tab)
            munmap(tab, HANDOFF_TABLE_SIZE);
        if (journal)
            munmap(journal, HANDOFF_JOURNAL_SIZE);
        conn->counters.table_refused++;
        return;
    }
    conn->lh.tab = tab;
    conn->lh.journal = journal;
    conn->lh.next = 0;
}

void localhold_unmap(shmref_conn *conn)
{
    if (conn->lh.tab)
        munmap(conn->lh.tab, HANDOFF_TABLE_SIZE);
    if (conn->lh.journal)
        munmap((void *)conn->lh.journal, HANDOFF_JOURNAL_SIZE);
    conn->lh.tab = NULL;
    conn->lh.journal = NULL;
}

/* token_for: a fresh token for a publish in slot: the slot, then 96 bits of SipHash of a
 * counter under the connection's random key (a PRF: unpredictable to anyone without the
 * key, which never leaves this process). */
static void token_for(shmref_conn *conn, uint32_t slot, uint8_t token[PROTO_TOKEN_LEN])
{
    uint64_t n = conn->lh.next++;
    uint64_t a = handoff_siphash(conn->lh.key, &n, sizeof(n));
    n |= UINT64_C(1) << 63;
    uint64_t b = handoff_siphash(conn->lh.key, &n, sizeof(n));
    memcpy(token + 4, &a, 8);
    memcpy(token + 12, &b, 4);
    handoff_set_slot(token, slot);
}

/* capacity_of: what the header says buffers of slot's class have (0: nothing usable). */
static uint64_t capacity_of(void *tab, uint32_t slot)
{
    uint32_t cls = atomic_load(&handoff_entry_at(tab, slot)->cls);
    return cls < HANDOFF_CLASSES ? atomic_load(&((struct handoff_header *)tab)->cap[cls]) : 0;
}

/* made: the handle of a table hold of slot (generation seq) on buffer buf_id mapped at
 * data (len bytes): a lease (writable, under a fresh token) when token is NULL, else an
 * acquire of the publish under token. */
static shmref_buf *made(shmref_conn *conn, uint32_t slot, uint32_t seq, uint64_t buf_id, void *data, size_t len,
                        size_t size, const uint8_t *token)
{
    shmref_buf *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->conn = conn;
    b->table = true;
    b->slot = slot;
    b->seq = seq;
    b->buf_id = buf_id;
    b->data = data;
    b->size = size;
    b->capacity = len;
    b->writable = token == NULL;
    if (token)
        memcpy(b->token, token, PROTO_TOKEN_LEN);
    else
        token_for(conn, slot, b->token);
    return b;
}

static void give_slot(shmref_conn *conn, uint32_t slot, uint64_t buf_id)
{
    if (handoff_give(conn->lh.tab, conn->lh.journal, slot, HANDOFF_TRIES) == HANDOFF_TO_DAEMON &&
        transport_ok(conn) == 0) {
        struct proto_msg req = { .op = PROTO_OP_GIVEBACK };
        req.u.giveback.buf_id = buf_id;
        char keep[sizeof(conn->errmsg)];
        memcpy(keep, conn->errmsg, sizeof(keep));
        client_send(conn, &req); /* one-way: a failure shows at the next call */
        memcpy(conn->errmsg, keep, sizeof(keep));
        conn->counters.table_givebacks++;
    }
}

int localhold_lease(shmref_conn *conn, size_t size, shmref_buf **ret_buf, struct localhold_popped *ret_popped)
{
    void *tab = conn->lh.tab;
    int cls = tab ? handoff_class(tab, size) : -1;
    uint32_t slot, seq;
    if (cls < 0 || handoff_lease(tab, conn->lh.journal, (uint32_t)cls, HANDOFF_TRIES, &slot, &seq) < 0)
        return -EAGAIN;
    if (handoff_journal_closed(conn->lh.journal)) { /* the daemon no longer counts this connection */
        give_slot(conn, slot, atomic_load(&handoff_entry_at(tab, slot)->buf_id));
        return -EAGAIN;
    }
    uint64_t buf_id = atomic_load(&handoff_entry_at(tab, slot)->buf_id);
    uint64_t cap = capacity_of(tab, slot);
    void *data = cap >= size ? mapcache_find(&conn->cache, buf_id, (size_t)cap, true) : NULL;
    if (!data) {
        *ret_popped = (struct localhold_popped){ .slot = slot, .seq = seq, .buf_id = buf_id, .size = size };
        return 1;
    }
    shmref_buf *b = made(conn, slot, seq, buf_id, data, (size_t)cap, size, NULL);
    if (!b) {
        mapcache_put(&conn->cache, data);
        give_slot(conn, slot, buf_id);
        return -ENOMEM;
    }
    conn->counters.table_leases++;
    *ret_buf = b;
    return 0;
}

int localhold_lease_mapped(shmref_conn *conn, const struct localhold_popped *pp, void *data, size_t len,
                           shmref_buf **ret_buf)
{
    shmref_buf *b = len >= pp->size ? made(conn, pp->slot, pp->seq, pp->buf_id, data, len, pp->size, NULL) : NULL;
    if (!b) {
        mapcache_put(&conn->cache, data);
        give_slot(conn, pp->slot, pp->buf_id);
        return -EAGAIN;
    }
    conn->counters.table_leases++;
    conn->counters.table_maps++;
    *ret_buf = b;
    return 0;
}

void localhold_lease_drop(shmref_conn *conn, const struct localhold_popped *pp)
{
    if (conn->lh.tab)
        give_slot(conn, pp->slot, pp->buf_id);
}

int localhold_publish(shmref_buf *buf, size_t len, const void *meta, size_t meta_len, shmref_desc *ret_desc)
{
    shmref_conn *conn = buf->conn;
    if (meta_len > HANDOFF_META_MAX)
        return -EAGAIN;
    if (!conn->lh.tab)
        return -ESTALE;
    /* the producer's between its lease and its publish: read by consumers under a hold */
    struct handoff_meta *m = handoff_meta_at(conn->lh.tab, buf->slot);
    if (meta_len)
        memcpy(m->data, meta, meta_len);
    atomic_store(&m->len, (uint32_t)meta_len);
    uint64_t tokhash = handoff_siphash(((struct handoff_header *)conn->lh.tab)->key, buf->token, PROTO_TOKEN_LEN);
    if (handoff_publish(conn->lh.tab, buf->slot, buf->seq, tokhash, len) < 0)
        return -ESTALE;
    buf->published = true;
    memcpy(ret_desc->token, buf->token, SHMREF_TOKEN_LEN);
    ret_desc->size = len;
    conn->counters.table_publishes++;
    return 0;
}

void localhold_adopted(shmref_buf *buf, uint64_t handle, const uint8_t token[PROTO_TOKEN_LEN])
{
    shmref_conn *conn = buf->conn;
    give_slot(conn, buf->slot, buf->buf_id); /* the daemon holds it now: never the last hold */
    buf->table = false;
    buf->handle = handle;
    memcpy(buf->token, token, PROTO_TOKEN_LEN);
}

/* take: a hold of slot's publish under token (size bytes); 0, *ret_seq; or -EAGAIN. */
static int take(shmref_conn *conn, uint32_t slot, const uint8_t *token, uint64_t size, uint32_t *ret_seq)
{
    void *tab = conn->lh.tab;
    uint64_t tokhash = handoff_siphash(((struct handoff_header *)tab)->key, token, PROTO_TOKEN_LEN);
    return handoff_take(tab, conn->lh.journal, slot, tokhash, size, HANDOFF_TRIES, ret_seq);
}

int localhold_acquire(shmref_conn *conn, const shmref_desc *desc, unsigned flags, shmref_buf **ret_buf)
{
    void *tab = conn->lh.tab;
    if (!tab || (flags & (SHMREF_ACQUIRE_SEALED | SHMREF_ACQUIRE_PRIVATE)))
        return -EAGAIN;
    uint32_t slot = handoff_slot_of(desc->token), seq;
    if (slot >= HANDOFF_MAX_SLOTS || take(conn, slot, desc->token, desc->size, &seq) < 0) {
        conn->counters.table_fallbacks++;
        return -EAGAIN;
    }
    if (handoff_journal_closed(conn->lh.journal)) { /* the daemon no longer counts this connection */
        give_slot(conn, slot, atomic_load(&handoff_entry_at(tab, slot)->buf_id));
        conn->counters.table_fallbacks++;
        return -EAGAIN;
    }
    /* Held: the entry (buffer, class, metadata) stays this publish's until the hold goes. */
    uint64_t buf_id = atomic_load(&handoff_entry_at(tab, slot)->buf_id);
    uint64_t cap = capacity_of(tab, slot);
    void *data = cap >= desc->size ? mapcache_find(&conn->cache, buf_id, (size_t)cap, false) : NULL;
    const struct handoff_meta *m = handoff_meta_at(tab, slot);
    uint32_t meta_len = atomic_load(&m->len);
    shmref_buf *b = data && meta_len <= HANDOFF_META_MAX
                        ? made(conn, slot, seq, buf_id, data, (size_t)cap, desc->size, desc->token)
                        : NULL;
    if (b && meta_len && !(b->meta = malloc(meta_len))) {
        free(b);
        b = NULL;
    }
    if (!b) {
        if (data)
            mapcache_put(&conn->cache, data);
        give_slot(conn, slot, buf_id);
        conn->counters.table_fallbacks++;
        return -EAGAIN;
    }
    if (meta_len)
        memcpy(b->meta, m->data, meta_len);
    b->meta_len = meta_len;
    conn->counters.table_acquires++;
    *ret_buf = b;
    return 0;
}

int localhold_again(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    uint32_t seq;
    if (!buf->table || buf->inherited || !conn->lh.tab || take(conn, buf->slot, buf->token, buf->size, &seq) < 0)
        return -EAGAIN;
    if (handoff_journal_closed(conn->lh.journal)) {
        give_slot(conn, buf->slot, buf->buf_id);
        return -EAGAIN;
    }
    conn->counters.table_acquires++;
    return 0;
}

void localhold_give(shmref_buf *buf)
{
    shmref_conn *conn = buf->conn;
    /* A forked child's inherited hold is its parent's (and the child has unmapped the
     * parent's table); a connection that lost its table lost the holds with it. */
    if (buf->inherited || !conn->lh.tab)
        return;
    give_slot(conn, buf->slot, buf->buf_id);
}
