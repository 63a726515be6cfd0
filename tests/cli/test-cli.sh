#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-cli.sh: shmrefd and shmrefctl as a new user runs them: put an 80 MB file, get it
# back from another process byte-identical, read status --json, and check the exit
# codes of refusals. Usage: test-cli.sh SHMREFD SHMREFCTL
set -euo pipefail
SHMREFD=$1 SHMREFCTL=$2
. "$(dirname "$0")/../lib.sh"
test_begin cli
dir=$tmp
sock=$dir/shmrefd.sock
json_at() { # json_at SOCKET EXPR: the same for the daemon at SOCKET
    "$SHMREFCTL" --socket "$1" status --json | /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); print($2)"
}
json() { # json EXPR: evaluate a Python expression on status --json as s
    "$SHMREFCTL" --socket "$sock" status --json |
        /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"
}

"$SHMREFD" --socket "$sock" --user root 2>"$dir/log" & # root, so it can remove its socket from $dir
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done

check "ping answers" "$SHMREFCTL" --socket "$sock" ping
check "the start line names socket and pool size" grep -q "serving on $sock.*pool size" "$dir/log"

head -c 80000000 /dev/urandom >"$dir/in.bin"
desc=$("$SHMREFCTL" --socket "$sock" put --max-gets 1 "$dir/in.bin")
check "put prints a descriptor" bash -c "[[ '$desc' =~ ^shmref1:[0-9a-f]{32}:80000000$ ]]"
check "status shows the retained 80 MB" test "$(json 's["buffers"]["retained"]')" = 1
# The descriptor is a bearer capability: get reads it from stdin (or a file), so it never
# shows in /proc/PID/cmdline (readable by every uid). Seen from outside while get waits.
mkfifo "$dir/desc.fifo"
exec 7<>"$dir/desc.fifo"    # read-write: opening does not wait for the reader
"$SHMREFCTL" --socket "$sock" get - -o "$dir/out.bin" <"$dir/desc.fifo" 2>"$dir/get.err" 7>&- &
gpid=$!
for _ in $(seq 100); do tr '\0' ' ' </proc/$gpid/cmdline | grep -q 'shmrefctl.* get -' && break; sleep 0.05; done
check "get - runs, waiting for its descriptor on stdin" bash -c "tr '\\0' ' ' </proc/$gpid/cmdline | grep -q 'shmrefctl.* get -'"
check "and the descriptor is not in its command line" bash -c "! tr '\\0' ' ' </proc/$gpid/cmdline | grep -q shmref1:"
printf '%s\n' "$desc" >&7
exec 7>&-
wait "$gpid"
check "get - (the descriptor from stdin) gives identical bytes" cmp -s "$dir/in.bin" "$dir/out.bin"
check "and warns of nothing" test ! -s "$dir/get.err"
check "leased bytes back at zero" test "$(json 's["pool"]["bytes_leased"]')" = 0
check "status json has the documented keys" test "$(json '",".join(sorted(s["pool"]))')" = \
    "bytes_allocated,bytes_free,bytes_leased,bytes_pinned,bytes_stock,bytes_tables,bytes_total,bytes_warm,classes,dir,fs_available,kind,mappers,stock_reserve"

desc2=$(printf 'hello through stdin' | "$SHMREFCTL" --socket "$sock" put --keep-ms 5000 -)
printf '%s' "$desc2" >"$dir/desc2"
check "put from stdin and get to stdout, the descriptor from a file (@FILE)" \
    test "$("$SHMREFCTL" --socket "$sock" get "@$dir/desc2")" = "hello through stdin"
check "and from --descriptor-file" \
    test "$("$SHMREFCTL" --socket "$sock" get --descriptor-file "$dir/desc2")" = "hello through stdin"
check "a descriptor given as the argument still works" \
    test "$("$SHMREFCTL" --socket "$sock" get "$desc2" 2>"$dir/argv.err")" = "hello through stdin"
check "with a warning that every user can read it" grep -q "warning: .*every user.*/proc/PID/cmdline" "$dir/argv.err"
set +e
head -c 4096 /dev/zero | tr '\\0' 'a' | "$SHMREFCTL" --socket "$sock" get - >/dev/null 2>"$dir/long.err"; rc=$?
"$SHMREFCTL" --socket "$sock" get "@$dir/no-such-file" >/dev/null 2>"$dir/nofile.err"; rc2=$?
set -e
check "4 KiB on stdin is not a descriptor: usage error (2)" test "$rc" = 2
check "and the message says so" grep -q "more than a descriptor" "$dir/long.err"
check "a missing descriptor file is a usage error (2) naming it" \
    bash -c "test $rc2 = 2 && grep -q 'no-such-file: No such file' '$dir/nofile.err'"

