#!/usr/bin/env bash
# Builds the h200 preset (sm_90a, static cudart) and bundles the server, the
# CLI and the integration tests with every non-system library into one folder
# that runs on the GPU machines (Ubuntu 24.04, newer glibc; no gRPC there).
#   deploy/gpu/make-bundle.sh [OUT_DIR]   (default .gpu-server, git-ignored)
# Compressed whole it is ~75 MB, past the 64 MB a device run carries: carry
# lib/ and the bin/ files the run uses, xz-compressed (gzip leaves the server
# and the attention sweep a few MB too large beside the source tree), e.g.
#   tar cf - .gpu-server/lib .gpu-server/bin/{gpucompute-server,gpucompute,\
#     integration_test,gc_sweep_attention,kernels_attention_test,sweep-attention.sh,\
#     attention_vendor.py,profile-attention.sh,attention_profile.py,attention_sdpa.py} \
#     | xz -T0 > .gpu-carry/bundle.txz
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-.gpu-server}"
cmake --preset h200 >/dev/null
cmake --build --preset h200 -j "$(nproc)" --target gpucompute-server gpucompute integration_test \
  gc_sweep_memops gc_sweep_gemm gc_sweep_attention gc_bench_device_path kernels_gemv_test \
  kernels_reduce_test kernels_transpose_test kernels_gemm_tc_test kernels_gemm_simt_test kernels_attention_test \
  gc_kernels_capi
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
cp build/h200/server/gpucompute-server build/h200/client/gpucompute \
   build/h200/tests/integration/integration_test deploy/gpu/verify-server.sh deploy/gpu/check-multi-gpu.sh \
   deploy/gpu/bench-data-path.sh deploy/gpu/bench-python.sh deploy/gpu/sweep-memops.sh \
   deploy/gpu/sweep-gemm.sh \
   deploy/gpu/sweep-attention.sh deploy/gpu/profile-attention.sh kernels/bench/attention_profile.py \
   kernels/bench/attention_sdpa.py build/h200/tests/sweep/gc_sweep_memops \
   build/h200/tests/sweep/gc_sweep_gemm build/h200/tests/sweep/gc_sweep_attention \
   build/h200/tests/sweep/gc_bench_device_path \
   tests/sweep/torch_vendor.py tests/sweep/gemm_table.py tests/sweep/attention_vendor.py \
   tests/sweep/compare_builds.py \
   build/h200/tests/kernels/kernels_attention_test build/h200/tests/kernels/kernels_gemv_test \
   build/h200/tests/kernels/kernels_reduce_test build/h200/tests/kernels/kernels_transpose_test \
   build/h200/tests/kernels/kernels_gemm_tc_test build/h200/tests/kernels/kernels_gemm_simt_test "$out/bin/"
skip='/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*|libcuda|libcudart|libcublas[A-Za-z]*|libnvidia[^/]*|libssl|libcrypto)\.so'
for bin in "$out"/bin/gpucompute-server "$out"/bin/gpucompute "$out"/bin/integration_test \
           "$out"/bin/gc_sweep_memops "$out"/bin/gc_sweep_gemm "$out"/bin/gc_sweep_attention \
           "$out"/bin/gc_bench_device_path; do
  ldd "$bin" | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib/"; done
# The kernels' C entry points, for the Python harnesses beside PyTorch
# (attention_sdpa.py, attention_profile.py); they need no other library here.
cp build/h200/kernels/libgc_kernels_capi.so "$out/lib/"
strip "$out"/bin/gpucompute-server "$out"/bin/gpucompute "$out"/bin/integration_test \
  "$out"/bin/gc_sweep_memops "$out"/bin/gc_sweep_gemm "$out"/bin/gc_sweep_attention \
  "$out"/bin/gc_bench_device_path "$out"/bin/kernels_*_test "$out"/lib/*.so* 2>/dev/null || true
du -sh "$out"
