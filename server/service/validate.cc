#include "server/service/validate.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace gpucompute {
namespace {

constexpr int64_t kMaxGemvColumns = 8;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::string_view ProtoDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "FLOAT32";
    case DType::kFloat16:
      return "FLOAT16";
    case DType::kBFloat16:
      return "BFLOAT16";
  }
  return "?";
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// a * b, or nullopt when it overflows int64. REQUIRES: a, b >= 0.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t product;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// The limits on a result: none but int64's when it stays on the server.
Limits ForOutput(const Limits& limits, const OpOptions& options) {
  if (!options.keep_output) return limits;
  Limits kept = limits;
  kept.max_output_bytes = std::numeric_limits<int64_t>::max();
  return kept;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum;
  if (__builtin_add_overflow(a, b, &sum)) return std::numeric_limits<int64_t>::max();
  return sum;
}

// Parses a required tensor field: `has` is the message's has_<field>().
absl::StatusOr<TensorView> RequireTensor(bool has, const v1::Tensor& tensor,
                                         absl::string_view field, absl::string_view expected,
                                         HandleResolver* handles) {
  if (!has) return Invalid(field, absl::StrCat("missing tensor; expected ", expected));
  return ParseTensor(tensor, field, handles);
}

// The bytes of `tensor`'s data field: in the message, or where `handles`
// says they were decoded.
absl::string_view TensorData(const v1::Tensor& tensor, HandleResolver* handles) {
  if (tensor.data().empty() && handles != nullptr) {
    if (std::optional<absl::string_view> staged = handles->StagedData(tensor)) return *staged;
  }
  return tensor.data();
}

// A tensor naming a handle: the resident tensor, checked against whatever
// dtype and shape the request gives.
absl::StatusOr<TensorView> ResolveTensor(const v1::Tensor& tensor, absl::string_view field,
                                         HandleResolver* handles) {
  if (handles == nullptr) {
    return Invalid(absl::StrCat(field, ".handle"),
                   "resident tensors are not taken here; send the bytes in data");
  }
  if (const absl::string_view data = TensorData(tensor, handles); !data.empty()) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrCat("expected no bytes beside a handle but got ", data.size()));
  }
  // No resident tensor has a longer shape; one is refused before it would
  // be echoed in a message below.
  if (tensor.shape_size() > kMaxTensorRank) {
    return Invalid(absl::StrCat(field, ".shape"),
                   absl::StrCat("rank ", tensor.shape_size(), " exceeds the largest supported, ",
                                kMaxTensorRank));
  }
  ASSIGN_OR_RETURN(TensorView view,
                   handles->Resolve(tensor.handle(), absl::StrCat(field, ".handle")));
  if (tensor.dtype() != v1::DTYPE_UNSPECIFIED) {
    ASSIGN_OR_RETURN(const DType dtype, ParseDType(tensor.dtype(), absl::StrCat(field, ".dtype")));
    if (dtype != view.dtype) {
      return Invalid(absl::StrCat(field, ".dtype"),
                     absl::StrCat("resident tensor ", Quote(tensor.handle()), " is ",
                                  ProtoDTypeName(view.dtype), ", not ", ProtoDTypeName(dtype)));
    }
  }
  if (tensor.shape_size() > 0 && !std::equal(tensor.shape().begin(), tensor.shape().end(),
                                             view.shape.begin(), view.shape.end())) {
    return Invalid(absl::StrCat(field, ".shape"),
                   absl::StrCat("resident tensor ", Quote(tensor.handle()), " has shape ",
                                ShapeString(view.shape), ", not ",
                                ShapeString(std::vector<int64_t>(tensor.shape().begin(),
                                                                 tensor.shape().end()))));
  }
  return view;
}

absl::Status RequireRank(const TensorView& view, absl::string_view field, int rank,
                         absl::string_view expected) {
  if (static_cast<int>(view.shape.size()) == rank) return absl::OkStatus();
  return Invalid(field, absl::StrCat("expected rank ", rank, " ", expected, " but got rank ",
                                     view.shape.size(), " ", ShapeString(view.shape)));
}

