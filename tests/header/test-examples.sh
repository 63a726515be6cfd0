#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test-examples.sh: the programs in shmref(3)'s EXAMPLES compile as they are printed,
# as C99 and as C++11, warnings as errors, against this tree's header and library.
# Usage: test-examples.sh SOURCE_DIR LIBSHMREF
set -uo pipefail
src=$(cd "$1" && pwd) LIB=$2
. "$src/tests/lib.sh"
test_begin examples
# Each .EX ... .EE block that includes the header, with roff escapes undone.
/usr/bin/python3 - "$src/man/shmref.3" "$tmp" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.findall(r"^\.EX\n(.*?)^\.EE\n", text, re.S | re.M)
n = 0
for b in blocks:
    if "#include <shmref/shmref.h>" not in b or "#include <uv.h>" in b:
        continue  # the libuv example is built and run by ctest example-uv-handoff
    b = b.replace("\\e", "\\").replace("\\-", "-")
    n += 1
    open("%s/example%d.c" % (sys.argv[2], n), "w").write(b)
print(n)
PY
n=$(ls "$tmp"/example*.c 2>/dev/null | wc -l)
check "shmref(3) has its producer and consumer examples" test "$n" -ge 2
for f in "$tmp"/example*.c; do
    b=$(basename "$f" .c)
    check "$b compiles and links as C99" \
        cc -std=c99 -Wall -Wextra -Werror -I"$src/client-lib/include" "$f" "$LIB" -o "$tmp/$b"
    check "$b compiles as C++11" \
        c++ -std=c++11 -Wall -Wextra -Werror -fsyntax-only -I"$src/client-lib/include" -x c++ "$f"
done
test_end
