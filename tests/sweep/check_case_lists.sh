#!/usr/bin/env bash
# The sweeps' case lists, without a GPU: the listed cases, and the random
# shapes of --random (the same for one seed, others for another, every one
# within the sweep's bounds: each operand at most 1 GiB, at most 2 TFLOP).
#   check_case_lists.sh GC_SWEEP_ATTENTION GC_SWEEP_GEMM GC_SWEEP_MEMOPS
set -euo pipefail
attn=$1 gemm=$2 memops=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

for bin in "$attn" "$gemm"; do
  n=$("$bin" --list | wc -l)
  [ "$n" -ge 100 ] || fail "$bin --list: $n cases"
  ! "$bin" --list | grep -q '^rnd_' || fail "$bin --list names random cases"
  a=$("$bin" --list --random=300 --seed=11)
  [ "$a" = "$("$bin" --list --random=300 --seed=11)" ] || fail "$bin: one seed, two lists"
  [ "$a" != "$("$bin" --list --random=300 --seed=12)" ] || fail "$bin: two seeds, one list"
  [ "$(grep -c '^rnd_' <<<"$a")" -eq 300 ] || fail "$bin --random=300: not 300 random cases"
  [ "$("$bin" --list --random=300 --seed=11 --filter=rnd_decode | wc -l)" -eq \
    "$(grep -c '^rnd_decode' <<<"$a")" ] || fail "$bin: --filter not applied to --list"
done

# Attention: "rnd_CLASS B<b> H<hq>[/<hkv>] (S<n>|Sq<n> Skv<n>) D<d> [causal] [lse] DTYPE".
for seed in 1 2 3; do
  "$attn" --list --random=400 --seed=$seed
done | awk '
  {
    b = substr($2, 2) + 0; split(substr($3, 2), h, "/"); hq = h[1] + 0; hkv = (2 in h) ? h[2] + 0 : hq
    if ($4 ~ /^Sq/) { sq = substr($4, 3) + 0; skv = substr($5, 4) + 0; i = 6 } else { sq = skv = substr($4, 2) + 0; i = 5 }
    d = substr($i, 2) + 0; causal = ($(i + 1) == "causal")
    pairs = causal ? (sq <= skv ? sq * (skv - sq) + sq * (sq + 1) / 2 : skv * (skv + 1) / 2) : sq * skv
    bad = ""
    if (d < 8 || d > 256 || d % 8) bad = bad " head dim"
    if (hq % hkv || hq > 64 || hkv < 1) bad = bad " heads"
    if (sq < 1 || skv < 1 || (causal && sq > skv)) bad = bad " lengths"
    if (2 * b * hq * sq * d > 2^30 || 2 * b * hkv * skv * d > 2^30) bad = bad " bytes"
    if (4 * b * hq * d * pairs > 2e12) bad = bad " flops"
    if (bad != "") { print "attention case out of bounds (" bad " ): " $0; n++ }
  }
  END { exit n > 0 }' || fail "attention --random: cases out of bounds"

# GEMM: "rnd_CLASS [<batch>*]<m>x<n>x<k> [B shared] [NT|TN|TT] [beta] IN->OUT".
for seed in 1 2 3; do
  "$gemm" --list --random=400 --seed=$seed
done | awk '
  {
    shape = $2; batch = 1
    if (index(shape, "*")) { split(shape, p, "*"); batch = p[1] + 0; shape = p[2] }
    split(shape, s, "x"); m = s[1] + 0; n = s[2] + 0; k = s[3] + 0
    shared = index($0, "B shared") > 0
    split($NF, t, "->"); es = (t[1] == "bf16" || t[1] == "f16") ? 2 : 4; eo = (t[2] == "f32") ? 4 : 2
    bad = ""
    if (m < 1 || n < 1 || k < 1 || batch < 1) bad = bad " sizes"
    if (batch * m * k * es > 2^30 || (shared ? 1 : batch) * k * n * es > 2^30 || batch * m * n * eo > 2^30) bad = bad " bytes"
    if (2 * batch * m * n * k > 2e12) bad = bad " flops"
    if (bad != "") { print "gemm case out of bounds (" bad " ): " $0; n_bad++ }
  }
  END { exit n_bad > 0 }' || fail "gemm --random: cases out of bounds"

# GEMM --case: shapes of one's own instead of the list; bad ones refused.
got=$("$gemm" --list --case=8192x5700x32,tf32 --case=4*512x150x128,TN,f16,out=f32,beta=0.5,shared_b)
[ "$got" = "case 8192x5700x32 tf32->f32
case 4*512x150x128 B shared TN beta f16->f32" ] || fail "gemm --case: listed as: $got"
for bad in 8x8 0x8x8 8x8x8,NX 8x8x8,f32,out=bf16 8x8x8,beta=x 2*8x8x8,tf32,out=tf32; do
  if "$gemm" --list --case=$bad >/dev/null 2>&1; then fail "gemm --case=$bad accepted"; fi
done
if "$gemm" --list --case=8x8x8 --random=3 >/dev/null 2>&1; then
  fail "gemm --case with --random accepted"
fi

if "$memops" --list >/dev/null 2>&1; then fail "gc_sweep_memops accepted --list"; fi
echo "case lists: ok"
