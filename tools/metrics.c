/* SPDX-License-Identifier: MIT */
/* metrics.c: see metrics.h. Names follow Prometheus conventions: base units (bytes,
 * seconds), _total for counters, labels for states and tenants. */
#include "metrics.h"

#include <stdint.h>
#include <string.h>

static uint64_t get(const shmref_status *st, const char *path)
{
    uint64_t v = 0;
    shmref_status_u64(st, path, &v);
    return v;
}

static void head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t v)
{
    head(f, name, type, help);
    fprintf(f, "%s %llu\n", name, (unsigned long long)v);
}

/* each: for every element of the array at list, print name{label="<key>"} <field>. */
static void each(const shmref_status *st, FILE *f, const char *list, const char *label, const char *key,
                 const char *name, const char *field)
{
    int n = shmref_status_count(st, list);
    for (int i = 0; i < n; i++) {
        char k[128], v[128];
        snprintf(k, sizeof(k), "%s.%d.%s", list, i, key);
        snprintf(v, sizeof(v), "%s.%d.%s", list, i, field);
        fprintf(f, "%s{%s=\"%llu\"} %llu\n", name, label, (unsigned long long)get(st, k),
                (unsigned long long)get(st, v));
    }
}

static void pool(const shmref_status *st, FILE *f)
{
    static const char *const states[] = { "total", "leased", "free", "allocated", "warm" };
    head(f, "shmref_pool_bytes", "gauge", "Bytes of the pool by state (total is the cap).");
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "pool.bytes_%s", states[i]);
        fprintf(f, "shmref_pool_bytes{state=\"%s\"} %llu\n", states[i], (unsigned long long)get(st, k));
    }
    one(f, "shmref_pool_fs_available_bytes", "gauge", "Bytes the pool directory's filesystem has left.",
        get(st, "pool.fs_available"));
    one(f, "shmref_pool_pinned_bytes", "gauge", "Bytes of buffers no lease holds that clients still map.",
        get(st, "pool.bytes_pinned"));
    one(f, "shmref_pool_mappers", "gauge", "Processes whose connection closed, charged for sealed buffers they map.",
        get(st, "pool.mappers"));
    one(f, "shmref_stock_reserve_bytes", "gauge", "The stock reserve: bytes beyond the cap for clients' stock leases.",
        get(st, "pool.stock_reserve"));
    one(f, "shmref_stock_bytes", "gauge", "Bytes of stock leases (in the stock reserve).", get(st, "pool.bytes_stock"));
    head(f, "shmref_pool_class_buffers", "gauge", "Buffers per size class, by state.");
    int n = shmref_status_count(st, "pool.classes");
    for (int i = 0; i < n; i++) {
        char k[64];
        snprintf(k, sizeof(k), "pool.classes.%d.size", i);
        uint64_t size = get(st, k);
        snprintf(k, sizeof(k), "pool.classes.%d.total", i);
        fprintf(f, "shmref_pool_class_buffers{class_bytes=\"%llu\",state=\"total\"} %llu\n",
                (unsigned long long)size, (unsigned long long)get(st, k));
        snprintf(k, sizeof(k), "pool.classes.%d.free", i);
        fprintf(f, "shmref_pool_class_buffers{class_bytes=\"%llu\",state=\"free\"} %llu\n",
                (unsigned long long)size, (unsigned long long)get(st, k));
    }
}

static void tenants_and_clients(const shmref_status *st, FILE *f)
{
    head(f, "shmref_tenant_bytes", "gauge", "Bytes held (leased or retained) per tenant uid.");
    each(st, f, "tenants", "uid", "uid", "shmref_tenant_bytes", "bytes");
    head(f, "shmref_tenant_quota_bytes", "gauge", "Quota in force per tenant uid.");
    each(st, f, "tenants", "uid", "uid", "shmref_tenant_quota_bytes", "quota");
    head(f, "shmref_tenant_buffers", "gauge", "Live buffers charged per tenant uid.");
    each(st, f, "tenants", "uid", "uid", "shmref_tenant_buffers", "buffers");
    head(f, "shmref_tenant_pinned_bytes", "gauge", "Bytes per tenant uid that its mappings pin (no lease holds them).");
    each(st, f, "tenants", "uid", "uid", "shmref_tenant_pinned_bytes", "pinned");
    head(f, "shmref_tenant_stock_bytes", "gauge", "Bytes of stock leases per tenant uid.");
    each(st, f, "tenants", "uid", "uid", "shmref_tenant_stock_bytes", "stock");
    one(f, "shmref_clients", "gauge", "Connected clients.", get(st, "clients_total"));
    one(f, "shmref_fds_in_flight", "gauge", "Buffer fds sent to clients and not yet received by them.",
        get(st, "daemon.fds_in_flight"));
    one(f, "shmref_fds_in_flight_budget", "gauge", "The daemon's budget of fds in flight (half of RLIMIT_NOFILE).",
        get(st, "daemon.fds_in_flight_budget"));
    one(f, "shmref_retentions_reclaimed_total", "counter",
        "Retentions ended early because their tenant's lease needed the quota.", get(st, "buffers.reclaimed"));
    one(f, "shmref_leases_held", "gauge", "Lease handles held by all clients.", get(st, "buffers.leases"));
    head(f, "shmref_buffers", "gauge", "Live buffers by state.");
    fprintf(f, "shmref_buffers{state=\"live\"} %llu\n", (unsigned long long)get(st, "buffers.live"));
    fprintf(f, "shmref_buffers{state=\"published\"} %llu\n", (unsigned long long)get(st, "buffers.published"));
    fprintf(f, "shmref_buffers{state=\"retained\"} %llu\n", (unsigned long long)get(st, "buffers.retained"));
}

