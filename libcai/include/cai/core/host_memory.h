#pragma once

namespace cai {

// Keeps freed host memory in the process's heap instead of handing it back to the system: with
// glibc, blocks up to 256 MiB come from the heap rather than their own mappings, and the heap is
// trimmed only above 1 GiB free. A training step on the CPU allocates and frees the same sizes
// every step (ZeRO-3's gathered layers, activations, gradients); returned to the system, each
// comes back as fresh pages the kernel faults in and zeroes (ZeRO-3 on 2 processes: 22.5-23.7
// ms a step against 19.7-20.2 kept). For apps to call once, early (a process-wide setting).
// Returns whether it did: not where GLIBC_TUNABLES is set (the user's malloc settings stay), nor
// on another C library.
bool keep_freed_host_memory();

}  // namespace cai
