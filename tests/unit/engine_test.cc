// The engine over virtual CPU devices: weighted shards, the same results as
// one device, option errors.
#include "server/engine/engine.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "client/reference.h"
#include "server/device/cpu/cpu_device.h"
#include "tests/unit/core_test_util.h"
#include "tests/unit/forwarding_device.h"

namespace gpucompute {
namespace {

using testing::kAllDTypes;

class CountingObserver : public ShardObserver {
 public:
  void OnShard(OpKind op, DType dtype, const DeviceDescription& device,
               const ShardTiming& shard) override {
    ++shards;
    if (shard.run.kernel_seconds < 0 || shard.run.variant.empty()) ++bad;
  }
  std::atomic<int> shards{0};
  std::atomic<int> bad{0};
};

class EngineTest : public ::testing::Test {
 protected:
  EngineTest()
      : one_("cpu", CreateCpuDevices(1, {})),
        four_("cpu", CreateCpuDevices(4, {1, 1, 2, 2}), &observer_) {}

  // Expects shard sizes in the ratio 1:1:2:2 of `unit` on devices 0..3.
  static void ExpectWeightedShards(const OpResult& r, int64_t unit, SplitAxis axis) {
    ASSERT_EQ(r.shards.size(), 4u);
    const int64_t want[] = {unit, unit, 2 * unit, 2 * unit};
    int64_t next = 0;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(r.shards[i].device, i);
      EXPECT_EQ(r.shards[i].axis, axis);
      EXPECT_EQ(r.shards[i].range.begin, next);
      EXPECT_EQ(r.shards[i].range.size(), want[i]) << "shard " << i;
      EXPECT_GE(r.shards[i].run.kernel_seconds, 0);
      EXPECT_GT(r.shards[i].work.bytes, 0);
      next = r.shards[i].range.end;
    }
  }

  CountingObserver observer_;
  Engine one_;
  Engine four_;
};

TEST_F(EngineTest, GemmShardsByWeightAndMatchesOneDevice) {
  for (DType dtype : kAllDTypes) {
    testing::GemmCase g = testing::MakeGemm(dtype, 2, 600, 33, 127, false, true, 1.0, 0.5);
    absl::StatusOr<OpResult> four = four_.Gemm(g.spec);
    absl::StatusOr<OpResult> one = one_.Gemm(g.spec);
    ASSERT_TRUE(four.ok()) << four.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ExpectWeightedShards(*four, 100, SplitAxis::kRows);
    EXPECT_EQ(four->backend, "cpu");
    EXPECT_EQ(four->output.shape, g.spec.out_shape);
    const double rtol = reference::Rtol(dtype, 127);
    const double atol = rtol * (std::sqrt(127.0) + 1);
    EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output), testing::Doubles(one->output),
                                      atol, rtol),
              "");
    EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output), g.Reference(), atol, rtol),
              "");
  }
}

TEST_F(EngineTest, GemvShardsByWeightAndMatchesOneDevice) {
  for (DType dtype : kAllDTypes) {
    testing::GemvCase g = testing::MakeGemv(dtype, 6000, 127, 3, true, 2.0, -1.0);
    absl::StatusOr<OpResult> four = four_.Gemv(g.spec);
    absl::StatusOr<OpResult> one = one_.Gemv(g.spec);
    ASSERT_TRUE(four.ok()) << four.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ExpectWeightedShards(*four, 1000, SplitAxis::kRows);
    const double rtol = reference::Rtol(dtype, 127);
    const double atol = rtol * (2 * std::sqrt(127.0) + 1);
    EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output), testing::Doubles(one->output),
                                      atol, rtol),
              "");
    EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output), g.Reference(), atol, rtol),
              "");
  }
}

TEST_F(EngineTest, ReduceOverOuterRowsIsBitwiseOneDevice) {
  for (ReduceKind kind :
       {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kMean}) {
    for (DType dtype : kAllDTypes) {
      testing::ReduceCase r = testing::MakeReduce(dtype, {60, 1000, 3}, 1, kind);
      absl::StatusOr<OpResult> four = four_.Reduce(r.spec);
      absl::StatusOr<OpResult> one = one_.Reduce(r.spec);
      ASSERT_TRUE(four.ok()) << four.status();
      ASSERT_TRUE(one.ok()) << one.status();
      ExpectWeightedShards(*four, 10, SplitAxis::kOuter);
      EXPECT_EQ(four->output.data, one->output.data);
    }
  }
}

