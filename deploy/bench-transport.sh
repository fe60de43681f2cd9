#!/usr/bin/env bash
# End-to-end transport throughput over loopback gRPC, with the allocator as
# the C library leaves it (--retain_host_memory_bytes=0 on the server and the
# CLI) and as the server and CLI set it by default. Prints one table.
#   deploy/bench-transport.sh [BUILD_DIR]   (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build/release}"
server="$build/server/gpucompute-server"
cli="$build/client/gpucompute"
ready=$(mktemp -u)

start_server() {  # $1: --retain_host_memory_bytes value, or "" for the default
  local flag=()
  [ -n "$1" ] && flag=(--retain_host_memory_bytes="$1")
  rm -f "$ready"
  "$server" --listen=127.0.0.1:0 --metrics_listen= --ready_file="$ready" "${flag[@]}" \
    2>/dev/null &
  server_pid=$!
  for _ in $(seq 100); do [ -s "$ready" ] && break; sleep 0.1; done
  port=$(sed 's/.*"grpc_port": \([0-9]*\).*/\1/' "$ready")
}
stop_server() { kill "$server_pid"; wait "$server_pid" || true; }

# bench <retain> <args...>: the "payload GB/s" and "requests/s" of the first
# result row.
bench() {
  local retain="$1"; shift
  local flag=()
  [ -n "$retain" ] && flag=(--retain_host_memory_bytes="$retain")
  "$cli" bench "$@" --server=127.0.0.1:"$port" --echo_baseline=false "${flag[@]}" 2>/dev/null |
    awk 'f{print $2, $6; exit} /requests\/s/{f=1}'
}

cases=(
  "echo --shape=262144 --requests=200 --concurrency=1"       # 1 MiB
  "echo --shape=4194304 --requests=20 --concurrency=1"       # 16 MiB
  "echo --shape=16777216 --requests=8 --concurrency=1"       # 64 MiB
  "echo --shape=67108864 --requests=6 --concurrency=1"       # 256 MiB
  "echo --shape=134217728 --requests=4 --concurrency=1"      # 512 MiB
  "reduce --shape=67108864 --requests=6 --concurrency=1"     # 256 MiB in, 4 bytes out
  "echo --shape=256 --requests=20000 --concurrency=16"       # 1 KiB
  "gemm --m=64 --n=64 --k=64 --requests=5000 --concurrency=16"
)
printf '%-58s %22s %22s %7s\n' "case" "C library default" "kept (default)" "ratio"
printf '%-58s %22s %22s %7s\n' "" "req/s  payload GB/s" "req/s  payload GB/s" "GB/s"
for c in "${cases[@]}"; do
  start_server 0
  read -r rps0 gbs0 < <(bench 0 $c)
  stop_server
  start_server ""
  read -r rps1 gbs1 < <(bench "" $c)
  stop_server
  printf '%-58s %10s %11s %10s %11s %7.2f\n' "$c" "$rps0" "$gbs0" "$rps1" "$gbs1" \
    "$(echo "$gbs1 / $gbs0" | bc -l)"
done
rm -f "$ready"
