// orion-shm: creates the shared-memory file a container's clients and oriond share.
// Flags and messages follow Orion's (shared/orion-reference.md):
//   orion-shm [-i index 0..9999] [-s MiB 16..1048576, default 128] [-d /dev/shm]
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "orion/ivshmem/region.h"

static int Main(int argc, char** argv) {
  CLI::App app{"Create an Orion shared-memory region file (<dir>/orionsock<index>)"};
  int index = 0;
  uint64_t mib = 128;
  std::string dir = "/dev/shm";
  app.add_option("-i,--index", index, "region index")->check(CLI::Range(0, 9999));
  app.add_option("-s,--size", mib, "size in MiB")->check(CLI::Range(uint64_t{16}, uint64_t{1048576}));
  app.add_option("-d,--dir", dir, "directory")->check(CLI::ExistingDirectory);
  CLI11_PARSE(app, argc, argv);

  std::string path = dir;
  if (!path.empty() && path.back() != '/') path += '/';
  path += "orionsock" + std::to_string(index);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    std::printf("%s has already exists.\n", path.c_str());
    return 0;
  }
  auto region = orion::ivshmem::MappedRegion::Open(path, mib << 20);
  if (!region.ok()) {
    std::fprintf(stderr, "orion-shm: %s\n", region.status().ToString().c_str());
    return 1;
  }
  std::printf("%s is successfully created.\n", path.c_str());
  return 0;
}

// Whatever escapes (a failed allocation, a library's exception) ends the program with its reason,
// not with std::terminate's abort.
int main(int argc, char** argv) {
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "orion-shm: %s\n", e.what());
    return 1;
  }
}
