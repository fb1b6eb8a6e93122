#include "cai/parallel/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "cai/core/error.h"
#include "cai/ops/ops.h"

namespace cai::parallel {

namespace {

// Rank r's chunk of an n-element parameter: [n·r/dp, n·(r+1)/dp).
int64_t chunk_begin(int64_t n, int r, int dp) {
  return n * r / dp;
}
int64_t chunk_size(int64_t n, int r, int dp) {
  return chunk_begin(n, r + 1, dp) - chunk_begin(n, r, dp);
}

float* fptr(const Tensor& t) {
  return t.data<float>();
}

struct Bucket {
  std::vector<nn::Parameter*> params;  // full parameters, in backward order
  int ready = 0;                       // parameters whose gradient is final this micro-batch
  bool launched = false;
  Tensor flat;                  // stage 0/1: all gradients; stage 2/3: rank-major
  Tensor recv;                  // stage 2/3: this rank's chunk of the reduction
  std::vector<int64_t> counts;  // stage 2/3: elements per rank
  std::unique_ptr<dist::Work> work;
  int64_t numel = 0;
};

}  // namespace

struct DataParallelPlugin::Impl {
  dist::Communicator& dp;
  DataParallelConfig cfg;
  int rank = 0, size = 1;
  std::vector<nn::Parameter*> params;            // model parameters, model order
  std::vector<nn::Parameter> shards;             // ZeRO: this rank's chunk of each parameter
  std::map<const nn::Parameter*, size_t> index;  // parameter -> position in params/shards
  std::vector<Bucket> buckets;
  std::map<const nn::Parameter*, size_t> bucket_of;
  std::map<const nn::Layer*, std::vector<nn::Parameter*>> layer_params;
  std::vector<Shape> shapes;  // full shapes (stage 3 frees the values)
  nn::LayerHooks last_hooks, accumulate_hooks, eval;

  Impl(dist::Communicator& c, DataParallelConfig g) : dp(c), cfg(g) {
    rank = dp.rank();
    size = dp.size();
    CAI_CHECK(cfg.zero_stage >= 0 && cfg.zero_stage <= 3,
              "[data_parallel] zero_stage {} is not 0, 1, 2 or 3", cfg.zero_stage);
    CAI_CHECK(cfg.ddp_bucket_cap_mb > 0 && cfg.zero_bucket_size_in_m > 0,
              "[data_parallel] bucket sizes must be positive (ddp_bucket_cap_mb {}, "
              "zero_bucket_size_in_m {})",
              cfg.ddp_bucket_cap_mb, cfg.zero_bucket_size_in_m);
  }

  bool sharded_grads() const { return cfg.zero_stage >= 2; }

  // ---- buckets ------------------------------------------------------------------------------

  std::vector<nn::Layer*> layers;  // the layers this plugin manages (a pipeline stage's subset)

  void build_buckets() {
    if (cfg.zero_stage == 3) {  // one chunk per layer
      for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
        Bucket b;
        b.params = layer_params[*it];
        if (!b.params.empty()) buckets.push_back(std::move(b));
      }
    } else {
      const int64_t cap = cfg.zero_stage == 2
                              ? static_cast<int64_t>(cfg.zero_bucket_size_in_m * 1e6)
                              : static_cast<int64_t>(cfg.ddp_bucket_cap_mb * 1024 * 1024 / 4);
      Bucket cur;
      for (auto it = params.rbegin(); it != params.rend(); ++it) {
        cur.params.push_back(*it);
        cur.numel += (*it)->value.numel();
        if (cur.numel >= cap) {
          buckets.push_back(std::move(cur));
          cur = Bucket{};
        }
      }
      if (!cur.params.empty()) buckets.push_back(std::move(cur));
    }
    for (size_t b = 0; b < buckets.size(); ++b) {
      Bucket& k = buckets[b];
      k.numel = 0;
      k.counts.assign(size, 0);
      for (nn::Parameter* p : k.params) {
        bucket_of[p] = b;
        const int64_t n = shape_numel(shapes[index[p]]);
        k.numel += n;
        for (int r = 0; r < size; ++r) k.counts[r] += chunk_size(n, r, size);
      }
      k.flat = Tensor::zeros({k.numel});
      if (sharded_grads()) k.recv = Tensor::zeros({k.counts[rank]});
    }
  }

