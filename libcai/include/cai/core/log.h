// Rank-aware logging on spdlog: "[12:00:01] [rank 0] message". Only rank 0 prints info by
// default; every rank prints warnings and errors.
#pragma once
#include <spdlog/spdlog.h>

#include <memory>

namespace cai::log {

// Sets up the "cai" logger for this process. all_ranks: info from every rank.
void init(int rank, bool all_ranks = false);
std::shared_ptr<spdlog::logger> get();

template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  get()->info(f, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  get()->warn(f, std::forward<Args>(args)...);
}

}  // namespace cai::log
