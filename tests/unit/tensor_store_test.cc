// The store of resident tensors over CPU devices: ownership, the reasons a
// handle is not found, caps and quotas, the lease, and accounting that
// follows the memory (a freed tensor in use keeps its bytes until released).
#include "server/engine/tensor_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "server/device/cpu/cpu_device.h"

namespace gpucompute {
namespace {

class TensorStoreTest : public ::testing::Test {
 protected:
  void Make(TensorStoreOptions options) {
    devices_ = CreateCpuDevices(2, {});
    std::vector<Device*> borrowed;
    for (auto& d : devices_) borrowed.push_back(d.get());
    store_ = std::make_unique<TensorStore>(borrowed, std::move(options));
  }
  // A published float32 tensor of `owner` with `n` elements.
  std::string Put(const std::string& owner, int64_t n, std::optional<int> device = std::nullopt) {
    auto t = store_->Create(owner, DType::kFloat32, {n}, device, "device");
    EXPECT_TRUE(t.ok()) << t.status();
    return store_->Publish(*t).handle;
  }
  void TearDown() override { store_.reset(); }

  std::vector<std::unique_ptr<Device>> devices_;
  std::unique_ptr<TensorStore> store_;
};

TEST_F(TensorStoreTest, HandlesBelongToTheirOwnerAndSayWhyTheyAreGone) {
  Make({});
  const std::string h = Put("alice", 10);
  ASSERT_TRUE(store_->Acquire("alice", h, "a").ok());
  auto foreign = store_->Acquire("bob", h, "a.handle");
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(foreign.status().message(), "another client"));
  EXPECT_FALSE(absl::StrContains(foreign.status().message(), "alice"));
  auto unknown = store_->Acquire("alice", "t0", "a.handle");
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "unknown handle"));
  EXPECT_TRUE(absl::StrContains(unknown.status().message(), "a.handle"));
  ASSERT_TRUE(store_->Free("alice", {h}).ok());
  auto freed = store_->Acquire("alice", h, "a");
  EXPECT_TRUE(absl::StrContains(freed.status().message(), "was freed"));
  EXPECT_EQ(store_->Free("alice", {h}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TensorStoreTest, FreeIsAllOrNone) {
  Make({});
  const std::string a = Put("o", 4), b = Put("o", 4);
  auto r = store_->Free("o", {a, "t1", b});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "handles[1]"));
  EXPECT_EQ(store_->List("o", nullptr).size(), 2u);
  EXPECT_EQ(store_->Free("o", {a, a}).status().code(), absl::StatusCode::kNotFound);
  auto both = store_->Free("o", {a, b});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(*both, 32);
  EXPECT_TRUE(store_->List("o", nullptr).empty());
}

TEST_F(TensorStoreTest, CapsAndQuotasRefuseNamingTheFlag) {
  TensorStoreOptions options;
  options.device_cap_bytes = {100, 100};
  options.quota_bytes = 150;
  options.max_tensors = 3;
  Make(options);
  Put("a", 20, 0);  // 80 bytes on device 0
  auto over_cap = store_->Create("a", DType::kFloat32, {6}, 0, "device");
  EXPECT_EQ(over_cap.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over_cap.status().message(), "--resident_max_bytes_per_device"));
  // Without a device named, the one with room is chosen.
  auto placed = store_->Create("a", DType::kFloat32, {6}, std::nullopt, "device");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)->device(), 1);
  auto over_quota = store_->Create("a", DType::kFloat32, {20}, 1, "device");
  EXPECT_TRUE(absl::StrContains(over_quota.status().message(), "--resident_quota_bytes"));
  Put("a", 1, 1);
  auto too_many = store_->Create("a", DType::kFloat32, {1}, 1, "device");
  EXPECT_TRUE(absl::StrContains(too_many.status().message(), "--resident_max_tensors"));
  // Another client has a quota of its own.
  EXPECT_TRUE(store_->Create("b", DType::kFloat32, {1}, 1, "device").ok());
  auto bad_device = store_->Create("a", DType::kFloat32, {1}, 5, "header.device");
  EXPECT_EQ(bad_device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad_device.status().message(), "header.device"));
}

TEST_F(TensorStoreTest, MemoryInUseIsCountedUntilItsLastUserLetsGo) {
  Make({});
  const std::string h = Put("o", 1000);
  EXPECT_EQ(store_->Usage()[0].bytes + store_->Usage()[1].bytes, 4000);
  auto held = store_->Acquire("o", h, "a");
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(store_->Free("o", {h}).ok());
  EXPECT_EQ(store_->Usage()[0].bytes + store_->Usage()[1].bytes, 4000);  // still read
  held->reset();
  EXPECT_EQ(store_->Usage()[0].bytes + store_->Usage()[1].bytes, 0);
  // An unpublished tensor is gone when dropped, and charged nothing after.
  { auto pending = store_->Create("o", DType::kFloat16, {8}, 0, "device"); }
  EXPECT_EQ(store_->Usage()[0].bytes, 0);
  int64_t used = -1;
  EXPECT_TRUE(store_->List("o", &used).empty());
  EXPECT_EQ(used, 0);
}

TEST_F(TensorStoreTest, WritesAndReadsGoThroughTheDevice) {
  Make({});
  auto t = store_->Create("o", DType::kFloat32, {4}, 1, "device");
  ASSERT_TRUE(t.ok());
  const float in[4] = {1, 2, 3, 4};
  ASSERT_TRUE(store_->Write(**t, 0, in, sizeof(in), nullptr).ok());
  float out[2] = {0, 0};
  ASSERT_TRUE(store_->Read(**t, 8, out, sizeof(out), nullptr).ok());
  EXPECT_EQ(out[0], 3);
  EXPECT_EQ(out[1], 4);
  const TensorView view = (*t)->view();
  EXPECT_EQ(view.device, 1);
  EXPECT_EQ(std::memcmp(view.data, in, sizeof(in)), 0);
}

TEST_F(TensorStoreTest, UnusedTensorsExpireAfterTheLeaseAndUseRenewsIt) {
  TensorStoreOptions options;
  options.lease = absl::Seconds(4);
  Make(options);
  const std::string idle = Put("o", 1), used = Put("o", 1);
  absl::SleepFor(absl::Seconds(2));
  ASSERT_TRUE(store_->Acquire("o", used, "a").ok());  // renews its lease
  // As of 2.5 s from now: `idle` unused for 4.5 s, `used` for 2.5 s.
  store_->ExpireIdle(absl::Now() + absl::Milliseconds(2500));
  auto gone = store_->Acquire("o", idle, "a");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "expired"));
  EXPECT_TRUE(absl::StrContains(gone.status().message(), "--resident_lease"));
  EXPECT_TRUE(store_->Acquire("o", used, "a").ok());
  EXPECT_EQ(store_->expirations(), 1);
}

}  // namespace
}  // namespace gpucompute
