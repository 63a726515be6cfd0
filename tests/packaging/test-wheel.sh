#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-wheel.sh: the manylinux wheel is the whole set-up (issue 19).
#   - scripts/dist's wheel (rebuilt when a source is newer than dist/'s) is manylinux by
#     `auditwheel show`, glibc 2.28 or older, and its shmrefd has libuv, msgpack-c, libcap
#     and libinih linked in (static), loading none of them from the system;
#   - installed alone into a fresh venv, as a non-root user (nobody, with an
#     XDG_RUNTIME_DIR made here) a producer and a consumer process share a 100 MB array,
#     no daemon started by hand: the first connect starts a private shmrefd;
#   - another uid cannot use it: refused by the 0700 directory, and by the daemon's
#     allow list when the test (root) opens the directory and socket to everyone;
#   - it exits by itself (SHMREF_IDLE_EXIT_S=2) when nothing is held;
#   - four processes connecting at once get one daemon (one pid, one start in its log).
# Needs root (setpriv to other uids); 77 = skipped. Usage: test-wheel.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
. "$src/tests/lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to run processes as other uids"; exit 77; }
# A system daemon is always preferred, so one running on this machine would serve these
# clients: run in a mount namespace of our own where /run/shmrefd is an empty tmpfs (the
# host's directory and socket are not touched).
if [ -z "${SHMREF_TEST_MNTNS:-}" ] && [ -e /run/shmrefd ]; then
    SHMREF_TEST_MNTNS=1 exec unshare --mount --propagation private -- "$0" "$@"
fi
if [ -n "${SHMREF_TEST_MNTNS:-}" ]; then
    mount -t tmpfs -o mode=0755,size=1m tmpfs /run/shmrefd || { echo "SKIP: cannot hide /run/shmrefd"; exit 77; }
fi
test_begin wheel
chmod 0755 "$tmp"
owner=nobody other=65533
pids=$tmp/daemon-pids
cleanup() {
    # Private daemons this test started (their pids, printed by the clients), if alive.
    for p in $(sort -u "$pids" 2>/dev/null); do
        grep -q "$tmp" "/proc/$p/cmdline" 2>/dev/null && kill "$p" 2>/dev/null
    done
    test_cleanup
}
trap cleanup EXIT

py=/usr/bin/python3 # readable by every uid (pyenv's live under /root)
tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
wheel=$(ls -t "$src"/dist/shmref-*-"$tag"-*manylinux*.whl 2>/dev/null | head -n 1)
if [ -z "$wheel" ] || [ -n "$(cd "$src" && find python client-lib daemon proto tools scripts/dist -newer "$wheel" \
        -type f -not -path '*/__pycache__/*' -not -path 'python/build/*' | head -n 1)" ]; then
    echo "building the wheel: scripts/dist $py"
    "$src/scripts/dist" "$py" >"$tmp/dist.log" 2>&1 || { tail -n 30 "$tmp/dist.log"; }
    wheel=$(ls -t "$src"/dist/shmref-*-"$tag"-*manylinux*.whl 2>/dev/null | head -n 1)
    pyid=$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable), sys.version.split()[0])')
    check "scripts/dist built it with $pyid (not a venv of another python3 left in build/)" \
        grep -qxF "scripts/dist: building with $pyid" "$tmp/dist.log"
    # Debian's python3-numpy (1.x) links its headers into /usr/include/python3.X/numpy: the
    # extension must still get those of the numpy in the isolated build environment.
    grep -o 'shmref: the extension is compiled against .*' "$tmp/dist.log" | tail -n 1
    check "the extension was compiled against the build environment's numpy 2" \
        grep -Eq 'shmref: the extension is compiled against the headers of numpy 2\.[0-9.]+ \(.*/build-env-' "$tmp/dist.log"
fi
check "scripts/dist made a $tag manylinux wheel" test -n "$wheel"
[ -n "$wheel" ] || { test_end; exit 1; }
echo "wheel: $wheel"
"$src/build/dist-venv/bin/auditwheel" show "$wheel" >"$tmp/show.txt" 2>&1
check "auditwheel show: consistent with a manylinux tag" \
    grep -Eq 'platform tag: "manylinux_2_[0-9]+_x86_64"' "$tmp/show.txt"
