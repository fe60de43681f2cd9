// Host memory allocated once, at start, and lent out in blocks: what large
// request operands are decoded into so that they need no allocation and, on
// the CUDA backend (where the region is pinned), reach the GPU by DMA alone
// instead of being copied into the lanes' staging buffers first.
#ifndef GPUCOMPUTE_SERVER_DEVICE_HOST_ARENA_H_
#define GPUCOMPUTE_SERVER_DEVICE_HOST_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gpucompute {

class HostArena {
 public:
  // Blocks start and end on this boundary.
  static constexpr size_t kAlignment = 4096;

  // A block lent by the arena: [data(), data() + size()), given back when
  // the block goes. Move-only; REQUIRES: the arena outlives it.
  class Block {
   public:
    Block() = default;
    Block(Block&& other) noexcept { *this = std::move(other); }
    Block& operator=(Block&& other) noexcept;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { Reset(); }

    char* data() const { return data_; }
    size_t size() const { return size_; }
    explicit operator bool() const { return arena_ != nullptr; }
    // Gives the block back now.
    void Reset();

   private:
    friend class HostArena;
    HostArena* arena_ = nullptr;
    char* data_ = nullptr;
    size_t size_ = 0;      // as asked
    size_t reserved_ = 0;  // rounded up to kAlignment
  };

  // Lends out [base, base + capacity); `release(base)` runs when the arena
  // goes (may be empty). `pinned` says the region is page-locked memory a GPU
  // can copy from and to directly. REQUIRES: base aligned to kAlignment,
  // capacity a multiple of it.
  HostArena(void* base, size_t capacity, bool pinned, std::function<void(void*)> release);
  // REQUIRES: every block was given back.
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // An arena of `capacity` bytes (rounded up to kAlignment) of ordinary host
  // memory, touched once here so that no block page-faults later; null when
  // it cannot be allocated.
  static std::unique_ptr<HostArena> AllocateHost(size_t capacity);

  // A block of `bytes` (> 0): the smallest free range that holds them (of
  // equal ones, the lowest); nothing, at once, when no free range does.
  std::optional<Block> Take(size_t bytes);

  // Whether [p, p + n) lies inside the arena's region.
  bool Contains(const void* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
    return a >= b && n <= capacity_ && a - b <= capacity_ - n;
  }
  bool pinned() const { return pinned_; }
  size_t capacity() const { return capacity_; }
  // Bytes lent out now (blocks rounded up to kAlignment).
  size_t used_bytes() const;
  // The largest block Take could lend now.
  size_t largest_free() const;

 private:
  void Give(char* data, size_t reserved);

  char* const base_;
  const size_t capacity_;
  const bool pinned_;
  const std::function<void(void*)> release_;
  mutable absl::Mutex mu_;
  // Free ranges: offset -> length, never adjacent (merged when given back).
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gpucompute

#endif  // GPUCOMPUTE_SERVER_DEVICE_HOST_ARENA_H_
