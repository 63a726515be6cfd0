#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh: build a proto/ fuzz target with clang's libFuzzer (+ ASan, UBSan) and run it
# for SECONDS (default 20). Usage: run.sh SOURCE_DIR [SECONDS] [TARGET]; TARGET is proto
# (the message and descriptor decoders, the default; seeded from tests/fuzz/seeds-proto, one
# message of each v2 op) or manifest (the unit-of-work
# manifest: envelope, decoder, validation; seeded from tests/fuzz/seeds-manifest with
# tests/fuzz/manifest.dict). Exits 77 (skipped) only when clang's fuzzer runtime is not
# installed; scripts/deps.sh installs it for tests.
set -euo pipefail
src=$1 seconds=${2:-20} target=${3:-proto}
command -v clang >/dev/null || { echo "clang not installed: fuzzing skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
extra=()
case $target in
proto) sources=("$src/proto/proto.c" "$src/proto/desc.c" "$src/proto/meta.c") ;;
manifest)
    sources=("$src/proto/manifest.c" "$src/proto/proto.c")
    extra=(-dict="$src/tests/fuzz/manifest.dict") ;;
*) echo "unknown fuzz target $target"; exit 2 ;;
esac
cflags=$(pkg-config --cflags msgpack) libs=$(pkg-config --libs msgpack)
# shellcheck disable=SC2086
if ! clang -g -O1 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src/proto" $cflags "$src/tests/fuzz/fuzz-$target.c" "${sources[@]}" \
    $libs -o "$tmp/fuzz-$target" 2>"$tmp/build.log"; then
    if grep -q "libclang_rt.fuzzer\|cannot find.*fuzzer" "$tmp/build.log"; then
        echo "clang's libFuzzer runtime not installed: fuzzing skipped"; exit 77
    fi
    cat "$tmp/build.log"; exit 1
fi
mkdir -p "$tmp/corpus"
if [ "$target" = proto ]; then
    # A seed of the array metadata convention, so the fuzzer starts from a valid map.
    printf '\x86\xa6shmref\x01\xa4kind\xa5array\xa5dtype\xa3<f8\xa5shape\x92\x03\x04\xa5order\xa1C\xa4user\xc4\x02ab' \
        >"$tmp/corpus/meta-array"
fi
[ -d "$src/tests/fuzz/seeds-$target" ] && cp "$src/tests/fuzz/seeds-$target"/* "$tmp/corpus/"
"$tmp/fuzz-$target" -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=1024 -print_final_stats=1 \
    "${extra[@]}" "$tmp/corpus" 2>"$tmp/fuzz.log" || { tail -60 "$tmp/fuzz.log"; echo "1 failed: see the crash above"; exit 1; }
grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$tmp/fuzz.log"
runs=$(grep -E "^stat::number_of_executed_units" "$tmp/fuzz.log" | awk '{print $2}')
cov=$(grep -oE "cov: [0-9]+" "$tmp/fuzz.log" | tail -1 || true)
echo "fuzz-$target: $runs inputs in ${seconds}s ($cov), no finding"
echo "1 passed, 0 failed"
