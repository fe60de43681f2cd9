#!/usr/bin/env bash
# Measures the data path on a GPU machine, from the bundle that
# deploy/gpu/make-bundle.sh makes (this script travels in its bin/): what a
# client on the same host gets, over loopback, through the server's whole
# path. Each figure below is a target of the data-path work.
#   1. GEMM 8192^3 bf16 on resident operands with a resident result: p50
#      against the kernel time the server measured for it (metrics);
#   2. GEMM 64^3 on resident operands at concurrency 1: p50;
#   3. inline (non-resident) GEMM 8192^3 bf16: p50, as the client sends it
#      (operands over parallel streams) and as one unary message;
#   4. upload and download of 1 GiB on 1 stream and on 8;
#   5. host-to-device staging inside the server (copy bytes over copy time,
#      from the metrics);
#   6. batch jobs over the Batch stream on resident operands, 1 GPU against
#      all: 1000 GEMMs 2048^3 bf16, and causal attention 4x32/8x2048^2x128;
#   7. server RSS over 1000 consecutive uploads and downloads of 256 MiB.
# Logs and data-path.json go to $OUT; a table is printed last. SKIP_BATCH=1
# and SKIP_RSS=1 leave out parts 6 and 7; ONLY_BATCH=1 leaves out parts 1-5.
# SERVER_ARGS and CLI_ARGS are added to every server's and command's flags.
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-data-path}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
server="$bundle/bin/gpucompute-server"
cli="$bundle/bin/gpucompute"
work=$(mktemp -d)
results="$OUT/data-path.tsv"
: >"$results"
ngpu=$(nvidia-smi -L | wc -l)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$gpu x$ngpu, $(date -u +%FT%TZ)" >"$OUT/host.txt"
nproc >>"$OUT/host.txt"

start_server() {  # name, args...
  local name=$1
  shift
  "$server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --ready_file="$work/$name.json" \
    --max_message_bytes=2000000000 --max_inflight_bytes=0 ${SERVER_ARGS:-} "$@" >"$OUT/server-$name.log" 2>&1 &
  echo $! >"$work/$name.pid"
  for _ in $(seq 1 600); do [ -s "$work/$name.json" ] && return; sleep 0.1; done
}
port() { sed -E 's/.*"grpc_port": *([0-9]+).*/\1/' "$work/$1.json"; }
mport() { sed -E 's/.*"metrics_port": *([0-9]+).*/\1/' "$work/$1.json"; }
scrape() {  # name -> metrics text on stdout
  python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$(mport "$1")/metrics').read().decode())"
}
cli_on() {  # name, label, cli args... (output in $work/label.txt); PIN: cores for the CLI
  local name=$1 label=$2
  shift 2
  ${PIN:+taskset -c $PIN} "$cli" --server=127.0.0.1:$(port "$name") --timeout=600s --max_message_bytes=2000000000 \
    ${CLI_ARGS:-} "$@" \
    >"$work/$label.txt" 2>&1
  local rc=$?
  { echo "== $label rc=$rc: $*"; cat "$work/$label.txt"; } >>"$OUT/cli.log"
  return $rc
}
# The p50 (ms) and requests/s of the first row of a bench table.
p50_of() { awk '/p50 ms/{getline; print $3; exit}' "$work/$1.txt"; }
rps_of() { awk '/p50 ms/{getline; print $2; exit}' "$work/$1.txt"; }
gbs_of() { sed -nE 's/.*: ([0-9.]+) GB\/s per transfer at p50.*/\1/p' "$work/$1.txt" | head -1; }
record() { printf '%s\t%s\n' "$1" "$2" | tee -a "$results"; }
# Mean of a histogram's observations: name, label filter, metrics file.
hist_mean() {
  python3 - "$1" "$2" "$3" <<'PY'
import re, sys
name, want, path = sys.argv[1:4]
s = c = 0.0
for line in open(path):
    m = re.match(r'(\w+)\{([^}]*)\} (\S+)', line)
    if not m or want not in m.group(2):
        continue
    if m.group(1) == name + '_sum':
        s += float(m.group(3))
    elif m.group(1) == name + '_count':
        c += float(m.group(3))
print(f"{s / c * 1e3:.4f}" if c else "nan")
PY
}

