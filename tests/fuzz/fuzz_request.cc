// Fuzz target: a request as the server receives it. The bytes are parsed as
// one request message (by protobuf, as gRPC's codec does for the unary calls
// and Batch; by wire::Parse, as the Upload stream does), validated
// (server/service/validate.h), handed to what the layers below take as given
// (the admission footprint, the shard plans and placement of server/core),
// and converted: operands to float and back (proto/dtype.h), the result into
// its response (server/service/convert.h) and through the wire codec.
//
// Input: one byte, then the message. The byte's low three bits pick the
// message (Kind), the next two the number of devices plans split over (1 to
// 4), the top three Limits::max_output_bytes (kOutputLimits). A tensor may
// name a resident tensor by its description (DescribedResidents).
//
// Besides no crash, leak or undefined behaviour, and memory bounded by the
// input's size (shapes are refused before anything is sized from them):
// - a refusal is INVALID_ARGUMENT, NOT_FOUND or RESOURCE_EXHAUSTED, maps to
//   the same gRPC code, and its message is short whatever the request;
// - a spec's views are its tensors' bytes, exactly; its dimensions agree with
//   its operands' shapes; its output is within the limit; a request accepted
//   under a limit is accepted without one;
// - its plans cover each split axis exactly, in order, on the given devices;
//   its footprint and costs are finite and not negative;
// - fp16 and bf16 operands come back bit for bit from float (NaN as NaN);
// - the response carries the output's dtype, shape and bytes, and reads back
//   the same after wire::Serialize with the bytes attached.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/stubs/logging.h"
#include "gpucompute/v1/compute.pb.h"
#include "proto/dtype.h"
#include "proto/wire.h"
#include "server/common/quote.h"
#include "server/common/tensor.h"
#include "server/core/cost.h"
#include "server/core/ops.h"
#include "server/core/planner.h"
#include "server/engine/engine.h"
#include "server/service/convert.h"
#include "server/service/validate.h"
#include "tests/fuzz/fuzz_check.h"