set +e
"$SHMREFCTL" --socket "$sock" get "$desc" >/dev/null 2>"$dir/err"; rc=$?
set -e
check "a consumed descriptor is refused with exit 1" test "$rc" = 1
check "and the message says why" grep -q "no published buffer" "$dir/err"

# Fan-out: the retention serves every get within its time; --max-gets ends it at N.
desc3=$(printf 'one for all' | "$SHMREFCTL" --socket "$sock" put --keep-ms 60000 -)
check "a retained buffer serves a first get" test "$("$SHMREFCTL" --socket "$sock" get "$desc3")" = "one for all"
check "and a second one" test "$("$SHMREFCTL" --socket "$sock" get "$desc3")" = "one for all"
desc4=$(printf 'two gets' | "$SHMREFCTL" --socket "$sock" put --max-gets 2 -)
"$SHMREFCTL" --socket "$sock" get "$desc4" >/dev/null
"$SHMREFCTL" --socket "$sock" get "$desc4" >/dev/null
set +e
"$SHMREFCTL" --socket "$sock" get "$desc4" >/dev/null 2>&1; rc=$?
"$SHMREFCTL" --socket "$sock" put --max-gets x - </dev/null >/dev/null 2>&1; rc2=$?
set -e
check "put --max-gets 2: a third get is refused" test "$rc" = 1
check "put --max-gets x is a usage error" test "$rc2" = 2
set +e
"$SHMREFCTL" --socket "$sock" get not-a-descriptor >/dev/null 2>&1; rc=$?
"$SHMREFCTL" --socket "$dir/nothing.sock" ping >/dev/null 2>&1; rc2=$?
set -e
check "a malformed descriptor is a usage error (2)" test "$rc" = 2
check "no daemon is exit 1" test "$rc2" = 1
set +e
"$SHMREFCTL" --socket "$dir/nothing.sock" ping 2>"$dir/err1"
SHMREFD_SOCKET=$dir/default.sock "$SHMREFCTL" ping 2>"$dir/err2"
set -e
check "a connect error names the socket given" grep -q "at $dir/nothing.sock: No such file or directory (no socket there" "$dir/err1"
check "and the default socket's path when none is given" grep -q "at $dir/default.sock: " "$dir/err2"
# A regular file or a directory given as the socket is named as such (connect says
# "Connection refused" for both); top --once with no daemon does not promise retries.
: >"$dir/regular"
mkdir "$dir/adir"
set +e
"$SHMREFCTL" --socket "$dir/regular" ping 2>"$dir/err3"
"$SHMREFCTL" --socket "$dir/adir" ping 2>"$dir/err4"
"$SHMREFCTL" --socket "$dir/nothing.sock" top --once >"$dir/top-down" 2>&1; rc=$?
set -e
check "a regular file as the socket is called one" grep -q "at $dir/regular: .*not a socket but a regular" "$dir/err3"
check "a directory as the socket is called one" grep -q "at $dir/adir: .*that is a directory, not a socket" "$dir/err4"
check "top --once with the daemon down exits 1" test "$rc" = 1
check "saying it is not reachable" grep -q "shmrefd is not reachable at $dir/nothing.sock" "$dir/top-down"
check "without promising retries it does not make" bash -c "! grep -q retrying '$dir/top-down'"
check "status table prints" bash -c "'$SHMREFCTL' --socket '$sock' status | grep -q '^pool /dev/shm'"

# A client's name is its comm: a program file named with a CSI, a right-to-left override
# and bytes that are not UTF-8 shows up cleaned, and status --json stays valid JSON.
evil=$dir/$'\e[2J\xe2\x80\xae\xff\xfeab'
cp "$SHMREFCTL" "$evil"
"$evil" --socket "$sock" status --json >"$dir/evil.json"
check "status --json is valid JSON whatever a client calls itself" \
    /usr/bin/python3 -c "import json,sys; json.load(open(sys.argv[1], encoding='utf-8'))" "$dir/evil.json"
check "the name is valid UTF-8, without control or bidi characters" \
    /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert '[2J??ab' in [c['name'] for c in s['clients']], s['clients']" "$dir/evil.json"