TEST_F(EngineTest, ReduceOverTheAxisIsBitwiseOneDevice) {
  // A full reduction of 12 chunks (last one short) splits the axis 2:2:4:4
  // chunks; a [3, n] row reduction too; a column reduction with wide rows.
  struct Case {
    std::vector<int64_t> shape;
    int axis;
  };
  const Case cases[] = {
      {{12 * kReduceChunk - 77}, -1}, {{3, 12 * kReduceChunk}, 1}, {{12 * kReduceChunk, 3}, 0}};
  for (const Case& c : cases) {
    for (ReduceKind kind :
         {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMin, ReduceKind::kMean}) {
      for (DType dtype : kAllDTypes) {
        testing::ReduceCase r = testing::MakeReduce(dtype, c.shape, c.axis, kind);
        absl::StatusOr<OpResult> four = four_.Reduce(r.spec);
        absl::StatusOr<OpResult> one = one_.Reduce(r.spec);
        ASSERT_TRUE(four.ok()) << four.status();
        ASSERT_TRUE(one.ok()) << one.status();
        ASSERT_EQ(four->shards.size(), 4u);
        EXPECT_EQ(four->shards[0].axis, SplitAxis::kAxis);
        EXPECT_EQ(four->output.data, one->output.data)
            << "shape[0] " << c.shape[0] << " kind " << int(kind);
        // And right.
        const int64_t n = r.spec.axis_len;
        double atol = 0, rtol = 0;
        if (kind == ReduceKind::kSum || kind == ReduceKind::kMean) {
          rtol = reference::Rtol(dtype, n);
          atol = reference::Rtol(DType::kFloat32, n) * std::sqrt(double(n));
          if (kind == ReduceKind::kMean) atol /= double(n);
        }
        EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output),
                                          testing::RoundTo(dtype, r.Reference()), atol, rtol),
                  "");
      }
    }
  }
  // The chunk shards are in the 1:1:2:2 ratio.
  testing::ReduceCase r =
      testing::MakeReduce(DType::kFloat32, {12 * kReduceChunk}, -1, ReduceKind::kSum);
  absl::StatusOr<OpResult> four = four_.Reduce(r.spec);
  ASSERT_TRUE(four.ok());
  ExpectWeightedShards(*four, 2 * kReduceChunk, SplitAxis::kAxis);
}

TEST_F(EngineTest, ReduceWithEmptyAxisOrEmptyOutput) {
  HostTensor in = HostTensor::Allocate(DType::kFloat32, {2, 0});
  ReduceSpec s;
  s.input = in.view();
  s.kind = ReduceKind::kSum;
  s.outer = 2;
  s.axis_len = 0;
  s.inner = 1;
  s.out_shape = {2};
  s.options.output_dtype = DType::kFloat16;
  absl::StatusOr<OpResult> r = four_.Reduce(s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(testing::Doubles(r->output), (std::vector<double>{0, 0}));

  s.outer = 1;
  s.axis_len = 2;
  s.inner = 0;
  s.out_shape = {0};
  in = HostTensor::Allocate(DType::kFloat32, {2, 0});
  s.input = in.view();
  r = four_.Reduce(s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output.num_elements(), 0);
}

TEST_F(EngineTest, TransposeShardsByWeightAndIsBitwiseOneDevice) {
  for (DType dtype : kAllDTypes) {
    testing::TransposeCase t = testing::MakeTranspose(dtype, {7, 600, 33}, {1, 2, 0});
    absl::StatusOr<OpResult> four = four_.Transpose(t.spec);
    absl::StatusOr<OpResult> one = one_.Transpose(t.spec);
    ASSERT_TRUE(four.ok()) << four.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ExpectWeightedShards(*four, 100, SplitAxis::kOutBlocks);
    EXPECT_EQ(four->output.data, one->output.data);
    EXPECT_EQ(testing::Doubles(four->output), t.Reference());
  }
}

TEST_F(EngineTest, AttentionShardsByWeightAndIsBitwiseOneDevice) {
  for (DType dtype : kAllDTypes) {
    // 12 (batch, head) pairs: split by heads.
    testing::AttentionCase a = testing::MakeAttention(dtype, 2, 6, 3, 33, 40, 64, true);
    absl::StatusOr<OpResult> four = four_.Attention(a.spec);
    absl::StatusOr<OpResult> one = one_.Attention(a.spec);
    ASSERT_TRUE(four.ok()) << four.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ExpectWeightedShards(*four, 2, SplitAxis::kHeads);
    EXPECT_EQ(four->output.data, one->output.data);
    ASSERT_TRUE(four->lse.has_value());
    EXPECT_EQ(four->lse->shape, (std::vector<int64_t>{2, 6, 33}));
    EXPECT_EQ(four->lse->data, one->lse->data);
    const reference::AttentionResult want = a.Reference();
    const double rtol = reference::Rtol(dtype, 64);
    EXPECT_EQ(reference::CompareClose(testing::Doubles(four->output), want.o, rtol + 1e-5, rtol),
              "");
    EXPECT_EQ(reference::CompareClose(testing::Doubles(*four->lse), want.lse, 1e-4, 1e-5), "");

    // One head: split by query rows.
    testing::AttentionCase b = testing::MakeAttention(dtype, 1, 1, 1, 600, 50, 128, true, false);
    four = four_.Attention(b.spec);
    one = one_.Attention(b.spec);
    ASSERT_TRUE(four.ok()) << four.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ExpectWeightedShards(*four, 100, SplitAxis::kQueryRows);
    EXPECT_FALSE(four->lse.has_value());
    EXPECT_EQ(four->output.data, one->output.data);
  }
}

TEST_F(EngineTest, ObserverSeesEveryShard) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 600, 7, 7);
  const int before = observer_.shards.load();
  ASSERT_TRUE(four_.Gemm(g.spec).ok());
  EXPECT_EQ(observer_.shards.load() - before, 4);
  EXPECT_EQ(observer_.bad.load(), 0);
}

