/* SPDX-License-Identifier: MIT */
/* harness.h: what the integration tests share: a real shmrefd (this build's binary) on a
 * temporary socket, raw socket clients (both from tests/support/, which bench/ uses too),
 * and looks at the daemon from outside (/proc).
 * Every helper asserts with Criterion, so a broken environment fails the test loudly. */
#ifndef SHMREF_TEST_HARNESS_H
#define SHMREF_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shmref/shmref.h"

struct daemon {
    pid_t pid;
    char dir[64];        /* temporary directory: socket and log live here */
    char socket[128];
    char log[128];
};

/* daemon_start: starts shmrefd with --socket in a fresh temporary directory plus the
 * given NULL-terminated extra arguments, and waits until it answers a ping. */
void daemon_start(struct daemon *d, ...) __attribute__((sentinel));
/* daemon_stop: SIGTERM, then asserts a clean exit 0 and removes the directory. */
void daemon_stop(struct daemon *d);
/* daemon_fds: how many fds the daemon has open now. */
int daemon_fds(const struct daemon *d);
/* daemon_log_contains: whether the daemon's stderr so far contains text. */
int daemon_log_contains(const struct daemon *d, const char *text);

/* connect_ok: shmref_connect that must succeed. */
shmref_conn *connect_ok(const struct daemon *d);
/* status_u64: one number from a fresh status snapshot, over its own connection. */
uint64_t status_u64(const struct daemon *d, const char *path);
/* wait_status: polls status until path equals want or ms pass; returns the last value. */
uint64_t wait_status(const struct daemon *d, const char *path, uint64_t want, int ms);

/* raw_connect: a plain SOCK_SEQPACKET connection to the daemon, no hello. */
int raw_connect(const struct daemon *d);
/* raw_hello: sends a valid hello on a raw connection and checks the reply. */
void raw_hello(int fd);
/* raw_roundtrip: send len bytes, wait up to ms for one reply; returns the reply's length,
 * 0 if the daemon closed the connection, -ETIMEDOUT if nothing came. */
ssize_t raw_roundtrip(int fd, const void *msg, size_t len, void *reply, size_t cap, int ms);
/* raw_closed: whether the daemon has closed fd within ms (EOF seen; replies drained). */
int raw_closed(int fd, int ms);

/* read_full: reads exactly n bytes from fd (EINTR retried); false at EOF or an error. */
bool read_full(int fd, void *p, size_t n);

/* now_ms: CLOCK_MONOTONIC in milliseconds. */
long now_ms(void);
/* xorshift: the next number of a deterministic pseudo-random sequence; *s is its state
 * (never 0). */
uint32_t xorshift(uint32_t *s);

/* fill_pattern / check_pattern: deterministic bytes from a seed; check returns the first
 * mismatching offset, or -1 when all len bytes match. */
void fill_pattern(void *p, size_t len, uint32_t seed);
ssize_t check_pattern(const void *p, size_t len, uint32_t seed);

/* child_run: fork a process that runs fn(arg) and _exits with its return value. */
/* reap_children: kills and reaps every child of this process (a suite's .fini: after a
 * failed assertion, daemon_stop never ran). */
void reap_children(void);
pid_t child_run(int (*fn)(void *), void *arg);
/* child_wait: waits for pid; returns its exit status, or 128+signal. */
int child_wait(pid_t pid);

#endif