start_server one --backend=cuda --devices=0
start_server all --backend=cuda

if [ "${ONLY_BATCH:-0}" != 1 ]; then
# 1-3. GEMM latency on one GPU.
cli_on one gemm8k_resident bench gemm --m=8192 --n=8192 --k=8192 --dtype=bfloat16 --resident \
  --requests=30 --warmup=3 --concurrency=1
scrape one >"$work/m1.txt"
record "gemm8192_bf16_resident_p50_ms" "$(p50_of gemm8k_resident)"
record "gemm8192_bf16_kernel_mean_ms" \
  "$(hist_mean gpucompute_kernel_duration_seconds 'op="gemm"' "$work/m1.txt")"
cli_on one gemm64_resident bench gemm --m=64 --n=64 --k=64 --dtype=float32 --resident \
  --requests=2000 --warmup=100 --concurrency=1
record "gemm64_resident_p50_ms" "$(p50_of gemm64_resident)"
record "gemm64_echo_p50_ms" "$(awk '/^echo /{print $3; exit}' "$work/gemm64_resident.txt")"
# Where a 64^3 call's time goes: the mean of each stage over these calls
# (the difference of two scrapes), in microseconds.
scrape one >"$work/m1b.txt"
python3 - "$work/m1.txt" "$work/m1b.txt" <<'PY' | while read -r k v; do record "$k" "$v"; done
import re, sys
def read(path):
    t = {}
    for line in open(path):
        m = re.match(r'gpucompute_stage_duration_seconds_(sum|count)\{stage="(\w+)"\} (\S+)', line)
        if m:
            t[(m.group(2), m.group(1))] = float(m.group(3))
    return t
a, b = read(sys.argv[1]), read(sys.argv[2])
for stage in sorted({k[0] for k in b}):
    c = b.get((stage, 'count'), 0) - a.get((stage, 'count'), 0)
    s = b.get((stage, 'sum'), 0) - a.get((stage, 'sum'), 0)
    if c > 0:
        print(f"gemm64_stage_{stage}_mean_us {s / c * 1e6:.1f}")
PY
# The same with the server's threads on cores 0-7 and the client's on 8-11
# (what waking threads on other cores, far apart, costs the round trip).
if [ "$(nproc)" -ge 12 ] && command -v taskset >/dev/null; then
  taskset -a -p -c 0-7 "$(cat "$work/one.pid")" >/dev/null
  PIN=8-11 cli_on one gemm64_pinned bench gemm --m=64 --n=64 --k=64 --dtype=float32 --resident \
    --requests=2000 --warmup=100 --concurrency=1
  record "gemm64_resident_pinned_p50_ms" "$(p50_of gemm64_pinned)"
  record "gemm64_echo_pinned_p50_ms" "$(awk '/^echo /{print $3; exit}' "$work/gemm64_pinned.txt")"
  taskset -a -p -c 0-$(($(nproc) - 1)) "$(cat "$work/one.pid")" >/dev/null
fi
cli_on one gemm8k_inline bench gemm --m=8192 --n=8192 --k=8192 --dtype=bfloat16 \
  --requests=10 --warmup=2 --concurrency=1
record "gemm8192_bf16_inline_p50_ms" "$(p50_of gemm8k_inline)"
# The same call as one unary message (the client's offload to parallel
# streams turned off).
cli_on one gemm8k_message bench gemm --m=8192 --n=8192 --k=8192 --dtype=bfloat16 \
  --requests=10 --warmup=2 --concurrency=1 --offload_min_bytes=0
record "gemm8192_bf16_one_message_p50_ms" "$(p50_of gemm8k_message)"
scrape one >"$work/m2.txt"
python3 - "$work/m2.txt" <<'PY' | while read -r k v; do record "$k" "$v"; done
import re, sys
t = {}
for line in open(sys.argv[1]):
    m = re.match(r'gpucompute_transfer_(bytes_total|duration_seconds_sum)\{([^}]*)\} (\S+)', line)
    if m:
        d = re.search(r'direction="(\w+)"', m.group(2)).group(1)
        t[(m.group(1), d)] = t.get((m.group(1), d), 0.0) + float(m.group(3))
for d in ("host_to_device", "device_to_host"):
    b, s = t.get(("bytes_total", d), 0), t.get(("duration_seconds_sum", d), 0)
    print(f"staging_{d}_GBps {b / s / 1e9 if s else float('nan'):.2f}")
