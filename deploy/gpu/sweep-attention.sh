#!/usr/bin/env bash
# Attention on a GPU machine, from the bundle that deploy/gpu/make-bundle.sh
# makes (this script travels in its bin/):
#   1. the attention kernel tests (float64 references, every version, head
#      dims 8-256, fp32 output, rows that see no key);
#   2. gc_sweep_attention: every case through the server's default path,
#      every flash version forced, sampled rows checked against float64;
#   3. attention_vendor.py: PyTorch SDPA's cuDNN and FlashAttention-2 backends
#      on the same shapes, the markdown table and the summary by class.
# Logs, sweep-attention.json (ours), sweep-attention-merged.json and
# sweep-attention.md go to $OUT; the summary is printed last. SKIP_TESTS=1
# leaves out part 1; SWEEP_ARGS passes flags to gc_sweep_attention (e.g.
# --filter=decode, --no-variants; --random=60 for 60 random shapes of its
# classes instead of its list, the seed in the command), VENDOR_ARGS to
# attention_vendor.py; COOLDOWN_MS=N to both (the GPU idles N ms before each
# timing). BASE_BIN=PATH names a second build's gc_sweep_attention (a change's
# base): it runs the same cases right after ours (sweep-attention-base.json),
# and compare_builds.py sets the two side by side against the same vendor
# times (sweep-attention-compared.json, compare.txt, printed last).
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-sweep}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  t=kernels_attention_test
  if "$bundle/bin/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1; then
    echo "$t: passed"
  else
    echo "$t: FAILED"; grep -E '^\[  FAILED  \]|Failure|error' "$OUT/$t.log" | head -20
    status=1
  fi
  tail -3 "$OUT/$t.log"
fi
cooldown=${COOLDOWN_MS:+--cooldown_ms=$COOLDOWN_MS}
"$bundle/bin/gc_sweep_attention" --json="$OUT/sweep-attention.json" $cooldown ${SWEEP_ARGS:-} \
  >"$OUT/sweep-attention.txt" 2>"$OUT/sweep-attention.err" || status=1
grep -E 'WRONG|error|INVALID|INTERNAL' "$OUT/sweep-attention.err" | head -20
tail -1 "$OUT/sweep-attention.txt"
if [ -n "${BASE_BIN:-}" ]; then
  "$BASE_BIN" --json="$OUT/sweep-attention-base.json" $cooldown ${SWEEP_ARGS:-} \
    >"$OUT/sweep-attention-base.txt" 2>"$OUT/sweep-attention-base.err" || status=1
  grep -E 'WRONG|error|INVALID|INTERNAL' "$OUT/sweep-attention-base.err" | head -20
fi
python3 "$bundle/bin/attention_vendor.py" "$OUT/sweep-attention.json" \
  --out "$OUT/sweep-attention-merged.json" --md "$OUT/sweep-attention.md" $cooldown ${VENDOR_ARGS:-} \
  >"$OUT/summary.txt" 2>"$OUT/vendor.err" || status=1
tail -5 "$OUT/vendor.err"
cat "$OUT/summary.txt"
if [ -n "${BASE_BIN:-}" ]; then
  python3 "$bundle/bin/compare_builds.py" "$OUT/sweep-attention-merged.json" \
    "$OUT/sweep-attention-base.json" --out "$OUT/sweep-attention-compared.json" \
    >"$OUT/compare.txt" 2>&1 || status=1
  cat "$OUT/compare.txt"
fi
exit $status
