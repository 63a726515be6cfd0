#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-autostart.sh: libshmref's private daemon on demand (client-lib/autostart.c), seen
# through shmrefctl (the C library, so every binding) as users other than root:
#   - no daemon at the default socket: the first connect starts one, the uid's own
#     (socket 0600 in a 0700 dir of that uid under $XDG_RUNTIME_DIR, or /tmp/shmref-UID),
#     it exits when idle (--exit-idle, SHMREF_IDLE_EXIT_S) and removes its socket;
#   - six processes at once: one daemon (one pid, one start in its log);
#   - a named socket (--socket, $SHMREFD_SOCKET) or SHMREF_AUTOSTART=0 never starts one;
#   - hostile: another uid's directory planted at /tmp/shmref-UID is refused with a
#     message naming it, and nothing is started; a daemon that cannot start is reported
#     with its log file and its last words.
# Needs root (setpriv); 77 = skipped. Usage: test-autostart.sh SHMREFD SHMREFCTL
set -uo pipefail
SHMREFD=$1 SHMREFCTL=$2
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to run clients as other uids"; exit 77; }
# Our own mount namespace with an empty tmpfs on /run: a system daemon of this machine
# (always preferred) stays out of it, and the test can play one at /run/shmrefd without
# touching the host's /run.
if [ -z "${SHMREF_TEST_MNTNS:-}" ]; then
    SHMREF_TEST_MNTNS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
mount -t tmpfs -o mode=0755,size=1m tmpfs /run || { echo "SKIP: cannot mount a tmpfs on /run"; exit 77; }
test_begin autostart
chmod 0755 "$tmp"
owner=64998 attacker=64997 fallback=64996
planted=/tmp/shmref-$owner fb=/tmp/shmref-$fallback
for d in "$planted" "$fb"; do
    [ -e "$d" ] && { echo "SKIP: $d exists (not made by this test)"; exit 77; }
done
started=()
cleanup() {
    for p in $(cat "$tmp"/pids.* 2>/dev/null | sort -u); do
        grep -q shmrefd "/proc/$p/cmdline" 2>/dev/null && kill "$p" 2>/dev/null
    done
    rm -rf "$planted" "$fb"
    test_cleanup
}
trap cleanup EXIT
run=$tmp/run
mkdir -m 0700 "$run" && chown "$owner" "$run"
# The other uids run a reachable copy of the build's shmrefctl (the clone may be 0700:
# tests/lib.sh reachable), which finds a copy of the build's shmrefd beside its libshmref
# (lib/../bin), as the build tree's does.
SHMREFCTL=$(reachable "$SHMREFCTL")
mkdir -p "$tmp/reach/bin" && cp "$SHMREFD" "$tmp/reach/bin/shmrefd" && chmod -R a+rX "$tmp/reach/bin"
as() { # as UID [VAR=VALUE...] -- COMMAND...
    local uid=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    setpriv --reuid="$uid" --regid="$uid" --clear-groups env -i PATH=/usr/bin:/bin SHMREF_IDLE_EXIT_S=2 "${envs[@]}" "$@"
}
pid_of() { sed -n 's/.*, pid \([0-9]*\),.*/\1/p' "$1"; }

as "$owner" XDG_RUNTIME_DIR="$run" -- "$SHMREFCTL" status >"$tmp/status.out" 2>&1
p=$(pid_of "$tmp/status.out"); echo "${p:-}" >"$tmp/pids.1"
check "no daemon: shmrefctl status starts a private one" test -n "$p"
grep -E 'pid|socket' "$tmp/status.out" | head -n 2
check "its socket: \$XDG_RUNTIME_DIR/shmref/shmrefd.sock, 0600, of the uid" \
    test "$(stat -c '%a %u' "$run/shmref/shmrefd.sock" 2>/dev/null)" = "600 $owner"
check "its directory: 0700" test "$(stat -c '%a %u' "$run/shmref")" = "700 $owner"
check "it runs as the uid, found beside libshmref" bash -c \
    "test \"\$(stat -c %u /proc/${p:-0})\" = $owner && tr '\\0' ' ' </proc/${p:-0}/cmdline | grep -q -- '--allow-users $owner --exit-idle 2'"
check "another uid cannot connect to it" bash -c \
    "! setpriv --reuid=$attacker --regid=$attacker --clear-groups '$SHMREFCTL' --socket '$run/shmref/shmrefd.sock' ping 2>/dev/null"
for _ in $(seq 1 100); do kill -0 "${p:-0}" 2>/dev/null || break; sleep 0.1; done
check "it exits by itself when idle (2 s)" bash -c "! kill -0 ${p:-0} 2>/dev/null"
check "and removes its socket" test ! -e "$run/shmref/shmrefd.sock"
check "its log says why" grep -q 'exiting (exit-idle)' "$run/shmref/shmrefd.log"

starts=$(grep -c 'starting a private shmrefd' "$run/shmref/shmrefd.log")
for i in 1 2 3 4 5 6; do
    as "$owner" XDG_RUNTIME_DIR="$run" -- "$SHMREFCTL" status >"$tmp/race.$i" 2>&1 &