  // Stage 0/1: the bucket's gradients back to back. Stage 2/3: rank-major chunks.
  void pack(Bucket& b) {
    float* out = fptr(b.flat);
    if (!sharded_grads()) {
      for (nn::Parameter* p : b.params) {
        std::memcpy(out, fptr(p->grad), sizeof(float) * p->grad.numel());
        out += p->grad.numel();
      }
      return;
    }
    for (int r = 0; r < size; ++r)
      for (nn::Parameter* p : b.params) {
        const int64_t n = p->grad.numel(), c0 = chunk_begin(n, r, size), c = chunk_size(n, r, size);
        std::memcpy(out, fptr(p->grad) + c0, sizeof(float) * c);
        out += c;
      }
  }

  void launch(Bucket& b) {
    if (b.launched) return;
    pack(b);
    if (sharded_grads())
      b.work = dp.reduce_scatter_async(b.flat, b.recv, b.counts, dist::ReduceOp::Sum);
    else
      b.work = dp.all_reduce_async(b.flat, dist::ReduceOp::Sum);
    b.launched = true;
  }

  // Completes a launched bucket: stage 0/1 copy the sums back into the gradients; stage 2/3 add
  // this rank's chunk into the shard gradients and free the full gradients.
  void finish(Bucket& b) {
    if (!b.launched) return;
    b.work->wait();
    b.work.reset();
    if (!sharded_grads()) {
      const float* in = fptr(b.flat);
      for (nn::Parameter* p : b.params) {
        std::memcpy(fptr(p->grad), in, sizeof(float) * p->grad.numel());
        in += p->grad.numel();
      }
    } else {
      const float* in = fptr(b.recv);
      for (nn::Parameter* p : b.params) {
        nn::Parameter& s = shards[index[p]];
        const int64_t c = s.grad.numel();
        kernels_axpy(in, s.grad, c);
        in += c;
        p->grad = Tensor();  // keep only the owned shard
      }
    }
    b.launched = false;
    b.ready = 0;
  }

  static void kernels_axpy(const float* x, Tensor& y, int64_t n) {
    float* py = fptr(y);
    for (int64_t i = 0; i < n; ++i) py[i] += x[i];
  }

  void progress() {
    for (Bucket& b : buckets)
      if (b.launched && b.work) b.work->test();
  }

  void grads_ready(nn::Layer& layer) {
    for (nn::Parameter* p : layer_params[&layer]) {
      Bucket& b = buckets[bucket_of[p]];
      if (++b.ready == static_cast<int>(b.params.size()) && cfg.overlap) launch(b);
    }
    progress();
  }

  // ---- ZeRO-3 parameter gathering ------------------------------------------------------------

  void gather_layer(nn::Layer& layer, bool with_grads) {
    auto& ps = layer_params[&layer];
    if (ps.empty()) return;
    if (cfg.zero_stage == 3) gather(ps);
    if (!with_grads) return;
    // A reduction of the previous micro-batch still in flight for these parameters completes
    // first (it adds into the shard and frees the full gradients).
    for (nn::Parameter* p : ps) finish(buckets[bucket_of[p]]);
    for (nn::Parameter* p : ps)
      if (!p->grad.defined()) p->grad = Tensor::zeros(shapes[index[p]]);
  }

  // All-gathers the shards of `ps` into freshly allocated full values.
  void gather(const std::vector<nn::Parameter*>& ps) {
    std::vector<int64_t> counts(size, 0);
    for (nn::Parameter* p : ps)
      for (int r = 0; r < size; ++r)
        counts[r] += chunk_size(shape_numel(shapes[index[p]]), r, size);
    Tensor mine = Tensor::empty({counts[rank]});
    float* o = fptr(mine);
    for (nn::Parameter* p : ps) {
      const Tensor& v = shards[index[p]].value;
      std::memcpy(o, fptr(v), sizeof(float) * v.numel());
      o += v.numel();
    }
    int64_t total = 0;
    for (int64_t c : counts) total += c;
    Tensor all = Tensor::empty({total});
    dp.all_gather(mine, all, counts);
    for (nn::Parameter* p : ps) p->value = Tensor::empty(shapes[index[p]]);
    const float* in = fptr(all);
    for (int r = 0; r < size; ++r)
      for (nn::Parameter* p : ps) {
        const int64_t n = p->value.numel(), c = chunk_size(n, r, size);
        std::memcpy(fptr(p->value) + chunk_begin(n, r, size), in, sizeof(float) * c);
        in += c;
      }
  }

