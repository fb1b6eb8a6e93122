#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cai/core/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

// glibc: the settings take (a block between the default and the new mmap threshold comes from the
// heap, and stays there once freed); GLIBC_TUNABLES set by the user wins, and nothing changes.
TEST(HostMemory, FreedStepBuffersStayInTheHeap) {
#if defined(__GLIBC__)
  const char* env = std::getenv("GLIBC_TUNABLES");
  const std::string user = env ? env : "";
  setenv("GLIBC_TUNABLES", "glibc.malloc.check=0", 1);
  EXPECT_FALSE(cai::keep_freed_host_memory());
  unsetenv("GLIBC_TUNABLES");
  const bool kept = cai::keep_freed_host_memory();
  if (env) setenv("GLIBC_TUNABLES", user.c_str(), 1);  // this process's settings are read at start
  ASSERT_TRUE(kept);
  // 64 MiB is above glibc's largest dynamic mmap threshold (32 MiB): mapped before, now from the
  // heap, so freeing it leaves it in the arena's free space rather than unmapping it.
  const size_t n = 64u << 20;
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(n);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[0] = 1;
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mapped on its own";
  std::free(p);
  const struct mallinfo2 after = mallinfo2();
  // Against the arena while the block was held (the block may have reused free space that was
  // there before, as when other tests ran first in this process).
  EXPECT_GE(after.fordblks, held.fordblks + n) << "the freed block left the heap";
#else
  EXPECT_FALSE(cai::keep_freed_host_memory());
#endif
}
