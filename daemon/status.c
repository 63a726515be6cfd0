/* SPDX-License-Identifier: MIT */
/* status.c: see status.h. Keys are stable: shmrefctl, the metrics exporter and operators'
 * scripts read them; add keys, never rename them. */
#include "status.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>


#define LIST_MAX 500 /* keeps the worst case (long client names) well inside one reply */
#define LIST_SHORT 100 /* when the full lists do not fit, status_build retries with these */

static void key(msgpack_packer *pk, const char *k)
{
    size_t n = strlen(k);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, k, n);
}

static void kv_u64(msgpack_packer *pk, const char *k, uint64_t v)
{
    key(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void kv_str(msgpack_packer *pk, const char *k, const char *v)
{
    key(pk, k);
    key(pk, v);
}

static void pack_daemon(msgpack_packer *pk, const struct status_src *s)
{
    key(pk, "daemon");
    msgpack_pack_map(pk, 8);
    kv_str(pk, "version", SHMREF_VERSION_STRING);
    kv_u64(pk, "protocol", PROTO_VERSION);
    kv_u64(pk, "pid", (uint64_t)getpid());
    kv_u64(pk, "uptime_ms", s->uptime_ms);
    kv_str(pk, "socket", s->opt->socket_path ? s->opt->socket_path : "");
    kv_u64(pk, "clients", s->sessions->n);
    kv_u64(pk, "fds_in_flight", transport_fds_in_flight());        /* sent, not yet received */
    kv_u64(pk, "fds_in_flight_budget", transport_fd_budget());     /* below the kernel's limit */
}

static void pack_pool(msgpack_packer *pk, const struct status_src *s)
{
    struct pool_class_stat cls[POOL_MAX_CLASSES];
    struct registry_stats rs = registry_stats(s->reg);
    uint64_t cap = pool_cap(s->pool);
    unsigned n = pool_classes(s->pool, cls, POOL_MAX_CLASSES);

    key(pk, "pool");
    msgpack_pack_map(pk, 14);
    kv_str(pk, "dir", pool_dir(s->pool));
    kv_str(pk, "kind", pool_kind(s->pool));
    kv_u64(pk, "bytes_total", cap);
    /* leased: buffers the daemon holds for someone (a handle, a retention); in tables: the
     * tenants' own (free, or held without the daemon), charged to them all the same */
    kv_u64(pk, "bytes_leased", rs.bytes - rs.lent_bytes);
    kv_u64(pk, "bytes_tables", rs.lent_bytes);
    kv_u64(pk, "bytes_free", cap > rs.bytes ? cap - rs.bytes : 0);
    kv_u64(pk, "bytes_allocated", pool_bytes_alloc(s->pool));
    kv_u64(pk, "bytes_warm", pool_bytes_warm(s->pool));
    kv_u64(pk, "fs_available", pool_fs_available(s->pool));
    kv_u64(pk, "bytes_pinned", pool_bytes_pinned(s->pool));
    kv_u64(pk, "mappers", pool_mappers(s->pool));
    kv_u64(pk, "stock_reserve", pool_stock_reserve(s->pool));
    kv_u64(pk, "bytes_stock", pool_bytes_stock(s->pool));
    key(pk, "classes");
    msgpack_pack_array(pk, n);
    for (unsigned i = 0; i < n; i++) {
        msgpack_pack_map(pk, 3);
        kv_u64(pk, "size", cls[i].size);
        kv_u64(pk, "total", cls[i].total);
        kv_u64(pk, "free", cls[i].nfree);
    }
}

/* pack_buffer: one entry of buffers.list. */
static void pack_buffer(msgpack_packer *pk, const struct status_src *s, const struct registry_buf *b)
{
    uint64_t now = s->now_ms;
    const char *state = !b->published ? "writing" : b->retained ? "retained" : "published";
    msgpack_pack_map(pk, 9);
    kv_u64(pk, "id", b->pb->id);
    kv_str(pk, "state", state);
    kv_u64(pk, "size", b->size);
    kv_u64(pk, "capacity", b->pb->size);
    kv_u64(pk, "uid", b->tenant);
    kv_u64(pk, "pid", b->producer_pid > 0 ? (uint64_t)b->producer_pid : 0);
    kv_u64(pk, "holders", b->refs - (b->retained ? 1 : 0));
    kv_u64(pk, "age_ms", now - b->created_ms);
    kv_u64(pk, "retention_left_ms", b->retained && b->deadline > now ? b->deadline - now : 0);
}

/* visible: whether the viewer may see what uid owns (status privacy: an unprivileged
 * viewer sees its own uid's clients, buffers and tenant; totals stay global). */
static bool visible(const struct status_src *s, uint32_t uid)
{
    return !s->only_uid || s->uid == uid;
}

/* writing: whether l is a producer's handle on a buffer not yet published (each such
 * buffer has exactly one: its producer's). */
static bool writing(const struct registry_lease *l)
{
    return l->buf && l->writable && !l->buf->published;
}

/* pack_buffer_list: published buffers (from the registry), then buffers still being
 * written (each held by its producer alone), up to max in all. */
static void pack_buffer_list(msgpack_packer *pk, const struct status_src *s, unsigned max)
{
    static const struct registry_buf *pub[LIST_MAX];
    unsigned npub = registry_published(s->reg, pub, s->only_uid ? LIST_MAX : max), nwr = 0, total = 0;
    for (const struct session *c = s->sessions->head; c; c = c->next)
        for (uint32_t i = 0; i < c->peer.holder.nslots; i++)
            total += writing(&c->peer.holder.slots[i]) && visible(s, c->peer.holder.slots[i].buf->tenant);
    if (s->only_uid) {
        unsigned k = 0;
        for (unsigned i = 0; i < npub; i++)
            if (visible(s, pub[i]->tenant))
                pub[k++] = pub[i];
        npub = k < max ? k : max;
        total += k;
    } else {
        total += (unsigned)registry_stats(s->reg).published;
    }
    nwr = total - npub < max - npub ? total - npub : max - npub;
    kv_u64(pk, "list_total", total);
    key(pk, "list");
    msgpack_pack_array(pk, npub + nwr);
    for (unsigned i = 0; i < npub; i++)
        pack_buffer(pk, s, pub[i]);
    unsigned done = 0;
    for (const struct session *c = s->sessions->head; c && done < nwr; c = c->next)
        for (uint32_t i = 0; i < c->peer.holder.nslots && done < nwr; i++)
            if (writing(&c->peer.holder.slots[i]) && visible(s, c->peer.holder.slots[i].buf->tenant)) {
                pack_buffer(pk, s, c->peer.holder.slots[i].buf);
                done++;
            }
}

static void pack_buffers(msgpack_packer *pk, const struct status_src *s, unsigned max)
{
    struct registry_stats rs = registry_stats(s->reg);
    key(pk, "buffers");
    msgpack_pack_map(pk, 9);
    kv_u64(pk, "live", rs.buffers - rs.lent); /* the daemon holds them for someone (not: in tables) */
    kv_u64(pk, "leases", rs.handles);
    kv_u64(pk, "published", rs.published);
    kv_u64(pk, "retained", rs.retained);
    kv_u64(pk, "retained_bytes", rs.retained_bytes);
    kv_u64(pk, "expired", rs.expired);
    kv_u64(pk, "reclaimed", rs.reclaimed); /* retentions ended for their tenant's lease */
    pack_buffer_list(pk, s, max);
}

static void pack_tenants(msgpack_packer *pk, const struct status_src *s, unsigned max)
{
    static struct quota_tenant t[LIST_MAX];
    unsigned n = quota_tenants(s->quota, t, s->only_uid ? LIST_MAX : max), k = 0;
    for (unsigned i = 0; i < n; i++)
        if (visible(s, t[i].uid))
            t[k++] = t[i];
    n = k < max ? k : max;
    kv_u64(pk, "tenants_total", s->only_uid ? k : quota_count(s->quota));
    key(pk, "tenants");
    msgpack_pack_array(pk, n);
    for (unsigned i = 0; i < n; i++) {
        msgpack_pack_map(pk, 11);
        kv_u64(pk, "uid", t[i].uid);
        kv_u64(pk, "bytes", t[i].bytes);
        kv_u64(pk, "quota", t[i].quota);
        kv_u64(pk, "buffers", t[i].buffers);
        kv_u64(pk, "refused_quota", t[i].refused_quota);
        kv_u64(pk, "refused_space", t[i].refused_space);
        kv_u64(pk, "refused_limit", t[i].refused_limit);
        kv_u64(pk, "refused_access", t[i].refused_access);
        kv_u64(pk, "refused_other", t[i].refused_other);
        kv_u64(pk, "pinned", t[i].pinned);
        kv_u64(pk, "stock", t[i].stock);
    }
}

static void pack_clients(msgpack_packer *pk, const struct status_src *s, unsigned max)
{
    uint32_t total = 0;
    for (const struct session *c = s->sessions->head; c; c = c->next)
        total += visible(s, c->peer.uid);
    unsigned n = total < max ? total : max;
    kv_u64(pk, "clients_total", total);
    key(pk, "clients");
    msgpack_pack_array(pk, n);
    const struct session *c = s->sessions->head;
    for (unsigned i = 0; i < n && c; c = c->next) {
        if (!visible(s, c->peer.uid))
            continue;
        i++;
        msgpack_pack_map(pk, 7);
        kv_u64(pk, "id", c->peer.id);
        kv_u64(pk, "pid", (uint64_t)c->peer.pid);
        kv_u64(pk, "uid", c->peer.uid);
        kv_str(pk, "name", c->name);
        kv_u64(pk, "leases", c->peer.holder.leases);
        kv_u64(pk, "bytes", c->peer.holder.bytes);
        kv_u64(pk, "connected_ms", s->now_ms - c->accepted_ms);
    }
}

static void pack_limits(msgpack_packer *pk, const struct status_src *s)
{
    key(pk, "limits");
    msgpack_pack_map(pk, 9);
    kv_u64(pk, "pool_size", s->opt->pool_size);
    kv_u64(pk, "tenant_quota", s->opt->tenant_quota);
    kv_u64(pk, "max_lease_size", s->opt->max_lease_size);
    kv_u64(pk, "max_leases_per_client", s->opt->max_leases);
    kv_u64(pk, "max_clients", s->opt->max_clients);
    kv_u64(pk, "max_clients_per_uid", s->opt->max_clients_per_uid);
    kv_u64(pk, "max_parked_per_uid", s->opt->max_parked_per_uid);
    kv_u64(pk, "reserved_clients", s->reserved_clients);
    kv_u64(pk, "idle_timeout_s", s->opt->idle_timeout);
}

static void pack_counters(msgpack_packer *pk, const struct status_src *s)
{
    const struct counters *k = s->counters;
    struct pool_counters pc = pool_counters(s->pool);
    key(pk, "counters");
    msgpack_pack_map(pk, 33);
    kv_u64(pk, "connections", k->connections);
    kv_u64(pk, "messages", k->messages);
    kv_u64(pk, "leases", k->leases);
    kv_u64(pk, "publishes", k->publishes);
    kv_u64(pk, "acquires", k->acquires);
    kv_u64(pk, "releases", k->releases);
    kv_u64(pk, "reclaimed_leases", k->reclaimed_leases);
    kv_u64(pk, "reclaimed_clients", k->reclaimed_clients);
    kv_u64(pk, "refused_quota", k->refused_quota);
    kv_u64(pk, "refused_space", k->refused_space);
    kv_u64(pk, "refused_limit", k->refused_limit);
    kv_u64(pk, "refused_other", k->refused_other);
    kv_u64(pk, "refused_access", k->refused_access);
    kv_u64(pk, "protocol_errors", k->protocol_errors);
    kv_u64(pk, "slow_clients", k->slow_clients);
    kv_u64(pk, "buffers_created", pc.created);
    kv_u64(pk, "buffers_recycled", pc.recycled);
    kv_u64(pk, "buffers_retired", pc.retired);
    kv_u64(pk, "buffers_evicted", pc.evicted);
    kv_u64(pk, "buffers_create_failed", pc.create_failed);
    kv_u64(pk, "buffers_tampered", pc.tampered);
    kv_u64(pk, "buffers_emptied_mapped", pc.emptied_mapped);
    kv_u64(pk, "buffers_empty_failed", pc.empty_failed);
    kv_u64(pk, "stock_leases", k->stock_leases);
    kv_u64(pk, "stock_refused", k->stock_refused);
    kv_u64(pk, "retentions_expired", registry_stats(s->reg).expired);
    kv_u64(pk, "clients_closed", k->clients_closed);
    kv_u64(pk, "clients_died", k->clients_died);
    kv_u64(pk, "lease_waits", k->lease_waits);
    kv_u64(pk, "lease_wait_timeouts", k->lease_wait_timeouts);
    kv_u64(pk, "acquire_waits", k->acquire_waits);
    kv_u64(pk, "acquire_wait_timeouts", k->acquire_wait_timeouts);
    kv_u64(pk, "fd_waits", k->fd_waits);
}

/* pack_table: same-tenant handoffs without the daemon (tenantdir.c). */
static void pack_table(msgpack_packer *pk, const struct status_src *s)
{
    const struct tenantdirs *t = s->sessions ? s->sessions->tenantdirs : NULL;
    struct tenantdir_stats st = t ? t->st : (struct tenantdir_stats){ 0 };
    key(pk, "table");
    msgpack_pack_map(pk, 15);
    kv_u64(pk, "tables", st.tables);        /* uids with a table connection */
    kv_u64(pk, "journals", st.journals);    /* connections with a journal */
    kv_u64(pk, "members", tenantdir_members(t)); /* buffers in tables now (charged to their uids) */
    kv_u64(pk, "lent", registry_stats(s->reg).lent); /* of those, with no daemon reference */
    kv_u64(pk, "slots", pool_slots_used(s->pool));
    kv_u64(pk, "grants", st.grants);
    kv_u64(pk, "takes", st.takes);
    kv_u64(pk, "maps", st.maps);
    kv_u64(pk, "adopts", st.adopts);
    kv_u64(pk, "givebacks", st.givebacks);
    kv_u64(pk, "reclaimed", st.reclaimed);
    kv_u64(pk, "crash_holds", st.crash_holds);
    kv_u64(pk, "repaired", st.repaired);
    kv_u64(pk, "ignored", st.ignored);
    kv_u64(pk, "idle_visits", st.idle_visits); /* members walked by idle checks */
}

static int build(const struct status_src *s, uint8_t *buf, size_t cap, unsigned max)
{
    struct proto_buf pb = { buf, 0, cap, 0 };
    msgpack_packer pk;
    msgpack_packer_init(&pk, &pb, proto_buf_write);
    msgpack_pack_map(&pk, 10);
    pack_daemon(&pk, s);
    pack_pool(&pk, s);
    pack_buffers(&pk, s, max);
    pack_tenants(&pk, s, max);
    pack_clients(&pk, s, max);
    pack_limits(&pk, s);
    pack_counters(&pk, s);
    pack_table(&pk, s);
    return pb.overflow ? -EMSGSIZE : (int)pb.len;
}

int status_build(const struct status_src *s, uint8_t *buf, size_t cap)
{
    int n = build(s, buf, cap, LIST_MAX);
    return n == -EMSGSIZE ? build(s, buf, cap, LIST_SHORT) : n;
}
