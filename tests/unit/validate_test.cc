// Validation of every request field: the code, and a message that names the
// field. Valid requests produce specs that borrow the request's bytes.
#include "server/service/validate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "server/core/cost.h"

namespace gpucompute {
namespace {

using ::absl::StatusCode;

// A well-formed tensor of `shape` (data zero-filled).
v1::Tensor MakeTensor(std::vector<int64_t> shape, v1::DType dtype = v1::FLOAT32) {
  v1::Tensor t;
  t.set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.add_shape(d);
    n *= d;
  }
  t.mutable_data()->assign(static_cast<size_t>(n) * (dtype == v1::FLOAT32 ? 4 : 2), '\0');
  return t;
}

// The status has `code` and its message starts with "<field>:".
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, StatusCode code, const std::string& field) {
  ASSERT_FALSE(result.ok()) << "expected an error naming " << field;
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_TRUE(absl::StartsWith(result.status().message(), field + ":"))
      << "message does not start with \"" << field << ":\": " << result.status().message();
}

v1::GemmRequest Gemm(std::vector<int64_t> a, std::vector<int64_t> b) {
  v1::GemmRequest r;
  *r.mutable_a() = MakeTensor(a);
  *r.mutable_b() = MakeTensor(b);
  return r;
}

// --- tensors -----------------------------------------------------------------

TEST(ParseTensorTest, AcceptsEveryDtypeAndBorrowsTheBytes) {
  for (auto [dtype, ours] :
       {std::pair{v1::FLOAT32, DType::kFloat32}, std::pair{v1::FLOAT16, DType::kFloat16},
        std::pair{v1::BFLOAT16, DType::kBFloat16}}) {
    v1::Tensor t = MakeTensor({3, 5}, dtype);
    absl::StatusOr<TensorView> view = ParseTensor(t, "x");
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, ours);
    EXPECT_EQ(view->shape, (std::vector<int64_t>{3, 5}));
    EXPECT_EQ(view->data, t.data().data());
  }
}

TEST(ParseTensorTest, AcceptsScalarsAndEmptyTensors) {
  EXPECT_TRUE(ParseTensor(MakeTensor({}), "x").ok());
  EXPECT_TRUE(ParseTensor(MakeTensor({0, 7}), "x").ok());
  v1::Tensor huge_but_empty = MakeTensor({0});
  huge_but_empty.add_shape(int64_t{1} << 40);
  EXPECT_TRUE(ParseTensor(huge_but_empty, "x").ok());
}

TEST(ParseTensorTest, RejectsUnspecifiedDtype) {
  v1::Tensor t = MakeTensor({2});
  t.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectError(ParseTensor(t, "a"), StatusCode::kInvalidArgument, "a.dtype");
}

TEST(ParseTensorTest, RejectsUnknownDtypeValue) {
  v1::Tensor t = MakeTensor({2});
  t.set_dtype(static_cast<v1::DType>(42));
  ExpectError(ParseTensor(t, "a"), StatusCode::kInvalidArgument, "a.dtype");
}

TEST(ParseTensorTest, RejectsNegativeDimension) {
  v1::Tensor t = MakeTensor({2, 3});
  t.set_shape(1, -3);
  ExpectError(ParseTensor(t, "q"), StatusCode::kInvalidArgument, "q.shape[1]");
}

TEST(ParseTensorTest, RejectsAHugeRankWithAShortMessage) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  for (int i = 0; i < 1000000; ++i) t.add_shape(1);
  t.set_data(std::string(4, '\0'));
  absl::StatusOr<TensorView> view = ParseTensor(t, "a");
  ExpectError(view, StatusCode::kInvalidArgument, "a.shape");
  EXPECT_LT(view.status().message().size(), 200u);
  // Rank 8 still passes.
  v1::Tensor eight = MakeTensor({1, 1, 1, 1, 1, 1, 1, 2});
  EXPECT_TRUE(ParseTensor(eight, "a").ok());
}

// A resident tensor of rank 2, whatever the handle.
class OneResident final : public HandleResolver {
 public:
  absl::StatusOr<TensorView> Resolve(const std::string& handle, const std::string& field) override {
    TensorView view;
    view.shape = {2, 3};
    view.data = &byte_;
    view.device = 0;
    return view;
  }

 private:
  char byte_ = 0;
};

