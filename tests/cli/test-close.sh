#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-close.sh: a clean close and a death look different to the daemon. Two real client
# processes (Python's ctypes over this build's libshmref) each take a lease: one calls
# shmref_close and exits, the other is SIGKILLed holding it. The daemon logs "closed"
# for the first and "died holding 1 lease" for the second, and counts them apart
# (counters.clients_closed, counters.clients_died; metrics *_total).
# Usage: test-close.sh SHMREFD SHMREFCTL LIBSHMREF
set -uo pipefail
SHMREFD=$1 SHMREFCTL=$2 LIB=$3
. "$(dirname "$0")/../lib.sh"
test_begin close
sock=$tmp/s.sock
ctl() { "$SHMREFCTL" --socket "$sock" "$@"; }
counter() { ctl status --json | /usr/bin/python3 -c "import json,sys; print(json.load(sys.stdin)['counters']['$1'])"; }
: >"$tmp/empty.conf"
"$SHMREFD" --config "$tmp/empty.conf" --socket "$sock" --pool-size 64M --verbose 2>"$tmp/log" &
dpid=$!
for _ in $(seq 200); do ctl ping >/dev/null 2>&1 && break; sleep 0.05; done

# client MODE: connect, lease 1 MiB, then "close" (shmref_close, exit 0) or "hold"
# (print ready, sleep until killed).
cat >"$tmp/client.py" <<'PY'
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
conn, buf = ctypes.c_void_p(), ctypes.c_void_p()
if lib.shmref_connect(sys.argv[2].encode(), ctypes.byref(conn)) < 0:
    sys.exit("connect failed")
if lib.shmref_lease(conn, ctypes.c_size_t(1 << 20), ctypes.byref(buf)) < 0:
    sys.exit("lease failed")
if sys.argv[3] == "close":
    lib.shmref_close(conn)
    sys.exit(0)
print("ready", flush=True)
time.sleep(600)
PY
env $(asan_env "$LIB") /usr/bin/python3 "$tmp/client.py" "$LIB" "$sock" close; rc=$?
check "a client leases and closes (exit 0)" test "$rc" = 0
ctl ping >/dev/null
check "the daemon logs it as closed" grep -q "client [0-9]* pid=[0-9]* uid=[0-9]* closed$" "$tmp/log"
check "and counts it in clients_closed" test "$(counter clients_closed)" -ge 1
check "not in clients_died" test "$(counter clients_died)" = 0

coproc HOLD { exec env $(asan_env "$LIB") /usr/bin/python3 "$tmp/client.py" "$LIB" "$sock" hold; }
read -r -t 10 line <&"${HOLD[0]}"
check "a second client holds a lease" test "${line:-}" = ready
kill -KILL "$HOLD_PID"; wait "$HOLD_PID" 2>/dev/null
for _ in $(seq 100); do grep -q "died holding" "$tmp/log" && break; sleep 0.05; done
check "the SIGKILLed client is logged as died holding 1 lease" grep -q "died holding 1 lease " "$tmp/log"
check "and counted in clients_died" test "$(counter clients_died)" = 1
check "its lease is reclaimed (reclaimed_leases 1, nothing leased)" \
    test "$(counter reclaimed_leases)" = 1 -a "$(ctl status --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["pool"]["bytes_leased"])')" = 0
check "metrics expose both" bash -c '"$1" --socket "$2" metrics | grep -q "^shmref_clients_closed_total [1-9]" &&
    "$1" --socket "$2" metrics | grep -q "^shmref_clients_died_total 1$"' _ "$SHMREFCTL" "$sock"

# SIGTERM with a client holding leases: one summary line, no "died holding" for it, and the
# daemon exits 0.
coproc HOLD2 { exec env $(asan_env "$LIB") /usr/bin/python3 "$tmp/client.py" "$LIB" "$sock" hold; }
read -r -t 10 line <&"${HOLD2[0]}"
check "a third client holds a lease" test "${line:-}" = ready
kill -TERM "$dpid"; wait "$dpid"; rc=$?; dpid=
check "SIGTERM stops the daemon with exit 0" test "$rc" = 0
check "the stop is one summary line" grep -q "stopping: closing 1 client, releasing the 1 lease they held" "$tmp/log"
check "the held client is not logged as died (still one such line)" test "$(grep -c "died holding" "$tmp/log")" = 1
kill "$HOLD2_PID" 2>/dev/null; wait "$HOLD2_PID" 2>/dev/null
test_end
