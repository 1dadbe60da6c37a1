// controller_bench — allocation round trips against a running orion-controller under concurrent
// clients, with a bare baseline measured in the same run: GET /v1/health (same HTTP client, fresh
// connection per request, same concurrency), i.e. the cost of the HTTP exchange alone.
//
//   controller_bench ADDR[,ADDR...] CLIENTS REQUESTS_PER_CLIENT
// With several controllers (one pool on etcd), client c sends to controller c % n first (and fails
// over to the others as the guest runtime does).
// Registers 8 fake servers (8 GPUs x 8 vGPUs each: 512 vGPUs, so no request is refused), then
// prints "health p50_us p99_us", "allocate p50_us p99_us", "release p50_us p99_us" and a
// "refused N" line. Each client does what the guest runtime does: one fresh connection per request.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "orion/controller/client.h"

using orion::controller::ControllerClient;
using Clock = std::chrono::steady_clock;

namespace {

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

template <typename Fn>
std::vector<double> Phase(int clients, Fn fn) {
  std::vector<std::vector<double>> per(static_cast<size_t>(clients));
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int c = 0; c < clients; ++c) {
    ts.emplace_back([&, c] {
      ready.fetch_add(1);
      while (ready.load() < clients) std::this_thread::yield();
      fn(c, &per[static_cast<size_t>(c)]);
    });
  }
  for (auto& t : ts) t.join();
  std::vector<double> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: controller_bench ADDR CLIENTS REQUESTS_PER_CLIENT\n");
    return 2;
  }
  auto eps = orion::controller::ParseEndpoints(argv[1]);
  if (!eps.ok()) return 2;
  const int clients = std::atoi(argv[2]);
  const int n = std::atoi(argv[3]);
  const char* key = std::getenv("ORION_CONTROLLER_KEY");
  ControllerClient cc(*eps, key != nullptr ? key : "", 10000);
  // Client c's list starts at controller c % n.
  auto client_of = [&](int c) {
    std::vector<orion::controller::Endpoint> v = *eps;
    std::rotate(v.begin(), v.begin() + static_cast<long>(static_cast<size_t>(c) % v.size()), v.end());
    return ControllerClient(std::move(v), key != nullptr ? key : "", 10000);
  };
  for (int s = 0; s < 8; ++s) {
    nlohmann::json gpus = nlohmann::json::array();
    for (int g = 0; g < 8; ++g) gpus.push_back({{"index", g}, {"name", "bench GPU"}, {"memory_mib", 81920}});
    auto r = cc.Call("PUT", "/v1/servers/10.9.0." + std::to_string(s + 1) + ":9960",
                     {{"hostname", "bench"}, {"vgpu_count", 8}, {"gpus", gpus}});
    if (!r.ok()) {
      std::fprintf(stderr, "register: %s\n", r.status().message().c_str());
      return 1;
    }
  }
  auto us = [](Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); };
  std::atomic<int> errors{0};
  auto health = Phase(clients, [&](int c, std::vector<double>* out) {
    const ControllerClient mine = client_of(c);
    for (int i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      auto r = mine.Call("GET", "/v1/health");
      out->push_back(us(t0));
      if (!r.ok()) errors++;
    }
  });
  std::mutex mu;
  std::vector<double> releases;
  std::atomic<int> refused{0};
  auto allocs = Phase(clients, [&](int c, std::vector<double>* out) {
    const ControllerClient mine = client_of(c);
    std::vector<double> rel;
    for (int i = 0; i < n; ++i) {
      auto t0 = Clock::now();
      auto r = mine.Call("POST", "/v1/allocations",
                         {{"vgpus", 1 + (i % 2)}, {"gmem_mib", 4096}, {"client", {{"host", "bench"}, {"pid", c}}}});
      out->push_back(us(t0));
      if (!r.ok()) {
        refused++;
        continue;
      }
      t0 = Clock::now();
      auto d = mine.Call("DELETE", "/v1/allocations/" + (*r)["id"].get<std::string>());
      rel.push_back(us(t0));
      if (!d.ok()) errors++;
    }
    std::lock_guard<std::mutex> lock(mu);
    releases.insert(releases.end(), rel.begin(), rel.end());
  });
  std::printf("health %.0f %.0f\n", Pct(health, 0.5), Pct(health, 0.99));
  std::printf("allocate %.0f %.0f\n", Pct(allocs, 0.5), Pct(allocs, 0.99));
  std::printf("release %.0f %.0f\n", Pct(releases, 0.5), Pct(releases, 0.99));
  std::printf("refused %d errors %d requests %zu\n", refused.load(), errors.load(), allocs.size());
  return errors.load() == 0 ? 0 : 1;
}