// Beside a handle too: the shape the request gives is not echoed whole in
// the message that says it is not the resident tensor's (a 400-axis shape
// gave a 1.2 kB message, past what tests/fuzz/fuzz_request allows).
TEST(ParseTensorTest, RejectsAHugeRankBesideAHandleWithAShortMessage) {
  OneResident resident;
  v1::Tensor t;
  t.set_handle("t1");
  for (int i = 0; i < 1000000; ++i) t.add_shape(7);
  absl::StatusOr<TensorView> view = ParseTensor(t, "a", &resident);
  ExpectError(view, StatusCode::kInvalidArgument, "a.shape");
  EXPECT_LT(view.status().message().size(), 200u);
  t.mutable_shape()->Truncate(2);
  view = ParseTensor(t, "a", &resident);
  ExpectError(view, StatusCode::kInvalidArgument, "a.shape");  // [7, 7], not [2, 3]
  t.mutable_shape()->Set(0, 2);
  t.mutable_shape()->Set(1, 3);
  EXPECT_TRUE(ParseTensor(t, "a", &resident).ok());
}

TEST(ParseTensorTest, RejectsShapeProductOverflow) {
  v1::Tensor t;
  t.set_dtype(v1::FLOAT32);
  t.add_shape(int64_t{1} << 32);
  t.add_shape(int64_t{1} << 32);
  ExpectError(ParseTensor(t, "input"), StatusCode::kInvalidArgument, "input.shape");
  // The element count fits but the byte count does not.
  v1::Tensor bytes;
  bytes.set_dtype(v1::FLOAT32);
  bytes.add_shape(int64_t{1} << 62);
  ExpectError(ParseTensor(bytes, "input"), StatusCode::kInvalidArgument, "input.shape");
}

TEST(ParseTensorTest, RejectsByteLengthMismatch) {
  v1::Tensor t = MakeTensor({4, 4});
  t.mutable_data()->pop_back();
  ExpectError(ParseTensor(t, "b"), StatusCode::kInvalidArgument, "b.data");
  v1::Tensor half = MakeTensor({4}, v1::FLOAT16);
  half.mutable_data()->append(8, '\0');  // sized as float32
  ExpectError(ParseTensor(half, "b"), StatusCode::kInvalidArgument, "b.data");
}

// --- options -----------------------------------------------------------------

TEST(ParseOptionsTest, OutputDtypeDefaultsToInput) {
  v1::OpOptions options;
  absl::StatusOr<OpOptions> parsed = ParseOptions(options, DType::kBFloat16);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->output_dtype, DType::kBFloat16);
  options.set_output_dtype(v1::FLOAT32);
  options.set_variant("naive");
  options.add_devices(2);
  options.add_devices(0);
  options.set_allow_tf32(true);
  parsed = ParseOptions(options, DType::kBFloat16);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->output_dtype, DType::kFloat32);
  EXPECT_EQ(parsed->variant, "naive");
  EXPECT_EQ(parsed->devices, (std::vector<int>{2, 0}));
  EXPECT_TRUE(parsed->allow_tf32);
}

TEST(ParseOptionsTest, RejectsBadOutputDtypeAndDevices) {
  v1::OpOptions options;
  options.set_output_dtype(static_cast<v1::DType>(9));
  ExpectError(ParseOptions(options, DType::kFloat32), StatusCode::kInvalidArgument,
              "options.output_dtype");
  options.Clear();
  options.add_devices(-1);
  ExpectError(ParseOptions(options, DType::kFloat32), StatusCode::kInvalidArgument,
              "options.devices[0]");
  options.Clear();
  options.add_devices(1);
  options.add_devices(1);
  ExpectError(ParseOptions(options, DType::kFloat32), StatusCode::kInvalidArgument,
              "options.devices");
}

// --- GEMM --------------------------------------------------------------------