absl::Status RequireSameDType(const TensorView& view, absl::string_view field,
                              const TensorView& first, absl::string_view first_field) {
  if (view.dtype == first.dtype) return absl::OkStatus();
  return Invalid(absl::StrCat(field, ".dtype"),
                 absl::StrCat("expected ", ProtoDTypeName(first.dtype), " (the dtype of ",
                              first_field, ") but got ", ProtoDTypeName(view.dtype)));
}

// Bytes of the result tensors, or RESOURCE_EXHAUSTED past the limit (or past
// int64).
absl::StatusOr<int64_t> CheckOutputBytes(absl::string_view field, const std::vector<int64_t>& shape,
                                         DType dtype, int64_t extra_bytes, const Limits& limits) {
  std::optional<int64_t> bytes = static_cast<int64_t>(DTypeSize(dtype));
  for (int64_t d : shape) {
    if (bytes) bytes = CheckedMul(*bytes, d);
  }
  if (bytes) bytes = SaturatingAdd(*bytes, extra_bytes);
  if (!bytes || *bytes > limits.max_output_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": the result ", ShapeString(shape), " ", std::string(DTypeName(dtype)), " needs ",
        bytes ? absl::StrCat(*bytes, " bytes") : std::string("more than 2^63 bytes"),
        ", over the limit of ", limits.max_output_bytes, " bytes (--max_message_bytes)"));
  }
  return *bytes;
}

}  // namespace

absl::StatusOr<DType> ParseDType(v1::DType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::FLOAT16:
      return DType::kFloat16;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_UNSPECIFIED:
      return Invalid(field, "dtype is unspecified; expected FLOAT32, FLOAT16 or BFLOAT16");
    default:
      return Invalid(field, absl::StrCat("unknown dtype value ", static_cast<int>(dtype),
                                         "; expected FLOAT32, FLOAT16 or BFLOAT16"));
  }
}

v1::DType ToProtoDType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::FLOAT32;
    case DType::kFloat16:
      return v1::FLOAT16;
    case DType::kBFloat16:
      return v1::BFLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<TensorView> ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                                       HandleResolver* handles) {
  if (!tensor.handle().empty()) return ResolveTensor(tensor, field, handles);
  // No operation takes more than 4 axes; a longer shape is refused before it
  // is copied or echoed into a message. The product of the non-zero
  // dimensions must fit, so that every partial product the layers below form
  // fits too.
  ASSIGN_OR_RETURN(const int64_t expected, TensorBytes(tensor.dtype(), tensor.shape(), field));
  TensorView view;
  view.dtype = *ParseDType(tensor.dtype(), field);
  view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  const absl::string_view data = TensorData(tensor, handles);
  if (static_cast<int64_t>(data.size()) != expected) {
    return Invalid(absl::StrCat(field, ".data"),
                   absl::StrCat("expected ", expected, " bytes (shape ", ShapeString(view.shape),
                                " x ", DTypeSize(view.dtype), "-byte ",
                                std::string(DTypeName(view.dtype)), ") but got ", data.size()));
  }
  view.data = data.data();
  return view;
}

absl::StatusOr<int64_t> TensorBytes(v1::DType dtype, absl::Span<const int64_t> shape,
                                    absl::string_view field) {
  ASSIGN_OR_RETURN(const DType parsed, ParseDType(dtype, absl::StrCat(field, ".dtype")));
  if (shape.size() > size_t(kMaxTensorRank)) {
    return Invalid(
        absl::StrCat(field, ".shape"),
        absl::StrCat("rank ", shape.size(), " exceeds the largest supported, ", kMaxTensorRank));
  }
  std::optional<int64_t> bytes = static_cast<int64_t>(DTypeSize(parsed));
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return Invalid(absl::StrCat(field, ".shape[", i, "]"),
                     absl::StrCat("expected a dimension >= 0 but got ", shape[i]));
    }
    if (shape[i] == 0) {
      empty = true;
    } else if (bytes) {
      bytes = CheckedMul(*bytes, shape[i]);
    }
  }
  const std::vector<int64_t> dims(shape.begin(), shape.end());
  if (!bytes) {
    return Invalid(absl::StrCat(field, ".shape"),
                   absl::StrCat("the size of ", ShapeString(dims), " ",
                                std::string(DTypeName(parsed)), " overflows int64"));
  }
  return empty ? 0 : *bytes;
}

