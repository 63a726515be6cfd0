#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh: the Python suite, as ctest's "python" entry runs it. Makes (once) a venv in
# BUILD_DIR/venv with the `python3` on PATH (pyenv's CPython 3.11 on the project's
# machines), installs the pinned test requirements, installs ./python the way a user
# does (`pip install ./python`: PEP 517, isolated build), then runs pytest against the
# given shmrefd (each test module starts its own on a temporary socket).
# Usage: run.sh SOURCE_DIR BUILD_DIR SHMREFD SHMREFCTL
set -euo pipefail
src=$1 build=$2 shmrefd=$3 shmrefctl=$4
venv=$build/venv
py=${SHMREF_PYTHON:-python3}
command -v "$py" >/dev/null || { echo "no $py on PATH: the Python suite needs CPython >= 3.9 with venv"; exit 1; }
if [ ! -x "$venv/bin/python" ]; then
    echo "creating $venv with $($py -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$py" -m venv "$venv"
fi
pipq=("$venv/bin/pip" install -q --disable-pip-version-check)
"${pipq[@]}" -r "$src/python/tests/requirements.txt"
# Rebuilt every run from this checkout (the in-tree build directory is the package's own).
"${pipq[@]}" --force-reinstall --no-deps "$src/python"
"$venv/bin/python" -c 'import shmref, numpy; print("shmref", shmref.__version__, "numpy", numpy.__version__)'
echo "pytest against $shmrefd (the extension itself is always built without sanitizers)"
export SHMREFD_BIN=$shmrefd SHMREFCTL_BIN=$shmrefctl
cd "$src/python/tests"
exec "$venv/bin/python" -m pytest -p no:cacheprovider --timeout=300 -q -rs .
