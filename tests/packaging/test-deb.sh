#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-deb.sh: the Debian packages, as a user of Debian 12 gets them. In a copy of the
# tree (the working tree stays clean): dpkg-buildpackage -us -uc -b, lintian on the
# result (no errors, no warnings); then dpkg -i of the four packages, the sysusers.d
# user, the socket enabled, the installed daemon run with the installed socket unit's
# settings (systemd-socket-activate, since PID 1 is not systemd here; as the unit's
# User/Group) and a put/get with the installed shmrefctl through the default socket, as
# root and as a member of the socket's group (a non-member is refused); python3-shmref
# with Debian's /usr/bin/python3 (isolated: no venv, no user site): it links the installed
# libshmref0 (no RPATH), a producer process (empty, fill, publish) and a consumer process
# as a group member (acquire, compare bytes, dtype, shape, metadata) through the default
# socket; shmrefd --check-config on /etc/shmrefd/shmrefd.conf, systemd-analyze verify on
# the installed units; then dpkg --purge and nothing of the packages left (nor the
# module's byte code; Debian's python3 no longer imports shmref). The user and group stay
# (Debian policy: a system user may own files elsewhere; sysusers.d never deletes).
# Where the install half runs: in a throwaway root by default. mmdebstrap makes a
# minimal Debian of the host's release (the packages' dependencies and the tools the
# checks use) in a directory of this test's, and this script runs again inside it
# (chroot, in a mount namespace of its own with its own /proc, /dev/shm, /run and /tmp;
# SHMREF_DEB_INSIDE=1, the built packages bound in read-only): dpkg -i and --purge
# change that root's dpkg database only, and the root is deleted at the end. Network
# failures of mmdebstrap skip the install half, saying so; any other failure fails. With
# SHMREF_TEST_HOST=1 (you say this machine may be changed) it runs on the host instead:
# dpkg -i and --purge on this machine's dpkg database, and the user shmrefd and group
# shmref, which stay. Skipped when not root, when dpkg-buildpackage, lintian or
# mmdebstrap is missing, or (on the host) when shmrefd is installed already (it would not
# touch that installation). Cleans up on every exit what it made (its daemons, the
# packages it installed, the root, /run/shmrefd and its socket only if it created them).
# Usage: test-deb.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
. "$src/tests/lib.sh"
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root: it installs the packages with dpkg -i"
inside=${SHMREF_DEB_INSIDE:-} # 1: this is the run inside the throwaway root
host=${SHMREF_TEST_HOST:-}
tools="systemd-socket-activate setpriv"
[ -n "$inside" ] || tools="$tools dpkg-buildpackage lintian"
for t in $tools; do
    command -v "$t" >/dev/null || skip "$t is not installed (scripts/deps.sh installs it)"
done
PKGS="shmrefd libshmref0 libshmref-dev python3-shmref"
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" &&
        skip "$p is installed on this machine already; this test would replace and purge it"
done

test_begin deb
installed_by_us=
sapid=
made_sock= made_rundir=
root=
deb_cleanup() {
    [ -n "$sapid" ] && { kill "$sapid" 2>/dev/null; wait "$sapid" 2>/dev/null; }
    [ -n "${hpid:-}" ] && { kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null; }
    # shellcheck disable=SC2086
    [ -n "$installed_by_us" ] && dpkg --purge $PKGS >/dev/null 2>&1
    # Only what this test made: a live daemon's socket (./scripts/run) is never touched.
    [ -n "$made_sock" ] && rm -f "$made_sock"
    [ -n "$made_rundir" ] && rmdir "$made_rundir" 2>/dev/null
    # The root's mounts lived in the namespace of the run inside it, gone with it; never
    # delete through one (--one-file-system stops at any mount point left).
    [ -n "$root" ] && [ -d "$root" ] && rm -rf --one-file-system "$root"
    test_cleanup
}
trap deb_cleanup EXIT
show() { [ -s "$1" ] && sed -e 's/^/    | /' "$1" | tail -n "${2:-30}"; return 0; }

if [ -n "$inside" ]; then
    debdir=$SHMREF_DEB_DIR # bound in read-only by the run outside
else
debdir=$tmp

