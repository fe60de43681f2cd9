// The GPU's clocks as NVML reports them, read beside the sweeps' timings so
// that a slow row can be told apart from a GPU that was slowed (power cap,
// thermal slowdown) while it ran. NVML is opened at run time
// (libnvidia-ml.so.1, the driver's): where it is missing every read answers
// nullopt and the sweeps leave the fields out.
#ifndef GPUCOMPUTE_TESTS_SWEEP_GPU_CLOCKS_H_
#define GPUCOMPUTE_TESTS_SWEEP_GPU_CLOCKS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace gpucompute::sweep {

struct ClockSample {
  int sm_mhz = -1;  // the SM clock now
  // NVML's clock event reasons now (nvmlClocksEventReason*), the GPU-idle
  // bit (1) cleared: 0x4 software power cap, 0x8 hardware slowdown, 0x20
  // software thermal, 0x40 hardware thermal, 0x80 power brake.
  uint64_t events = 0;
  int temp_c = -1;      // GPU temperature
  double power_w = -1;  // board power draw
};

// The CUDA device 0's sample (matched to NVML's device by PCI bus id);
// nullopt without NVML or on any NVML error.
std::optional<ClockSample> SampleGpuClocks();

// The names of the bits set in `events`, e.g. "power_cap+hw_slowdown";
// "" for none.
std::string ClockEventNames(uint64_t events);

}  // namespace gpucompute::sweep

#endif  // GPUCOMPUTE_TESTS_SWEEP_GPU_CLOCKS_H_
