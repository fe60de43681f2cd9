// Request validation: proto messages -> the validated specs of
// server/core/ops.h. Every check a request can fail happens here, so that the
// layers below take their input as given.
//
// The specs' TensorViews borrow the request's bytes (no copies): a spec is
// valid while its request message lives and is not modified.
//
// Errors name the field and what was expected, e.g.
//   INVALID_ARGUMENT "b.shape: expected K=7 rows (a.shape[1]) but got 5"
// and RESOURCE_EXHAUSTED when a result would exceed Limits.
#ifndef GPUCOMPUTE_SERVER_SERVICE_VALIDATE_H_
#define GPUCOMPUTE_SERVER_SERVICE_VALIDATE_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gpucompute/v1/compute.pb.h"
#include "server/core/ops.h"

namespace gpucompute {

// What the serving backend accepts beyond the wire format.
struct Limits {
  // Largest result (all output tensors together) in bytes; larger ->
  // RESOURCE_EXHAUSTED. The server derives it from max_message_bytes.
  int64_t max_output_bytes = std::numeric_limits<int64_t>::max();
  // Attention head dimensions the backend implements, ascending.
  std::vector<int64_t> head_dims = AttentionHeadDims();
};

// Proto dtype -> ours. INVALID_ARGUMENT naming `field` for
// DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> ParseDType(v1::DType dtype, absl::string_view field);

// Ours -> proto.
v1::DType ToProtoDType(DType dtype);

// Resolves Tensor.handle: a resident tensor as an operand. Also says where a
// tensor's bytes are when they were decoded outside its message.
class HandleResolver {
 public:
  virtual ~HandleResolver() = default;
  // The resident tensor `handle` as a view (its device set), kept alive as
  // long as the resolver lives; NOT_FOUND naming `field` and saying why.
  virtual absl::StatusOr<TensorView> Resolve(const std::string& handle,
                                             const std::string& field) = 0;
  // The bytes of `tensor`'s data field when they were decoded elsewhere than
  // the message (whose field is then empty): the request arena. Valid as
  // long as the resolver lives. Nothing (the default) when they were not.
  virtual std::optional<absl::string_view> StagedData(const v1::Tensor& tensor) {
    (void)tensor;
    return std::nullopt;
  }
};

// Validates one tensor (dtype, dims >= 0, element count fits in int64, byte
// length == count * element size) and returns a view of its bytes. `field`
// names it in errors ("a", "x", "input", ...). The view borrows `tensor`.
// A tensor naming a handle is resolved by `handles` (INVALID_ARGUMENT when
// null: resident tensors are not taken there); it carries no data, and the
// dtype and shape it gives, if any, must be the resident tensor's.
absl::StatusOr<TensorView> ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                                       HandleResolver* handles = nullptr);

// The byte size of a tensor of `dtype` and `shape` (dtype set, rank <= 8,
// dims >= 0, the size fits in int64), or INVALID_ARGUMENT naming
// `field`.dtype / `field`.shape.
absl::StatusOr<int64_t> TensorBytes(v1::DType dtype, absl::Span<const int64_t> shape,
                                    absl::string_view field);

// Longest shape ParseTensor accepts (operations use at most 4 axes).
inline constexpr int kMaxTensorRank = 8;

// Validates options against the input dtype: output_dtype unspecified ->
// `input_dtype`; negative or repeated device indices are rejected (unknown
// indices and variants are the engine's to reject, as it knows them).
absl::StatusOr<OpOptions> ParseOptions(const v1::OpOptions& options, DType input_dtype);

// One parser per operation. Each returns the validated spec or
// INVALID_ARGUMENT / RESOURCE_EXHAUSTED as described above (NOT_FOUND for a
// handle `handles` does not know). The returned spec borrows `request`'s
// tensor bytes and the resolved resident tensors.
absl::StatusOr<GemmSpec> ParseGemm(const v1::GemmRequest& request, const Limits& limits = {},
                                   HandleResolver* handles = nullptr);
absl::StatusOr<GemvSpec> ParseGemv(const v1::GemvRequest& request, const Limits& limits = {},
                                   HandleResolver* handles = nullptr);
absl::StatusOr<ReduceSpec> ParseReduce(const v1::ReduceRequest& request, const Limits& limits = {},
                                       HandleResolver* handles = nullptr);
absl::StatusOr<TransposeSpec> ParseTranspose(const v1::TransposeRequest& request,
                                             const Limits& limits = {},
                                             HandleResolver* handles = nullptr);
absl::StatusOr<AttentionSpec> ParseAttention(const v1::AttentionRequest& request,
                                             const Limits& limits = {},
                                             HandleResolver* handles = nullptr);

// Most parts (streams) one upload may be split into.
inline constexpr int kMaxUploadParts = 64;

// What one Upload stream carries: the bytes [begin, end) of a tensor of
// `bytes` bytes.
struct UploadPart {
  int64_t bytes = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// Validates the header of an Upload stream: the tensor's dtype and shape (as
// TensorBytes), parts 0 to kMaxUploadParts, and the stream's part: the whole
// tensor for parts 0 or 1 (part_begin and part_end unset, or part_end the
// tensor's bytes), else an upload_id and a part within the tensor.
// INVALID_ARGUMENT naming the field ("header.parts", ...).
absl::StatusOr<UploadPart> ParseUploadHeader(const v1::UploadHeader& header);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_SERVICE_VALIDATE_H_
