/* SPDX-License-Identifier: MIT */
/* test-status.c: the status map (daemon/status.c) that shmrefctl, the metrics exporter
 * and operators' scripts read: built from a real pool, quota and registry and a list of
 * sessions, decoded here with msgpack-c. Keys are stable; lists are cut at 500 entries
 * with *_total saying how many there are; a map that does not fit is -EMSGSIZE. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>
#include <uv.h>

#include "core-fixture.h"
#include "pool-callback.h"
#include "status.h"

#define MiB (UINT64_C(1) << 20)

static uint8_t buf[PROTO_MAX_REPLY];

struct fx {
    uv_loop_t loop;
    struct core core;
    struct options opt;
    struct counters counters;
    struct pool *pool;
    struct quota *quota;
    struct registry *reg;
    struct session_env env;
    struct session *sessions;
    struct status_src src;
    msgpack_unpacked up;
};

static void fx_open(struct fx *f, unsigned nsessions)
{
    memset(f, 0, sizeof(*f));
    core_open(&f->core, &f->loop, "status", 64 * MiB, 16 * MiB);
    f->pool = f->core.pool;
    f->quota = f->core.quota;
    f->reg = f->core.reg;
    f->opt = (struct options){ .socket_path = (char *)"/run/x.sock", .pool_size = 64 * MiB,
                               .tenant_quota = 16 * MiB, .max_lease_size = 8 * MiB, .max_leases = 5,
                               .max_clients = 700 };
    f->sessions = calloc(nsessions ? nsessions : 1, sizeof(*f->sessions));
    for (unsigned i = 0; i < nsessions; i++) {
        struct session *s = &f->sessions[i];
        s->peer.id = i + 1;
        s->peer.pid = 100 + i;
        s->peer.uid = 1000;
        snprintf(s->name, sizeof(s->name), "client-%u", i);
        s->next = i + 1 < nsessions ? &f->sessions[i + 1] : NULL;
    }
    f->env.head = nsessions ? f->sessions : NULL;
    f->env.n = nsessions;
    f->src = (struct status_src){ .uptime_ms = 1234, .opt = &f->opt, .pool = f->pool, .quota = f->quota,
                                  .reg = f->reg, .counters = &f->counters, .sessions = &f->env };
    msgpack_unpacked_init(&f->up);
}

static void fx_close(struct fx *f)
{
    msgpack_unpacked_destroy(&f->up);
    core_close(&f->core, &f->loop);
    free(f->sessions);
}

static const msgpack_object *build(struct fx *f)
{
    int n = status_build(&f->src, buf, sizeof(buf));
    cr_assert_gt(n, 0, "status_build: %d", n);
    cr_assert_eq(msgpack_unpack_next(&f->up, (const char *)buf, (size_t)n, NULL), MSGPACK_UNPACK_SUCCESS);
    cr_assert_eq(f->up.data.type, MSGPACK_OBJECT_MAP);
    return &f->up.data;
}

/* at: the value at a dotted path of maps ("pool.kind"), or NULL. */
static const msgpack_object *at(const msgpack_object *o, const char *path)
{
    char key[64];
    while (*path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof(key), "%.*s", (int)n, path);
        path += n + (path[n] == '.');
        if (o->type != MSGPACK_OBJECT_MAP)
            return NULL;
        const msgpack_object *next = NULL;
        for (uint32_t i = 0; i < o->via.map.size && !next; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(key) &&
                memcmp(k->via.str.ptr, key, k->via.str.size) == 0)
                next = &o->via.map.ptr[i].val;
        }
        if (!next)
            return NULL;
        o = next;
    }
    return o;
}

static uint64_t u64(const msgpack_object *root, const char *path)
{
    const msgpack_object *o = at(root, path);
    cr_assert_not_null(o, "no key %s", path);
    cr_assert_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER, "%s is not a number", path);
    return o->via.u64;
}

static void expect_str(const msgpack_object *root, const char *path, const char *want)
{
    const msgpack_object *o = at(root, path);
    cr_assert_not_null(o, "no key %s", path);
    cr_assert_eq(o->type, MSGPACK_OBJECT_STR);
    cr_assert(o->via.str.size == strlen(want) && memcmp(o->via.str.ptr, want, o->via.str.size) == 0,
              "%s is %.*s, not %s", path, (int)o->via.str.size, o->via.str.ptr, want);
}

