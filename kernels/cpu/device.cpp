#include "kernels/device.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include <cblas.h>
#include "kernels/cpu/parallel.h"

#include "kernels/base/error.h"

namespace cai::kernels::cpu {

// malloc / calloc with room to align: the block starts at the first 64-byte boundary with a
// pointer's room before it, where the pointer to free is kept. (aligned_alloc has no calloc: a
// model's gigabytes of zeros, values and gradients, took a pass each before the first step.)
void* alloc(size_t bytes, bool zeroed) {
  if (bytes == 0) return nullptr;
  const size_t total = bytes + 64 + sizeof(void*);
  void* raw = zeroed ? std::calloc(1, total) : std::malloc(total);
  if (!raw) fail("[alloc] could not allocate {} bytes of host memory", bytes);
  const auto start = (reinterpret_cast<uintptr_t>(raw) + sizeof(void*) + 63) & ~uintptr_t{63};
  reinterpret_cast<void**>(start)[-1] = raw;
  return reinterpret_cast<void*>(start);
}
void free(void* p) {
  if (p) std::free(static_cast<void**>(p)[-1]);
}

std::string blas_info() {
  std::string s = openblas_get_config();
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

int max_threads() {
  return num_threads();
}

}  // namespace cai::kernels::cpu
