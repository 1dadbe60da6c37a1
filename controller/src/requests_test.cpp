#include "orion/controller/requests.h"

#include <gtest/gtest.h>

namespace orion::controller {
namespace {

// The message of a refused body (an accepted one fails the test).
template <typename T>
std::string Refusal(const Json& body) {
  auto r = T::FromJson(body);
  EXPECT_FALSE(r.ok()) << body.dump();
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << body.dump();
  return r.status().message();
}

TEST(RequestsTest, AnAllocationRequestIsDecodedWithEveryField) {
  auto r = AllocationRequest::FromJson({{"vgpus", 2},
                                        {"gmem_mib", 4096},
                                        {"ratio", 30},
                                        {"server", "10.0.0.1:9960"},
                                        {"client", {{"host", "c1"}, {"pid", 42}, {"process", "train"}}},
                                        {"job", "slurm/1234.0@node1"},
                                        {"request_id", "0f8fad5b-d9cb-469f-a165-70867728950e"},
                                        {"session", 7}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vgpus, 2u);
  EXPECT_EQ(r->gmem_mib, 4096u);
  EXPECT_EQ(r->ratio, 30u);
  EXPECT_EQ(r->server, "10.0.0.1:9960");
  EXPECT_EQ(r->client_host, "c1");
  EXPECT_EQ(r->client_pid, 42u);
  EXPECT_EQ(r->client_process, "train");
  EXPECT_EQ(r->job, "slurm/1234.0@node1");
  EXPECT_EQ(r->request_id, "0f8fad5b-d9cb-469f-a165-70867728950e");
  EXPECT_EQ(r->session, 7u);
  // Absent and null fields take their defaults.
  auto bare = AllocationRequest::FromJson({{"vgpus", 1}, {"gmem_mib", nullptr}});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(bare->gmem_mib, 0u);
  EXPECT_EQ(bare->ratio, 0u);
  EXPECT_TRUE(bare->server.empty());
  EXPECT_TRUE(bare->request_id.empty());
}

TEST(RequestsTest, AnAllocationRequestOutOfRangeIsRefusedNamingTheField) {
  using R = AllocationRequest;
  EXPECT_EQ(Refusal<R>(Json::array()), "the body must be a JSON object");
  EXPECT_EQ(Refusal<R>(Json::object()), "ORION_VGPU must be 1..16");
  EXPECT_EQ(Refusal<R>({{"vgpus", 17}}), "ORION_VGPU: vgpus = 17 is larger than 16");
  EXPECT_EQ(Refusal<R>({{"vgpus", -1}}), "ORION_VGPU: vgpus must be a whole number, not -1");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1.5}}), "ORION_VGPU: vgpus must be a whole number, not 1.5");
  EXPECT_EQ(Refusal<R>({{"vgpus", "2"}}), "ORION_VGPU: vgpus must be a whole number, not \"2\"");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"gmem_mib", uint64_t{1} << 40}}),
            "ORION_GMEM: gmem_mib = 1099511627776 is larger than 16777216");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"ratio", 101}}), "ORION_RATIO: ratio = 101 is larger than 100");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"server", 9960}}), "server must be a string");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"server", std::string(301, 'a')}}), "server is longer than 300");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"client", "c1"}}), "client must be an object");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"client", {{"host", "c\n1"}}}}), "host has control characters");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"client", {{"pid", uint64_t{1} << 32}}}}),
            "pid = 4294967296 is larger than 4294967295");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"job", "a b"}}), "job must be 1..128 of [A-Za-z0-9._:@/+-]");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"job", ""}}), "job must be 1..128 of [A-Za-z0-9._:@/+-]");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"request_id", "not-a-uuid"}}),
            "request_id must be a UUID (the client's idempotency key)");
  EXPECT_EQ(Refusal<R>({{"vgpus", 1}, {"session", "7"}}), "session must be a whole number, not \"7\"");
}

