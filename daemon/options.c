/* SPDX-License-Identifier: MIT */
/* options.c: see options.h. The key table below is the one place a setting is named,
 * typed and parsed; the command line, the config file, merging and printing all walk it. */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include "paths.h"
#include "units.h"

enum type { T_STR, T_MODE, T_SIZE, T_COUNT, T_BOOL, T_TRI, T_UIDS, T_GIDS, T_COUNT0 /* 0 allowed */, T_SIZE0 };

struct key {
    const char *name;
    int short_opt;
    enum type type;
    size_t off;
    const char *help;
};

#define OFF(f) offsetof(struct options, f)
static const struct key keys[] = {
    { "socket", 's', T_STR, OFF(socket_path), "listen here" },
    { "socket-mode", 0, T_MODE, OFF(socket_mode), "octal file mode of the socket (0660)" },
    { "socket-group", 0, T_STR, OFF(socket_group), "group owning the socket file" },
    { "pool-dir", 'd', T_STR, OFF(pool_dir), "tmpfs directory of the buffers (/dev/shm)" },
    { "pool-size", 'p', T_SIZE, OFF(pool_size), "cap on buffer bytes (1G, or half of what pool-dir has)" },
    { "tenant-quota", 'q', T_SIZE, OFF(tenant_quota), "bytes one uid may hold (half the pool)" },
    { "max-lease-size", 0, T_SIZE, OFF(max_lease_size), "largest single lease (the pool size)" },
    { "max-leases", 0, T_COUNT, OFF(max_leases), "lease handles per connection (4096)" },
    { "max-clients", 0, T_COUNT, OFF(max_clients), "concurrent connections (1024)" },
    { "pool-hugepages", 0, T_TRI, OFF(pool_hugepages), "auto, yes or no: a private huge-page tmpfs (auto)" },
    { "memfd", 0, T_BOOL, OFF(memfd), "memfd_create instead of O_TMPFILE (no)" },
    { "sched-batch", 0, T_BOOL, OFF(sched_batch),
      "run as SCHED_BATCH: woken by a client's one-way message, never preempt it (no)" },
    { "verbose", 'v', T_BOOL, OFF(verbose), "log debug lines (no)" },
    { "user", 'u', T_STR, OFF(user), "run as this user after setup, when started as root" },
    { "allow-users", 0, T_UIDS, OFF(allow_uids), "uids or names allowed to connect (all)" },
    { "allow-groups", 0, T_GIDS, OFF(allow_gids), "gids or names allowed to connect (all)" },
    { "max-clients-per-uid", 0, T_COUNT, OFF(max_clients_per_uid),
      "connections of one uid, root and the daemon's uid (unless nobody) exempt (half of max-clients)" },
    { "max-parked-per-uid", 0, T_COUNT, OFF(max_parked_per_uid),
      "requests of one uid waiting (wait_ms) on all its connections (4 x max-leases)" },
    { "idle-timeout", 0, T_COUNT0, OFF(idle_timeout),
      "seconds a connection holding nothing may stay silent; 0: forever (600)" },
    { "stock-reserve", 0, T_SIZE0, OFF(stock_reserve),
      "bytes beyond pool-size for clients' lease stocks; 0: no stock (pool-size/16, at most 64M)" },
    { "stock-max-lease", 0, T_SIZE, OFF(stock_max_lease), "largest stock lease (a quarter of stock-reserve, at most 4M)" },
    { "stock-per-uid", 0, T_SIZE, OFF(stock_per_uid), "stock bytes one uid may hold (a quarter of stock-reserve)" },
    { "exit-idle", 0, T_COUNT0, OFF(exit_idle),
      "exit after this many seconds with no connection and no buffer in use; 0: never (0)" },
    { "private", 0, T_STR, OFF(private_config),
      "a uid's private daemon, as libshmref starts it, whose user's config file is FILE: tenant-quota "
      "defaults to the pool and refusals name SHMREF_POOL_SIZE, SHMREF_TENANT_QUOTA and FILE (none)" },
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))
#define FIELD(o, k, T) ((T *)((char *)(o) + (k)->off))

static int errf(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int parse_count(const char *v, int base, uint32_t max, uint32_t *ret)
{
    char *end;
    if (!*v || !isdigit((unsigned char)v[0]))
        return -EINVAL;
    errno = 0;
    unsigned long n = strtoul(v, &end, base);
    if (errno || *end || n > max)
        return -EINVAL;
    *ret = (uint32_t)n;
    return 0;
}

static int parse_bool(const char *v, bool *ret)
{
    static const char *const yes[] = { "yes", "true", "on", "1" }, *const no[] = { "no", "false", "off", "0" };
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) { *ret = true; return 0; }
        if (strcasecmp(v, no[i]) == 0) { *ret = false; return 0; }
    }
    return -EINVAL;
}

