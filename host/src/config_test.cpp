#include "orion/host/config.h"

#include <gtest/gtest.h>

namespace orion::host {
namespace {

TEST(ServerConfig, ParsesOrionsSampleFile) {
  const char* text = R"(
[server]
    listen_port = 9960          ; oriond uses this and the next two ports
    bind_addr = 127.0.0.1       ; data-plane address reachable by clients
    enable_shm = "true"
    enable_rdma = "false"
    enable_kvm = "true"
    vgpu_count = 4
[server-log]
    log_with_time = 1
    log_to_screen = 0
    log_to_file = 1
    log_level = INFO
    file_log_level = DEBUG
[server-shm]
    shm_path_base = "/dev/shm/"
    shm_group_name = "kvm"
    shm_user_name = "libvirt-qemu"
    shm_buffer_size = 128
[controller]
    controller_addr = 127.0.0.1:9123
)";
  auto c = ParseServerConfig(text, "server.conf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->listen_port, 9960);
  EXPECT_EQ(c->bind_addr, "127.0.0.1");
  EXPECT_TRUE(c->enable_shm);
  EXPECT_FALSE(c->enable_rdma);
  EXPECT_TRUE(c->enable_kvm);
  EXPECT_EQ(c->vgpu_count, 4u);
  EXPECT_EQ(c->file_log_level, "DEBUG");
  EXPECT_FALSE(c->log_to_screen);
  EXPECT_EQ(c->shm_buffer_size_mib, 128u);
  EXPECT_EQ(c->shm_user_name, "libvirt-qemu");
  EXPECT_EQ(c->controller_addr, "127.0.0.1:9123");
  EXPECT_EQ(c->default_ratio, 0u);  // unset: best effort
}

TEST(ServerConfig, DefaultComputeRatio) {
  auto c = ParseServerConfig("[server]\ndefault_ratio = 25\ndefault_ratio_policy = cap\n", "server.conf");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->default_ratio, 25u);
  EXPECT_EQ(c->default_ratio_policy, 1u);
}

TEST(ServerConfig, BadValuesNameTheKeyAndValue) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"[server]\nvgpu_count = abc\n", "[server] vgpu_count = 'abc' is not a number in 1..100"},
      {"[server]\nvgpu_count = 0\n", "vgpu_count = '0'"},
      {"[server]\nvgpu_count = 101\n", "vgpu_count = '101'"},
      {"[server]\nlisten_port = 70000\n", "listen_port = '70000' is not a port number"},
      {"[server]\nenable_shm = \"maybe\"\n", "enable_shm = 'maybe' is not \"true\" or \"false\""},
      {"[server]\nno_such_key = 1\n", "no_such_key = '1' is not a known key"},
      {"[server]\ndefault_ratio = 101\n", "default_ratio = '101' is not a percentage in 0..100"},
      {"[server]\ndefault_ratio_policy = fast\n", "default_ratio_policy = 'fast' is not share or cap"},
      {"[nowhere]\nx = 1\n", "is in an unknown section"},
      {"[server-log]\nlog_level = LOUD\n", "log_level = 'LOUD'"},
      {"[server-shm]\nshm_buffer_size = -5\n", "shm_buffer_size = '-5'"},
      {"[server]\nthis line has no equals\n", "syntax error on line 2"},
      // Issue #11 item 12: accepted without error before.
      {"[orion]\nclient_key = \"abc\n", "has an unterminated quote"},
      {"[orion]\nclient_key = \"   \"\n", "is blank"},
      {"[controller]\ncontroller_key = \" \"\n", "is blank"},
      {"[controller]\ncontroller_addr = ::::\n", "is not a controller address list"},
      {"[controller]\ncontroller_addr = 10.0.0.1:9123,:\n", "is not a controller address list"},
  };
  for (const auto& tc : cases) {
    auto c = ParseServerConfig(tc.text, "server.conf");
    ASSERT_FALSE(c.ok()) << tc.text;
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find(tc.expect), std::string::npos)
        << "message: " << c.status().message() << "\nexpected to contain: " << tc.expect;
  }
}

TEST(ServerConfig, ControllerAddressListsParse) {
  auto c = ParseServerConfig("[controller]\ncontroller_addr = 10.0.0.1:9123, 10.0.0.2:9123\n", "server.conf");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->controller_addr, "10.0.0.1:9123, 10.0.0.2:9123");
}

TEST(ServerConfig, ControllerTlsCa) {
  auto c = ParseServerConfig(
      "[controller]\ncontroller_addr = https://10.0.0.1:9123\ncontroller_tls_ca = /etc/orion/ca.crt\n", "server.conf");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->controller_tls_ca, "/etc/orion/ca.crt");
  EXPECT_FALSE(ParseServerConfig("[controller]\ncontroller_tls_ca = \" \"\n", "server.conf").ok());
}

TEST(ServerConfig, DirectoryIsRefused) {
  auto c = LoadServerConfig("/tmp");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is a directory"), std::string::npos) << c.status().message();
}

TEST(ServerConfig, MissingFileIsNotFound) {
  EXPECT_EQ(LoadServerConfig("/nonexistent/server.conf").status().code(), Code::kNotFound);
}

TEST(ServerConfig, Backend) {
  EXPECT_EQ(*ParseBackend("sim"), BackendKind::kSim);
  EXPECT_EQ(*ParseBackend("cuda"), BackendKind::kCuda);
  EXPECT_EQ(*ParseBackend("auto"), BackendKind::kAuto);
  EXPECT_FALSE(ParseBackend("gpu").ok());
}

}  // namespace
}  // namespace orion::host
