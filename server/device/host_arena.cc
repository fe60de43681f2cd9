#include "server/device/host_arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace gpucompute {

HostArena::Block& HostArena::Block::operator=(Block&& other) noexcept {
  if (this != &other) {
    Reset();
    arena_ = std::exchange(other.arena_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    reserved_ = std::exchange(other.reserved_, 0);
  }
  return *this;
}

void HostArena::Block::Reset() {
  if (arena_ != nullptr) arena_->Give(data_, reserved_);
  arena_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  reserved_ = 0;
}

HostArena::HostArena(void* base, size_t capacity, bool pinned, std::function<void(void*)> release)
    : base_(static_cast<char*>(base)),
      capacity_(capacity),
      pinned_(pinned),
      release_(std::move(release)) {
  if (capacity_ > 0) free_[0] = capacity_;
}

HostArena::~HostArena() {
  if (release_) release_(base_);
}

std::unique_ptr<HostArena> HostArena::AllocateHost(size_t capacity) {
  capacity = (capacity + kAlignment - 1) / kAlignment * kAlignment;
  if (capacity == 0) return nullptr;
  void* base = std::aligned_alloc(kAlignment, capacity);
  if (base == nullptr) return nullptr;
  std::memset(base, 0, capacity);  // faulted in once, here
  return std::make_unique<HostArena>(base, capacity, /*pinned=*/false,
                                     [](void* p) { std::free(p); });
}

std::optional<HostArena::Block> HostArena::Take(size_t bytes) {
  if (bytes == 0 || bytes > capacity_) return std::nullopt;
  const size_t reserved = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  absl::MutexLock lock(&mu_);
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second >= reserved && (best == free_.end() || it->second < best->second)) best = it;
  }
  if (best == free_.end()) return std::nullopt;
  const size_t offset = best->first, length = best->second;
  free_.erase(best);
  if (length > reserved) free_[offset + reserved] = length - reserved;
  used_ += reserved;
  Block block;
  block.arena_ = this;
  block.data_ = base_ + offset;
  block.size_ = bytes;
  block.reserved_ = reserved;
  return block;
}

void HostArena::Give(char* data, size_t reserved) {
  size_t offset = size_t(data - base_), length = reserved;
  absl::MutexLock lock(&mu_);
  used_ -= reserved;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_[offset] = length;
}

size_t HostArena::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

size_t HostArena::largest_free() const {
  absl::MutexLock lock(&mu_);
  size_t largest = 0;
  for (const auto& [offset, length] : free_) largest = std::max(largest, length);
  return largest;
}

}  // namespace gpucompute