TEST(ParseGemmTest, PlainBatchedAndTransposedShapes) {
  {
    v1::GemmRequest r = Gemm({7, 33}, {33, 5});
    absl::StatusOr<GemmSpec> spec = ParseGemm(r);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->m, 7);
    EXPECT_EQ(spec->k, 33);
    EXPECT_EQ(spec->n, 5);
    EXPECT_EQ(spec->batch, 1);
    EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{7, 5}));
    EXPECT_EQ(spec->alpha, 1.0);
    EXPECT_EQ(spec->beta, 0.0);
    EXPECT_FALSE(spec->c.has_value());
    EXPECT_EQ(spec->a.data, r.a().data().data());
    EXPECT_EQ(spec->b.data, r.b().data().data());
    EXPECT_EQ(spec->options.output_dtype, DType::kFloat32);
  }
  {
    v1::GemmRequest r = Gemm({3, 33, 7}, {33, 5});  // B shared by the batch
    r.set_transpose_a(true);
    absl::StatusOr<GemmSpec> spec = ParseGemm(r);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->batch, 3);
    EXPECT_EQ(spec->m, 7);
    EXPECT_EQ(spec->k, 33);
    EXPECT_TRUE(spec->a_batched);
    EXPECT_FALSE(spec->b_batched);
    EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{3, 7, 5}));
  }
  {
    v1::GemmRequest r = Gemm({2, 7, 33}, {2, 5, 33});
    r.set_transpose_b(true);
    r.set_alpha(0.5);
    r.set_beta(2);
    *r.mutable_c() = MakeTensor({2, 7, 5});
    absl::StatusOr<GemmSpec> spec = ParseGemm(r);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->n, 5);
    EXPECT_TRUE(spec->b_batched);
    EXPECT_TRUE(spec->c_batched);
    ASSERT_TRUE(spec->c.has_value());
    EXPECT_EQ(spec->c->data, r.c().data().data());
    EXPECT_EQ(spec->alpha, 0.5);
    EXPECT_EQ(spec->beta, 2.0);
  }
}

TEST(ParseGemmTest, OutputDtypeResolution) {
  v1::GemmRequest r;
  *r.mutable_a() = MakeTensor({2, 3}, v1::BFLOAT16);
  *r.mutable_b() = MakeTensor({3, 4}, v1::BFLOAT16);
  absl::StatusOr<GemmSpec> spec = ParseGemm(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->dtype, DType::kBFloat16);
  EXPECT_EQ(spec->options.output_dtype, DType::kBFloat16);
  r.mutable_options()->set_output_dtype(v1::FLOAT32);
  spec = ParseGemm(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->options.output_dtype, DType::kFloat32);
}

TEST(ParseGemmTest, RejectsMissingTensors) {
  v1::GemmRequest r = Gemm({2, 3}, {3, 4});
  r.clear_a();
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "a");
  r = Gemm({2, 3}, {3, 4});
  r.clear_b();
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "b");
}

TEST(ParseGemmTest, RejectsMismatchedDtype) {
  v1::GemmRequest r = Gemm({2, 3}, {3, 4});
  *r.mutable_b() = MakeTensor({3, 4}, v1::FLOAT16);
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "b.dtype");
  r = Gemm({2, 3}, {3, 4});
  r.set_beta(1);
  *r.mutable_c() = MakeTensor({2, 4}, v1::BFLOAT16);
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "c.dtype");
}

TEST(ParseGemmTest, RejectsBadRank) {
  ExpectError(ParseGemm(Gemm({6}, {6, 4})), StatusCode::kInvalidArgument, "a.shape");
  ExpectError(ParseGemm(Gemm({2, 3}, {1, 1, 3, 4})), StatusCode::kInvalidArgument, "b.shape");
}

TEST(ParseGemmTest, RejectsInnerDimensionMismatch) {
  ExpectError(ParseGemm(Gemm({2, 3}, {4, 5})), StatusCode::kInvalidArgument, "b.shape[0]");
  v1::GemmRequest r = Gemm({2, 3}, {2, 5});
  r.set_transpose_a(true);  // op(A) is [3, 2]: K = 2 matches
  EXPECT_TRUE(ParseGemm(r).ok());
  r = Gemm({2, 3}, {5, 4});
  r.set_transpose_b(true);  // op(B) is [4, 5]: K = 4 != 3
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "b.shape[1]");
}

TEST(ParseGemmTest, RejectsBatchMismatch) {
  ExpectError(ParseGemm(Gemm({2, 3, 4}, {3, 4, 5})), StatusCode::kInvalidArgument, "b.shape[0]");
}

TEST(ParseGemmTest, BetaNeedsC) {
  v1::GemmRequest r = Gemm({2, 3}, {3, 4});
  r.set_beta(0.5);
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "c");
  *r.mutable_c() = MakeTensor({4, 2});
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "c.shape");
  *r.mutable_c() = MakeTensor({2, 4});
  EXPECT_TRUE(ParseGemm(r).ok());
  // C is not read when beta == 0.
  r.set_beta(0);
  absl::StatusOr<GemmSpec> spec = ParseGemm(r);
  ASSERT_TRUE(spec.ok());
  EXPECT_FALSE(spec->c.has_value());
}

