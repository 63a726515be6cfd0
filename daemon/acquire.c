/* SPDX-License-Identifier: MIT */
/* acquire.c: see acquire.h. */
#include "acquire.h"

#include <errno.h>
#include <string.h>

void acquire_serve(struct broker *bk, struct broker_peer *p, uint32_t id, struct registry_buf *b)
{
    uint64_t handle;
    if (!peer_leases_left(bk, p, id, "acquire"))
        return;
    char msg[PROTO_MAX_ERRMSG];
    if (p->uid != b->tenant && quota_check_pinned(bk->quota, p->uid, msg, sizeof(msg)) < 0) {
        peer_refuse(bk, p, id, EDQUOT, "acquire", msg);
        return;
    }
    int fd = pool_ro_fd(bk->pool, b->pb);
    if (fd < 0) {
        log_error("cannot open a read-only fd of buffer %llu: %s", (unsigned long long)b->pb->id,
                  strerror(-fd));
        peer_fail(p, id, -fd, "cannot open the buffer read-only: %s", strerror(-fd));
        return;
    }
    if (registry_hold(bk->reg, &p->holder, b, false, &handle) < 0) {
        peer_fail(p, id, ENOMEM, "daemon out of memory");
        return;
    }
    /* Another tenant will have mapped it: never hand it to its producer's next lease. */
    if (p->uid != b->tenant)
        b->pb->foreign = true;
    registry_acquired(bk->reg, b);
    bk->counters->acquires++;
    peer_send_buffer(p, id, handle, b, fd);
}
