#include "orion/controller/service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <thread>

#include "orion/controller/config.h"
#include "orion/controller/client.h"

namespace orion::controller {
namespace {

// The REST layer's path for a body: decoded by its type's FromJson (requests.h), then the service.
template <typename Req, typename Call>
Result<Json> Decoded(const Json& body, Call call) {
  auto r = Req::FromJson(body);
  if (!r.ok()) return r.status();
  return call(*r);
}
Result<Json> RegisterServer(Service& s, const std::string& id, const Json& body) {
  return Decoded<ServerRegistration>(body, [&](const auto& r) { return s.RegisterServer(id, r); });
}
Result<Json> Heartbeat(Service& s, const std::string& id, const Json& body) {
  return Decoded<ServerHeartbeat>(body, [&](const auto& r) { return s.Heartbeat(id, r); });
}
Result<Json> Allocate(Service& s, const Json& body, const std::string& server, const Caller& caller = {}) {
  return Decoded<AllocationRequest>(body, [&](AllocationRequest r) {
    r.server = server;
    return s.Allocate(r, caller);
  });
}
Result<Json> Confirm(Service& s, const std::string& id, const Json& body) {
  return Decoded<SessionConfirmation>(body, [&](const auto& r) { return s.Confirm(id, r); });
}
Result<Json> Assign(Service& s, const std::string& vm, const Json& body) {
  return Decoded<AssignmentRequest>(body, [&](const auto& r) { return s.Assign(vm, r); });
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("orion-ctl-" + std::to_string(getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    opts_.database = (dir_ / "c.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<Service> Open() {
    auto s = Service::Open(opts_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(*s);
  }
  static Json TwoGpuServer(const std::string& host, uint32_t vgpu_count = 4) {
    return {{"hostname", host},
            {"vgpu_count", vgpu_count},
            {"boot_id", "b1"},
            {"gpus",
             {{{"index", 0}, {"uuid", "GPU-a"}, {"name", "V100"}, {"memory_mib", 16384}},
              {{"index", 1}, {"uuid", "GPU-b"}, {"name", "V100"}, {"memory_mib", 16384}}}}};
  }
  static Json Req(uint32_t vgpus, uint64_t gmem) {
    return {{"vgpus", vgpus}, {"gmem_mib", gmem}, {"client", {{"host", "c1"}, {"pid", 42}, {"process", "train"}}}};
  }
  std::filesystem::path dir_;
  ServiceOptions opts_;
};

TEST_F(ServiceTest, OwnerHashesAreSaltedPerStoreAndOldOnesStillOwn) {
  // Issue #22: the owner hash was a bare SHA-256 of the key, so a short key could be found from it
  // by whoever reads the store. It is PBKDF2 with the store's own salt, stable across restarts.
  std::string first, again;
  {
    auto s = Open();
    first = s->OwnerOf("client-key-0001");
    EXPECT_EQ(first.rfind("key2:", 0), 0u) << first;
    EXPECT_EQ(first.size(), 5u + 32u);
    EXPECT_EQ(s->OwnerOf("client-key-0001"), first);  // cached, the same
    EXPECT_NE(s->OwnerOf("client-key-0002"), first);
  }
  {
    auto s = Open();  // the salt is the store's: the same key, the same owner
    again = s->OwnerOf("client-key-0001");
  }
  EXPECT_EQ(again, first);
  opts_.database = (dir_ / "other.db").string();
  auto other = Open();  // another store, another salt
  EXPECT_NE(other->OwnerOf("client-key-0001"), first);
  // The unsalted hash older controllers recorded: "key:" and the first 16 hex digits of SHA-256
  // (`echo -n client-key-0001 | sha256sum`); an allocation carrying it is still the key's.
  const std::string legacy = Service::LegacyOwnerOf("client-key-0001");
  EXPECT_EQ(legacy, "key:64eae4db4b1eb8b3");
  Caller c{Caller::Kind::kClient, first, "", legacy};
  EXPECT_TRUE(c.Owns(first));
  EXPECT_TRUE(c.Owns(legacy));
  EXPECT_FALSE(c.Owns(""));
  EXPECT_FALSE(c.Owns(Service::LegacyOwnerOf("client-key-0002")));
}

TEST_F(ServiceTest, PacksVgpusOntoOneGpuThenTheFullestServer) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b")).ok());
  auto a = Allocate(*s, Req(2, 7000), "");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const auto& p = (*a)["placements"];
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0]["pgpu"], p[1]["pgpu"]);  // two < 8 GB vGPUs share one 16 GB card (Orion's rule)
  EXPECT_EQ((*a)["state"], "pending");
  EXPECT_EQ((*a)["gmem_mib"], 7000);
  auto b = Allocate(*s, Req(1, 9000), "");  // only the other GPU fits it: same (fuller) server
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)["server"], (*a)["server"]);
  EXPECT_NE((*b)["placements"][0]["pgpu"], (*a)["placements"][0]["pgpu"]);
  auto c = Allocate(*s, Req(1, 8000), "");  // the first server has no 8000 MiB left on any GPU
  ASSERT_TRUE(c.ok());
  EXPECT_NE((*c)["server"], (*a)["server"]);
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);
}

TEST_F(ServiceTest, SpreadPolicyTakesTheEmptiestServerAndGpu) {
  opts_.policy = pool::PlacementPolicy::kSpread;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b")).ok());
  auto a = Allocate(*s, Req(2, 1000), "");
  ASSERT_TRUE(a.ok());
  EXPECT_NE((*a)["placements"][0]["pgpu"], (*a)["placements"][1]["pgpu"]);
  auto b = Allocate(*s, Req(1, 1000), "");
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*b)["server"], (*a)["server"]);
}

