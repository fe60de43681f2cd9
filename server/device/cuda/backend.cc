#include "server/device/cuda/backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpucompute/kernels/gemm.h"
#include "proto/host_memory.h"
#include "server/common/status_macros.h"
#include "server/device/cuda/cuda_util.h"

namespace gpucompute::cuda {

namespace k = ::gpucompute::kernels;

int CountUsableGpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {

// What a short bf16 GEMM and a device-to-device copy measure on one GPU.
struct Calibration {
  double gemm_flops_per_second = 0;
  double copy_bytes_per_second = 0;  // read + written
  // Relative speed: the geometric mean of the two. Identical GPUs come out
  // within noise of each other; the caller normalises and rounds.
  double Speed() const { return std::sqrt(gemm_flops_per_second * copy_bytes_per_second); }
};

// Calibrates `device` over a few milliseconds.
absl::StatusOr<Calibration> Calibrate(CudaDevice& device) {
  DeviceGuard guard(device.ordinal());
  const int64_t n = 2048;
  const size_t bytes = size_t(n * n) * 2;
  const size_t copy_bytes = size_t{256} << 20;
  void *a = nullptr, *b = nullptr, *c = nullptr, *src = nullptr, *dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr, e2 = nullptr;
  auto cleanup = [&] {
    if (stream) cudaStreamSynchronize(stream);
    for (void* p : {a, b, c, src, dst}) cudaFree(p);
    for (cudaEvent_t e : {e0, e1, e2})
      if (e) cudaEventDestroy(e);
    if (stream) cudaStreamDestroy(stream);
    cudaGetLastError();
  };
  cudaError_t err = cudaSuccess;
  for (auto [p, sz] :
       {std::pair{&a, bytes}, {&b, bytes}, {&c, bytes}, {&src, copy_bytes}, {&dst, copy_bytes}})
    if (err == cudaSuccess) err = cudaMalloc(p, sz);
  if (err == cudaSuccess) err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  for (cudaEvent_t* e : {&e0, &e1, &e2})
    if (err == cudaSuccess) err = cudaEventCreate(e);
  if (err == cudaSuccess) err = cudaMemsetAsync(a, 0x3c, bytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(b, 0x3c, bytes, stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(src, 0x3c, copy_bytes, stream);
  k::GemmArgs args;
  args.m = args.n = args.k = n;
  args.a = a;
  args.b = b;
  args.c = c;
  args.lda = args.ldb = args.ldc = n;
  args.ab_type = args.c_type = k::DType::kBF16;
  const int reps = 5;
  for (int i = 0; i < 2 && err == cudaSuccess; ++i) err = k::LaunchGemm(args, "", nullptr, stream);
  if (err == cudaSuccess) err = cudaEventRecord(e0, stream);
  for (int i = 0; i < reps && err == cudaSuccess; ++i)
    err = k::LaunchGemm(args, "", nullptr, stream);
  if (err == cudaSuccess) err = cudaEventRecord(e1, stream);
  for (int i = 0; i < reps && err == cudaSuccess; ++i)
    err = cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, stream);
  if (err == cudaSuccess) err = cudaEventRecord(e2, stream);
  if (err == cudaSuccess) err = cudaEventSynchronize(e2);
  float gemm_ms = 0, copy_ms = 0;
  if (err == cudaSuccess) err = cudaEventElapsedTime(&gemm_ms, e0, e1);
  if (err == cudaSuccess) err = cudaEventElapsedTime(&copy_ms, e1, e2);
  cleanup();
  if (err != cudaSuccess) return CudaStatus(err, "calibration");
  if (!(gemm_ms > 0) || !(copy_ms > 0)) {
    return absl::InternalError("calibration: the GPU's events measured no time");
  }
  Calibration calibration;
  calibration.gemm_flops_per_second = 2.0 * n * n * n * reps / (gemm_ms * 1e-3);
  calibration.copy_bytes_per_second = 2.0 * copy_bytes * reps / (copy_ms * 1e-3);
  return calibration;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Device>>> CreateCudaDevices(
    const std::vector<int>& ordinals_in, const std::vector<double>& weights,
    const CudaDeviceOptions& options) {
  const int count = CountUsableGpus();
  if (count == 0) return absl::NotFoundError("no usable CUDA device");
  std::vector<int> ordinals = ordinals_in;
  if (ordinals.empty())
    for (int i = 0; i < count; ++i) ordinals.push_back(i);
  for (int o : ordinals)
    if (o < 0 || o >= count)
      return absl::InvalidArgumentError(
          absl::StrCat("--devices: GPU ", o, " does not exist (", count, " present)"));
  if (!weights.empty() && weights.size() != ordinals.size())
    return absl::InvalidArgumentError(absl::StrCat("--device_weights: ", weights.size(),
                                                   " weights for ", ordinals.size(), " devices"));

  // Staging copies, unless options.copy_threads says: the host's cores
  // shared among the GPUs, at most kMaxAutoCopyThreads each.
  CudaDeviceOptions per_device = options;
  if (per_device.copy_threads <= 0) {
    const int cores = std::max(1, int(std::thread::hardware_concurrency()));
    per_device.copy_threads = std::clamp(cores / int(ordinals.size()), 1, kMaxAutoCopyThreads);
  }
  std::vector<std::unique_ptr<CudaDevice>> devices;
  for (size_t i = 0; i < ordinals.size(); ++i) {
    ASSIGN_OR_RETURN(auto d, CudaDevice::Create(ordinals[i], int(i),
                                                weights.empty() ? 1.0 : weights[i], per_device));
    devices.push_back(std::move(d));
  }
  // Peer access for every pair that allows it.
  for (size_t i = 0; i < devices.size(); ++i) {
    std::vector<int> peers;
    DeviceGuard guard(devices[i]->ordinal());
    for (size_t j = 0; j < devices.size(); ++j) {
      if (i == j) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, devices[i]->ordinal(), devices[j]->ordinal()) !=
              cudaSuccess ||
          !can)
        continue;
      cudaError_t err = cudaDeviceEnablePeerAccess(devices[j]->ordinal(), 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) err = cudaSuccess;
      cudaGetLastError();
      if (err != cudaSuccess) continue;
      // Device i reads and writes j's pool allocations in place and copies
      // to and from them: its results kept on j, j's resident operands.
      RETURN_IF_ERROR(devices[j]->GrantPoolAccess(devices[i]->ordinal()));
      peers.push_back(int(j));
    }
    devices[i]->set_peers(std::move(peers));
  }
  if (weights.empty() && devices.size() > 1) {
    std::vector<double> speed;
    for (auto& d : devices) {
      ASSIGN_OR_RETURN(const Calibration calibration, Calibrate(*d));
      d->set_calibration(calibration.gemm_flops_per_second, calibration.copy_bytes_per_second);
      speed.push_back(calibration.Speed());
    }
    const double slowest = *std::min_element(speed.begin(), speed.end());
    for (size_t i = 0; i < devices.size(); ++i) {
      // Within 5% counts as equal: calibration noise must not skew shards.
      double w = speed[i] / slowest;
      devices[i]->set_weight(std::round(w * 20.0) / 20.0);
    }
  }
  std::vector<std::unique_ptr<Device>> out;
  for (auto& d : devices) out.push_back(std::move(d));
  return out;
}

absl::StatusOr<std::unique_ptr<HostArena>> CreatePinnedArena(int ordinal, int64_t bytes) {
  const size_t a = HostArena::kAlignment;
  const size_t capacity = (size_t(bytes) + a - 1) / a * a;
  DeviceGuard guard(ordinal);
  void* base = nullptr;
  if (cudaError_t err = cudaHostAlloc(&base, capacity, cudaHostAllocPortable); err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("--request_staging_bytes: cannot pin ", capacity, " bytes of host memory (",
                     cudaGetErrorString(err), "); ask for less, or 0 for none"));
  }
  // Resident for good, outside the allocator: not freed memory to trim.
  AddForeignResidentBytes(int64_t(capacity));
  return std::make_unique<HostArena>(base, capacity, /*pinned=*/true, [capacity](void* p) {
    cudaFreeHost(p);
    AddForeignResidentBytes(-int64_t(capacity));
  });
}

}  // namespace gpucompute::cuda
