/* SPDX-License-Identifier: MIT */
/* test-main.c: shmrefd's entry point (daemon/main.c), run as the real binary: exit codes
 * (0 for --help, --version and --check-config; 2 for a bad command line; 1 when setup
 * fails), the effective configuration printed by --check-config, and a setup failure
 * that names both numbers. Reloads and signals are covered by integration-service. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"

#ifndef SHMREFD_BIN
#error "SHMREFD_BIN must name the daemon binary under test"
#endif

static char out[16384];

/* run: shmrefd with args (NULL-terminated), stdout+stderr into out; its exit status. */
static int run(const char *const *args)
{
    setenv("SHMREFD_SOCKET", "/tmp/shmref-test-main-unused.sock", 1);
    int r = launcher_run(SHMREFD_BIN, args, out, sizeof(out));
    cr_assert_geq(r, 0, "running shmrefd: %s", strerror(-r));
    return r;
}

Test(main, help_and_version_exit_0)
{
    const char *help[] = { "--help", NULL }, *version[] = { "--version", NULL };
    cr_assert_eq(run(help), 0);
    cr_assert(strstr(out, "--pool-size"), "%s", out);
    cr_assert_eq(run(version), 0);
    cr_assert(strstr(out, "shmrefd " SHMREF_VERSION_STRING), "%s", out);
}

Test(main, a_bad_command_line_exits_2)
{
    const char *bad[] = { "--pool-size", "lots", NULL }, *stray[] = { "extra", NULL };
    cr_assert_eq(run(bad), 2);
    cr_assert_eq(run(stray), 2);
}

Test(main, check_config_prints_the_effective_configuration)
{
    const char *args[] = { "--config", "/nonexistent/shmrefd.conf", "--check-config", NULL };
    cr_assert_eq(run(args), 1, "a named config file that is missing is an error");
    const char *ok[] = { "--check-config", "--pool-size", "8M", "--max-leases", "3", NULL };
    cr_assert_eq(run(ok), 0, "%s", out);
    cr_assert(strstr(out, "pool-size = 8388608\n"), "%s", out);
    cr_assert(strstr(out, "max-leases = 3\n"), "%s", out);
    cr_assert(strstr(out, "tenant-quota = 4194304\n"), "the default follows the pool size: %s", out);
}

Test(main, a_pool_that_does_not_fit_exits_1_naming_both_numbers)
{
    const char *args[] = { "--pool-size", "1T", "--pool-hugepages", "no", NULL };
    cr_assert_eq(run(args), 1, "%s", out);
    cr_assert(strstr(out, "(1099511627776 bytes) does not fit in /dev/shm"), "%s", out);
    cr_assert(strstr(out, "available"), "%s", out);
}
