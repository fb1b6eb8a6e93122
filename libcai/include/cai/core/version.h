#pragma once
namespace cai {
const char* version();   // "0.1.0"
const char* git_hash();  // short commit hash the library was built from, or "unknown"
}  // namespace cai
