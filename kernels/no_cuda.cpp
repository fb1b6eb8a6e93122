// Linked instead of kernels/cuda/*.cu when the build has no CUDA: every CUDA entry point throws,
// runtime_info() reports "not compiled", so call sites need no #ifdef.
#include "kernels/base/error.h"
#include "kernels/device.h"
#include "kernels/gelu.h"

#define CAI_STUB(op)                                                      \
  throw ::cai::NotImplemented("[" op                                      \
                              "] this build has no CUDA (configure with " \
                              "-DCAI_WITH_CUDA=ON where nvcc is installed)")
#include "kernels/cuda_stubs.inc"

namespace cai::kernels::cuda {
RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.device_error = "this build has no CUDA";
  return r;
}
int device_count() {
  return 0;
}
void* alloc(size_t, int) {
  CAI_STUB("cuda_alloc");
}
void free(void*, int) {}
void copy_h2d(void*, const void*, size_t) {
  CAI_STUB("copy_h2d");
}
void copy_d2h(void*, const void*, size_t) {
  CAI_STUB("copy_d2h");
}
void copy_d2d(void*, const void*, size_t) {
  CAI_STUB("copy_d2d");
}
void memset_zero(void*, size_t) {
  CAI_STUB("memset_zero");
}
void synchronize() {}
void gelu_fwd(const float*, float*, int64_t, void*) {
  CAI_STUB("gelu_fwd");
}
void gelu_bwd(const float*, const float*, float*, int64_t, void*) {
  CAI_STUB("gelu_bwd");
}
}  // namespace cai::kernels::cuda
