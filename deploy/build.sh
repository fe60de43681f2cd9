#!/usr/bin/env bash
# Configures and builds gpucompute with a CMake preset (default: release, which
# builds the CUDA kernels when nvcc is found and the CPU backend always).
#   deploy/build.sh [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)"