TEST(ParseGemmTest, RejectsResultOverTheLimit) {
  Limits limits;
  limits.max_output_bytes = 1000;
  EXPECT_TRUE(ParseGemm(Gemm({10, 3}, {3, 25}), limits).ok());  // exactly 1000 bytes
  ExpectError(ParseGemm(Gemm({10, 3}, {3, 26}), limits), StatusCode::kResourceExhausted, "c");
  // Empty inputs whose product would not fit in int64 bytes.
  ExpectError(ParseGemm(Gemm({int64_t{1} << 40, 0}, {0, int64_t{1} << 40})),
              StatusCode::kResourceExhausted, "c");
}

TEST(ParseGemmTest, RejectsBadOptions) {
  v1::GemmRequest r = Gemm({2, 3}, {3, 4});
  r.mutable_options()->set_output_dtype(static_cast<v1::DType>(7));
  ExpectError(ParseGemm(r), StatusCode::kInvalidArgument, "options.output_dtype");
}

// --- GEMV --------------------------------------------------------------------

v1::GemvRequest Gemv(std::vector<int64_t> a, std::vector<int64_t> x) {
  v1::GemvRequest r;
  *r.mutable_a() = MakeTensor(a);
  *r.mutable_x() = MakeTensor(x);
  return r;
}

TEST(ParseGemvTest, VectorAndThinMatrix) {
  absl::StatusOr<GemvSpec> spec = ParseGemv(Gemv({127, 33}, {33}));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->m, 127);
  EXPECT_EQ(spec->k, 33);
  EXPECT_EQ(spec->ncols, 1);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{127}));
  v1::GemvRequest r = Gemv({33, 127}, {33, 8});
  r.set_transpose_a(true);
  spec = ParseGemv(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->m, 127);
  EXPECT_EQ(spec->ncols, 8);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{127, 8}));
}

TEST(ParseGemvTest, RejectsMissingTensors) {
  v1::GemvRequest r = Gemv({2, 3}, {3});
  r.clear_x();
  ExpectError(ParseGemv(r), StatusCode::kInvalidArgument, "x");
  r = Gemv({2, 3}, {3});
  r.clear_a();
  ExpectError(ParseGemv(r), StatusCode::kInvalidArgument, "a");
}

TEST(ParseGemvTest, RejectsBadRankDtypeAndInnerDimension) {
  ExpectError(ParseGemv(Gemv({2, 3, 4}, {4})), StatusCode::kInvalidArgument, "a.shape");
  ExpectError(ParseGemv(Gemv({2, 3}, {3, 1, 1})), StatusCode::kInvalidArgument, "x.shape");
  ExpectError(ParseGemv(Gemv({2, 3}, {4})), StatusCode::kInvalidArgument, "x.shape[0]");
  v1::GemvRequest r = Gemv({2, 3}, {3});
  *r.mutable_x() = MakeTensor({3}, v1::FLOAT16);
  ExpectError(ParseGemv(r), StatusCode::kInvalidArgument, "x.dtype");
}

TEST(ParseGemvTest, RejectsMoreThanEightColumns) {
  ExpectError(ParseGemv(Gemv({2, 3}, {3, 9})), StatusCode::kInvalidArgument, "x.shape[1]");
  ExpectError(ParseGemv(Gemv({2, 3}, {3, 0})), StatusCode::kInvalidArgument, "x.shape[1]");
}

TEST(ParseGemvTest, BetaNeedsY) {
  v1::GemvRequest r = Gemv({2, 3}, {3, 2});
  r.set_beta(-1);
  ExpectError(ParseGemv(r), StatusCode::kInvalidArgument, "y");
  *r.mutable_y() = MakeTensor({2});
  ExpectError(ParseGemv(r), StatusCode::kInvalidArgument, "y.shape");
  *r.mutable_y() = MakeTensor({2, 2});
  absl::StatusOr<GemvSpec> spec = ParseGemv(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->y.has_value());
}

// --- reduce ------------------------------------------------------------------

v1::ReduceRequest Reduce(std::vector<int64_t> shape, v1::ReduceOp op) {
  v1::ReduceRequest r;
  *r.mutable_input() = MakeTensor(shape);
  r.set_op(op);
  return r;
}

