// Central finite differences for the explicit backward functions.
// The scalar checked is L = Σ r_i·y_i with a fixed random r, so dL/dy = r; the analytic gradient
// of each input comes from the op's backward fed with r. fp32 forward, double accumulation.
#pragma once
#include <functional>
#include <string>

#include "cai/core/tensor.h"

namespace cai::test {

Tensor random_tensor(const Shape& s, uint64_t seed, float scale = 1.0f);

// L(inputs) evaluated by `loss`; checks analytic d L / d `input` against central differences on
// up to `max_elems` elements. Returns the worst ratio |num − ana| / (atol + rtol·|ana|).
double gradcheck(const std::function<double()>& loss, Tensor& input, const Tensor& analytic,
                 float h = 1e-2f, double rtol = 2e-2, double atol = 2e-3, int max_elems = 64);

// Σ r_i·y_i in double.
double dot(const Tensor& r, const Tensor& y);

}  // namespace cai::test