TEST_F(EngineTest, UnknownVariantNamesTheFieldAndTheChoices) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 7, 7, 7);
  g.spec.options.variant = "x";
  absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "options.variant: unknown variant \"x\" for gemm; available: openblas, naive");

  testing::ReduceCase red = testing::MakeReduce(DType::kFloat32, {7}, -1, ReduceKind::kSum);
  red.spec.options.variant = "openblas";
  r = four_.Reduce(red.spec);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("for reduce; available: cpu"), std::string::npos);
}

TEST_F(EngineTest, EveryNamedVariantRuns) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 127, 33, 7);
  for (const std::string& variant : four_.Variants(OpKind::kGemm)) {
    g.spec.options.variant = variant;
    absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
    ASSERT_TRUE(r.ok()) << r.status();
    for (const ShardTiming& s : r->shards) EXPECT_EQ(s.run.variant, variant);
    EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-5, 1e-5), "");
  }
  EXPECT_EQ(four_.Variants(OpKind::kGemv), (std::vector<std::string>{"openblas", "naive"}));
  EXPECT_EQ(four_.Variants(OpKind::kReduce), (std::vector<std::string>{"cpu"}));
  EXPECT_EQ(four_.Variants(OpKind::kTranspose), (std::vector<std::string>{"cpu_blocked"}));
}

// Repeated indices are validation's to refuse (validate_test); the engine
// knows which indices exist.
TEST_F(EngineTest, BadDeviceIndicesAreInvalidArgument) {
  testing::GemvCase g = testing::MakeGemv(DType::kFloat32, 7, 7, 1);
  for (std::vector<int> devices :
       {std::vector<int>{4}, std::vector<int>{-1}, std::vector<int>{0, 7}}) {
    g.spec.options.devices = devices;
    absl::StatusOr<OpResult> r = four_.Gemv(g.spec);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind("options.devices: ", 0), 0u) << r.status();
  }
}

TEST_F(EngineTest, DeviceSubsetRunsOnlyThere) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat16, 1, 300, 33, 33);
  g.spec.options.devices = {3, 1};  // weights 2 and 1
  absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shards.size(), 2u);
  EXPECT_EQ(r->shards[0].device, 3);
  EXPECT_EQ(r->shards[0].range, (Range{0, 200}));
  EXPECT_EQ(r->shards[1].device, 1);
  EXPECT_EQ(r->shards[1].range, (Range{200, 300}));
  const double rtol = reference::Rtol(DType::kFloat16, 33);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(),
                                    rtol * (std::sqrt(33.0) + 1), rtol),
            "");
}

TEST_F(EngineTest, CpuDevicesSplitEvenTinyOperations) {
  // No fixed cost per shard on the CPU: six rows still go 1:1:2:2.
  EXPECT_EQ(four_.device(0).Cost(OpKind::kGemm, DType::kFloat32).fixed_seconds, 0);
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 6, 1, 1);
  absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectWeightedShards(*r, 1, SplitAxis::kRows);
}

TEST_F(EngineTest, EmptyOutputsRunNoShard) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 0, 5, 3);
  absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->shards.empty());
  EXPECT_EQ(r->output.shape, (std::vector<int64_t>{0, 5}));

  testing::TransposeCase t = testing::MakeTranspose(DType::kFloat32, {0, 7}, {1, 0});
  r = four_.Transpose(t.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output.num_elements(), 0);

  // A batch of zero matrices with rows to split: no shard may run (a shard
  // would divide by the empty batch).
  testing::GemmCase batch0 = testing::MakeGemm(DType::kFloat32, 2, 9, 5, 3);
  batch0.spec.batch = 0;  // as validation builds it for A [0, 9, 3]
  batch0.spec.out_shape = {0, 9, 5};
  r = four_.Gemm(batch0.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->shards.empty());
  EXPECT_EQ(r->output.num_elements(), 0);

  // No heads but an enormous query length: answered at once, no row loop.
  testing::AttentionCase no_heads =
      testing::MakeAttention(DType::kFloat16, 0, 1, 1, 3, 1, 64, true);
  no_heads.spec.seq_q = int64_t{1} << 50;
  no_heads.spec.out_shape = {0, 1, int64_t{1} << 50, 64};
  r = four_.Attention(no_heads.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->shards.empty());
  EXPECT_EQ(r->output.num_elements(), 0);
}

// A CPU device that can be marked unhealthy or made to fail every GEMM.
class FlakyDevice : public testing::ForwardingDevice {
 public:
  FlakyDevice(std::unique_ptr<Device> inner, bool healthy, bool fail)
      : ForwardingDevice(std::move(inner)), healthy_(healthy), fail_(fail) {}
  bool healthy() const override { return healthy_; }
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView out) override {
    if (fail_) return absl::InternalError("device lost");
    return ForwardingDevice::Gemm(spec, rows, out);
  }

 private:
  bool healthy_, fail_;
};