TEST_F(ServiceTest, RefusalsSayWhyAndAllocateNothing) {
  auto s = Open();
  EXPECT_EQ(Allocate(*s, Req(1, 1000), "").status().code(), Code::kUnavailable);  // no server yet
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto big = Allocate(*s, Req(1, 20000), "");
  EXPECT_EQ(big.status().code(), Code::kInvalidArgument);
  EXPECT_NE(big.status().message().find("more than any GPU has (16384 MiB)"), std::string::npos)
      << big.status().message();
  auto many = Allocate(*s, Req(9, 100), "");
  EXPECT_EQ(many.status().code(), Code::kInvalidArgument);
  EXPECT_NE(many.status().message().find("more than any server holds (8 vGPUs)"), std::string::npos);
  auto mem = Allocate(*s, Req(3, 12000), "");
  EXPECT_EQ(mem.status().code(), Code::kInvalidArgument);
  EXPECT_NE(mem.status().message().find("more than any server's GPU memory (32768 MiB)"), std::string::npos);
  for (const Json& garbage : {Json{{"vgpus", "two"}}, Json{{"vgpus", -1}}, Json{{"vgpus", 0}}, Json{{"vgpus", 1.5}},
                              Json{{"vgpus", 1}, {"gmem_mib", "x"}}, Json{{"vgpus", 1}, {"client", 3}},
                              Json{{"vgpus", 1}, {"gmem_mib", 1ull << 40}}, Json::array()}) {
    EXPECT_EQ(Allocate(*s, garbage, "").status().code(), Code::kInvalidArgument) << garbage.dump();
  }
  ASSERT_TRUE(Allocate(*s, Req(2, 16000), "").ok());
  auto full = Allocate(*s, Req(1, 1000), "");
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted);
  EXPECT_NE(full.status().message().find("10.0.0.1:9960: 6 of 8 vGPUs free, 768 MiB unallocated"), std::string::npos)
      << full.status().message();
  EXPECT_EQ(s->Summary()["allocations"], 1);
}

// Compute share (issue #21): the ratios on a physical GPU add up to at most 100. A request whose
// ratio does not fit a GPU is placed on another, or refused saying how much compute is left; a
// release and a restart give the compute back and keep it accounted.
TEST_F(ServiceTest, ComputeRatiosOnAGpuAddUpToAtMost100) {
  std::string first;
  {
    auto s = Open();
    ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
    Json r70 = Req(1, 1000);
    r70["ratio"] = 70;
    auto a = Allocate(*s, r70, "");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ((*a)["ratio"], 70);
    first = (*a)["id"];
    Json r50 = Req(1, 1000);
    r50["ratio"] = 50;
    auto b = Allocate(*s, r50, "");  // packing prefers the same GPU; its compute does not allow it
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_NE((*b)["placements"][0]["pgpu"], (*a)["placements"][0]["pgpu"]);
    auto best_effort = Allocate(*s, Req(1, 1000), "");  // no ratio: not counted, not promised
    ASSERT_TRUE(best_effort.ok());
    EXPECT_EQ((*best_effort)["ratio"], 0);
    Json r60 = Req(1, 1000);
    r60["ratio"] = 60;
    auto c = Allocate(*s, r60, "");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kResourceExhausted);
    EXPECT_NE(c.status().message().find("with ORION_RATIO=60% of a GPU's compute each"), std::string::npos)
        << c.status().message();
    EXPECT_NE(c.status().message().find("at most 50% of a GPU's compute left"), std::string::npos)
        << c.status().message();
    Json r101 = Req(1, 1000);
    r101["ratio"] = 101;
    EXPECT_EQ(Allocate(*s, r101, "").status().code(), Code::kInvalidArgument);
  }
  {
    auto s = Open();  // restarted: the ratios are accounted from the stored allocations
    Json r60 = Req(1, 1000);
    r60["ratio"] = 60;
    auto c = Allocate(*s, r60, "");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("at most 50% of a GPU's compute left"), std::string::npos)
        << c.status().message();
    ASSERT_TRUE(s->Release(first, "done", Caller{}).ok());
    EXPECT_TRUE(Allocate(*s, r60, "").ok());  // the 70 given back
  }
}

TEST_F(ServiceTest, ConcurrentRequestsNeverDoubleBook) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b")).ok());
  std::vector<std::thread> ts;
  std::mutex mu;
  std::vector<Json> got;
  int refused = 0;
  for (int i = 0; i < 50; ++i) {
    ts.emplace_back([&] {
      auto a = Allocate(*s, Req(1, 1000), "");
      std::lock_guard<std::mutex> lock(mu);
      if (a.ok())
        got.push_back(*a);
      else
        refused += a.status().code() == Code::kResourceExhausted;
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(got.size(), 16u);  // 2 servers x 2 GPUs x 4 vGPUs
  EXPECT_EQ(refused, 34);
  std::set<std::string> slots;
  for (const Json& a : got) slots.insert(a["placements"][0]["text"].get<std::string>());
  EXPECT_EQ(slots.size(), 16u);
}

// A store whose Apply loses the next `lose` races (kAlreadyExists: a guard failed, nothing applied),
// as when other controllers write first; everything else is the SQLite store's.
class RacingStore final : public Store {
 public:
  explicit RacingStore(std::unique_ptr<Store> real) : real_(std::move(real)) {}
  const char* kind() const override { return real_->kind(); }
  std::string where() const override { return real_->where(); }
  bool shared() const override { return real_->shared(); }
  Result<StoreState> Load() override { return real_->Load(); }
  Status Apply(const StoreChange& c) override {
    ++applies;
    if (lose > 0) {
      --lose;
      return Status(Code::kAlreadyExists, "a guarded key changed");
    }
    return real_->Apply(c);
  }
  Result<int64_t> Grant(uint64_t ttl_ms) override { return real_->Grant(ttl_ms); }
  Result<uint64_t> KeepAlive(int64_t lease, uint64_t ttl_hint_ms) override {
    return real_->KeepAlive(lease, ttl_hint_ms);
  }
  void Revoke(int64_t lease) override { real_->Revoke(lease); }
  Result<std::string> OwnerSalt(const std::string& proposed, bool overwrite) override {
    return real_->OwnerSalt(proposed, overwrite);
  }
  Status Ping() override { return real_->Ping(); }

  int lose = 0;
  int applies = 0;

 private:
  std::unique_ptr<Store> real_;
};

// Every write is one Transact: a lost race is decided again from fresh state, up to 24 tries; the
// 24th lost race is reported as a busy pool and leaves nothing placed or reserved.
TEST_F(ServiceTest, LostRacesAreTriedAgainThenReportedAsABusyPool) {
  auto real = OpenStore(opts_.database);
  ASSERT_TRUE(real.ok()) << real.status().ToString();
  auto racing = std::make_unique<RacingStore>(std::move(*real));
  RacingStore* store = racing.get();
  auto opened = Service::Open(opts_, std::move(racing));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Service& s = **opened;
  store->lose = 3;
  store->applies = 0;
  ASSERT_TRUE(RegisterServer(s, "10.0.0.1:9960", TwoGpuServer("a", 1)).ok());
  EXPECT_EQ(store->applies, 4);
  store->lose = 5;
  store->applies = 0;
  auto first = Allocate(s, Req(1, 1000), "");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(store->applies, 6);
  store->lose = 1000;
  store->applies = 0;
  auto busy = Allocate(s, Req(1, 1000), "");
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), Code::kUnavailable);
  EXPECT_EQ(busy.status().message(), "the pool is too busy: placement lost 24 races in a row; try again");
  EXPECT_EQ(store->applies, 24);
  // Nothing of the lost placement stayed reserved: the server's second GPU is still free.
  store->lose = 0;
  auto second = Allocate(s, Req(1, 1000), "");
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(s.ListAllocations("", "").size(), 2u);
  auto full = Allocate(s, Req(1, 1000), "");
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted);  // 2 GPUs x 1 vGPU
  store->lose = 2;
  store->applies = 0;
  ASSERT_TRUE(s.Release((*first)["id"].get<std::string>(), "test").ok());
  EXPECT_EQ(store->applies, 3);
  EXPECT_EQ(s.ListAllocations("", "").size(), 1u);
}

