#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-user.sh: the wheels run as users run them (issue 25 item 10; DESIGN.md section 12).
# For each CPython 3.9-3.13 under /root/.pyenv/versions (the newest of each minor):
#   - scripts/dist's wheel for it (built into BUILD_DIR/user-dist, with the sdist, when one
#     is missing or older than a source) is pip-installed by uid nobody (65534) into a
#     fresh venv in a HOME of its own;
#   - as nobody, with `env -i` (no SHMREF_* variable: no socket named, autostart on, the
#     wheel's own shmrefd), test-user.py runs the Python examples of README.md,
#     docs/install.md and docs/python.md, a 3-stage multiprocessing pipeline of 200 MB
#     arrays (fork and spawn), ProcessPoolExecutor with 200 MB arrays, 200 handoffs
#     between two processes that send the daemon no message (its counter), and (on 3.11 only:
#     the pins of python/tests/requirements.txt, reused as constraints, are 3.11's, and
#     one Dask run is a minute) a Dask LocalCluster whose large frames are counted as sent
#     by reference; the daemon that answered must be the private one, started from the
#     venv's wheel;
#   - XDG_RUNTIME_DIR is a 0700 directory of nobody's on 3.9, 3.11 and 3.13, and unset on
#     3.10 and 3.12 (the library's fallback, /tmp/shmref-65534).
# The choice for interpreters nobody cannot read: pyenv's live under /root (0700). The
# test runs in a mount namespace of its own in which /root is an empty 0755 tmpfs with the
# real /root/.pyenv/versions bind-mounted at the same path: nobody runs the very same
# interpreters at their own paths (libpython found by their RPATH), nothing is copied and
# nothing on the host changes. In that namespace /tmp is a directory of the test's (under
# BUILD_DIR, on disk), so /tmp/shmref-65534 is the test's own, and /run/shmrefd is an empty
# tmpfs (a system daemon would be preferred over the private one). The private daemons (and
# any process of nobody's left in the namespace) are stopped at the end, also on failure.
# With no pyenv Python, Debian's /usr/bin/python3 runs; a missing version makes the test
# end as skipped (77) after the others ran, unless something failed.
# Needs root. Usage: test-user.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
. "$src/tests/lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to run processes as uid nobody and a mount namespace"; exit 77; }
user=65534
pyenv=/root/.pyenv/versions