TEST(ParseReduceTest, FullAndAxisReductions) {
  absl::StatusOr<ReduceSpec> spec = ParseReduce(Reduce({2, 3, 4}, v1::SUM));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, ReduceKind::kSum);
  EXPECT_EQ(spec->outer, 1);
  EXPECT_EQ(spec->axis_len, 24);
  EXPECT_EQ(spec->inner, 1);
  EXPECT_TRUE(spec->out_shape.empty());

  v1::ReduceRequest r = Reduce({2, 3, 4}, v1::MEAN);
  r.set_keepdims(true);
  spec = ParseReduce(r);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{1, 1, 1}));

  r = Reduce({2, 3, 4}, v1::MAX);
  r.set_has_axis(true);
  r.set_axis(-2);
  spec = ParseReduce(r);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->kind, ReduceKind::kMax);
  EXPECT_EQ(spec->outer, 2);
  EXPECT_EQ(spec->axis_len, 3);
  EXPECT_EQ(spec->inner, 4);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{2, 4}));
  r.set_keepdims(true);
  spec = ParseReduce(r);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{2, 1, 4}));
}

TEST(ParseReduceTest, RejectsMissingInputAndBadOp) {
  v1::ReduceRequest r = Reduce({3}, v1::SUM);
  r.clear_input();
  ExpectError(ParseReduce(r), StatusCode::kInvalidArgument, "input");
  ExpectError(ParseReduce(Reduce({3}, v1::REDUCE_OP_UNSPECIFIED)), StatusCode::kInvalidArgument,
              "op");
  ExpectError(ParseReduce(Reduce({3}, static_cast<v1::ReduceOp>(17))), StatusCode::kInvalidArgument,
              "op");
}

TEST(ParseReduceTest, RejectsAxisOutOfRange) {
  for (int axis : {2, -3, 100}) {
    v1::ReduceRequest r = Reduce({2, 3}, v1::SUM);
    r.set_has_axis(true);
    r.set_axis(axis);
    ExpectError(ParseReduce(r), StatusCode::kInvalidArgument, "axis");
  }
  v1::ReduceRequest scalar = Reduce({}, v1::SUM);
  scalar.set_has_axis(true);
  ExpectError(ParseReduce(scalar), StatusCode::kInvalidArgument, "axis");
}

TEST(ParseReduceTest, MaxAndMinOfNothingAreErrorsSumAndMeanAreNot) {
  ExpectError(ParseReduce(Reduce({0}, v1::MAX)), StatusCode::kInvalidArgument, "input");
  ExpectError(ParseReduce(Reduce({3, 0}, v1::MIN)), StatusCode::kInvalidArgument, "input");
  v1::ReduceRequest r = Reduce({3, 0}, v1::MIN);
  r.set_has_axis(true);
  r.set_axis(0);  // reduces 3 elements into an empty output: fine
  EXPECT_TRUE(ParseReduce(r).ok());
  r.set_axis(1);  // reduces 0 elements per output
  ExpectError(ParseReduce(r), StatusCode::kInvalidArgument, "input");
  EXPECT_TRUE(ParseReduce(Reduce({0}, v1::SUM)).ok());
  EXPECT_TRUE(ParseReduce(Reduce({0}, v1::MEAN)).ok());
}

// --- transpose ---------------------------------------------------------------

v1::TransposeRequest Transpose(std::vector<int64_t> shape, std::vector<int> perm) {
  v1::TransposeRequest r;
  *r.mutable_input() = MakeTensor(shape);
  for (int p : perm) r.add_perm(p);
  return r;
}

TEST(ParseTransposeTest, DefaultReversesAndNegativeAxesCount) {
  absl::StatusOr<TransposeSpec> spec = ParseTranspose(Transpose({7, 33}, {}));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->rank, 2);
  EXPECT_EQ(spec->perm[0], 1);
  EXPECT_EQ(spec->perm[1], 0);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{33, 7}));
  spec = ParseTranspose(Transpose({2, 3, 4, 5}, {-1, 0, 2, 1}));
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->perm[0], 3);
  EXPECT_EQ(spec->in_shape[3], 5);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{5, 2, 4, 3}));
}

TEST(ParseTransposeTest, RejectsBadRank) {
  ExpectError(ParseTranspose(Transpose({}, {})), StatusCode::kInvalidArgument, "input.shape");
  ExpectError(ParseTranspose(Transpose({1, 1, 1, 1, 1}, {})), StatusCode::kInvalidArgument,
              "input.shape");
  v1::TransposeRequest r = Transpose({2}, {});
  r.clear_input();
  ExpectError(ParseTranspose(r), StatusCode::kInvalidArgument, "input");
}