static void counters(const shmref_status *st, FILE *f)
{
    static const struct { const char *key, *name, *help; } c[] = {
        { "connections", "shmref_connections_total", "Connections accepted." },
        { "messages", "shmref_messages_total", "Messages read from clients (handoffs in a uid's table send none)." },
        { "leases", "shmref_leases_total", "Leases granted." },
        { "publishes", "shmref_publishes_total", "Buffers published." },
        { "acquires", "shmref_acquires_total", "Acquires granted." },
        { "releases", "shmref_releases_total", "Explicit releases." },
        { "reclaimed_leases", "shmref_reclaimed_leases_total", "Leases released because their client left or died." },
        { "reclaimed_clients", "shmref_reclaimed_clients_total", "Clients that left holding leases." },
        { "protocol_errors", "shmref_protocol_errors_total", "Connections dropped for protocol errors." },
        { "slow_clients", "shmref_slow_clients_total", "Connections dropped for not reading replies." },
        { "buffers_created", "shmref_buffers_created_total", "Backing files created and reserved." },
        { "buffers_recycled", "shmref_buffers_recycled_total", "Leases served from a warm buffer." },
        { "buffers_retired", "shmref_buffers_retired_total", "Backing files closed." },
        { "buffers_evicted", "shmref_buffers_evicted_total", "Warm buffers closed to make room." },
        { "buffers_create_failed", "shmref_buffers_create_failed_total", "Failed creations (full tmpfs)." },
        { "buffers_tampered", "shmref_buffers_tampered_total", "Buffers retired because they came back resized." },
        { "retentions_expired", "shmref_retentions_expired_total", "Retentions that ran out unacquired." },
        { "clients_closed", "shmref_clients_closed_total", "Clients that closed holding nothing (a clean close)." },
        { "clients_died", "shmref_clients_died_total", "Clients that went away holding leases (died, or closed without releasing)." },
        { "lease_waits", "shmref_lease_waits_total", "Leases that waited for quota or pool space." },
        { "lease_wait_timeouts", "shmref_lease_wait_timeouts_total", "Waiting leases whose deadline passed (ETIMEDOUT)." },
        { "acquire_waits", "shmref_acquire_waits_total", "Acquires that waited for a publish." },
        { "acquire_wait_timeouts", "shmref_acquire_wait_timeouts_total", "Waiting acquires whose deadline passed (ENOENT)." },
        { "fd_waits", "shmref_fd_waits_total", "Replies whose fd waited because the daemon uid's fds in flight passed RLIMIT_NOFILE (ETOOMANYREFS)." },
        { "buffers_emptied_mapped", "shmref_buffers_emptied_mapped_total", "Retired buffers whose pages were freed under clients' mappings." },
        { "buffers_empty_failed", "shmref_buffers_empty_failed_total", "Retired buffers whose pages could not be freed." },
        { "stock_leases", "shmref_stock_leases_total", "Stock leases granted from the stock reserve." },
        { "stock_refused", "shmref_stock_refused_total", "Stock leases refused (EAGAIN): reserve, size or per-uid cap." },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "counters.%s", c[i].key);
        one(f, c[i].name, "counter", c[i].help, get(st, k));
    }
    static const char *const reasons[] = { "quota", "space", "limit", "access", "other" };
    head(f, "shmref_refusals_total", "counter", "Requests or connections refused, by reason.");
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
        char k[64];
        snprintf(k, sizeof(k), "counters.refused_%s", reasons[i]);
        fprintf(f, "shmref_refusals_total{reason=\"%s\"} %llu\n", reasons[i], (unsigned long long)get(st, k));
    }
}

void metrics_print(const shmref_status *st, FILE *f)
{
    one(f, "shmref_up", "gauge", "Whether shmrefd answered.", 1);
    fprintf(f, "# HELP shmref_uptime_seconds Seconds since shmrefd started.\n"
               "# TYPE shmref_uptime_seconds gauge\nshmref_uptime_seconds %.3f\n",
            (double)get(st, "daemon.uptime_ms") / 1000.0);
    pool(st, f);
    tenants_and_clients(st, f);
    counters(st, f);
}

void metrics_print_down(FILE *f)
{
    one(f, "shmref_up", "gauge", "Whether shmrefd answered.", 0);
}
