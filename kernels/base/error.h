// Errors shared by every layer: the library throws, only apps exit.
// Messages start with "[op]" and name the values that were wrong.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cai {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A CUDA, cuBLAS or NCCL call failed: the message names the call, file and line.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& what) : Error(what) {}
};

// The operation is not available in this build or not implemented yet for this backend.
class NotImplemented : public Error {
 public:
  explicit NotImplemented(const std::string& what) : Error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace cai

// CAI_CHECK(cond, "[op] input has {} features, weight expects {}", a, b)
#define CAI_CHECK(cond, ...)               \
  do {                                     \
    if (!(cond)) ::cai::fail(__VA_ARGS__); \
  } while (0)