namespace gpucompute {
namespace {

enum class Kind : int {
  kGemm = 0,
  kGemv,
  kReduce,
  kTranspose,
  kAttention,
  kBatch,
  kEcho,
  kUpload,
};

// Limits::max_output_bytes, by the top three bits of the first byte.
constexpr int64_t kOutputLimits[8] = {std::numeric_limits<int64_t>::max(),
                                      0,
                                      1,
                                      64,
                                      4096,
                                      int64_t{1} << 20,
                                      int64_t{1} << 30,
                                      int64_t{1} << 40};
// Outputs at most this large are allocated and converted into a response.
constexpr int64_t kMaxOutputBytes = int64_t{256} << 10;
// Longest error message a refusal may carry.
constexpr size_t kMaxErrorBytes = 1024;
// Upload chunks from this size stay in the slices (as in transfer.cc), and a
// small threshold that every test input reaches.
constexpr int64_t kUploadExternalBytes = int64_t{16} << 10;
constexpr int64_t kSmallExternalBytes = 4;

// Relative compute weights of up to four devices, and the indices a
// placement gives them.
constexpr double kWeights[4] = {1.0, 2.0, 0.5, 3.0};
constexpr int kDeviceIndices[4] = {0, 2, 3, 7};
// Row granularities of the devices (Device::RowGranularity).
constexpr int64_t kRowGranularities[2] = {1, 16};

// What the inputs reached, per operation (Echo and Upload too): printed at
// exit when GC_FUZZ_STATS is set, to see that inputs get past validation.
struct Reached {
  const char* name;
  int64_t refused = 0;
  int64_t accepted = 0;
  int64_t converted = 0;  // into a response and through the wire codec
};
Reached reached[] = {{"gemm"},      {"gemv"}, {"reduce"}, {"transpose"},
                     {"attention"}, {"echo"}, {"upload"}};
enum Op : int { kGemmOp = 0, kGemvOp, kReduceOp, kTransposeOp, kAttentionOp, kEchoOp, kUploadOp };

void PrintReached() {
  for (const Reached& r : reached) {
    std::fprintf(stderr, "fuzz_request: %-9s refused %lld, accepted %lld, converted %lld\n", r.name,
                 static_cast<long long>(r.refused), static_cast<long long>(r.accepted),
                 static_cast<long long>(r.converted));
  }
}

struct Setup {
  Kind kind = Kind::kGemm;
  std::vector<double> weights;
  Limits limits;
};

// Where resident tensors' bytes "are": never read.
char resident_bytes;

// Resident tensors named by their description: "r", a dtype letter (f:
// FLOAT32, h: FLOAT16, b: BFLOAT16), then the dimensions separated by
// commas, e.g. "rb2,3" or "rf" (a scalar). Any other handle, or a shape no
// upload could have (TensorBytes), is NOT_FOUND, as the store answers for a
// handle it does not hold.
class DescribedResidents final : public HandleResolver {
 public:
  absl::StatusOr<TensorView> Resolve(const std::string& handle, const std::string& field) override {
    const absl::Status not_found =
        absl::NotFoundError(absl::StrCat(field, ": no resident tensor ", Quote(handle)));
    if (handle.size() < 2 || handle[0] != 'r') return not_found;
    v1::DType dtype;
    switch (handle[1]) {
      case 'f':
        dtype = v1::FLOAT32;
        break;
      case 'h':
        dtype = v1::FLOAT16;
        break;
      case 'b':
        dtype = v1::BFLOAT16;
        break;
      default:
        return not_found;
    }
    std::vector<int64_t> shape;
    if (handle.size() > 2) {
      for (absl::string_view dim : absl::StrSplit(absl::string_view(handle).substr(2), ',')) {
        int64_t d;
        if (shape.size() == kMaxTensorRank || !absl::SimpleAtoi(dim, &d)) return not_found;
        shape.push_back(d);
      }
    }
    if (!TensorBytes(dtype, shape, field).ok()) return not_found;
    TensorView view;
    view.dtype = *ParseDType(dtype, field);
    view.shape = std::move(shape);
    view.data = &resident_bytes;
    view.device = kDeviceIndices[0];
    return view;
  }
};

// a * b * ... without overflow (the fuzzer's own arithmetic).
__int128 Product(const std::vector<int64_t>& dims) {
  __int128 p = 1;
  for (int64_t d : dims) {
    FUZZ_CHECK(d >= 0);
    p *= d;
    if (p > (__int128{1} << 100)) p = __int128{1} << 100;  // saturate: never a valid size
  }
  return p;
}

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(!status.ok());
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument ||
             status.code() == absl::StatusCode::kNotFound ||
             status.code() == absl::StatusCode::kResourceExhausted);
  FUZZ_CHECK(!status.message().empty());
  FUZZ_CHECK(status.message().size() <= kMaxErrorBytes);
  const grpc::Status mapped = ToGrpcStatus(status);
  FUZZ_CHECK(static_cast<int>(mapped.error_code()) == static_cast<int>(status.code()));
  FUZZ_CHECK(mapped.error_message() == status.message());
}

// A validated operand: its view is the tensor's bytes (inline), or a
// resident tensor (a handle).
void CheckView(const TensorView& view, const v1::Tensor& tensor) {
  FUZZ_CHECK(view.shape.size() <= size_t(kMaxTensorRank));
  const __int128 elements = Product(view.shape);
  FUZZ_CHECK(elements * __int128(DTypeSize(view.dtype)) <= std::numeric_limits<int64_t>::max());
  if (!tensor.handle().empty()) {
    FUZZ_CHECK(view.device == kDeviceIndices[0]);
    FUZZ_CHECK(view.data == &resident_bytes);
    return;
  }
  FUZZ_CHECK(view.device == kHostMemory);
  FUZZ_CHECK(view.data == tensor.data().data());
  FUZZ_CHECK(view.num_bytes() == tensor.data().size());
  FUZZ_CHECK(std::equal(view.shape.begin(), view.shape.end(), tensor.shape().begin(),
                        tensor.shape().end()));
  FUZZ_CHECK(ToProtoDType(view.dtype) == tensor.dtype());
}

bool IsNaN(DType dtype, const char* element) {
  uint32_t bits = 0;
  std::memcpy(&bits, element, DTypeSize(dtype));
  switch (dtype) {
    case DType::kFloat32:
      return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
    case DType::kFloat16:
      return (bits & 0x7c00u) == 0x7c00u && (bits & 0x03ffu) != 0;
    case DType::kBFloat16:
      return (bits & 0x7f80u) == 0x7f80u && (bits & 0x007fu) != 0;
  }
  return false;
}