std::vector<std::unique_ptr<Device>> FlakyDevices(std::vector<bool> healthy,
                                                  std::vector<bool> fail) {
  std::vector<std::unique_ptr<Device>> cpus = CreateCpuDevices(int(healthy.size()), {});
  std::vector<std::unique_ptr<Device>> devices;
  for (size_t i = 0; i < cpus.size(); ++i) {
    devices.push_back(std::make_unique<FlakyDevice>(std::move(cpus[i]), healthy[i], fail[i]));
  }
  return devices;
}

TEST(EngineHealth, UnhealthyDevicesAreSkipped) {
  Engine engine("cpu", FlakyDevices({true, false, true}, {false, false, false}));
  EXPECT_TRUE(engine.AnyHealthy());
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shards.size(), 2u);
  EXPECT_EQ(r->shards[0].device, 0);
  EXPECT_EQ(r->shards[1].device, 2);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-5, 1e-5), "");

  // Naming only unhealthy devices leaves nothing to run on.
  g.spec.options.devices = {1};
  EXPECT_EQ(engine.Gemm(g.spec).status().code(), absl::StatusCode::kUnavailable);
}

TEST(EngineHealth, DefaultChunkPartialsGiveTheSameBits) {
  // FlakyDevice keeps Device's default ReduceChunks (one partial Reduce per
  // chunk); the CPU device overrides it. Both give the same bits.
  Engine wrapped("cpu", FlakyDevices({true, true, true}, {false, false, false}));
  Engine plain("cpu", CreateCpuDevices(3, {}));
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMax, ReduceKind::kMean}) {
    testing::ReduceCase r =
        testing::MakeReduce(DType::kBFloat16, {2, 7 * kReduceChunk + 3}, 1, kind);
    absl::StatusOr<OpResult> a = wrapped.Reduce(r.spec);
    absl::StatusOr<OpResult> b = plain.Reduce(r.spec);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->shards[0].axis, SplitAxis::kAxis);
    EXPECT_EQ(a->shards.size(), 3u);
    EXPECT_EQ(a->output.data, b->output.data);
  }
}

TEST(EngineHealth, NoHealthyDeviceIsUnavailable) {
  Engine engine("cpu", FlakyDevices({false, false}, {false, false}));
  EXPECT_FALSE(engine.AnyHealthy());
  testing::ReduceCase r = testing::MakeReduce(DType::kFloat32, {7}, -1, ReduceKind::kSum);
  EXPECT_EQ(engine.Reduce(r.spec).status().code(), absl::StatusCode::kUnavailable);
}

TEST(EngineHealth, AFailedShardFailsTheOperation) {
  Engine engine("cpu", FlakyDevices({true, true}, {false, true}));
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(r.status().message(), "device lost");
  // The other operations still run on both.
  testing::GemvCase v = testing::MakeGemv(DType::kFloat32, 100, 7, 1);
  ASSERT_TRUE(engine.Gemv(v.spec).ok());
  // Failed shards leave nothing counted in flight.
  EXPECT_EQ(engine.InflightShards(0), 0);
  EXPECT_EQ(engine.InflightShards(1), 0);
}

// A CPU device that counts the shards it is given and what it is told of
// their call: whether the check is set, and what it said at the start.
class WatchingDevice : public testing::ForwardingDevice {
 public:
  WatchingDevice(std::unique_ptr<Device> inner, std::function<void()> on_start)
      : ForwardingDevice(std::move(inner)), on_start_(std::move(on_start)) {}
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView out) override {
    ++started;
    if (spec.options.cancelled) ++checked;
    if (on_start_) on_start_();
    return ForwardingDevice::Gemm(spec, rows, out);
  }
  std::atomic<int> started{0};
  std::atomic<int> checked{0};

 private:
  std::function<void()> on_start_;
};

TEST(EngineCancellation, ACancelledCallStartsNoShard) {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<WatchingDevice*> watched;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(2, {})) {
    devices.push_back(std::make_unique<WatchingDevice>(std::move(cpu), nullptr));
    watched.push_back(static_cast<WatchingDevice*>(devices.back().get()));
  }
  CountingObserver observer;
  Engine engine("cpu", std::move(devices), &observer);
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  CallContext call;
  std::atomic<bool> gone{false};
  call.cancelled = [&gone] { return gone.load(); };

  // Wanted: every shard runs, told how to learn that its call has gone.
  ASSERT_TRUE(engine.Gemm(g.spec, call).ok());
  for (WatchingDevice* d : watched) {
    EXPECT_EQ(d->started.load(), 1);
    EXPECT_EQ(d->checked.load(), 1);
  }
  // Gone: no shard starts, none is reported.
  gone = true;
  EXPECT_EQ(engine.Gemm(g.spec, call).status().code(), absl::StatusCode::kCancelled);
  testing::ReduceCase r =
      testing::MakeReduce(DType::kFloat32, {4, 3 * kReduceChunk}, 1, ReduceKind::kSum);
  EXPECT_EQ(engine.Reduce(r.spec, call).status().code(), absl::StatusCode::kCancelled);
  testing::AttentionCase a = testing::MakeAttention(DType::kFloat32, 1, 2, 1, 33, 65, 64, false);
  EXPECT_EQ(engine.Attention(a.spec, call).status().code(), absl::StatusCode::kCancelled);
  for (WatchingDevice* d : watched) EXPECT_EQ(d->started.load(), 1);
  EXPECT_EQ(observer.shards.load(), 2);
  EXPECT_EQ(engine.InflightShards(0), 0);
  EXPECT_EQ(engine.InflightShards(1), 0);
}

