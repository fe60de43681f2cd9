// Device time of the GPU work a call enqueues, from CUPTI's activity records
// (kernels, memsets, copies): the busy time, the sum of their durations, and
// the span from the first one's start to the last one's end. Host time
// before the first launch is counted by neither (launch latency is the
// host's, and differs between a C++ call and a Python one). The span also
// counts the gaps between a call's launches, which activity tracing widens
// (every traced API call costs the host microseconds that an untraced one
// does not); back-to-back launches queue up on an untraced GPU, so the busy
// time is the figure the sweeps compare. Used to time the server's path and
// the vendor's calls the same way.
#ifndef GPUCOMPUTE_TESTS_SWEEP_DEVICE_TIMER_H_
#define GPUCOMPUTE_TESTS_SWEEP_DEVICE_TIMER_H_

namespace gpucompute::sweep {

class DeviceTimer {
 public:
  // The process's timer; enables CUPTI's activity records on first use.
  // Aborts when CUPTI cannot be enabled.
  static DeviceTimer& Get();

  // Waits for the device and forgets every activity so far.
  void Begin();
  // Waits for the device; the busy seconds of the activities that started
  // since Begin(), or -1 when there were none. `*span` and `*count` (when not
  // null) receive their span in seconds and how many there were.
  double End(double* span = nullptr, int* count = nullptr);

 private:
  DeviceTimer();
};

}  // namespace gpucompute::sweep

#endif  // GPUCOMPUTE_TESTS_SWEEP_DEVICE_TIMER_H_
