// `colossalai benchmark --calibrate OUT --config F`: times the real kernels of a vit_train model on
// this device, op by op, over the shapes its layouts use, and writes the simulator's calibration
// profile (sim/cluster.h: "samples": per plan op and phase, [flops, bytes, seconds]).
//
// For every micro-batch size b in 1, 2, 4, ... up to the config's batch size (and that size) and
// every 1D tensor-parallel size T in 1, 2, 4, 8 the model splits over, the analytic plan
// (libcai's `plan`) lists each layer's ops with their FLOPs and bytes; each distinct (op, phase,
// FLOPs) is run with the shapes that give it (ops::linear_fwd/bwd, attention_fwd/bwd,
// layernorm, GELU, residual adds, patch embedding, class token and position embedding, the
// classifier, cross-entropy) and timed (synchronised, warm, repeated). The optimizer step
// (clipping, AdamW, zero_grad) is timed over parameter counts from 10^4 to the model's. The
// profile holds per-op timings only: no whole-step figure feeds the simulator. Collectives are
// not timed yet (the simulator's network model comes from the cluster file).
#pragma once
#include "cmd_benchmark.h"

namespace cai::app {

int run_calibrate(const BenchmarkOptions& opts);

}  // namespace cai::app
