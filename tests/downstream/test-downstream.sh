#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-downstream.sh: shmref as a package. Installs a built tree into a temporary prefix,
# checks that every installed file is in place (library, header, pkg-config file, CMake
# package, systemd units, sysusers.d entry, example config, binaries, man pages), then
# builds tests/downstream/producer.c against the installed package twice, once with
# find_package(shmref) and once with pkg-config alone, and runs both against a real
# shmrefd on a temporary socket.
# Usage: test-downstream.sh SOURCE_DIR BUILD_DIR SHMREFD_BINARY
#
# The install runs with DESTDIR set to a scratch root, so a rule that escapes the prefix
# (an absolute DESTINATION) lands in that root instead of the host, and is reported.
set -uo pipefail
if [ $# -ne 3 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR SHMREFD_BINARY" >&2
    exit 2
fi
SOURCE_DIR=$(cd "$1" && pwd) BUILD_DIR=$(cd "$2" && pwd) SHMREFD=$3
. "$(dirname "$0")/../lib.sh"
test_begin downstream
prefix=$tmp/prefix            # the prefix the package is installed for
root=$tmp/root                # DESTDIR
P=$root$prefix                # where the installed tree really is
sock=$tmp/s.sock
show() { # show FILE: the end of a log, indented, after a failure
    [ -s "$1" ] && sed -e 's/^/    | /' "$1" | tail -n 40
    return 0
}
run_logged() { # run_logged NAME LOG COMMAND...: check, and show the log on failure
    local name=$1 log=$2; shift 2
    if "$@" >"$log" 2>&1; then ok "$name"; return 0; fi
    ko "$name"; show "$log"; return 1
}
cache_var() { # cache_var NAME DEFAULT: a variable of BUILD_DIR's CMakeCache.txt
    local v
    v=$(sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" 2>/dev/null | head -n 1)
    echo "${v:-$2}"
}

libdir=$(cache_var CMAKE_INSTALL_LIBDIR lib)
mandir=$(cache_var CMAKE_INSTALL_MANDIR share/man)
# A sanitizer build's libshmref needs the ASan runtime first in the program that loads
# it: build the downstream program with the same sanitizers.
san_flags=
case $(cache_var SHMREF_SANITIZE OFF) in
    ON|on|1|TRUE|true|YES|yes) san_flags="-fsanitize=address,undefined -fno-omit-frame-pointer" ;;
esac

# --- install -------------------------------------------------------------------------
run_logged "cmake --install into a temporary prefix" "$tmp/install.log" \
    env DESTDIR="$root" cmake --install "$BUILD_DIR" --prefix "$prefix"

escaped=$(cd "$root" 2>/dev/null && find . -path ".$prefix" -prune -o \( -type f -o -type l \) -print | sed 's/^\.//')
if [ -z "$escaped" ]; then
    ok "nothing is installed outside the prefix"
else
    ko "nothing is installed outside the prefix (these ignore --prefix):"
    # shellcheck disable=SC2086 # one path a line
    printf '    | %s\n' $escaped
fi

installed() { # installed PATH...: every PATH (relative to the prefix) exists
    local f missing=0
    for f in "$@"; do
        if [ ! -e "$P/$f" ]; then
            echo "    | missing: $f"
            missing=1
        fi
    done
    return $missing
}
check "the library is installed (with its soname link)" \
    installed "$libdir/libshmref.so" "$libdir/libshmref.so.0"
check "the public header is installed" installed include/shmref/shmref.h
check "the pkg-config file is installed" installed "$libdir/pkgconfig/shmref.pc"
check "the CMake package is installed" \
    installed "$libdir/cmake/shmref/shmrefConfig.cmake" "$libdir/cmake/shmref/shmrefConfigVersion.cmake" \
    "$libdir/cmake/shmref/shmrefTargets.cmake"
check "the system units are installed" \
    installed lib/systemd/system/shmrefd.socket lib/systemd/system/shmrefd.service
check "the user units are installed" \
    installed lib/systemd/user/shmrefd.socket lib/systemd/user/shmrefd.service
check "the sysusers.d entry is installed" installed lib/sysusers.d/shmrefd.conf
check "the example config is installed" installed etc/shmrefd/shmrefd.conf
check "the daemon and the CLI are installed" installed sbin/shmrefd bin/shmrefctl
check "the man pages are installed" \
    installed "$mandir/man8/shmrefd.8" "$mandir/man1/shmrefctl.1" "$mandir/man3/shmref.3"

if command -v groff >/dev/null; then
    lint() {
        local f bad=0
        for f in "$mandir/man8/shmrefd.8" "$mandir/man1/shmrefctl.1" "$mandir/man3/shmref.3"; do
            [ -e "$P/$f" ] || { echo "    | not installed: $f"; bad=1; continue; }
            groff -man -ww -z "$P/$f" >"$tmp/groff.log" 2>&1
            [ -s "$tmp/groff.log" ] && { show "$tmp/groff.log"; bad=1; }
        done
        return $bad
    }
    check "the installed man pages format without warnings" lint
else
    echo "SKIP man page formatting (groff is not installed)"
fi

export LD_LIBRARY_PATH=$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "$libdir" = lib ] || LD_LIBRARY_PATH=$P/$libdir:$LD_LIBRARY_PATH
# shellcheck disable=SC2016 # expanded by the inner shell
check "the installed shmrefd runs" bash -c '"$1/sbin/shmrefd" --version | grep -q "^shmrefd "' _ "$P"
# shellcheck disable=SC2016
check "the installed shmrefd accepts the installed example config" \
    bash -c '"$1/sbin/shmrefd" --check-config --config "$1/etc/shmrefd/shmrefd.conf" >/dev/null' _ "$P"