absl::StatusOr<OpOptions> ParseOptions(const v1::OpOptions& options, DType input_dtype) {
  OpOptions out;
  out.variant = options.variant();
  out.keep_output = options.keep_output();
  absl::flat_hash_set<int> seen;
  for (int i = 0; i < options.devices_size(); ++i) {
    const int device = options.devices(i);
    if (device < 0) {
      return Invalid(absl::StrCat("options.devices[", i, "]"),
                     absl::StrCat("expected a device index >= 0 but got ", device));
    }
    if (!seen.insert(device).second) {
      return Invalid("options.devices", absl::StrCat("device ", device, " is listed twice"));
    }
    out.devices.push_back(device);
  }
  if (options.output_dtype() == v1::DTYPE_UNSPECIFIED) {
    out.output_dtype = input_dtype;
  } else {
    ASSIGN_OR_RETURN(out.output_dtype, ParseDType(options.output_dtype(), "options.output_dtype"));
  }
  out.allow_tf32 = options.allow_tf32();
  return out;
}

absl::StatusOr<GemmSpec> ParseGemm(const v1::GemmRequest& request, const Limits& limits,
                                   HandleResolver* handles) {
  GemmSpec spec;
  ASSIGN_OR_RETURN(spec.a,
                   RequireTensor(request.has_a(), request.a(), "a",
                                 "[M, K] or [batch, M, K] ([K, M] with transpose_a)", handles));
  ASSIGN_OR_RETURN(spec.b,
                   RequireTensor(request.has_b(), request.b(), "b",
                                 "[K, N] or [batch, K, N] ([N, K] with transpose_b)", handles));
  for (const auto& [view, field] : {std::pair{&spec.a, "a"}, std::pair{&spec.b, "b"}}) {
    const size_t rank = view->shape.size();
    if (rank != 2 && rank != 3) {
      return Invalid(absl::StrCat(field, ".shape"),
                     absl::StrCat("expected rank 2 (a matrix) or 3 (a batch of matrices) but got "
                                  "rank ",
                                  rank, " ", ShapeString(view->shape)));
    }
  }
  RETURN_IF_ERROR(RequireSameDType(spec.b, "b", spec.a, "a"));
  spec.dtype = spec.a.dtype;
  spec.trans_a = request.transpose_a();
  spec.trans_b = request.transpose_b();
  spec.a_batched = spec.a.shape.size() == 3;
  spec.b_batched = spec.b.shape.size() == 3;

  const auto& as = spec.a.shape;
  const auto& bs = spec.b.shape;
  const int ar = spec.a_batched ? 1 : 0;  // index of A's first matrix axis
  const int br = spec.b_batched ? 1 : 0;
  spec.m = spec.trans_a ? as[ar + 1] : as[ar];
  spec.k = spec.trans_a ? as[ar] : as[ar + 1];
  const int b_k_axis = spec.trans_b ? br + 1 : br;
  spec.n = spec.trans_b ? bs[br] : bs[br + 1];
  if (bs[b_k_axis] != spec.k) {
    return Invalid(
        absl::StrCat("b.shape[", b_k_axis, "]"),
        absl::StrCat("inner dimensions do not match: op(A) is [M, K] = [", spec.m, ", ", spec.k,
                     "] (a.shape ", ShapeString(as), spec.trans_a ? ", transposed" : "",
                     ") so op(B) needs K = ", spec.k, " rows, but b.shape ", ShapeString(bs),
                     spec.trans_b ? " (transposed)" : "", " gives ", bs[b_k_axis]));
  }
  if (spec.a_batched && spec.b_batched && as[0] != bs[0]) {
    return Invalid("b.shape[0]",
                   absl::StrCat("expected batch ", as[0], " (a.shape[0]) but got ", bs[0]));
  }
  spec.batch = spec.a_batched ? as[0] : (spec.b_batched ? bs[0] : 1);
  const bool batched_out = spec.a_batched || spec.b_batched;
  spec.out_shape = batched_out ? std::vector<int64_t>{spec.batch, spec.m, spec.n}
                               : std::vector<int64_t>{spec.m, spec.n};

  spec.alpha = request.has_alpha() ? request.alpha() : 1.0;
  spec.beta = request.beta();
  if (request.has_c()) {
    ASSIGN_OR_RETURN(TensorView c, ParseTensor(request.c(), "c", handles));
    RETURN_IF_ERROR(RequireSameDType(c, "c", spec.a, "a"));
    const std::vector<int64_t> shared = {spec.m, spec.n};
    if (c.shape != shared && !(batched_out && c.shape == spec.out_shape)) {
      return Invalid("c.shape",
                     absl::StrCat("expected ", ShapeString(shared),
                                  batched_out ? absl::StrCat(" or ", ShapeString(spec.out_shape))
                                              : std::string(),
                                  " but got ", ShapeString(c.shape)));
    }
    spec.c_batched = c.shape.size() == 3;
    if (spec.beta != 0) spec.c = c;
  } else if (spec.beta != 0) {
    return Invalid("c", absl::StrCat("missing tensor; beta = ", spec.beta, " needs C of shape ",
                                     ShapeString(spec.out_shape)));
  }

  ASSIGN_OR_RETURN(spec.options, ParseOptions(request.options(), spec.dtype));
  RETURN_IF_ERROR(CheckOutputBytes("c", spec.out_shape, spec.options.output_dtype, 0,
                                   ForOutput(limits, spec.options))
                      .status());
  return spec;
}

