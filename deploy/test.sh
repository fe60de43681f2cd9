#!/usr/bin/env bash
# Runs every test of a built preset (default: release) with CTest. When some
# fail, what each failed test printed last is shown again at the end, after
# CTest's summary, so that the reason stands at the bottom of a long log.
#   deploy/test.sh [PRESET] [CTEST ARGS...]
# Environment: TEST_TAIL_LINES (default 30) lines per failed test, at most
# TEST_TAIL_TESTS (default 5) failed tests.
set -uo pipefail
cd "$(dirname "$0")/.."
preset=release
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then  # a first argument that is not a flag
  preset="$1"
  shift
fi
ctest --preset "$preset" "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0

dir="build/$preset"  # every preset's binaryDir (CMakePresets.json)
log="$dir/Testing/Temporary/LastTest.log"
failed="$dir/Testing/Temporary/LastTestsFailed.log"
if [ ! -f "$log" ] || [ ! -f "$failed" ]; then
  echo "test.sh: no $log or $failed to show the failures from" >&2
  exit "$rc"
fi
lines="${TEST_TAIL_LINES:-30}"
echo
echo "== what the failed tests printed last (of $(wc -l < "$failed") failed; $log has all) =="
head -n "${TEST_TAIL_TESTS:-5}" "$failed" | while IFS= read -r entry; do
  name="${entry#*:}"
  echo "---- $name: last $lines lines ----"
  # A test's block: "N/M Test: NAME", ..., "Output:", a rule, its output,
  # "<end of output>".
  awk -v name="$name" '
    $0 ~ /^[0-9]+\/[0-9]+ Test: / { sub(/^[0-9]+\/[0-9]+ Test: /, ""); mine = ($0 == name); state = 0; next }
    mine && state == 0 && $0 == "Output:" { state = 1; next }
    mine && state == 1 { state = 2; next }
    mine && state == 2 && $0 == "<end of output>" { state = 3; next }
    mine && state == 2 { print }
  ' "$log" | tail -n "$lines"
done
exit "$rc"