PY
cp "$work/m2.txt" "$OUT/metrics-one.txt"

# 4. Upload and download of 1 GiB.
for s in 1 8; do
  cli_on one up_$s bench upload --bytes=1073741824 --requests=5 --warmup=1 --streams=$s
  record "upload_1GiB_${s}_streams_GBps" "$(gbs_of up_$s)"
  cli_on one down_$s bench download --bytes=1073741824 --requests=5 --warmup=1 --streams=$s
  record "download_1GiB_${s}_streams_GBps" "$(gbs_of down_$s)"
done
fi

# 6. Batch jobs on resident operands: one GPU, then all, over one Batch
# stream and over several (each on a connection of its own; the CLI runs an
# untimed warm-up job over the same streams first). Each job runs three
# times and the median rate is recorded. Per job: each device's shards and
# mean kernel time (CUDA events: a kernel queued behind another lane's counts
# its wait), the server's CPU cores in use, and the client's. A job of 64^3
# GEMMs, and one of 8^3 GEMMs on the CPU backend, measure what the streams
# carry with (almost) no device work.
cpu_of() { awk '{print $14 + $15}' "/proc/$(cat "$work/$1.pid")/stat"; }  # ticks
batch_job() {  # server name, label, cli args...
  local name=$1 label=$2
  shift 2
  local rates=() r
  scrape "$name" >"$work/b0.txt"
  local cpu0 t0 t1
  cpu0=$(cpu_of "$name")
  t0=$(date +%s.%N)
  for rep in 1 2 3; do
    TIMEFORMAT='%R %U %S'
    { time cli_on "$name" "${label}_$rep" bench "$@" --resident --mode=batch; } 2>>"$work/$label.time"
    rates+=("$(rps_of "${label}_$rep")")
  done
  t1=$(date +%s.%N)
  scrape "$name" >"$work/b1.txt"
  r=$(printf '%s\n' "${rates[@]}" | sort -g | sed -n 2p)
  record "${label}_req_per_s" "$r"
  record "${label}_req_per_s_runs" "$(echo "${rates[@]}" | tr ' ' ,)"
  python3 - "$work/b0.txt" "$work/b1.txt" "$t0" "$t1" "$(cpu_of "$name")" "$cpu0" \
    "$(getconf CLK_TCK)" "$work/$label.time" "$label" <<'PY' | while read -r k v; do record "$k" "$v"; done
import re, sys
a_path, b_path, t0, t1, c1, c0, tck, times, label = sys.argv[1:10]
def read(path):
    t = {}
    for line in open(path):
        m = re.match(r'gpucompute_kernel_duration_seconds_(sum|count)\{([^}]*)\} (\S+)', line)
        if m:
            d = re.search(r'device="(\d+)"', m.group(2)).group(1)
            t[(d, m.group(1))] = t.get((d, m.group(1)), 0.0) + float(m.group(3))
    return t
a, b = read(a_path), read(b_path)
wall = float(t1) - float(t0)
shards = 0
for d in sorted({k[0] for k in b}):
    s = b.get((d, 'sum'), 0) - a.get((d, 'sum'), 0)
    c = b.get((d, 'count'), 0) - a.get((d, 'count'), 0)
    shards += c
    if c:
        print(f"{label}_device{d}_shards {c:.0f}")
        print(f"{label}_device{d}_kernel_mean_us {s / c * 1e6:.1f}")
        print(f"{label}_device{d}_kernel_busy_pct {100 * s / wall:.1f}")
rows = [l.split() for l in open(times) if len(l.split()) == 3]
real = sum(float(r[0]) for r in rows)
cpu = sum(float(r[1]) + float(r[2]) for r in rows)
print(f"{label}_server_cpu_cores {(float(c1) - float(c0)) / float(tck) / wall:.2f}")
print(f"{label}_client_cpu_cores {cpu / real:.2f}")
PY
}
if [ "${SKIP_BATCH:-0}" != 1 ]; then
  # One 2048^3 GEMM alone on a GPU: the device time a batch item costs (the
  # shard timing's kernel milliseconds of the last of 20 calls).
  cli_on one gemm2048_alone gemm --m=2048 --n=2048 --k=2048 --dtype=bfloat16 --resident --repeat=20
  record "gemm2048_bf16_alone_shard" "$(grep -E '^ *0 ' "$work/gemm2048_alone.txt" | tr -s ' ' | head -1)"
