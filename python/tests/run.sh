#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh: the Python suite, as ctest's "python" entry runs it. Makes (once) the project's
# venv (build/venv, bench/python/venv.sh) with the `python3` on PATH (pyenv's CPython 3.11
# on the project's machines), installs the pinned requirements, installs ./python the way a user
# does (`pip install ./python`: PEP 517, isolated build), then runs pytest against the
# given shmrefd (each test module starts its own on a temporary socket).
# Usage: run.sh SOURCE_DIR BUILD_DIR SHMREFD SHMREFCTL
set -euo pipefail
src=$1 build=$2 shmrefd=$3 shmrefctl=$4
# The project's one venv (tests, docs check, benchmarks): $SHMREF_VENV, else
# SOURCE_DIR/build/venv also for build-asan (the extension is never built with sanitizers).
venv=${SHMREF_VENV:-$src/build/venv}
command -v python3 >/dev/null || { echo "no python3 on PATH: the Python suite needs CPython >= 3.9 with venv"; exit 1; }
# Made or brought up to date (pins, then ./python when its sources changed).
"$src/bench/python/venv.sh" "$venv"
"$venv/bin/python" -c 'import shmref, torch, numpy; print("shmref", shmref.__version__, "numpy", numpy.__version__, "torch", torch.__version__)'
echo "pytest against $shmrefd (the extension itself is always built without sanitizers)"
export SHMREFD_BIN=$shmrefd SHMREFCTL_BIN=$shmrefctl
cd "$src/python/tests"
exec "$venv/bin/python" -m pytest -p no:cacheprovider --timeout=300 -q -rs .