# --- build -----------------------------------------------------------------------------
copy=$tmp/shmrefd-0.1.0
mkdir "$copy"
tree_state() { (cd "$src" && git status --porcelain --ignored --untracked-files=all 2>/dev/null | grep -v '^!! build') | md5sum; }
before=$(tree_state)
(cd "$src" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$copy"
if ! (cd "$copy" && dpkg-checkbuilddeps) >"$tmp/deps.log" 2>&1; then
    ko "the build dependencies are installed (apt-get build-dep ./)"; show "$tmp/deps.log"
    test_end; exit
fi
(cd "$copy" && timeout 900 dpkg-buildpackage -us -uc -b -j2) >"$tmp/build.log" 2>&1; rc=$?
check "dpkg-buildpackage -us -uc -b builds the packages" test "$rc" = 0
[ "$rc" = 0 ] || { show "$tmp/build.log" 40; test_end; exit; }
for p in $PKGS; do
    check "$p's .deb exists" test -f "$tmp/${p}_0.1.0-1_amd64.deb"
done
check "the working tree is as it was (the build ran in a copy)" test "$(tree_state)" = "$before"
check "dpkg-gensymbols saw no new or missing symbols (debian/libshmref0.symbols is current)" \
    bash -c '! grep -q "^dpkg-gensymbols: warning" "$1"' _ "$tmp/build.log"
grep -A40 "^dpkg-gensymbols: warning" "$tmp/build.log" | grep '^[+-] ' | sed 's/^/    | /'

timeout 600 lintian --fail-on error,warning --display-level ">=warning" "$tmp"/shmrefd_0.1.0-1_amd64.changes \
    >"$tmp/lintian.log" 2>&1; rc=$?
grep -v "running with root privileges" "$tmp/lintian.log" >"$tmp/lintian.tags"
check "lintian reports no errors and no warnings" test "$rc" = 0 -a ! -s "$tmp/lintian.tags"
show "$tmp/lintian.tags"

# --- a throwaway root for the install half ------------------------------------------------
# On the host only with SHMREF_TEST_HOST=1 (it changes the host's dpkg database and leaves
# a system user and group). Otherwise in a minimal Debian made here, with what the
# packages depend on (from the .debs: a wrong dependency fails mmdebstrap, and the test)
# and the tools the checks use; this script then runs again in it.
if [ "$host" != 1 ]; then
    for t in mmdebstrap unshare; do
        command -v "$t" >/dev/null && continue
        test_end_skipping "the install half: $t is not installed (scripts/deps.sh installs it)"
    done
    deps=$(for p in $PKGS; do dpkg-deb -f "$tmp/${p}_0.1.0-1_amd64.deb" Depends; done | tr ',' '\n' |
        sed 's/([^)]*)//g; s/|.*//; s/:any//; s/[[:space:]]//g' | grep -vxE "${PKGS// /|}|" | sort -u | paste -sd, -)
    . /etc/os-release
    root=$(mktemp -d /tmp/shmref-deb-root-XXXXXX)
    # mmdebstrap mounts /proc and /dev in the root while it installs: in a mount namespace
    # of its own, so nothing of them can outlive it on the host.
    timeout 600 unshare --mount --propagation private --fork \
        mmdebstrap --variant=apt --include="$deps,systemd,strace,pkg-config,binutils,python3-numpy" \
        "$VERSION_CODENAME" "$root" http://deb.debian.org/debian >"$tmp/mmdebstrap.log" 2>&1; rc=$?
    # What says the mirror is unreachable or unusable from here (not a wrong dependency,
    # which is "Unable to locate package" or "has no installation candidate", a failure).
    unreachable="Failed to fetch|Could not resolve|Temporary failure|Unable to connect|Connection (timed out|refused)"
    unreachable="$unreachable|is expired|is not valid yet|does not have a Release file"
    if [ "$rc" != 0 ] && grep -qE "$unreachable" "$tmp/mmdebstrap.log"; then
        show "$tmp/mmdebstrap.log" 10
        test_end_skipping "the install half: mmdebstrap could not reach the Debian mirror (above)"
    fi
    check "mmdebstrap makes a throwaway $VERSION_CODENAME root with the packages' dependencies ($deps)" test "$rc" = 0
    [ "$rc" = 0 ] || { show "$tmp/mmdebstrap.log" 30; test_end; exit; }
    # The run inside: its own mount namespace (the binds and mounts vanish with it), fresh
    # /proc, /dev/shm, /run and /tmp, then the source and the packages read-only (after
    # the tmpfs mounts, which would hide a source under /tmp).
    unshare --mount --propagation private --fork bash -c '
        set -e
        root=$1 src=$2 debs=$3
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
        mount -t proc proc "$root/proc"
        mount -t tmpfs -o mode=755 tmpfs "$root/run"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mkdir -p "$root$src" "$root/debs"
        mount --bind "$src" "$root$src" && mount -o remount,bind,ro "$root$src"
        mount --bind "$debs" "$root/debs" && mount -o remount,bind,ro "$root/debs"
        exec chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root SHMREF_DEB_INSIDE=1 \
            SHMREF_DEB_DIR=/debs /bin/bash "$src/tests/packaging/test-deb.sh" "$src"
    ' _ "$root" "$src" "$tmp" >"$tmp/inside.log" 2>&1; rc=$?
    sed -e 's/^/    inside: /' "$tmp/inside.log"
    check "the install half passes inside the throwaway root ($(tail -n 1 "$tmp/inside.log"))" test "$rc" = 0
    test_end; exit
fi
fi # not inside

# --- install -----------------------------------------------------------------------------
installed_by_us=1
# shellcheck disable=SC2046
(cd "$debdir" && dpkg -i $(printf '%s_0.1.0-1_amd64.deb ' $PKGS)) >"$tmp/dpkg-i.log" 2>&1; rc=$?
check "dpkg -i installs the four packages" test "$rc" = 0
[ "$rc" = 0 ] || show "$tmp/dpkg-i.log"
# shellcheck disable=SC2086
dpkg -L $PKGS 2>/dev/null | sort -u >"$tmp/files.list"
unitdir=/lib/systemd/system
check "the user shmrefd and the group shmref exist (systemd-sysusers in postinst)" \
    bash -c 'getent passwd shmrefd >/dev/null && getent group shmref >/dev/null'
check "the socket is enabled (deb-systemd-helper)" test -L /etc/systemd/system/sockets.target.wants/shmrefd.socket
check "/etc/shmrefd/shmrefd.conf is a conffile" \
    bash -c 'dpkg-query -W -f="\${Conffiles}" shmrefd | grep -q "^ /etc/shmrefd/shmrefd.conf "'
check "the units are in Debian 12's $unitdir" test -f $unitdir/shmrefd.socket -a -f $unitdir/shmrefd.service
multiarch=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_config_var("MULTIARCH"))') # no dpkg-dev in the root
check "the library is in the multiarch libdir ($multiarch)" test -n "$multiarch" -a -e "/usr/lib/$multiarch/libshmref.so.0"
check "pkg-config finds the installed libshmref" pkg-config --exists shmref
pyext=$(dpkg -L python3-shmref 2>/dev/null | grep '^/usr/lib/python3/dist-packages/shmref/_shmref\..*\.so$')
check "python3-shmref's extension is in /usr/lib/python3/dist-packages/shmref" test -n "$pyext" -a -f "$pyext"
check "it links the installed libshmref.so.0 (no private copy, no RPATH)" \
    bash -c 'ldd "$1" | grep -Eq "libshmref\.so\.0 => (/usr)?/lib/[^/]+/libshmref\.so\.0 " &&
             ! readelf -d "$1" | grep -q "RPATH\|RUNPATH"' _ "$pyext"