/* parse_ids: "1000 alice, 1001" into uids (or gids, with group names). */
static int parse_ids(const char *v, bool groups, struct options_list *ret, char *err, size_t len)
{
    struct options_list l = { 0 };
    char *copy = strdup(v), *save = NULL;
    if (!copy)
        return -ENOMEM;
    for (char *t = strtok_r(copy, " \t,", &save); t; t = strtok_r(NULL, " \t,", &save)) {
        uint32_t id;
        if (parse_count(t, 10, UINT32_MAX - 1, &id) < 0) {
            struct passwd *pw = groups ? NULL : getpwnam(t);
            struct group *gr = groups ? getgrnam(t) : NULL;
            if (!pw && !gr) {
                errf(err, len, "unknown %s '%s'", groups ? "group" : "user", t);
                free(copy);
                free(l.v);
                return -EINVAL;
            }
            id = pw ? pw->pw_uid : gr->gr_gid;
        }
        uint32_t *nv = realloc(l.v, (l.n + 1) * sizeof(*nv));
        if (!nv) {
            free(copy);
            free(l.v);
            return -ENOMEM;
        }
        l.v = nv;
        l.v[l.n++] = id;
    }
    free(copy);
    free(ret->v);
    *ret = l;
    return 0;
}

/* set_key: parse value for keys[i] into o. Error text (without location) in err. */
static int set_key(struct options *o, unsigned i, const char *value, char *err, size_t len)
{
    const struct key *k = &keys[i];
    int r = 0;
    switch (k->type) {
    case T_STR: {
        char **p = FIELD(o, k, char *);
        if (!*value)
            return errf(err, len, "%s: needs a value", k->name);
        free(*p);
        if (!(*p = strdup(value)))
            return -ENOMEM;
        break;
    }
    case T_MODE:
        if (parse_count(value, 8, 0777, FIELD(o, k, uint32_t)) < 0)
            return errf(err, len, "%s: '%s' is not an octal file mode like 0660", k->name, value);
        break;
    case T_SIZE: {
        uint64_t *p = FIELD(o, k, uint64_t);
        if (units_parse(value, p) < 0 || *p == 0)
            return errf(err, len, "%s: '%s' is not a size in bytes (like 4096, 64M or 2G)", k->name, value);
        break;
    }
    case T_SIZE0:
        if (units_parse(value, FIELD(o, k, uint64_t)) < 0)
            return errf(err, len, "%s: '%s' is not a size in bytes (like 0, 4096 or 64M)", k->name, value);
        break;
    case T_COUNT: {
        uint32_t *p = FIELD(o, k, uint32_t);
        if (parse_count(value, 10, UINT32_MAX, p) < 0 || *p == 0)
            return errf(err, len, "%s: '%s' is not a number of at least 1", k->name, value);
        break;
    }
    case T_COUNT0:
        if (parse_count(value, 10, UINT32_MAX, FIELD(o, k, uint32_t)) < 0)
            return errf(err, len, "%s: '%s' is not a number", k->name, value);
        break;
    case T_BOOL:
        if (parse_bool(value, FIELD(o, k, bool)) < 0)
            return errf(err, len, "%s: '%s' is not yes or no", k->name, value);
        break;
    case T_TRI: {
        bool b;
        if (strcasecmp(value, "auto") == 0)
            *FIELD(o, k, int) = OPTIONS_HUGE_AUTO;
        else if (parse_bool(value, &b) == 0)
            *FIELD(o, k, int) = b ? OPTIONS_HUGE_YES : OPTIONS_HUGE_NO;
        else
            return errf(err, len, "%s: '%s' is not auto, yes or no", k->name, value);
        break;
    }
    case T_UIDS:
    case T_GIDS:
        r = parse_ids(value, k->type == T_GIDS, FIELD(o, k, struct options_list), err, len);
        if (r == -EINVAL) {
            char inner[256];
            snprintf(inner, sizeof(inner), "%s", err);
            return errf(err, len, "%s: %s", k->name, inner);
        }
        if (r < 0)
            return r;
        break;
    }
    o->set |= 1ULL << i;
    return 0;
}