TEST(EngineCancellation, ShardsOfACallThatGoesStop) {
  // The call goes as the first shard starts: no shard completes, whether
  // it had not started yet or stops between its blocks.
  std::atomic<bool> gone{false};
  std::vector<std::unique_ptr<Device>> devices;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(3, {})) {
    devices.push_back(std::make_unique<WatchingDevice>(std::move(cpu), [&gone] { gone = true; }));
  }
  CountingObserver observer;
  Engine engine("cpu", std::move(devices), &observer);
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 300, 64, 64);
  CallContext call;
  call.cancelled = [&gone] { return gone.load(); };
  EXPECT_EQ(engine.Gemm(g.spec, call).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(observer.shards.load(), 0);
}

// A CPU device that reports the cost `cost`, as a GPU would.
class PricedDevice : public FlakyDevice {
 public:
  PricedDevice(std::unique_ptr<Device> inner, DeviceCost cost)
      : FlakyDevice(std::move(inner), true, false), cost_(cost) {}
  DeviceCost Cost(OpKind op, DType dtype) const override { return cost_; }

 private:
  DeviceCost cost_;
};

// CPU devices of weights `weights` that cost `cost`.
std::vector<std::unique_ptr<Device>> PricedDevices(std::vector<double> weights, DeviceCost cost) {
  std::vector<std::unique_ptr<Device>> devices;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(int(weights.size()), weights)) {
    devices.push_back(std::make_unique<PricedDevice>(std::move(cpu), cost));
  }
  return devices;
}

// What an H200 charges (server/device/cuda/cuda_device.cc): 150 us per shard.
constexpr DeviceCost kGpuCost = {150e-6, 8e9, 4000e9, 700e12};
// Bytes so slow that any work outweighs the fixed cost.
constexpr DeviceCost kSlowBytesCost = {1e-6, 1e3, 0, 0};

// The devices that ran `r`'s shards, in order.
std::vector<int> ShardDevices(const OpResult& r) {
  std::vector<int> devices;
  for (const ShardTiming& s : r.shards) devices.push_back(s.device);
  return devices;
}

TEST(EngineCost, SmallOperationsStayOnTheHeaviestDevice) {
  // Operations of tens of KB: a second shard would save a few microseconds
  // against 150 us each.
  Engine engine("cuda", PricedDevices({1, 1, 2, 2}, kGpuCost));
  const std::vector<int> heaviest = {2};  // of the two heaviest, the first

  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 2, 60, 33, 127, false, true, 1.0, 0.5);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), heaviest);
  EXPECT_EQ(r->shards[0].range, (Range{0, 60}));
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-4, 1e-5), "");

  testing::GemvCase v = testing::MakeGemv(DType::kBFloat16, 60, 127, 3);
  r = engine.Gemv(v.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), heaviest);

  testing::ReduceCase red = testing::MakeReduce(DType::kFloat32, {60, 100}, 1, ReduceKind::kSum);
  r = engine.Reduce(red.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), heaviest);

  testing::TransposeCase t = testing::MakeTranspose(DType::kFloat16, {7, 60, 33}, {1, 2, 0});
  r = engine.Transpose(t.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), heaviest);
  EXPECT_EQ(testing::Doubles(r->output), t.Reference());

  testing::AttentionCase a = testing::MakeAttention(DType::kBFloat16, 1, 4, 2, 33, 40, 64, true);
  r = engine.Attention(a.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), heaviest);
}

TEST(EngineCost, LargeOperationsSplitByWeight) {
  Engine engine("cuda", PricedDevices({1, 1, 2, 2}, kSlowBytesCost));
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 600, 33, 127);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ShardDevices(*r), (std::vector<int>{0, 1, 2, 3}));
  const int64_t sizes[] = {100, 100, 200, 200};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r->shards[i].range.size(), sizes[i]) << "shard " << i;
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-4, 1e-5), "");
}

