// Internal to libcai/src/checkpoint: the file helpers that checkpoint.cpp (saving and loading)
// and checkpoint_run.cpp (run records, the directory lock, the hook) share. Not installed.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <optional>
#include <string>

namespace cai::checkpoint::detail {

inline constexpr const char* kRunRecord = "run.json";

// The whole file at `path` (throws when it cannot be opened).
std::string read_text(const std::string& path);
// Replaces `path` with `text` atomically (temporary file, fsync, rename, fsync of the directory).
void write_atomically(const std::string& path, const std::string& text);
// fs::exists without std::filesystem::filesystem_error: an unreadable path is one not there.
bool path_exists(const std::filesystem::path& p);
// The JSON file at `path` (throws naming it when it is not valid JSON).
nlohmann::json read_json(const std::string& path);
// The run id a checkpoint directory's trainer_state.json names ("" before run records);
// nullopt when it cannot be read.
std::optional<std::string> step_run_id(const std::filesystem::path& step);

}  // namespace cai::checkpoint::detail
