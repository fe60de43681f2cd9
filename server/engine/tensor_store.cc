#include "server/engine/tensor_store.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/common/quote.h"
#include "server/common/status_macros.h"

namespace gpucompute {
namespace {

// Gone handles remembered, to say why one is no longer live.
constexpr size_t kRememberedGone = size_t{1} << 16;

int64_t NowNanos() { return absl::ToUnixNanos(absl::Now()); }

// splitmix64: a handle's random bits.
uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

ResidentTensor::ResidentTensor(TensorStore* store, std::string handle, std::string owner,
                               DType dtype, std::vector<int64_t> shape,
                               std::unique_ptr<DeviceBuffer> buffer)
    : store_(store),
      handle_(std::move(handle)),
      owner_(std::move(owner)),
      dtype_(dtype),
      shape_(std::move(shape)),
      bytes_(buffer->bytes()),
      buffer_(std::move(buffer)),
      last_use_ns_(NowNanos()) {}

ResidentTensor::~ResidentTensor() {
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [device, replica] : replicas_)
      store_->ReleaseReplica(device, replica->bytes());
  }
  store_->Release(owner_, device(), bytes_);
}

TensorView ResidentTensor::view() const {
  TensorView v;
  v.dtype = dtype_;
  v.shape = shape_;
  v.data = buffer_->data();
  v.device = buffer_->device();
  return v;
}

std::vector<int> ResidentTensor::replicas() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> devices;
  for (const auto& [device, replica] : replicas_) devices.push_back(device);
  return devices;
}

double ResidentTensor::idle_seconds() const {
  return double(NowNanos() - last_use_ns_.load()) * 1e-9;
}

void ResidentTensor::Touch() const { last_use_ns_.store(NowNanos()); }

TensorStore::TensorStore(std::vector<Device*> devices, TensorStoreOptions options)
    : devices_(std::move(devices)), options_(std::move(options)) {
  {
    absl::MutexLock lock(&mu_);
    std::random_device seed;
    rng_state_[0] = (uint64_t(seed()) << 32) ^ seed();
    rng_state_[1] = (uint64_t(seed()) << 32) ^ seed() ^ uint64_t(NowNanos());
    device_bytes_.assign(devices_.size(), 0);
    device_tensors_.assign(devices_.size(), 0);
  }
  const bool expires =
      options_.lease > absl::ZeroDuration() && options_.lease != absl::InfiniteDuration();
  if (expires) {
    const absl::Duration tick =
        std::clamp(options_.lease / 8, absl::Milliseconds(10), absl::Seconds(1));
    janitor_ = std::thread([this, tick] {
      while (!stop_.WaitForNotificationWithTimeout(tick)) ExpireIdle(absl::Now());
    });
  }
}

TensorStore::~TensorStore() {
  stop_.Notify();
  if (janitor_.joinable()) janitor_.join();
  std::vector<std::shared_ptr<ResidentTensor>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, owner] : owners_) {
      for (auto& [handle, tensor] : owner.live) dropped.push_back(std::move(tensor));
      owner.live.clear();
    }
  }
  dropped.clear();  // outside mu_: their destructors take it
}

std::string TensorStore::NewHandle() {
  return absl::StrCat("t", absl::Hex(Mix(rng_state_[0]), absl::kZeroPad16),
                      absl::Hex(Mix(rng_state_[1]), absl::kZeroPad16));
}

bool TensorStore::ChargeDevice(int device, int64_t bytes) {
  const int64_t cap =
      size_t(device) < options_.device_cap_bytes.size() ? options_.device_cap_bytes[device] : 0;
  if (cap > 0 && device_bytes_[device] + bytes > cap) return false;
  device_bytes_[device] += bytes;
  return true;
}

