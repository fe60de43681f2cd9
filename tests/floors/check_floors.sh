#!/usr/bin/env bash
# Checks the floor rules of ARCHITECTURE.md from the #include lines:
#   - no file includes a folder on a floor above its own;
#   - client/ includes nothing from server/; kernels/ nothing outside kernels/;
#     proto/ nothing outside proto/;
#   - the backends (server/device/cpu/, server/device/cuda/) are included only
#     from their own folder, the composition root (server/*.cc, *.h) and tests;
#   - only the CUDA backend includes the kernels.
#   check_floors.sh [ROOT]     check the tree at ROOT (default: this checkout)
#   check_floors.sh --self-test  check that violations are caught
set -euo pipefail

# The floor of a file or include path, lowest first; "x" for paths outside the
# project's floors (third-party headers, tests).
floor_of() {
  case "$1" in
    proto/*|gpucompute/v1/*) echo 0 ;;
    server/common/*) echo 1 ;;
    server/core/*) echo 2 ;;
    server/device/*) echo 3 ;;
    server/engine/*) echo 4 ;;
    server/metrics/*) echo 5 ;;
    server/service/*) echo 6 ;;
    server/*) echo 7 ;;
    *) echo x ;;
  esac
}

# Prints one line per violation in the tree at $1; returns 1 if any.
check() {
  local root=$1 bad=0 file line inc from to
  cd "$root"
  while IFS= read -r file; do
    while IFS= read -r line; do
      inc=${line#*\"}
      inc=${inc%%\"*}
      case "$file" in
        kernels/*)
          case "$inc" in
            proto/*|server/*|client/*|tests/*|gpucompute/v1/*)
              echo "$file: kernels/ includes $inc"; bad=1 ;;
          esac
          continue ;;
        proto/*)
          case "$inc" in
            server/*|client/*|kernels/*|tests/*|gpucompute/kernels/*)
              echo "$file: proto/ includes $inc"; bad=1 ;;
          esac
          continue ;;
        client/*)
          case "$inc" in
            server/*|kernels/*|tests/*|gpucompute/kernels/*)
              echo "$file: client/ includes $inc"; bad=1 ;;
          esac
          continue ;;
      esac
      # server/
      case "$inc" in
        client/*|tests/*) echo "$file: server/ includes $inc"; bad=1; continue ;;
        gpucompute/kernels/*)
          case "$file" in
            server/device/cuda/*) ;;
            *) echo "$file: only server/device/cuda/ includes the kernels ($inc)"; bad=1 ;;
          esac
          continue ;;
        server/device/cpu/*|server/device/cuda/*)
          local backend=${inc%/*}/
          case "$file" in
            "$backend"*) ;;
            server/*/*) echo "$file: includes the backend header $inc"; bad=1; continue ;;
          esac ;;
      esac
      from=$(floor_of "$file")
      to=$(floor_of "$inc")
      if [ "$to" != x ] && [ "$from" != x ] && [ "$to" -gt "$from" ]; then
        echo "$file (floor $from) includes $inc (floor $to): an upward include"
        bad=1
      fi
    done < <(grep -h '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
  done < <(find proto server client kernels -type f \
             \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort)
  return $bad
}

self_test() {
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  mkdir -p "$tmp"/{proto,server/core,server/engine,server/device/cpu,server/service,client,kernels/src}
  printf '#include "proto/dtype.h"\n' > "$tmp/server/core/ops.h"
  printf '#include "server/core/ops.h"\n#include "server/device/cpu/k.h"\n' \
    > "$tmp/server/device/cpu/cpu.cc"
  printf '#include "server/device/cpu/cpu.h"\n#include "server/service/s.h"\n' > "$tmp/server/main.cc"
  printf '#include "gpucompute/v1/compute.pb.h"\n' > "$tmp/client/c.cc"
  printf '#include "gpucompute/kernels/gemm.h"\n#include "common.cuh"\n' > "$tmp/kernels/src/g.cu"
  if ! (check "$tmp" > /dev/null); then
    echo "self-test: a clean tree was refused:"; (check "$tmp" || true); return 1
  fi
  local violations=(
    'server/core/cost.h:#include "server/engine/engine.h"'
    'server/engine/e.cc:#include "server/service/s.h"'
    'server/service/s.cc:#include "server/device/cpu/cpu_device.h"'
    'server/service/t.cc:#include "gpucompute/kernels/gemm.h"'
    'client/v.cc:#include "server/core/ops.h"'
    'proto/d.cc:#include "server/common/tensor.h"'
    'kernels/src/x.cu:#include "server/core/ops.h"'
  )
  local v file
  for v in "${violations[@]}"; do
    file=${v%%:*}
    cp -r "$tmp" "$tmp.case"
    printf '%s\n' "${v#*:}" > "$tmp.case/$file"
    if (check "$tmp.case" > /dev/null); then
      echo "self-test: not caught: $file ${v#*:}"; rm -rf "$tmp.case"; return 1
    fi
    rm -rf "$tmp.case"
  done
  echo "self-test: a clean tree passes and ${#violations[@]} kinds of violation are caught"
}

if [ "${1:-}" = "--self-test" ]; then
  self_test
else
  root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
  if check "$root"; then
    echo "floors: every #include keeps to the floor rules"
  else
    echo "floors: the includes above break the floor rules (ARCHITECTURE.md)"
    exit 1
  fi
fi