TEST_F(ServiceTest, ARestartLosesNothing) {
  std::string id, vm_id;
  {
    auto s = Open();
    ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
    auto a = Allocate(*s, Req(2, 4000), "");
    ASSERT_TRUE(a.ok());
    id = (*a)["id"];
    ASSERT_TRUE(Confirm(*s, id, {{"server", "10.0.0.1:9960"}, {"session", 7}}).ok());
    auto v = Assign(*s, "vm-1", {{"vgpus", 1}, {"gmem_mib", 2000}, {"server", "10.0.0.1:9960"}});
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    vm_id = (*v)["id"];
  }
  auto s = Open();
  auto a = s->GetAllocation(id);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)["state"], "active");
  EXPECT_EQ((*a)["session"], 7);
  EXPECT_EQ((*a)["placements"].size(), 2u);
  EXPECT_EQ(s->Summary()["vgpus_free"], 5);
  auto v = Assign(*s, "vm-1", {{"vgpus", 1}, {"gmem_mib", 2000}, {"server", "10.0.0.1:9960"}});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)["id"], vm_id);  // idempotent across restarts
  // A second controller cannot serve the same database.
  auto second = Service::Open(opts_);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use by another orion-controller"), std::string::npos);
}

TEST_F(ServiceTest, UnrenewedLeasesExpireAndHeartbeatsRenewThem) {
  opts_.lease_ttl_ms = 1000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto kept = Allocate(*s, Req(1, 1000), "");
  auto lost = Allocate(*s, Req(1, 1000), "");
  ASSERT_TRUE(kept.ok() && lost.ok());
  const uint64_t t0 = WallMs();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(Heartbeat(*s, "10.0.0.1:9960",
                        {{"boot_id", "b1"}, {"allocations", {{{"id", (*kept)["id"]}, {"used_mib", {300}}}}}})
                  .ok());
  auto did = s->Sweep(t0 + 1005);
  ASSERT_EQ(did.size(), 1u);
  EXPECT_NE(did[0].find((*lost)["id"].get<std::string>()), std::string::npos);
  EXPECT_TRUE(s->GetAllocation((*kept)["id"]).ok());
  EXPECT_EQ((*s->GetAllocation((*kept)["id"]))["placements"][0]["used_mib"], 300);
  EXPECT_EQ(s->GetAllocation((*lost)["id"]).status().code(), Code::kNotFound);
  // A heartbeat naming an allocation the controller does not hold gets it back as revoked.
  auto hb = Heartbeat(*s, "10.0.0.1:9960", {{"allocations", {{{"id", (*lost)["id"]}}}}});
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ((*hb)["revoked"][0], (*lost)["id"]);
}

TEST_F(ServiceTest, SilentServersAreWithheldAndComeBack) {
  opts_.server_timeout_ms = 1000;
  opts_.server_release_ms = 5000;
  opts_.lease_ttl_ms = 100000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto a = Allocate(*s, Req(1, 1000), "");
  ASSERT_TRUE(a.ok());
  const uint64_t t0 = WallMs();
  EXPECT_EQ(s->Sweep(t0 + 1500).size(), 1u);  // down
  EXPECT_EQ(s->Summary()["vgpus_total"], 0);
  EXPECT_EQ(Allocate(*s, Req(1, 1000), "").status().code(), Code::kUnavailable);
  EXPECT_TRUE(s->GetAllocation((*a)["id"]).ok());  // kept until server_release_ms
  ASSERT_TRUE(Heartbeat(*s, "10.0.0.1:9960", {{"boot_id", "b1"}}).ok());
  EXPECT_EQ(s->Summary()["vgpus_total"], 8);
  EXPECT_EQ(s->Sweep(WallMs() + 5500).size(), 2u);  // down again, and its allocation released
  EXPECT_EQ(s->GetAllocation((*a)["id"]).status().code(), Code::kNotFound);
}

TEST_F(ServiceTest, AGapInTheControllersClockGivesLeasesAGracePeriod) {
  // Issue #11 item 6: a paused controller must not expire what nobody could renew meanwhile.
  opts_.lease_ttl_ms = 1000;
  opts_.server_timeout_ms = 1000;
  opts_.clock_gap_ms = 500;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto a = Allocate(*s, Req(1, 1000), "");
  ASSERT_TRUE(a.ok());
  const uint64_t t0 = WallMs();
  EXPECT_TRUE(s->Sweep(t0).empty());
  auto did = s->Sweep(t0 + 3000);  // 3 s since the last sweep: longer than the lease
  ASSERT_EQ(did.size(), 1u);
  EXPECT_NE(did[0].find("grace period"), std::string::npos);
  EXPECT_TRUE(s->GetAllocation((*a)["id"]).ok());
  EXPECT_EQ(s->Summary()["servers_up"], 1);
  EXPECT_TRUE(s->Sweep(t0 + 3400).empty());  // within the grace (sweeps every 400 ms again)
  EXPECT_TRUE(s->Sweep(t0 + 3800).empty());
  // The grace is one lease from the resume: unrenewed, it expires after that.
  EXPECT_EQ(s->Sweep(t0 + 4200).size(), 2u);  // expired, and the server is down
  EXPECT_EQ(s->GetAllocation((*a)["id"]).status().code(), Code::kNotFound);
}

