#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-autostart.sh: libshmref's private daemon on demand (client-lib/autostart.c), seen
# through shmrefctl (the C library, so every binding) as users other than root:
#   - no daemon at the default socket: the first connect starts one, the uid's own
#     (socket 0600 in a 0700 dir of that uid under $XDG_RUNTIME_DIR, or /tmp/shmref-UID),
#     it exits when idle (--exit-idle, SHMREF_IDLE_EXIT_S) and removes its socket;
#   - six processes at once: one daemon (one pid, one start in its log);
#   - a named socket (--socket, $SHMREFD_SOCKET) or SHMREF_AUTOSTART=0 never starts one;
#   - hostile: another uid's directory planted at /tmp/shmref-UID: the daemon runs in
#     $HOME/.cache/shmref instead (with no usable HOME, a message saying what to do), and
#     nothing is started in it; a daemon that cannot start is reported with its log file
#     and its last words;
#   - hardened (issue 25 item 6): the first connect's time (printed); the daemon keeps no
#     fd of its starter's; root's runs as root; a connect during an idle exit starts a new
#     one; a system socket that refuses the uid: a private daemon with and without
#     XDG_RUNTIME_DIR, its log saying why;
#   - sized for its user (issue 25 item 2): quota = pool, SHMREF_POOL_SIZE,
#     SHMREF_TENANT_QUOTA and the user's shmrefd.conf; a refusal names those knobs;
#   - shmrefctl which (issue 25 item 1): the socket, why, the daemon and its limits.
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
owner=64998 attacker=64997 fallback=64996 refusee=64995
planted=/tmp/shmref-$owner fb=/tmp/shmref-$fallback rf=/tmp/shmref-$refusee
for d in "$planted" "$fb" "$rf"; do
    [ -e "$d" ] && { echo "SKIP: $d exists (not made by this test)"; exit 77; }
