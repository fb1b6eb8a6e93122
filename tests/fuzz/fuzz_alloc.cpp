// Allocation guard for the fuzz harness: malloc, calloc, realloc and aligned_alloc are interposed
// (glibc's __libc_* do the work), so vectors, strings, tensors (aligned_alloc) and stb_image
// (malloc) all go through the same check. While armed, a request above the limit returns null
// (operator new then throws std::bad_alloc) and is remembered for the harness to report.
// Sanitizer builds use the sanitizer's allocator instead (ASAN_OPTIONS=max_allocation_size_mb).
#include <atomic>
#include <cerrno>
#include <cstddef>

#include "fuzz.h"

#if defined(CAI_FUZZ_NO_ALLOC_GUARD)
#elif defined(__SANITIZE_ADDRESS__)
#define CAI_FUZZ_NO_ALLOC_GUARD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CAI_FUZZ_NO_ALLOC_GUARD 1
#endif
#endif

namespace cai::fuzz {
namespace {
std::atomic<size_t> g_limit{0};    // 0: disarmed
std::atomic<size_t> g_tripped{0};  // largest refused request

bool refuse(size_t n) {
  const size_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit == 0 || n <= limit) return false;
  size_t prev = g_tripped.load();
  while (n > prev && !g_tripped.compare_exchange_weak(prev, n)) {
  }
  errno = ENOMEM;
  return true;
}
}  // namespace

void alloc_guard_arm(size_t limit_bytes) {
  g_tripped = 0;
  g_limit = limit_bytes;
}
void alloc_guard_disarm() {
  g_limit = 0;
}
size_t alloc_guard_tripped() {
  return g_tripped.load();
}

}  // namespace cai::fuzz

#ifndef CAI_FUZZ_NO_ALLOC_GUARD
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) {
  return cai::fuzz::refuse(n) ? nullptr : __libc_malloc(n);
}
void* calloc(size_t n, size_t m) {
  if (m != 0 && n > static_cast<size_t>(-1) / m) return __libc_calloc(n, m);  // glibc says ENOMEM
  return cai::fuzz::refuse(n * m) ? nullptr : __libc_calloc(n, m);
}
void* realloc(void* p, size_t n) {
  return cai::fuzz::refuse(n) ? nullptr : __libc_realloc(p, n);
}
void* aligned_alloc(size_t a, size_t n) {
  return cai::fuzz::refuse(n) ? nullptr : __libc_memalign(a, n);
}
}
#endif
