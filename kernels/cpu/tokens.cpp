// The CPU reference of kernels/tokens.h: a row (F elements) at a time.
#include "kernels/tokens.h"

#include <cstring>

#include "kernels/base/error.h"

namespace cai::kernels::cpu {

namespace {

void check(int64_t B, int64_t N, int64_t F, int T, size_t es) {
  CAI_CHECK(B >= 0 && F >= 0 && T >= 1 && N >= T && es > 0,
            "[tokens_ranks] batch {}, tokens {}, features {} over {} ranks ({}-byte elements): "
            "expected at least as many tokens as ranks",
            B, N, F, T, es);
}

// Calls f(staged row, full row) for every row of every rank's block.
template <typename Fn>
void for_each_row(int64_t B, int64_t N, int T, bool padded, Fn&& f) {
  const int64_t most = (N + T - 1) / T;
  for (int r = 0; r < T; ++r) {
    const int64_t t0 = N * r / T, t1 = N * (r + 1) / T, n = t1 - t0;
    const int64_t block = padded ? r * B * most : B * t0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < n; ++j) f(block + b * n + j, b * N + t0 + j);
  }
}

}  // namespace

void tokens_from_ranks(const void* staged, void* full, size_t es, int64_t B, int64_t N, int64_t F,
                       int T, bool padded) {
  check(B, N, F, T, es);
  const size_t row = static_cast<size_t>(F) * es;
  const char* s = static_cast<const char*>(staged);
  char* d = static_cast<char*>(full);
  for_each_row(B, N, T, padded,
               [&](int64_t sr, int64_t fr) { std::memcpy(d + fr * row, s + sr * row, row); });
}

void tokens_to_ranks(const void* full, void* staged, size_t es, int64_t B, int64_t N, int64_t F,
                     int T, bool padded) {
  check(B, N, F, T, es);
  const size_t row = static_cast<size_t>(F) * es;
  const char* s = static_cast<const char*>(full);
  char* d = static_cast<char*>(staged);
  if (padded) std::memset(d, 0, static_cast<size_t>(staged_numel(B, N, F, T, true)) * es);
  for_each_row(B, N, T, padded,
               [&](int64_t sr, int64_t fr) { std::memcpy(d + sr * row, s + fr * row, row); });
}

}  // namespace cai::kernels::cpu
