#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ctest bench-python-smoke: every method of the Python benchmark, a few round trips at
# 1e3 and 1e5 elements, every element of every output compared (not a benchmark).
#   bench/python/smoke.sh VENV SHMREFD
# Exits 77 (skipped) when the venv is not there (scripts/test makes it with
# bench/python/venv.sh; it may fail without PyPI); a missing package in it is a failure.
set -euo pipefail
venv=$1
shmrefd=$2
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.requirements" ]; then
    echo "SKIPPED: no benchmark venv at $venv (made by scripts/test with bench/python/venv.sh)"
    exit 77
fi
require=numpy,torch,tesseract_core,iceoryx2
[ -f "$here/../../python/pyproject.toml" ] && require=$require,shmref
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$venv/bin/python" "$here/pybench.py" --smoke --require "$require" --shmrefd "$shmrefd" \
    --json "$out/smoke.json"
