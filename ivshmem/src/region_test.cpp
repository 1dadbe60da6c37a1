#include "orion/ivshmem/region.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <vector>

#include "orion/ivshmem/ring.h"

namespace orion::ivshmem {
namespace {

TEST(RegionLayout, HeaderIsPinned) {
  EXPECT_EQ(sizeof(ChannelDesc), 128u);
  EXPECT_EQ(offsetof(ChannelDesc, client_lease), 8u);
  EXPECT_EQ(offsetof(ChannelDesc, server_done_seq), 16u);
  EXPECT_EQ(offsetof(ChannelDesc, generation), 28u);
  EXPECT_EQ(offsetof(ChannelDesc, server_sleeping), 64u);  // its own cache line (see region.h)
  EXPECT_EQ(offsetof(ChannelDesc, doorbell), 68u);
  EXPECT_EQ(offsetof(ChannelDesc, client_rings), 72u);
  EXPECT_EQ(offsetof(RegionHeader, channel_count), 24u);
  EXPECT_EQ(offsetof(RegionHeader, channel_bytes), 32u);
  EXPECT_EQ(offsetof(RegionHeader, server_heartbeat), 40u);
  EXPECT_EQ(offsetof(RegionHeader, features), 56u);
  EXPECT_EQ(offsetof(RegionHeader, vm_vgpus), 60u);
  EXPECT_EQ(offsetof(RegionHeader, vm_gmem_bytes), 64u);
  EXPECT_EQ(offsetof(RegionHeader, doorbell_peer), 72u);
  EXPECT_EQ(offsetof(RegionHeader, doorbell_vectors), 76u);
  EXPECT_EQ(offsetof(RegionHeader, channels), 128u);
  EXPECT_EQ(kFeatureVmLimits, 1u);
}

TEST(RegionLayout, ChannelLayoutFitsAndIsAligned) {
  for (uint64_t mib : {4, 16, 64, 128, 1024}) {
    const uint64_t bytes = mib << 20;
    ChannelLayout l = ChannelLayout::Compute(bytes);
    EXPECT_EQ(l.request_ring_bytes & (l.request_ring_bytes - 1), 0u) << mib;
    EXPECT_EQ(l.reply_ring_bytes & (l.reply_ring_bytes - 1), 0u) << mib;
    EXPECT_GE(l.reply_ring_offset, l.request_ring_offset + kRingCursorBytes + l.request_ring_bytes);
    EXPECT_GE(l.window_offset, l.reply_ring_offset + kRingCursorBytes + l.reply_ring_bytes);
    EXPECT_EQ(l.window_offset % 4096, 0u);
    EXPECT_LE(l.window_offset + l.window_bytes, bytes);
    EXPECT_GT(l.staging_bytes, 0u);
    EXPECT_LT(l.staging_bytes, l.window_bytes);
  }
  EXPECT_EQ(ChannelCountFor(256ull << 20, 64ull << 20), 3u);  // the header page takes a slice
  EXPECT_EQ(ChannelCountFor((256ull << 20) + 4096, 64ull << 20), 4u);
  EXPECT_EQ(ChannelCountFor(16ull << 20, 64ull << 20), 0u);
}

TEST(Region, FormatValidateAndReset) {
  char path[] = "/tmp/orion_region_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  unlink(path);
  const uint64_t size = 64ull << 20;
  auto r = MappedRegion::Open(path, size);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), size);
  EXPECT_EQ(ValidateHeader(r->data(), r->size()).status().code(), Code::kFailedPrecondition);
  ASSERT_TRUE(FormatRegion(r->data(), size, 16ull << 20).ok());
  auto h = ValidateHeader(r->data(), r->size());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ((*h)->channel_count, 3u);
  // A lying header is refused.
  Header(r->data())->channel_count = 99;
  EXPECT_FALSE(ValidateHeader(r->data(), r->size()).ok());
  Header(r->data())->channel_count = 3;
  Header(r->data())->region_bytes = size * 2;
  EXPECT_FALSE(ValidateHeader(r->data(), r->size()).ok());
  Header(r->data())->region_bytes = size;
  // Reset clears a used channel.
  RegionHeader trusted{};
  trusted.channel_bytes = 16ull << 20;
  Header(r->data())->channels[1].state.store(kChannelDead);
  Header(r->data())->channels[1].client_lease.store(42);
  EXPECT_EQ(ResetChannel(r->data(), trusted, 1, 1), 2u);
  EXPECT_EQ(Header(r->data())->channels[1].generation, 2u);
  EXPECT_EQ(Header(r->data())->channels[1].state.load(), kChannelFree);
  EXPECT_EQ(Header(r->data())->channels[1].client_lease.load(), 0u);
  EXPECT_EQ(FormatRegion(r->data(), size, 128ull << 20).code(), Code::kInvalidArgument);
  unlink(path);
}

