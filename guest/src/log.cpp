// Guest logging: spdlog (header-only, compiled into libcuda.so.1 and libnvidia-ml.so.1, hidden in each), to stderr or
// $ORION_LOG_FILE; never stdout. ORION_LOG_LEVEL: ERROR, WARNING, INFO (default), DEBUG, TRACE.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

#include "log.h"

namespace orion::guest {
namespace {

spdlog::logger& Logger() {
  static spdlog::logger* l = [] {
    spdlog::sink_ptr sink;
    const char* file = std::getenv("ORION_LOG_FILE");
    try {
      if (file != nullptr && *file != '\0') sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file);
    } catch (...) {
      sink = nullptr;
    }
    if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    auto* lg = new spdlog::logger("orion", sink);  // leaked: used from exit handlers
    lg->set_pattern("[%l] %v");
    spdlog::level::level_enum lvl = spdlog::level::info;
    if (const char* e = std::getenv("ORION_LOG_LEVEL")) {
      if (strcasecmp(e, "ERROR") == 0)
        lvl = spdlog::level::err;
      else if (strcasecmp(e, "WARNING") == 0 || strcasecmp(e, "WARN") == 0)
        lvl = spdlog::level::warn;
      else if (strcasecmp(e, "DEBUG") == 0)
        lvl = spdlog::level::debug;
      else if (strcasecmp(e, "TRACE") == 0)
        lvl = spdlog::level::trace;
      else if (strcasecmp(e, "OFF") == 0 || strcasecmp(e, "NONE") == 0)
        lvl = spdlog::level::off;
    }
    lg->set_level(lvl);
    lg->flush_on(spdlog::level::trace);
    return lg;
  }();
  return *l;
}

void Log(spdlog::level::level_enum lvl, const std::string& msg) noexcept {
  try {
    Logger().log(lvl, msg);
  } catch (...) {
  }
}

}  // namespace

void LogInfo(const std::string& msg) noexcept { Log(spdlog::level::info, msg); }
void LogWarn(const std::string& msg) noexcept { Log(spdlog::level::warn, msg); }
void LogError(const std::string& msg) noexcept { Log(spdlog::level::err, msg); }
void LogDebug(const std::string& msg) noexcept { Log(spdlog::level::debug, msg); }

}  // namespace orion::guest