TEST_F(ServiceTest, PerKeyLimitsAndPendingAllocationsExpire) {
  // Issue #11 item 10: a per-key limit on live allocations, and pending ones cannot be renewed forever.
  opts_.max_allocations_per_key = 2;
  opts_.pending_ttl_ms = 1000;
  opts_.lease_ttl_ms = 100000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  const Caller alice{Caller::Kind::kClient, "key:aaaa", ""}, bob{Caller::Kind::kClient, "key:bbbb", ""};
  auto a1 = Allocate(*s, Req(1, 100), "", alice);
  auto a2 = Allocate(*s, Req(1, 100), "", alice);
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = Allocate(*s, Req(1, 100), "", alice);
  ASSERT_FALSE(a3.ok());
  EXPECT_EQ(a3.status().code(), Code::kOutOfRange);
  EXPECT_NE(a3.status().message().find("max_allocations_per_key"), std::string::npos);
  EXPECT_TRUE(Allocate(*s, Req(1, 100), "", bob).ok());
  // Another key's allocation is out of reach; its own is not.
  EXPECT_EQ(s->Release((*a1)["id"], "x", bob).status().code(), Code::kPermissionDenied);
  EXPECT_EQ(s->ListAllocations("", "", bob).size(), 1u);
  ASSERT_TRUE(Confirm(*s, (*a1)["id"], {{"server", "10.0.0.1:9960"}, {"session", 1}}).ok());
  // A renewal never carries a pending allocation past pending_ttl_ms; the sweep then drops it.
  auto r = s->Renew((*a2)["id"], alice);
  ASSERT_TRUE(r.ok());
  EXPECT_LE((*r)["lease_expires_ms"].get<uint64_t>(), (*a2)["created_ms"].get<uint64_t>() + 1000);
  auto did = s->Sweep(WallMs() + 1500);
  ASSERT_EQ(did.size(), 2u);  // alice's and bob's pending ones; the confirmed one stays
  EXPECT_TRUE(s->GetAllocation((*a1)["id"]).ok());
  EXPECT_EQ(s->GetAllocation((*a2)["id"]).status().code(), Code::kNotFound);
  EXPECT_TRUE(Allocate(*s, Req(1, 100), "", alice).ok());  // under the limit again
}

TEST_F(ServiceTest, ARestartedServerLosesTheSessionsItNoLongerHas) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto a = Allocate(*s, Req(1, 1000), "10.0.0.1:9960");
  auto b = Allocate(*s, Req(1, 1000), "10.0.0.1:9960");
  auto v = Assign(*s, "vm-1", {{"vgpus", 1}, {"server", "10.0.0.1:9960"}});
  ASSERT_TRUE(a.ok() && b.ok() && v.ok());
  EXPECT_EQ((*a)["state"], "active");
  Json again = TwoGpuServer("a");
  again["boot_id"] = "b2";
  again["allocations"] = Json::array({(*b)["id"]});  // not {x}: clang makes that x itself
  auto r = RegisterServer(*s, "10.0.0.1:9960", again);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["released"], Json::array({(*a)["id"]}));
  EXPECT_EQ((*r)["assignments"].size(), 1u);  // a VM's standing assignment outlives oriond restarts
  EXPECT_EQ(Heartbeat(*s, "10.0.0.1:9960", {{"boot_id", "b1"}}).status().code(), Code::kNotFound);
  EXPECT_TRUE(s->Unassign("vm-1").ok());
  EXPECT_EQ(s->Unassign("vm-1").status().code(), Code::kNotFound);
  EXPECT_EQ(Assign(*s, "bad name!", {{"vgpus", 1}}).status().code(), Code::kInvalidArgument);
}

TEST_F(ServiceTest, AJobsAllocationServesEverySessionOfTheJobUntilItsHolderReleasesIt) {
  // Issue #14 (Slurm): the plugin allocates for a job step; the job's processes come and go.
  opts_.pending_ttl_ms = 1000;
  opts_.lease_ttl_ms = 100000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  const Caller slurm{Caller::Kind::kClient, "key:5555", ""}, other{Caller::Kind::kClient, "key:6666", ""};
  Json body = Req(2, 1000);
  body["job"] = "slurm/17.batch@node1";
  auto j = Allocate(*s, body, "", slurm);
  ASSERT_TRUE(j.ok()) << j.status().ToString();
  EXPECT_EQ((*j)["state"], "held");
  EXPECT_EQ((*j)["job"], "slurm/17.batch@node1");
  const std::string id = (*j)["id"];
  // Two sessions at once, then a third after both ended: each is confirmed on the same vGPUs.
  auto c1 = Confirm(*s, id, {{"server", "10.0.0.1:9960"}, {"session", 1}});
  auto c2 = Confirm(*s, id, {{"server", "10.0.0.1:9960"}, {"session", 2}});
  ASSERT_TRUE(c1.ok() && c2.ok()) << c2.status().ToString();
  EXPECT_EQ((*c1)["placements"], (*c2)["placements"]);
  EXPECT_EQ(Confirm(*s, id, {{"server", "10.0.0.2:9960"}, {"session", 3}}).status().code(), Code::kInvalidArgument);
  // oriond's release when a session ends keeps the job's vGPUs.
  auto r = s->Release(id, "session_ended", {}, "10.0.0.1:9960");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->contains("released"));
  ASSERT_TRUE(s->GetAllocation(id).ok());
  ASSERT_TRUE(Confirm(*s, id, {{"server", "10.0.0.1:9960"}, {"session", 3}}).ok());
  // Not subject to pending_confirm_s (its holder renews it), and kept when its server restarts
  // with no session of the job.
  EXPECT_TRUE(s->Sweep(WallMs() + 1500).empty());
  Json again = TwoGpuServer("a");
  again["boot_id"] = "b2";
  again["allocations"] = Json::array();
  auto reg = RegisterServer(*s, "10.0.0.1:9960", again);
  ASSERT_TRUE(reg.ok());
  EXPECT_TRUE((*reg)["released"].empty());
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);
  // Only its holder (or an admin) releases it, at once; oriond's next heartbeat then revokes it.
  EXPECT_EQ(s->Release(id, "job_ended", other).status().code(), Code::kPermissionDenied);
  ASSERT_TRUE(s->Release(id, "job_ended", slurm).ok());
  EXPECT_EQ(s->Summary()["vgpus_used"], 0);
  auto hb = Heartbeat(*s, "10.0.0.1:9960", {{"boot_id", "b2"}, {"allocations", {{{"id", id}}}}});
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ((*hb)["revoked"][0], id);
  // Job names are checked.
  body["job"] = "bad name";
  EXPECT_EQ(Allocate(*s, body, "", slurm).status().code(), Code::kInvalidArgument);
  body["job"] = std::string(200, 'x');
  EXPECT_EQ(Allocate(*s, body, "", slurm).status().code(), Code::kInvalidArgument);
}

