// A Device that forwards every call to another: tests derive from it to
// change one behaviour (fail, wait, report a cost) of a real CPU device.
#ifndef GPUCOMPUTE_TESTS_UNIT_FORWARDING_DEVICE_H_
#define GPUCOMPUTE_TESTS_UNIT_FORWARDING_DEVICE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/device/device.h"

namespace gpucompute::testing {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::unique_ptr<Device> inner) : inner_(std::move(inner)) {}

  const DeviceDescription& description() const override { return inner_->description(); }
  bool healthy() const override { return inner_->healthy(); }
  std::vector<std::string> Variants(OpKind op) const override { return inner_->Variants(op); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(int64_t bytes) override {
    return inner_->Allocate(bytes);
  }
  absl::Status Write(DeviceBuffer& buffer, int64_t offset, const void* src, int64_t n,
                     double* seconds) override {
    return inner_->Write(buffer, offset, src, n, seconds);
  }
  absl::Status Read(const DeviceBuffer& buffer, int64_t offset, void* dst, int64_t n,
                    double* seconds) override {
    return inner_->Read(buffer, offset, dst, n, seconds);
  }
  bool ReadsInPlace(int index) const override { return inner_->ReadsInPlace(index); }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Replicate(const DeviceBuffer& source,
                                                          double* seconds) override {
    return inner_->Replicate(source, seconds);
  }
  absl::StatusOr<ShardRun> Gemm(const GemmSpec& spec, Range rows, OutputView out) override {
    return inner_->Gemm(spec, rows, out);
  }
  absl::StatusOr<ShardRun> Gemv(const GemvSpec& spec, Range rows, OutputView out) override {
    return inner_->Gemv(spec, rows, out);
  }
  absl::StatusOr<ShardRun> Reduce(const ReduceSpec& spec, Range outer, Range axis, bool partial,
                                  OutputView out) override {
    return inner_->Reduce(spec, outer, axis, partial, out);
  }
  absl::StatusOr<ShardRun> Transpose(const TransposeSpec& spec, int prefix_axes, Range prefix,
                                     OutputView out) override {
    return inner_->Transpose(spec, prefix_axes, prefix, out);
  }
  absl::StatusOr<ShardRun> Attention(const AttentionSpec& spec, Range heads, Range q_rows,
                                     OutputView o_out, OutputView lse_out) override {
    return inner_->Attention(spec, heads, q_rows, o_out, lse_out);
  }

 private:
  std::unique_ptr<Device> inner_;
};

}  // namespace gpucompute::testing

#endif  // GPUCOMPUTE_TESTS_UNIT_FORWARDING_DEVICE_H_