  void release_values(nn::Layer& layer) {
    if (cfg.zero_stage != 3) return;
    for (nn::Parameter* p : layer_params[&layer]) p->value = Tensor();
  }
};

DataParallelPlugin::DataParallelPlugin(dist::Communicator& dp, DataParallelConfig cfg)
    : impl_(std::make_unique<Impl>(dp, cfg)) {}

DataParallelPlugin::~DataParallelPlugin() = default;

std::string DataParallelPlugin::name() const {
  return impl_->cfg.zero_stage == 0 ? fmt::format("ddp×{}", impl_->size)
                                    : fmt::format("zero-{}×{}", impl_->cfg.zero_stage, impl_->size);
}
int DataParallelPlugin::rank() const {
  return impl_->rank;
}
int DataParallelPlugin::world_size() const {
  return impl_->size;
}
int DataParallelPlugin::num_buckets() const {
  return static_cast<int>(impl_->buckets.size());
}

void DataParallelPlugin::setup(nn::ViT& model) {
  std::vector<nn::Layer*> all;
  for (auto& l : model.layers()) all.push_back(l.get());
  setup_layers(all);
}

void DataParallelPlugin::setup_layers(const std::vector<nn::Layer*>& layers) {
  Impl& m = *impl_;
  CAI_CHECK(m.params.empty() && m.layers.empty(), "[data_parallel] setup() called twice");
  m.layers = layers;
  for (nn::Layer* l : layers) l->collect(m.params);
  for (size_t i = 0; i < m.params.size(); ++i) {
    CAI_CHECK(!m.params[i]->value.is_cuda(),
              "[data_parallel] parameter {} is on {}: the MPI data-parallel path moves CPU "
              "tensors",
              m.params[i]->name, m.params[i]->value.device().str());
    m.index[m.params[i]] = i;
    m.shapes.push_back(m.params[i]->value.shape());
  }
  for (nn::Layer* l : layers) {
    std::vector<nn::Parameter*> ps;
    l->collect(ps);
    m.layer_params[l] = ps;
  }
  // Every rank starts from rank 0's parameters.
  int64_t total = 0;
  for (nn::Parameter* p : m.params) total += p->value.numel();
  Tensor flat = Tensor::empty({total});
  float* o = fptr(flat);
  for (nn::Parameter* p : m.params) {
    std::memcpy(o, fptr(p->value), sizeof(float) * p->value.numel());
    o += p->value.numel();
  }
  m.dp.broadcast(flat, 0);
  const float* in = fptr(flat);
  for (nn::Parameter* p : m.params) {
    std::memcpy(fptr(p->value), in, sizeof(float) * p->value.numel());
    in += p->value.numel();
  }
  if (m.cfg.zero_stage >= 1) {
    for (nn::Parameter* p : m.params) {
      const int64_t n = p->value.numel();
      const int64_t c0 = chunk_begin(n, m.rank, m.size), c = chunk_size(n, m.rank, m.size);
      nn::Parameter s;
      s.name = p->name;
      s.weight_decay = p->weight_decay;
      s.value = Tensor::empty({c});
      std::memcpy(fptr(s.value), fptr(p->value) + c0, sizeof(float) * c);
      s.grad = Tensor::zeros({c});
      m.shards.push_back(std::move(s));
    }
  }
  m.build_buckets();
  if (m.cfg.zero_stage >= 2)
    for (nn::Parameter* p : m.params) p->grad = Tensor();  // created per layer in backward
  if (m.cfg.zero_stage == 3)
    for (nn::Parameter* p : m.params) p->value = Tensor();

  // Hooks. Final micro-batch (and every micro-batch for stage 2/3): reduce as layers finish.
  auto before_fwd = [&m](nn::Layer& l) {
    if (m.cfg.zero_stage == 3) m.gather(m.layer_params[&l]);
  };
  auto after_fwd = [&m](nn::Layer& l) { m.release_values(l); };
  auto before_bwd = [&m](nn::Layer& l) { m.gather_layer(l, m.cfg.zero_stage >= 2); };
  auto after_bwd_reduce = [&m](nn::Layer& l) {
    m.grads_ready(l);
    m.release_values(l);
  };
  m.last_hooks = nn::LayerHooks{before_fwd, after_fwd, before_bwd, after_bwd_reduce};
  m.accumulate_hooks = m.sharded_grads()
                           ? m.last_hooks
                           : nn::LayerHooks{before_fwd, after_fwd, before_bwd,
                                            [&m](nn::Layer& l) { m.release_values(l); }};
  m.eval = nn::LayerHooks{before_fwd, after_fwd, nullptr, nullptr};
}

