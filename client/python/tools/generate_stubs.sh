#!/usr/bin/env bash
# Generates gpucompute/v1/compute_pb2.py and compute_pb2_grpc.py from
# proto/gpucompute/v1/compute.proto with protoc and grpc_python_plugin (Debian:
# protobuf-compiler, protobuf-compiler-grpc).
#   tools/generate_stubs.sh [OUT_DIR]   (default: this package, in place)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$here}"
plugin="$(command -v grpc_python_plugin)"
mkdir -p "$out"
protoc -I "$root/proto" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$root/proto/gpucompute/v1/compute.proto"
