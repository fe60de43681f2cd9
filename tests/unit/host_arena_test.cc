#include "server/device/host_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace gpucompute {
namespace {

constexpr size_t kA = HostArena::kAlignment;

TEST(HostArenaTest, BlocksAreAlignedDisjointAndGivenBackWhenTheyGo) {
  std::unique_ptr<HostArena> arena = HostArena::AllocateHost(10 * kA + 1);
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->capacity(), 11 * kA);  // rounded up
  EXPECT_FALSE(arena->pinned());
  std::optional<HostArena::Block> a = arena->Take(1);
  std::optional<HostArena::Block> b = arena->Take(3 * kA + 5);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->size(), 1u);
  EXPECT_EQ(b->size(), 3 * kA + 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % kA, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % kA, 0u);
  EXPECT_TRUE(a->data() + kA <= b->data() || b->data() + 4 * kA <= a->data());
  EXPECT_TRUE(arena->Contains(b->data(), b->size()));
  EXPECT_EQ(arena->used_bytes(), 5 * kA);
  EXPECT_EQ(arena->largest_free(), 6 * kA);
  // Writing a whole block leaves the other's bytes alone.
  std::memset(b->data(), 0x5a, b->size());
  a->data()[0] = 7;
  EXPECT_EQ(b->data()[0], 0x5a);
  EXPECT_EQ(b->data()[b->size() - 1], 0x5a);
  a.reset();
  EXPECT_EQ(arena->used_bytes(), 4 * kA);
  HostArena::Block moved = std::move(*b);
  EXPECT_FALSE(*b);
  EXPECT_EQ(arena->used_bytes(), 4 * kA);  // the move gave nothing back
  moved.Reset();
  EXPECT_EQ(arena->used_bytes(), 0u);
  EXPECT_EQ(arena->largest_free(), 11 * kA);  // merged into one range again
}

TEST(HostArenaTest, ContainsOnlyRangesInsideTheRegion) {
  std::unique_ptr<HostArena> arena = HostArena::AllocateHost(4 * kA);
  ASSERT_NE(arena, nullptr);
  std::optional<HostArena::Block> all = arena->Take(4 * kA);
  ASSERT_TRUE(all);
  const char* p = all->data();
  EXPECT_TRUE(arena->Contains(p, 4 * kA));
  EXPECT_TRUE(arena->Contains(p + 4 * kA - 1, 1));
  EXPECT_FALSE(arena->Contains(p + 1, 4 * kA));
  EXPECT_FALSE(arena->Contains(p - 1, 2));
  EXPECT_FALSE(arena->Contains(p + 4 * kA, 1));
  int outside = 0;
  EXPECT_FALSE(arena->Contains(&outside, sizeof(outside)));
}

TEST(HostArenaTest, FullOrTooSmallIsRefusedAtOnceAndTheSmallestFitIsTaken) {
  std::unique_ptr<HostArena> arena = HostArena::AllocateHost(8 * kA);
  ASSERT_NE(arena, nullptr);
  EXPECT_FALSE(arena->Take(0));
  EXPECT_FALSE(arena->Take(8 * kA + 1));
  std::optional<HostArena::Block> a = arena->Take(2 * kA);
  std::optional<HostArena::Block> b = arena->Take(kA);
  std::optional<HostArena::Block> c = arena->Take(3 * kA);
  std::optional<HostArena::Block> d = arena->Take(2 * kA);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_FALSE(arena->Take(1));  // full
  // Free ranges of 2 and 3 pages (a's and c's): a page goes in the smaller.
  char* a_at = a->data();
  a.reset();
  c.reset();
  std::optional<HostArena::Block> e = arena->Take(kA);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->data(), a_at);
  EXPECT_FALSE(arena->Take(4 * kA));  // 1 + 3 pages free, not adjacent
  std::optional<HostArena::Block> f = arena->Take(3 * kA);
  EXPECT_TRUE(f);
}

// Blocks taken and given back from several threads at once never overlap,
// and the arena is whole again afterwards.
TEST(HostArenaTest, ConcurrentBlocksNeverOverlap) {
  std::unique_ptr<HostArena> arena = HostArena::AllocateHost(256 * kA);
  ASSERT_NE(arena, nullptr);
  std::atomic<int> bad{0}, taken{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 2000; ++i) {
        const size_t n = 1 + rng() % (20 * kA);
        std::optional<HostArena::Block> block = arena->Take(n);
        if (!block) continue;
        ++taken;
        const char mark = char(t + 1);
        std::memset(block->data(), mark, n);
        std::this_thread::yield();
        if (std::any_of(block->data(), block->data() + n, [&](char c) { return c != mark; })) ++bad;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(taken.load(), 1000);
  EXPECT_EQ(arena->used_bytes(), 0u);
  EXPECT_EQ(arena->largest_free(), 256 * kA);
}

TEST(HostArenaTest, TheRegionIsReleasedWithTheArena) {
  static std::vector<char> region(8 * kA + kA);
  void* base =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(region.data()) + kA - 1) / kA * kA);
  void* released = nullptr;
  {
    HostArena arena(base, 8 * kA, /*pinned=*/true, [&](void* p) { released = p; });
    EXPECT_TRUE(arena.pinned());
    EXPECT_TRUE(arena.Take(kA));
  }
  EXPECT_EQ(released, base);
}

}  // namespace
}  // namespace gpucompute
