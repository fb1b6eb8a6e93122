// The host side of ZeRO-Offload for the calibration profile's "host" entry (sim/cluster.h:
// Calibration::h2d_bytes_per_s ...): pinned copies each way, the host Adam and the host add, as
// DataParallelPlugin's offload lane and the host optimizer run them.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "cai/nn/module.h"
#include "cai/optim/optimizer.h"
#include "calibrate_internal.h"
#include "kernels/cpu/parallel.h"
#include "kernels/device.h"

namespace cai::app::detail {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one copy of `bytes` between pinned host memory and the device on a stream of its
// own (the lane's copy stream), the median of 5 after one warm copy.
double time_copy(void* dst, const void* src, size_t bytes, bool to_device) {
  void* stream = kernels::cuda::stream_create();
  void* done = kernels::cuda::event_create();
  std::vector<double> s;
  for (int k = 0; k < 6; ++k) {
    const auto t0 = Clock::now();
    if (to_device)
      kernels::cuda::copy_h2d_async(dst, src, bytes, stream);
    else
      kernels::cuda::copy_d2h_async(dst, src, bytes, stream);
    kernels::cuda::event_record(done, stream);
    kernels::cuda::event_synchronize(done);
    if (k > 0) s.push_back(seconds_since(t0));
  }
  kernels::cuda::event_destroy(done);
  kernels::cuda::stream_destroy(stream);
  return median(s);
}

}  // namespace

HostRates time_host_offload(Device dev, int64_t copy_bytes, int64_t adam_elements) {
  HostRates r;
  if (dev.is_cuda()) {
    struct Pinned {
      void* p;
      ~Pinned() { kernels::cuda::free_pinned(p); }
    } host{kernels::cuda::alloc_pinned(static_cast<size_t>(copy_bytes))};
    std::memset(host.p, 0, static_cast<size_t>(copy_bytes));
    const Tensor device_buf = Tensor::zeros({copy_bytes / 4}, DType::F32, dev);
    const size_t b = static_cast<size_t>(device_buf.nbytes());
    r.h2d_bytes_per_s = static_cast<double>(b) / time_copy(device_buf.raw(), host.p, b, true);
    r.d2h_bytes_per_s = static_cast<double>(b) / time_copy(host.p, device_buf.raw(), b, false);
  }
  // HybridAdam over host fp32 parameters in four tensors (the large weights that dominate a big
  // model's step: 16M elements each for the default 64M), on the default CPU pool: the offloaded
  // step. (Tensors of 1M elements measured 5.4e8 elements/s on a 32-core H200 host where the
  // 6.4B ViT's step ran 2.4e9: the pool's per-tensor start dominated.)
  {
    std::vector<nn::Parameter> ps;
    const int64_t chunk = std::max<int64_t>(int64_t{1} << 20, adam_elements / 4);
    for (int64_t off = 0, i = 0; off < adam_elements; off += chunk, ++i) {
      const int64_t n = std::min(chunk, adam_elements - off);
      nn::Parameter p = nn::make_parameter(fmt::format("p{}", i), {n}, true);
      p.grad = randn({n}, DType::F32, Device::cpu(), 50 + i);
      ps.push_back(std::move(p));
    }
    std::vector<nn::Parameter*> ptrs;
    for (auto& p : ps) ptrs.push_back(&p);
    optim::HybridAdam opt(optim::weight_decay_groups(ptrs, 1e-3, 0.05));
    r.adam_elements_per_s =
        static_cast<double>(adam_elements) / time_it([&] { opt.step(); }, Device::cpu());
  }
  // y += x over the CPU pool in the lane's grains (offload_lane.cpp): bytes of x per second.
  {
    const int64_t n = copy_bytes / 4;
    std::vector<float> x(static_cast<size_t>(n), 1e-3f), y(static_cast<size_t>(n), 0.0f);
    const double s = time_it(
        [&] {
          kernels::cpu::parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
            for (int64_t k = b; k < e; ++k) y[k] += x[k];
          });
        },
        Device::cpu());
    r.add_bytes_per_s = 4.0 * static_cast<double>(n) / s;
  }
  return r;
}

}  // namespace cai::app::detail