TEST(EngineCost, OptionsDevicesAreTheCandidates) {
  Engine engine("cuda", PricedDevices({1, 1, 2, 2}, kGpuCost));
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 60, 7, 7);
  for (const auto& [devices, chosen] : std::vector<std::pair<std::vector<int>, int>>{
           {{0, 1}, 0}, {{1, 0}, 1}, {{0, 3}, 3}, {{1}, 1}}) {
    g.spec.options.devices = devices;
    absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(ShardDevices(*r), std::vector<int>{chosen}) << "options.devices[0] " << devices[0];
  }

  // Worth splitting: over the named devices only, in their order, by weight.
  Engine slow("cuda", PricedDevices({1, 1, 2, 2}, kSlowBytesCost));
  g = testing::MakeGemm(DType::kFloat32, 1, 300, 7, 7);
  g.spec.options.devices = {3, 1};
  absl::StatusOr<OpResult> r = slow.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(ShardDevices(*r), (std::vector<int>{3, 1}));
  EXPECT_EQ(r->shards[0].range, (Range{0, 200}));
  EXPECT_EQ(r->shards[1].range, (Range{200, 300}));
}

// A CPU device whose GEMMs wait until `open` is set.
class GatedDevice : public FlakyDevice {
 public:
  GatedDevice(std::unique_ptr<Device> inner, std::atomic<int>& entered, std::atomic<bool>& open)
      : FlakyDevice(std::move(inner), true, false), entered_(entered), open_(open) {}
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView out) override {
    ++entered_;
    while (!open_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return FlakyDevice::Gemm(spec, rows, out);
  }

 private:
  std::atomic<int>& entered_;
  std::atomic<bool>& open_;
};

TEST(EngineInflight, ShardsCountWhileTheyRunAndNotAfter) {
  std::atomic<int> entered{0};
  std::atomic<bool> open{false};
  std::vector<std::unique_ptr<Device>> devices;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(3, {})) {
    devices.push_back(std::make_unique<GatedDevice>(std::move(cpu), entered, open));
  }
  Engine engine("cpu", std::move(devices));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(engine.InflightShards(i), 0);

  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  g.spec.options.devices = {0, 2};
  absl::StatusOr<OpResult> r;
  std::thread caller([&] { r = engine.Gemm(g.spec); });
  while (entered.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(engine.InflightShards(0), 1);
  EXPECT_EQ(engine.InflightShards(1), 0);
  EXPECT_EQ(engine.InflightShards(2), 1);
  open = true;
  caller.join();
  ASSERT_TRUE(r.ok()) << r.status();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(engine.InflightShards(i), 0) << "device " << i;
}

TEST_F(EngineTest, ConcurrentOperationsShareTheDevices) {
  // Several callers at once on the same devices and pools.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        if (t % 2 == 0) {
          testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 64 + t, 33, 65);
          absl::StatusOr<OpResult> r = four_.Gemm(g.spec);
          if (!r.ok() ||
              !reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-4, 1e-5)
                   .empty()) {
            ++failures;
          }
        } else {
          testing::ReduceCase red =
              testing::MakeReduce(DType::kFloat32, {5 * kReduceChunk}, -1, ReduceKind::kMax);
          absl::StatusOr<OpResult> r = four_.Reduce(red.spec);
          if (!r.ok() || testing::Doubles(r->output) != red.Reference()) ++failures;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < four_.num_devices(); ++i) {
    EXPECT_EQ(four_.InflightShards(i), 0) << "device " << i;
  }
}

// Gated CPU devices (GEMMs wait for `open`) with in-flight byte bounds.
std::vector<std::unique_ptr<Device>> GatedDevices(int n, std::atomic<int>& entered,
                                                  std::atomic<bool>& open) {
  std::vector<std::unique_ptr<Device>> devices;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(n, {})) {
    devices.push_back(std::make_unique<GatedDevice>(std::move(cpu), entered, open));
  }
  return devices;
}

void WaitFor(const std::function<bool()>& done) {
  for (absl::Time until = absl::Now() + absl::Seconds(30); !done() && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

TEST(EngineAdmission, AShardOverItsDeviceBoundIsRefusedNamingTheFlag) {
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  const int64_t bytes = static_cast<int64_t>(GemmWork(g.spec, Range{0, 100}).bytes);
  Engine engine("cpu", CreateCpuDevices(2, {}), nullptr, {0, bytes - 1});
  EXPECT_EQ(engine.MaxInflightBytes(0), 0);
  EXPECT_EQ(engine.MaxInflightBytes(1), bytes - 1);
  g.spec.options.devices = {1};
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--device_max_inflight_bytes of device 1"))
      << r.status();
  // Unbounded device 0 runs it; device 1 runs what fits.
  g.spec.options.devices = {0};
  r = engine.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  testing::GemmCase small = testing::MakeGemm(DType::kFloat32, 1, 50, 7, 7);
  small.spec.options.devices = {1};
  r = engine.Gemm(small.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), small.Reference(), 1e-5, 1e-5),
            "");
  EXPECT_EQ(engine.InflightBytes(1), 0);
}

