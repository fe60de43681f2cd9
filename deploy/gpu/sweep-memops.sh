#!/usr/bin/env bash
# GEMV, transpose and reduce on a GPU machine, from the bundle that
# deploy/gpu/make-bundle.sh makes (this script travels in its bin/):
#   1. the kernel tests of the three operations (float64 references, every
#      version, odd sizes, all dtypes);
#   2. gc_sweep_memops: every case through the server's default path, every
#      version forced, and the vendor in the same run;
#   3. torch_vendor.py: PyTorch's times for the cases no vendor library runs,
#      the merged results and the markdown table.
# Logs, sweep-memops.json (raw), sweep-memops-merged.json and sweep-memops.md
# go to $OUT; the summary by class is printed last. SKIP_TESTS=1 leaves out
# part 1; SWEEP_ARGS passes flags to gc_sweep_memops (e.g. --filter=gemv).
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-sweep}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in kernels_gemv_test kernels_reduce_test kernels_transpose_test; do
    if "$bundle/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; then
      echo "$t: passed ($(grep -c '^\[       OK \]' "$OUT/$t.log" || true) listed OK)"
    else
      echo "$t: FAILED"; grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$t.log" | head -20
      status=1
    fi
    tail -3 "$OUT/$t.log"
  done
fi
"$bundle/bin/gc_sweep_memops" --json="$OUT/sweep-memops.json" ${SWEEP_ARGS:-} \
  >"$OUT/sweep-memops.txt" 2>"$OUT/sweep-memops.err" || status=1
tail -40 "$OUT/sweep-memops.txt"
grep -E 'WRONG|error|INVALID|INTERNAL' "$OUT/sweep-memops.err" | head -20
python3 "$bundle/bin/torch_vendor.py" "$OUT/sweep-memops.json" --out "$OUT/sweep-memops-merged.json" \
  --md "$OUT/sweep-memops.md" >"$OUT/summary.txt" 2>"$OUT/torch.err" || status=1
tail -5 "$OUT/torch.err"
cat "$OUT/summary.txt"
exit $status
