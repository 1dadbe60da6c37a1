// guest/src/log.h — guest-side logging (log.cpp): stderr or $ORION_LOG_FILE, never stdout; level
// from ORION_LOG_LEVEL. One hidden spdlog copy per library (libcuda.so.1, libnvidia-ml.so.1).
// Thread-safe; never throws.
#pragma once

#include <string>

namespace orion::guest {

void LogInfo(const std::string& msg) noexcept;
void LogWarn(const std::string& msg) noexcept;
void LogError(const std::string& msg) noexcept;
void LogDebug(const std::string& msg) noexcept;

}  // namespace orion::guest