TEST(EngineAdmission, WorkOverTheBoundWaitsForRoomThenRuns) {
  std::atomic<int> entered{0};
  std::atomic<bool> open{false};
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  const int64_t bytes = static_cast<int64_t>(GemmWork(g.spec, Range{0, 100}).bytes);
  // Room for one such GEMM at a time.
  Engine engine("cpu", GatedDevices(1, entered, open), nullptr, {bytes + bytes / 2});
  absl::StatusOr<OpResult> first, second;
  std::thread a([&] { first = engine.Gemm(g.spec); });
  WaitFor([&] { return entered.load() == 1; });
  EXPECT_EQ(engine.InflightBytes(0), bytes);
  std::thread b([&] { second = engine.Gemm(g.spec); });
  // The second waits outside the device: it never enters while the first holds.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(entered.load(), 1);
  EXPECT_EQ(engine.InflightBytes(0), bytes);
  open = true;
  a.join();
  b.join();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(entered.load(), 2);
  EXPECT_GE(second->device_wait_seconds, 0.05);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(second->output), g.Reference(), 1e-5, 1e-5),
            "");
  EXPECT_EQ(engine.InflightBytes(0), 0);
}

TEST(EngineAdmission, DeadlineAndCancellationEndTheWait) {
  std::atomic<int> entered{0};
  std::atomic<bool> open{false};
  testing::GemmCase g = testing::MakeGemm(DType::kFloat32, 1, 100, 7, 7);
  const int64_t bytes = static_cast<int64_t>(GemmWork(g.spec, Range{0, 100}).bytes);
  Engine engine("cpu", GatedDevices(1, entered, open), nullptr, {bytes});
  absl::StatusOr<OpResult> first;
  std::thread a([&] { first = engine.Gemm(g.spec); });
  WaitFor([&] { return entered.load() == 1; });

  CallContext late;
  late.deadline = absl::Now() + absl::Milliseconds(50);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec, late);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "deadline passed")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--device_max_inflight_bytes of device 0"))
      << r.status();

  std::atomic<bool> gone{false};
  CallContext cancelled;
  cancelled.cancelled = [&gone] { return gone.load(); };
  std::thread c([&] { r = engine.Gemm(g.spec, cancelled); });
  absl::SleepFor(absl::Milliseconds(50));
  gone = true;
  c.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();

  open = true;
  a.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(entered.load(), 1);  // neither refused operation reached the device
  EXPECT_EQ(engine.InflightBytes(0), 0);
}