static int find_key(const char *name)
{
    for (unsigned i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return (int)i;
    return -1;
}

bool options_given(const struct options *o, const char *key)
{
    int i = find_key(key);
    return i >= 0 && (o->set >> i & 1);
}

static void usage(FILE *f)
{
    fputs("Usage: shmrefd [OPTION]...\n"
          "Broker of pre-faulted shared-memory buffers over a Unix socket.\n\n", f);
    for (unsigned i = 0; i < NKEYS; i++) {
        char left[64];
        const char *arg = keys[i].type == T_BOOL ? "" : keys[i].type == T_SIZE || keys[i].type == T_SIZE0 ? " BYTES" : " VALUE";
        if (keys[i].short_opt)
            snprintf(left, sizeof(left), "-%c, --%s%s", keys[i].short_opt, keys[i].name, arg);
        else
            snprintf(left, sizeof(left), "    --%s%s", keys[i].name, arg);
        fprintf(f, "  %-30s %s\n", left, keys[i].help);
    }
    fputs("  -c, --config PATH              config file (default " OPTIONS_DEFAULT_CONFIG ", if present)\n"
          "      --check-config             validate the configuration, print it, and exit\n"
          "  -h, --help                     show this help\n"
          "  -V, --version                  show the version\n\n"
          "The socket defaults to $SHMREFD_SOCKET, else $XDG_RUNTIME_DIR/shmrefd.sock, else\n"
          PATHS_SYSTEM_SOCKET ". Sizes take K, M, G or T suffixes (powers of 1024).\n"
          "A yes/no option alone is yes (--NAME=no: no). Every option is also a key of the\n"
          "config file's [daemon] section; flags win.\n", f);
}

int options_parse_args(int argc, char **argv, struct options *o)
{
    enum { O_CONFIG = 'c', O_CHECK = 1000, O_HELP = 'h', O_VERSION = 'V', O_KEY = 2000 };
    struct option longopts[NKEYS + 5];
    char shortopts[64] = "+c:hV";
    char err[512];
    unsigned n = 0;

    memset(o, 0, sizeof(*o));
    for (unsigned i = 0; i < NKEYS; i++) {
        int arg = keys[i].type == T_BOOL ? no_argument : required_argument;
        /* a yes/no option alone is yes; --name=no turns it off (a default of yes) */
        longopts[n++] = (struct option){ keys[i].name, arg == no_argument ? optional_argument : arg, NULL, O_KEY + (int)i };
        if (keys[i].short_opt) {
            size_t l = strlen(shortopts);
            shortopts[l] = (char)keys[i].short_opt;
            shortopts[l + 1] = arg == required_argument ? ':' : '\0';
            shortopts[l + 2] = '\0';
        }
    }
    longopts[n++] = (struct option){ "config", required_argument, NULL, O_CONFIG };
    longopts[n++] = (struct option){ "check-config", no_argument, NULL, O_CHECK };
    longopts[n++] = (struct option){ "help", no_argument, NULL, O_HELP };
    longopts[n++] = (struct option){ "version", no_argument, NULL, O_VERSION };
    longopts[n] = (struct option){ 0 };

    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        int idx = c >= O_KEY ? c - O_KEY : -1;
        for (unsigned i = 0; idx < 0 && i < NKEYS; i++)
            if (keys[i].short_opt && keys[i].short_opt == c)
                idx = (int)i;
        if (idx >= 0) {
            const char *v = keys[idx].type == T_BOOL ? (optarg ? optarg : "yes") : optarg;
            if (set_key(o, (unsigned)idx, v, err, sizeof(err)) < 0) {
                fprintf(stderr, "shmrefd: --%s\n", err);
                return -EINVAL;
            }
            continue;
        }
        switch (c) {
        case O_CONFIG:
            free(o->config_path);
            o->config_path = strdup(optarg);
            break;
        case O_CHECK: o->check_config = true; break;
        case O_HELP: usage(stdout); return 1;
        case O_VERSION: printf("shmrefd %s (protocol %d)\n", SHMREF_VERSION_STRING, 1); return 1;
        default: fputs("Try 'shmrefd --help'.\n", stderr); return -EINVAL;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "shmrefd: unexpected argument '%s'\nTry 'shmrefd --help'.\n", argv[optind]);
        return -EINVAL;
    }
    return 0;
}