"$evil" --socket "$sock" status >"$dir/evil.txt"
check "the status table carries no escape byte" bash -c "! grep -q \$'\\e' '$dir/evil.txt'"

kill -TERM "$dpid"; wait "$dpid"; rc=$?; dpid=
check "SIGTERM exits 0" test "$rc" = 0
check "the socket is removed" test ! -e "$sock"

# A daemon removes only the socket it bound: once its path names another daemon's socket
# (its own was deleted, and a second daemon bound a new one there), it leaves that alone.
"$SHMREFD" --socket "$dir/two.sock" --config /dev/null --pool-size 32M --pool-hugepages no --user root 2>"$dir/two1.log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/two.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
rm "$dir/two.sock"
"$SHMREFD" --socket "$dir/two.sock" --config /dev/null --pool-size 32M --pool-hugepages no --user root 2>"$dir/two2.log" &
dpid2=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/two.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
kill -TERM "$dpid"; wait "$dpid"; dpid=
check "a daemon whose socket path now names another daemon's socket leaves it at exit" test -S "$dir/two.sock"
check "and that daemon still answers there" "$SHMREFCTL" --socket "$dir/two.sock" ping
check "the first says why it left it" grep -q "leaving $dir/two.sock: it is no longer the socket this daemon bound" "$dir/two1.log"
kill -TERM "$dpid2"; wait "$dpid2"
check "the second removes its own" test ! -e "$dir/two.sock"

# A root daemon given no --user serves as an unprivileged user (the package's shmrefd if it
# exists, else nobody) once its socket and pool are set up; --user root keeps root.
if [ "$(id -u)" = 0 ]; then
    chmod 755 "$dir" # the daemon's user reaches its directory through it, as through /run
    ctl_nobody=$(reachable "$SHMREFCTL") # for other uids: the build may sit in a 0700 clone
    "$SHMREFD" --socket "$dir/own/s.sock" --config /dev/null --pool-size 32M --pool-hugepages no 2>"$dir/def.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/own/s.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    duid=$(awk '/^Uid:/ {print $2}' "/proc/$dpid/status")
    check "a root daemon given no --user does not serve as uid 0" test "$duid" != 0
    check "but as the package's user, or nobody" test "$duid" = "$(id -u shmrefd 2>/dev/null || id -u nobody)"
    check "and says so" grep -q "serving as user [a-z]* (uid $duid), not root" "$dir/def.log"
    check "root's clients are served" bash -c "printf hi | '$SHMREFCTL' --socket '$dir/own/s.sock' put - >/dev/null"
    kill -TERM "$dpid"; wait "$dpid"; dpid=
    check "its socket, in the directory it made, is removed at exit" test ! -e "$dir/own/s.sock"
    "$SHMREFD" --socket "$dir/root.sock" --config /dev/null --pool-size 32M --pool-hugepages no --user root 2>"$dir/root.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/root.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    check "--user root keeps uid 0" test "$(awk '/^Uid:/ {print $2}' "/proc/$dpid/status")" = 0
    kill -TERM "$dpid"; wait "$dpid"; dpid=

    # Without systemd, the unit's settings by flags (docs/operating.md): user, the socket's
    # group and mode, no capabilities, no_new_privs; here nobody and nogroup.
    "$SHMREFD" --socket "$dir/unit/s.sock" --config /dev/null --pool-size 32M --pool-hugepages no \
        --user nobody --socket-group nogroup --socket-mode 0660 2>"$dir/unit.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/unit/s.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    check "--user nobody: uid and gid nobody/nogroup, no capabilities, no_new_privs" \
        bash -c 'awk "/^Uid:/ {u=\$2} /^Gid:/ {g=\$2} /^CapEff:/ {c=\$2} /^CapBnd:/ {b=\$2} /^NoNewPrivs:/ {n=\$2} END {print u, g, c, b, n}" "/proc/$1/status" |
                 grep -qx "$(id -u nobody) $(getent group nogroup | cut -d: -f3) 0000000000000000 0000000000000000 1"' _ "$dpid"
    check "--socket-group nogroup --socket-mode 0660: the socket's group and mode" \
        test "$(stat -c '%G %a' "$dir/unit/s.sock")" = "nogroup 660"
    check "the socket's directory, made by the daemon, belongs to its user" test "$(stat -c %U "$dir/unit")" = nobody
    member=$(getent group nogroup | cut -d: -f3)
    check "a member of the socket's group may connect" \
        bash -c 'setpriv --reuid=1000 --regid=1000 --groups="$3" "$1" --socket "$2" ping >/dev/null' _ "$ctl_nobody" "$dir/unit/s.sock" "$member"
    check "a non-member may not" \
        bash -c '! setpriv --reuid=1000 --regid=1000 --clear-groups "$1" --socket "$2" ping 2>/dev/null' _ "$ctl_nobody" "$dir/unit/s.sock"
    kill -TERM "$dpid"; wait "$dpid"; rc=$?; dpid=
    check "it stops on SIGTERM (exit 0) and removes its socket" test "$rc" = 0 -a ! -e "$dir/unit/s.sock"

    # The kernel counts SCM_RIGHTS fds in flight per sending uid over all its processes: a
    # daemon of uid nobody with RLIMIT_NOFILE 64 stalls (ETOOMANYREFS) while another process
    # of nobody holds 160 fds in flight. The wait is counted and logged with that cause,
    # and the reply goes once that process is gone.
    cat >"$dir/inflight.py" <<'PY'
