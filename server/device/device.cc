#include "server/device/device.h"

#include <memory>

namespace gpucompute {

absl::Status Device::WriteFrom(DeviceBuffer& buffer, int64_t offset, int64_t n,
                               const HostSource& src, double* seconds) {
  if (n <= 0) return absl::OkStatus();
  std::unique_ptr<char[]> gathered(new char[static_cast<size_t>(n)]);
  src(0, n, gathered.get());
  return Write(buffer, offset, gathered.get(), n, seconds);
}

}  // namespace gpucompute
