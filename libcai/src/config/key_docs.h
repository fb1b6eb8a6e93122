// Descriptions of the configuration keys (key_docs.cpp); nullptr for a key without one.
#pragma once
#include <string>

namespace cai::config::detail {
const char* key_doc(const std::string& key);
}  // namespace cai::config::detail
