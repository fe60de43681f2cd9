#!/usr/bin/env bash
# Installs the built binaries into PREFIX and copies every non-system shared
# library they need into PREFIX/lib, so that PREFIX runs on a machine without
# the build dependencies (the runtime container image, the GPU machines).
#   deploy/bundle.sh PREFIX [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="$1"
build="${2:-build/release}"
cmake --install "$build" --prefix "$prefix"
mkdir -p "$prefix/lib"
# System libraries (and the CUDA driver/toolkit libraries, present wherever a
# GPU is) stay behind.
skip='/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda|libcudart|libcublas[A-Za-z]*|libnvidia[^/]*)\.so'
for bin in "$prefix"/bin/*; do
  ldd "$bin" | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do
  cp -L "$lib" "$prefix/lib/"
done
du -sh "$prefix"
