#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-install.sh: `cmake --install` as a distribution runs it. Into a DESTDIR with the
# prefix /usr (given at install time, whatever the build was configured for): the
# config lands in /etc (not /usr/etc), the units where pkg-config systemd says, the
# service names /usr/sbin/shmrefd and /etc/shmrefd/shmrefd.conf, the user unit reads no
# system config, the installed shmrefd accepts the installed config, the installed
# shmrefctl finds the installed libshmref through its RPATH. Then with another prefix
# (/opt/shmref): everything, units' paths included, follows it.
# Usage: test-install.sh BUILD_DIR
set -uo pipefail
BUILD_DIR=$(cd "$1" && pwd)
. "$(dirname "$0")/../lib.sh"
test_begin install
cache_var() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD_DIR/CMakeCache.txt" | head -n 1; }
libdir=$(cache_var CMAKE_INSTALL_LIBDIR)
rpath=$(cache_var SHMREF_INSTALL_RPATH)
sanitize=$(cache_var SHMREF_SANITIZE)
sysunits=$(pkg-config --variable=systemdsystemunitdir systemd)
userunits=$(pkg-config --variable=systemduserunitdir systemd)
sysusers=$(pkg-config --variable=sysusersdir systemd)

# --- prefix /usr ------------------------------------------------------------------------
D=$tmp/usr-root
check "cmake --install --prefix /usr into a DESTDIR" \
    bash -c 'DESTDIR="$1" cmake --install "$2" --prefix /usr >"$3" 2>&1' _ "$D" "$BUILD_DIR" "$tmp/install.log"
check "the config is /etc/shmrefd/shmrefd.conf" test -f "$D/etc/shmrefd/shmrefd.conf"
check "nothing under /usr/etc" test ! -e "$D/usr/etc"
check "system units in pkg-config's systemdsystemunitdir ($sysunits)" \
    test -f "$D$sysunits/shmrefd.service" -a -f "$D$sysunits/shmrefd.socket"
check "user units in pkg-config's systemduserunitdir ($userunits)" \
    test -f "$D$userunits/shmrefd.service" -a -f "$D$userunits/shmrefd.socket"
check "sysusers.d entry in pkg-config's sysusersdir ($sysusers)" test -f "$D$sysusers/shmrefd.conf"
check "the service runs /usr/sbin/shmrefd with /etc/shmrefd/shmrefd.conf" \
    grep -qx 'ExecStart=/usr/sbin/shmrefd --config /etc/shmrefd/shmrefd.conf' "$D$sysunits/shmrefd.service"
check "the binary the service names is installed" test -x "$D/usr/sbin/shmrefd"
check "the user unit reads no system config file" \
    bash -c '! grep "^ExecStart=" "$1" | grep -q /etc/ && grep -q "^ExecStart=/usr/sbin/shmrefd --config=$" "$1"' _ "$D$userunits/shmrefd.service"
# shellcheck disable=SC2016
check "the installed shmrefd --check-config accepts the installed config" \
    bash -c '"$1/usr/sbin/shmrefd" --check-config --config "$1/etc/shmrefd/shmrefd.conf" >"$2" 2>&1' _ "$D" "$tmp/check.log"
[ -s "$tmp/check.log" ] && grep -q '^\[daemon\]' "$tmp/check.log" || sed 's/^/    | /' "$tmp/check.log"
case $rpath in
    ON|on|1|TRUE|true|YES|yes)
        check "shmrefctl's RUNPATH is \$ORIGIN/../$libdir" \
            bash -c 'readelf -d "$1" | grep -F "[\$ORIGIN/../$2]" | grep -q "R\(UN\)\?PATH"' _ "$D/usr/bin/shmrefctl" "$libdir"
        if [ "$sanitize" != ON ]; then
            uses_installed_lib() {
                local at
                at=$(env -u LD_LIBRARY_PATH ldd "$D/usr/bin/shmrefctl" | sed -n 's/^[[:space:]]*libshmref\.so\.0 => \([^ ]*\).*/\1/p')
                [ -n "$at" ] && [ "$(readlink -f "$at")" = "$(readlink -f "$D/usr/$libdir/libshmref.so.0")" ] &&
                    env -u LD_LIBRARY_PATH "$D/usr/bin/shmrefctl" --version >/dev/null
            }
            check "the installed shmrefctl runs with no LD_LIBRARY_PATH, using the installed libshmref" \
                uses_installed_lib
        fi ;;
    *) echo "SKIP RPATH checks (SHMREF_INSTALL_RPATH is off)" ;;
esac
pc_resolves() { # the relocatable .pc's includedir is the installed one
    local got
    got=$(PKG_CONFIG_PATH="$D/usr/$libdir/pkgconfig" pkg-config --variable=includedir shmref)
    [ "$(cd "$got" 2>/dev/null && pwd -P)" = "$(cd "$D/usr/include" && pwd -P)" ]
}
check "the .pc file resolves into the installed tree" pc_resolves

# --- another prefix -----------------------------------------------------------------------
O=$tmp/opt-root
check "cmake --install --prefix /opt/shmref into a DESTDIR" \
    bash -c 'DESTDIR="$1" cmake --install "$2" --prefix /opt/shmref >"$3" 2>&1' _ "$O" "$BUILD_DIR" "$tmp/install2.log"
escaped=$(cd "$O" && find . -path ./opt/shmref -prune -o -type f -print)
check "nothing is installed outside /opt/shmref" test -z "$escaped"
check "there, the service names /opt/shmref's binary and config" \
    grep -qx 'ExecStart=/opt/shmref/sbin/shmrefd --config /opt/shmref/etc/shmrefd/shmrefd.conf' \
    "$O/opt/shmref/lib/systemd/system/shmrefd.service"
check "and the config is there" test -f "$O/opt/shmref/etc/shmrefd/shmrefd.conf"

test_end
