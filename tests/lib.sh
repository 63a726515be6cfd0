# SPDX-License-Identifier: MIT
# lib.sh: sourced by the shell tests. PASS/FAIL counting with the plain closing line
# ctest and CI read, and a scratch directory removed (and a daemon stopped) on exit.
#   test_begin NAME   sets $tmp; a daemon started later stores its pid in $dpid
#   check NAME COMMAND...   PASS if COMMAND succeeds
#   test_end          prints "N passed, M failed"; fails if any did
pass=0 fail=0 dpid=

test_cleanup() {
    if [ -n "$dpid" ]; then
        kill "$dpid" 2>/dev/null || true
        wait "$dpid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}

test_begin() {
    tmp=$(mktemp -d "/tmp/shmref-$1-XXXXXX")
    trap test_cleanup EXIT
    trap 'exit 1' INT TERM HUP
}

ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1"; }
check() {
    local name=$1; shift
    if "$@"; then ok "$name"; else ko "$name"; fi
}

test_end() {
    echo "$pass passed, $fail failed"
    [ "$fail" = 0 ]
}

# asan_env LIB: what a program built without sanitizers (python3 with ctypes) needs in its
# environment to load LIB when LIB was built with AddressSanitizer (./scripts/test
# --sanitize): the ASan runtime preloaded, leak checks off (they would report Python's).
# Prints nothing for a plain build. Use: env $(asan_env "$LIB") /usr/bin/python3 ...
asan_env() {
    local rt
    rt=$(ldd "$1" 2>/dev/null | sed -n 's/^[[:space:]]*libasan\.so[^ ]* => \([^ ]*\).*/\1/p')
    if [ -n "$rt" ]; then echo "LD_PRELOAD=$rt ASAN_OPTIONS=detect_leaks=0"; fi
}