std::vector<nn::Parameter*> DataParallelPlugin::optimizer_parameters(nn::ViT&) {
  Impl& m = *impl_;
  if (m.cfg.zero_stage == 0) return m.params;
  CAI_CHECK(!m.shards.empty() || m.params.empty(),
            "[data_parallel] call setup(model) before optimizer_parameters()");
  std::vector<nn::Parameter*> out;
  for (auto& s : m.shards) out.push_back(&s);
  return out;
}

const nn::LayerHooks* DataParallelPlugin::train_hooks(bool last_micro_batch) {
  if (impl_->size == 1 && impl_->cfg.zero_stage == 0) return nullptr;
  return last_micro_batch || impl_->sharded_grads() ? &impl_->last_hooks : &impl_->accumulate_hooks;
}

const nn::LayerHooks* DataParallelPlugin::eval_hooks() {
  return impl_->cfg.zero_stage == 3 ? &impl_->eval : nullptr;
}

void DataParallelPlugin::sync_gradients(nn::ViT&) {
  Impl& m = *impl_;
  for (Bucket& b : m.buckets) {
    if (!b.launched && !m.sharded_grads()) m.launch(b);  // overlap off, or a layer never ran
    m.finish(b);
  }
  // Stage 1: this rank's chunk of the summed gradients feeds its shard.
  if (m.cfg.zero_stage == 1)
    for (size_t i = 0; i < m.params.size(); ++i) {
      const int64_t n = m.params[i]->grad.numel();
      std::memcpy(fptr(m.shards[i].grad), fptr(m.params[i]->grad) + chunk_begin(n, m.rank, m.size),
                  sizeof(float) * m.shards[i].grad.numel());
    }
}

double DataParallelPlugin::clip_grad_norm(optim::Optimizer& opt, double max_norm) {
  Impl& m = *impl_;
  // DDP: every rank holds the full (identical) gradients; ZeRO: each holds its shard.
  std::function<double(double)> reduce;
  if (m.cfg.zero_stage >= 1) reduce = [&m](double sq) { return m.dp.all_reduce_scalar(sq); };
  return optim::clip_grad_norm(train::optimizer_params(opt), max_norm, reduce);
}

void DataParallelPlugin::optimizer_step(optim::Optimizer& opt) {
  Impl& m = *impl_;
  opt.step();
  if (m.cfg.zero_stage == 1 || m.cfg.zero_stage == 2) {
    // Every rank needs the updated full parameters for the next forward.
    m.gather(m.params);
  }
}

void DataParallelPlugin::zero_grad(nn::ViT&, optim::Optimizer& opt) {
  Impl& m = *impl_;
  opt.zero_grad();
  if (m.cfg.zero_stage >= 2) return;  // full gradients are created per layer
  for (nn::Parameter* p : m.params) p->grad.zero_();
}

double DataParallelPlugin::all_reduce_sum(double v) {
  return impl_->dp.all_reduce_scalar(v);
}

void DataParallelPlugin::materialize_parameters() {
  if (impl_->cfg.zero_stage == 3) impl_->gather(impl_->params);
}

int64_t DataParallelPlugin::parameter_bytes() const {
  int64_t b = 0;
  for (nn::Parameter* p : impl_->params)
    if (p->value.defined()) b += static_cast<int64_t>(p->value.nbytes());
  // Stage 1/2 also hold the full parameters: their shard values are the optimizer's copies.
  for (const auto& s : impl_->shards) b += static_cast<int64_t>(s.value.nbytes());
  return b;
}

}  // namespace cai::parallel