absl::StatusOr<std::shared_ptr<ResidentTensor>> TensorStore::Create(
    const std::string& owner, DType dtype, std::vector<int64_t> shape, std::optional<int> device,
    const std::string& device_field) {
  const int n = static_cast<int>(devices_.size());
  const int64_t bytes = NumElements(shape) * int64_t(DTypeSize(dtype));
  int home = -1;
  {
    absl::MutexLock lock(&mu_);
    if (device.has_value()) {
      if (*device < 0 || *device >= n) {
        return absl::InvalidArgumentError(absl::StrCat(device_field, ": device ", *device,
                                                       " does not exist; the server has ", n));
      }
      if (!devices_[*device]->healthy()) {
        return absl::InvalidArgumentError(
            absl::StrCat(device_field, ": device ", *device, " has failed"));
      }
      home = *device;
    } else {
      for (int d = 0; d < n; ++d) {
        if (devices_[d]->healthy() && (home < 0 || device_bytes_[d] < device_bytes_[home])) {
          home = d;
        }
      }
      if (home < 0) return absl::UnavailableError("no healthy device is left");
    }
    Owner& account = owners_[owner];
    absl::Status refused;
    if (options_.quota_bytes > 0 && account.bytes + bytes > options_.quota_bytes) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("--resident_quota_bytes: ", bytes,
                       " bytes more would bring this client's resident "
                       "tensors to ",
                       account.bytes + bytes, " bytes, over its quota of ", options_.quota_bytes,
                       "; free some (Free) first"));
    } else if (options_.max_tensors > 0 && account.tensors + 1 > options_.max_tensors) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("--resident_max_tensors: this client holds ", account.tensors,
                       " resident tensors, the most allowed; free some (Free) first"));
    } else if (!ChargeDevice(home, bytes)) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("--resident_max_bytes_per_device: device ", home, " holds ",
                       device_bytes_[home], " resident bytes; ", bytes,
                       " more would pass its cap of ", options_.device_cap_bytes[home]));
    }
    if (!refused.ok()) {
      // An owner that holds nothing is not kept (see Release).
      if (account.tensors == 0) owners_.erase(owner);
      return refused;
    }
    account.bytes += bytes;
    ++account.tensors;
    ++device_tensors_[home];
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer = devices_[home]->Allocate(bytes);
  std::string handle;
  {
    absl::MutexLock lock(&mu_);
    if (buffer.ok()) handle = NewHandle();
  }
  if (!buffer.ok()) {
    Release(owner, home, bytes);
    return buffer.status();
  }
  return std::shared_ptr<ResidentTensor>(new ResidentTensor(this, std::move(handle), owner, dtype,
                                                            std::move(shape), *std::move(buffer)));
}

ResidentInfo TensorStore::Publish(const std::shared_ptr<ResidentTensor>& tensor) {
  tensor->Touch();
  {
    absl::MutexLock lock(&mu_);
    owners_[tensor->owner_].live[tensor->handle_] = tensor;
    owner_of_[tensor->handle_] = tensor->owner_;
  }
  return Info(*tensor);
}

absl::Status TensorStore::NotFound(const std::string& owner, const std::string& handle,
                                   const std::string& field) const {
  auto whose = owner_of_.find(handle);
  if (whose != owner_of_.end() && whose->second != owner) {
    return absl::NotFoundError(
        absl::StrCat(field, ": handle ", Quote(handle), " belongs to another client"));
  }
  auto gone = gone_.find(handle);
  if (gone != gone_.end()) {
    return absl::NotFoundError(
        absl::StrCat(field, ": handle ", Quote(handle), " ",
                     gone->second == Gone::kFreed
                         ? "was freed"
                         : absl::StrCat("expired (unused for longer than --resident_lease, ",
                                        absl::FormatDuration(options_.lease), ")")));
  }
  return absl::NotFoundError(absl::StrCat(field, ": unknown handle ", Quote(handle)));
}

absl::StatusOr<std::shared_ptr<ResidentTensor>> TensorStore::Acquire(const std::string& owner,
                                                                     const std::string& handle,
                                                                     const std::string& field) {
  absl::MutexLock lock(&mu_);
  auto account = owners_.find(owner);
  if (account != owners_.end()) {
    auto it = account->second.live.find(handle);
    if (it != account->second.live.end()) {
      it->second->Touch();
      return it->second;
    }
  }
  return NotFound(owner, handle, field);
}

absl::StatusOr<int64_t> TensorStore::Free(const std::string& owner,
                                          const std::vector<std::string>& handles) {
  std::vector<std::shared_ptr<ResidentTensor>> dropped;
  int64_t freed = 0;
  {
    absl::MutexLock lock(&mu_);
    auto account = owners_.find(owner);
    for (size_t i = 0; i < handles.size(); ++i) {
      const bool live =
          account != owners_.end() && account->second.live.contains(handles[i]) &&
          std::find(handles.begin(), handles.begin() + i, handles[i]) == handles.begin() + i;
      if (!live) {
        absl::Status missing = NotFound(owner, handles[i], absl::StrCat("handles[", i, "]"));
        if (std::find(handles.begin(), handles.begin() + i, handles[i]) != handles.begin() + i) {
          missing = absl::NotFoundError(
              absl::StrCat("handles[", i, "]: handle ", Quote(handles[i]), " is listed twice"));
        }
        return missing;
      }
    }
    for (const std::string& handle : handles) {
      auto it = account->second.live.find(handle);
      freed += it->second->bytes();
      dropped.push_back(std::move(it->second));
      account->second.live.erase(it);
      Forget(handle, Gone::kFreed);
    }
  }
  dropped.clear();  // outside mu_: the destructors take it
  return freed;
}

void TensorStore::Forget(const std::string& handle, Gone why) {
  gone_[handle] = why;
  gone_order_.push_back(handle);
  while (gone_order_.size() > kRememberedGone) {
    gone_.erase(gone_order_.front());
    owner_of_.erase(gone_order_.front());
    gone_order_.pop_front();
  }
}

