#!/bin/sh
# SPDX-License-Identifier: MIT
# skew-previous.sh SOURCE COMMIT OUT: builds shmrefd as of COMMIT (the last commit of the
# previous protocol version) into OUT/build/bin/shmrefd, for integration-skew. The source
# comes from git history (git archive: the checkout is not touched); kept while COMMIT is
# the same. Exits 77 (skipped) when SOURCE has no git history holding COMMIT.
set -eu
src=$1 commit=$2 out=$3
if [ -x "$out/build/bin/shmrefd" ] && [ "$(cat "$out/commit" 2>/dev/null)" = "$commit" ]; then
    exit 0
fi
if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "skew-previous: $src has no git history with $commit: skipped"
    exit 77
fi
rm -rf "$out"
mkdir -p "$out/src"
git -C "$src" archive "$commit" | tar -x -C "$out/src"
cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHMREF_TESTS=OFF >"$out/configure.log" 2>&1 ||
    { cat "$out/configure.log"; exit 1; }
cmake --build "$out/build" --target shmrefd -j2 >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
echo "$commit" >"$out/commit"
echo "skew-previous: shmrefd of $commit built in $out/build/bin"