check "python3-shmref depends on libshmref0 (shlibs) and python3-numpy" \
    bash -c 'd=$(dpkg-query -W -f="\${Depends}" python3-shmref) && [[ $d == *libshmref0* && $d == *python3-numpy* ]]'

# --- run as the units say ------------------------------------------------------------------
unit_key() { sed -n "s/^$2=//p" "$unitdir/$1" | tail -n 1; }
sock=$(unit_key shmrefd.socket ListenSequentialPacket)
smode=$(unit_key shmrefd.socket SocketMode)
sgroup=$(unit_key shmrefd.socket SocketGroup)
dmode=$(unit_key shmrefd.socket DirectoryMode)
execstart=$(unit_key shmrefd.service ExecStart)
suser=$(unit_key shmrefd.service User)
sgrp=$(unit_key shmrefd.service Group)
check "the socket unit names /run/shmrefd/shmrefd.sock" test "$sock" = /run/shmrefd/shmrefd.sock
check "the service runs /usr/sbin/shmrefd with /etc/shmrefd/shmrefd.conf" \
    test "$execstart" = "/usr/sbin/shmrefd --config /etc/shmrefd/shmrefd.conf"
if [ -e "$sock" ]; then
    ko "nothing listens at $sock already"
else
    if [ ! -d "$(dirname "$sock")" ]; then
        mkdir -p -m "${dmode:-0755}" "$(dirname "$sock")" && made_rundir=$(dirname "$sock")
    fi
    made_sock=$sock # it did not exist (checked above): systemd-socket-activate makes it
    # Under strace when there is one: the system calls the daemon makes are checked
    # against the groups the unit's SystemCallFilter= refuses.
    tracer=()
    command -v strace >/dev/null && tracer=(strace -f -qq -o "$tmp/trace")
    # shellcheck disable=SC2086 # ExecStart is a command line
    "${tracer[@]}" systemd-socket-activate --seqpacket -l "$sock" \
        setpriv --reuid="$suser" --regid="$sgrp" --init-groups -- $execstart 2>"$tmp/daemon.log" &
    sapid=$!
    for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.05; done
    chgrp "$sgroup" "$sock" && chmod "$smode" "$sock"
    ctl() { env -u SHMREFD_SOCKET -u XDG_RUNTIME_DIR "$@"; }
    # quiet CMD...: CMD with its output dropped (a redirection after check would drop
    # check's PASS/FAIL line too).
    quiet() { "$@" >/dev/null; }
    up=1
    for _ in $(seq 100); do ctl shmrefctl ping >/dev/null 2>&1 && { up=0; break; }; sleep 0.05; done
    check "the installed shmrefctl reaches the daemon at the default socket" test "$up" = 0
    dpid=$(ctl shmrefctl status --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["daemon"]["pid"])' 2>/dev/null)
    check "the daemon runs as the unit's User=$suser" \
        bash -c '[ -n "$1" ] && [ "$(awk "/^Uid:/ {print \$2}" /proc/$1/status)" = "$(id -u "$2")" ]' _ "$dpid" "$suser"
    check "it was socket-activated (it logs the passed socket)" grep -q "socket passed by the service manager" "$tmp/daemon.log"
    head -c 3000000 /dev/urandom >"$tmp/in.bin"
    desc=$(ctl shmrefctl put "$tmp/in.bin" 2>"$tmp/put.err")
    ctl shmrefctl get "$desc" -o "$tmp/out.bin" 2>"$tmp/get.err"
    check "put then get through the installed tools gives the same bytes" cmp -s "$tmp/in.bin" "$tmp/out.bin"
    show "$tmp/put.err"; show "$tmp/get.err"
    check "a member of group $sgroup may use the socket" \
        quiet ctl setpriv --reuid=nobody --regid=nogroup --groups="$(getent group "$sgroup" | cut -d: -f3)" shmrefctl ping
    check "a non-member may not use it (socket mode $smode)" \
        bash -c '! env -u SHMREFD_SOCKET -u XDG_RUNTIME_DIR setpriv --reuid=nobody --regid=nogroup --clear-groups shmrefctl --socket "$1" ping 2>/dev/null' _ "$sock"
    # With the default socket a refused non-member gets a private daemon of its own (issue
    # 25 item 6: docs/install.md's rule), which it may use and which is never the system's.
    ctl setpriv --reuid=nobody --regid=nogroup --clear-groups shmrefctl ping >"$tmp/nonmember.out" 2>&1
    ppid=$(sed -n 's/.*pid \([0-9]*\).*/\1/p' "$tmp/nonmember.out" | head -n 1)
    check "a non-member with the default socket gets a private daemon of its own, not the system one" \
        bash -c '[ -n "$1" ] && [ "$1" != "$2" ] && [ "$(awk "/^Uid:/ {print \$2}" /proc/$1/status)" = "$(id -u nobody)" ]' \
        _ "$ppid" "$dpid"
    show "$tmp/nonmember.out"
    [ -n "$ppid" ] && [ "$ppid" != "$dpid" ] && kill "$ppid" 2>/dev/null
    # Debian's python3, isolated (-I: no PYTHON* variables, no user site; env -i: no venv,
    # the default socket) with the installed module; the consumer runs as a group member.
    py=(timeout 60 env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/bin/python3 -I)
    producer='