grep -o '"manylinux[^"]*"' "$tmp/show.txt" | head -n 1
check "the tag is manylinux_2_28 or older (scripts/dist builds for glibc 2.28)" \
    grep -Eq 'platform tag: "manylinux_2_([0-9]|1[0-9]|2[0-8])_x86_64"' "$tmp/show.txt"

# A fresh venv with nothing but the wheel (and numpy, its one requirement).
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --disable-pip-version-check "$wheel" >"$tmp/pip.log" 2>&1
check "pip install <the wheel> in a fresh venv" "$tmp/venv/bin/python" -c 'import shmref'
check "the venv has shmref and numpy only" bash -c \
    "'$tmp/venv/bin/pip' list --format=freeze 2>/dev/null | grep -v -E '^(pip|setuptools)==' | cut -d= -f1 | sort | tr '\n' ' ' | grep -qx 'numpy shmref '"
site=$("$tmp/venv/bin/python" -c 'import shmref, os; print(os.path.dirname(shmref.__file__))')
LD_LIBRARY_PATH= ldd "$site/bin/shmrefd" >"$tmp/ldd.txt" 2>&1
check "the wheel's shmrefd loads no libuv, msgpack-c, libcap, libinih (linked in statically)" bash -c \
    "grep -q libc.so '$tmp/ldd.txt' && ! grep -E 'libuv|libmsgpackc|libcap|libinih' '$tmp/ldd.txt'"
check "the wheel's shmrefd needs no libsystemd" bash -c "! grep -q libsystemd '$tmp/ldd.txt'"
check "the wheel carries the licences of the libraries linked in (libuv, msgpack-c, libcap, inih)" "$py" -c '
import sys, zipfile
names = {n.rsplit("/", 1)[-1] for n in zipfile.ZipFile(sys.argv[1]).namelist() if "dist-info/licenses/LICENSES/" in n} - {""}
sys.exit(0 if names == {"libuv.txt", "msgpack-c.txt", "libcap.txt", "inih.txt"} else 1)' "$wheel"
check "console entry shmrefd runs the wheel's daemon" bash -c "'$tmp/venv/bin/shmrefd' --version | grep -q shmrefd"
check "python -m shmref.daemon runs it too" bash -c "'$tmp/venv/bin/python' -m shmref.daemon --version | grep -q shmrefd"

