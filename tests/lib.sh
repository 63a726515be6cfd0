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

# test_end_skipping WHY: the end of a test whose remaining part cannot run here: what ran
# is reported, and the test exits 77 (ctest's SKIP_RETURN_CODE: shown as skipped, never as
# passed) unless something failed, which fails it.
test_end_skipping() {
    echo "SKIP the rest: $*"
    echo "$pass passed, $fail failed"
    [ "$fail" = 0 ] || exit 1
    exit 77
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

# reachable BIN: prints the path of a copy of BIN that another uid (setpriv --reuid nobody)
# can run even when BIN's own directory is not reachable, as in a clone made with
# `mktemp -d` (0700): BIN and the libshmref it loads are copied under $tmp/reach (0755;
# $tmp itself must be made 0755 by the caller), and the printed path is a wrapper that
# runs the copy with LD_LIBRARY_PATH pointing at the library's copy (the process keeps
# BIN's name). BIN's other libraries are the system's.
reachable() {
    local bin=$1 d=$tmp/reach lib
    mkdir -p "$d/real" "$d/lib"
    cp "$bin" "$d/real/"
    lib=$(ldd "$bin" | sed -n 's/^[[:space:]]*\(libshmref\.so[^ ]*\) => \([^ ]*\).*/\1 \2/p')
    if [ -n "$lib" ]; then cp -L "${lib#* }" "$d/lib/${lib%% *}"; fi
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s "$@"\n' \
        "$d/lib" "$d/real/$(basename "$bin")" >"$d/$(basename "$bin")"
    chmod -R a+rX "$d"
    chmod 755 "$d/$(basename "$bin")"
    echo "$d/$(basename "$bin")"
}