TEST_F(ServiceTest, ConfirmChecksTheServer) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  auto a = Allocate(*s, Req(1, 1000), "");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Confirm(*s, (*a)["id"], {{"server", "10.0.0.2:9960"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Confirm(*s, "nope", {{"server", "10.0.0.1:9960"}}).status().code(), Code::kNotFound);
  ASSERT_TRUE(Confirm(*s, (*a)["id"], {{"server", "10.0.0.1:9960"}, {"session", 3}}).ok());
  EXPECT_EQ(Confirm(*s, (*a)["id"], {{"server", "10.0.0.1:9960"}, {"session", 4}}).status().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(s->Release((*a)["id"], "test").ok());
  EXPECT_EQ(s->Summary()["vgpus_free"], 8);
}

TEST_F(ServiceTest, ARequestSentAgainGetsTheSameAllocation) {
  // The idempotency key (request_id): a client whose answer was lost asks again and is given the
  // allocation its first request made, across a restart of the controller too; nothing is held twice.
  const Caller alice{Caller::Kind::kClient, "key:aaaa", ""}, bob{Caller::Kind::kClient, "key:bbbb", ""};
  Json req = Req(1, 1000);
  req["request_id"] = "0f8fad5b-d9cb-469f-a165-70867728950e";
  std::string id;
  {
    auto s = Open();
    ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
    auto a = Allocate(*s, req, "", alice);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    id = (*a)["id"];
    EXPECT_EQ((*a)["request_id"], req["request_id"]);
    auto again = Allocate(*s, req, "", alice);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ((*again)["id"], id);
    EXPECT_EQ(s->Summary()["vgpus_used"], 1);
    EXPECT_NE(s->Metrics().find("orion_allocation_replays_total 1"), std::string::npos);
  }
  auto s = Open();  // restarted: the key is stored with the allocation
  auto again = Allocate(*s, req, "", alice);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)["id"], id);
  // Another key cannot use it to learn of (or take) alice's allocation.
  auto theirs = Allocate(*s, req, "", bob);
  ASSERT_FALSE(theirs.ok());
  EXPECT_EQ(theirs.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(theirs.status().message().find(id), std::string::npos);
  // A key that is not a UUID is refused (it becomes an etcd key); no key: a new allocation each time.
  Json bad = Req(1, 1000);
  for (const Json& v : {Json("../../vgpus/x"), Json(7), Json("")}) {
    bad["request_id"] = v;
    EXPECT_EQ(Allocate(*s, bad, "", alice).status().code(), Code::kInvalidArgument) << v;
  }
  EXPECT_NE((*Allocate(*s, Req(1, 1000), "", alice))["id"], (*Allocate(*s, Req(1, 1000), "", alice))["id"]);
  // Once released, a late repeat (a request that waited in a stalled controller's queue while its
  // client asked elsewhere, ran and released) places nothing: it would hold vGPUs for nobody.
  const Json key2 = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
  req["request_id"] = key2;
  auto second = Allocate(*s, req, "", alice);
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(s->Release((*second)["id"], "test", alice).ok());
  EXPECT_EQ(s->Summary()["vgpus_used"], 3);
  auto late = Allocate(*s, req, "", alice);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Code::kNotFound) << late.status().ToString();
  EXPECT_NE(late.status().message().find("released"), std::string::npos) << late.status().ToString();
  EXPECT_EQ(s->Summary()["vgpus_used"], 3);
}

TEST_F(ServiceTest, CheckpointsKeepTheWriteAheadLogBounded) {
  // Found by config_fuzz: the SQLite checkpoint never ran, so the write-ahead log grew by ~33 KB per
  // allocation made and released, without bound. With a checkpoint every 200 requests it stays small.
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  for (int i = 0; i < 2000; ++i) {
    auto a = Allocate(*s, Req(1, 100), "");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(s->Release((*a)["id"], "test").ok());
    if (i % 200 == 199) s->Checkpoint();
  }
  const auto wal = std::filesystem::path(opts_.database + "-wal");
  ASSERT_TRUE(std::filesystem::exists(wal));
  EXPECT_LT(std::filesystem::file_size(wal), uint64_t{20} << 20) << "2000 allocations, checkpointed every 200";
}