done
started=()
# ours: the shmrefd processes whose command line names a path of this test's ($tmp, the
# /tmp/shmref-UID directories it made); nothing else is stopped.
ours() {
    local f p
    for f in /proc/[0-9]*/cmdline; do
        p=${f#/proc/}; p=${p%/cmdline}
        tr '\0' ' ' 2>/dev/null <"$f" | grep -q -e "shmrefd .*--socket \($tmp\|$planted\|$fb\|$rf\)/" && echo "$p"
    done
}
cleanup() {
    for p in $(cat "$tmp"/pids.* 2>/dev/null | sort -u); do
        grep -q shmrefd "/proc/$p/cmdline" 2>/dev/null && kill "$p" 2>/dev/null
    done
    for p in $(ours); do kill "$p" 2>/dev/null; done
    rm -rf "$planted" "$fb" "$rf"
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

# Hostile: a directory planted by another uid where the owner's would be. In sticky /tmp
# the owner cannot remove it, so the daemon moves to a directory of the owner's
# ($HOME/.cache/shmref); with no usable HOME either, the message says what to do.
home=$tmp/home-$owner
mkdir -m 0700 "$home" && chown "$owner" "$home"
mkdir -m 0777 "$planted" && chown "$attacker" "$planted"
as "$owner" HOME="$home" -- "$SHMREFCTL" ping >"$tmp/planted.out" 2>&1
sed -e 's/^/    | /' "$tmp/planted.out"
check "a planted directory of another uid: the daemon runs in \$HOME/.cache/shmref (0700, the uid's)" bash -c \
    "grep -q '^pong' '$tmp/planted.out' && test \"\$(stat -c '%a %u' '$home/.cache/shmref' 2>/dev/null)\" = '700 $owner'"
check "and nothing was started in the planted one" test -z "$(ls -A "$planted")"
as "$owner" HOME=/nonexistent -- "$SHMREFCTL" ping >"$tmp/planted.err" 2>&1
sed -e 's/^/    | /' "$tmp/planted.err"
check "no usable HOME either: the message names the squatter and an action the user can take" bash -c \
    "grep -q '$planted belongs to uid $attacker' '$tmp/planted.err' && grep -q 'export XDG_RUNTIME_DIR=' '$tmp/planted.err'"
rm -rf "$planted"
ln -s "$run" "$planted"
as "$owner" HOME="$home" -- "$SHMREFCTL" ping >"$tmp/link.out" 2>&1
check "a planted symlink: the same alternative" bash -c "grep -q '^pong' '$tmp/link.out' && test -z \"\$(ls -A '$run/shmref' 2>/dev/null)\""
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
# A relative SHMREF_DAEMON names the program from the caller's directory (the daemon's
# child changes to / before it execs: it named nothing there).
r7=$tmp/run7
mkdir -m 0700 "$r7" && chown "$owner" "$r7"
(cd "$tmp/reach" && as "$owner" XDG_RUNTIME_DIR="$r7" SHMREF_DAEMON=bin/shmrefd -- "$SHMREFCTL" ping) >"$tmp/rel.out" 2>&1
sed -e 's/^/    | /' "$tmp/rel.out"
check "a relative SHMREF_DAEMON starts that program" grep -q '^pong' "$tmp/rel.out"
# Hardened (issue 25 item 6). The first connect that starts a daemon: its time, printed.
r6=$tmp/run6
mkdir -m 0700 "$r6" && chown "$owner" "$r6"
t0=$(date +%s%N)
as "$owner" XDG_RUNTIME_DIR="$r6" -- "$SHMREFCTL" ping >"$tmp/first.out" 2>&1
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
echo "    first connect, daemon started (shmrefctl ping, exec included): $ms ms"
check "the first connect that starts the daemon takes under 500 ms (target 50)" bash -c \
    "grep -q '^pong' '$tmp/first.out' && test $ms -lt 500"
# It keeps no fd of the process that started it: a pipe's reader sees EOF when the
# starter exits, not when the daemon does (fd 9, a copy of the pipe, not close-on-exec).
r7=$tmp/run7
mkdir -m 0700 "$r7" && chown "$owner" "$r7"
t0=$(date +%s%N)
as "$owner" XDG_RUNTIME_DIR="$r7" -- bash -c 'exec 8>"$1/probe8"; "$2" ping 9>&1' sh "$r7" "$SHMREFCTL" | cat >"$tmp/pipe.out"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
p=$(sed -n 's/.*pid \([0-9]*\).*/\1/p' "$tmp/pipe.out"); echo "${p:-}" >"$tmp/pids.7"
echo "    a pipe's reader saw EOF after $ms ms (the daemon idles out after 2 s)"
check "a pipe the starter had open: its reader sees EOF with the starter (< 1.5 s), not with the daemon" \
    bash -c "grep -q '^pong' '$tmp/pipe.out' && test $ms -lt 1500"
ls -l "/proc/${p:-0}/fd" 2>/dev/null | sed -n 's/.* -> /    daemon fd -> /p' >"$tmp/fds.7"
check "the daemon holds none of its starter's fds (a file it had open)" bash -c \
    "test -n '${p:-}' && ! grep -q probe8 '$tmp/fds.7'"
# Root's private daemon runs as root: as nobody, any process of nobody could signal it.
rr=$tmp/runroot
mkdir -m 0700 "$rr"
env -i PATH=/usr/bin:/bin SHMREF_IDLE_EXIT_S=2 XDG_RUNTIME_DIR="$rr" "$SHMREFCTL" status >"$tmp/root.out" 2>&1
p=$(pid_of "$tmp/root.out"); echo "${p:-}" >"$tmp/pids.8"
check "root's private daemon runs as root" bash -c "test -n '${p:-}' && test \"\$(stat -c %u /proc/${p:-0})\" = 0"
# A connect while the private daemon is exiting (it still holds the lock, and its listener
# takes connections it will never serve) starts a new daemon once that one is gone.
r9=$tmp/run9
mkdir -m 0700 "$r9" "$r9/shmref" && chown -R "$owner" "$r9"
printf '%s\n' 'import fcntl, os, socket, sys, time' 'd = sys.argv[1]' \
    'lock = open(os.path.join(d, "shmrefd.lock"), "a")' 'fcntl.flock(lock, fcntl.LOCK_EX)' \
    's = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)' 's.bind(os.path.join(d, "shmrefd.sock"))' \
    's.listen(16)' 'open(os.path.join(d, "ready"), "w").close()' \
    'time.sleep(0.5)  # exiting: connections wait in the backlog, then are reset' \
    'os.unlink(os.path.join(d, "shmrefd.sock"))' >"$tmp/dying.py"
chmod 0644 "$tmp/dying.py"
as "$owner" -- /usr/bin/python3 "$tmp/dying.py" "$r9/shmref" &
dying=$!
for _ in $(seq 1 100); do [ -e "$r9/shmref/ready" ] && break; sleep 0.02; done
as "$owner" XDG_RUNTIME_DIR="$r9" -- "$SHMREFCTL" ping >"$tmp/dying.out" 2>&1
wait "$dying"
sed -e 's/^/    | /' "$tmp/dying.out"
check "a connect during a private daemon's exit starts a new one" grep -q '^pong' "$tmp/dying.out"
# The system socket refuses the uid (mode 0660, group root): with and without
# XDG_RUNTIME_DIR the same choice, a private daemon, whose log says why and what to do.
mkdir -m 0755 /run/shmrefd
"$SHMREFD" --socket /run/shmrefd/shmrefd.sock --socket-mode 0660 --config= >"$tmp/system2.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S /run/shmrefd/shmrefd.sock ] && break; sleep 0.05; done
ra=$tmp/runa
mkdir -m 0700 "$ra" && chown "$owner" "$ra"
as "$owner" XDG_RUNTIME_DIR="$ra" -- "$SHMREFCTL" ping >"$tmp/refused.xdg" 2>&1
as "$refusee" HOME=/nonexistent -- "$SHMREFCTL" ping >"$tmp/refused.tmp" 2>&1
sed -e 's/^/    | /' "$tmp/refused.xdg" "$tmp/refused.tmp"
grep -h 'refused uid' "$ra/shmref/shmrefd.log" "$rf/shmrefd.log" | sed -e 's/^/    log: /'
check "refused by the system socket, with XDG_RUNTIME_DIR: a private daemon" grep -q '^pong' "$tmp/refused.xdg"
check "refused by the system socket, without XDG_RUNTIME_DIR: the same" grep -q '^pong' "$tmp/refused.tmp"
check "the private daemon's log says the system daemon refused the uid, and the group to join" bash -c \
    "grep -q 'shmrefd at /run/shmrefd/shmrefd.sock refused uid $owner (Permission denied).*group root' '$ra/shmref/shmrefd.log' &&
     grep -q 'refused uid $refusee (Permission denied)' '$rf/shmrefd.log'"
kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=
rm -rf /run/shmrefd
# Sized for its user (issue 25 item 2): one tenant, so its quota is its pool; the pool is
# the smallest of half the memory cgroup's room, half of /dev/shm's free bytes and a
# quarter of MemAvailable; SHMREF_POOL_SIZE / SHMREF_TENANT_QUOTA and the user's
# shmrefd.conf override it; a refusal names those knobs, not a flag no one can give.
limits() { # limits JSON: "POOL QUOTA" from status --json
    /usr/bin/python3 -c 'import json,sys; l=json.load(open(sys.argv[1]))["limits"]; print(l["pool_size"], l["tenant_quota"])' \
        "$1" 2>/dev/null || echo "? ?"
}
for d in s1 s2 s3 s4; do mkdir -m 0700 "$tmp/$d" && chown "$owner" "$tmp/$d"; done
avail_kb=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
as "$owner" XDG_RUNTIME_DIR="$tmp/s1" -- "$SHMREFCTL" status --json >"$tmp/s1.json" 2>&1
read -r pool quota < <(limits "$tmp/s1.json")
echo "    default: pool $pool, tenant quota $quota (MemAvailable $avail_kb kB)"
check "by default its tenant quota is its pool (its one tenant)" test "$pool" = "$quota"
check "and the pool is at most a quarter of MemAvailable (10% slack)" bash -c \
    "test '$pool' != '?' && test $((${pool/\?/0} / 1024 * 40 / 11)) -le $avail_kb"
as "$owner" XDG_RUNTIME_DIR="$tmp/s2" SHMREF_POOL_SIZE=64M SHMREF_TENANT_QUOTA=8M -- \
    "$SHMREFCTL" status --json >"$tmp/s2.json" 2>&1
check "SHMREF_POOL_SIZE=64M SHMREF_TENANT_QUOTA=8M: pool 64 MiB, quota 8 MiB" \
    test "$(limits "$tmp/s2.json")" = "67108864 8388608"
conf=$tmp/conf
mkdir -p "$conf/shmref" && printf '[daemon]\npool-size = 32M\ntenant-quota = 4M\n' >"$conf/shmref/shmrefd.conf"
chown -R "$owner" "$conf"
as "$owner" XDG_RUNTIME_DIR="$tmp/s3" XDG_CONFIG_HOME="$conf" -- "$SHMREFCTL" status --json >"$tmp/s3.json" 2>&1
check "\$XDG_CONFIG_HOME/shmref/shmrefd.conf: pool 32 MiB, quota 4 MiB" test "$(limits "$tmp/s3.json")" = "33554432 4194304"
as "$owner" XDG_RUNTIME_DIR="$tmp/s4" XDG_CONFIG_HOME="$conf" SHMREF_TENANT_QUOTA=6M -- \
    "$SHMREFCTL" status --json >"$tmp/s4.json" 2>&1
check "an environment variable overrides the file: quota 6 MiB, the file's pool" \
    test "$(limits "$tmp/s4.json")" = "33554432 6291456"
head -c 10000000 /dev/zero >"$tmp/ten" && chmod 0644 "$tmp/ten"
as "$owner" XDG_RUNTIME_DIR="$tmp/s2" SHMREF_POOL_SIZE=64M SHMREF_TENANT_QUOTA=8M -- \
    "$SHMREFCTL" put "$tmp/ten" >"$tmp/quota.err" 2>&1
sed -e 's/^/    | /' "$tmp/quota.err"
check "a private daemon's quota refusal names SHMREF_TENANT_QUOTA and the file, not --tenant-quota" bash -c \
    "grep -q 'quota exceeded' '$tmp/quota.err' && grep -q 'SHMREF_TENANT_QUOTA' '$tmp/quota.err' &&
     grep -q 'shmref/shmrefd.conf' '$tmp/quota.err' && ! grep -q -- '--tenant-quota' '$tmp/quota.err'"
# shmrefctl which (issue 25 item 1): the socket a connect would use, why, the daemon's
# pid and uid, its pool and the uid's quota; it starts nothing.
w1=$tmp/w1
mkdir -m 0700 "$w1" && chown "$owner" "$w1"
as "$owner" XDG_RUNTIME_DIR="$w1" -- "$SHMREFCTL" which >"$tmp/which1.out" 2>&1
sed -e 's/^/    | /' "$tmp/which1.out"
check "which, no daemon anywhere: the private daemon's socket, that it would be started, and nothing started" bash -c \
    "grep -q '^socket: $w1/shmref/shmrefd.sock\$' '$tmp/which1.out' &&
     grep -q '^daemon: .*private.*not running: the next connect starts it' '$tmp/which1.out' &&
     grep -q 'no daemon at the default socket $w1/shmrefd.sock' '$tmp/which1.out' &&
     grep -q 'system socket /run/shmrefd/shmrefd.sock: absent' '$tmp/which1.out' &&
     grep -q '^pool size: .*(would be given' '$tmp/which1.out' && test ! -e '$w1/shmref/shmrefd.sock'"
as "$owner" XDG_RUNTIME_DIR="$w1" -- "$SHMREFCTL" status --json >"$tmp/w1.json" 2>&1
p=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["daemon"]["pid"])' "$tmp/w1.json" 2>/dev/null)
echo "${p:-}" >"$tmp/pids.w1"
read -r pool quota < <(limits "$tmp/w1.json")
as "$owner" XDG_RUNTIME_DIR="$w1" -- "$SHMREFCTL" which >"$tmp/which2.out" 2>&1
sed -e 's/^/    | /' "$tmp/which2.out"
check "which, the private daemon running: its pid and uid, its pool and the uid's quota (status)" bash -c \
    "test -n '$p' && grep -q '^daemon: .*private.*running' '$tmp/which2.out' &&
     grep -q '^pid: $p, uid $owner\$' '$tmp/which2.out' &&
     grep -q '^pool size: .* ($pool bytes)\$' '$tmp/which2.out' &&
     grep -q '^tenant quota: .* ($quota bytes) for uid $owner\$' '$tmp/which2.out'"
as "$owner" XDG_RUNTIME_DIR="$w1" -- "$SHMREFCTL" --socket "$w1/none.sock" which >"$tmp/which3.out" 2>&1
check "which, a socket named: that one, a choice, nothing started" bash -c \
    "grep -q '^socket: $w1/none.sock\$' '$tmp/which3.out' && grep -q 'named by --socket' '$tmp/which3.out' &&
     grep -q 'No such file' '$tmp/which3.out'"
mkdir -m 0755 /run/shmrefd
"$SHMREFD" --socket /run/shmrefd/shmrefd.sock --socket-mode 0666 --config= >"$tmp/system3.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S /run/shmrefd/shmrefd.sock ] && break; sleep 0.05; done
w2=$tmp/w2
mkdir -m 0700 "$w2" && chown "$owner" "$w2"
as "$owner" XDG_RUNTIME_DIR="$w2" -- "$SHMREFCTL" which >"$tmp/which4.out" 2>&1
sed -e 's/^/    | /' "$tmp/which4.out"
check "which, a system daemon answering: it, and why" bash -c \
    "grep -q '^socket: /run/shmrefd/shmrefd.sock\$' '$tmp/which4.out' &&
     grep -q '^daemon: the system shmrefd' '$tmp/which4.out' && grep -q '^pid: $dpid, ' '$tmp/which4.out'"
kill "$dpid"; wait "$dpid" 2>/dev/null
rm -f /run/shmrefd/shmrefd.sock # left by a daemon serving as nobody in root's directory
"$SHMREFD" --socket /run/shmrefd/shmrefd.sock --socket-mode 0660 --config= >"$tmp/system4.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S /run/shmrefd/shmrefd.sock ] && break; sleep 0.05; done
as "$owner" HOME=/nonexistent -- "$SHMREFCTL" which >"$tmp/which5.out" 2>&1
sed -e 's/^/    | /' "$tmp/which5.out"
check "which, the system socket refusing the uid: the private daemon, the refusal and the group to join" bash -c \
    "grep -q '^socket: /tmp/shmref-$owner/shmrefd.sock\$' '$tmp/which5.out' &&
     grep -q 'system socket /run/shmrefd/shmrefd.sock: refused uid $owner (Permission denied).*group root' '$tmp/which5.out'"
kill "$dpid"; wait "$dpid" 2>/dev/null; dpid=
rm -rf /run/shmrefd
test_end
