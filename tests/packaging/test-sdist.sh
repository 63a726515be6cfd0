#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-sdist.sh: `pip install <the sdist>` works in a new venv on each Python (issue 19),
# and then a producer and a consumer process share an array through the private shmrefd
# the first connect starts (SHMREF_IDLE_EXIT_S=1: it is gone before the next Python).
# Pythons: pyenv's 3.13.0 and 3.9.18 (newest and oldest) by default;
# SHMREF_SDIST_PYTHONS=all for 3.9-3.13 (each takes about a minute on 2 idle cores), or
# a space-separated list of interpreters. Also: with no -dev package visible to
# pkg-config the build names all that are missing in one message, and
# SHMREF_LIBRARY=system without an installed libshmref names shmref.pc.
# Needs root (it may run scripts/dist, which installs -dev packages); 77 = skipped.
# Usage: test-sdist.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
. "$src/tests/lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
# A system daemon is always preferred, so one running on this machine would serve these
# clients: run in a mount namespace of our own where /run/shmrefd is an empty tmpfs (the
# host's directory and socket are not touched).
if [ -z "${SHMREF_TEST_MNTNS:-}" ] && [ -e /run/shmrefd ]; then
    SHMREF_TEST_MNTNS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
if [ -n "${SHMREF_TEST_MNTNS:-}" ]; then
    mount -t tmpfs -o mode=0755,size=1m tmpfs /run/shmrefd || { echo "SKIP: cannot hide /run/shmrefd"; exit 77; }
fi
test_begin sdist
pyenv=/root/.pyenv/versions
case "${SHMREF_SDIST_PYTHONS:-}" in
    "") pythons="$pyenv/3.13.0/bin/python3 $pyenv/3.9.18/bin/python3" ;;
    all) pythons=$(for v in 3.9.18 3.10.13 3.11.7 3.12.1 3.13.0; do echo "$pyenv/$v/bin/python3"; done) ;;
    *) pythons=$SHMREF_SDIST_PYTHONS ;;
esac

sdist=$(ls -t "$src"/dist/shmref-*.tar.gz 2>/dev/null | head -n 1)
if [ -z "$sdist" ] || [ -n "$(cd "$src" && find python client-lib daemon proto tools scripts/dist -newer "$sdist" \
        -type f -not -path '*/__pycache__/*' -not -path 'python/build/*' | head -n 1)" ]; then
    echo "building the sdist: scripts/dist --sdist"
    "$src/scripts/dist" --sdist >"$tmp/dist.log" 2>&1 || tail -n 30 "$tmp/dist.log"
    sdist=$(ls -t "$src"/dist/shmref-*.tar.gz 2>/dev/null | head -n 1)
fi
check "scripts/dist made an sdist" test -n "$sdist"
[ -n "$sdist" ] || { test_end; exit 1; }
tar -tzf "$sdist" >"$tmp/list"
for f in LICENSE pyproject.toml CMakeLists.txt csrc/client-lib/session.c csrc/client-lib/autostart.c \
         csrc/client-lib/include/shmref/shmref.h csrc/proto/proto.c csrc/daemon/main.c csrc/tools/shmrefctl.c; do
    check "the sdist holds $f" grep -qx "shmref-[0-9.]*/$f" "$tmp/list"
done

cat >"$tmp/roundtrip.py" <<'EOF'
import subprocess, sys, numpy as np, shmref
c = shmref.connect()
a = c.empty((1 << 20,), "int64")
a[:] = np.arange(a.size)
ref = c.publish(a)
out = subprocess.run([sys.executable, "-c",
    "import sys, shmref; b = shmref.connect().acquire(sys.argv[1]); print(int(b.sum()), shmref.connect().daemon_pid)",
    str(ref)], capture_output=True, text=True, check=True).stdout.split()
assert int(out[0]) == (1 << 20) * ((1 << 20) - 1) // 2 and int(out[1]) == c.daemon_pid, out
print("ok", sys.version.split()[0], "numpy", np.__version__, "daemon", c.daemon_pid)
EOF
for py in $pythons; do
    if [ ! -x "$py" ]; then ko "$py: no such interpreter"; continue; fi
    v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    start=$(date +%s)
    rm -rf "$tmp/venv"
    "$py" -m venv "$tmp/venv"
    if "$tmp/venv/bin/pip" install -q --disable-pip-version-check "$sdist" >"$tmp/pip-$v.log" 2>&1; then
        ok "Python $v: pip install <the sdist> in a new venv ($(( $(date +%s) - start )) s)"
    else
        ko "Python $v: pip install <the sdist>"; tail -n 25 "$tmp/pip-$v.log"; continue
    fi
    mkdir -m 0700 "$tmp/run-$v"
    env -u SHMREFD_SOCKET SHMREF_AUTOSTART=1 XDG_RUNTIME_DIR="$tmp/run-$v" SHMREF_IDLE_EXIT_S=1 \
        "$tmp/venv/bin/python" "$tmp/roundtrip.py" >"$tmp/rt-$v.out" 2>&1
    cat "$tmp/rt-$v.out"
    check "Python $v: producer and consumer through a private daemon" grep -q '^ok ' "$tmp/rt-$v.out"
    dpid=$(awk '/^ok /{print $NF}' "$tmp/rt-$v.out")
    for _ in $(seq 1 100); do [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null || break; sleep 0.1; done
    check "Python $v: the private daemon exited when idle" bash -c "! kill -0 ${dpid:-0} 2>/dev/null"
    dpid=
done

# The messages (with the newest Python's venv left from the loop): pkg-config sees nothing.
py=$(echo $pythons | awk '{print $1}')
"$py" -m venv "$tmp/venv-msg"
PKG_CONFIG_LIBDIR=$tmp/empty PKG_CONFIG_PATH= "$tmp/venv-msg/bin/pip" install --disable-pip-version-check \
    "$sdist" >"$tmp/nodev.log" 2>&1
check "no -dev packages: one message names libuv1-dev, libmsgpack-dev, libcap-dev and libinih-dev" bash -c \
    "grep -A4 'needs C libraries that are missing' '$tmp/nodev.log' | tr -s ' \n' ' ' >'$tmp/nodev.msg' &&
     for d in libuv1-dev libmsgpack-dev libcap-dev libinih-dev; do grep -q \"\$d (pkg-config\" '$tmp/nodev.msg' || exit 1; done"
sed -n '/CMake Error/,/Configuring incomplete/p' "$tmp/nodev.log" | head -n 12
SHMREF_LIBRARY=system PKG_CONFIG_LIBDIR=$tmp/empty PKG_CONFIG_PATH= "$tmp/venv-msg/bin/pip" install \
    --disable-pip-version-check "$src/python" >"$tmp/nolib.log" 2>&1
check "SHMREF_LIBRARY=system without libshmref: the message names shmref.pc" grep -q 'finds no shmref.pc' "$tmp/nolib.log"
test_end
