#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz) with clang, and runs each for a bounded
# time on its seed corpus: what ctest runs in the release tree.
#   tests/fuzz/run.sh build BUILD_DIR
#       configures BUILD_DIR with the fuzz preset (clang, CPU only, ASan and
#       UBSan) and builds fuzz_request, fuzz_wire and fuzz_npy
#   tests/fuzz/run.sh run BUILD_DIR TARGET [SECONDS] [LIBFUZZER_FLAGS...]
#       runs TARGET for SECONDS (default 30) from tests/fuzz/corpus/TARGET;
#       the inputs it finds go to BUILD_DIR/corpus-TARGET (the checked-in
#       corpus is only read), a failing input to BUILD_DIR/artifacts/
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
usage="usage: $0 build BUILD_DIR | run BUILD_DIR TARGET [SECONDS] [FLAGS...]"
command=${1:?$usage}
dir=${2:?$usage}
cmake=${CMAKE:-cmake}

case "$command" in
  build)
    # Debian's clang with libFuzzer and the sanitizer runtimes (packages
    # clang and libclang-rt-dev), or a message saying so.
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
      >"$probe/probe.cc"
    if ! clang++ -fsanitize=fuzzer,address,undefined "$probe/probe.cc" -o "$probe/probe" \
      2>"$probe/log"; then
      cat "$probe/log" >&2
      echo "fuzz: clang++ with libFuzzer, ASan and UBSan not usable; deploy/install-deps.sh" \
        "installs Debian's clang and libclang-rt-dev" >&2
      exit 1
    fi
    "$cmake" --preset fuzz -S "$src" -B "$dir"
    "$cmake" --build "$dir" --target fuzz_request fuzz_wire fuzz_npy -j "$(nproc)"
    ;;
  run)
    target=${3:?$usage}
    seconds=${4:-30}
    shift $(($# < 4 ? $# : 4))
    work="$dir/corpus-$target"
    rm -rf "$work"
    mkdir -p "$work" "$dir/artifacts"
    flags=(-max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048
      -print_final_stats=1 -artifact_prefix="$dir/artifacts/$target-")
    if [ -f "$src/tests/fuzz/$target.dict" ]; then flags+=(-dict="$src/tests/fuzz/$target.dict"); fi
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
    exec "$dir/tests/fuzz/$target" "${flags[@]}" "$@" "$work" "$src/tests/fuzz/corpus/$target"
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
