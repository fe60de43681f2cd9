#!/usr/bin/env bash
# Verifies the CUDA backend on a GPU machine, from the bundle that
# deploy/gpu/make-bundle.sh makes (this script travels in its bin/;
# SKIP_SUITE=1 leaves out part 1):
#   1. the integration suite against the CUDA backend on GPU 0;
#   2. with two or more GPUs: server info (peers, calibrated weights), every
#      operation sharded over all GPUs against the float64 reference and
#      against the one-GPU result, --device_weights=1,3 shard extents,
#      kernel-time scaling and end-to-end payload throughput.
# Logs and results go to $OUT; a summary is printed last.
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-verify}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
server="$bundle/bin/gpucompute-server"
cli="$bundle/bin/gpucompute"
work=$(mktemp -d)
summary="$OUT/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
ngpu=$(nvidia-smi -L | wc -l)
note "GPUs: $ngpu ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)), $(date -u +%FT%TZ)"

# SKIP_SUITE=1 leaves out the two one-GPU parts below (the integration suite
# and the 8 GiB round trip) and runs only what needs every GPU.
if [ "${SKIP_SUITE:-0}" != 1 ]; then
# 1. The integration suite on one GPU. Sharding tests use virtual CPU devices
# and promtool is not on the GPU machine (the scraped text is checked on the
# build machine instead), so those are left out here.
GPUCOMPUTE_TEST_SERVER="$server" GPUCOMPUTE_TEST_CLI="$cli" \
  GPUCOMPUTE_TEST_SERVER_ARGS="--backend=cuda --devices=0" \
  timeout 400 "$bundle/bin/integration_test" --gtest_filter='-*Shard*:*Promtool*' \
  >"$OUT/integration-cuda-1gpu.log" 2>&1
note "integration suite, CUDA backend, 1 GPU: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/integration-cuda-1gpu.log" | tr '\n' ' ')"

# The 8 GiB round trip (upload -> transpose kept resident -> download) on GPU 0.
GPUCOMPUTE_TEST_SERVER="$server" GPUCOMPUTE_TEST_LARGE_SERVER_ARGS="--backend=cuda --devices=0" \
  timeout 300 "$bundle/bin/integration_test" --gtest_filter='ResidentLargeTest.*' \
  >"$OUT/resident-8gib.log" 2>&1
note "8 GiB resident round trip, 1 GPU: rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)|seconds|GB/s' "$OUT/resident-8gib.log" | tr '\n' ' ' | cut -c1-300)"
fi

start_server() {  # name, args...
  local name=$1
  shift
  "$server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --ready_file="$work/$name.json" \
    --max_message_bytes=2000000000 --max_inflight_bytes=16000000000 "$@" >"$OUT/server-$name.log" 2>&1 &
  echo $! >"$work/$name.pid"
}
port_of() {  # name -> grpc port (waits for the ready file)
  for _ in $(seq 1 600); do
    if [ -s "$work/$1.json" ]; then
      sed -E 's/.*"grpc_port": *([0-9]+).*/\1/' "$work/$1.json"
      return
    fi
    sleep 0.1
  done
  echo 0
}
metrics_port_of() { sed -E 's/.*"metrics_port": *([0-9]+).*/\1/' "$work/$1.json"; }

start_server one --backend=cuda --devices=0
if [ "$ngpu" -ge 2 ]; then
  start_server all --backend=cuda
  start_server w13 --backend=cuda --devices=0,1 --device_weights=1,3
fi
p1=$(port_of one)
run() {  # label, port, cli args...
  local label=$1 port=$2
  shift 2
  "$cli" --server=127.0.0.1:$port --timeout=300s --max_message_bytes=2000000000 "$@" \
    >"$work/$label.txt" 2>&1
  local rc=$?
  cat "$work/$label.txt" >>"$OUT/cli.log"
  echo "== $label rc=$rc" >>"$OUT/cli.log"
  return $rc
}

cases=(
  "gemm_f32 gemm --m=1000 --n=777 --k=333 --dtype=float32"
  "gemm_bf16 gemm --m=1000 --n=3000 --k=777 --dtype=bfloat16"
  "gemm_f16_tA gemm --m=513 --n=1024 --k=256 --dtype=float16 --transpose_a"
  "gemv_bf16 gemv --m=4097 --k=1000 --n=4 --dtype=bfloat16"
  "gemv_f32_t gemv --m=2048 --k=3000 --dtype=float32 --transpose_a"
  "reduce_rows reduce --shape=1000,4097 --axis=1 --op=sum --dtype=float32"
  "reduce_all reduce --shape=10000019 --op=max --dtype=float32"
  "reduce_mean_bf16 reduce --shape=7,100000 --op=mean --dtype=bfloat16"
  "transpose_2d transpose --shape=1000,3000 --dtype=float32"
  "transpose_4d transpose --shape=3,4,100,50 --perm=2,0,3,1 --dtype=float16"
  "attention_bf16 attention --batch=2 --heads_q=8 --heads_kv=2 --seq_q=1000 --seq_kv=1000 --head_dim=128 --causal --dtype=bfloat16 --lse"
  "attention_f16_d64 attention --batch=1 --heads_q=4 --heads_kv=4 --seq_q=17 --seq_kv=4097 --head_dim=64 --dtype=float16"
)
checked=0
failed=0
for c in "${cases[@]}"; do
  set -- $c
  label=$1
  shift
  run "$label-1gpu" "$p1" "$@" --seed=7 --check --out="$work/$label-1.npy" || failed=$((failed + 1))
  checked=$((checked + 1))
