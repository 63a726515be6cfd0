#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-spdx.sh: the tree is MIT-licensed and says so: LICENSE holds the MIT text and the
# copyright notice, and every tracked source file carries an SPDX-License-Identifier
# line (scripts/spdx-add --check). scripts/spdx-add itself is checked in a throwaway
# copy of the tree: after it runs, the check passes, a second run changes nothing,
# #! lines stay first and every file only gained its one line.
# Usage: test-spdx.sh SOURCE_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
. "$src/tests/lib.sh"
test_begin spdx

check "LICENSE is the MIT license" grep -q '^Permission is hereby granted, free of charge' "$src/LICENSE"
check "LICENSE carries the copyright notice" \
    grep -qx 'Copyright (c) 2026 The shmrefd authors' "$src/LICENSE"

"$src/scripts/spdx-add" --check "$src" >"$tmp/check.out" 2>&1; rc=$?
check "every tracked source file has an SPDX-License-Identifier line" test "$rc" = 0
[ "$rc" = 0 ] || sed -e 's/^/    | /' "$tmp/check.out" | tail -n 20

# The throwaway copy: the tracked files as they are in the working tree, in a fresh repo.
copy=$tmp/tree
mkdir "$copy"
(cd "$src" && git ls-files -z | xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$copy"
(cd "$copy" && git init -q && git add -A) >/dev/null 2>&1
cp -a "$copy" "$tmp/before"
"$src/scripts/spdx-add" "$copy" >"$tmp/add.out" 2>&1; rc=$?
check "scripts/spdx-add runs" test "$rc" = 0
check "after it, the check passes" "$src/scripts/spdx-add" --check "$copy"
"$src/scripts/spdx-add" "$copy" >"$tmp/again.out" 2>&1
check "a second run changes nothing" test ! -s "$tmp/again.out"

only_one_line_added() {
    local f bad=0 n
    while IFS= read -r f; do
        f=${f#added: }
        n=$(diff "$tmp/before/$f" "$copy/$f" | grep -c '^>')
        if [ "$n" != 1 ] || diff "$tmp/before/$f" "$copy/$f" | grep -q '^<'; then
            echo "    | $f: not exactly one added line"; bad=1
        fi
        if head -n 1 "$tmp/before/$f" | grep -q '^#!' && ! head -n 1 "$copy/$f" | grep -q '^#!'; then
            echo "    | $f: the #! line is no longer first"; bad=1
        fi
        if ! head -n 2 "$copy/$f" | grep -q 'SPDX-License-Identifier: MIT'; then
            echo "    | $f: the identifier is not in the first two lines"; bad=1
        fi
    done <"$tmp/add.out"
    return $bad
}
check "each changed file gained exactly one line, after any #! line" only_one_line_added
check "shell scripts still parse" bash -c 'for f in "$1"/scripts/run "$1"/scripts/test "$1"/tests/lib.sh; do bash -n "$f" || exit 1; done' _ "$copy"
check "C sources still start with a comment" bash -c 'head -n 1 "$1/client-lib/session.c" | grep -qx "/\* SPDX-License-Identifier: MIT \*/"' _ "$copy"

test_end