import sys, numpy as np, shmref
assert shmref.__file__ == "/usr/lib/python3/dist-packages/shmref/__init__.py", shmref.__file__
with shmref.connect() as c:
    a = c.empty((512, 1000), "float64")
    a[:] = np.random.default_rng(int(sys.argv[1])).random(a.shape)
    print(c.publish(a, keep_ms=30000, meta=b"deb test"))
'
    consumer='
import sys, numpy as np, shmref
want = np.random.default_rng(int(sys.argv[2])).random((512, 1000))
with shmref.connect() as c:
    b = c.acquire(sys.argv[1])
    assert (b.dtype, b.shape) == (want.dtype, want.shape), (b.dtype, b.shape)
    assert np.array_equal(b, want), "the bytes differ"
    assert shmref.metadata(b) == b"deb test", shmref.metadata(b)
    assert not b.flags.writeable, "an acquired array is writable"
    del b
print("same", want.nbytes, "bytes")
'
    seed=$RANDOM
    pref=$("${py[@]}" -c "$producer" "$seed" 2>"$tmp/py-producer.err")
    check "python3: a producer process publishes an array from Client.empty (${pref:-nothing})" \
        bash -c '[[ $1 == shmref1:* ]]' _ "$pref"
    show "$tmp/py-producer.err"
    setpriv --reuid=nobody --regid=nogroup --groups="$(getent group "$sgroup" | cut -d: -f3)" -- \
        "${py[@]}" -c "$consumer" "$pref" "$seed" >"$tmp/py-consumer.out" 2>"$tmp/py-consumer.err"
    check "python3: a consumer process (nobody, in group $sgroup) acquires the same array" \
        grep -qx "same 4096000 bytes" "$tmp/py-consumer.out"
    show "$tmp/py-consumer.err"
    if [ -n "$dpid" ]; then
        kill -HUP "$dpid"; sleep 0.2 # a reload, for the trace
        kill -TERM "$dpid"
    else
        kill -TERM "$sapid"
    fi
    wait "$sapid"; rc=$?; sapid= dpid=
    check "the daemon stops on SIGTERM with exit 0" test "$rc" = 0
    [ "$rc" = 0 ] || show "$tmp/daemon.log"
    if [ -s "$tmp/trace" ]; then
        refused=$(systemd-analyze syscall-filter $(sed -n 's/^SystemCallFilter=~//p' "$unitdir/shmrefd.service") 2>/dev/null |
            grep -v '^ *#\|^@\|^ *$' | tr -d ' ' | sort -u)
        sed -n '\|execve("/usr/sbin/shmrefd"|,$p' "$tmp/trace" |
            awk '{ sub(/^[0-9]+ +/, ""); if (match($0, /^[a-z_0-9]+\(/)) print substr($0, 1, RLENGTH - 1) }' |
            sort -u >"$tmp/calls"
        bad=$(printf '%s\n' "$refused" | grep -xFf - "$tmp/calls" | tr '\n' ' ')
        check "the daemon makes no system call the unit's SystemCallFilter=~ refuses (${bad:-none})" \
            test -s "$tmp/calls" -a -z "$bad"
    else
        echo "SKIP the system call check (strace is not installed)"
    fi