if [ -z "${SHMREF_TEST_USER_NS:-}" ]; then
    # On the host: the Pythons, the wheels, then the rest in a mount namespace of its own.
    pythons=() missing=()
    for minor in 9 10 11 12 13; do
        p=$(ls -d "$pyenv"/3."$minor".*/bin/python3 2>/dev/null | sort -V | tail -n 1)
        if [ -n "$p" ]; then pythons+=("$p"); else missing+=("3.$minor"); fi
    done
    [ ${#pythons[@]} -gt 0 ] || pythons=(/usr/bin/python3)
    out=$bin/user-dist
    stale=no
    for p in "${pythons[@]}"; do
        tag=$("$p" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
        w=$(ls -t "$out"/shmref-*-"$tag"-*manylinux*.whl 2>/dev/null | head -n 1)
        if [ -z "$w" ] || [ -n "$(cd "$src" && find python client-lib daemon proto tools scripts/dist -newer "$w" \
                -type f -not -path '*/__pycache__/*' -not -path 'python/build/*' | head -n 1)" ]; then
            stale=yes
        fi
    done
    if [ "$stale" = yes ]; then
        echo "building the wheels: scripts/dist --out $out --build-dir $bin ${pythons[*]}"
        rm -rf "$out"
        start=$(date +%s)
        "$src/scripts/dist" --out "$out" --build-dir "$bin" "${pythons[@]}" >"$bin/user-dist.log" 2>&1 ||
            { tail -n 30 "$bin/user-dist.log"; echo "FAIL scripts/dist (log: $bin/user-dist.log)"; echo "0 passed, 1 failed"; exit 1; }
        echo "scripts/dist took $(($(date +%s) - start)) s"
    fi
    scratch=$(mktemp -d "$bin/test-user.XXXXXX")
    # What the run in the namespace reads, copied now: there /tmp is the scratch directory,
    # which hides a source or build tree under /tmp (a fresh clone in CI).
    in=$scratch/inputs
    mkdir -p "$in/docs/docs" "$in/wheels"
    cp "$src/README.md" "$in/docs/"
    cp "$src/docs/install.md" "$src/docs/python.md" "$in/docs/docs/"
    cp "$src/tests/packaging/test-user.py" "$src/python/tests/requirements.txt" "$in/"
    cp "$out"/shmref-*.whl "$in/wheels/"
    SHMREF_TEST_USER_NS=$scratch SHMREF_TEST_USER_PYTHONS="${pythons[*]}" SHMREF_TEST_USER_MISSING="${missing[*]}" \
        unshare --mount --propagation private -- "$0" "$@"
    rc=$?
    rm -rf "$scratch"
    exit $rc
fi

# In the namespace: /tmp, /run/shmrefd and /root as the header says.
scratch=$SHMREF_TEST_USER_NS
chmod 1777 "$scratch"
mount --bind "$scratch" /tmp || { echo "SKIP: cannot mount a /tmp of the test's own"; exit 77; }
if [ -e /run/shmrefd ]; then
    mount -t tmpfs -o mode=0755,size=1m tmpfs /run/shmrefd || { echo "SKIP: cannot hide /run/shmrefd"; exit 77; }
fi
if [ -d "$pyenv" ]; then
    mkdir /tmp/.pyenv-versions && mount --bind "$pyenv" /tmp/.pyenv-versions &&
        mount -t tmpfs -o mode=0755,size=1m tmpfs /root && mkdir -p "$pyenv" &&
        mount --bind /tmp/.pyenv-versions "$pyenv" || { echo "SKIP: cannot show $pyenv to uid $user"; exit 77; }
fi
test_begin user
chmod 0755 "$tmp"
# The working directory the test was started in may be a path the new /tmp hides (a
# fresh clone under /tmp): spawned Pythons chdir to their parent's os.getcwd() and fail
# there. The users' processes start in the test's directory.
cd "$tmp" || exit 1
ns=$(readlink /proc/self/ns/mnt)
cleanup() {
    # Every process of uid nobody in this namespace is this test's (the private daemons,
    # a pipeline stage left behind).
    local p
    for p in /proc/[0-9]*; do
        [ "$(stat -c %u "$p" 2>/dev/null)" = "$user" ] && [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ] &&
            kill -9 "${p#/proc/}" 2>/dev/null
    done
    test_cleanup
}
trap cleanup EXIT

cp -r /tmp/inputs/. "$tmp/" # copied before the namespace hid the trees (above)
chmod -R a+rX "$tmp/docs" "$tmp/wheels" "$tmp/test-user.py" "$tmp/requirements.txt"

for py in $SHMREF_TEST_USER_PYTHONS; do
    v=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    tag=cp${v/./}
    t0=$(date +%s)
    echo "== Python $v ($py)"
    wheel=$(ls "$tmp"/wheels/shmref-*-"$tag"-"$tag"-manylinux_2_*_x86_64.whl 2>/dev/null | head -n 1)
    check "$v: a $tag manylinux wheel (glibc 2.28 or older) from scripts/dist" test -n "$wheel"
    [ -n "$wheel" ] || continue
    echo "   $(basename "$wheel")"
    home=$tmp/home-$tag
    mkdir -m 0700 "$home" && chown "$user:$user" "$home"
    xdg=()
    case $v in
        3.10|3.12) run=/tmp/shmref-$user ;;
        *) mkdir -m 0700 "$tmp/run-$tag" && chown "$user:$user" "$tmp/run-$tag"
           xdg=(XDG_RUNTIME_DIR="$tmp/run-$tag"); run=$tmp/run-$tag/shmref ;;
    esac
    echo "   ${xdg[0]:-XDG_RUNTIME_DIR unset}, the private daemon's directory: $run"
    as_user() {
        setpriv --reuid="$user" --regid="$user" --clear-groups env -i PATH=/usr/bin:/bin HOME="$home" "${xdg[@]}" "$@"
    }
    extra=() dask=()
    if [ "$v" = 3.11 ]; then extra=(dask==2026.8.0 distributed==2026.8.0 -c "$tmp/requirements.txt"); dask=(--dask); fi
    as_user "$py" -m venv "$home/venv" >"$tmp/venv-$tag.log" 2>&1 &&
        as_user "$home/venv/bin/pip" install -q --disable-pip-version-check "$wheel" "${extra[@]}" >>"$tmp/venv-$tag.log" 2>&1
    rc=$?
    check "$v: nobody pip-installs the wheel into a fresh venv" test "$rc" = 0
    [ "$rc" = 0 ] || tail -n 20 "$tmp/venv-$tag.log"
    as_user "$home/venv/bin/python" -c 'import shmref' >>"$tmp/venv-$tag.log" 2>&1 || { tail -n 20 "$tmp/venv-$tag.log"; continue; }

    # In the background, so a signal to this script runs its cleanup at once.
    timeout 900 setpriv --reuid="$user" --regid="$user" --clear-groups env -i PATH=/usr/bin:/bin HOME="$home" \
        "${xdg[@]}" "$home/venv/bin/python" "$tmp/test-user.py" "$tmp/docs" "${dask[@]}" >"$tmp/out-$tag" 2>"$tmp/err-$tag" &
    wait $!
    rc=$?
    sed -e '/^PASS \|^FAIL \|^DAEMON /d' -e 's/^/   /' "$tmp/out-$tag"
    while read -r what rest; do
        case $what in
            PASS) ok "$v: $rest" ;;
            FAIL) ko "$v: $rest" ;;
        esac
    done <"$tmp/out-$tag"
    check "$v: test-user.py ran to its end (exit $rc)" test "$rc" = 0
    [ "$rc" = 0 ] || tail -n 20 "$tmp/err-$tag" | sed -e 's/^/   stderr: /'
    daemons=$(sed -n 's/^DAEMON \([0-9]*\)$/\1/p' "$tmp/out-$tag" | sort -u)
    for d in $daemons; do
        exe=$(readlink "/proc/$d/exe" 2>/dev/null)
        check "$v: the daemon that answered (pid $d) is the venv's wheel's shmrefd, of uid $user" \
            test "$exe" = "$(readlink -f "$home/venv")/lib/python$v/site-packages/shmref/bin/shmrefd" -a \
            "$(stat -c %u "/proc/$d" 2>/dev/null)" = "$user"
    done
    check "$v: one private daemon served every process" test "$(echo "$daemons" | grep -c .)" = 1
    check "$v: its socket is $run/shmrefd.sock" test -S "$run/shmrefd.sock"
    grep -h -i 'quota\|refus' "$run/shmrefd.log" 2>/dev/null | tail -n 3 | sed -e 's/^/   daemon log: /'
    # Stop it (and anything of nobody's left) before the next Python.
    for d in $daemons; do kill "$d" 2>/dev/null; done
    for _ in $(seq 50); do
        alive=no
        for d in $daemons; do kill -0 "$d" 2>/dev/null && alive=yes; done
        [ "$alive" = no ] && break
        sleep 0.1
    done
    echo "   Python $v took $(($(date +%s) - t0)) s"
done

if [ -n "$SHMREF_TEST_USER_MISSING" ]; then
    test_end_skipping "no CPython $SHMREF_TEST_USER_MISSING under $pyenv: not run there"
fi
test_end
