// Resident tensors: tensors that stay in a device's memory between requests,
// named by an opaque handle and owned by one client. Uploads and operations
// with keep_output create them; operations read them in place; Download
// reads them back; Free, or a lease that runs out unused, ends them.
//
// Bounded: each device holds at most its cap of resident bytes (replicas
// included) and each owner at most its quota of bytes and tensors; a tensor
// over either is refused (RESOURCE_EXHAUSTED naming the flag), and a live
// tensor is never evicted to make room. A tensor's memory is given back when
// the last user lets go of it, so freeing one that an operation is reading
// is safe.
#ifndef GPUCOMPUTE_SERVER_ENGINE_TENSOR_STORE_H_
#define GPUCOMPUTE_SERVER_ENGINE_TENSOR_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/device/device.h"

namespace gpucompute {

class TensorStore;

// One resident tensor. Created pending (invisible) by TensorStore::Create;
// visible under its handle once published. Thread-safe.
class ResidentTensor {
 public:
  // Gives its bytes (and its replicas') back to the store's accounts.
  ~ResidentTensor();
  ResidentTensor(const ResidentTensor&) = delete;
  ResidentTensor& operator=(const ResidentTensor&) = delete;

  const std::string& handle() const { return handle_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t bytes() const { return bytes_; }
  // The device whose memory holds it.
  int device() const { return buffer_->device(); }
  DeviceBuffer& buffer() const { return *buffer_; }
  // The tensor as an operand (on its device).
  TensorView view() const;
  // Devices holding a replica.
  std::vector<int> replicas() const;
  // Seconds since it was last used.
  double idle_seconds() const;

 private:
  friend class TensorStore;
  ResidentTensor(TensorStore* store, std::string handle, std::string owner, DType dtype,
                 std::vector<int64_t> shape, std::unique_ptr<DeviceBuffer> buffer);
  void Touch() const;

  TensorStore* const store_;
  const std::string handle_;
  const std::string owner_;
  const DType dtype_;
  const std::vector<int64_t> shape_;
  const int64_t bytes_;
  const std::unique_ptr<DeviceBuffer> buffer_;
  mutable std::atomic<int64_t> last_use_ns_;
  mutable absl::Mutex mu_;
  // Copies on other devices, made when a shard there needed one.
  std::map<int, std::unique_ptr<DeviceBuffer>> replicas_ ABSL_GUARDED_BY(mu_);
};

// What a resident tensor looks like to clients (proto TensorInfo).
struct ResidentInfo {
  std::string handle;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int device = 0;
  std::vector<int> replicas;
  double idle_seconds = 0;
  double expires_in_seconds = 0;  // 0: never
};

// Per device, what it holds now (for metrics).
struct ResidentUsage {
  int64_t bytes = 0;    // resident tensors and replicas
  int64_t tensors = 0;  // resident tensors (replicas not counted)
  int64_t cap_bytes = 0;
};

struct TensorStoreOptions {
  // Per device: bound on resident bytes (tensors and replicas). Missing or
  // <= 0 entries are unbounded. Named --resident_max_bytes_per_device.
  std::vector<int64_t> device_cap_bytes;
  // Per owner: bound on the bytes of its tensors (pending ones included);
  // 0: none. Named --resident_quota_bytes.
  int64_t quota_bytes = 0;
  // Per owner: bound on its number of tensors; 0: none. Named
  // --resident_max_tensors.
  int64_t max_tensors = 0;
  // A tensor unused for this long expires; zero or infinite: never.
  absl::Duration lease = absl::ZeroDuration();
};

class TensorStore {
 public:
  // Over `devices` (borrowed; indexed by device index; they outlive the
  // store). Starts a thread that expires tensors whose lease ran out.
  TensorStore(std::vector<Device*> devices, TensorStoreOptions options);
  // REQUIRES: no ResidentTensor outlives the store.
  ~TensorStore();
  TensorStore(const TensorStore&) = delete;
  TensorStore& operator=(const TensorStore&) = delete;

