#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-units.sh: systemd-analyze verify on the units generated for this build (their
# ExecStart is this build's shmrefd). verify can exit 0 while complaining, so any output
# on stderr fails the test too. Usage: test-units.sh DIR (build/systemd/test).
set -uo pipefail
dir=$1
pass=0 fail=0
check() { # check NAME STDERR_FILE RC
    if [ "$3" = 0 ] && [ ! -s "$2" ]; then pass=$((pass + 1)); echo "PASS $1"
    else fail=$((fail + 1)); echo "FAIL $1 (exit $3)"; cat "$2"; fi
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

(cd "$dir" && systemd-analyze verify --man=no shmrefd.socket shmrefd.service) 2>"$tmp/system.err"
check "system units verify cleanly" "$tmp/system.err" $?

mkdir -m 700 "$tmp/runtime"
(cd "$dir/user" && XDG_RUNTIME_DIR=$tmp/runtime systemd-analyze --user verify --man=no shmrefd.socket shmrefd.service) \
    2>"$tmp/user.err"
check "user units verify cleanly" "$tmp/user.err" $?

grep -q '^ListenSequentialPacket=/run/shmrefd/shmrefd.sock$' "$dir/shmrefd.socket"; check "socket path" /dev/null $?
grep -q '^Type=notify$' "$dir/shmrefd.service"; check "Type=notify" /dev/null $?
grep -q '^CapabilityBoundingSet=$' "$dir/shmrefd.service"; check "no capabilities" /dev/null $?
# /dev/shm stays the host's: writable, never replaced (PrivateDevices= binds the host's).
grep -q '^ReadWritePaths=/dev/shm$' "$dir/shmrefd.service" &&
    ! grep -Eq '^(TemporaryFileSystem|InaccessiblePaths|BindPaths|BindReadOnlyPaths)=.*/dev/shm' "$dir/shmrefd.service"
check "/dev/shm stays shared" /dev/null $?
grep -q '^RestrictAddressFamilies=AF_UNIX$' "$dir/shmrefd.service"; check "AF_UNIX only" /dev/null $?
score=$(systemd-analyze security --offline=yes "$dir/shmrefd.service" 2>/dev/null |
    sed -n 's/.*Overall exposure level for shmrefd.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze security: ${score:-?}"
awk -v s="${score:-9}" 'BEGIN { exit !(s <= 1.0) }'; check "systemd-analyze security exposure at most 1.0 (is ${score:-?})" /dev/null $?

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
