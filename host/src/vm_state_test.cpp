#include "orion/host/vm_state.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace orion::host {
namespace {

std::vector<VmAttachment> Two() {
  return {{"web1",
           "/dev/shm/orionsock-web1",
           2,
           3000,
           4,
           {{0, 0, 3000ull << 20}, {0, 1, 3000ull << 20}},
           "/dev/shm/orionsock-web1.sock",
           4},
          {"db.2", "/dev/shm/orionsock-db.2", 1, 0, 0, {{1, 3, 4096ull << 20}}, "", 0}};
}

std::string TempDir() {
  std::string t = std::filesystem::temp_directory_path().string() + "/orion-vmstate-XXXXXX";
  if (mkdtemp(t.data()) == nullptr) return "/tmp";
  return t;
}

TEST(VmState, RoundTrip) {
  const auto vms = Two();
  auto back = DecodeVmState(EncodeVmState(vms), "t");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(EncodeVmState(*back), EncodeVmState(vms));  // equal records encode alike
  EXPECT_EQ((*back)[0].placements[1].vgpu, 1u);
  EXPECT_EQ((*back)[1].placements[0].quota_bytes, 4096ull << 20);
  EXPECT_EQ((*back)[0].doorbell_socket, "/dev/shm/orionsock-web1.sock");
  EXPECT_EQ((*back)[0].doorbell_vectors, 4u);
  EXPECT_TRUE((*back)[1].doorbell_socket.empty());
  auto empty = DecodeVmState(EncodeVmState({}), "t");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(VmState, ComputeShareRoundTripsAndIsChecked) {
  auto vms = Two();
  vms[0].ratio = 40;
  vms[0].ratio_policy = 1;  // cap
  auto back = DecodeVmState(EncodeVmState(vms), "t");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ((*back)[0].ratio, 40u);
  EXPECT_EQ((*back)[0].ratio_policy, 1u);
  EXPECT_EQ((*back)[0].placements[1].ratio, 40u);  // what the pool reserves again at a restart
  EXPECT_EQ((*back)[1].ratio, 0u);                 // none recorded: best effort
  EXPECT_EQ((*back)[1].placements[0].ratio, 0u);
  for (const char* bad :
       {R"("compute": {"ratio": 0, "policy": "share"})", R"("compute": {"ratio": 101, "policy": "cap"})",
        R"("compute": {"ratio": 40, "policy": "most"})", R"("compute": 40)"}) {
    std::string text = EncodeVmState(Two());
    text.replace(text.find(R"("gmem_mib")"), 0, std::string(bad) + ", ");
    auto r = DecodeVmState(text, "t");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(".compute needs ratio (1..100) and policy (share or cap)"), std::string::npos)
        << r.status().message();
  }
}

TEST(VmState, MissingFileIsEmpty) {
  auto r = LoadVmState(TempDir() + "/nothing/here.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->empty());
}

TEST(VmState, SaveIsAtomicAndPrivate) {
  const std::string dir = TempDir() + "/lib/orion";  // created by Save
  const std::string path = dir + "/vms.json";
  ASSERT_TRUE(SaveVmState(path, Two()).ok());
  auto r = LoadVmState(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(EncodeVmState(*r), EncodeVmState(Two()));
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Replaced whole; no temporary file is left behind.
  ASSERT_TRUE(SaveVmState(path, {}).ok());
  r = LoadVmState(path);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1u);
}

TEST(VmState, SaveFailsClearlyWhereItCannotWrite) {
  const std::string dir = TempDir();
  const std::string blocker = dir + "/file";
  std::ofstream(blocker) << "x";
  const Status s = SaveVmState(blocker + "/vms.json", Two());  // parent is a file
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(blocker), std::string::npos) << s.message();
}

TEST(VmState, CorruptFilesAreRefusedWithTheirReason) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"", "not valid JSON"},
      {"{\"version\": 1, \"vms\": [", "not valid JSON"},
      {"[]", "not a JSON object"},
      {"{\"vms\": []}", "no \"version\""},
      {"{\"version\": 7, \"vms\": []}", "version 7 is not 1"},
      {"{\"version\": 1}", "no \"vms\" list"},
      {"{\"version\": 1, \"vms\": [3]}", "vms[0] is not an object"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"../x\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}]}",
       "vms[0].vm"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"rel\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}]}",
       "vms[0].region"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 0, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": []}]}",
       "vms[0].vgpus"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": -5, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}]}",
       "vms[0].gmem_mib"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 99, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}]}",
       "vms[0].processes"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 2, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}]}",
       "vms[0].placements is not a list of 2"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": \"x\", \"quota_bytes\": 1}]}]}",
       "vms[0].placements[0]"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}]}, "
       "{\"vm\": \"a\", \"region\": \"/s\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 1, \"quota_bytes\": 1}]}]}",
       "VM a is listed twice"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}], "
       "\"doorbell\": {\"socket\": \"/r.sock\", \"vectors\": 31}}]}",
       "vms[0].doorbell"},
      {"{\"version\": 1, \"vms\": [{\"vm\": \"a\", \"region\": \"/r\", \"vgpus\": 1, \"gmem_mib\": 0, "
       "\"processes\": 0, \"placements\": [{\"pgpu\": 0, \"vgpu\": 0, \"quota_bytes\": 1}], "
       "\"doorbell\": {\"socket\": \"r.sock\", \"vectors\": 2}}]}",
       "vms[0].doorbell"},
  };
  for (const Case& c : cases) {
    auto r = DecodeVmState(c.text, "/var/lib/orion/vms.json");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kDataLoss);
    EXPECT_NE(r.status().message().find("/var/lib/orion/vms.json is corrupt"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.text << " -> " << r.status().message();
  }
}

TEST(VmState, CorruptFileOnDiskIsAnErrorNotACrash) {
  const std::string path = TempDir() + "/vms.json";
  std::ofstream(path) << "\x01\x02garbage{{{";
  auto r = LoadVmState(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
}

}  // namespace
}  // namespace orion::host
