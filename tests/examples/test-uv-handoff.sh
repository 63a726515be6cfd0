#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-uv-handoff.sh: shmref(3)'s libuv example, compiled from tests/examples/uv-handoff.c,
# run against a real shmrefd: N handoffs with every byte checked and a status, on one loop
# that never calls a blocking libshmref function; and the example printed in shmref(3) is
# that file, character for character.
# Usage: test-uv-handoff.sh SOURCE_DIR SHMREFD UV_HANDOFF
set -uo pipefail
src=$(cd "$1" && pwd) SHMREFD=$2 EXAMPLE=$3
. "$src/tests/lib.sh"
test_begin uv-handoff
sock=$tmp/s.sock
: >"$tmp/empty.conf"
"$SHMREFD" --config "$tmp/empty.conf" --socket "$sock" --pool-size 64M --verbose 2>"$tmp/log" &
dpid=$!
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
check "the libuv example moves 500 handoffs of correct bytes and gets a status" \
    timeout 60 "$EXAMPLE" "$sock" 500
# The man page's copy: the .EX block after the "libuv" marker, roff escapes undone.
/usr/bin/python3 - "$src/man/shmref.3" "$tmp/from-man.c" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for b in re.findall(r"^\.EX\n(.*?)^\.EE\n", text, re.S | re.M):
    if "uv_poll_start" in b:
        open(sys.argv[2], "w").write(b.replace("\\e", "\\").replace("\\-", "-").replace("\\&", ""))
        break
PY
check "shmref(3) prints tests/examples/uv-handoff.c exactly" cmp "$tmp/from-man.c" "$src/tests/examples/uv-handoff.c"
kill "$dpid"
wait "$dpid"; st=$?; dpid=
check "shmrefd exited 0" test "$st" -eq 0
test_end