// An operand in host memory as floats; converting them back gives its bytes
// (NaN as some NaN). Resident operands give nothing.
std::vector<float> ToFloats(const TensorView& view) {
  if (view.device != kHostMemory) return {};
  const int64_t n = view.num_elements();
  std::vector<float> values(static_cast<size_t>(n));
  ToFloat(view.dtype, view.data, values.data(), n);
  std::string back(view.num_bytes(), '\0');
  FromFloat(view.dtype, values.data(), back.data(), n);
  const size_t size = DTypeSize(view.dtype);
  const char* in = static_cast<const char*>(view.data);
  for (int64_t i = 0; i < n; ++i) {
    const char* a = in + i * size;
    const char* b = back.data() + i * size;
    if (IsNaN(view.dtype, a)) {
      FUZZ_CHECK(IsNaN(view.dtype, b));
    } else {
      FUZZ_CHECK(std::memcmp(a, b, size) == 0);
    }
  }
  return values;
}

void CheckWork(const WorkCost& work) {
  for (double v : {work.bytes, work.flops, work.host_bytes}) {
    FUZZ_CHECK(std::isfinite(v));
    FUZZ_CHECK(v >= 0);
  }
  FUZZ_CHECK(work.host_bytes <= work.bytes * (1 + 1e-9));
}

// The plan splits [0, extent) into non-empty ranges in order, each starting
// at a multiple of `granularity`, one per device at most, on `devices`.
void CheckShards(const ShardPlan& plan, int64_t extent, int64_t granularity,
                 const std::vector<int>& devices) {
  int64_t next = 0;
  size_t device_at = 0;
  for (const Shard& shard : plan.shards) {
    FUZZ_CHECK(shard.range.begin == next);
    FUZZ_CHECK(shard.range.end > shard.range.begin);
    FUZZ_CHECK(shard.range.begin % granularity == 0);
    while (device_at < devices.size() && devices[device_at] != shard.device) ++device_at;
    FUZZ_CHECK(device_at < devices.size());  // a device of the list, each once, in order
    ++device_at;
    next = shard.range.end;
  }
  FUZZ_CHECK(next == std::max<int64_t>(extent, 0));
}

// Plans and places an operation over every prefix of the devices: `plan_for`
// plans over weights, `extent_of` gives the plan's split extent and
// granularity, `work_of` a shard's cost.
template <typename PlanFor, typename ExtentOf, typename WorkOf>
ShardPlan CheckPlans(const Setup& setup, const PlanFor& plan_for, const ExtentOf& extent_of,
                     const WorkOf& work_of) {
  const int n = static_cast<int>(setup.weights.size());
  std::vector<int> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  const ShardPlan plan = plan_for(absl::MakeConstSpan(setup.weights));
  const auto [extent, granularity] = extent_of(plan);
  CheckShards(plan, extent, granularity, positions);
  for (const Shard& shard : plan.shards) CheckWork(work_of(plan, shard));

  std::vector<CostedDevice> candidates;
  std::vector<int> indices;
  for (int i = 0; i < n; ++i) {
    CostedDevice device;
    device.device = kDeviceIndices[i];
    device.weight = setup.weights[i];
    device.cost = {150e-6, 30e9, 4e12, 1e15};
    device.busy_seconds = i * 1e-4;
    candidates.push_back(device);
    indices.push_back(kDeviceIndices[i]);
  }
  const ShardPlan placed = PlaceByCost(candidates, plan_for, work_of);
  const auto [placed_extent, placed_granularity] = extent_of(placed);
  CheckShards(placed, placed_extent, placed_granularity, indices);
  return plan;
}

// One shard timing per shard of `plan`, as the engine reports them.
template <typename WorkOf>
std::vector<ShardTiming> Timings(const ShardPlan& plan, const WorkOf& work_of) {
  std::vector<ShardTiming> timings;
  for (const Shard& shard : plan.shards) {
    ShardTiming t;
    t.device = shard.device;
    t.axis = plan.axis;
    t.range = shard.range;
    t.run.variant = "fuzz";
    t.run.kernel_seconds = 1e-3;
    t.run.h2d_seconds = 2e-4;
    t.work = work_of(plan, shard);
    timings.push_back(std::move(t));
  }
  return timings;
}

// The output: within the limit unless kept on the server.
void CheckOutputSize(const std::vector<int64_t>& shape, const OpOptions& options,
                     int64_t extra_bytes, const Limits& limits) {
  const __int128 bytes = Product(shape) * __int128(DTypeSize(options.output_dtype)) + extra_bytes;
  FUZZ_CHECK(bytes <= std::numeric_limits<int64_t>::max());
  if (!options.keep_output) FUZZ_CHECK(bytes <= limits.max_output_bytes);
}

