#include "orion/pool/pool.h"

#include <gtest/gtest.h>

namespace orion::pool {
namespace {

std::vector<PhysicalGpu> TwoV100() {
  return {{0, "V100", 16384ull << 20, "GPU-0"}, {1, "V100", 16384ull << 20, "GPU-1"}};
}

TEST(VgpuPool, SmallRequestsPackOntoOneGpu) {
  VgpuPool pool(TwoV100(), 4);
  auto p = pool.Admit(2, 7000);  // two vGPUs of < 8 GB fit on one V100 (Orion's example)
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].pgpu, (*p)[1].pgpu);
  EXPECT_NE((*p)[0].vgpu, (*p)[1].vgpu);
  EXPECT_EQ((*p)[0].quota_bytes, 7000ull << 20);
}

TEST(VgpuPool, LargeRequestsSpillToTheNextGpu) {
  VgpuPool pool(TwoV100(), 4);
  auto p = pool.Admit(2, 9000);  // more than half a card each: one per GPU
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NE((*p)[0].pgpu, (*p)[1].pgpu);
}

TEST(VgpuPool, RefusalsSayWhyAndAllocateNothing) {
  VgpuPool pool(TwoV100(), 2);
  auto too_big = pool.Admit(1, 20000);
  EXPECT_EQ(too_big.status().code(), Code::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("ORION_GMEM=20000"), std::string::npos);
  auto too_many = pool.Admit(5, 1000);
  EXPECT_EQ(too_many.status().code(), Code::kResourceExhausted);
  EXPECT_NE(too_many.status().message().find("ORION_VGPU=5"), std::string::npos);
  EXPECT_EQ(pool.free_vgpus(), 4u);
  // Memory: three 9000 MiB vGPUs do not fit on two 16 GiB cards; nothing is taken.
  auto mem = pool.Admit(3, 9000);
  EXPECT_EQ(mem.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(pool.free_vgpus(), 4u);
}

TEST(VgpuPool, ReleaseFreesSlotsAndMemory) {
  VgpuPool pool(TwoV100(), 1);
  auto a = pool.Admit(2, 16000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.free_vgpus(), 0u);
  EXPECT_FALSE(pool.Admit(1, 100).ok());
  pool.Release(*a);
  EXPECT_EQ(pool.free_vgpus(), 2u);
  EXPECT_TRUE(pool.Admit(1, 16000).ok());
}

TEST(VgpuPool, DefaultSizeIsGpuMemoryOverVgpuCount) {
  VgpuPool pool(TwoV100(), 4);
  auto p = pool.Admit(1, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].quota_bytes, 4096ull << 20);
  EXPECT_EQ(pool.FinalList(), "0:0:4096,1:0:4096,2:0:4096,3:0:4096,0:1:4096,1:1:4096,2:1:4096,3:1:4096");
}

TEST(VgpuPool, SpreadTakesTheEmptiestGpuForEachVgpu) {
  VgpuPool pool(TwoV100(), 4);
  auto p = pool.Admit(2, 1000, PlacementPolicy::kSpread);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NE((*p)[0].pgpu, (*p)[1].pgpu);
  auto q = pool.Admit(2, 1000, PlacementPolicy::kPack);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ((*q)[0].pgpu, (*q)[1].pgpu);
}

TEST(VgpuPool, ReserveMirrorsPlacementsDecidedElsewhere) {
  VgpuPool pool(TwoV100(), 2);
  ASSERT_TRUE(pool.Reserve({{1, 1, 4096ull << 20}}).ok());
  EXPECT_EQ(pool.free_vgpus(), 3u);
  EXPECT_EQ(pool.used_bytes(), 4096ull << 20);
  // Taken, missing and too large slots are refused, and nothing of the batch is kept.
  EXPECT_FALSE(pool.Reserve({{0, 0, 1ull << 20}, {1, 1, 1ull << 20}}).ok());
  EXPECT_FALSE(pool.Reserve({{0, 5, 1ull << 20}}).ok());
  EXPECT_FALSE(pool.Reserve({{2, 0, 1ull << 20}}).ok());
  EXPECT_FALSE(pool.Reserve({{1, 0, 13000ull << 20}}).ok());
  EXPECT_EQ(pool.free_vgpus(), 3u);
  pool.Release({{1, 1, 4096ull << 20}});
  EXPECT_EQ(pool.free_vgpus(), 4u);
  EXPECT_EQ(pool.used_bytes(), 0u);
}

TEST(VgpuPool, RatiosOnAGpuAddUpToAtMost100) {
  VgpuPool pool(TwoV100(), 4);
  auto a = pool.Admit(1, 1000, PlacementPolicy::kPack, 70);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)[0].ratio, 70u);
  // 50 more does not fit beside 70: the vGPU goes to the other GPU, though packing prefers the first.
  auto b = pool.Admit(1, 1000, PlacementPolicy::kPack, 50);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE((*b)[0].pgpu, (*a)[0].pgpu);
  // Best-effort vGPUs (ratio 0) still fit anywhere a slot and memory are free.
  auto c = pool.Admit(1, 1000, PlacementPolicy::kPack, 0);
  ASSERT_TRUE(c.ok());
  // 60 fits nowhere now (30 and 50 are left): refused, saying how much compute is left, nothing taken.
  const uint32_t free_before = pool.free_vgpus();
  auto d = pool.Admit(1, 1000, PlacementPolicy::kPack, 60);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kResourceExhausted);
  EXPECT_NE(d.status().message().find("ORION_RATIO=60 does not fit any p-GPU: at most 50% of a GPU's compute is left"),
            std::string::npos)
      << d.status().message();
  EXPECT_EQ(pool.free_vgpus(), free_before);
  // Two vGPUs of 30 each cannot both go on the GPU with 30 left: one each.
  auto e = pool.Admit(2, 1000, PlacementPolicy::kPack, 30);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE((*e)[0].pgpu, (*e)[1].pgpu);
  EXPECT_EQ(pool.used_ratio(0) + pool.used_ratio(1), 70u + 50u + 60u);
  // Released, the compute is free again.
  pool.Release(*a);
  EXPECT_EQ(pool.used_ratio(0) + pool.used_ratio(1), 50u + 60u);
  EXPECT_TRUE(pool.Admit(1, 1000, PlacementPolicy::kPack, 70).ok());
  EXPECT_EQ(pool.Admit(1, 1000, PlacementPolicy::kPack, 101).status().code(), Code::kInvalidArgument);
}

TEST(VgpuPool, ReserveChecksCompute) {
  VgpuPool pool(TwoV100(), 4);
  ASSERT_TRUE(pool.Reserve({{0, 0, 1000ull << 20, 60}}).ok());
  const Status st = pool.Reserve({{0, 1, 1000ull << 20, 50}});
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("40% of its compute left, not 50%"), std::string::npos) << st.message();
  EXPECT_EQ(pool.free_vgpus(), 7u);
  EXPECT_TRUE(pool.Reserve({{0, 1, 1000ull << 20, 40}}).ok());
  // One GPU short of compute: the refusal names it.
  VgpuPool one({{0, "H100", 80ull << 30, "GPU-0"}}, 4);
  ASSERT_TRUE(one.Admit(1, 1000, PlacementPolicy::kPack, 70).ok());
  auto r = one.Admit(1, 1000, PlacementPolicy::kPack, 40);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "ORION_RATIO=40 does not fit p-GPU 0: 30% of its compute is left (its tenants' ratios add up to 70)");
}

}  // namespace
}  // namespace orion::pool
