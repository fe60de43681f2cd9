#include "server/core/ops.h"

namespace gpucompute {

std::string_view OpName(OpKind op) {
  switch (op) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kGemv:
      return "gemv";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kTranspose:
      return "transpose";
    case OpKind::kAttention:
      return "attention";
  }
  return "unknown";
}

std::vector<int64_t> AttentionHeadDims() {
  std::vector<int64_t> dims;
  for (int64_t d = 8; d <= 256; d += 8) dims.push_back(d);
  return dims;
}

}  // namespace gpucompute
