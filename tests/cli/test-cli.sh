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
json() { # json EXPR: evaluate a Python expression on status --json as s
    "$SHMREFCTL" --socket "$sock" status --json |
        /usr/bin/python3 -c "import json,sys; s=json.load(sys.stdin); print($1)"
}

"$SHMREFD" --socket "$sock" 2>"$dir/log" &
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
    "bytes_allocated,bytes_free,bytes_leased,bytes_pinned,bytes_total,bytes_warm,classes,dir,fs_available,kind"

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

# --check-config refuses what start refuses, and warns about a quota above the pool.
set +e
"$SHMREFD" --check-config --config /dev/null --pool-size 1024T >/dev/null 2>"$dir/cc1"; rc=$?
"$SHMREFD" --check-config --config /dev/null --pool-size 64M --tenant-quota 1G >/dev/null 2>"$dir/cc2"; rc2=$?
set -e
check "--check-config with a pool larger than its directory fails (exit 1)" test "$rc" = 1
check "naming both numbers" grep -q "pool size .* (1125899906842624 bytes) does not fit in /dev/shm: .* available" "$dir/cc1"
check "a tenant quota above the pool size passes with a warning" \
    bash -c '[ "$1" = 0 ] && grep -q "warning: tenant-quota 1.0 GiB is above the pool size 64.0 MiB" "$2"' _ "$rc2" "$dir/cc2"

# A refusal by allow-users reaches the user with the daemon's reason and the path.
if [ "$(id -u)" = 0 ]; then
    chmod 755 "$dir"
    "$SHMREFD" --socket "$dir/acl.sock" --socket-mode 0666 --allow-users 0 --config /dev/null 2>"$dir/acl.log" &
    dpid=$!
    for _ in $(seq 200); do "$SHMREFCTL" --socket "$dir/acl.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
    set +e
    setpriv --reuid=nobody --regid=nogroup --clear-groups "$SHMREFCTL" --socket "$dir/acl.sock" ping 2>"$dir/acl.err"
    rc=$?
    set -e
    check "a user not in allow-users is refused (exit 1)" test "$rc" = 1
    check "with the daemon's reason and the socket path" \
        grep -q "shmrefd at $dir/acl.sock: access denied: uid $(id -u nobody) .* not in allow-users" "$dir/acl.err"
    kill -TERM "$dpid"; wait "$dpid"; dpid=
fi

test_end
