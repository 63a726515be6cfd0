#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-top.sh: `shmrefctl top` in a real terminal (tmux: send-keys, capture-pane), on a
# private tmux server. A daemon with retained buffers, a client holding a lease and a
# refused put; top must show clients (user name, process name, leases), tenants (quota
# refusals), buffers (state, publisher pid, retention left) and a lease rate; fit a
# resized window; say when the daemon is gone and come back when it returns; quit on q
# with exit 0. `status --buffers` and `top --once` print the same buffer rows.
# Usage: test-top.sh SHMREFD SHMREFCTL LIBSHMREF
set -uo pipefail
SHMREFD=$1 SHMREFCTL=$2 LIB=$3
. "$(dirname "$0")/../lib.sh"
command -v tmux >/dev/null || { echo "SKIP: tmux is not installed (scripts/deps.sh installs it)"; exit 77; }
test_begin top
sock=$tmp/s.sock
tm() { tmux -L "shmref-top-$$" "$@"; }
top_cleanup() { tm kill-server 2>/dev/null; [ -n "${hpid:-}" ] && kill "$hpid" 2>/dev/null; test_cleanup; }
trap top_cleanup EXIT
ctl() { "$SHMREFCTL" --socket "$sock" "$@"; }
: >"$tmp/empty.conf"
start_daemon() {
    "$SHMREFD" --config "$tmp/empty.conf" --socket "$sock" --pool-size 64M 2>>"$tmp/log" &
    dpid=$!
    for _ in $(seq 200); do ctl ping >/dev/null 2>&1 && break; sleep 0.05; done
}
screen() { tm capture-pane -p -t top; }
# wait_for REGEX: until the pane shows it (5 s).
wait_for() {
    for _ in $(seq 100); do screen | grep -Eq "$1" && return 0; sleep 0.05; done
    echo "    | the pane never showed /$1/:"; screen | sed 's/^/    | /'; return 1
}
start_daemon

# A client that holds one lease (a real process through libshmref), named in hello by
# its comm: "holder".
cat >"$tmp/holder.py" <<'PY'
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
conn, buf = ctypes.c_void_p(), ctypes.c_void_p()
assert lib.shmref_connect(sys.argv[2].encode(), ctypes.byref(conn)) == 0
assert lib.shmref_lease(conn, ctypes.c_size_t(1 << 20), ctypes.byref(buf)) == 0
time.sleep(600)
PY
cp /usr/bin/python3 "$tmp/holder" 2>/dev/null || ln -s /usr/bin/python3 "$tmp/holder"
env $(asan_env "$LIB") "$tmp/holder" "$tmp/holder.py" "$LIB" "$sock" &
hpid=$!
for i in $(seq 12); do echo "buffer $i" | ctl put --keep-ms 120000 - >/dev/null; done
head -c 40000000 /dev/zero | ctl put - >/dev/null 2>&1 # over the 32 MiB default quota: refused
check "status --buffers lists the 12 retained buffers" \
    test "$(ctl status --buffers | grep -c '^[0-9]* *retained ')" = 12
check "top --once prints the same buffer rows without escapes" \
    bash -c '"$1" --socket "$2" top --once | grep -c "^[0-9]* *retained " | grep -qx 12 && ! "$1" --socket "$2" top --once | grep -q $'"'"'\033'"'"'' _ "$SHMREFCTL" "$sock"
check "status --json carries the buffer, client and tenant fields" bash -c '"$1" --socket "$2" status --json | /usr/bin/python3 -c "
import json, sys
s = json.load(sys.stdin)
b = s[\"buffers\"][\"list\"][0]
assert set(b) >= {\"id\", \"state\", \"size\", \"capacity\", \"uid\", \"pid\", \"holders\", \"age_ms\", \"retention_left_ms\"}, b
assert all(\"connected_ms\" in c for c in s[\"clients\"])
t = s[\"tenants\"][0]
assert t[\"refused_quota\"] == 1 and \"refused_access\" in t, t
"' _ "$SHMREFCTL" "$sock"

tm new-session -d -s top -x 132 -y 50 "'$SHMREFCTL' --socket '$sock' top --delay 0.3; echo EXIT=\$? >'$tmp/top.rc'; sleep 30"
check "top draws its header" wait_for "^shmrefd [0-9.]+ pid $dpid up"
check "on the alternate screen, with the cursor hidden" \
    test "$(tm display-message -p -t top '#{alternate_on} #{cursor_flag}')" = "1 0"
check "clients: the holder with its user name, process name and 1 lease" \
    wait_for "^[0-9]+ +$hpid +$(id -un) +holder +1 +1\.0 MiB [0-9:]+ [0-9]+s"
check "tenants: $(id -un) with one quota refusal (then its pinned and stock bytes)" \
    wait_for "^$(id -u) +$(id -un) .* 1 +0 +0 +0 +0 +[0-9.]+ [KMGT]?i?B +[0-9.]+ [KMGT]?i?B *$"
check "buffers: retained, with the publisher's pid and retention left" \
    wait_for "^[0-9]+ +retained +10 B +4\.0 KiB +[0-9]+ +$(id -un) +0 +[0-9]+s +[0-9]m[0-9]+s"
check "buffers: the one being written by the holder" wait_for "^[0-9]+ +writing +1\.0 MiB"
for i in $(seq 20); do echo "$i" | ctl put --keep-ms 1 - >/dev/null; done
check "rates: leases/s after a burst of puts" wait_for "rates: [0-9]*[1-9][0-9]*\.[0-9] leases/s|rates: 0\.[1-9] leases/s"

tm resize-window -t top -x 64 -y 14
check "after a resize to 64x14 the frame fits" bash -c '
    for _ in $(seq 100); do
        out=$(tmux -L "$1" capture-pane -p -t top)
        if [ "$(printf "%s\n" "$out" | awk "length > 64" | wc -l)" = 0 ] && printf "%s\n" "$out" | grep -q "\.\.\. [0-9]* more"; then exit 0; fi
        sleep 0.05
    done
    printf "%s\n" "$out" | sed "s/^/    | /"; exit 1' _ "shmref-top-$$"
tm resize-window -t top -x 132 -y 50

kill -TERM "$dpid"; wait "$dpid"; dpid=
check "a daemon that goes away is shown" wait_for "shmrefd is not reachable at $sock"
start_daemon
check "and top reconnects when it is back" wait_for "^shmrefd [0-9.]+ pid $dpid up"

tm send-keys -t top q
for _ in $(seq 100); do [ -s "$tmp/top.rc" ] && break; sleep 0.05; done
check "q quits, exit status 0" grep -qx "EXIT=0" "$tmp/top.rc"
check "and the terminal is restored (main screen, cursor shown)" \
    test "$(tm display-message -p -t top '#{alternate_on} #{cursor_flag}')" = "0 1"
test_end
