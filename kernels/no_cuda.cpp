// Linked instead of kernels/cuda/*.cu when the build has no CUDA: every CUDA entry point throws,
// runtime_info() reports "not compiled", so call sites need no #ifdef.
#include <atomic>

#include "kernels/base/error.h"
#include "kernels/device.h"
#include "kernels/gelu.h"

#define CAI_STUB(op)                                                      \
  throw ::cai::NotImplemented("[" op                                      \
                              "] this build has no CUDA (configure with " \
                              "-DCAI_WITH_CUDA=ON where nvcc is installed)")
#include "kernels/attention.h"
#include "kernels/copy.h"
#include "kernels/cross_entropy.h"
#include "kernels/dropout.h"
#include "kernels/elementwise.h"
#include "kernels/embed.h"
#include "kernels/layernorm.h"
#include "kernels/linear.h"
#include "kernels/optim.h"
#include "kernels/tokens.h"

namespace cai::kernels::cuda {
void layernorm_fwd(const float*, const float*, const float*, float*, float*, float*, int64_t,
                   int64_t, float, void*) {
  CAI_STUB("layernorm_fwd");
}
void layernorm_bwd(const float*, const float*, const float*, const float*, const float*, float*,
                   float*, float*, int64_t, int64_t, void*) {
  CAI_STUB("layernorm_bwd");
}
void dropout_fwd(const float*, float*, int64_t, float, uint64_t, uint64_t, uint64_t, void*) {
  CAI_STUB("dropout_fwd");
}
void dropout_bwd(const float*, float*, int64_t, float, uint64_t, uint64_t, uint64_t, void*) {
  CAI_STUB("dropout_bwd");
}
void drop_path_fwd(const float*, float*, int64_t, int64_t, float, uint64_t, uint64_t, uint64_t,
                   void*) {
  CAI_STUB("drop_path_fwd");
}
void drop_path_bwd(const float*, float*, int64_t, int64_t, float, uint64_t, uint64_t, uint64_t,
                   void*) {
  CAI_STUB("drop_path_bwd");
}
void patchify(const float*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("patchify");
}
void cls_pos_fwd(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                 void*) {
  CAI_STUB("cls_pos_fwd");
}
void cls_pos_bwd(const float*, float*, float*, float*, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("cls_pos_bwd");
}
void select_token_fwd(const float*, float*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("select_token_fwd");
}
void select_token_bwd(const float*, float*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("select_token_bwd");
}
void cross_entropy_fwd(const float*, const int32_t*, float*, int64_t, int64_t, float, void*) {
  CAI_STUB("cross_entropy_fwd");
}
void cross_entropy_bwd(const float*, const int32_t*, float, float*, int64_t, int64_t, float,
                       void*) {
  CAI_STUB("cross_entropy_bwd");
}
void linear_fwd(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                void*) {
  CAI_STUB("linear_fwd");
}
void linear_bwd(const float*, const float*, const float*, float*, float*, float*, int64_t, int64_t,
                int64_t, void*) {
  CAI_STUB("linear_bwd");
}
void attention_fwd(const float*, float*, float*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("attention_fwd");
}
void attention_bwd(const float*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                   int64_t, void*) {
  CAI_STUB("attention_bwd");
}
void linear_fwd_t(DT, const void*, const void*, const void*, DT, void*, int64_t, int64_t, int64_t,
                  bool, void*) {
  CAI_STUB("linear_fwd");
}
void linear_fwd_residual_t(DT, const void*, const void*, const float*, const float*, float*,
                           int64_t, int64_t, int64_t, void*) {
  CAI_STUB("linear_fwd_residual_t");
}
void linear_bwd_t(DT, const void*, const void*, const void*, void*, float*, float*, int64_t,
                  int64_t, int64_t, bool, void*) {
  CAI_STUB("linear_bwd");
}
void column_sum_t(DT, const void*, float*, int64_t, int64_t, void*) {
  CAI_STUB("column_sum");
}
void linear_gelu_fwd_t(DT, const void*, const void*, const void*, void*, void*, int64_t, int64_t,
                       int64_t, void*) {
  CAI_STUB("linear_gelu_fwd_t");
}
void linear_bwd_dgelu_t(DT, const void*, const void*, const void*, const void*, void*, float*,
                        float*, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("linear_bwd_dgelu_t");
}
void attention_fwd_t(DT, const void*, void*, void*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("attention_fwd");
}
void attention_bwd_t(DT, const void*, const void*, const void*, void*, int64_t, int64_t, int64_t,
                     int64_t, void*) {
  CAI_STUB("attention_bwd");
}
bool flash_attention_supported(DT, int64_t) {
  return false;  // no CUDA: callers take the unfused path (which throws too)
}
bool flash_attention_sm90_available(DT, int64_t) {
  return false;
}
bool flash_attention_sm90_default() {
  return false;
}
void flash_attention_fwd_t(DT, const void*, void*, float*, int64_t, int64_t, int64_t, int64_t,
                           void*, FlashKernel) {
  CAI_STUB("flash_attention_fwd");
}
void flash_attention_bwd_t(DT, const void*, const void*, const float*, const void*, void*, int64_t,
                           int64_t, int64_t, int64_t, float*, void*, FlashKernel) {
  CAI_STUB("flash_attention_bwd");
}
void add(const float*, const float*, float*, int64_t, void*) {
  CAI_STUB("add");
}
void axpy(float, const float*, float*, int64_t, void*) {
  CAI_STUB("axpy");
}
void scale(float, float*, int64_t, void*) {
  CAI_STUB("scale");
}
void fill(float, float*, int64_t, void*) {
  CAI_STUB("fill");
}
double sum_squares(const float*, int64_t, void*) {
  CAI_STUB("sum_squares");
}
void sgd_step(float*, const float*, float*, int64_t, float, float, float, float, bool, bool,
              void*) {
  CAI_STUB("sgd_step");
}
void adam_step(float*, const float*, float*, float*, int64_t, float, float, float, float, float,
               int64_t, bool, void*) {
  CAI_STUB("adam_step");
}
void lamb_update(const float*, const float*, float*, float*, float*, int64_t, float, float, float,
                 float, int64_t, void*) {
  CAI_STUB("lamb_update");
}
}  // namespace cai::kernels::cuda

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
AllocatorStats allocator_stats(int) {
  return {};
}
void reset_peak(int) {}
bool read_sensors(int, GpuSensors*) {
  return false;
}
void empty_cache(int) {}
void* alloc_pinned(size_t) {
  CAI_STUB("alloc_pinned");
}
void free_pinned(void*) {}
void* stream_create() {
  CAI_STUB("stream_create");
}
void stream_destroy(void*) {}
void* event_create() {
  CAI_STUB("event_create");
}
void event_destroy(void*) {}
void event_record(void*, void*) {
  CAI_STUB("event_record");
}
void stream_wait_event(void*, void*) {
  CAI_STUB("stream_wait_event");
}
void event_synchronize(void*) {
  CAI_STUB("event_synchronize");
}
bool event_query(void*) {
  CAI_STUB("event_query");
}
void* event_create_timed() {
  CAI_STUB("event_create_timed");
}
float event_elapsed_ms(void*, void*) {
  CAI_STUB("event_elapsed_ms");
}
void copy_h2d_async(void*, const void*, size_t, void*) {
  CAI_STUB("copy_h2d_async");
}
void upload_async(void*, const void*, size_t, void*) {
  CAI_STUB("upload_async");
}
void copy_d2h_async(void*, const void*, size_t, void*) {
  CAI_STUB("copy_d2h_async");
}
int current_device() {
  CAI_STUB("current_device");
}
void set_device(int) {
  CAI_STUB("set_device");
}
bool has_primary_context(int) {
  return false;
}
void copy_h2d(void*, const void*, size_t) {
  CAI_STUB("copy_h2d");
}
void copy_d2h(void*, const void*, size_t) {
  CAI_STUB("copy_d2h");
}
void copy_d2d(void*, const void*, size_t) {
  CAI_STUB("copy_d2d");
}
void copy_2d(void*, size_t, const void*, size_t, size_t, size_t) {
  CAI_STUB("copy_2d");
}
void tokens_from_ranks(const void*, void*, size_t, int64_t, int64_t, int64_t, int, bool, void*) {
  CAI_STUB("tokens_from_ranks");
}
void tokens_to_ranks(const void*, void*, size_t, int64_t, int64_t, int64_t, int, bool, void*) {
  CAI_STUB("tokens_to_ranks");
}
void memset_zero(void*, size_t) {
  CAI_STUB("memset_zero");
}
void synchronize() {}
namespace {
std::atomic<bool> gemm_timing_on{true};  // the setting only: there are no GEMMs to time
}  // namespace
void set_gemm_timing(bool on) {
  gemm_timing_on.store(on);
}
bool gemm_timing() {
  return gemm_timing_on.load();
}
namespace {
std::atomic<int> gemm_sm_margin_sms{0};  // the setting only
}  // namespace
void set_gemm_sm_margin(int sms) {
  CAI_CHECK(sms >= 0, "[gemm] SM margin {}: expected 0 or more SMs", sms);
  gemm_sm_margin_sms.store(sms);
}
int gemm_sm_margin() {
  return gemm_sm_margin_sms.load();
}
void gelu_fwd(const float*, float*, int64_t, void*) {
  CAI_STUB("gelu_fwd");
}
void gelu_bwd(const float*, const float*, float*, int64_t, void*) {
  CAI_STUB("gelu_bwd");
}
}  // namespace cai::kernels::cuda

