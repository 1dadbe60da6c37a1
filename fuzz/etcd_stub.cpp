// etcd_stub.cpp — linked into config_fuzz instead of controller/src/store_etcd.cpp when the compiler
// cannot build that file (clang < 16 does not let a lambda capture a structured binding, which
// store_etcd.cpp does). config_fuzz uses a SQLite store; the etcd store is never opened.
#include "orion/controller/store.h"

namespace orion::controller {

Result<std::unique_ptr<Store>> OpenEtcdStore(const std::string& endpoints) {
  return Status(Code::kUnimplemented, "the fuzz build has no etcd store (" + endpoints + ")");
}

}  // namespace orion::controller
