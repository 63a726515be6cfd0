#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-userns.sh: peers whose uid shmrefd's user namespace cannot map all show up as the
# overflow uid (65534), so they would share one tenant and read each other's recycled
# bytes. shmrefd runs here in a user namespace that maps only root; clients of uids 1000
# and 1001 are refused with a message, root (mapped) is served. Needs root and unshare(1).
# Usage: test-userns.sh SHMREFD SHMREFCTL
set -euo pipefail
SHMREFD=$1 SHMREFCTL=$2
. "$(dirname "$0")/../lib.sh"
test_begin userns
chmod 755 "$tmp"
# Run as other uids: a copy they can reach (the build may sit in a 0700 clone).
SHMREFCTL=$(reachable "$SHMREFCTL")
sock=$tmp/shmrefd.sock
if ! unshare -U -r true 2>/dev/null; then
    test_end_skipping "cannot create a user namespace here"
fi
as() { local uid=$1; shift; setpriv --reuid "$uid" --regid "$uid" --clear-groups "$@"; }

# unshare(1) execs shmrefd in the new namespace: $! is the daemon.
unshare -U -r "$SHMREFD" --socket "$sock" --socket-mode 0666 --pool-hugepages no 2>"$tmp/log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
check "root, mapped in the daemon's namespace, is served" "$SHMREFCTL" --socket "$sock" ping
for uid in 1000 1001; do
    set +e
    as "$uid" "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>"$tmp/err$uid"; rc=$?
    set -e
    check "uid $uid (unmapped: the overflow uid to the daemon) is refused" test "$rc" = 1
    check "and told why" grep -q "is the overflow uid: its real uid is not mapped" "$tmp/err$uid"
done
check "the daemon logged the refusals" test "$(grep -c 'refused client.*overflow uid' "$tmp/log")" = 2
check "root is still served" "$SHMREFCTL" --socket "$sock" ping
kill -TERM "$dpid"; wait "$dpid"; rc=$?; dpid=
check "SIGTERM exits 0" test "$rc" = 0
test_end