// A result of `shape` filled from `values` (as far as they go).
HostTensor MakeOutput(DType dtype, const std::vector<int64_t>& shape,
                      const std::vector<float>& values) {
  HostTensor out = HostTensor::Allocate(dtype, shape);
  const int64_t n = std::min<int64_t>(out.num_elements(), static_cast<int64_t>(values.size()));
  FromFloat(dtype, values.data(), out.mutable_data(), n);
  return out;
}

void CheckTensor(const v1::Tensor& tensor, DType dtype, const std::vector<int64_t>& shape) {
  FUZZ_CHECK(tensor.dtype() == ToProtoDType(dtype));
  FUZZ_CHECK(std::equal(shape.begin(), shape.end(), tensor.shape().begin(), tensor.shape().end()));
  FUZZ_CHECK(static_cast<__int128>(tensor.data().size()) ==
             Product(shape) * __int128(DTypeSize(dtype)));
  FUZZ_CHECK(tensor.handle().empty());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  FUZZ_CHECK(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// The response as a client reads it: its output's bytes attached, not
// copied (wire::Serialize), then parsed by protobuf and by wire::Parse.
template <typename Response>
void CheckResponseOnTheWire(const Response& response, const char* output_field) {
  const auto* output = wire::Field(Response::descriptor(), output_field);
  const auto* data = wire::Field(v1::Tensor::descriptor(), "data");
  FUZZ_CHECK(output != nullptr && data != nullptr);
  Response rest = response;
  auto bytes = std::make_shared<std::string>();
  auto* tensor = static_cast<v1::Tensor*>(rest.GetReflection()->MutableMessage(&rest, output));
  tensor->mutable_data()->swap(*bytes);
  std::vector<wire::Attachment> attachments;
  if (!bytes->empty()) {
    attachments.push_back(
        {{output, data}, bytes->data(), static_cast<int64_t>(bytes->size()), bytes});
  }
  const grpc::ByteBuffer sent = wire::Serialize(rest, std::move(attachments));
  const std::string expected = response.SerializeAsString();

  Response by_protobuf;
  FUZZ_CHECK(by_protobuf.ParseFromString(Flatten(sent)));
  FUZZ_CHECK(by_protobuf.SerializeAsString() == expected);

  Response by_wire;
  std::vector<wire::ExternalField> external;
  FUZZ_CHECK(wire::Parse(sent, &by_wire, &external, kSmallExternalBytes, "response").ok());
  wire::Materialize(&external);
  FUZZ_CHECK(by_wire.SerializeAsString() == expected);
}

// Validation under the setup's limit and under none: the same verdict unless
// the limit refused the output.
template <typename Spec, typename Parser>
absl::StatusOr<Spec> Validate(Op op, const Parser& parse, const Setup& setup) {
  DescribedResidents handles;
  absl::StatusOr<Spec> spec = parse(setup.limits, &handles);
  absl::StatusOr<Spec> unlimited = parse(Limits{}, &handles);
  if (!spec.ok()) CheckRefusal(spec.status());
  if (!unlimited.ok()) CheckRefusal(unlimited.status());
  if (spec.ok()) FUZZ_CHECK(unlimited.ok());
  if (!spec.ok() && spec.status().code() != absl::StatusCode::kResourceExhausted) {
    FUZZ_CHECK(!unlimited.ok());
    FUZZ_CHECK(unlimited.status() == spec.status());
  }
  ++(spec.ok() ? reached[op].accepted : reached[op].refused);
  return spec;
}

// Each operation: validate; check the spec against its request; plan, place
// and cost it; convert its operands and its result.

void FuzzGemm(const v1::GemmRequest& request, const Setup& setup) {
  const absl::StatusOr<GemmSpec> parsed = Validate<GemmSpec>(
      kGemmOp, [&](const Limits& l, HandleResolver* h) { return ParseGemm(request, l, h); }, setup);
  if (!parsed.ok()) return;
  const GemmSpec& s = *parsed;
  CheckView(s.a, request.a());
  CheckView(s.b, request.b());
  FUZZ_CHECK(s.c.has_value() == (s.beta != 0));
  if (s.c) CheckView(*s.c, request.c());
  FUZZ_CHECK(s.m >= 0 && s.n >= 0 && s.k >= 0 && s.batch >= 0);
  const __int128 batch = s.batch;
  FUZZ_CHECK(Product(s.a.shape) == (s.a_batched ? batch : 1) * s.m * s.k);
  FUZZ_CHECK(Product(s.b.shape) == (s.b_batched ? batch : 1) * s.k * s.n);
  if (s.c) FUZZ_CHECK(Product(s.c->shape) == (s.c_batched ? batch : 1) * s.m * s.n);
  FUZZ_CHECK(Product(s.out_shape) == batch * s.m * s.n);
  FUZZ_CHECK(s.a.dtype == s.dtype && s.b.dtype == s.dtype);
  CheckOutputSize(s.out_shape, s.options, 0, setup.limits);
  FUZZ_CHECK(FootprintBytes(s) >= 0);

  const auto work_of = [&](const ShardPlan&, const Shard& shard) {
    return GemmWork(s, shard.range);
  };
  ShardPlan plan;
  for (int64_t granularity : kRowGranularities) {
    plan = CheckPlans(
        setup, [&](absl::Span<const double> w) { return PlanGemm(s, w, granularity); },
        [&](const ShardPlan& p) {
          FUZZ_CHECK(p.axis == SplitAxis::kRows);
          return std::pair<int64_t, int64_t>{s.m, granularity};
        },
        work_of);
  }
  const std::vector<float> a = ToFloats(s.a);
  ToFloats(s.b);
  if (s.c) ToFloats(*s.c);
  if (s.options.keep_output ||
      Product(s.out_shape) * DTypeSize(s.options.output_dtype) > kMaxOutputBytes) {
    return;
  }
  OpResult result;
  result.output = MakeOutput(s.options.output_dtype, s.out_shape, a);
  result.shards = Timings(plan, work_of);
  v1::GemmResponse response;
  FillResponse(result, &response);
  CheckTensor(response.c(), s.options.output_dtype, s.out_shape);
  FUZZ_CHECK(response.timings().shards_size() == static_cast<int>(plan.shards.size()));
  CheckResponseOnTheWire(response, "c");
  ++reached[kGemmOp].converted;
}

void FuzzGemv(const v1::GemvRequest& request, const Setup& setup) {
  const absl::StatusOr<GemvSpec> parsed = Validate<GemvSpec>(
      kGemvOp, [&](const Limits& l, HandleResolver* h) { return ParseGemv(request, l, h); }, setup);
  if (!parsed.ok()) return;
  const GemvSpec& s = *parsed;
  CheckView(s.a, request.a());
  CheckView(s.x, request.x());
  FUZZ_CHECK(s.y.has_value() == (s.beta != 0));
  if (s.y) CheckView(*s.y, request.y());
  FUZZ_CHECK(s.m >= 0 && s.k >= 0 && s.ncols >= 1 && s.ncols <= 8);
  FUZZ_CHECK(Product(s.a.shape) == __int128(s.m) * s.k);
  FUZZ_CHECK(Product(s.x.shape) == __int128(s.k) * s.ncols);
  if (s.y) FUZZ_CHECK(s.y->shape == s.out_shape);
  FUZZ_CHECK(Product(s.out_shape) == __int128(s.m) * s.ncols);
  CheckOutputSize(s.out_shape, s.options, 0, setup.limits);
  FUZZ_CHECK(FootprintBytes(s) >= 0);

  const auto work_of = [&](const ShardPlan&, const Shard& shard) {
    return GemvWork(s, shard.range);
  };
  ShardPlan plan;
  for (int64_t granularity : kRowGranularities) {
    plan = CheckPlans(
        setup, [&](absl::Span<const double> w) { return PlanGemv(s, w, granularity); },
        [&](const ShardPlan& p) {
          FUZZ_CHECK(p.axis == SplitAxis::kRows);
          return std::pair<int64_t, int64_t>{s.m, granularity};
        },
        work_of);
  }
  const std::vector<float> a = ToFloats(s.a);
  ToFloats(s.x);
  if (s.y) ToFloats(*s.y);
  if (s.options.keep_output ||
      Product(s.out_shape) * DTypeSize(s.options.output_dtype) > kMaxOutputBytes) {
    return;
  }
  OpResult result;
  result.output = MakeOutput(s.options.output_dtype, s.out_shape, a);
  result.shards = Timings(plan, work_of);
  v1::GemvResponse response;
  FillResponse(result, &response);
  CheckTensor(response.y(), s.options.output_dtype, s.out_shape);
  CheckResponseOnTheWire(response, "y");
  ++reached[kGemvOp].converted;
}

void FuzzReduce(const v1::ReduceRequest& request, const Setup& setup) {
  const absl::StatusOr<ReduceSpec> parsed = Validate<ReduceSpec>(
      kReduceOp, [&](const Limits& l, HandleResolver* h) { return ParseReduce(request, l, h); },
      setup);
  if (!parsed.ok()) return;
  const ReduceSpec& s = *parsed;
  CheckView(s.input, request.input());
  FUZZ_CHECK(s.outer >= 0 && s.axis_len >= 0 && s.inner >= 0);
  FUZZ_CHECK(Product(s.input.shape) == __int128(s.outer) * s.axis_len * s.inner);
  FUZZ_CHECK(Product(s.out_shape) == __int128(s.outer) * s.inner);
  if (s.kind == ReduceKind::kMax || s.kind == ReduceKind::kMin) FUZZ_CHECK(s.axis_len > 0);
  CheckOutputSize(s.out_shape, s.options, 0, setup.limits);
  FUZZ_CHECK(FootprintBytes(s) >= 0);

  const auto work_of = [&](const ShardPlan& p, const Shard& shard) {
    return p.axis == SplitAxis::kOuter ? ReduceWork(s, shard.range, {0, s.axis_len}, false)
                                       : ReduceWork(s, {0, s.outer}, shard.range, true);
  };
  const ShardPlan plan = CheckPlans(
      setup, [&](absl::Span<const double> w) { return PlanReduce(s, w); },
      [&](const ShardPlan& p) {
        FUZZ_CHECK(p.axis == SplitAxis::kOuter || p.axis == SplitAxis::kAxis);
        return p.axis == SplitAxis::kOuter ? std::pair<int64_t, int64_t>{s.outer, 1}
                                           : std::pair<int64_t, int64_t>{s.axis_len, kReduceChunk};
      },
      work_of);
  const std::vector<float> input = ToFloats(s.input);
  if (s.options.keep_output ||
      Product(s.out_shape) * DTypeSize(s.options.output_dtype) > kMaxOutputBytes) {
    return;
  }
  OpResult result;
  result.output = MakeOutput(s.options.output_dtype, s.out_shape, input);
  result.shards = Timings(plan, work_of);
  v1::ReduceResponse response;
  FillResponse(result, &response);
  CheckTensor(response.output(), s.options.output_dtype, s.out_shape);
  CheckResponseOnTheWire(response, "output");
  ++reached[kReduceOp].converted;
}

void FuzzTranspose(const v1::TransposeRequest& request, const Setup& setup) {
  const absl::StatusOr<TransposeSpec> parsed = Validate<TransposeSpec>(
      kTransposeOp,
      [&](const Limits& l, HandleResolver* h) { return ParseTranspose(request, l, h); }, setup);
  if (!parsed.ok()) return;
  const TransposeSpec& s = *parsed;
  CheckView(s.input, request.input());
  FUZZ_CHECK(s.rank >= 1 && s.rank <= 4);
  FUZZ_CHECK(static_cast<int>(s.input.shape.size()) == s.rank);
  bool seen[4] = {false, false, false, false};
  for (int i = 0; i < s.rank; ++i) {
    FUZZ_CHECK(s.perm[i] >= 0 && s.perm[i] < s.rank && !seen[s.perm[i]]);
    seen[s.perm[i]] = true;
    FUZZ_CHECK(s.in_shape[i] == s.input.shape[i]);
    FUZZ_CHECK(s.out_shape[i] == s.in_shape[s.perm[i]]);
  }
  FUZZ_CHECK(static_cast<int>(s.out_shape.size()) == s.rank);
  CheckOutputSize(s.out_shape, s.options, 0, setup.limits);
  FUZZ_CHECK(FootprintBytes(s) >= 0);

  const auto work_of = [&](const ShardPlan& p, const Shard& shard) {
    return TransposeWork(s, p.prefix_axes, shard.range);
  };
  const ShardPlan plan = CheckPlans(
      setup, [&](absl::Span<const double> w) { return PlanTranspose(s, w); },
      [&](const ShardPlan& p) {
        FUZZ_CHECK(p.axis == SplitAxis::kOutBlocks);
        FUZZ_CHECK(p.prefix_axes >= 0 && p.prefix_axes <= std::max(s.rank - 1, 0));
        int64_t extent = 1;
        for (int i = 0; i < p.prefix_axes; ++i) extent *= s.out_shape[i];
        return std::pair<int64_t, int64_t>{extent, 1};
      },
      work_of);
  const std::vector<float> input = ToFloats(s.input);
  if (s.options.keep_output ||
      Product(s.out_shape) * DTypeSize(s.options.output_dtype) > kMaxOutputBytes) {
    return;
  }
  OpResult result;
  result.output = MakeOutput(s.options.output_dtype, s.out_shape, input);
  result.shards = Timings(plan, work_of);
  v1::TransposeResponse response;
  FillResponse(result, &response);
  CheckTensor(response.output(), s.options.output_dtype, s.out_shape);
  CheckResponseOnTheWire(response, "output");
  ++reached[kTransposeOp].converted;
}

void FuzzAttention(const v1::AttentionRequest& request, const Setup& setup) {
  const absl::StatusOr<AttentionSpec> parsed = Validate<AttentionSpec>(
      kAttentionOp,
      [&](const Limits& l, HandleResolver* h) { return ParseAttention(request, l, h); }, setup);
  if (!parsed.ok()) return;
  const AttentionSpec& s = *parsed;
  CheckView(s.q, request.q());
  CheckView(s.k, request.k());
  CheckView(s.v, request.v());
  FUZZ_CHECK(s.q.shape == (std::vector<int64_t>{s.batch, s.heads_q, s.seq_q, s.head_dim}));
  FUZZ_CHECK(s.k.shape == (std::vector<int64_t>{s.batch, s.heads_kv, s.seq_kv, s.head_dim}));
  FUZZ_CHECK(s.v.shape == s.k.shape);
  FUZZ_CHECK(s.heads_kv >= 1 && s.heads_q % s.heads_kv == 0);
  FUZZ_CHECK(std::isfinite(s.scale) && s.scale > 0);
  FUZZ_CHECK(s.out_shape == s.q.shape);
  const int64_t lse_bytes = s.return_lse ? s.batch * s.heads_q * s.seq_q * 4 : 0;
  CheckOutputSize(s.out_shape, s.options, lse_bytes, setup.limits);
  FUZZ_CHECK(FootprintBytes(s) >= 0);

  const auto work_of = [&](const ShardPlan& p, const Shard& shard) {
    return p.axis == SplitAxis::kHeads ? AttentionWork(s, shard.range, {0, s.seq_q})
                                       : AttentionWork(s, {0, s.batch * s.heads_q}, shard.range);
  };
  const ShardPlan plan = CheckPlans(
      setup, [&](absl::Span<const double> w) { return PlanAttention(s, w); },
      [&](const ShardPlan& p) {
        FUZZ_CHECK(p.axis == SplitAxis::kHeads || p.axis == SplitAxis::kQueryRows);
        return p.axis == SplitAxis::kHeads ? std::pair<int64_t, int64_t>{s.batch * s.heads_q, 1}
                                           : std::pair<int64_t, int64_t>{s.seq_q, 1};
      },
      work_of);
  const std::vector<float> q = ToFloats(s.q);
  ToFloats(s.k);
  ToFloats(s.v);
  if (s.options.keep_output ||
      Product(s.out_shape) * DTypeSize(s.options.output_dtype) + lse_bytes > kMaxOutputBytes) {
    return;
  }
  OpResult result;
  result.output = MakeOutput(s.options.output_dtype, s.out_shape, q);
  const std::vector<int64_t> lse_shape = {s.batch, s.heads_q, s.seq_q};
  if (s.return_lse) result.lse = MakeOutput(DType::kFloat32, lse_shape, q);
  result.shards = Timings(plan, work_of);
  v1::AttentionResponse response;
  FillResponse(result, &response);
  CheckTensor(response.o(), s.options.output_dtype, s.out_shape);
  FUZZ_CHECK(response.has_lse() == s.return_lse);
  if (s.return_lse) CheckTensor(response.lse(), DType::kFloat32, lse_shape);
  CheckResponseOnTheWire(response, "o");
  ++reached[kAttentionOp].converted;
}

void FuzzBatch(const v1::BatchRequest& request, const Setup& setup) {
  switch (request.op_case()) {
    case v1::BatchRequest::kGemm:
      return FuzzGemm(request.gemm(), setup);
    case v1::BatchRequest::kGemv:
      return FuzzGemv(request.gemv(), setup);
    case v1::BatchRequest::kReduce:
      return FuzzReduce(request.reduce(), setup);
    case v1::BatchRequest::kTranspose:
      return FuzzTranspose(request.transpose(), setup);
    case v1::BatchRequest::kAttention:
      return FuzzAttention(request.attention(), setup);
    case v1::BatchRequest::OP_NOT_SET:
      return;
  }
}

// Echo: any valid inline tensor.
void FuzzEcho(const v1::EchoRequest& request) {
  absl::StatusOr<TensorView> view = ParseTensor(request.input(), "input");
  if (!view.ok()) {
    CheckRefusal(view.status());
    FUZZ_CHECK(view.status().code() == absl::StatusCode::kInvalidArgument);
    ++reached[kEchoOp].refused;
    return;
  }
  CheckView(*view, request.input());
  ToFloats(*view);
  ++reached[kEchoOp].accepted;
}

// Upload: the message as the stream parses it (its data left in the
// slices), then its header.
void FuzzUpload(const std::string& bytes) {
  for (int64_t threshold : {kUploadExternalBytes, kSmallExternalBytes}) {
    grpc::Slice slice(bytes.data(), bytes.size());
    const grpc::ByteBuffer raw(&slice, 1);
    v1::UploadRequest chunk;
    std::vector<wire::ExternalField> external;
    if (!wire::Parse(raw, &chunk, &external, threshold, "request").ok()) {
      FUZZ_CHECK(external.empty());
      continue;
    }
    FUZZ_CHECK(external.size() <= 1);
    for (const wire::ExternalField& e : external) {
      FUZZ_CHECK(e.owner == &chunk && e.field->name() == "data" && chunk.data().empty());
      FUZZ_CHECK(e.bytes.size() >= threshold);
    }
    if (!chunk.has_header()) continue;
    const absl::StatusOr<UploadPart> part = ParseUploadHeader(chunk.header());
    if (!part.ok()) {
      CheckRefusal(part.status());
      FUZZ_CHECK(part.status().code() == absl::StatusCode::kInvalidArgument);
      ++reached[kUploadOp].refused;
      continue;
    }
    ++reached[kUploadOp].accepted;
    const absl::StatusOr<int64_t> bytes_of =
        TensorBytes(chunk.header().dtype(), chunk.header().shape(), "header");
    FUZZ_CHECK(bytes_of.ok() && *bytes_of == part->bytes);
    FUZZ_CHECK(0 <= part->begin && part->begin <= part->end && part->end <= part->bytes);
    if (chunk.header().parts() <= 1) FUZZ_CHECK(part->begin == 0 && part->end == part->bytes);
  }
}

Setup MakeSetup(uint8_t knobs) {
  Setup setup;
  setup.kind = static_cast<Kind>(knobs & 7);
  const int devices = 1 + ((knobs >> 3) & 3);
  setup.weights.assign(kWeights, kWeights + devices);
  setup.limits.max_output_bytes = kOutputLimits[knobs >> 5];
  return setup;
}

void FuzzOne(const uint8_t* data, size_t size) {
  if (size < 1) return;
  const Setup setup = MakeSetup(data[0]);
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (setup.kind) {
    case Kind::kGemm: {
      v1::GemmRequest request;
      if (request.ParseFromString(bytes)) FuzzGemm(request, setup);
      return;
    }
    case Kind::kGemv: {
      v1::GemvRequest request;
      if (request.ParseFromString(bytes)) FuzzGemv(request, setup);
      return;
    }
    case Kind::kReduce: {
      v1::ReduceRequest request;
      if (request.ParseFromString(bytes)) FuzzReduce(request, setup);
      return;
    }
    case Kind::kTranspose: {
      v1::TransposeRequest request;
      if (request.ParseFromString(bytes)) FuzzTranspose(request, setup);
      return;
    }
    case Kind::kAttention: {
      v1::AttentionRequest request;
      if (request.ParseFromString(bytes)) FuzzAttention(request, setup);
      return;
    }
    case Kind::kBatch: {
      v1::BatchRequest request;
      if (request.ParseFromString(bytes)) FuzzBatch(request, setup);
      return;
    }
    case Kind::kEcho: {
      v1::EchoRequest request;
      if (request.ParseFromString(bytes)) FuzzEcho(request);
      return;
    }
    case Kind::kUpload:
      FuzzUpload(bytes);
      return;
  }
}

}  // namespace
}  // namespace gpucompute

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field with invalid UTF-8 it refuses.
  google::protobuf::SetLogHandler(nullptr);
  // gRPC's and protobuf's process-wide state, made once before the first
  // input so that its allocations are not taken for that input's leaks.
  grpc::Slice slice(std::string("init"));
  const grpc::ByteBuffer buffer(&slice, 1);
  gpucompute::v1::BatchRequest request;
  request.mutable_gemm()->mutable_a()->add_shape(1);
  std::string bytes = request.SerializeAsString();
  request.ParseFromString(bytes);
  if (std::getenv("GC_FUZZ_STATS") != nullptr) std::atexit(gpucompute::PrintReached);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gpucompute::FuzzOne(data, size);
  return 0;
}
