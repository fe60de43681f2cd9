#!/usr/bin/env bash
# A short multi-GPU check from the bundle (deploy/gpu/make-bundle.sh): the
# operations whose multi-GPU paths differ from one GPU (attention heads split
# over devices, reduce partials by chunk), against the float64 reference, and
# the reduce kernel time on 1 and 2 GPUs. Output: $OUT/check.log.
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-check}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
log="$OUT/check.log"
for name in one all; do
  args=(--backend=cuda)
  [ $name = one ] && args+=(--devices=0)
  "$bundle/bin/gpucompute-server" --listen=127.0.0.1:0 --metrics_listen= --ready_file="$work/$name.json" \
    --max_message_bytes=2000000000 "${args[@]}" >"$work/$name.log" 2>&1 &
done
for name in one all; do
  for _ in $(seq 1 300); do [ -s "$work/$name.json" ] && break; sleep 0.1; done
done
port() { sed -E 's/.*"grpc_port": *([0-9]+).*/\1/' "$work/$1.json"; }
cli() { "$bundle/bin/gpucompute" --server=127.0.0.1:$(port "$1") --timeout=120s --max_message_bytes=2000000000 "${@:2}"; }
ok=0
total=0
for name in one all; do
  for c in "attention --batch=2 --heads_q=8 --heads_kv=2 --seq_q=1000 --seq_kv=1000 --head_dim=128 --causal --dtype=bfloat16 --lse" \
           "attention --batch=1 --heads_q=6 --heads_kv=2 --seq_q=77 --seq_kv=300 --head_dim=64 --dtype=float32 --lse" \
           "attention --batch=1 --heads_q=1 --heads_kv=1 --seq_q=4097 --seq_kv=4097 --head_dim=64 --causal --dtype=float16" \
           "reduce --shape=10000019 --op=sum --dtype=float32" \
           "reduce --shape=3,1000003 --axis=1 --op=mean --dtype=bfloat16" \
           "reduce --shape=100000,33 --axis=0 --op=max --dtype=float16"; do
    total=$((total + 1))
    if cli $name $c --check >>"$log" 2>&1; then ok=$((ok + 1)); else echo "FAILED [$name] $c" | tee -a "$log"; fi
  done
done
echo "checked against the float64 reference on 1 and 2 GPUs: $ok/$total passed" | tee -a "$log"
for name in one all; do
  echo "reduce 2^28 fp32 sum [$name]:" | tee -a "$log"
  cli $name reduce --shape=268435456 --op=sum --dtype=float32 --repeat=3 2>&1 | grep -E 'latency|^  [0-9]' | tee -a "$log"
done
kill $(jobs -p) 2>/dev/null
wait