TEST_F(ServiceTest, PerKeyLimitsOnVgpusAndMemory) {
  // Issue #22 item 4: a key within max_allocations_per_key could still hold the whole pool (a few
  // allocations of many vGPUs each, never used). vGPUs and memory are bounded per key too.
  opts_.max_vgpus_per_key = 5;
  opts_.max_gmem_mib_per_key = 6000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());  // 8 vGPUs of 4096 MiB
  const Caller alice{Caller::Kind::kClient, "key:aaaa", ""}, bob{Caller::Kind::kClient, "key:bbbb", ""};
  auto a1 = Allocate(*s, Req(4, 1000), "", alice);
  ASSERT_TRUE(a1.ok()) << a1.status().ToString();
  // 4 + 2 vGPUs > 5: refused, naming the limit and the numbers; nothing placed.
  auto a2 = Allocate(*s, Req(2, 100), "", alice);
  ASSERT_FALSE(a2.ok());
  EXPECT_EQ(a2.status().code(), Code::kOutOfRange);
  EXPECT_EQ(a2.status().message(),
            "this key holds 4 vGPUs; 2 more would pass its limit (max_vgpus_per_key 5); release some first");
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);
  // 4000 + 1 x 2500 MiB > 6000: refused on memory though the vGPU fits.
  auto a3 = Allocate(*s, Req(1, 2500), "", alice);
  ASSERT_FALSE(a3.ok());
  EXPECT_EQ(a3.status().code(), Code::kOutOfRange);
  EXPECT_EQ(a3.status().message(),
            "this key holds 4000 MiB of GPU memory; 2500 MiB more would pass its limit (max_gmem_mib_per_key "
            "6000); release some first");
  // The default size (0: a GPU's share, 4096 MiB here) counts as placed.
  auto a4 = Allocate(*s, Req(1, 0), "", alice);
  ASSERT_FALSE(a4.ok());
  EXPECT_EQ(a4.status().code(), Code::kOutOfRange);
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);
  // Within both: 5 vGPUs, 6000 MiB.
  auto a5 = Allocate(*s, Req(1, 2000), "", alice);
  ASSERT_TRUE(a5.ok()) << a5.status().ToString();
  // Another key has its own budget; a server key (oriond, for its clients) and the admin none.
  EXPECT_TRUE(Allocate(*s, Req(2, 1000), "", bob).ok());
  EXPECT_EQ(Allocate(*s, Req(1, 100), "", alice).status().code(), Code::kOutOfRange);
  // A release gives the budget back.
  ASSERT_TRUE(s->Release((*a1)["id"], "test", alice).ok());
  auto a6 = Allocate(*s, Req(4, 1000), "", alice);
  ASSERT_TRUE(a6.ok()) << a6.status().ToString();
}

TEST_F(ServiceTest, PerKeyVgpuAndMemoryLimitsOffAtZero) {
  opts_.max_vgpus_per_key = 0;
  opts_.max_gmem_mib_per_key = 0;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a", 16)).ok());
  const Caller alice{Caller::Kind::kClient, "key:aaaa", ""};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Allocate(*s, Req(8, 0), "", alice).ok()) << i;
  EXPECT_EQ(s->Summary()["vgpus_used"], 32);
}

TEST(ControllerConfig, ParsesLimits) {
  auto c = ParseControllerConfig("max_allocations_per_key: 5\npending_confirm_s: 30\n", "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->service.max_allocations_per_key, 5u);
  EXPECT_EQ(c->service.pending_ttl_ms, 30000u);
  EXPECT_EQ(ServiceOptions{}.max_allocations_per_key, 64u);
  EXPECT_FALSE(ParseControllerConfig("max_allocations_per_key: 0\n", "t").ok());
  EXPECT_EQ(ServiceOptions{}.max_vgpus_per_key, 64u);
  EXPECT_EQ(ServiceOptions{}.max_gmem_mib_per_key, 0u);
  auto v = ParseControllerConfig("max_vgpus_per_key: 12\nmax_gmem_mib_per_key: 65536\n", "t");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->service.max_vgpus_per_key, 12u);
  EXPECT_EQ(v->service.max_gmem_mib_per_key, 65536u);
  auto off = ParseControllerConfig("max_vgpus_per_key: 0\nmax_gmem_mib_per_key: 0\n", "t");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->service.max_vgpus_per_key, 0u);
  EXPECT_FALSE(ParseControllerConfig("max_vgpus_per_key: -1\n", "t").ok());
  EXPECT_FALSE(ParseControllerConfig("max_gmem_mib_per_key: -5\n", "t").ok());
  EXPECT_FALSE(ParseControllerConfig("max_gmem_mib_per_key: lots\n", "t").ok());
  EXPECT_FALSE(ParseControllerConfig("pending_confirm_s: -1\n", "t").ok());
}

TEST(ControllerConfig, TlsNeedsCertAndKeyAndHttpsAddressesParse) {
  auto c = ParseControllerConfig("tls_cert: /etc/orion/c.crt\ntls_key: /etc/orion/c.key\n", "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tls_cert, "/etc/orion/c.crt");
  EXPECT_EQ(c->tls_key, "/etc/orion/c.key");
  auto half = ParseControllerConfig("tls_cert: /etc/orion/c.crt\n", "t");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("tls_cert is set without tls_key"), std::string::npos);
  EXPECT_FALSE(ParseControllerConfig("tls_key: /k\n", "t").ok());
  EXPECT_FALSE(ParseControllerConfig("tls_client_ca: /ca\n", "t").ok());
  auto m = ParseControllerConfig("tls_cert: /c\ntls_key: /k\ntls_client_ca: /ca\n", "t");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->tls_client_ca, "/ca");
  EXPECT_FALSE(ParseControllerConfig("listen: https://0.0.0.0:9123\n", "t").ok());
  EXPECT_FALSE(ParseControllerConfig("database: etcd://https://10.0.0.1:2379\n", "t").ok());
  // Clients: https:// is TLS, http:// or no scheme is plain.
  auto eps = ParseEndpoints("https://10.0.0.1:9200, http://h2, [::1]:9300");
  ASSERT_TRUE(eps.ok()) << eps.status().ToString();
  ASSERT_EQ(eps->size(), 3u);
  EXPECT_TRUE((*eps)[0].tls);
  EXPECT_EQ((*eps)[0].host, "10.0.0.1");
  EXPECT_EQ((*eps)[0].port, 9200);
  EXPECT_EQ((*eps)[0].text(), "https://10.0.0.1:9200");
  EXPECT_FALSE((*eps)[1].tls);
  EXPECT_EQ((*eps)[1].host, "h2");
  EXPECT_EQ((*eps)[1].port, kDefaultPort);
  EXPECT_EQ((*eps)[2].hostport(), "[::1]:9300");
  EXPECT_FALSE(ParseEndpoint("https://").ok());
  EXPECT_FALSE(ParseEndpoint("ftp://h:1").ok());
}

