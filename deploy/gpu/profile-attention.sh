#!/usr/bin/env bash
# Nsight Compute on attention cases, ours beside PyTorch SDPA's cuDNN and
# FlashAttention-2 on the same inputs, from the bundle that
# deploy/gpu/make-bundle.sh makes (this script travels in its bin/, with
# attention_profile.py, attention_sdpa.py and lib/libgc_kernels_capi.so):
#   CASES="B128,H32,S128,D64 B8,H16,S2048,D128,causal"   (attention_profile.py's
#                     case syntax; these two by default)
#   VARIANTS="flash_wgmma_overlap flash_mma"  our versions (default: the default)
#   NCU_SET=full      the ncu section set
# First each launch's median device time without the profiler (times.txt),
# then one profiled launch of each (attention.ncu-rep, details.txt, raw.csv).
# Prints the times and a table of the profiled launches last.
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-profile}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
NCU=${NCU:-/usr/local/cuda/bin/ncu}
args=(--lib "$bundle/lib/libgc_kernels_capi.so")
for c in ${CASES:-B128,H32,S128,D64 B8,H16,S2048,D128,causal}; do args+=(--case "$c"); done
for v in ${VARIANTS:-}; do args+=(--variant "$v"); done
status=0
python3 "$bundle/bin/attention_profile.py" "${args[@]}" >"$OUT/times.txt" 2>&1 || status=1
"$NCU" --clock-control none --profile-from-start off --nvtx --set "${NCU_SET:-full}" -f \
  -o "$OUT/attention" python3 "$bundle/bin/attention_profile.py" "${args[@]}" \
  >"$OUT/ncu.log" 2>&1 || { status=1; tail -20 "$OUT/ncu.log"; }
"$NCU" -i "$OUT/attention.ncu-rep" --print-nvtx-rename kernel --page details \
  >"$OUT/details.txt" 2>&1 || status=1
"$NCU" -i "$OUT/attention.ncu-rep" --print-nvtx-rename kernel --page raw --csv >"$OUT/raw.csv" 2>&1 || status=1
cat "$OUT/times.txt"
python3 - "$OUT/raw.csv" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3:
    sys.exit("no profiled launches")
head, units, data = rows[0], rows[1], rows[2:]
col = {name: i for i, name in enumerate(head)}
time_scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}
want = [("gpu__time_duration.sum", "us", None),
        ("dram__bytes.sum.per_second", "TB/s", 1),
        ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "dram%", 1),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm%", 1),
        ("smsp__inst_executed.sum", "Minst", 1e-6),
        ("smsp__average_warps_issue_stalled_wait_per_issue_active.ratio", "st.wait", 1),
        ("smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio", "st.bar", 1),
        ("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "st.lsb", 1),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "occ%", 1),
        ("launch__grid_size", "grid", 1), ("launch__registers_per_thread", "regs", 1),
        ("launch__shared_mem_per_block_dynamic", "smem", 1)]
want = [w for w in want if w[0] in col]
name = col.get("Kernel Name")
print("%-60s" % "launch" + "".join("%9s" % w[1] for w in want))
for r in data:
    label = r[name][:60] if name is not None else "?"
    vals = []
    for metric, _, scale in want:
        if scale is None:
            scale = time_scale.get(units[col[metric]], 1.0)
        try:
            vals.append("%9.2f" % (float(r[col[metric]].replace(",", "")) * scale))
        except ValueError:
            vals.append("%9s" % r[col[metric]][:8])
    print("%-60s" % label + "".join(vals))
EOF
exit $status