struct file_ctx {
    struct options *o;
    char err[512];
    bool failed;
};

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    struct file_ctx *ctx = user;
    char err[400];
    int r = 0;
    if (strcmp(section, "daemon") == 0) {
        int i = find_key(name);
        if (i < 0)
            r = errf(err, sizeof(err), "unknown key '%s' in [daemon]", name);
        else
            r = set_key(ctx->o, (unsigned)i, value, err, sizeof(err));
    } else if (strcmp(section, "quota") == 0) {
        struct options_list ids = { 0 };
        uint64_t bytes;
        if ((r = parse_ids(name, false, &ids, err, sizeof(err))) == 0 && ids.n != 1)
            r = errf(err, sizeof(err), "[quota] keys are one uid or user name, not '%s'", name);
        else if (r == 0 && (units_parse(value, &bytes) < 0))
            r = errf(err, sizeof(err), "[quota] %s: '%s' is not a size in bytes", name, value);
        if (r == 0) {
            struct options_quota *q = realloc(ctx->o->quotas, (ctx->o->n_quotas + 1) * sizeof(*q));
            if (!q)
                r = -ENOMEM;
            else {
                ctx->o->quotas = q;
                q[ctx->o->n_quotas++] = (struct options_quota){ ids.v[0], bytes };
            }
        }
        free(ids.v);
    } else {
        r = errf(err, sizeof(err), "unknown section [%s] (expected [daemon] or [quota])", section);
    }
    if (r < 0 && !ctx->failed) {
        ctx->failed = true;
        snprintf(ctx->err, sizeof(ctx->err), "%s", r == -ENOMEM ? "out of memory" : err);
    }
    return r == 0;
}