absl::StatusOr<GemvSpec> ParseGemv(const v1::GemvRequest& request, const Limits& limits,
                                   HandleResolver* handles) {
  GemvSpec spec;
  ASSIGN_OR_RETURN(spec.a, RequireTensor(request.has_a(), request.a(), "a",
                                         "[M, K] ([K, M] with transpose_a)", handles));
  ASSIGN_OR_RETURN(spec.x, RequireTensor(request.has_x(), request.x(), "x",
                                         "[K] or [K, n] with n <= 8", handles));
  RETURN_IF_ERROR(RequireRank(spec.a, "a.shape", 2, "([M, K])"));
  RETURN_IF_ERROR(RequireSameDType(spec.x, "x", spec.a, "a"));
  spec.dtype = spec.a.dtype;
  spec.trans_a = request.transpose_a();
  spec.m = spec.trans_a ? spec.a.shape[1] : spec.a.shape[0];
  spec.k = spec.trans_a ? spec.a.shape[0] : spec.a.shape[1];

  const size_t x_rank = spec.x.shape.size();
  if (x_rank != 1 && x_rank != 2) {
    return Invalid("x.shape", absl::StrCat("expected rank 1 ([K]) or 2 ([K, n]) but got rank ",
                                           x_rank, " ", ShapeString(spec.x.shape)));
  }
  if (spec.x.shape[0] != spec.k) {
    return Invalid(
        "x.shape[0]",
        absl::StrCat("inner dimensions do not match: op(A) is [M, K] = [", spec.m, ", ", spec.k,
                     "] (a.shape ", ShapeString(spec.a.shape), spec.trans_a ? ", transposed" : "",
                     ") so x needs K = ", spec.k, " rows but has ", spec.x.shape[0]));
  }
  if (x_rank == 2) {
    spec.ncols = spec.x.shape[1];
    if (spec.ncols < 1 || spec.ncols > kMaxGemvColumns) {
      return Invalid("x.shape[1]", absl::StrCat("expected 1 to ", kMaxGemvColumns,
                                                " columns but got ", spec.ncols));
    }
  }
  spec.out_shape =
      x_rank == 1 ? std::vector<int64_t>{spec.m} : std::vector<int64_t>{spec.m, spec.ncols};

  spec.alpha = request.has_alpha() ? request.alpha() : 1.0;
  spec.beta = request.beta();
  if (request.has_y()) {
    ASSIGN_OR_RETURN(TensorView y, ParseTensor(request.y(), "y", handles));
    RETURN_IF_ERROR(RequireSameDType(y, "y", spec.a, "a"));
    if (y.shape != spec.out_shape) {
      return Invalid("y.shape",
                     absl::StrCat("expected ", ShapeString(spec.out_shape),
                                  " (M rows, shaped like x) but got ", ShapeString(y.shape)));
    }
    if (spec.beta != 0) spec.y = y;
  } else if (spec.beta != 0) {
    return Invalid("y", absl::StrCat("missing tensor; beta = ", spec.beta, " needs y of shape ",
                                     ShapeString(spec.out_shape)));
  }

  ASSIGN_OR_RETURN(spec.options, ParseOptions(request.options(), spec.dtype));
  RETURN_IF_ERROR(CheckOutputBytes("y", spec.out_shape, spec.options.output_dtype, 0,
                                   ForOutput(limits, spec.options))
                      .status());
  return spec;
}