import os, socket, time
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
fd = os.open("/dev/null", os.O_RDONLY)
for _ in range(20):
    socket.send_fds(a, [b"x"], [fd] * 8)
print("ready", flush=True)
time.sleep(600)
PY
    prlimit --nofile=64:64 "$SHMREFD" --socket "$dir/fl.sock" --config /dev/null --pool-size 32M \
        --pool-hugepages no --user nobody 2>"$dir/fl.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/fl.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    coproc FLIGHT { exec setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 "$dir/inflight.py"; }
    read -r -t 10 line <&"${FLIGHT[0]}"
    check "another process of the daemon's uid holds 160 fds in flight" test "${line:-}" = ready
    printf 'waits' | "$SHMREFCTL" --socket "$dir/fl.sock" put - >"$dir/fl.out" 2>&1 &
    put=$!
    for _ in $(seq 100); do [ "$(json_at "$dir/fl.sock" "s['counters']['fd_waits']")" -ge 1 ] && break; sleep 0.05; done
    check "a lease reply waits on ETOOMANYREFS, counted in counters.fd_waits" \
        test "$(json_at "$dir/fl.sock" "s['counters']['fd_waits']")" -ge 1
    check "and in metrics" bash -c '"$1" --socket "$2" metrics | grep -q "^shmref_fd_waits_total [1-9]"' _ "$SHMREFCTL" "$dir/fl.sock"
    check "the log names the uid's fds in flight over all its processes, and the fix" \
        grep -q "ETOOMANYREFS): the fds in flight of uid $(id -u nobody), over all its processes.*RLIMIT_NOFILE 64.*--user" "$dir/fl.log"
    kill "$FLIGHT_PID"; wait "$FLIGHT_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$put" 2>/dev/null || break; sleep 0.05; done
    rc=0; wait "$put" || rc=$?
    check "once that process is gone the put completes" bash -c '[ "$1" = 0 ] && grep -q "^shmref1:" "$2"' _ "$rc" "$dir/fl.out"
    kill -TERM "$dpid"; wait "$dpid"; dpid=
fi

# A retained put nobody holds is the first thing its own uid's next lease reclaims when the
# quota is short: a second 5 MB put under an 8 MiB quota succeeds, the first is gone.
"$SHMREFD" --socket "$dir/q.sock" --config /dev/null --pool-size 32M --tenant-quota 8M --pool-hugepages no 2>"$dir/q.log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/q.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
head -c 5000000 /dev/zero >"$dir/5m.bin"
set +e
qd1=$("$SHMREFCTL" --socket "$dir/q.sock" put "$dir/5m.bin")
"$SHMREFCTL" --socket "$dir/q.sock" put "$dir/5m.bin" >/dev/null 2>"$dir/q.err"; rc=$?
"$SHMREFCTL" --socket "$dir/q.sock" get "$qd1" >/dev/null 2>&1; rc2=$?
set -e
check "a second 5 MB put over an 8 MiB quota succeeds, reclaiming the first" test "$rc" = 0
check "the first put's descriptor is gone (exit 1)" test "$rc2" = 1
check "status counts the reclaimed retention" test "$(json_at "$dir/q.sock" 's["buffers"]["reclaimed"]')" = 1
kill -TERM "$dpid"; wait "$dpid"; dpid=

