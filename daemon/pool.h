/* SPDX-License-Identifier: MIT */
/* pool.h: the pool of pre-faulted shared-memory buffers. Private to the daemon.
 * Invariants: every buffer's pages are reserved (fallocate) before it is handed out, so a
 * full tmpfs is an error at lease time, never a SIGBUS in a client; bytes_alloc (every
 * backing file, including those being created) never exceeds the cap; a free buffer is
 * reused only by its own tenant, and a buffer another tenant has mapped is never reused. */
#ifndef SHMREFD_POOL_H
#define SHMREFD_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#define POOL_MAX_CLASSES 1024 /* class indexes (pool_cls.idx, pool_buf.cls: uint16_t) */

/* pool_pin: how many of a uid's client mappings of a buffer the sessions know of. */
struct pool_pin {
    uint32_t uid, n;
};

struct pool_buf {
    uint64_t id;            /* unique per backing file for the daemon's lifetime */
    int fd;                 /* O_RDWR, owned by the pool */
    int ro_fd;              /* O_RDONLY reopen, made on first acquire, or -1 */
    uint64_t size;          /* the class size: bytes reserved */
    uint32_t tenant;        /* uid that may reuse it: the one it was created for, or last leased to */
    uint32_t gen;           /* how many times it has been handed out (sent in lease replies) */
    uint32_t slot;          /* dense index < HANDOFF_MAX_SLOTS (its directory entry and ledger count),
                             * reused once this struct is freed; HANDOFF_NO_SLOT when all were taken */
    uint16_t cls;
    bool foreign;           /* mapped by another uid than tenant: retire on return */
    bool sealed;            /* F_SEAL_WRITE added (a sealed publish): retire on return */
    bool is_free;
    bool stock;             /* held as a stock lease: counted in the stock reserve, not the cap */
    struct pool_buf *lru_prev, *lru_next; /* all free buffers, oldest first */
    struct pool_buf *cls_prev, *cls_next; /* free buffers of this class */
    /* Client mappings (an fd sent and not forgotten, as sessions report them). A buffer
     * that no lease holds but clients still map is "pinned": warm, its pages cannot be
     * freed by evicting it; retired, its fds are closed but its pages live on in those
     * processes. Pinned bytes count against each mapping uid's quota, and retired ones
     * against the cap too, until the last mapping is gone. */
    uint32_t maps;
    uint32_t npins, pins_cap;
    struct pool_pin *pins;
    bool pin_charged;           /* pinned: its bytes are charged to the mapping uids */
    bool retired;               /* retired while mapped: kept only for the accounting */
    struct pool_buf *id_next;   /* the pool's id hash */
};

struct pool_class_stat {
    uint64_t size;
    uint32_t total;         /* buffers of this class that exist (free or in use) */
    uint32_t nfree;
};

struct pool_counters {
    uint64_t created, recycled, retired, evicted, create_failed;
    uint64_t tampered;      /* came back resized or with holes: retired */
    uint64_t emptied_mapped; /* retired while clients mapped it: its pages freed under them */
    uint64_t empty_failed;  /* store_empty failed: its pages stay with whoever maps it */
};

struct pool;

/* Completion of an asynchronous create: buf is NULL and err < 0 on failure. The
 * callback always runs (on the loop thread), even during shutdown. */
typedef void (*pool_get_cb)(struct pool *pool, struct pool_buf *buf, int err, void *data);

/* pool_new: opens the pool in dir, capped at cap bytes.
 * Refuses, with the numbers in *ret_why (a static buffer), when cap exceeds the space
 * statvfs reports for dir. use_memfd forces memfd_create instead of O_TMPFILE. */
int pool_new(uv_loop_t *loop, const char *dir, uint64_t cap, bool use_memfd,
             struct pool **ret, const char **ret_why);
/* pool_free: closes every free buffer. Every buffer handed out must have been put back
 * and every creation must have completed (the loop has run dry). Accepts NULL. */
void pool_free(struct pool *pool);