  // A pending tensor of `owner` on `device` (unset: the healthy device with
  // the fewest resident bytes), its memory allocated and not initialised,
  // charged to the device's cap and the owner's quota. It becomes visible by
  // Publish; dropped unpublished, it is gone. Errors: RESOURCE_EXHAUSTED
  // naming the flag over a cap or quota, or the device's when it has no
  // room; INVALID_ARGUMENT naming `device_field` for a device that does not
  // exist or has failed.
  absl::StatusOr<std::shared_ptr<ResidentTensor>> Create(const std::string& owner, DType dtype,
                                                         std::vector<int64_t> shape,
                                                         std::optional<int> device,
                                                         const std::string& device_field);

  // Makes `tensor` visible to its owner under its handle; returns what the
  // client is told. REQUIRES: from this store's Create, published once.
  ResidentInfo Publish(const std::shared_ptr<ResidentTensor>& tensor);

  // The live tensor `handle` of `owner`, its lease renewed. NOT_FOUND saying
  // whether the handle is unknown, was freed, expired or belongs to another
  // client (never whose); the message names `field`.
  absl::StatusOr<std::shared_ptr<ResidentTensor>> Acquire(const std::string& owner,
                                                          const std::string& handle,
                                                          const std::string& field);

  // Frees `handles` of `owner`: all, or none (NOT_FOUND as Acquire, naming
  // handles[i]). Returns the bytes freed. Memory in use by operations is
  // given back when they finish.
  absl::StatusOr<int64_t> Free(const std::string& owner, const std::vector<std::string>& handles);

  // The owner's live tensors, oldest first, and the bytes they hold.
  std::vector<ResidentInfo> List(const std::string& owner, int64_t* used_bytes) const;

  // A copy of `tensor` in device `device`'s memory, made device to device
  // and kept with the tensor for later operations; null when the device's
  // cap leaves no room for it (the caller then reads the tensor where it
  // is). Adds the copy's seconds to `*seconds`.
  absl::StatusOr<const DeviceBuffer*> Replica(ResidentTensor& tensor, int device, double* seconds);

  // Copies host bytes into `tensor` at byte `offset`, or out of it (on its
  // device, through Device::Write / Read). REQUIRES: the range lies within
  // the tensor.
  absl::Status Write(ResidentTensor& tensor, int64_t offset, const void* src, int64_t n,
                     double* seconds);
  absl::Status Read(const ResidentTensor& tensor, int64_t offset, void* dst, int64_t n,
                    double* seconds);
  // Write from bytes in ranges (Device::WriteFrom).
  absl::Status WriteFrom(ResidentTensor& tensor, int64_t offset, int64_t n, const HostSource& src,
                         double* seconds);

  ResidentInfo Info(const ResidentTensor& tensor) const;

  const TensorStoreOptions& options() const { return options_; }
  // Per device, what it holds now.
  std::vector<ResidentUsage> Usage() const;
  // Tensors expired so far.
  int64_t expirations() const { return expirations_.load(); }

  // Expires every tensor unused for longer than the lease, as of `now`
  // (the store's thread calls it every second or so).
  void ExpireIdle(absl::Time now);

 private:
  friend class ResidentTensor;

  // Why a handle is no longer live.
  enum class Gone { kFreed, kExpired };
  struct Owner {
    int64_t bytes = 0;    // quota charge, pending tensors included
    int64_t tensors = 0;  // likewise
    // Live tensors, by handle.
    absl::flat_hash_map<std::string, std::shared_ptr<ResidentTensor>> live;
  };

  std::string NewHandle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `bytes` of `device`'s cap: false when over it.
  bool ChargeDevice(int device, int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Give back a tensor's charges (called by ~ResidentTensor, without mu_).
  void Release(const std::string& owner, int device, int64_t bytes);
  void ReleaseReplica(int device, int64_t bytes);
  // Remembers why `handle` is gone (a bounded memory of recent ones).
  void Forget(const std::string& handle, Gone why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NotFound(const std::string& owner, const std::string& handle,
                        const std::string& field) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::vector<Device*> devices_;
  const TensorStoreOptions options_;
  std::atomic<int64_t> expirations_{0};

  mutable absl::Mutex mu_;
  uint64_t rng_state_[2] ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> device_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> device_tensors_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Owner> owners_ ABSL_GUARDED_BY(mu_);
  // Every handle ever given out, to its owner, while live or remembered gone.
  absl::flat_hash_map<std::string, std::string> owner_of_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Gone> gone_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> gone_order_ ABSL_GUARDED_BY(mu_);

  absl::Notification stop_;
  std::thread janitor_;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_ENGINE_TENSOR_STORE_H_
