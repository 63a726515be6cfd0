#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cgroup.sh: the pool fits the daemon's memory cgroup. In a real cgroup with a
# 48 MiB limit, a 256 MiB pool is refused at start (and by --check-config) with both
# numbers; the default pool sizes itself below the limit, and a lease the pool cannot
# hold is refused instead of getting the daemon OOM-killed. Needs root and a writable
# memory cgroup (v2 memory.max or v1 memory.limit_in_bytes); skips without one.
# Usage: test-cgroup.sh SHMREFD SHMREFCTL
set -euo pipefail
SHMREFD=$1 SHMREFCTL=$2
. "$(dirname "$0")/../lib.sh"
test_begin cgroup
sock=$tmp/shmrefd.sock
limit=$((48 << 20))

# A child of our own memory cgroup, v2 if the memory controller is there, else v1.
cg=
if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    own=$(awk -F: '$1=="0"{print $3}' /proc/self/cgroup)
    parent=/sys/fs/cgroup${own%/}
    grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null ||
        echo +memory >"$parent/cgroup.subtree_control" 2>/dev/null || true
    cg=$parent/shmref-test-$$
    mkdir "$cg" 2>/dev/null && echo "$limit" >"$cg/memory.max" 2>/dev/null || cg=
elif [ -d /sys/fs/cgroup/memory ]; then
    own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
    cg=/sys/fs/cgroup/memory${own%/}/shmref-test-$$
    mkdir "$cg" 2>/dev/null && echo "$limit" >"$cg/memory.limit_in_bytes" 2>/dev/null || cg=
fi
if [ -z "$cg" ]; then
    test_end_skipping "no writable memory cgroup here"
fi
cleanup_cg() {
    test_cleanup
    for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
}
trap cleanup_cg EXIT
# in_cg CMD...: runs CMD inside the test cgroup.
in_cg() { timeout 10 sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$@"; }

set +e
in_cg "$SHMREFD" --socket "$sock" --pool-size 256M 2>"$tmp/err"; rc=$?
in_cg "$SHMREFD" --socket "$sock" --pool-size 256M --check-config >/dev/null 2>"$tmp/err2"; rc2=$?
set -e
check "a pool larger than the cgroup's limit is refused at start (exit 1)" test "$rc" = 1
check "the refusal names the pool size and the limit" \
    grep -q "pool size 256.0 MiB (268435456 bytes) does not fit the memory cgroup .*limit 48.0 MiB (50331648 bytes)" "$tmp/err"
check "--check-config refuses it too" test "$rc2" = 1
check "with the same message" grep -q "does not fit the memory cgroup" "$tmp/err2"

# Not through in_cg: $! must be the daemon itself, not a subshell around it.
sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "$SHMREFD" --socket "$sock" 2>"$tmp/log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
size=$("$SHMREFCTL" --socket "$sock" status --json |
    /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["limits"]["pool_size"])')
check "the default pool sizes itself to half the cgroup's limit ($size bytes)" test "$size" = $((limit / 2))
head -c $((32 << 20)) /dev/zero >"$tmp/big"
set +e
"$SHMREFCTL" --socket "$sock" put "$tmp/big" >/dev/null 2>"$tmp/put-err"; rc=$?
set -e
check "a 32 MiB put beyond that pool is refused" test "$rc" = 1
check "and the daemon is alive, not OOM-killed" "$SHMREFCTL" --socket "$sock" ping
head -c $((8 << 20)) /dev/urandom >"$tmp/mid"
desc=$("$SHMREFCTL" --socket "$sock" put "$tmp/mid")
"$SHMREFCTL" --socket "$sock" get "$desc" -o "$tmp/mid.out"
check "an 8 MiB put and get inside the quota move the bytes" cmp -s "$tmp/mid" "$tmp/mid.out"
check "the daemon is still alive" kill -0 "$dpid"
kill -TERM "$dpid"; wait "$dpid"; rc=$?; dpid=
check "and stops cleanly (exit 0)" test "$rc" = 0
test_end
