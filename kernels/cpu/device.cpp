#include "kernels/device.h"

#include <cstdlib>
#include <new>

#include <cblas.h>
#include "kernels/cpu/parallel.h"

#include "kernels/base/error.h"

namespace cai::kernels::cpu {

void* alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) fail("[alloc] could not allocate {} bytes of host memory", bytes);
  return p;
}
void free(void* p) {
  std::free(p);
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