std::vector<ResidentInfo> TensorStore::List(const std::string& owner, int64_t* used_bytes) const {
  std::vector<std::shared_ptr<ResidentTensor>> tensors;
  int64_t used = 0;
  {
    absl::MutexLock lock(&mu_);
    auto account = owners_.find(owner);
    if (account != owners_.end()) {
      used = account->second.bytes;
      for (const auto& [handle, tensor] : account->second.live) tensors.push_back(tensor);
    }
  }
  std::vector<ResidentInfo> infos;
  infos.reserve(tensors.size());
  for (const auto& tensor : tensors) infos.push_back(Info(*tensor));
  std::sort(infos.begin(), infos.end(), [](const ResidentInfo& a, const ResidentInfo& b) {
    return a.idle_seconds > b.idle_seconds;
  });
  if (used_bytes != nullptr) *used_bytes = used;
  return infos;
}

absl::Status TensorStore::Write(ResidentTensor& tensor, int64_t offset, const void* src, int64_t n,
                                double* seconds) {
  tensor.Touch();
  if (n == 0) return absl::OkStatus();
  return devices_[tensor.device()]->Write(tensor.buffer(), offset, src, n, seconds);
}

absl::Status TensorStore::WriteFrom(ResidentTensor& tensor, int64_t offset, int64_t n,
                                    const HostSource& src, double* seconds) {
  tensor.Touch();
  if (n == 0) return absl::OkStatus();
  return devices_[tensor.device()]->WriteFrom(tensor.buffer(), offset, n, src, seconds);
}

absl::Status TensorStore::Read(const ResidentTensor& tensor, int64_t offset, void* dst, int64_t n,
                               double* seconds) {
  tensor.Touch();
  if (n == 0) return absl::OkStatus();
  return devices_[tensor.device()]->Read(tensor.buffer(), offset, dst, n, seconds);
}

ResidentInfo TensorStore::Info(const ResidentTensor& tensor) const {
  ResidentInfo info;
  info.handle = tensor.handle();
  info.dtype = tensor.dtype();
  info.shape = tensor.shape();
  info.bytes = tensor.bytes();
  info.device = tensor.device();
  info.replicas = tensor.replicas();
  info.idle_seconds = tensor.idle_seconds();
  if (options_.lease > absl::ZeroDuration() && options_.lease != absl::InfiniteDuration()) {
    info.expires_in_seconds =
        std::max(0.0, absl::ToDoubleSeconds(options_.lease) - info.idle_seconds);
  }
  return info;
}

absl::StatusOr<const DeviceBuffer*> TensorStore::Replica(ResidentTensor& tensor, int device,
                                                         double* seconds) {
  if (device == tensor.device()) return &tensor.buffer();
  absl::MutexLock tensor_lock(&tensor.mu_);
  auto it = tensor.replicas_.find(device);
  if (it != tensor.replicas_.end()) return it->second.get();
  {
    absl::MutexLock lock(&mu_);
    if (!ChargeDevice(device, tensor.bytes())) return nullptr;
  }
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> copy =
      devices_[device]->Replicate(tensor.buffer(), seconds);
  if (!copy.ok()) {
    ReleaseReplica(device, tensor.bytes());
    // No room on the device is no error: the shard reads the original.
    if (copy.status().code() == absl::StatusCode::kResourceExhausted) return nullptr;
    return copy.status();
  }
  const DeviceBuffer* replica = copy->get();
  tensor.replicas_[device] = *std::move(copy);
  return replica;
}

std::vector<ResidentUsage> TensorStore::Usage() const {
  absl::MutexLock lock(&mu_);
  std::vector<ResidentUsage> usage(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    usage[d].bytes = device_bytes_[d];
    usage[d].tensors = device_tensors_[d];
    usage[d].cap_bytes = d < options_.device_cap_bytes.size()
                             ? std::max<int64_t>(0, options_.device_cap_bytes[d])
                             : 0;
  }
  return usage;
}

void TensorStore::ExpireIdle(absl::Time now) {
  if (options_.lease <= absl::ZeroDuration() || options_.lease == absl::InfiniteDuration()) return;
  const int64_t cutoff = absl::ToUnixNanos(now - options_.lease);
  std::vector<std::shared_ptr<ResidentTensor>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, owner] : owners_) {
      for (auto it = owner.live.begin(); it != owner.live.end();) {
        if (it->second->last_use_ns_.load() < cutoff) {
          Forget(it->first, Gone::kExpired);
          dropped.push_back(std::move(it->second));
          owner.live.erase(it++);
        } else {
          ++it;
        }
      }
    }
  }
  expirations_ += static_cast<int64_t>(dropped.size());
  dropped.clear();  // outside mu_
}

void TensorStore::Release(const std::string& owner, int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  device_bytes_[device] -= bytes;
  --device_tensors_[device];
  auto account = owners_.find(owner);
  if (account == owners_.end()) return;
  account->second.bytes -= bytes;
  --account->second.tensors;
  // Owners come and go with their sessions: one that holds nothing is
  // forgotten, so that the map stays as small as the tensors it counts.
  if (account->second.tensors == 0 && account->second.live.empty()) owners_.erase(account);
}

void TensorStore::ReleaseReplica(int device, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  device_bytes_[device] -= bytes;
}

}  // namespace gpucompute