TEST(EngineAdmission, OperationsOverSeveralBoundedDevicesNeverDeadlock) {
  // Each device has room for one shard of these at a time. Operations over
  // both devices, named in either order, and over one device all finish; a
  // wait cycle would end in the deadline's error instead.
  const int64_t shard_bytes = static_cast<int64_t>(
      GemmWork(testing::MakeGemm(DType::kFloat32, 1, 200, 33, 65).spec, Range{0, 100}).bytes);
  Engine engine("cpu", CreateCpuDevices(2, {}), nullptr,
                {shard_bytes + shard_bytes / 2, shard_bytes + shard_bytes / 2});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 9; ++t) {
    threads.emplace_back([&, t] {
      // Two shards of 100 rows (either order), or one shard of 100 rows.
      testing::GemmCase mine =
          testing::MakeGemm(DType::kFloat32, 1, t % 3 == 2 ? 100 : 200, 33, 65);
      mine.spec.options.devices = t % 3 == 0   ? std::vector<int>{0, 1}
                                  : t % 3 == 1 ? std::vector<int>{1, 0}
                                               : std::vector<int>{t % 2};
      for (int i = 0; i < 10; ++i) {
        CallContext call;
        call.deadline = absl::Now() + absl::Seconds(10);
        absl::StatusOr<OpResult> r = engine.Gemm(mine.spec, call);
        if (!r.ok() ||
            !reference::CompareClose(testing::Doubles(r->output), mine.Reference(), 1e-4, 1e-5)
                 .empty()) {
          ++failures;
          return;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(engine.InflightBytes(0), 0);
  EXPECT_EQ(engine.InflightBytes(1), 0);
}

// A CPU device that the cost model sees as a GPU: a fixed cost per shard and
// 8-row GEMM/GEMV shards, so that the engine places operations as on the CUDA
// backend (small ones on one device), and the chunked reduce its default.
class GpuLikeDevice : public testing::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  DeviceCost Cost(OpKind op, DType dtype) const override { return {150e-6, 8e9, 4000e9, 700e12}; }
  int64_t RowGranularity(OpKind op) const override {
    return op == OpKind::kGemm || op == OpKind::kGemv ? 8 : 1;
  }
};

// Bytes and FLOPs summed over an operation's shards.
WorkCost Total(const OpResult& r) {
  WorkCost total;
  for (const ShardTiming& s : r.shards) {
    total.bytes += s.work.bytes;
    total.flops += s.work.flops;
  }
  return total;
}

// The same request on a backend that splits everything (CPU) and on one
// placed like GPUs reports the same FLOPs, those of the whole operation as
// counted here from first principles: devices report only times, and the
// engine attributes the cost model's work.
TEST(EngineWork, BothBackendsReportTheWholeOperationsBytesAndFlops) {
  Engine cpu("cpu", CreateCpuDevices(4, {1, 1, 2, 2}));
  std::vector<std::unique_ptr<Device>> gpu_like;
  for (std::unique_ptr<Device>& d : CreateCpuDevices(2, {})) {
    gpu_like.push_back(std::make_unique<GpuLikeDevice>(std::move(d)));
  }
  Engine gpu("cuda", std::move(gpu_like));
  auto expect_same = [&](const absl::StatusOr<OpResult>& a, const absl::StatusOr<OpResult>& b,
                         double bytes, double flops, const char* what) {
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    // Split four ways on the CPU, over fewer devices by the cost model on
    // the GPU-like ones.
    EXPECT_EQ(a->shards.size(), 4u) << what;
    EXPECT_LT(b->shards.size(), a->shards.size()) << what;
    EXPECT_DOUBLE_EQ(Total(*a).flops, flops) << what;
    EXPECT_DOUBLE_EQ(Total(*b).flops, flops) << what;
    // Bytes are what each shard must move: the whole operation's on one
    // device; more over several, as every shard reads what all of them need
    // (B, K and V, the reduce's chunk partials).
    for (const OpResult* r : {&*a, &*b}) {
      if (r->shards.size() == 1) {
        EXPECT_DOUBLE_EQ(Total(*r).bytes, bytes) << what;
      } else {
        EXPECT_GE(Total(*r).bytes, bytes) << what;
      }
    }
  };

  // Causal attention, Sq < Skv, GQA 4:2, with LSE: each query row i sees
  // i + Skv - Sq + 1 keys.
  {
    const int64_t b = 2, hq = 4, hkv = 2, sq = 37, skv = 53, d = 32;
    testing::AttentionCase a = testing::MakeAttention(DType::kBFloat16, b, hq, hkv, sq, skv, d,
                                                      /*causal=*/true, /*return_lse=*/true);
    double keys = 0;
    for (int64_t i = 0; i < sq; ++i) keys += double(std::min(skv, i + skv - sq + 1));
    const double flops = 4.0 * b * hq * keys * d;
    const double bytes = 2.0 * (2 * b * hq * sq * d + 2 * b * hkv * skv * d) + 4.0 * b * hq * sq;
    expect_same(cpu.Attention(a.spec), gpu.Attention(a.spec), bytes, flops, "attention");
  }
  // Batched GEMM with a shared B and a batched C, output in fp32.
  {
    const int64_t batch = 3, m = 40, n = 24, k = 17;
    testing::GemmCase g = testing::MakeGemm(DType::kFloat16, batch, m, n, k, false, true, 1.0, 0.5,
                                            /*b_batched=*/false, /*c_batched=*/true);
    g.spec.options.output_dtype = DType::kFloat32;
    const double flops = 2.0 * batch * m * n * k;
    const double bytes = 2.0 * (batch * m * k + k * n + batch * m * n) + 4.0 * batch * m * n;
    expect_same(cpu.Gemm(g.spec), gpu.Gemm(g.spec), bytes, flops, "gemm");
  }
  // A full reduction over whole chunks: partials per chunk, combined.
  {
    const int64_t n = 3 * kReduceChunk + 11;
    testing::ReduceCase r = testing::MakeReduce(DType::kFloat32, {n}, -1, ReduceKind::kSum);
    const double chunks = 4;
    expect_same(cpu.Reduce(r.spec), gpu.Reduce(r.spec), 4.0 * n + 4.0 * chunks, double(n),
                "reduce");
  }
}

// A CPU device whose GEMM and GEMV shards begin at multiples of 8 rows, as a GPU's.
class EightRowDevice : public testing::ForwardingDevice {
 public:
  using ForwardingDevice::ForwardingDevice;
  int64_t RowGranularity(OpKind op) const override {
    return op == OpKind::kGemm || op == OpKind::kGemv ? 8 : 1;
  }
};

TEST(EngineGranularity, RowShardsBeginWhereTheDevicesNeedThem) {
  std::vector<std::unique_ptr<Device>> devices;
  for (std::unique_ptr<Device>& cpu : CreateCpuDevices(4, {1, 1, 2, 2})) {
    devices.push_back(std::make_unique<EightRowDevice>(std::move(cpu)));
  }
  Engine engine("cpu", std::move(devices));
  testing::GemmCase g = testing::MakeGemm(DType::kFloat16, 2, 101, 33, 17, /*trans_a=*/true);
  absl::StatusOr<OpResult> r = engine.Gemm(g.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shards.size(), 4u);
  for (const ShardTiming& s : r->shards) EXPECT_EQ(s.range.begin % 8, 0) << s.range.begin;
  EXPECT_EQ(r->shards.back().range.end, 101);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), g.Reference(), 1e-2, 1e-2), "");

  testing::GemvCase v = testing::MakeGemv(DType::kBFloat16, 99, 40, 3);
  r = engine.Gemv(v.spec);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->shards.size(), 4u);
  for (const ShardTiming& s : r->shards) EXPECT_EQ(s.range.begin % 8, 0) << s.range.begin;
  EXPECT_EQ(r->shards.back().range.end, 99);
  EXPECT_EQ(reference::CompareClose(testing::Doubles(r->output), v.Reference(), 2e-2, 2e-2), "");
}

}  // namespace
}  // namespace gpucompute
