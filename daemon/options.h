/* options.h: shmrefd's settings, from the command line over built-in defaults.
 * Private to the daemon. */
#ifndef SHMREFD_OPTIONS_H
#define SHMREFD_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

struct options {
    char *socket_path;        /* resolved: flag, $SHMREFD_SOCKET, $XDG_RUNTIME_DIR, /run */
    char *pool_dir;           /* default /dev/shm */
    uint64_t pool_size;       /* 0 until resolved: min(1 GiB, half of what the dir has) */
    uint64_t tenant_quota;    /* 0 until resolved: half of pool_size */
    uint64_t max_lease_size;  /* 0 until resolved: pool_size */
    uint32_t max_leases;      /* per connection */
    uint32_t max_clients;
    uint32_t socket_mode;
    bool memfd;
    bool verbose;
};

#define OPTIONS_DEFAULT_POOL_MAX (1ULL << 30)
#define OPTIONS_DEFAULT_MAX_LEASES 4096
#define OPTIONS_DEFAULT_MAX_CLIENTS 1024

/* options_parse: fills *ret from argv. Returns 0 to run, 1 when --help or --version was
 * printed (exit 0), or -EINVAL after printing what is wrong to stderr (exit 2). */
int options_parse(int argc, char **argv, struct options *ret);

/* options_default_socket: the default socket path for this environment (malloc'd), the
 * same rule libshmref uses. */
char *options_default_socket(void);

/* options_resolve_sizes: fills the sizes left at 0, given the bytes the pool dir has. */
void options_resolve_sizes(struct options *o, uint64_t dir_available);

void options_free(struct options *o);

#endif