/* pool_class_size: the size class that holds size bytes (page-rounded, then rounded up
 * to one of four steps per power of two below 1 MiB, so at most 25% is wasted, and of 32
 * steps per power of two from 1 MiB up, so at most 1/32 (3.1%); on a huge-page pool,
 * sizes above 1 MiB first round up to whole 2 MiB pages); 0 if too large. */
uint64_t pool_class_size(const struct pool *pool, uint64_t size);

/* pool_cls: a size class, computed once per lease (its size is what the lease is charged). */
struct pool_cls {
    uint16_t idx;
    uint64_t size;
    bool stock;             /* for a stock lease: from the stock reserve (see pool_set_stock) */
};
/* pool_class: the class of size bytes into *ret. Returns 0, or -EFBIG if too large. */
int pool_class(const struct pool *pool, uint64_t size, struct pool_cls *ret);

/* pool_get: a buffer of size's class for tenant. Returns 0 with *ret for a warm buffer;
 * 1 when a new buffer is being created off the loop (cb will be called); -ENOSPC when
 * the cap leaves no room even after evicting every free buffer (a request that cannot
 * fit evicts nothing); -EMFILE when the buffers' fds would pass three quarters of
 * RLIMIT_NOFILE even after evicting; -EFBIG when size is beyond every class. */
int pool_get(struct pool *pool, uint64_t size, uint32_t tenant, struct pool_buf **ret,
             pool_get_cb cb, void *data);
/* pool_get_class: pool_get for a class pool_class gave. */
int pool_get_class(struct pool *pool, const struct pool_cls *cls, uint32_t tenant, struct pool_buf **ret,
                   pool_get_cb cb, void *data);

/* pool_take_warm: the tenant's warm buffer of cls, taken (its pin, if its tenant's
 * clients map it, is no longer charged), or NULL. pool_untake gives it back unused. */
struct pool_buf *pool_take_warm(struct pool *pool, const struct pool_cls *cls, uint32_t tenant);
void pool_untake(struct pool *pool, struct pool_buf *buf);

/* pool_put: a buffer no one holds any more. It goes back warm to its tenant's free list,
 * or is retired (closed) if another tenant mapped it or its file was resized. */
void pool_put(struct pool *pool, struct pool_buf *buf);

/* pool_seal: seals buf against writing for good (store_seal_write); it is retired when it
 * comes back. Returns 0 or what store_seal_write returned. */
int pool_seal(struct pool *pool, struct pool_buf *buf);
/* pool_sealable: whether this pool's buffers can be sealed (a memfd pool). */
bool pool_sealable(const struct pool *pool);

/* pool_pin_cb: a uid's pinned bytes change by delta (the registry charges them to its
 * quota). */
typedef void (*pool_pin_cb)(void *arg, uint32_t uid, int64_t delta);
/* pool_set_pin_cb: who hears of pins (NULL: nobody). */
void pool_set_pin_cb(struct pool *pool, pool_pin_cb cb, void *arg);
/* pool_mapped: a client of uid was sent buffer id's fd and maps it now. Returns 0,
 * -ENOENT (no such live buffer) or -ENOMEM (then it is not counted). */
int pool_mapped(struct pool *pool, uint64_t id, uint32_t uid);
/* pool_unmapped: that client said it unmapped it (forget), or went away. A pinned buffer
 * whose last mapping goes is gone for good. Unknown ids are ignored. */
void pool_unmapped(struct pool *pool, uint64_t id, uint32_t uid);

/* pool_pins_after_close: whether buffer id's pages outlive the pool's fds while a client
 * maps it: it is retired and pinned, or cannot be emptied when it is (a memfd sealed
 * against writing refuses a punched hole). A connection that closes while it maps such a
 * buffer stays charged for it: pool_hold_until_exit. */
bool pool_pins_after_close(struct pool *pool, uint64_t id);
/* pool_hold_until_exit: a connection of uid from process pid closed while it mapped
 * ids[0..n) (each as pool_mapped counted it); those mappings stay counted, charged to uid
 * as pinned once their buffer is retired, until pidfd (the process's, taken by the pool,
 * which closes it) turns readable: the process exited. Connections of one process share
 * one watch, which counts as one of the pool's fds. Returns 0; on failure (-ENOMEM) the
 * mappings are no longer counted, as if unmapped. */
