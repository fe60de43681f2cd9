#include "tests/sweep/gpu_clocks.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <utility>
#include <vector>

namespace gpucompute::sweep {
namespace {

// The few NVML entry points used, with NVML's C signatures (nvml.h; its
// return codes are ints, 0 for success, and a device is an opaque pointer).
using NvmlDevice = void*;
using InitFn = int (*)();
using ByBusIdFn = int (*)(const char*, NvmlDevice*);
using ClockFn = int (*)(NvmlDevice, int, unsigned int*);
using ReasonsFn = int (*)(NvmlDevice, unsigned long long*);
using TemperatureFn = int (*)(NvmlDevice, int, unsigned int*);
using PowerFn = int (*)(NvmlDevice, unsigned int*);

constexpr int kClockSm = 1;         // NVML_CLOCK_SM
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr uint64_t kGpuIdle = 0x1;  // nvmlClocksEventReasonGpuIdle

struct Nvml {
  bool ok = false;
  NvmlDevice device = nullptr;
  ClockFn clock = nullptr;
  ReasonsFn reasons = nullptr;
  TemperatureFn temperature = nullptr;
  PowerFn power = nullptr;
};

const Nvml& Open() {
  static const Nvml nvml = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return n;
    auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
    auto by_bus = reinterpret_cast<ByBusIdFn>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    n.clock = reinterpret_cast<ClockFn>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    n.reasons = reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (n.reasons == nullptr) {  // the name before driver 535
      n.reasons =
          reinterpret_cast<ReasonsFn>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    }
    n.temperature = reinterpret_cast<TemperatureFn>(dlsym(lib, "nvmlDeviceGetTemperature"));
    n.power = reinterpret_cast<PowerFn>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    if (init == nullptr || by_bus == nullptr || n.clock == nullptr || init() != 0) return n;
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), 0) != cudaSuccess) return n;
    n.ok = by_bus(bus_id, &n.device) == 0;
    return n;
  }();
  return nvml;
}

}  // namespace

std::optional<ClockSample> SampleGpuClocks() {
  const Nvml& nvml = Open();
  if (!nvml.ok) return std::nullopt;
  ClockSample s;
  unsigned int value = 0;
  if (nvml.clock(nvml.device, kClockSm, &value) != 0) return std::nullopt;
  s.sm_mhz = static_cast<int>(value);
  unsigned long long reasons = 0;
  if (nvml.reasons != nullptr && nvml.reasons(nvml.device, &reasons) == 0) {
    s.events = reasons & ~kGpuIdle;
  }
  if (nvml.temperature != nullptr && nvml.temperature(nvml.device, kTemperatureGpu, &value) == 0) {
    s.temp_c = static_cast<int>(value);
  }
  if (nvml.power != nullptr && nvml.power(nvml.device, &value) == 0) s.power_w = value * 1e-3;
  return s;
}

std::string ClockEventNames(uint64_t events) {
  static const std::vector<std::pair<uint64_t, const char*>> kNames = {
      {0x2, "app_clocks"},  {0x4, "power_cap"},   {0x8, "hw_slowdown"},  {0x10, "sync_boost"},
      {0x20, "sw_thermal"}, {0x40, "hw_thermal"}, {0x80, "power_brake"}, {0x100, "display_clocks"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((events & bit) == 0) continue;
    if (!out.empty()) out += "+";
    out += name;
  }
  const uint64_t known = 0x1fe;
  if ((events & ~known) != 0) {
    if (!out.empty()) out += "+";
    out += "other";
  }
  return out;
}

}  // namespace gpucompute::sweep
