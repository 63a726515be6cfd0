/* options.c: see options.h. Sizes accept K/M/G/T suffixes (binary). */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"
#include "units.h"

static const char usage[] =
    "Usage: shmrefd [OPTION]...\n"
    "Broker of pre-faulted shared-memory buffers over a Unix socket.\n"
    "\n"
    "  -s, --socket PATH         listen here (default: $SHMREFD_SOCKET, else\n"
    "                            $XDG_RUNTIME_DIR/shmrefd.sock, else " PATHS_SYSTEM_SOCKET ")\n"
    "      --socket-mode MODE    octal file mode of the socket (default 0660)\n"
    "  -d, --pool-dir DIR        tmpfs directory for the buffers (default /dev/shm)\n"
    "  -p, --pool-size BYTES     global cap on buffer bytes (default: 1G, or half of\n"
    "                            what DIR has if that is less)\n"
    "  -q, --tenant-quota BYTES  bytes one uid may hold (default: half the pool)\n"
    "      --max-lease-size BYTES  largest single lease (default: the pool size)\n"
    "      --max-leases N        lease handles per connection (default 4096)\n"
    "      --max-clients N       concurrent connections (default 1024)\n"
    "      --memfd               back buffers with memfd_create instead of O_TMPFILE\n"
    "  -v, --verbose             log debug lines\n"
    "  -h, --help                show this help\n"
    "  -V, --version             show the version\n"
    "\n"
    "Sizes take K, M, G or T suffixes (powers of 1024).\n";

char *options_default_socket(void)
{
    char buf[4096];
    return paths_default_socket(buf, sizeof(buf)) < 0 ? NULL : strdup(buf);
}

static int parse_size(const char *name, const char *v, uint64_t *ret)
{
    int r = units_parse(v, ret);
    if (r < 0 || *ret == 0) {
        fprintf(stderr, "shmrefd: --%s: '%s' is not a size in bytes (like 4096, 64M or 2G)\n", name, v);
        return -EINVAL;
    }
    return 0;
}

static int parse_u32(const char *name, const char *v, int base, uint32_t *ret)
{
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, base);
    if (errno || !*v || *end || n > UINT32_MAX || v[0] == '-') {
        fprintf(stderr, "shmrefd: --%s: '%s' is not a valid number\n", name, v);
        return -EINVAL;
    }
    *ret = (uint32_t)n;
    return 0;
}

int options_parse(int argc, char **argv, struct options *o)
{
    enum { O_MODE = 256, O_MAX_LEASE_SIZE, O_MAX_LEASES, O_MAX_CLIENTS, O_MEMFD };
    static const struct option longopts[] = {
        { "socket", required_argument, NULL, 's' },
        { "socket-mode", required_argument, NULL, O_MODE },
        { "pool-dir", required_argument, NULL, 'd' },
        { "pool-size", required_argument, NULL, 'p' },
        { "tenant-quota", required_argument, NULL, 'q' },
        { "max-lease-size", required_argument, NULL, O_MAX_LEASE_SIZE },
        { "max-leases", required_argument, NULL, O_MAX_LEASES },
        { "max-clients", required_argument, NULL, O_MAX_CLIENTS },
        { "memfd", no_argument, NULL, O_MEMFD },
        { "verbose", no_argument, NULL, 'v' },
        { "help", no_argument, NULL, 'h' },
        { "version", no_argument, NULL, 'V' },
        { 0 },
    };
    int c, r = 0;

    *o = (struct options){ .max_leases = OPTIONS_DEFAULT_MAX_LEASES,
                           .max_clients = OPTIONS_DEFAULT_MAX_CLIENTS, .socket_mode = 0660 };
    optind = 1;
    while (r == 0 && (c = getopt_long(argc, argv, "s:d:p:q:vhV", longopts, NULL)) != -1) {
        switch (c) {
        case 's': free(o->socket_path); o->socket_path = strdup(optarg); break;
        case 'd': free(o->pool_dir); o->pool_dir = strdup(optarg); break;
        case 'p': r = parse_size("pool-size", optarg, &o->pool_size); break;
        case 'q': r = parse_size("tenant-quota", optarg, &o->tenant_quota); break;
        case O_MAX_LEASE_SIZE: r = parse_size("max-lease-size", optarg, &o->max_lease_size); break;
        case O_MAX_LEASES: r = parse_u32("max-leases", optarg, 10, &o->max_leases); break;
        case O_MAX_CLIENTS: r = parse_u32("max-clients", optarg, 10, &o->max_clients); break;
        case O_MODE:
            r = parse_u32("socket-mode", optarg, 8, &o->socket_mode);
            if (r == 0 && o->socket_mode > 0777) {
                fprintf(stderr, "shmrefd: --socket-mode: '%s' is not a file mode\n", optarg);
                r = -EINVAL;
            }
            break;
        case O_MEMFD: o->memfd = true; break;
        case 'v': o->verbose = true; break;
        case 'h': fputs(usage, stdout); return 1;
        case 'V': printf("shmrefd %s (protocol %d)\n", SHMREF_VERSION_STRING, 1); return 1;
        default: fputs("Try 'shmrefd --help'.\n", stderr); return -EINVAL;
        }
    }
    if (r < 0)
        return r;
    if (optind < argc) {
        fprintf(stderr, "shmrefd: unexpected argument '%s'\nTry 'shmrefd --help'.\n", argv[optind]);
        return -EINVAL;
    }
    if (o->max_leases == 0 || o->max_clients == 0) {
        fprintf(stderr, "shmrefd: --max-leases and --max-clients must be at least 1\n");
        return -EINVAL;
    }
    if (!o->socket_path)
        o->socket_path = options_default_socket();
    if (!o->pool_dir)
        o->pool_dir = strdup("/dev/shm");
    if (!o->socket_path || !o->pool_dir)
        return -ENOMEM;
    return 0;
}

void options_resolve_sizes(struct options *o, uint64_t dir_available)
{
    if (!o->pool_size) {
        o->pool_size = OPTIONS_DEFAULT_POOL_MAX;
        if (dir_available / 2 < o->pool_size)
            o->pool_size = dir_available / 2;
    }
    if (!o->tenant_quota)
        o->tenant_quota = o->pool_size / 2;
    if (!o->max_lease_size)
        o->max_lease_size = o->pool_size;
}

void options_free(struct options *o)
{
    free(o->socket_path);
    free(o->pool_dir);
    o->socket_path = o->pool_dir = NULL;
}