TEST(RequestsTest, AnAssignmentTakesOnlyThePlacement) {
  auto r = AssignmentRequest::FromJson({{"vgpus", 2}, {"gmem_mib", 2000}, {"server", "10.0.0.1:9960"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vgpus, 2u);
  EXPECT_EQ(r->gmem_mib, 2000u);
  EXPECT_EQ(r->server, "10.0.0.1:9960");
  EXPECT_EQ(Refusal<AssignmentRequest>({{"vgpus", 0}}), "ORION_VGPU must be 1..16");
  EXPECT_TRUE(ValidVmName("vm-1.a_b"));
  EXPECT_FALSE(ValidVmName(""));
  EXPECT_FALSE(ValidVmName("bad name!"));
  EXPECT_FALSE(ValidVmName(std::string(65, 'a')));
}

TEST(RequestsTest, AServerRegistrationListsItsGpusOnceEach) {
  const Json gpu0 = {{"index", 0}, {"uuid", "GPU-a"}, {"name", "H100"}, {"memory_mib", 81920}};
  const Json gpu1 = {{"index", 1}, {"uuid", "GPU-b"}, {"name", "H100"}, {"memory_mib", 81920}};
  auto r = ServerRegistration::FromJson({{"vgpu_count", 4},
                                         {"hostname", "h1"},
                                         {"boot_id", "b1"},
                                         {"gpus", {gpu0, gpu1}},
                                         {"allocations", {"a", 7, "b"}}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->vgpu_count, 4u);
  EXPECT_EQ(r->hostname, "h1");
  EXPECT_EQ(r->boot_id, "b1");
  ASSERT_EQ(r->gpus.size(), 2u);
  EXPECT_EQ(r->gpus[1].index, 1u);
  EXPECT_EQ(r->gpus[1].uuid, "GPU-b");
  EXPECT_EQ(r->gpus[1].memory_mib, 81920u);
  EXPECT_EQ(r->allocations, (std::set<std::string>{"a", "b"}));  // the 7 is not an id

  using S = ServerRegistration;
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 4}}), "gpus must be an array of at most 64 GPUs");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 0}, {"gpus", {gpu0}}}), "vgpu_count must be 1..100");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 101}, {"gpus", {gpu0}}}), "vgpu_count = 101 is larger than 100");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 1}, {"gpus", {gpu0, gpu0}}}), "GPU index 0 is listed twice");
  Json empty = gpu1;
  empty["memory_mib"] = 0;
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 1}, {"gpus", {empty}}}), "GPU memory_mib must be > 0");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 1}, {"gpus", {"GPU-a"}}}), "each GPU must be an object");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 1}, {"gpus", Json::array()}, {"allocations", "a"}}),
            "allocations must be an array of ids");
  EXPECT_EQ(Refusal<S>({{"vgpu_count", 1}, {"gpus", Json(65, gpu0)}}), "gpus must be an array of at most 64 GPUs");
}

TEST(RequestsTest, AHeartbeatSkipsMalformedEntriesAndKeepsTheRest) {
  auto h = ServerHeartbeat::FromJson(
      {{"boot_id", "b1"},
       {"allocations", {{{"id", "a"}, {"used_mib", {100, -1, "x", 300}}}, "junk", {{"id", 5}}, {{"id", "b"}}}}});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->boot_id, "b1");
  ASSERT_EQ(h->allocations.size(), 2u);
  EXPECT_EQ(h->allocations[0].id, "a");
  ASSERT_EQ(h->allocations[0].used_mib.size(), 4u);
  EXPECT_EQ(h->allocations[0].used_mib[0], std::optional<uint64_t>(100));
  EXPECT_FALSE(h->allocations[0].used_mib[1].has_value());
  EXPECT_FALSE(h->allocations[0].used_mib[2].has_value());
  EXPECT_EQ(h->allocations[0].used_mib[3], std::optional<uint64_t>(300));
  EXPECT_EQ(h->allocations[1].id, "b");
  EXPECT_TRUE(h->allocations[1].used_mib.empty());
  EXPECT_EQ(Refusal<ServerHeartbeat>({{"boot_id", 1}}), "boot_id must be a string");
  EXPECT_EQ(Refusal<ServerHeartbeat>({{"boot_id", std::string(65, 'b')}}), "boot_id is longer than 64");
}

TEST(RequestsTest, AConfirmationAndAWatchAreBounded) {
  auto c = SessionConfirmation::FromJson({{"server", "10.0.0.1:9960"}, {"session", 3}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "10.0.0.1:9960");
  EXPECT_EQ(c->session, 3u);
  EXPECT_EQ(Refusal<SessionConfirmation>({{"session", -3}}), "session must be a whole number, not -3");

  const std::string id = "0f8fad5b-d9cb-469f-a165-70867728950e";
  auto w = WatchRequest::FromJson({{"allocations", {id}}, {"timeout_ms", 500}});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->allocations, std::vector<std::string>{id});
  EXPECT_EQ(w->timeout_ms, 500u);
  auto plain = WatchRequest::FromJson(Json::object());
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->allocations.empty());
  EXPECT_EQ(plain->timeout_ms, 20000u);
  using W = WatchRequest;
  EXPECT_EQ(Refusal<W>({{"allocations", Json(4097, id)}}), "allocations must be a list of at most 4096 ids");
  EXPECT_EQ(Refusal<W>({{"allocations", {"../etc"}}}), "allocation ids must be UUIDs");
  EXPECT_EQ(Refusal<W>({{"timeout_ms", 30001}}), "timeout_ms must be 0..30000");
  EXPECT_EQ(Refusal<W>({{"timeout_ms", -1}}), "timeout_ms must be 0..30000");
}

}  // namespace
}  // namespace orion::controller