fi
check "shmrefd --check-config accepts /etc/shmrefd/shmrefd.conf (as $suser)" \
    bash -c '"$@" >/dev/null' _ \
    setpriv --reuid="$suser" --regid="$sgrp" --init-groups /usr/sbin/shmrefd --check-config --config /etc/shmrefd/shmrefd.conf
# verify checks the man pages the units' Documentation= names when man(1) is there.
man_opt=--man=no
command -v man >/dev/null && man -w shmrefd.8 >/dev/null 2>&1 && man_opt=--man=yes
systemd-analyze verify "$man_opt" $unitdir/shmrefd.socket $unitdir/shmrefd.service >"$tmp/verify.log" 2>&1; rc=$?
check "systemd-analyze verify $man_opt passes on the installed units, silently" test "$rc" = 0 -a ! -s "$tmp/verify.log"
show "$tmp/verify.log"
score=$(systemd-analyze security --offline=yes $unitdir/shmrefd.service 2>/dev/null | sed -n 's/.*Overall exposure level for shmrefd.service: \([0-9.]*\).*/\1/p')
echo "NOTE systemd-analyze security: exposure ${score:-?} for the installed shmrefd.service"

# --- without systemd: the documented command gives the unit's user, group, socket mode ---
chmod 755 "$tmp" # the daemon's user and the clients reach its socket directory through it
hsock=$tmp/hand/shmrefd.sock
(ulimit -n 1048576 2>/dev/null; exec /usr/sbin/shmrefd --config /etc/shmrefd/shmrefd.conf --socket "$hsock" \
    --user "$suser" --socket-group "$sgroup" --socket-mode "$smode") 2>"$tmp/hand.log" &