Test(status, every_section_with_its_numbers)
{
    struct fx f;
    char why[256];
    fx_open(&f, 2);
    /* one live buffer of uid 1000, as the broker would make it */
    struct got g = { 0 };
    struct pool_buf *pb = NULL;
    cr_assert_eq(pool_get(f.pool, 5000, 1000, &pb, got_cb, &g), 1);
    while (!g.calls)
        uv_run(&f.loop, UV_RUN_ONCE);
    struct quota_ticket t;
    cr_assert_eq(quota_take(f.quota, 1000, g.buf->size, &t, why, sizeof(why)), 0);
    struct registry_buf *b = registry_buf_charged(f.reg, g.buf, &t, 5000);
    uint64_t handle;
    cr_assert_eq(registry_hold(f.reg, &f.sessions[0].peer.holder, b, true, &handle), 0);
    f.counters.leases = 3;
    f.counters.refused_quota = 2;

    const msgpack_object *st = build(&f);
    cr_assert_eq(st->via.map.size, 10);
    expect_str(st, "daemon.version", SHMREF_VERSION_STRING);
    cr_assert_eq(u64(st, "daemon.protocol"), PROTO_VERSION);
    cr_assert_eq(u64(st, "daemon.pid"), (uint64_t)getpid());
    cr_assert_eq(u64(st, "daemon.uptime_ms"), 1234);
    expect_str(st, "daemon.socket", "/run/x.sock");
    cr_assert_eq(u64(st, "daemon.clients"), 2);
    expect_str(st, "pool.kind", "tmpfile");
    cr_assert_eq(u64(st, "pool.bytes_total"), 64 * MiB);
    cr_assert_eq(u64(st, "pool.bytes_leased"), 8192);
    cr_assert_eq(u64(st, "pool.bytes_free"), 64 * MiB - 8192);
    cr_assert_eq(u64(st, "pool.bytes_allocated"), 8192);
    cr_assert_eq(u64(st, "pool.bytes_warm"), 0);
    cr_assert_eq(u64(st, "buffers.live"), 1);
    cr_assert_eq(u64(st, "buffers.leases"), 1);
    cr_assert_eq(u64(st, "tenants_total"), 1);
    cr_assert_eq(u64(st, "clients_total"), 2);
    cr_assert_eq(u64(st, "limits.max_leases_per_client"), 5);
    cr_assert_eq(u64(st, "limits.max_clients"), 700);
    cr_assert_eq(u64(st, "counters.leases"), 3);
    cr_assert_eq(u64(st, "counters.refused_quota"), 2);
    cr_assert_eq(u64(st, "counters.buffers_created"), 1);
    const msgpack_object *clients = at(st, "clients");
    cr_assert_eq(clients->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(clients->via.array.size, 2);
    expect_str(&clients->via.array.ptr[0], "name", "client-0");
    cr_assert_eq(u64(&clients->via.array.ptr[0], "leases"), 1);
    cr_assert_eq(u64(&clients->via.array.ptr[0], "bytes"), 8192);
    cr_assert_eq(u64(&clients->via.array.ptr[1], "leases"), 0);
    const msgpack_object *tenants = at(st, "tenants");
    cr_assert_eq(tenants->via.array.size, 1);
    cr_assert_eq(u64(&tenants->via.array.ptr[0], "uid"), 1000);
    cr_assert_eq(u64(&tenants->via.array.ptr[0], "bytes"), 8192);
    cr_assert_eq(u64(&tenants->via.array.ptr[0], "quota"), 16 * MiB);
    const msgpack_object *classes = at(st, "pool.classes");
    cr_assert_eq(classes->via.array.size, 1);
    cr_assert_eq(u64(&classes->via.array.ptr[0], "size"), 8192);

    registry_release_all(f.reg, &f.sessions[0].peer.holder);
    fx_close(&f);
}

Test(status, lists_are_cut_and_counted)
{
    struct fx f;
    fx_open(&f, 600);
    const msgpack_object *st = build(&f);
    cr_assert_eq(u64(st, "clients_total"), 600);
    cr_assert_eq(at(st, "clients")->via.array.size, 500);
    fx_close(&f);
}

Test(status, too_small_a_buffer_is_emsgsize)
{
    struct fx f;
    fx_open(&f, 1);
    cr_assert_eq(status_build(&f.src, buf, 64), -EMSGSIZE);
    fx_close(&f);
}
