// How a GPU is named outside this server: the strings NVML (and so
// nvidia-smi and the DCGM exporter, in its UUID and pci_bus_id labels) use,
// so that our metrics can be joined with theirs.
#ifndef GPUCOMPUTE_SERVER_DEVICE_IDENTITY_H_
#define GPUCOMPUTE_SERVER_DEVICE_IDENTITY_H_

#include <string>

namespace gpucompute {

// "GPU-" and the 16 bytes of a device UUID in the 8-4-4-4-12 grouping, lower
// case hex: "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52".
// REQUIRES: bytes points to 16 bytes.
std::string GpuUuidString(const unsigned char* bytes);

// NVML's PCI bus id, "%08X:%02X:%02X.0" of domain, bus and device:
// "00000000:19:00.0".
std::string PciBusIdString(int domain, int bus, int device);

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_IDENTITY_H_
