/* SPDX-License-Identifier: MIT */
/* options.h: shmrefd's settings. Private to the daemon.
 * One table of keys serves the command line (--key value) and the config file (key =
 * value under [daemon]), so every flag has a key and both parse the same way.
 * Precedence: flags > config file > built-in defaults. Each struct options records in
 * `set` which keys it was given, so two of them can be merged by that rule. */
#ifndef SHMREFD_OPTIONS_H
#define SHMREFD_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define OPTIONS_DEFAULT_CONFIG "/etc/shmrefd/shmrefd.conf"
#define OPTIONS_DEFAULT_POOL_MAX (1ULL << 30)
#define OPTIONS_DEFAULT_STOCK_MAX (64ULL << 20)
#define OPTIONS_DEFAULT_MAX_LEASES 4096
#define OPTIONS_DEFAULT_MAX_CLIENTS 1024
#define OPTIONS_DEFAULT_IDLE_TIMEOUT 600 /* seconds */

enum { OPTIONS_HUGE_AUTO = 0, OPTIONS_HUGE_YES = 1, OPTIONS_HUGE_NO = 2 };

struct options_list {
    uint32_t *v;
    unsigned n;
};

struct options_quota {
    uint32_t uid;
    uint64_t bytes;
};

struct options {
    uint64_t set;             /* bit per key given (see options.c) */
    char *socket_path;        /* default: $SHMREFD_SOCKET, $XDG_RUNTIME_DIR, /run/shmrefd */
    uint32_t socket_mode;     /* default 0660 */
    char *socket_group;       /* group of the socket file; NULL: leave it */
    char *pool_dir;           /* default /dev/shm */
    uint64_t pool_size;       /* default: min(1 GiB, half of what the dir has) */
    uint64_t tenant_quota;    /* default: half of pool_size */
    uint64_t max_lease_size;  /* default: pool_size */
    uint64_t stock_reserve;   /* beyond pool_size, for stock leases (default: pool_size/16, <= 64 MiB,
                               * and what pool_dir has beyond pool_size); 0: no stock */
    uint64_t stock_max_lease; /* largest stock lease (default: stock_reserve/4, <= 4 MiB) */
    uint64_t stock_per_uid;   /* stock bytes one uid may hold (default: stock_reserve/4) */
    uint32_t max_leases;      /* per connection */
    uint32_t max_clients;
    bool memfd;
    bool sched_batch;         /* run as SCHED_BATCH (default no) */
    int pool_hugepages;       /* OPTIONS_HUGE_*: auto (default), yes, no */
    bool verbose;
    char *user;               /* switch to this user after setup (when root) */
    struct options_list allow_uids, allow_gids; /* both empty: anyone who can open the socket */
    uint32_t max_clients_per_uid; /* default: half of max_clients; operators (access_operator) exempt */
    uint32_t max_parked_per_uid; /* waiting requests of one uid; default 4 x max_leases */
    uint32_t idle_timeout;    /* seconds; 0: never (default OPTIONS_DEFAULT_IDLE_TIMEOUT) */
    uint32_t exit_idle;       /* seconds with no connection and nothing held, then exit; 0: never */
    char *private_config;     /* --private FILE: a uid's private daemon (libshmref's autostart), whose
                               * user sets it with SHMREF_* variables and FILE: tenant-quota defaults
                               * to the pool (one tenant) and refusals name those knobs; NULL: no */
    struct options_quota *quotas;      /* [quota] uid = bytes */
    unsigned n_quotas;
    /* Command line only. */
    char *config_path;        /* --config; default OPTIONS_DEFAULT_CONFIG if it exists */
    bool check_config;
};

/* options_parse_args: the command line into *ret (only what was given is set). Returns
 * 0 to run, 1 after --help/--version (exit 0), -EINVAL after printing why (exit 2). */
int options_parse_args(int argc, char **argv, struct options *ret);

/* options_read_file: the config file at path into *ret. Returns 0, -ENOENT if it does
 * not exist, or -EINVAL with "PATH:LINE: what is wrong" in err. */
int options_read_file(const char *path, struct options *ret, char *err, size_t err_len);

/* options_merge: *ret = flags over file over defaults (defaults that depend on the pool
 * directory are filled by options_resolve). Either input may be empty. */
int options_merge(const struct options *flags, const struct options *file, struct options *ret);

/* options_resolve: fills what was not given, from the environment and the pool dir's
 * available bytes. */
int options_resolve(struct options *o, uint64_t dir_available);

/* options_given: whether key was set (by a flag or the file) in o. */
bool options_given(const struct options *o, const char *key);

/* options_print: the effective configuration, as a config file. */
void options_print(const struct options *o, FILE *f);

/* options_default_socket: the default socket path for this environment (malloc'd). */
char *options_default_socket(void);

void options_free(struct options *o);

#endif