done
note "every op on 1 GPU against the float64 reference: $((checked - failed))/$checked passed"

if [ "$ngpu" -ge 2 ]; then
  pa=$(port_of all)
  pw=$(port_of w13)
  "$cli" --server=127.0.0.1:$pa info >"$OUT/info-all.txt" 2>&1
  note "server info (all GPUs): $(grep -iE 'weight|peer' "$OUT/info-all.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
  failed=0
  same=0
  for c in "${cases[@]}"; do
    set -- $c
    label=$1
    shift
    run "$label-all" "$pa" "$@" --seed=7 --check --out="$work/$label-2.npy" || failed=$((failed + 1))
    python3 - "$work/$label-1.npy" "$work/$label-2.npy" >>"$OUT/compare.txt" 2>&1 <<'PY'
import sys, numpy as np
a, b = (np.load(p) for p in sys.argv[1:3])
if a.dtype == np.uint16:  # bfloat16 bits
    a, b = ((x.astype(np.uint32) << 16).view(np.float32) for x in (a, b))
same = a.shape == b.shape and a.tobytes() == b.tobytes()
diff = float(np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.shape == b.shape else float('inf')
print(f"{sys.argv[1].split('/')[-1]}: shape {a.shape} bitwise_equal={same} max_abs_diff={diff:.3g}")
PY
    grep -q "bitwise_equal=True" <(tail -1 "$OUT/compare.txt") && same=$((same + 1))
  done
  note "every op sharded over $ngpu GPUs against the float64 reference: $((checked - failed))/$checked passed; bitwise equal to 1 GPU: $same/$checked (compare.txt)"

  # Resident operands and results over every GPU: operands land on different
  # GPUs, large operations split, and each shard reads copies made peer to peer.
  # (The reference is computed on one host core: the large cases are sized to
  # split over the GPUs and still be checked in seconds.)
  failed=0
  total=0
  for c in "${cases[@]}" "gemm_big gemm --m=4096 --n=2048 --k=1024 --dtype=bfloat16" \
           "attention_big attention --batch=2 --heads_q=16 --heads_kv=4 --seq_q=1024 --seq_kv=1024 --head_dim=128 --causal --dtype=bfloat16 --lse"; do
    set -- $c
    label=$1
    shift
    run "$label-resident" "$pa" "$@" --seed=11 --resident --check || failed=$((failed + 1))
    total=$((total + 1))
  done
  note "every op on resident operands over $ngpu GPUs against the float64 reference: $((total - failed))/$total passed; shards: $(grep -hE 'peer|rows|heads' "$work"/gemm_big-resident.txt | tr -s ' ' | head -3 | tr '\n' ';')"

  run w13 "$pw" gemm --m=4000 --n=1024 --k=1024 --dtype=bfloat16 --check
  note "--device_weights=1,3, gemm M=4000 rc=$? shards: $(grep -E 'rows' "$work/w13.txt" | tr -s ' ' | tr '\n' ';')"

  for p in "one:$p1" "all:$pa"; do
    name=${p%%:*}
    port=${p#*:}
    run "gemm16k-$name" "$port" gemm --m=16384 --n=16384 --k=16384 --dtype=bfloat16 --repeat=3
    note "gemm 16384^3 bf16 [$name]: $(grep -E 'latency|^  [0-9]' "$work/gemm16k-$name.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
    run "reduce1g-$name" "$port" reduce --shape=268435456 --op=sum --dtype=float32 --repeat=3
    note "reduce 2^28 fp32 [$name]: $(grep -E 'latency|^  [0-9]' "$work/reduce1g-$name.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
  done
  run echo1g "$pa" echo --shape=268435456 --dtype=float32 --repeat=3
  note "echo 1 GiB: $(grep -iE 'latency|GB/s' "$work/echo1g.txt" | tr -s ' ' | head -3 | tr '\n' ';')"
  run transpose1g "$pa" transpose --shape=16384,16384 --dtype=float32 --repeat=3
  note "transpose 1 GiB over $ngpu GPUs: $(grep -E 'latency|^  [0-9]' "$work/transpose1g.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
  curl -s "http://127.0.0.1:$(metrics_port_of all)/metrics" >"$OUT/metrics-all.txt" 2>/dev/null ||
    python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$(metrics_port_of all)/metrics').read().decode())" >"$OUT/metrics-all.txt"
  note "metrics scraped: $(grep -c '^gpucompute_kernel_duration_seconds_count' "$OUT/metrics-all.txt") kernel-duration series"
fi

for f in "$work"/*.pid; do kill -TERM "$(cat "$f")" 2>/dev/null; done
wait
# At most a few files travel back: the rest goes into one archive.
(cd "$OUT" && tar czf logs.tgz server-*.log topo.txt info-all.txt compare.txt cli.log 2>/dev/null &&
  rm -f server-*.log topo.txt info-all.txt compare.txt cli.log)
cat "$summary"
