#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench/python/venv.sh VENV: make (or bring up to date) the project's one Python venv
# (build/venv: the tests, the docs check and the benchmarks share it, so torch is
# installed once) from the `python3` on PATH: the pinned packages of
# bench/python/requirements.txt, those of python/tests/requirements.txt, then the local
# ./python package (shmref). Reinstalls only what changed (a stamp per part). Prints what
# it installs, and pip's errors; non-zero if pip fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${1:?usage: bench/python/venv.sh VENV}
req=bench/python/requirements.txt

if [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
log="$venv/pip.log"
pip_install() {
    # pip's output goes to a log, shown only when it fails (this machine's pip
    # configuration warns once per package about local index directories it lacks).
    "$venv/bin/python" -m pip --disable-pip-version-check install "$@" >"$log" 2>&1 ||
        { grep -v "^WARNING: Location 'file:" "$log" >&2; return 1; }
}

want=$(sha256sum "$req" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements" 2>/dev/null)" != "$want" ]; then
    echo "bench venv: installing $req into $venv" >&2
    # The file pins every package; pip still resolves, so that torch==2.13.0 from plain
    # PyPI brings the libraries its build needs (where a local CPU wheel of the same
    # version is on disk, pip prefers it, and needs nothing more).
    pip_install -r "$req"
    echo "$want" >"$venv/.requirements"
fi

# The test suite's pins (python/tests/run.sh), resolved by pip on top (numpy: the tests'
# pin wins, the benchmark pins the same).
treq=python/tests/requirements.txt
if [ -f "$treq" ]; then
    want=$(sha256sum "$treq" | cut -d' ' -f1)
    if [ "$(cat "$venv/.test-requirements" 2>/dev/null)" != "$want" ]; then
        echo "venv: installing $treq into $venv" >&2
        pip_install -r "$treq"
        echo "$want" >"$venv/.test-requirements"
    fi
fi

if [ -f python/pyproject.toml ]; then
    # The package's sources, and this tree's C sources it builds (python/csrc links to
    # them: the links themselves are skipped).
    want=$({ git ls-files -co --exclude-standard python client-lib proto daemon tools 2>/dev/null ||
        find python client-lib proto daemon tools -type f -not -path '*/build/*'; } | sort |
        while IFS= read -r f; do [ -L "$f" ] || [ ! -f "$f" ] || cat "$f"; done | sha256sum | cut -d' ' -f1)
    if [ "$(cat "$venv/.shmref" 2>/dev/null)" != "$want" ]; then
        echo "bench venv: installing ./python (shmref) into $venv" >&2
        pip_install --no-deps --force-reinstall ./python
        echo "$want" >"$venv/.shmref"
    fi
else
    rm -f "$venv/.shmref"
fi
