# SPDX-License-Identifier: MIT
# deps.sh: sourced by the other scripts. ensure_packages installs the Debian packages
# this project builds and tests with, if any are missing (apt-get needs root).
SHMREF_BUILD_PACKAGES="build-essential cmake pkg-config libuv1-dev libmsgpack-dev libcriterion-dev
    libsystemd-dev libcap-dev libinih-dev"
# python3-venv and python3-dev: the Python package's suite builds its extension in a venv (with
# the python3 on PATH: pyenv's where there is one, else Debian's, which needs these two).
SHMREF_TEST_PACKAGES="python3 python3-prometheus-client systemd clang libclang-rt-14-dev strace
    tmux python3-venv python3-dev"
# The deb test's (debian/control's Build-Depends, lintian, mmdebstrap for its throwaway
# root): installed by scripts/test only under CI=true or SHMREF_TEST_HOST=1.
SHMREF_PACKAGING_PACKAGES="debhelper dpkg-dev lintian dh-python python3-all-dev python3-setuptools python3-numpy mmdebstrap"

ensure_packages() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing missing packages: ${missing[*]}" >&2
    local sudo=
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; return 1; }
        sudo=sudo
    fi
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# The benchmark's own packages (scripts/bench installs them; the tests do not need them:
# without iceoryx the bench's iceoryx rows, and the smoke run's, are skipped with the reason).
# iceoryx: RouDi (iox-roudi); libiceoryx-binding-c-dev: the C binding the iceoryx method uses.
SHMREF_BENCH_PACKAGES="gnuplot-nox iceoryx libiceoryx-binding-c-dev"