absl::StatusOr<ReduceSpec> ParseReduce(const v1::ReduceRequest& request, const Limits& limits,
                                       HandleResolver* handles) {
  ReduceSpec spec;
  ASSIGN_OR_RETURN(spec.input, RequireTensor(request.has_input(), request.input(), "input",
                                             "a tensor", handles));
  switch (request.op()) {
    case v1::SUM:
      spec.kind = ReduceKind::kSum;
      break;
    case v1::MAX:
      spec.kind = ReduceKind::kMax;
      break;
    case v1::MIN:
      spec.kind = ReduceKind::kMin;
      break;
    case v1::MEAN:
      spec.kind = ReduceKind::kMean;
      break;
    case v1::REDUCE_OP_UNSPECIFIED:
      return Invalid("op", "reduction is unspecified; expected SUM, MAX, MIN or MEAN");
    default:
      return Invalid("op", absl::StrCat("unknown reduction value ", static_cast<int>(request.op()),
                                        "; expected SUM, MAX, MIN or MEAN"));
  }

  const std::vector<int64_t>& shape = spec.input.shape;
  const int rank = static_cast<int>(shape.size());
  if (request.has_axis()) {
    if (rank == 0) return Invalid("axis", "a scalar input (rank 0) has no axis to reduce");
    const int axis = request.axis();
    if (axis < -rank || axis >= rank) {
      return Invalid("axis",
                     absl::StrCat("expected an axis in [", -rank, ", ", rank, ") for input.shape ",
                                  ShapeString(shape), " but got ", axis));
    }
    const int ax = axis < 0 ? axis + rank : axis;
    spec.outer = 1;
    spec.inner = 1;
    for (int i = 0; i < ax; ++i) spec.outer *= shape[i];
    for (int i = ax + 1; i < rank; ++i) spec.inner *= shape[i];
    spec.axis_len = shape[ax];
    for (int i = 0; i < rank; ++i) {
      if (i != ax) {
        spec.out_shape.push_back(shape[i]);
      } else if (request.keepdims()) {
        spec.out_shape.push_back(1);
      }
    }
  } else {
    spec.outer = 1;
    spec.inner = 1;
    spec.axis_len = spec.input.num_elements();
    if (request.keepdims()) spec.out_shape.assign(rank, 1);
  }
  if ((spec.kind == ReduceKind::kMax || spec.kind == ReduceKind::kMin) && spec.axis_len == 0) {
    return Invalid(
        "input",
        absl::StrCat(spec.kind == ReduceKind::kMax ? "MAX" : "MIN",
                     " over zero elements is undefined (input.shape ", ShapeString(shape),
                     request.has_axis() ? absl::StrCat(", axis ", request.axis()) : std::string(),
                     ")"));
  }

  ASSIGN_OR_RETURN(spec.options, ParseOptions(request.options(), spec.input.dtype));
  RETURN_IF_ERROR(CheckOutputBytes("output", spec.out_shape, spec.options.output_dtype, 0,
                                   ForOutput(limits, spec.options))
                      .status());
  return spec;
}

