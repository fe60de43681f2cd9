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

}  // namespace gpucompute
