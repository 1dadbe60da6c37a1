// orion/ptx/link.h — links PTX modules into one PTX module, at the text level: what the guest's
// cuLinkCreate / cuLinkAddData / cuLinkComplete produce (guest/src/api_link.cpp). The result is
// loaded like any PTX image (cuModuleLoadData): oriond's cuda backend has the driver JIT-compile
// it, the sim backend executes it.
//
// Rules (those of a device linker, nvlink / the driver's cuLink*, for PTX compiled with
// -rdc=true):
//   * `.extern` declarations of a function or variable are resolved by a `.visible` or `.weak`
//     definition in any module; a `.weak` definition yields to a `.visible` one, and of several
//     `.weak` ones the first wins; two `.visible` definitions of one name are an error.
//   * Names without linkage (module-local functions and variables, e.g. `$str` constants) that
//     collide with a name of an earlier module are renamed in their module (`name$orion<k>`).
//   * Functions the driver provides (vprintf, malloc, free, __assertfail) may stay unresolved; any
//     other unresolved `.extern` is an error naming it ("undefined reference"), as the driver's
//     linker reports at cuLinkComplete.
//   * Output: one header (the highest `.version`, the first module's `.target` with the highest
//     sm_ number, `.address_size 64`), then every variable, then a prototype of every function,
//     then the functions' bodies in module order. Debug line information (`.file`, `.loc`,
//     `.section`) is dropped: file numbers of different modules would collide.
//
//   auto ptx = orion::ptx::LinkText({kernel_ptx, helper_ptx});
//   if (!ptx.ok()) log(ptx.status().message());   // kNotFound: an undefined reference
//
// Errors: kInvalidArgument (a module is not PTX text, unbalanced braces, 64 modules or more,
// a duplicate strong definition), kNotFound (an undefined reference). Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "orion/common/status.h"

namespace orion::ptx {

inline constexpr size_t kMaxLinkModules = 64;

Result<std::string> LinkText(const std::vector<std::string_view>& modules);

}  // namespace orion::ptx
