#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-status-privacy.sh: shmrefctl status, status --json, status --buffers and top --once
# as an unprivileged user: they work, and show that user's own clients and buffers only,
# never root's (issue 8). The daemon serves as nobody, as a root shmrefd does by default
# where no user shmrefd exists: nobody's uid is shared by other services, so its clients
# are tenants, not operators; a daemon serving as a user of its own makes that user an
# operator (status of everyone, allow-users passed). Usage: test-status-privacy.sh SHMREFD SHMREFCTL (as root; 77:
# skipped otherwise).
set -euo pipefail
SHMREFD=$1 SHMREFCTL=$2
. "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP needs root"; exit 77; }
test_begin status-privacy
chmod 755 "$tmp"
# Run as other uids: a copy they can reach (the build may sit in a 0700 clone).
SHMREFCTL=$(reachable "$SHMREFCTL")
sock=$tmp/shmrefd.sock
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
"$SHMREFD" --socket "$sock" --socket-mode 0666 --config /dev/null --user nobody 2>"$tmp/log" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done

printf 'root data' | "$SHMREFCTL" --socket "$sock" put --keep-ms 60000 - >/dev/null
nobody_desc=$(printf 'nobody data' | as_nobody "$SHMREFCTL" --socket "$sock" put --keep-ms 60000 -)
check "root sees both retained buffers" test "$("$SHMREFCTL" --socket "$sock" status --json |
    /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)["buffers"]["list"]))')" = 2
as_nobody "$SHMREFCTL" --socket "$sock" status --json >"$tmp/nobody.json"
check "an unprivileged status --json is valid JSON" /usr/bin/python3 -c "import json; json.load(open('$tmp/nobody.json'))"
uid=$(id -u nobody)
check "it lists only its own uid's buffers, clients and tenants" /usr/bin/python3 -c "
import json; s = json.load(open('$tmp/nobody.json'))
assert [b['uid'] for b in s['buffers']['list']] == [$uid], s['buffers']['list']
assert all(c['uid'] == $uid for c in s['clients']) and s['clients'], s['clients']
assert all(t['uid'] == $uid for t in s['tenants']), s['tenants']
assert s['buffers']['retained'] == 2  # totals stay the daemon's
"
as_nobody "$SHMREFCTL" --socket "$sock" status --buffers >"$tmp/table.txt"
check "status --buffers works for it, showing its own buffer only" \
    test "$(grep -cE '^[0-9]+ +retained' "$tmp/table.txt")" = 1
as_nobody "$SHMREFCTL" --socket "$sock" top --once >"$tmp/top.txt"
check "top --once works for it" grep -q "^CLIENT" "$tmp/top.txt"
check "and shows no root client or buffer" bash -c "! grep -Eq ' root ' '$tmp/top.txt'"
check "its own buffer is still its to get" test "$(as_nobody "$SHMREFCTL" --socket "$sock" get "$nobody_desc")" = "nobody data"
kill -TERM "$dpid"; wait "$dpid"; dpid=
check "the daemon serving as nobody says nobody's clients are no operators" \
    grep -q "uid $uid is user nobody's, which other services share: its clients are tenants like any other, not operators (root is), and any process of nobody may signal shmrefd" "$tmp/log"

# A daemon serving as a user of its own (here: daemon, uid 1): that uid is an operator. It
# sees root's buffer, and passes allow-users, which names only root.
as_daemon() { setpriv --reuid=daemon --regid=daemon --clear-groups "$@"; }
"$SHMREFD" --socket "$sock" --socket-mode 0666 --config /dev/null --user daemon --allow-users 0 2>"$tmp/log2" &
dpid=$!
for _ in $(seq 200); do "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
printf 'root data' | "$SHMREFCTL" --socket "$sock" put --keep-ms 60000 - >/dev/null
check "the daemon's own uid (not nobody's) is an operator: it sees root's buffer" \
    test "$(as_daemon "$SHMREFCTL" --socket "$sock" status --json |
        /usr/bin/python3 -c 'import json,sys; print([b["uid"] for b in json.load(sys.stdin)["buffers"]["list"]])')" = "[0]"
check "and the log does not call it a shared uid" bash -c "! grep -q 'other services share' '$tmp/log2'"
set +e
as_nobody "$SHMREFCTL" --socket "$sock" ping >/dev/null 2>"$tmp/acl.err"; rc=$?
set -e
check "while nobody, not in allow-users, is refused" test "$rc" = 1
kill -TERM "$dpid"; wait "$dpid"; dpid=
test_end
