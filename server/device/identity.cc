#include "server/device/identity.h"

#include "absl/strings/str_format.h"

namespace gpucompute {

std::string GpuUuidString(const unsigned char* b) {
  return absl::StrFormat("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

std::string PciBusIdString(int domain, int bus, int device) {
  return absl::StrFormat("%08X:%02X:%02X.0", domain, bus, device);
}

}  // namespace gpucompute
