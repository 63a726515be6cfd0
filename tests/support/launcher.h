/* SPDX-License-Identifier: MIT */
/* launcher.h: starting, waiting for and stopping a shmrefd (this build's binary), for the
 * integration tests' harness and for bench/. Plain C, no test framework: every function
 * returns >= 0 or -errno, and its caller decides how to fail. */
#ifndef SHMREF_TEST_LAUNCHER_H
#define SHMREF_TEST_LAUNCHER_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define LAUNCHER_PDEATHSIG 1u   /* the daemon gets SIGTERM if its starter dies */
#define LAUNCHER_CLOSE_FDS 2u   /* the daemon inherits nothing but stdio */

/* launcher_spawn: fork and exec bin with argv (argv[0] included, NULL-terminated), its
 * stdout and stderr going to log (created or truncated). Returns 0 with the pid. */
int launcher_spawn(const char *bin, char *const argv[], const char *log, unsigned flags, pid_t *ret_pid);

/* launcher_wait_ready: polls until a libshmref client can connect (hello) at socket.
 * Returns 0; -ECHILD if the daemon exited first (its wait status in *ret_status, which
 * may be NULL; the child is reaped); -ETIMEDOUT after timeout_ms. */
int launcher_wait_ready(pid_t pid, const char *socket, int timeout_ms, int *ret_status);

/* launcher_stop: SIGTERM, then waits; SIGKILL after grace_ms. Returns 0 with the wait
 * status in *ret_status (may be NULL), or -errno (-ECHILD: already reaped). */
int launcher_stop(pid_t pid, int grace_ms, int *ret_status);

/* launcher_run: bin with args (argv[0] is bin; args NULL-terminated) to completion, its
 * stdout and stderr into out (cap bytes, NUL-terminated). Returns its exit status, or
 * 128 + the signal that killed it, or -errno. */
int launcher_run(const char *bin, const char *const args[], char *out, size_t cap);

/* launcher_log_contains: whether the log so far has a line containing text. */
bool launcher_log_contains(const char *log, const char *text);

/* launcher_print_log: the whole log to f, framed by its name (after a failure). */
void launcher_print_log(const char *log, FILE *f);

#endif