hpid=$!
for _ in $(seq 100); do [ -S "$hsock" ] && break; sleep 0.05; done
check "by hand: the daemon runs as User=$suser, Group=$sgrp, no capabilities, no_new_privs" \
    bash -c 'awk "/^Uid:/ {u=\$2} /^Gid:/ {g=\$2} /^CapEff:/ {c=\$2} /^NoNewPrivs:/ {n=\$2} END {print u, g, c, n}" "/proc/$1/status" |
             grep -qx "$(id -u "$2") $(getent group "$3" | cut -d: -f3) 0000000000000000 1"' _ "$hpid" "$suser" "$sgrp"
check "by hand: its socket has the socket unit's group $sgroup and mode $smode" \
    test "$(stat -c '%G %a' "$hsock" 2>/dev/null)" = "$sgroup ${smode#0}"
check "by hand: a member of $sgroup may use it, a non-member may not" \
    bash -c 'setpriv --reuid=nobody --regid=nogroup --groups="$(getent group "$2" | cut -d: -f3)" shmrefctl --socket "$1" ping >/dev/null &&
             ! setpriv --reuid=nobody --regid=nogroup --clear-groups shmrefctl --socket "$1" ping 2>/dev/null' _ "$hsock" "$sgroup"

# --- purge ---------------------------------------------------------------------------------
# shellcheck disable=SC2086
dpkg --purge $PKGS >"$tmp/purge.log" 2>&1; rc=$?
check "dpkg --purge removes the four packages" test "$rc" = 0
[ "$rc" = 0 ] && installed_by_us=
left_over() {
    local f bad=0
    while IFS= read -r f; do
        [ -d "$f" ] && continue # shared directories (/usr/bin) stay
        if [ -e "$f" ] || [ -L "$f" ]; then echo "    | left: $f"; bad=1; fi
    done <"$tmp/files.list"
    for f in /etc/shmrefd /etc/systemd/system/sockets.target.wants/shmrefd.socket \
             /var/lib/systemd/deb-systemd-helper-enabled/shmrefd.socket.dsh-also; do
        if [ -e "$f" ] || [ -L "$f" ]; then echo "    | left: $f"; bad=1; fi
    done
    find /etc/systemd /var/lib/systemd/deb-systemd-helper-enabled -name 'shmrefd*' 2>/dev/null | sed 's/^/    | left: /' | grep . && bad=1
    find /usr/lib/python3/dist-packages /usr/lib/python3.*/dist-packages -maxdepth 1 -name 'shmref*' 2>/dev/null |
        sed 's/^/    | left: /' | grep . && bad=1
    return $bad
}
check "nothing of the packages is left: files, conffiles, unit symlinks, helper state, byte code" left_over
for _ in $(seq 100); do kill -0 "$hpid" 2>/dev/null || break; sleep 0.1; done
check "the daemon started by hand was stopped by the package's prerm" bash -c '! kill -0 "$1" 2>/dev/null' _ "$hpid"
kill "$hpid" 2>/dev/null; wait "$hpid" 2>/dev/null
check "Debian's python3 no longer imports shmref" \
    bash -c '! env -i PATH=/usr/bin:/bin /usr/bin/python3 -I -c "import shmref" 2>/dev/null'
getent passwd shmrefd >/dev/null && echo "NOTE the user shmrefd and group shmref stay after purge (Debian policy)"

test_end