int options_read_file(const char *path, struct options *ret, char *err, size_t err_len)
{
    struct file_ctx ctx = { .o = ret };
    memset(ret, 0, sizeof(*ret));
    FILE *f = fopen(path, "re");
    if (!f) {
        int e = errno;
        errf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    int line = ini_parse_file(f, on_ini, &ctx);
    fclose(f);
    if (line != 0) {
        errf(err, err_len, "%s:%d: %s", path, line, ctx.failed ? ctx.err : "syntax error");
        options_free(ret);
        return -EINVAL;
    }
    return 0;
}

static int copy_key(struct options *dst, const struct options *src, unsigned i)
{
    const struct key *k = &keys[i];
    switch (k->type) {
    case T_STR: {
        char *const *s = FIELD(src, k, char *const);
        char **d = FIELD(dst, k, char *);
        free(*d);
        if (!(*d = *s ? strdup(*s) : NULL) && *s)
            return -ENOMEM;
        break;
    }
    case T_MODE:
    case T_COUNT0:
    case T_COUNT: *FIELD(dst, k, uint32_t) = *FIELD(src, k, const uint32_t); break;
    case T_SIZE: case T_SIZE0: *FIELD(dst, k, uint64_t) = *FIELD(src, k, const uint64_t); break;
    case T_BOOL: *FIELD(dst, k, bool) = *FIELD(src, k, const bool); break;
    case T_TRI: *FIELD(dst, k, int) = *FIELD(src, k, const int); break;
    case T_UIDS:
    case T_GIDS: {
        const struct options_list *s = FIELD(src, k, const struct options_list);
        struct options_list *d = FIELD(dst, k, struct options_list);
        free(d->v);
        d->n = 0;
        if (!(d->v = malloc((s->n ? s->n : 1) * sizeof(uint32_t))))
            return -ENOMEM;
        memcpy(d->v, s->v, s->n * sizeof(uint32_t));
        d->n = s->n;
        break;
    }
    }
    dst->set |= 1ULL << i;
    return 0;
}

int options_merge(const struct options *flags, const struct options *file, struct options *ret)
{
    memset(ret, 0, sizeof(*ret));
    for (unsigned i = 0; i < NKEYS; i++) {
        const struct options *src = flags && (flags->set >> i & 1) ? flags
                                  : file && (file->set >> i & 1)   ? file : NULL;
        if (src && copy_key(ret, src, i) < 0)
            return -ENOMEM;
    }
    if (file && file->n_quotas) {
        if (!(ret->quotas = malloc(file->n_quotas * sizeof(*ret->quotas))))
            return -ENOMEM;
        memcpy(ret->quotas, file->quotas, file->n_quotas * sizeof(*ret->quotas));
        ret->n_quotas = file->n_quotas;
    }
    if (flags && flags->config_path && !(ret->config_path = strdup(flags->config_path)))
        return -ENOMEM;
    ret->check_config = flags && flags->check_config;
    return 0;
}

char *options_default_socket(void)
{
    char buf[4096];
    return paths_default_socket(buf, sizeof(buf)) < 0 ? NULL : strdup(buf);
}

int options_resolve(struct options *o, uint64_t dir_available)
{
    if (!o->socket_path && !(o->socket_path = options_default_socket()))
        return -ENOMEM;
    if (!o->pool_dir && !(o->pool_dir = strdup("/dev/shm")))
        return -ENOMEM;
    if (!o->socket_mode)
        o->socket_mode = 0660;
    if (!o->max_leases)
        o->max_leases = OPTIONS_DEFAULT_MAX_LEASES;
    if (!o->max_clients)
        o->max_clients = OPTIONS_DEFAULT_MAX_CLIENTS;
    if (!o->max_parked_per_uid)
        o->max_parked_per_uid = o->max_leases > UINT32_MAX / 4 ? UINT32_MAX : o->max_leases * 4;
    if (!o->max_clients_per_uid)
        o->max_clients_per_uid = o->max_clients > 1 ? o->max_clients / 2 : 1;
    if (!options_given(o, "idle-timeout"))
        o->idle_timeout = OPTIONS_DEFAULT_IDLE_TIMEOUT;
    if (!o->pool_size) {
        o->pool_size = OPTIONS_DEFAULT_POOL_MAX;
        if (dir_available / 2 < o->pool_size)
            o->pool_size = dir_available / 2;
    }
    if (!o->tenant_quota)
        o->tenant_quota = o->private_config ? o->pool_size : o->pool_size / 2; /* private: one tenant */
    if (!o->max_lease_size)
        o->max_lease_size = o->pool_size;
    if (!options_given(o, "stock-reserve")) {
        o->stock_reserve = o->pool_size / 16 < OPTIONS_DEFAULT_STOCK_MAX ? o->pool_size / 16 : OPTIONS_DEFAULT_STOCK_MAX;
        /* beyond the cap: only what the pool's directory has beyond it */
        uint64_t beyond = dir_available > o->pool_size ? dir_available - o->pool_size : 0;
        if (o->stock_reserve > beyond)
            o->stock_reserve = beyond;
    }
    if (!o->stock_max_lease)
        o->stock_max_lease = o->stock_reserve / 4 < (4u << 20) ? o->stock_reserve / 4 : (4u << 20);
    if (!o->stock_per_uid)
        o->stock_per_uid = o->stock_reserve / 4;
    return 0;
}

void options_print(const struct options *o, FILE *f)
{
    fprintf(f, "[daemon]\n");
    for (unsigned i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        /* An unset string or list prints as a comment, so the output reads back as a file. */
        if ((k->type == T_STR && !(*FIELD(o, k, char *const) && **FIELD(o, k, char *const))) ||
            ((k->type == T_UIDS || k->type == T_GIDS) && FIELD(o, k, const struct options_list)->n == 0)) {
            fprintf(f, "# %s = (not set)\n", k->name);
            continue;
        }
        fprintf(f, "%s = ", k->name);
        switch (k->type) {
        case T_STR: {
            const char *s = *FIELD(o, k, char *const);
            fprintf(f, "%s", s ? s : "");
            break;
        }
        case T_MODE: fprintf(f, "%04o", *FIELD(o, k, const uint32_t)); break;
        case T_COUNT0:
        case T_COUNT: fprintf(f, "%u", *FIELD(o, k, const uint32_t)); break;
        case T_SIZE: case T_SIZE0: fprintf(f, "%llu", (unsigned long long)*FIELD(o, k, const uint64_t)); break;
        case T_BOOL: fprintf(f, "%s", *FIELD(o, k, const bool) ? "yes" : "no"); break;
        case T_TRI: {
            static const char *const v[] = { "auto", "yes", "no" };
            fprintf(f, "%s", v[*FIELD(o, k, const int)]);
            break;
        }
        case T_UIDS:
        case T_GIDS: {
            const struct options_list *l = FIELD(o, k, const struct options_list);
            for (unsigned j = 0; j < l->n; j++)
                fprintf(f, "%s%u", j ? " " : "", l->v[j]);
            break;
        }
        }
        fputc('\n', f);
    }
    fprintf(f, "\n[quota]\n");
    for (unsigned i = 0; i < o->n_quotas; i++)
        fprintf(f, "%u = %llu\n", o->quotas[i].uid, (unsigned long long)o->quotas[i].bytes);
}

void options_free(struct options *o)
{
    for (unsigned i = 0; i < NKEYS; i++) {
        if (keys[i].type == T_STR) {
            char **p = FIELD(o, &keys[i], char *);
            free(*p);
            *p = NULL;
        } else if (keys[i].type == T_UIDS || keys[i].type == T_GIDS) {
            struct options_list *l = FIELD(o, &keys[i], struct options_list);
            free(l->v);
            *l = (struct options_list){ 0 };
        }
    }
    free(o->quotas);
    free(o->config_path);
    o->quotas = NULL;
    o->n_quotas = 0;
    o->config_path = NULL;
}