absl::StatusOr<TransposeSpec> ParseTranspose(const v1::TransposeRequest& request,
                                             const Limits& limits, HandleResolver* handles) {
  TransposeSpec spec;
  ASSIGN_OR_RETURN(spec.input, RequireTensor(request.has_input(), request.input(), "input",
                                             "a tensor of rank 1 to 4", handles));
  const std::vector<int64_t>& shape = spec.input.shape;
  const int rank = static_cast<int>(shape.size());
  if (rank < 1 || rank > 4) {
    return Invalid("input.shape", absl::StrCat("expected rank 1 to 4 but got rank ", rank, " ",
                                               ShapeString(shape)));
  }
  spec.rank = rank;
  for (int i = 0; i < rank; ++i) spec.in_shape[i] = shape[i];

  if (request.perm_size() == 0) {
    for (int i = 0; i < rank; ++i) spec.perm[i] = rank - 1 - i;
  } else {
    if (request.perm_size() != rank) {
      return Invalid("perm", absl::StrCat("expected ", rank, " axes (a permutation of [0, ", rank,
                                          ") for input.shape ", ShapeString(shape), ") but got ",
                                          request.perm_size()));
    }
    bool seen[4] = {false, false, false, false};
    for (int i = 0; i < rank; ++i) {
      const int p = request.perm(i);
      if (p < -rank || p >= rank) {
        return Invalid(
            absl::StrCat("perm[", i, "]"),
            absl::StrCat("axis ", p, " is out of range [", -rank, ", ", rank, ") for rank ", rank));
      }
      const int axis = p < 0 ? p + rank : p;
      if (seen[axis]) {
        return Invalid("perm",
                       absl::StrCat("axis ", axis, " appears twice; expected a permutation of [0, ",
                                    rank, ")"));
      }
      seen[axis] = true;
      spec.perm[i] = axis;
    }
  }
  for (int i = 0; i < rank; ++i) spec.out_shape.push_back(shape[spec.perm[i]]);

  ASSIGN_OR_RETURN(spec.options, ParseOptions(request.options(), spec.input.dtype));
  RETURN_IF_ERROR(CheckOutputBytes("output", spec.out_shape, spec.options.output_dtype, 0,
                                   ForOutput(limits, spec.options))
                      .status());
  return spec;
}

