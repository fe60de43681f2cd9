#!/usr/bin/env bash
# The Python client beside the C++ CLI on a GPU machine, from the bundle that
# deploy/gpu/make-bundle.sh makes (this script travels in its bin/): one
# server of the bundle, then `python3 -m gpucompute.bench` from the checkout's
# client/python (Echo 512 MiB, GEMM 8192^3 bf16, upload and download of 1 GiB,
# a 64^3 GEMM at concurrency 1; each in Python and through the CLI's bench)
# once per transfer_processes setting.
#   PROCESSES="0 4 8"   settings of transfer_processes to run (0: threads)
#   BENCH_ARGS          added to every bench command (e.g. --only=upload,download)
#   SERVER_ARGS         added to the server's flags
#   PYTHON              the interpreter (default python3)
#   PYCLIENT            the client's folder (default: client/python under the
#                       working directory, the repository root on a device run)
# Logs and one bench-python-N.md per setting go to $OUT; the tables are
# printed last.
set -u
bundle=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpucompute-bench-python}
PYCLIENT=${PYCLIENT:-$PWD/client/python}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$bundle/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
work=$(mktemp -d)
trap 'kill "$(cat "$work/pid" 2>/dev/null)" 2>/dev/null; rm -rf "$work"' EXIT
{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
  echo "$(nproc) cores, $(date -u +%FT%TZ)"
  "$PYTHON" -c 'import sys, grpc, google.protobuf as p, numpy as n; print("python", sys.version.split()[0], "grpcio", grpc.__version__, "protobuf", p.__version__, "numpy", n.__version__)'
} >"$OUT/host.txt" 2>&1

"$bundle/bin/gpucompute-server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --ready_file="$work/ready.json" --max_message_bytes=2000000000 ${SERVER_ARGS:-} \
  >"$OUT/server.log" 2>&1 &
echo $! >"$work/pid"
for _ in $(seq 1 600); do [ -s "$work/ready.json" ] && break; sleep 0.1; done
if [ ! -s "$work/ready.json" ]; then
  echo "the server did not start:" >&2
  cat "$OUT/server.log" >&2
  exit 1
fi
port=$(sed -E 's/.*"grpc_port": *([0-9]+).*/\1/' "$work/ready.json")

status=0
for n in ${PROCESSES:-0 4 8}; do
  (cd "$PYCLIENT" && "$PYTHON" -m gpucompute.bench --server="127.0.0.1:$port" \
    --cli="$bundle/bin/gpucompute" --transfer_processes="$n" ${BENCH_ARGS:-}) \
    >"$OUT/bench-python-$n.md" 2>"$OUT/bench-python-$n.log" || status=1
done

cat "$OUT/host.txt"
for n in ${PROCESSES:-0 4 8}; do
  echo
  echo "transfer_processes=$n:"
  grep '^|' "$OUT/bench-python-$n.md" || tail -5 "$OUT/bench-python-$n.log"
done
exit $status