TEST(ParseTransposeTest, RejectsBadPermutation) {
  ExpectError(ParseTranspose(Transpose({2, 3, 4}, {0, 1})), StatusCode::kInvalidArgument, "perm");
  ExpectError(ParseTranspose(Transpose({2, 3, 4}, {0, 3, 1})), StatusCode::kInvalidArgument,
              "perm[1]");
  ExpectError(ParseTranspose(Transpose({2, 3, 4}, {0, -4, 1})), StatusCode::kInvalidArgument,
              "perm[1]");
  ExpectError(ParseTranspose(Transpose({2, 3, 4}, {0, 1, 1})), StatusCode::kInvalidArgument,
              "perm");
  ExpectError(ParseTranspose(Transpose({2, 3, 4}, {2, -1, 0})), StatusCode::kInvalidArgument,
              "perm");
}

// --- attention ---------------------------------------------------------------

v1::AttentionRequest Attention(std::vector<int64_t> q, std::vector<int64_t> kv,
                               v1::DType dtype = v1::FLOAT32) {
  v1::AttentionRequest r;
  *r.mutable_q() = MakeTensor(q, dtype);
  *r.mutable_k() = MakeTensor(kv, dtype);
  *r.mutable_v() = MakeTensor(kv, dtype);
  return r;
}

TEST(ParseAttentionTest, GroupedQueryShapesAndDefaultScale) {
  v1::AttentionRequest r = Attention({2, 8, 7, 64}, {2, 2, 33, 64}, v1::BFLOAT16);
  r.set_causal(true);
  r.set_return_lse(true);
  absl::StatusOr<AttentionSpec> spec = ParseAttention(r);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->batch, 2);
  EXPECT_EQ(spec->heads_q, 8);
  EXPECT_EQ(spec->heads_kv, 2);
  EXPECT_EQ(spec->seq_q, 7);
  EXPECT_EQ(spec->seq_kv, 33);
  EXPECT_EQ(spec->head_dim, 64);
  EXPECT_DOUBLE_EQ(spec->scale, 0.125);
  EXPECT_TRUE(spec->causal);
  EXPECT_TRUE(spec->return_lse);
  EXPECT_EQ(spec->dtype, DType::kBFloat16);
  EXPECT_EQ(spec->out_shape, (std::vector<int64_t>{2, 8, 7, 64}));
  r.set_scale(0.5);
  spec = ParseAttention(r);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->scale, 0.5);
}

TEST(ParseAttentionTest, EverySupportedHeadDim) {
  for (int64_t d : {8, 32, 40, 64, 96, 128, 200, 256}) {
    EXPECT_TRUE(ParseAttention(Attention({1, 1, 3, d}, {1, 1, 5, d})).ok()) << d;
  }
}

TEST(ParseAttentionTest, RejectsUnsupportedHeadDimListingTheSupportedOnes) {
  for (int64_t d : {1, 60, 100, 264}) {
    absl::StatusOr<AttentionSpec> spec = ParseAttention(Attention({1, 1, 3, d}, {1, 1, 5, d}));
    ExpectError(spec, StatusCode::kInvalidArgument, "q.shape[3]");
    EXPECT_TRUE(absl::StrContains(spec.status().message(), "8, 16, 24, 32, 40")) << spec.status();
    EXPECT_TRUE(absl::StrContains(spec.status().message(), "248, 256")) << spec.status();
  }
  Limits limits;
  limits.head_dims = {64, 128};
  ExpectError(ParseAttention(Attention({1, 1, 3, 32}, {1, 1, 5, 32}), limits),
              StatusCode::kInvalidArgument, "q.shape[3]");
}

TEST(ParseAttentionTest, RejectsMissingTensorsAndBadRank) {
  for (const char* field : {"q", "k", "v"}) {
    v1::AttentionRequest r = Attention({1, 2, 3, 64}, {1, 2, 5, 64});
    r.GetReflection()->ClearField(&r, r.GetDescriptor()->FindFieldByName(field));
    ExpectError(ParseAttention(r), StatusCode::kInvalidArgument, field);
  }
  ExpectError(ParseAttention(Attention({2, 3, 64}, {1, 2, 5, 64})), StatusCode::kInvalidArgument,
              "q.shape");
  ExpectError(ParseAttention(Attention({1, 2, 3, 64}, {2, 5, 64})), StatusCode::kInvalidArgument,
              "k.shape");
}