# --check-config refuses what start refuses, and warns about a quota above the pool.
set +e
"$SHMREFD" --check-config --config /dev/null --pool-size 1024T >/dev/null 2>"$dir/cc1"; rc=$?
"$SHMREFD" --check-config --config /dev/null --pool-size 64M --tenant-quota 1G >/dev/null 2>"$dir/cc2"; rc2=$?
set -e
check "--check-config with a pool larger than its directory fails (exit 1)" test "$rc" = 1
check "naming both numbers" grep -q "pool size .* (1125899906842624 bytes) does not fit in /dev/shm: .* available" "$dir/cc1"
check "a tenant quota above the pool size passes with a warning" \
    bash -c '[ "$1" = 0 ] && grep -q "warning: tenant-quota 1.0 GiB is above the pool size 64.0 MiB" "$2"' _ "$rc2" "$dir/cc2"

# Connections take two fds each (a socket, a pidfd): a max-clients that RLIMIT_NOFILE cannot
# hold beside the buffers' share is a warning with the numbers, at --check-config and start.
set +e
(ulimit -n 1024; exec "$SHMREFD" --check-config --config /dev/null) >/dev/null 2>"$dir/cc3"; rc3=$?
(ulimit -n 1024; exec "$SHMREFD" --check-config --config /dev/null --max-clients 120) >/dev/null 2>"$dir/cc4"; rc4=$?
set -e
check "--check-config warns when max-clients' connections do not fit RLIMIT_NOFILE, with both fixes" \
    bash -c '[ "$1" = 0 ] && grep -q "warning: max-clients 1024 (and 8 for operators) may take 2064 fds, a socket and a pidfd each, more than the 256 that RLIMIT_NOFILE 1024 leaves .* raise the limit to 8256 or more .* or lower --max-clients to 120" "$2"' _ "$rc3" "$dir/cc3"
check "and not when they fit (max-clients 120)" bash -c '[ "$1" = 0 ] && ! grep -q "max-clients" "$2"' _ "$rc4" "$dir/cc4"
(ulimit -n 1024; exec "$SHMREFD" --socket "$dir/fd.sock" --config /dev/null --user root) 2>"$dir/fd.log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/fd.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
check "a daemon started so logs the same warning" grep -q "max-clients 1024 (and 8 for operators) may take 2064 fds" "$dir/fd.log"
kill -TERM "$dpid"; wait "$dpid"; dpid=

# A refusal by allow-users reaches the user with the daemon's reason and the path.
if [ "$(id -u)" = 0 ]; then
    chmod 755 "$dir"
    "$SHMREFD" --socket "$dir/acl.sock" --socket-mode 0666 --allow-users 0 --config /dev/null 2>"$dir/acl.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/acl.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    set +e
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$ctl_nobody" --socket "$dir/acl.sock" ping 2>"$dir/acl.err"
    rc=$?
    set -e
    check "a root daemon serving as nobody in a directory of root's warns that its socket will stay" \
        grep -q "uid $(id -u nobody), which shmrefd serves as, may not remove files in $dir: the socket $dir/acl.sock will stay" "$dir/acl.log"
    check "a user not in allow-users is refused (exit 1)" test "$rc" = 1
    check "with the daemon's reason and the socket path" \
        grep -q "shmrefd at $dir/acl.sock: access denied: uid $(id -u nobody) .* not in allow-users" "$dir/acl.err"
    kill -TERM "$dpid"; wait "$dpid"; dpid=

    # A daemon of another uid that cannot make its socket's directory (as /run/shmrefd for
    # a non-root user without XDG_RUNTIME_DIR) says where to put the socket instead. The
    # path is under this test's root-owned 0755 directory, so nothing else is touched.
    d_nobody=$(reachable "$SHMREFD")
    set +e
    setpriv --reuid=nobody --regid=nogroup --clear-groups env -u XDG_RUNTIME_DIR \
        "$d_nobody" --config /dev/null --pool-hugepages no --socket "$dir/rootonly/shmrefd.sock" 2>"$dir/nobody.log"
    rc=$?
    set -e
    check "a non-root daemon that cannot create its socket's directory fails (exit 1)" test "$rc" = 1
    check "and hints at --socket and XDG_RUNTIME_DIR" \
        grep -q "cannot listen on $dir/rootonly/shmrefd.sock: .*give --socket PATH in a directory of yours, e.g. --socket \$XDG_RUNTIME_DIR/shmrefd.sock" "$dir/nobody.log"
fi

test_end
