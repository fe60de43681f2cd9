// Routes GEMM requests to the SIMT or the tensor-core ladder (see gemm.h).
#include <algorithm>

#include "gpucompute/kernels/gemm.h"

namespace gpucompute::kernels {
namespace {

bool Contains(const std::vector<std::string>& v, std::string_view name) {
  return std::find(v.begin(), v.end(), name) != v.end();
}

// True when the request belongs to the SIMT ladder.
bool UseSimt(const GemmArgs& args, std::string_view variant) {
  if (!variant.empty()) return Contains(GemmSimtVariants(), variant);
  return args.ab_type == DType::kF32 && !args.allow_tf32;
}

bool Known(std::string_view variant) {
  return variant.empty() || Contains(GemmSimtVariants(), variant) ||
         Contains(GemmTcVariants(), variant);
}

}  // namespace

const std::vector<std::string>& GemmVariants() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v = GemmSimtVariants();
    for (const auto& name : GemmTcVariants()) v.push_back(name);
    return v;
  }();
  return all;
}

Support CanImplementGemm(const GemmArgs& args, std::string_view variant) {
  if (!Known(variant)) return Support::No("unknown gemm variant '" + std::string(variant) + "'");
  return UseSimt(args, variant) ? CanImplementGemmSimt(args, variant)
                                : CanImplementGemmTc(args, variant);
}

size_t GemmWorkspaceBytes(const GemmArgs& args, std::string_view variant) {
  if (!Known(variant)) return 0;
  return UseSimt(args, variant) ? GemmSimtWorkspaceBytes(args, variant)
                                : GemmTcWorkspaceBytes(args, variant);
}

cudaError_t LaunchGemm(const GemmArgs& args, std::string_view variant, void* workspace,
                       cudaStream_t stream) {
  if (!Known(variant)) return cudaErrorInvalidValue;
  return UseSimt(args, variant) ? LaunchGemmSimt(args, variant, workspace, stream)
                                : LaunchGemmTc(args, variant, workspace, stream);
}

}  // namespace gpucompute::kernels