TEST(ParseAttentionTest, RejectsMismatches) {
  v1::AttentionRequest r = Attention({1, 2, 3, 64}, {1, 2, 5, 64});
  *r.mutable_v() = MakeTensor({1, 2, 5, 64}, v1::FLOAT16);
  ExpectError(ParseAttention(r), StatusCode::kInvalidArgument, "v.dtype");
  ExpectError(ParseAttention(Attention({2, 2, 3, 64}, {1, 2, 5, 64})), StatusCode::kInvalidArgument,
              "k.shape[0]");
  ExpectError(ParseAttention(Attention({1, 2, 3, 64}, {1, 2, 5, 128})),
              StatusCode::kInvalidArgument, "k.shape[3]");
  r = Attention({1, 2, 3, 64}, {1, 2, 5, 64});
  *r.mutable_v() = MakeTensor({1, 2, 6, 64});
  ExpectError(ParseAttention(r), StatusCode::kInvalidArgument, "v.shape");
}

TEST(ParseAttentionTest, RejectsHeadsThatDoNotGroup) {
  ExpectError(ParseAttention(Attention({1, 6, 3, 64}, {1, 4, 5, 64})), StatusCode::kInvalidArgument,
              "q.shape[1]");
  ExpectError(ParseAttention(Attention({1, 2, 3, 64}, {1, 0, 5, 64})), StatusCode::kInvalidArgument,
              "k.shape[1]");
}

TEST(ParseAttentionTest, RejectsBadScale) {
  for (double scale :
       {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    v1::AttentionRequest r = Attention({1, 1, 3, 64}, {1, 1, 5, 64});
    r.set_scale(scale);
    ExpectError(ParseAttention(r), StatusCode::kInvalidArgument, "scale");
  }
}

TEST(ParseAttentionTest, ResultLimitCountsTheLse) {
  Limits limits;
  limits.max_output_bytes = 1 * 1 * 4 * 64 * 4;  // O exactly
  v1::AttentionRequest r = Attention({1, 1, 4, 64}, {1, 1, 5, 64});
  EXPECT_TRUE(ParseAttention(r, limits).ok());
  r.set_return_lse(true);
  ExpectError(ParseAttention(r, limits), StatusCode::kResourceExhausted, "o");
}

// --- footprint ---------------------------------------------------------------

TEST(FootprintTest, CountsInputsAndOutputs) {
  v1::GemmRequest r = Gemm({7, 33}, {33, 5});
  r.mutable_options()->set_output_dtype(v1::FLOAT16);
  absl::StatusOr<GemmSpec> gemm = ParseGemm(r);
  ASSERT_TRUE(gemm.ok());
  EXPECT_EQ(FootprintBytes(*gemm), (7 * 33 + 33 * 5) * 4 + 7 * 5 * 2);
  absl::StatusOr<ReduceSpec> reduce = ParseReduce(Reduce({10, 3}, v1::SUM));
  ASSERT_TRUE(reduce.ok());
  EXPECT_EQ(FootprintBytes(*reduce), 30 * 4 + 4);
  absl::StatusOr<GemvSpec> gemv = ParseGemv(Gemv({9, 4}, {4, 3}));
  ASSERT_TRUE(gemv.ok());
  EXPECT_EQ(FootprintBytes(*gemv), (9 * 4 + 4 * 3 + 9 * 3) * 4);
  absl::StatusOr<TransposeSpec> transpose = ParseTranspose(Transpose({2, 3, 5}, {2, 0, 1}));
  ASSERT_TRUE(transpose.ok());
  EXPECT_EQ(FootprintBytes(*transpose), 2 * 30 * 4);
  // GQA: every K and V head once, whatever the query heads; the LSE in fp32.
  v1::AttentionRequest a = Attention({2, 8, 16, 64}, {2, 2, 40, 64});
  a.set_causal(true);
  a.set_return_lse(true);
  absl::StatusOr<AttentionSpec> attention = ParseAttention(a);
  ASSERT_TRUE(attention.ok()) << attention.status();
  EXPECT_EQ(FootprintBytes(*attention),
            (2 * 2 * 16 * 64 * 8 + 2 * 2 * 2 * 40 * 64) * 4 + 2 * 8 * 16 * 4);
}

}  // namespace
}  // namespace gpucompute
