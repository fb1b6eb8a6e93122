#include "cai/core/log.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace cai::log {

namespace {
std::shared_ptr<spdlog::logger> make(int rank, bool all_ranks) {
  auto sink = std::make_shared<spdlog::sinks::stdout_sink_mt>();
  auto l = std::make_shared<spdlog::logger>("cai", sink);
  l->set_pattern(fmt::format("[%H:%M:%S] [rank {}] %v", rank));
  l->set_level(rank == 0 || all_ranks ? spdlog::level::info : spdlog::level::warn);
  l->flush_on(spdlog::level::info);
  return l;
}
}  // namespace

// The logger is process-wide output configuration, not state of any process group.
std::shared_ptr<spdlog::logger>& slot() {
  static std::shared_ptr<spdlog::logger> logger = make(0, false);
  return logger;
}

void init(int rank, bool all_ranks) {
  slot() = make(rank, all_ranks);
}
std::shared_ptr<spdlog::logger> get() {
  return slot();
}

}  // namespace cai::log
