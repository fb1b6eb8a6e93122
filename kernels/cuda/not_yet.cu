// CUDA twins that have not landed yet: they throw a clear NotImplemented.
#include "kernels/base/error.h"

#define CAI_STUB(op) \
  throw ::cai::NotImplemented("[" op "] the CUDA kernel is not implemented yet; use a CPU tensor")
#include "kernels/cuda_stubs.inc"