// Typed (fp32/bf16/fp16) kernels and the multi-tensor optimizers.
namespace cai::kernels::cuda {
void layernorm_fwd_t(DT, const void*, const float*, const float*, DT, void*, float*, float*,
                     int64_t, int64_t, float, void*) {
  CAI_STUB("layernorm_fwd_t");
}
void layernorm_bwd_t(DT, const void*, const float*, const float*, const float*, DT, const void*, DT,
                     void*, float*, float*, int64_t, int64_t, void*) {
  CAI_STUB("layernorm_bwd_t");
}
void layernorm_bwd_add_t(DT, const void*, const float*, const float*, const float*, DT, const void*,
                         DT, void*, const void*, DT, void*, float*, float*, float*, bool, int64_t,
                         int64_t, void*) {
  CAI_STUB("layernorm_bwd_add_t");
}
void layernorm_row_sums(const float*, const float*, float*, int64_t, int64_t, void*) {
  CAI_STUB("layernorm_row_sums");
}
void layernorm_split_fwd(const float*, const float*, const float*, const float*, const float*,
                         float*, float*, int64_t, int64_t, int64_t, float, void*) {
  CAI_STUB("layernorm_split_fwd");
}
void layernorm_split_bwd_sums(const float*, const float*, const float*, const float*, const float*,
                              float*, float*, float*, int64_t, int64_t, void*) {
  CAI_STUB("layernorm_split_bwd_sums");
}
void layernorm_split_bwd(const float*, const float*, const float*, const float*, const float*,
                         const float*, float*, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("layernorm_split_bwd");
}
void gelu_fwd_t(DT, const void*, void*, int64_t, void*) {
  CAI_STUB("gelu_fwd_t");
}
void gelu_bwd_t(DT, const void*, const void*, void*, int64_t, void*) {
  CAI_STUB("gelu_bwd_t");
}
void gelu_tanh_fwd_t(DT, const void*, void*, int64_t, void*) {
  CAI_STUB("gelu_tanh_fwd_t");
}
void gelu_tanh_bwd_t(DT, const void*, const void*, void*, int64_t, void*) {
  CAI_STUB("gelu_tanh_bwd_t");
}
void gelu_bwd_bias_t(DT, bool, const void*, const void*, void*, float*, int64_t, int64_t, void*,
                     void*) {
  CAI_STUB("gelu_bwd_bias_t");
}
void dropout_fwd_t(DT, const void*, void*, int64_t, float, uint64_t, uint64_t, uint64_t, void*) {
  CAI_STUB("dropout_fwd_t");
}
void dropout_strided_t(DT, const void*, void*, int64_t, float, uint64_t, uint64_t, uint64_t,
                       int64_t, int64_t, void*) {
  CAI_STUB("dropout_strided_t");
}
void drop_path_fwd_t(DT, const void*, void*, int64_t, int64_t, float, uint64_t, uint64_t, uint64_t,
                     void*) {
  CAI_STUB("drop_path_fwd_t");
}
void patchify_t(const float*, DT, void*, int64_t, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("patchify_t");
}
void cls_pos_fwd_t(DT, const void*, const float*, const float*, float*, int64_t, int64_t, int64_t,
                   void*) {
  CAI_STUB("cls_pos_fwd_t");
}
void cls_pos_bwd_t(const float*, DT, void*, float*, float*, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("cls_pos_bwd_t");
}
void select_token_fwd_t(DT, const void*, void*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("select_token_fwd_t");
}
void select_token_bwd_t(DT, const void*, void*, int64_t, int64_t, int64_t, int64_t, void*) {
  CAI_STUB("select_token_bwd_t");
}
void cast(DT, const void*, DT, void*, int64_t, void*) {
  CAI_STUB("cast");
}
void copy_spans(DT, DT, int, const SpanDesc*, void*, bool) {
  CAI_STUB("copy_spans");
}
void zero_multi(int, void* const*, const int64_t*, void*) {
  CAI_STUB("zero_multi");
}
void cast_multi(int, const float* const*, DT, void* const*, const int64_t*, void*) {
  CAI_STUB("cast_multi");
}
void add_t(DT, const void*, DT, const void*, DT, void*, int64_t, void*) {
  CAI_STUB("add_t");
}
void axpy_t(float, DT, const void*, float*, int64_t, void*) {
  CAI_STUB("axpy_t");
}
int64_t count_nonfinite(const float*, int64_t, void*) {
  CAI_STUB("count_nonfinite");
}
void multi_tensor_grad_stats(int, float* const*, const int64_t*, const float*, float, float*, void*,
                             const GradReplicas*) {
  CAI_STUB("multi_tensor_grad_stats");
}
void multi_tensor_clip(int, float* const*, const int64_t*, const float*, float, float*, void*) {
  CAI_STUB("multi_tensor_clip");
}
void loss_metrics(const float*, const float*, const int32_t*, int64_t, int64_t, float*, void*) {
  CAI_STUB("loss_metrics");
}
void multi_tensor_adam(int, float* const*, const float* const*, float* const*, float* const*,
                       const int64_t*, const float*, float, float, float, float, int64_t, bool,
                       float, void*, const float*, float, const GradReplicas*) {
  CAI_STUB("multi_tensor_adam");
}
void multi_tensor_lamb(int, float* const*, const float* const*, float* const*, float* const*,
                       const int64_t*, const float*, float, float, float, float, int64_t, float,
                       void*) {
  CAI_STUB("multi_tensor_lamb");
}
}  // namespace cai::kernels::cuda
