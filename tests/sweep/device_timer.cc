#include "tests/sweep/device_timer.h"

#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace gpucompute::sweep {
namespace {

#define TIMER_CUPTI(expr)                                                       \
  do {                                                                          \
    CUptiResult r_ = (expr);                                                    \
    if (r_ != CUPTI_SUCCESS) {                                                  \
      const char* msg_ = nullptr;                                               \
      cuptiGetResultString(r_, &msg_);                                          \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, msg_); \
      std::exit(1);                                                             \
    }                                                                           \
  } while (0)

constexpr size_t kBufferBytes = size_t(8) << 20;

std::mutex mu;
std::vector<std::pair<uint64_t, uint64_t>> spans;  // (start, end) in ns, under mu
uint64_t since = 0;  // CUPTI time of the last Begin(); earlier activities are not counted

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
        spans.emplace_back(uint64_t(k->start), uint64_t(k->end));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<CUpti_ActivityMemcpy6*>(record);
        spans.emplace_back(uint64_t(m->start), uint64_t(m->end));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<CUpti_ActivityMemset4*>(record);
        spans.emplace_back(uint64_t(m->start), uint64_t(m->end));
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

}  // namespace

DeviceTimer::DeviceTimer() {
  TIMER_CUPTI(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
  TIMER_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  TIMER_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
  TIMER_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
}

DeviceTimer& DeviceTimer::Get() {
  static DeviceTimer* timer = new DeviceTimer();
  return *timer;
}

void DeviceTimer::Begin() {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mu);
  spans.clear();
  // Records of earlier work can still arrive after the flush: only activities
  // that start after this point belong to the call being timed.
  cuptiGetTimestamp(&since);
}

double DeviceTimer::End(double* span, int* count) {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mu);
  uint64_t first = UINT64_MAX, last = 0, busy = 0;
  int n = 0;
  for (const auto& [s, e] : spans) {
    if (s < since) continue;
    first = std::min(first, s);
    last = std::max(last, e);
    busy += e - s;
    ++n;
  }
  spans.clear();
  if (count != nullptr) *count = n;
  if (span != nullptr) *span = n ? double(last - first) * 1e-9 : -1;
  if (n == 0) return -1;
  return double(busy) * 1e-9;
}

}  // namespace gpucompute::sweep