done
wait
for i in 1 2 3 4 5 6; do pid_of "$tmp/race.$i"; done | sort | uniq -c >"$tmp/race.pids"
awk '{print $2}' "$tmp/race.pids" >"$tmp/pids.2"
sed -e 's/^/    race: /' "$tmp/race.pids"
check "six processes at once: one daemon served all six" grep -Eq '^ *6 [0-9]+$' "$tmp/race.pids"
check "one start in its log" test "$(grep -c 'starting a private shmrefd' "$run/shmref/shmrefd.log")" = $((starts + 1))
# Something held (a 5 s retention of a put from a process that is gone): no idle exit.
rp=$(awk '{print $2}' "$tmp/race.pids" | head -n 1)
head -c 100000 /dev/urandom >"$tmp/blob" && chmod 0644 "$tmp/blob"
as "$owner" XDG_RUNTIME_DIR="$run" -- "$SHMREFCTL" put --keep-ms 5000 "$tmp/blob" >"$tmp/put.out" 2>&1
sleep 3.5
check "a retained buffer keeps it alive past the idle time (3.5 s > 2 s)" kill -0 "${rp:-0}"
check "(the put went to that daemon)" grep -q '^shmref1:' "$tmp/put.out"
for _ in $(seq 1 150); do kill -0 "${rp:-0}" 2>/dev/null || break; sleep 0.1; done
check "it exits once the retention ended and 2 s passed" bash -c "! kill -0 ${rp:-0} 2>/dev/null"

# A system daemon, when one answers, is preferred to the private one.
mkdir -m 0755 /run/shmrefd
"$SHMREFD" --socket /run/shmrefd/shmrefd.sock --socket-mode 0666 --config= >"$tmp/system.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S /run/shmrefd/shmrefd.sock ] && break; sleep 0.05; done
rm -rf "$run/shmref"
as "$owner" XDG_RUNTIME_DIR="$run" -- "$SHMREFCTL" status >"$tmp/sys.out" 2>&1
check "a system daemon answering at /run/shmrefd: it serves, no private one starts" bash -c \
    "grep -q 'pid $dpid,.*socket /run/shmrefd/shmrefd.sock' '$tmp/sys.out' && test ! -e '$run/shmref'"
kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=
rm -rf /run/shmrefd

# Named sockets and SHMREF_AUTOSTART=0 never start one.
rm -rf "$run/shmref"
as "$owner" XDG_RUNTIME_DIR="$run" -- "$SHMREFCTL" --socket "$run/none.sock" ping >"$tmp/named.err" 2>&1
check "--socket PATH with no daemon: ENOENT, nothing started" bash -c \
    "grep -q 'No such file' '$tmp/named.err' && test ! -e '$run/shmref'"
as "$owner" XDG_RUNTIME_DIR="$run" SHMREFD_SOCKET="$run/none.sock" -- "$SHMREFCTL" ping >"$tmp/env.err" 2>&1
check "\$SHMREFD_SOCKET with no daemon: ENOENT, nothing started" bash -c \
    "grep -q 'No such file' '$tmp/env.err' && test ! -e '$run/shmref'"
as "$owner" XDG_RUNTIME_DIR="$run" SHMREF_AUTOSTART=0 -- "$SHMREFCTL" ping >"$tmp/off.err" 2>&1
check "SHMREF_AUTOSTART=0: ENOENT at the default socket, nothing started" bash -c \
    "grep -q \"shmrefd at $run/shmrefd.sock: No such file\" '$tmp/off.err' && test ! -e '$run/shmref'"

# Without XDG_RUNTIME_DIR: /tmp/shmref-UID.
as "$fallback" -- "$SHMREFCTL" ping >"$tmp/fb.out" 2>&1
echo "$(stat -c %u "$fb" 2>/dev/null)" >/dev/null
check "no XDG_RUNTIME_DIR: the daemon lives in /tmp/shmref-UID (0700, the uid's)" bash -c \
    "grep -q '^pong' '$tmp/fb.out' && test \"\$(stat -c '%a %u' '$fb')\" = '700 $fallback'"
sed -n 's/.*\(pid [0-9]*\).*/\1/p' "$fb/shmrefd.log" >/dev/null
pgrep -f -- "--socket $fb/shmrefd.sock" >"$tmp/pids.3" || true

# Hostile: a directory planted by another uid where the owner's would be.
mkdir -m 0777 "$planted" && chown "$attacker" "$planted"
as "$owner" -- "$SHMREFCTL" ping >"$tmp/planted.err" 2>&1
sed -e 's/^/    | /' "$tmp/planted.err"
check "a planted directory of another uid is refused, named in the message" \
    grep -q "$planted must be a directory of uid $owner with mode 0700 (it is a directory of uid $attacker, mode 0777)" \
    "$tmp/planted.err"
check "and nothing was started in it" test -z "$(ls -A "$planted")"
rm -rf "$planted"
ln -s "$run" "$planted"
as "$owner" -- "$SHMREFCTL" ping >"$tmp/link.err" 2>&1
check "a planted symlink is refused" grep -q "$planted must be a directory of uid $owner" "$tmp/link.err"
rm -f "$planted"

# A daemon that cannot start: its log file and last words in the message.
printf '#!/bin/sh\necho "shmrefd: cannot start: the disk is on fire (42 bytes free)" >&2\nexit 1\n' >"$tmp/bad-shmrefd"
chmod 0755 "$tmp/bad-shmrefd"
as "$owner" XDG_RUNTIME_DIR="$run" SHMREF_DAEMON="$tmp/bad-shmrefd" -- "$SHMREFCTL" ping >"$tmp/bad.err" 2>&1
sed -e 's/^/    | /' "$tmp/bad.err"
check "a daemon that fails to start: the message quotes it and names its log" \
    grep -q "exited at start: shmrefd: cannot start: the disk is on fire (42 bytes free); its log: $run/shmref/shmrefd.log" \
    "$tmp/bad.err"
as "$owner" XDG_RUNTIME_DIR="$run" SHMREF_DAEMON=/nonexistent/shmrefd -- "$SHMREFCTL" ping >"$tmp/none.err" 2>&1
check "SHMREF_DAEMON that is not a program: said so" grep -q "SHMREF_DAEMON=/nonexistent/shmrefd is not an executable" \
    "$tmp/none.err"
test_end