# --- build the downstream project, twice ----------------------------------------------
src=$SOURCE_DIR/tests/downstream
if run_logged "find_package(shmref): configure" "$tmp/cmake-configure.log" \
        cmake -S "$src" -B "$tmp/build-cmake" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Debug \
        ${san_flags:+"-DCMAKE_C_FLAGS=$san_flags"}; then
    found=$(sed -n 's/^shmref_DIR:[A-Z]*=//p' "$tmp/build-cmake/CMakeCache.txt")
    check "find_package found the installed package ($found)" test "$found" = "$P/$libdir/cmake/shmref"
    run_logged "find_package(shmref): build, linking shmref::shmref" "$tmp/cmake-build.log" \
        cmake --build "$tmp/build-cmake"
fi

export PKG_CONFIG_PATH=$P/$libdir/pkgconfig
check "pkg-config knows shmref" pkg-config --exists shmref
pc_points_into_prefix() { # the .pc is relocatable: its paths resolve into the prefix
    local var want got bad=0
    for var in libdir includedir; do
        want=$P/$libdir
        [ $var = includedir ] && want=$P/include
        got=$(pkg-config --variable=$var shmref 2>/dev/null)
        if [ "$(cd "$got" 2>/dev/null && pwd -P)" != "$(cd "$want" && pwd -P)" ]; then
            echo "    | $var=$got, expected $want"
            bad=1
        fi
    done
    return $bad
}
check "pkg-config's libdir and includedir point into the prefix (the .pc is relocatable)" \
    pc_points_into_prefix
flags=$(pkg-config --cflags --libs shmref)
# shellcheck disable=SC2086 # pkg-config's output is several words
run_logged "pkg-config: cc producer.c \$(pkg-config --cflags --libs shmref)" "$tmp/cc.log" \
    cc -std=c99 -Wall -Wextra -Werror $san_flags "$src/producer.c" $flags -o "$tmp/producer-pc"
unset PKG_CONFIG_PATH

# --- run both against a real shmrefd ---------------------------------------------------
# The installed example config (all comments), so the host's /etc/shmrefd cannot interfere.
conf=$P/etc/shmrefd/shmrefd.conf
[ -e "$conf" ] || { conf=$tmp/empty.conf; : >"$conf"; }
"$SHMREFD" --socket "$sock" --pool-size 64M --config "$conf" 2>"$tmp/shmrefd.log" &
dpid=$!
up=1
for _ in $(seq 200); do
    "$P/bin/shmrefctl" --socket "$sock" ping >/dev/null 2>&1 && { up=0; break; }
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.05
done
if [ $up = 0 ]; then ok "shmrefd serves, and the installed shmrefctl reaches it"; else ko "shmrefd serves"; show "$tmp/shmrefd.log"; fi

uses_installed_lib() { # uses_installed_lib BINARY: libshmref resolves into the prefix
    local at
    at=$(ldd "$1" 2>/dev/null | sed -n 's/^[[:space:]]*libshmref\.so\.0 => \([^ ]*\).*/\1/p')
    [ -n "$at" ] && [ "$(cd "$(dirname "$at")" && pwd -P)" = "$(cd "$P/$libdir" && pwd -P)" ]
}
run_producer() { # run_producer NAME BINARY
    local name=$1 bin=$2 out rc
    if [ ! -x "$bin" ]; then
        ko "$name: leases, publishes, acquires and checks (not built)"
        return
    fi
    check "$name: links the installed libshmref" uses_installed_lib "$bin"
    out=$("$bin" "$sock" 2>"$tmp/producer.err"); rc=$?
    check "$name: exits 0" test "$rc" = 0
    if [[ $out =~ ^shmref1:[0-9a-f]{32}:1048576$ ]]; then ok "$name: prints a shmref1: descriptor"
    else ko "$name: prints a shmref1: descriptor (got '$out')"; fi
    [ "$rc" = 0 ] || show "$tmp/producer.err"
}
run_producer "find_package build" "$tmp/build-cmake/producer"
run_producer "pkg-config build" "$tmp/producer-pc"

kill -TERM "$dpid" 2>/dev/null; wait "$dpid"; rc=$?; dpid=
check "shmrefd stops with exit 0" test "$rc" = 0

test_end