fi
# BATCH_STREAMS: the stream counts of the GEMM jobs (the last also runs the
# 5000-item job); BATCH_CONCURRENCY: their requests outstanding.
batch_streams=${BATCH_STREAMS:-1 4 8}
most_streams=${batch_streams##* }
bc=${BATCH_CONCURRENCY:-64}
for name in $([ "${SKIP_BATCH:-0}" = 1 ] || echo one all); do
  for st in $batch_streams; do
    batch_job $name batch_gemm2048_bf16_s${st}_$name gemm --m=2048 --n=2048 --k=2048 \
      --dtype=bfloat16 --requests=1000 --warmup=200 --concurrency=$bc --streams=$st
  done
  batch_job $name batch_gemm2048_bf16_s${most_streams}_5k_$name gemm --m=2048 --n=2048 \
    --k=2048 --dtype=bfloat16 --requests=5000 --warmup=200 --concurrency=$bc \
    --streams=$most_streams
  batch_job $name batch_attention_s1_$name attention --batch=4 --heads_q=32 --heads_kv=8 \
    --seq_q=2048 --seq_kv=2048 --head_dim=128 --causal --dtype=bfloat16 \
    --requests=200 --warmup=10 --concurrency=16 --streams=1
  batch_job $name batch_gemm64_s${most_streams}_$name gemm --m=64 --n=64 --k=64 \
    --dtype=float32 --requests=20000 --warmup=200 --concurrency=$bc --streams=$most_streams
done
if [ "${SKIP_BATCH:-0}" != 1 ]; then
  # What Batch streams carry on this host with no device work at all: the
  # CPU backend, 8^3 GEMMs, over one stream and over more.
  start_server cpu --backend=cpu --cpu_devices=1
  for st in 1 $most_streams 16; do
    batch_job cpu batch_gemm8_cpu_s$st gemm --m=8 --n=8 --k=8 --dtype=float32 \
      --requests=20000 --warmup=20 --concurrency=64 --streams=$st
  done
  scrape all >"$OUT/metrics-all.txt"
fi

# 7. RSS over 1000 uploads and 1000 downloads of 256 MiB (sampled every
# 0.5 s; the first 10% of each loop is warm-up).
pid=$(cat "$work/one.pid")
for op in $([ "${SKIP_RSS:-0}" = 1 ] || echo upload download); do
  (while kill -0 "$pid" 2>/dev/null; do
     echo "$(date +%s.%N) $(awk '/VmRSS/{print $2}' /proc/$pid/status)"; sleep 0.5
   done) >"$work/rss-$op.txt" &
  sampler=$!
  cli_on one rss_$op bench $op --bytes=268435456 --requests=1000 --warmup=20 --streams=1
  kill $sampler 2>/dev/null
  python3 - "$work/rss-$op.txt" <<PY | while read -r k v; do record "$k" "$v"; done
import sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 2]
kb = [int(r[1]) for r in rows][len(rows) // 10:]
lo, hi = min(kb), max(kb)
print(f"rss_{'$op'}_256MiB_x1000_min_MiB {lo / 1024:.0f}")
print(f"rss_{'$op'}_256MiB_x1000_max_MiB {hi / 1024:.0f}")
print(f"rss_{'$op'}_256MiB_x1000_spread_pct {100 * (hi - lo) / lo:.1f}")
PY
done

for f in "$work"/*.pid; do kill -TERM "$(cat "$f")" 2>/dev/null; done
wait
python3 - "$results" "$OUT/data-path.json" "$OUT/host.txt" <<'PY'
import json, sys
rows = [l.rstrip('\n').split('\t') for l in open(sys.argv[1]) if '\t' in l]
host = open(sys.argv[3]).read().split('\n')
json.dump({"host": host[0], "cores": host[1], "results": {k: v for k, v in rows}},
          open(sys.argv[2], "w"), indent=1)
PY
(cd "$OUT" && tar czf logs.tgz server-*.log && rm -f server-*.log)
echo "== data path ($(cat "$OUT/host.txt" | head -1))"
cat "$results"
