// SessionState's tables and lookups on their own: handles of one kind never answer for another,
// ids are unique across every table of a session, and the device-range checks every copy, memset,
// launch and tensor map goes through.
#include "session_state.h"

#include <gtest/gtest.h>

#include <set>

namespace orion::host::detail {
namespace {

TEST(SessionState, AHandleAnswersOnlyForItsOwnKind) {
  SessionState s;
  int backend_ctx = 0, backend_stream = 0;
  const uint64_t ctx = s.AddHandle({Kind::kCtx, &backend_ctx, 0, 0, {}});
  const uint64_t stream = s.AddHandle({Kind::kStream, &backend_stream, 0, ctx, {}});
  ASSERT_NE(s.Find(ctx, Kind::kCtx), nullptr);
  EXPECT_EQ(s.Find(ctx, Kind::kCtx)->backend, &backend_ctx);
  EXPECT_EQ(s.Find(ctx, Kind::kStream), nullptr);
  EXPECT_EQ(s.Find(stream, Kind::kCtx), nullptr);
  EXPECT_EQ(s.Find(stream + 1, Kind::kStream), nullptr);
  EXPECT_EQ(s.Find(0, Kind::kStream), nullptr);
  void* out = &backend_ctx;
  EXPECT_TRUE(s.Stream(0, &out));  // the null stream
  EXPECT_EQ(out, nullptr);
  EXPECT_TRUE(s.Stream(stream, &out));
  EXPECT_EQ(out, &backend_stream);
  EXPECT_FALSE(s.Stream(ctx, &out));
}

TEST(SessionState, IdsAreUniqueAcrossTablesAndNeverZero) {
  SessionState s;
  std::set<uint64_t> seen;
  for (int i = 0; i < 1000; ++i) {
    const uint64_t h = s.AddHandle({Kind::kEvent, nullptr, 0, 0, {}});
    const uint64_t a = s.NewId();  // an array's
    EXPECT_TRUE(s.arrays_.Add(a, ArrayRec{}));
    EXPECT_NE(h, 0u);
    EXPECT_NE(a, 0u);
    EXPECT_TRUE(seen.insert(h).second);
    EXPECT_TRUE(seen.insert(a).second);
    EXPECT_EQ(s.Find(a, Kind::kEvent), nullptr);  // an array's id is no event
  }
  EXPECT_EQ(s.handles_.size() + s.arrays_.size(), 2000u);
  EXPECT_FALSE(s.HandlesFull());
}

TEST(SessionState, HandlesFullCountsEveryTable) {
  SessionState s;
  for (size_t i = 0; i + 1 < kMaxSessionHandles; ++i) s.mipmaps_.Add(s.NewId(), MipmapRec{});
  EXPECT_FALSE(s.HandlesFull());
  s.texobjs_.Add({1, false}, TexRec{});
  EXPECT_TRUE(s.HandlesFull());
}

// [p, p + bytes) must lie inside one allocation, or run through accessible VMM mappings side by side.
TEST(SessionState, DeviceRangeStaysInsideTheSessionsMemory) {
  SessionState s;
  s.allocs_[0x10000] = Alloc{0x1000, 0, true, 0x1000};
  s.allocs_[0x11000] = Alloc{0x1000, 0, true, 0x1000};  // adjoins, but two allocations
  Alloc vmm{0x2000, 0, false};
  vmm.vmm = true;
  s.allocs_[0x40000] = vmm;
  s.allocs_[0x42000] = vmm;  // mapped side by side
  s.allocs_[0x48000] = vmm;  // a gap before it
  EXPECT_TRUE(s.DeviceRange(0x10000, 0x1000));
  EXPECT_TRUE(s.DeviceRange(0x10ff0, 0x10));
  EXPECT_FALSE(s.DeviceRange(0x10ff0, 0x11));   // into the next allocation
  EXPECT_FALSE(s.DeviceRange(0xffff, 1));       // before any
  EXPECT_FALSE(s.DeviceRange(0x12000, 1));      // after
  EXPECT_TRUE(s.DeviceRange(0x40000, 0x4000));  // two adjoining mappings
  EXPECT_TRUE(s.DeviceRange(0x41000, 0x2000));
  EXPECT_FALSE(s.DeviceRange(0x40000, 0x4001));  // into the gap
  EXPECT_FALSE(s.DeviceRange(0x10000, ~uint64_t{0}));
  EXPECT_FALSE(s.DeviceRange(~uint64_t{0}, 2));
}

TEST(SessionState, ReservationsAndWholeMappings) {
  SessionState s;
  s.reservations_[0x100000] = Reservation{0x10000};
  EXPECT_NE(s.ReservationOf(0x100000, 0x10000), s.reservations_.end());
  EXPECT_NE(s.ReservationOf(0x108000, 0x8000), s.reservations_.end());
  EXPECT_EQ(s.ReservationOf(0x108000, 0x8001), s.reservations_.end());
  EXPECT_EQ(s.ReservationOf(0xfffff, 2), s.reservations_.end());
  EXPECT_EQ(s.ReservationOf(0x108000, ~uint64_t{0}), s.reservations_.end());
  s.mappings_[0x100000] = Mapping{0x2000, 1};
  s.mappings_[0x102000] = Mapping{0x2000, 2};
  s.mappings_[0x106000] = Mapping{0x2000, 3};
  std::map<uint64_t, Mapping>::iterator first, end;
  EXPECT_TRUE(s.WholeMappings(0x100000, 0x4000, &first, &end));
  EXPECT_EQ(first->first, 0x100000u);
  EXPECT_EQ(end->first, 0x106000u);
  EXPECT_FALSE(s.WholeMappings(0x100000, 0x3000, &first, &end));  // part of one
  EXPECT_FALSE(s.WholeMappings(0x100000, 0x8000, &first, &end));  // across the gap
  EXPECT_FALSE(s.WholeMappings(0x101000, 0x1000, &first, &end));  // not a mapping's start
  EXPECT_FALSE(s.WholeMappings(0x106000, 0, &first, &end));
}

// A table never makes a record by looking it up, refuses a key it holds, and Known refuses one it
// does not (std::out_of_range: the worker ends rather than corrupt its counts).
TEST(SessionState, TablesFindWhatTheyHoldAndNothingElse) {
  Table<ArrayRec> t;
  EXPECT_EQ(t.Find(7), nullptr);
  EXPECT_EQ(t.size(), 0u);
  ArrayRec a;
  a.width = 64;
  EXPECT_TRUE(t.Add(7, a));
  a.width = 128;
  EXPECT_FALSE(t.Add(7, a));  // taken: the first record stays
  ASSERT_NE(t.Find(7), nullptr);
  EXPECT_EQ(t.Find(7)->width, 64u);
  EXPECT_EQ(t.Known(7).width, 64u);
  EXPECT_THROW((void)t.Known(8), std::out_of_range);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.Erase(7));
  EXPECT_FALSE(t.Erase(7));
  EXPECT_EQ(t.Find(7), nullptr);
}

// A level of a mipmapped array lives only while its owner does.
TEST(SessionState, AnArrayOfADestroyedMipmapIsNotLive) {
  SessionState s;
  const uint64_t m = s.NewId(), level = s.NewId(), plain = s.NewId();
  s.mipmaps_.Add(m, MipmapRec{});
  ArrayRec l;
  l.mipmap = m;
  s.arrays_.Add(level, l);
  s.arrays_.Add(plain, ArrayRec{});
  EXPECT_NE(s.LiveArray(level), nullptr);
  EXPECT_NE(s.LiveArray(plain), nullptr);
  s.mipmaps_.Known(m).destroyed = true;
  EXPECT_EQ(s.LiveMipmap(m), nullptr);
  EXPECT_EQ(s.LiveArray(level), nullptr);
  s.arrays_.Known(plain).destroyed = true;
  EXPECT_EQ(s.LiveArray(plain), nullptr);
  EXPECT_EQ(s.LiveArray(m), nullptr);  // a mipmap's id is no array
}

}  // namespace
}  // namespace orion::host::detail
