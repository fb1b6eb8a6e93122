#include "kernels/device.h"

#include <cstdint>
#include <cstdlib>
#include <new>

#include <sys/mman.h>

#include <cblas.h>
#include "kernels/cpu/parallel.h"

#include "kernels/base/error.h"

namespace cai::kernels::cpu {

// Host blocks start on a 64-byte boundary with two words before them: what to release and how
// (the mapping's length; 0: the pointer came from malloc / calloc).
// - Below kHuge: malloc / calloc with room to align (aligned_alloc has no calloc: a model's
//   gigabytes of zeros, values and gradients, took a pass each before the first step).
// - From kHuge up (ZeRO-Offload's host shards and optimizer state: tens of gigabytes): an
//   anonymous mapping, zeros by construction, its block on a 2 MiB boundary and advised as
//   transparent huge pages (where the kernel's setting is "madvise", as on the GPU hosts): a
//   first touch faults a 2 MiB page instead of a 4 KiB one (the 6.4B ViT's offload setup spent
//   minutes in faults), and the host Adam's streams cross 512 times fewer TLB entries.
namespace {
constexpr size_t kHuge = size_t{64} << 20;
constexpr size_t kPage2M = size_t{2} << 20;
}  // namespace

void* alloc(size_t bytes, bool zeroed) {
  if (bytes == 0) return nullptr;
  constexpr size_t head = 2 * sizeof(void*);
  if (bytes >= kHuge) {
    const size_t total = bytes + 2 * kPage2M;
    void* raw = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) fail("[alloc] could not map {} bytes of host memory", bytes);
    const auto start = (reinterpret_cast<uintptr_t>(raw) + head + kPage2M - 1) & ~(kPage2M - 1);
#ifdef MADV_HUGEPAGE
    madvise(reinterpret_cast<void*>(start), (bytes + kPage2M - 1) & ~(kPage2M - 1), MADV_HUGEPAGE);
#endif
    reinterpret_cast<void**>(start)[-2] = raw;
    reinterpret_cast<uintptr_t*>(start)[-1] = total;
    return reinterpret_cast<void*>(start);
  }
  const size_t total = bytes + 64 + head;
  void* raw = zeroed ? std::calloc(1, total) : std::malloc(total);
  if (!raw) fail("[alloc] could not allocate {} bytes of host memory", bytes);
  const auto start = (reinterpret_cast<uintptr_t>(raw) + head + 63) & ~uintptr_t{63};
  reinterpret_cast<void**>(start)[-2] = raw;
  reinterpret_cast<uintptr_t*>(start)[-1] = 0;
  return reinterpret_cast<void*>(start);
}
void free(void* p) {
  if (!p) return;
  void* raw = static_cast<void**>(p)[-2];
  const uintptr_t mapped = static_cast<uintptr_t*>(p)[-1];
  if (mapped)
    munmap(raw, mapped);
  else
    std::free(raw);
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
