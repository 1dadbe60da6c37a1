#pragma once
namespace orion::guest {
inline constexpr const char* kOrionVersion = ORION_VERSION_STRING;
inline constexpr const char* kOrionBuild = ORION_BUILD_STRING;
}  // namespace orion::guest