// oriond's mapping survives a tenant shrinking the file under it: the access past the new end
// reads zeros instead of killing the process, and the mapping says it faulted.
TEST(Region, ServedMappingSurvivesTruncation) {
  char path[] = "/tmp/orion_region_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8ull << 20), 0);
  close(fd);
  auto r = MappedRegion::OpenServed(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  r->data()[(4ull << 20) + 1] = 7;
  EXPECT_FALSE(r->faulted());
  EXPECT_EQ(*r->FileBytes(), 8ull << 20);
  ASSERT_EQ(truncate(path, 4096), 0);
  EXPECT_EQ(*r->FileBytes(), 4096u);
  volatile uint8_t* p = r->data();
  EXPECT_EQ(p[(4ull << 20) + 1], 0);  // SIGBUS without the guard
  EXPECT_TRUE(r->faulted());
  p[5ull << 20] = 1;  // writes land in private zero pages
  unlink(path);
}

// A region has one owner: a second OpenServed (a second oriond) is refused while the first holds it.
TEST(Region, ServedRegionHasOneOwner) {
  char path[] = "/tmp/orion_region_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8ull << 20), 0);
  close(fd);
  {
    auto first = MappedRegion::OpenServed(path);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto second = MappedRegion::OpenServed(path);
    EXPECT_EQ(second.status().code(), Code::kAlreadyExists);
    EXPECT_NE(second.status().message().find("already served by another oriond"), std::string::npos);
    EXPECT_TRUE(MappedRegion::Open(path).ok());  // clients do not take the lock
  }
  EXPECT_TRUE(MappedRegion::OpenServed(path).ok());  // released with the first mapping
  unlink(path);
}

// A VM's region: its limits are published with a feature bit; a host region has none.
TEST(Region, VmLimitsArePublished) {
  std::vector<uint8_t> mem(8ull << 20);
  ASSERT_TRUE(FormatRegion(mem.data(), mem.size(), 4ull << 20).ok());
  EXPECT_EQ(Header(mem.data())->features & kFeatureVmLimits, 0u);
  EXPECT_EQ(Header(mem.data())->vm_vgpus, 0u);
  const VmLimits vm{2, 3000ull << 20};
  ASSERT_TRUE(FormatRegion(mem.data(), mem.size(), 4ull << 20, &vm).ok());
  auto h = ValidateHeader(mem.data(), mem.size());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)->features & kFeatureVmLimits, kFeatureVmLimits);
  EXPECT_EQ((*h)->vm_vgpus, 2u);
  EXPECT_EQ((*h)->vm_gmem_bytes, 3000ull << 20);
}

// Channels for N processes: the region split evenly after the header page, 4096-aligned.
TEST(Region, ChannelBytesForProcesses) {
  auto ch = ChannelBytesFor(256ull << 20, 4);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(*ch % 4096, 0u);
  EXPECT_EQ(ChannelCountFor(256ull << 20, *ch), 4u);
  EXPECT_GT(*ch, 63ull << 20);
  ch = ChannelBytesFor(64ull << 20, 4);
  ASSERT_TRUE(ch.ok());
  EXPECT_EQ(ChannelCountFor(64ull << 20, *ch), 4u);
  EXPECT_EQ(ChannelBytesFor(16ull << 20, 4).status().code(), Code::kInvalidArgument);
  EXPECT_NE(ChannelBytesFor(16ull << 20, 4).status().message().find("too small for 4 processes"), std::string::npos);
  EXPECT_FALSE(ChannelBytesFor(1ull << 30, 0).ok());
  EXPECT_FALSE(ChannelBytesFor(1ull << 30, kMaxChannels + 1).ok());
}

// A served file that is removed (or replaced) is noticed: a VM's region after the VM stopped.
TEST(Region, ServedMappingKnowsWhenItsFileIsGone) {
  char path[] = "/tmp/orion_region_testXXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8ull << 20), 0);
  close(fd);
  auto r = MappedRegion::OpenServed(path);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->StillAtPath());
  unlink(path);
  EXPECT_FALSE(r->StillAtPath());
  fd = open(path, O_CREAT | O_RDWR, 0600);  // a new file under the old name is another file
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_FALSE(r->StillAtPath());
  unlink(path);
}

TEST(Region, OpenErrorsAreClear) {
  auto r = MappedRegion::Open("/nonexistent/dir/orionsock0");
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace orion::ivshmem