absl::StatusOr<AttentionSpec> ParseAttention(const v1::AttentionRequest& request,
                                             const Limits& limits, HandleResolver* handles) {
  AttentionSpec spec;
  ASSIGN_OR_RETURN(spec.q,
                   RequireTensor(request.has_q(), request.q(), "q", "[B, Hq, Sq, D]", handles));
  ASSIGN_OR_RETURN(spec.k,
                   RequireTensor(request.has_k(), request.k(), "k", "[B, Hkv, Skv, D]", handles));
  ASSIGN_OR_RETURN(spec.v,
                   RequireTensor(request.has_v(), request.v(), "v", "[B, Hkv, Skv, D]", handles));
  RETURN_IF_ERROR(RequireRank(spec.q, "q.shape", 4, "([B, Hq, Sq, D])"));
  RETURN_IF_ERROR(RequireRank(spec.k, "k.shape", 4, "([B, Hkv, Skv, D])"));
  RETURN_IF_ERROR(RequireRank(spec.v, "v.shape", 4, "([B, Hkv, Skv, D])"));
  RETURN_IF_ERROR(RequireSameDType(spec.k, "k", spec.q, "q"));
  RETURN_IF_ERROR(RequireSameDType(spec.v, "v", spec.q, "q"));
  spec.dtype = spec.q.dtype;

  const auto& qs = spec.q.shape;
  const auto& ks = spec.k.shape;
  spec.batch = qs[0];
  spec.heads_q = qs[1];
  spec.seq_q = qs[2];
  spec.head_dim = qs[3];
  spec.heads_kv = ks[1];
  spec.seq_kv = ks[2];
  if (ks[0] != spec.batch) {
    return Invalid("k.shape[0]", absl::StrCat("expected batch B = ", spec.batch,
                                              " (q.shape[0]) but got ", ks[0]));
  }
  if (ks[3] != spec.head_dim) {
    return Invalid("k.shape[3]", absl::StrCat("expected head dim D = ", spec.head_dim,
                                              " (q.shape[3]) but got ", ks[3]));
  }
  if (spec.v.shape != ks) {
    return Invalid("v.shape", absl::StrCat("expected the shape of k ", ShapeString(ks), " but got ",
                                           ShapeString(spec.v.shape)));
  }
  bool supported = false;
  for (int64_t d : limits.head_dims) supported = supported || d == spec.head_dim;
  if (!supported) {
    return Invalid("q.shape[3]",
                   absl::StrCat("head dim D = ", spec.head_dim, " is not supported; supported: ",
                                absl::StrJoin(limits.head_dims, ", ")));
  }
  if (spec.heads_kv < 1) {
    return Invalid("k.shape[1]", "expected at least one key/value head (Hkv >= 1) but got 0");
  }
  if (spec.heads_q % spec.heads_kv != 0) {
    return Invalid("q.shape[1]",
                   absl::StrCat("Hq = ", spec.heads_q, " query heads is not a multiple of Hkv = ",
                                spec.heads_kv, " (k.shape[1])"));
  }
  const double scale = request.scale();
  if (!std::isfinite(scale) || scale < 0) {
    return Invalid(
        "scale", absl::StrCat("expected a finite value > 0 (or 0 for 1/sqrt(D)) but got ", scale));
  }
  spec.scale = scale == 0 ? 1.0 / std::sqrt(static_cast<double>(spec.head_dim)) : scale;
  spec.causal = request.causal();
  spec.return_lse = request.return_lse();
  spec.out_shape = qs;

  ASSIGN_OR_RETURN(spec.options, ParseOptions(request.options(), spec.dtype));
  const int64_t lse_bytes =
      spec.return_lse ? spec.batch * spec.heads_q * spec.seq_q * int64_t{sizeof(float)} : 0;
  RETURN_IF_ERROR(CheckOutputBytes("o", spec.out_shape, spec.options.output_dtype, lse_bytes,
                                   ForOutput(limits, spec.options))
                      .status());
  return spec;
}

absl::StatusOr<UploadPart> ParseUploadHeader(const v1::UploadHeader& header) {
  UploadPart part;
  ASSIGN_OR_RETURN(part.bytes, TensorBytes(header.dtype(), header.shape(), "header"));
  if (header.parts() < 0 || header.parts() > kMaxUploadParts) {
    return Invalid("header.parts",
                   absl::StrCat("expected 0 to ", kMaxUploadParts, " but got ", header.parts()));
  }
  if (header.parts() <= 1) {
    if (header.part_begin() != 0 || (header.part_end() != 0 && header.part_end() != part.bytes)) {
      return Invalid("header.part_begin",
                     "a single-stream upload carries the whole tensor (leave the part unset)");
    }
    part.end = part.bytes;
    return part;
  }
  if (header.upload_id().empty()) {
    return Invalid("header.upload_id", "required when the upload has several parts");
  }
  if (header.part_begin() < 0 || header.part_end() < header.part_begin() ||
      header.part_end() > part.bytes) {
    return Invalid("header.part_begin",
                   absl::StrCat("part [", header.part_begin(), ", ", header.part_end(),
                                ") is not within the tensor's ", part.bytes, " bytes"));
  }
  part.begin = header.part_begin();
  part.end = header.part_end();
  return part;
}

}  // namespace gpucompute
