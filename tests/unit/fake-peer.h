/* SPDX-License-Identifier: MIT */
/* fake-peer.h: the session the unit tests of acquire, lease and peer give the broker's
 * modules: a struct broker_peer that records its last reply and its last refusal apart,
 * and counts the references taken on it. (test-broker's own fake records refusals in
 * the order of its replies.) Test code only. */
#ifndef SHMREF_TEST_FAKE_PEER_H
#define SHMREF_TEST_FAKE_PEER_H

#include <stdio.h>
#include <string.h>

#include "peer.h"

struct fake {
    struct broker_peer peer;
    unsigned replies, refusals;
    int refs;
    struct proto_msg last;       /* the last reply (pointers not kept) */
    int last_fd;
    int code;                    /* of the last refusal */
    uint32_t refused_id;
    char msg[PROTO_MAX_ERRMSG + 64]; /* room past the limit: the daemon cuts a message, not this */
};

static void fake_reply(struct broker_peer *p, const struct proto_msg *m, int fd)
{
    struct fake *f = (struct fake *)p;
    f->replies++;
    f->last = *m;
    f->last_fd = fd;
}

static void fake_refuse(struct broker_peer *p, uint32_t id, int code, const char *msg)
{
    struct fake *f = (struct fake *)p;
    f->refusals++;
    f->code = code;
    f->refused_id = id;
    snprintf(f->msg, sizeof(f->msg), "%s", msg);
}

static void fake_ref(struct broker_peer *p) { ((struct fake *)p)->refs++; }
static void fake_unref(struct broker_peer *p) { ((struct fake *)p)->refs--; }

static const struct broker_peer_ops fake_ops = { fake_reply, fake_refuse, fake_ref, fake_unref, NULL };

/* fake_init: a peer of uid with connection number id (the "client N" of log lines), pid
 * 4242, no fd sent yet. */
static void fake_init(struct fake *f, uint64_t id, uid_t uid)
{
    memset(f, 0, sizeof(*f));
    f->peer.ops = &fake_ops;
    f->peer.id = id;
    f->peer.pid = 4242;
    f->peer.uid = uid;
    f->last_fd = -1;
}

#endif