TEST(ControllerConfig, EtcdTlsNeedsACaAndACertWithItsKey) {
  auto c = ParseControllerConfig(
      "database: etcd://10.0.0.1:2379\netcd_tls_ca: /ca.crt\netcd_tls_cert: /c.crt\netcd_tls_key: /c.key\n", "t");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->service.etcd_tls.ca, "/ca.crt");
  EXPECT_EQ(c->service.etcd_tls.cert, "/c.crt");
  EXPECT_EQ(c->service.etcd_tls.key, "/c.key");
  EXPECT_TRUE(c->service.etcd_tls.on());
  auto ca_only = ParseControllerConfig("database: etcd://h:2379\netcd_tls_ca: /ca.crt\n", "t");
  ASSERT_TRUE(ca_only.ok()) << ca_only.status().ToString();
  EXPECT_TRUE(ca_only->service.etcd_tls.cert.empty());
  auto half = ParseControllerConfig("etcd_tls_ca: /ca\netcd_tls_cert: /c.crt\n", "t");
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("etcd_tls_cert and etcd_tls_key go together"), std::string::npos);
  auto no_ca = ParseControllerConfig("etcd_tls_cert: /c.crt\netcd_tls_key: /c.key\n", "t");
  ASSERT_FALSE(no_ca.ok());
  EXPECT_NE(no_ca.status().message().find("needs etcd_tls_ca"), std::string::npos);
  // Opening a store: TLS files given for a store that is not etcd, or that cannot be read, are refused
  // before any connection is tried.
  EtcdTls tls{.ca = "/nonexistent/ca.crt", .cert = "", .key = ""};
  auto sqlite = OpenStore("sqlite:/nonexistent/x.db", tls);
  ASSERT_FALSE(sqlite.ok());
  EXPECT_EQ(sqlite.status().code(), Code::kInvalidArgument);
  EXPECT_NE(sqlite.status().message().find("is not etcd://"), std::string::npos);
  auto unreadable = OpenStore("etcd://127.0.0.1:1", tls);
  ASSERT_FALSE(unreadable.ok());
  EXPECT_EQ(unreadable.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unreadable.status().message().find("etcd_tls_ca /nonexistent/ca.crt"), std::string::npos);
}

TEST(ControllerConfig, ParsesKeysAndRejectsGarbage) {
  auto c = ParseControllerConfig(
      "listen: 127.0.0.1:9200\ndatabase: /tmp/x.db\nplacement: spread\nlease_ttl_s: 2.5\n"
      "authentication:\n  client: [clientkey1, clientkey2]\n  server: serverkey\n  admin: adminkey1\n",
      "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen, "127.0.0.1:9200");
  EXPECT_EQ(c->service.policy, pool::PlacementPolicy::kSpread);
  EXPECT_EQ(c->service.lease_ttl_ms, 2500u);
  EXPECT_EQ(c->keys.size(), 4u);
  EXPECT_EQ(c->keys["serverkey"], Role::kServer);
  for (const char* bad : {"placement: tight\n", "lease_ttl_s: -1\n", "nonsense: 1\n", "listen: 'a b'\n",
                          "authentication:\n  root: k12345678\n", "authentication:\n  client: short\n", "[1, 2]\n",
                          "server_timeout_s: 100\nserver_release_s: 10\n"}) {
    auto r = ParseControllerConfig(bad, "c.yaml");
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind("c.yaml: ", 0), 0u) << r.status().message();
    }
  }
}

// Live migration (issue #24): an allocation moves to another server with its session. The target's
// vGPUs are reserved when the move is asked for, the target confirms the moving session on them,
// and its report commits the move; a failure, the target's copy ending first, or the timeout gives
// it up, and the allocation stays where it was.
TEST_F(ServiceTest, AMoveReservesTheTargetCommitsThereOrGivesUp) {
  opts_.move_timeout_ms = 1000;
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b")).ok());
  Json req = Req(2, 4096);
  req["session"] = 5;  // oriond's own request for its session: active at once
  auto a = Allocate(*s, req, "10.0.0.1:9960");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  const std::string id = (*a)["id"];
  auto migrate = [&](const std::string& to) {
    MigrateRequest m;
    m.to = to;
    return s->Migrate(id, m);
  };
  auto report = [&](const std::string& server, bool committed, uint32_t session, const std::string& error = "") {
    MoveReport r;
    r.server = server;
    r.committed = committed;
    r.session = session;
    r.error = error;
    return s->MoveOutcome(id, r);
  };
  // Refused before anything is reserved: to where it is, to a server that does not exist.
  EXPECT_EQ(migrate("10.0.0.1:9960").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(migrate("10.0.0.9:9960").status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);

  auto m = migrate("10.0.0.2:9960");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["move"]["to"], "10.0.0.2:9960");
  const std::string reservation = (*m)["move"]["reservation"];
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);                                        // the target's two are held for it
  EXPECT_EQ(migrate("10.0.0.2:9960").status().code(), Code::kFailedPrecondition);  // under way already
  // The source hears of it with its heartbeat; the target keeps the moving copy without a revocation.
  auto beat = Heartbeat(*s, "10.0.0.1:9960", {{"boot_id", "b1"}, {"allocations", {{{"id", id}}}}});
  ASSERT_TRUE(beat.ok());
  EXPECT_EQ((*beat)["moves"], Json::array({{{"id", id}, {"to", "10.0.0.2:9960"}}}));
  // The target confirms the moving session: on the reservation's vGPUs, and the allocation is unchanged.
  auto c = Confirm(*s, id, {{"server", "10.0.0.2:9960"}, {"session", 7}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)["server"], "10.0.0.2:9960");
  ASSERT_EQ((*c)["placements"].size(), 2u);
  EXPECT_EQ((*c)["placements"][0]["server"], "10.0.0.2:9960");
  beat = Heartbeat(*s, "10.0.0.2:9960", {{"boot_id", "b1"}, {"allocations", {{{"id", id}}}}});
  EXPECT_EQ((*beat)["revoked"], Json::array());
  EXPECT_EQ(s->GetAllocation(id)->at("server"), "10.0.0.1:9960");
  // Only the target commits; a third server is neither end.
  EXPECT_EQ(report("10.0.0.1:9960", true, 3).status().code(), Code::kPermissionDenied);
  EXPECT_EQ(report("10.0.0.3:9960", false, 0, "no").status().code(), Code::kPermissionDenied);
  auto done = report("10.0.0.2:9960", true, 7);
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ((*done)["server"], "10.0.0.2:9960");
  EXPECT_EQ((*done)["session"], 7);
  EXPECT_FALSE(done->contains("move"));
  EXPECT_EQ(s->GetAllocation(reservation).status().code(), Code::kNotFound);
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);  // the source's two are free
  // The source no longer serves it: its heartbeat hears so, and its release (it says which server
  // it is) does not release it.
  beat = Heartbeat(*s, "10.0.0.1:9960", {{"boot_id", "b1"}, {"allocations", {{{"id", id}}}}});
  EXPECT_EQ((*beat)["revoked"], Json::array({id}));
  EXPECT_TRUE(s->Release(id, "session_ended", {}, "10.0.0.1:9960").ok());
  EXPECT_EQ(s->GetAllocation(id)->at("server"), "10.0.0.2:9960");

  // Back to the first server, and the source says it failed: given up, with the reason.
  ASSERT_TRUE(migrate("10.0.0.1:9960").ok());
  auto failed = report("10.0.0.2:9960", false, 0, "cannot connect");
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ((*failed)["server"], "10.0.0.2:9960");
  EXPECT_EQ((*failed)["last_move"]["to"], "10.0.0.1:9960");
  EXPECT_EQ((*failed)["last_move"]["error"], "the source: cannot connect");
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);
  // Again, and the target's copy ends before the program came: given up the same way.
  ASSERT_TRUE(migrate("10.0.0.1:9960").ok());
  auto ended = s->Release(id, "session_ended", {}, "10.0.0.1:9960");
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(s->GetAllocation(id)->at("server"), "10.0.0.2:9960");
  EXPECT_EQ(s->GetAllocation(id)->at("last_move")["error"].get<std::string>().rfind("the session ended at", 0), 0u);
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);
  // Again, and nobody reports: the sweep gives it up after move_timeout_ms.
  ASSERT_TRUE(migrate("10.0.0.1:9960").ok());
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);
  auto did = s->Sweep(WallMs() + 1500);
  EXPECT_EQ(s->Summary()["vgpus_used"], 2);
  EXPECT_EQ(s->GetAllocation(id)->at("last_move")["error"], "it did not complete within 1 s");
  // Released while moving: the reservation goes with it.
  ASSERT_TRUE(migrate("10.0.0.1:9960").ok());
  ASSERT_TRUE(s->Release(id, "released").ok());
  EXPECT_EQ(s->Summary()["vgpus_used"], 0);
}

