#!/usr/bin/env bash
# GEMM on a GPU machine, from the bundle that deploy/gpu/make-bundle.sh makes
# (this script travels in its bin/):
#   1. the GEMM kernel tests (float64 references, every rung, the dispatcher's
#      default and the cuBLASLt fallback, odd sizes, all dtypes);
#   2. gc_sweep_gemm: every case through the server's default path, every
#      version forced, cuBLAS in the same run;
#   3. gemm_table.py: the markdown table and the summary by class.
# Logs, sweep-gemm.json (raw) and sweep-gemm.md go to $OUT; the summary is
# printed last. SKIP_TESTS=1 leaves out part 1; SWEEP_ARGS passes flags to
# gc_sweep_gemm (e.g. --filter=thin_m, --no-variants; --random=60 for 60
# random shapes of its classes instead of its list, the seed in the command;
# --case=8192x5700x32,tf32 --case=... for shapes of one's own; --l2=warm to
# time without flushing L2 before each run).
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-sweep}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in kernels_gemm_tc_test kernels_gemm_simt_test; do
    if "$bundle/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; then
      echo "$t: passed ($(grep -c '^\[       OK \]' "$OUT/$t.log" || true) listed OK)"
    else
      echo "$t: FAILED"; grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$t.log" | head -20
      status=1
    fi
    tail -3 "$OUT/$t.log"
  done
fi
"$bundle/bin/gc_sweep_gemm" --json="$OUT/sweep-gemm.json" ${SWEEP_ARGS:-} \
  >"$OUT/sweep-gemm.txt" 2>"$OUT/sweep-gemm.err" || status=1
grep -E 'WRONG|error|INVALID|INTERNAL' "$OUT/sweep-gemm.err" | head -20
python3 "$bundle/bin/gemm_table.py" "$OUT/sweep-gemm.json" --md "$OUT/sweep-gemm.md" \
  >"$OUT/summary.txt" 2>"$OUT/table.err" || status=1
tail -5 "$OUT/table.err"
cat "$OUT/summary.txt"
exit $status