# The owner's environment: nothing of this shell's shmref settings, its own runtime dir.
run=$tmp/run-$owner
mkdir -m 0700 "$run" && chown "$owner" "$run"
as_owner() {
    setpriv --reuid="$owner" --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin HOME="$tmp" \
        XDG_RUNTIME_DIR="$run" SHMREF_IDLE_EXIT_S=2 "$@"
}
cat >"$tmp/producer.py" <<'EOF'
import sys, numpy as np, shmref
c = shmref.connect()
a = c.empty((100 * 2**20 // 8,), "float64")            # 100 MiB
a[:] = np.arange(a.size, dtype="float64")
ref = c.publish(a)                                      # lives while this process holds it
print(ref, c.daemon_pid, flush=True)
sys.stdin.readline()                                    # until the consumer is done
EOF
cat >"$tmp/consumer.py" <<'EOF'
import sys, numpy as np, shmref
c = shmref.connect()
b = c.acquire(sys.argv[1])
n = 100 * 2**20 // 8
assert b.shape == (n,) and b.dtype == np.float64 and not b.flags.writeable, (b.shape, b.dtype)
assert b[0] == 0 and b[-1] == n - 1 and float(b.sum()) == n * (n - 1) / 2
print("consumed", b.nbytes, c.daemon_pid)
EOF
cat >"$tmp/pid.py" <<'EOF'
import shmref
print(shmref.Client().daemon_pid)
EOF
coproc PROD { as_owner "$tmp/venv/bin/python" "$tmp/producer.py" 2>"$tmp/producer.err"; }
read -r -t 60 ref ppid <&"${PROD[0]}"
echo "$ppid" >>"$pids"
check "the producer published 100 MiB with no daemon started by hand" test -n "${ref:-}"
sock=$run/shmref/shmrefd.sock
check "the private daemon's socket is in \$XDG_RUNTIME_DIR/shmref, mode 0600, of $owner" \
    test "$(stat -c '%a %U' "$sock" 2>/dev/null)" = "600 $owner"
check "its directory is 0700" test "$(stat -c %a "$run/shmref")" = 700
check "the daemon runs as $owner" test "$(stat -c %U "/proc/$ppid" 2>/dev/null)" = "$owner"
as_owner "$tmp/venv/bin/python" "$tmp/consumer.py" "${ref:-none}" >"$tmp/consumer.out" 2>&1
cat "$tmp/consumer.out"
check "a consumer process reads the 100 MiB array from the same daemon" \
    grep -qx "consumed 104857600 $ppid" "$tmp/consumer.out"

# Another uid: the directory keeps it out; with it opened, the allow list does.
setpriv --reuid="$other" --regid="$other" --clear-groups env -i PATH=/usr/bin:/bin \
    "$tmp/venv/bin/python" -c "import shmref; shmref.Client('$sock')" >"$tmp/other1.err" 2>&1
check "uid $other cannot reach the socket (0700 directory)" grep -q PermissionError "$tmp/other1.err"
chmod 0711 "$run" "$run/shmref" && chmod 0666 "$sock"
# libshmref refuses a daemon of an untrusted uid itself (peer credentials); trusting the
# owner's uid ($SHMREF_DAEMON_UID) leaves the daemon's allow list to refuse.
setpriv --reuid="$other" --regid="$other" --clear-groups env -i PATH=/usr/bin:/bin \
    "$tmp/venv/bin/python" -c "import shmref; shmref.Client('$sock')" >"$tmp/other3.err" 2>&1
check "uid $other refuses a daemon of uid $(id -u $owner) it does not trust" grep -q "refusing the daemon" "$tmp/other3.err"
setpriv --reuid="$other" --regid="$other" --clear-groups env -i PATH=/usr/bin:/bin SHMREF_DAEMON_UID="$(id -u $owner)" \
    "$tmp/venv/bin/python" -c "import shmref; shmref.Client('$sock')" >"$tmp/other2.err" 2>&1
chmod 0700 "$run" "$run/shmref" && chmod 0600 "$sock"
sed -e 's/^/    | /' "$tmp/other2.err" | tail -n 2
check "uid $other is refused by the daemon's allow list when it can open the socket" \
    grep -q "not in allow-users" "$tmp/other2.err"

echo done >&"${PROD[1]}"
wait "$PROD_PID"
check "the producer exits cleanly" test $? = 0
gone=no
for _ in $(seq 1 150); do
    if ! kill -0 "$ppid" 2>/dev/null; then gone=yes; break; fi
    sleep 0.1
done
check "the private daemon exited by itself when idle (SHMREF_IDLE_EXIT_S=2)" test "$gone" = yes
check "it said why in its log" grep -q "exiting (exit-idle)" "$run/shmref/shmrefd.log"
check "and removed its socket" test ! -e "$sock"

# Four processes at once: one daemon.
starts=$(grep -c 'starting a private shmrefd' "$run/shmref/shmrefd.log")
for i in 1 2 3 4; do
    as_owner "$tmp/venv/bin/python" "$tmp/pid.py" >"$tmp/race.$i" 2>&1 &
done
wait
cat "$tmp"/race.* | sort -u >"$tmp/race.pids"
cat "$tmp/race.pids" >>"$pids"
sed -e 's/^/    race: /' "$tmp/race.pids"
check "four processes connecting at once got one daemon" test "$(grep -c -E '^[0-9]+$' "$tmp/race.pids")" = 1 -a \
    "$(wc -l <"$tmp/race.pids")" = 1
check "its log shows one more start" test "$(grep -c 'starting a private shmrefd' "$run/shmref/shmrefd.log")" = $((starts + 1))
check "SHMREF_AUTOSTART=0 turns it off (no daemon -> FileNotFoundError)" bash -c \
    "rm -rf '$tmp/run-off' && mkdir -m 0700 '$tmp/run-off' && chown $owner '$tmp/run-off' &&
     setpriv --reuid=$owner --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin XDG_RUNTIME_DIR='$tmp/run-off' \
       SHMREF_AUTOSTART=0 '$tmp/venv/bin/python' -c 'import shmref; shmref.connect()' 2>&1 | grep -q FileNotFoundError &&
     test ! -e '$tmp/run-off/shmref'"
test_end