int pool_hold_until_exit(struct pool *pool, uint32_t uid, pid_t pid, int pidfd, const uint64_t *ids, unsigned n);
/* pool_mappers: processes watched by pool_hold_until_exit now. */
uint64_t pool_mappers(const struct pool *pool);
/* pool_stop: the daemon is stopping: every watch ends (its handles are closed, so the
 * loop can run dry) and retired files are no longer emptied (clients that still hold
 * leases keep their bytes). */
void pool_stop(struct pool *pool);

/* The stock reserve: bytes beyond the cap that only stock leases (kept ready by clients,
 * not asked for by a caller yet) may take, and that ordinary leases never count: the cap
 * applies to bytes_alloc + pinned - bytes_stock. So however much stock clients keep, an
 * ordinary lease finds the whole cap; a stock lease that does not fit the reserve is
 * refused (-EAGAIN) and the client leases plainly when a caller asks. */
/* pool_set_stock: the reserve's size (clamped, for a tmpfile pool, to what the directory
 * has beyond the cap now) and who hears of each uid's stock bytes (cb(arg, uid, delta)).
 * Returns the reserve in force. */
uint64_t pool_set_stock(struct pool *pool, uint64_t reserve, pool_pin_cb cb, void *arg);
uint64_t pool_stock_reserve(const struct pool *pool);
uint64_t pool_bytes_stock(const struct pool *pool);
/* pool_stock_room: whether a stock lease of size bytes fits the reserve now. */
bool pool_stock_room(const struct pool *pool, uint64_t size);
/* pool_unstock: a stock lease became an ordinary one (its client published it): it leaves
 * the reserve if the cap has room for it (evicting warm buffers), else it stays counted
 * there until it comes back. Returns whether it moved. */
bool pool_unstock(struct pool *pool, struct pool_buf *buf);

/* pool_slots_used: slots (pool_buf.slot) held by buffers now. */
uint32_t pool_slots_used(const struct pool *pool);
/* pool_slot_of: the slot of buffer id if it exists and tenant is its tenant, else
 * HANDOFF_NO_SLOT. */
uint32_t pool_slot_of(const struct pool *pool, uint64_t id, uint32_t tenant);

/* pool_ro_fd: the read-only fd of buf (made on first use). Returns it or -errno. */
int pool_ro_fd(struct pool *pool, struct pool_buf *buf);
/* pool_ro_close: buf's read-only fd closed (if it has one): no daemon reference needs it
 * (a buffer going warm, or LENT to its tenant's table); pool_ro_fd makes it again. */
void pool_ro_close(struct pool *pool, struct pool_buf *buf);

/* Accounting, for status and refusal messages. */
uint64_t pool_cap(const struct pool *pool);
uint64_t pool_fds(const struct pool *pool);           /* fds held by buffers */
uint64_t pool_fd_budget(const struct pool *pool);     /* most it may hold (RLIMIT_NOFILE) */
/* pool_fd_budget_of: the buffers' fd budget under an RLIMIT_NOFILE of nofile: all but a
 * quarter and POOL_FDS_DAEMON (the daemon's own fds); the quarter is the connections'. */
#define POOL_FDS_DAEMON 64
uint64_t pool_fd_budget_of(uint64_t nofile);
uint64_t pool_bytes_alloc(const struct pool *pool);   /* every backing file */
uint64_t pool_bytes_warm(const struct pool *pool);    /* free buffers, ready */
uint64_t pool_bytes_creating(const struct pool *pool); /* buffers being created off the loop */
uint64_t pool_bytes_pinned(const struct pool *pool);  /* buffers no lease holds that clients still map */
uint64_t pool_bytes_retired_pinned(const struct pool *pool); /* of those, retired (sealed memfds) */
uint64_t pool_fs_available(const struct pool *pool);  /* statvfs of the dir, now */
const char *pool_dir(const struct pool *pool);
const char *pool_kind(const struct pool *pool);       /* "tmpfile", "tmpfile-hugepages" or "memfd" */
unsigned pool_classes(const struct pool *pool, struct pool_class_stat *ret, unsigned max);
struct pool_counters pool_counters(const struct pool *pool);

#endif
