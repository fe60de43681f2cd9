// Routes GEMM requests to the SIMT or the tensor-core ladder or to the vendor
// fallback (see gemm.h); the default's choice is heuristics/gemm_heuristics.h.
#include <algorithm>
#include <cstdint>

#include "gemm_addend.h"
#include "gpucompute/kernels/gemm.h"
#include "heuristics/gemm_heuristics.h"
#include "launch_util.h"

namespace gpucompute::kernels {
namespace {

bool Contains(const std::vector<std::string>& v, std::string_view name) {
  return std::find(v.begin(), v.end(), name) != v.end();
}

// True when the request belongs to the SIMT ladder (a vendor request never).
bool UseSimt(const GemmArgs& args, std::string_view variant) {
  if (!variant.empty()) return Contains(GemmSimtVariants(), variant);
  return args.ab_type == DType::kF32 && !args.allow_tf32;
}

bool Known(std::string_view variant) {
  return variant.empty() || IsGemmVendorVariant(variant) || Contains(GemmSimtVariants(), variant) ||
         Contains(GemmTcVariants(), variant);
}

// The largest power of two, up to 16, that A's and B's bases, rows and batch
// strides (of operands not shared by the batch) are all multiples of, in bytes.
int AbAlignment(const GemmArgs& args) {
  const uint64_t es = DTypeSize(args.ab_type);
  uint64_t bits = reinterpret_cast<uintptr_t>(args.a) | reinterpret_cast<uintptr_t>(args.b) |
                  uint64_t(args.lda) * es | uint64_t(args.ldb) * es | 16u;
  if (args.batch > 1) bits |= uint64_t(args.stride_a) * es | uint64_t(args.stride_b) * es;
  return static_cast<int>(bits & (~bits + 1));  // the lowest bit set
}

// The variant the empty one stands for: what the heuristics pick when it
// takes the arguments (the vendor fallback or a rung by name), else "" (the
// dtype's ladder picks).
std::string_view Resolve(const GemmArgs& args, std::string_view variant) {
  if (!variant.empty()) return variant;
  GemmShape s;
  s.m = args.m;
  s.n = args.n;
  s.k = args.k;
  s.batch = args.batch;
  s.ab = args.ab_type;
  s.tf32 = args.ab_type == DType::kF32 && args.allow_tf32;
  s.trans_a = args.trans_a;
  s.trans_b = args.trans_b;
  s.tma_ok = !UseSimt(args, "") && CanImplementGemmTc(args, "wgmma_persistent");
  s.aligned = GemmTcAddressable(args);
  s.ab_align = AbAlignment(args);
  s.copy_bytes = UseSimt(args, "") ? 0.0 : double(GemmTcPackedCopyBytes(args));
  s.c_bytes = static_cast<int>(DTypeSize(args.c_type));
  s.c_aligned = GemmCAligned(args, 16);
  s.c_sectors = GemmCAligned(args, 32);
  s.vendor_ok = static_cast<bool>(CanImplementGemmVendor(args, kGemmVendorVariant));
  s.beta = args.beta != 0;
  s.sms = SmCount();
  const std::string_view chosen = ChooseGemmVariant(s);
  // A rung that refuses these arguments leaves the choice to the vendor.
  if (!chosen.empty() && !IsGemmVendorVariant(chosen) && !CanImplementGemm(args, chosen))
    return s.vendor_ok ? kGemmVendorVariant : "";
  return chosen;
}

}  // namespace

const std::vector<std::string>& GemmVariants() {
  static const std::vector<std::string> all = [] {
    std::vector<std::string> v = GemmSimtVariants();
    for (const auto& name : GemmTcVariants()) v.push_back(name);
    v.push_back(kGemmVendorVariant);
    v.push_back(kGemmCublasVariant);
    return v;
  }();
  return all;
}

Support CanImplementGemm(const GemmArgs& args, std::string_view variant) {
  if (!Known(variant)) return Support::No("unknown gemm variant '" + std::string(variant) + "'");
  variant = Resolve(args, variant);
  if (IsGemmVendorVariant(variant)) return CanImplementGemmVendor(args, variant);
  return UseSimt(args, variant) ? CanImplementGemmSimt(args, variant)
                                : CanImplementGemmTc(args, variant);
}

size_t GemmWorkspaceBytes(const GemmArgs& args, std::string_view variant) {
  if (!Known(variant)) return 0;
  variant = Resolve(args, variant);
  if (IsGemmVendorVariant(variant)) return GemmVendorWorkspaceBytes(args);
  return UseSimt(args, variant) ? GemmSimtWorkspaceBytes(args, variant)
                                : GemmTcWorkspaceBytes(args, variant);
}

cudaError_t LaunchGemm(const GemmArgs& args, std::string_view variant, void* workspace,
                       cudaStream_t stream) {
  if (!Known(variant)) return cudaErrorInvalidValue;
  variant = Resolve(args, variant);
  if (IsGemmVendorVariant(variant)) return LaunchGemmVendor(args, variant, workspace, stream);
  return UseSimt(args, variant) ? LaunchGemmSimt(args, variant, workspace, stream)
                                : LaunchGemmTc(args, variant, workspace, stream);
}

std::string GemmVariantName(const GemmArgs& args, std::string_view variant) {
  if (!variant.empty()) return std::string(variant);
  variant = Resolve(args, variant);
  if (!variant.empty()) return std::string(variant);
  return UseSimt(args, "") ? GemmSimtDefaultRung(args) : GemmTcDefaultRung(args);
}

}  // namespace gpucompute::kernels
