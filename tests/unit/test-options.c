/* SPDX-License-Identifier: MIT */
/* test-options.c: shmrefd's settings (daemon/options.c): one key table for flags and the
 * config file, errors naming file and line, flags over file over defaults, defaults that
 * follow the pool size, and the printed configuration. */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "options.h"

static int parse(struct options *o, const char *const *args)
{
    char *argv[32] = { (char *)"shmrefd" };
    int argc = 1;
    for (; args[argc - 1]; argc++)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    return options_parse_args(argc, argv, o);
}

static void write_conf(char *path, const char *text)
{
    strcpy(path, "/tmp/shmref-test-options-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

Test(options, flags_parse_sizes_modes_and_lists)
{
    struct options o;
    const char *args[] = { "--pool-size", "2G", "-q", "512M", "--socket-mode", "0600", "--max-leases", "7",
                           "--pool-hugepages", "no", "--memfd", "--allow-users", "0,1000", "--verbose", NULL };
    cr_assert_eq(parse(&o, args), 0);
    cr_assert_eq(o.pool_size, UINT64_C(2) << 30);
    cr_assert_eq(o.tenant_quota, UINT64_C(512) << 20);
    cr_assert_eq(o.socket_mode, 0600);
    cr_assert_eq(o.max_leases, 7);
    cr_assert_eq(o.pool_hugepages, OPTIONS_HUGE_NO);
    cr_assert(o.memfd && o.verbose);
    cr_assert_eq(o.allow_uids.n, 2);
    cr_assert_eq(o.allow_uids.v[1], 1000);
    cr_assert(options_given(&o, "pool-size"));
    cr_assert_not(options_given(&o, "max-clients"));
    options_free(&o);
}

Test(options, bad_flags_are_refused)
{
    struct options o;
    const char *bad_size[] = { "--pool-size", "lots", NULL };
    const char *bad_tri[] = { "--pool-hugepages", "maybe", NULL };
    const char *stray[] = { "extra", NULL };
    const char *unknown[] = { "--bogus", NULL };
    cr_assert_eq(parse(&o, bad_size), -EINVAL);
    options_free(&o);
    cr_assert_eq(parse(&o, bad_tri), -EINVAL);
    options_free(&o);
    cr_assert_eq(parse(&o, stray), -EINVAL);
    options_free(&o);
    cr_assert_eq(parse(&o, unknown), -EINVAL);
    options_free(&o);
}

/* A yes/no flag alone is yes; --name=no says no. */
Test(options, yes_no_flags_take_an_optional_value)
{
    struct options o;
    const char *off[] = { "--sched-batch=no", "--memfd=yes", NULL };
    cr_assert_eq(parse(&o, off), 0);
    cr_assert(options_given(&o, "sched-batch"));
    cr_assert_eq(options_resolve(&o, UINT64_C(1) << 40), 0);
    cr_assert_not(o.sched_batch, "--sched-batch=no");
    cr_assert(o.memfd);
    options_free(&o);
    const char *on[] = { "--sched-batch", NULL };
    cr_assert_eq(parse(&o, on), 0);
    cr_assert_eq(options_resolve(&o, UINT64_C(1) << 40), 0);
    cr_assert(o.sched_batch, "alone: yes");
    options_free(&o);
    const char *none[] = { NULL };
    cr_assert_eq(parse(&o, none), 0);
    cr_assert_eq(options_resolve(&o, UINT64_C(1) << 40), 0);
    cr_assert_not(o.sched_batch, "SCHED_OTHER by default");
    options_free(&o);
    const char *bad[] = { "--sched-batch=maybe", NULL };
    cr_assert_eq(parse(&o, bad), -EINVAL);
    options_free(&o);
}

Test(options, config_file_and_its_errors_name_the_line)
{
    char path[64], err[512];
    struct options o;
    write_conf(path, "[daemon]\npool-size = 64M\nmax-clients = 9\n\n[quota]\n1000 = 4G\nroot = 1M\n");
    cr_assert_eq(options_read_file(path, &o, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(o.pool_size, UINT64_C(64) << 20);
    cr_assert_eq(o.max_clients, 9);
    cr_assert_eq(o.n_quotas, 2);
    cr_assert_eq(o.quotas[0].uid, 1000);
    cr_assert_eq(o.quotas[0].bytes, UINT64_C(4) << 30);
    cr_assert_eq(o.quotas[1].uid, 0, "a user name resolves to its uid");
    options_free(&o);
    unlink(path);

    write_conf(path, "[daemon]\npool-size = 64M\nbogus = 1\n");
    cr_assert_eq(options_read_file(path, &o, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, ":3: unknown key 'bogus' in [daemon]"), "%s", err);
    unlink(path);
    write_conf(path, "[elsewhere]\nx = 1\n");
    cr_assert_eq(options_read_file(path, &o, err, sizeof(err)), -EINVAL);
    cr_assert(strstr(err, ":2: unknown section [elsewhere]"), "%s", err);
    unlink(path);
    cr_assert_eq(options_read_file("/nonexistent/shmrefd.conf", &o, err, sizeof(err)), -ENOENT);
}

Test(options, flags_over_file_over_defaults)
{
    char path[64], err[512];
    struct options flags, file, o;
    const char *args[] = { "--max-leases", "3", NULL };
    cr_assert_eq(parse(&flags, args), 0);
    write_conf(path, "[daemon]\nmax-leases = 5\nmax-clients = 6\npool-size = 100M\n[quota]\n7 = 1M\n");
    cr_assert_eq(options_read_file(path, &file, err, sizeof(err)), 0, "%s", err);
    unlink(path);
    cr_assert_eq(options_merge(&flags, &file, &o), 0);
    cr_assert_eq(o.max_leases, 3, "a flag beats the file");
    cr_assert_eq(o.max_clients, 6, "the file beats a default");
    cr_assert_eq(o.n_quotas, 1);
    setenv("SHMREFD_SOCKET", "/tmp/x.sock", 1);
    cr_assert_eq(options_resolve(&o, UINT64_C(1) << 40), 0);
    unsetenv("SHMREFD_SOCKET");
    cr_assert_str_eq(o.socket_path, "/tmp/x.sock");
    cr_assert_str_eq(o.pool_dir, "/dev/shm");
    cr_assert_eq(o.socket_mode, 0660);
    cr_assert_eq(o.tenant_quota, 50 * (UINT64_C(1) << 20), "half the pool");
    cr_assert_eq(o.max_lease_size, 100 * (UINT64_C(1) << 20), "the pool size");
    options_free(&flags);
    options_free(&file);
    options_free(&o);
}

Test(options, default_pool_size_is_half_of_a_small_dir)
{
    struct options o = { 0 };
    cr_assert_eq(options_resolve(&o, UINT64_C(64) << 20), 0);
    cr_assert_eq(o.pool_size, UINT64_C(32) << 20);
    cr_assert_eq(o.max_leases, OPTIONS_DEFAULT_MAX_LEASES);
    cr_assert_eq(o.max_clients, OPTIONS_DEFAULT_MAX_CLIENTS);
    options_free(&o);
    struct options big = { 0 };
    cr_assert_eq(options_resolve(&big, UINT64_C(1) << 40), 0);
    cr_assert_eq(big.pool_size, OPTIONS_DEFAULT_POOL_MAX);
    options_free(&big);
}

Test(options, printed_configuration_reads_back)
{
    char path[64], err[512];
    struct options o = { 0 }, back;
    /* socket-group, user and allow-users unset: they print as comments */
    const char *args[] = { "--pool-size", "3M", "--allow-groups", "0", "--pool-hugepages", "yes", NULL };
    cr_assert_eq(parse(&o, args), 0);
    cr_assert_eq(options_resolve(&o, UINT64_C(1) << 30), 0);
    strcpy(path, "/tmp/shmref-test-options-XXXXXX");
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    options_print(&o, f);
    fclose(f);
    cr_assert_eq(options_read_file(path, &back, err, sizeof(err)), 0, "printed config does not parse: %s", err);
    unlink(path);
    cr_assert_eq(back.pool_size, o.pool_size);
    cr_assert_eq(back.pool_hugepages, OPTIONS_HUGE_YES);
    cr_assert_eq(back.allow_gids.n, 1);
    cr_assert_eq(back.max_leases, o.max_leases);
    cr_assert_null(back.socket_group);
    cr_assert_null(back.user);
    cr_assert_eq(back.allow_uids.n, 0);
    options_free(&o);
    options_free(&back);
}