TEST_F(ServiceTest, AMoveNeedsRoomAtTheTargetAndASessionServingIt) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b", 1)).ok());  // 2 vGPUs
  Json req = Req(2, 1024);
  req["session"] = 5;
  auto big = Allocate(*s, req, "10.0.0.1:9960");
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(Allocate(*s, req, "10.0.0.2:9960").ok());  // the target's two vGPUs taken
  MigrateRequest m;
  m.to = "10.0.0.2:9960";
  auto r = s->Migrate((*big)["id"], m);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(r.status().message().rfind("server 10.0.0.2:9960 cannot take allocation " +
                                           (*big)["id"].get<std::string>() + ": no server has 2 free vGPU(s)",
                                       0),
            0u)
      << r.status().message();
  EXPECT_EQ(s->Summary()["vgpus_used"], 4);  // nothing reserved
  // A client's allocation no server confirmed yet: no session to move.
  auto pending = Allocate(*s, Req(1, 1024), "");
  ASSERT_TRUE(pending.ok());
  ASSERT_EQ((*pending)["state"], "pending");
  EXPECT_EQ(s->Migrate((*pending)["id"], m).status().code(), Code::kFailedPrecondition);
}

TEST_F(ServiceTest, ADrainMovesEverySessionElsewhereAndTakesNoNewOnes) {
  auto s = Open();
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.2:9960", TwoGpuServer("b")).ok());
  Json req = Req(1, 1024);
  req["session"] = 5;
  std::vector<std::string> served;
  for (int i = 0; i < 3; ++i) served.push_back((*Allocate(*s, req, "10.0.0.1:9960"))["id"]);
  Json job = Req(1, 1024);
  job["job"] = "slurm/7.0@n1";
  auto held = Allocate(*s, job, "10.0.0.1:9960");
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  auto d = s->Drain("10.0.0.1:9960", true, 0);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ((*d)["moves"].size(), 3u) << d->dump();
  for (const Json& m : (*d)["moves"]) {
    EXPECT_EQ(m["to"], "10.0.0.2:9960");
    EXPECT_EQ(m["state"], "moving");
    EXPECT_NE(std::find(served.begin(), served.end(), m["id"].get<std::string>()), served.end());
  }
  ASSERT_EQ((*d)["staying"].size(), 1u);
  EXPECT_EQ((*d)["staying"][0]["id"], (*held)["id"]);
  EXPECT_NE((*d)["staying"][0]["why"].get<std::string>().find("a job's sessions cannot move yet"), std::string::npos);
  // Draining: no new placement there, not even oriond's own; elsewhere as usual.
  EXPECT_EQ(Allocate(*s, req, "10.0.0.1:9960").status().code(), Code::kUnavailable);
  auto elsewhere = Allocate(*s, Req(1, 1024), "");
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ((*elsewhere)["server"], "10.0.0.2:9960");
  bool listed = false;
  for (const Json& srv : s->Servers()) listed |= srv["id"] == "10.0.0.1:9960" && srv["draining"] == true;
  EXPECT_TRUE(listed);
  // A drained server that registers again (oriond restarted) still drains; DELETE ends it.
  ASSERT_TRUE(RegisterServer(*s, "10.0.0.1:9960", TwoGpuServer("a")).ok());
  EXPECT_EQ(Allocate(*s, req, "10.0.0.1:9960").status().code(), Code::kUnavailable);
  ASSERT_TRUE(s->Drain("10.0.0.1:9960", false, 0).ok());
  EXPECT_TRUE(Allocate(*s, req, "10.0.0.1:9960").ok());
  EXPECT_EQ(s->Drain("10.0.0.9:9960", true, 0).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace orion::controller
