// ViTConfig: validation, parameter counts and timm's named models (vit.cpp holds the layers).
#include "cai/core/error.h"
#include "cai/nn/vit.h"

namespace cai::nn {

// ---------------------------------------------------------------------------------------------
// Config

void ViTConfig::validate() const {
  CAI_CHECK(img_size > 0 && patch_size > 0 && img_size % patch_size == 0,
            "[vit] img_size {} must be a positive multiple of patch_size {}", img_size, patch_size);
  CAI_CHECK(in_chans > 0, "[vit] in_chans {} must be positive", in_chans);
  CAI_CHECK(num_classes > 0, "[vit] num_classes {} must be positive", num_classes);
  CAI_CHECK(depth > 0, "[vit] depth {} must be positive", depth);
  CAI_CHECK(num_heads > 0 && embed_dim > 0 && embed_dim % num_heads == 0,
            "[vit] hidden size {} must be divisible by num_heads {}", embed_dim, num_heads);
  CAI_CHECK(mlp_ratio > 0 && mlp_hidden() > 0, "[vit] mlp_ratio {} gives no hidden units",
            mlp_ratio);
  CAI_CHECK(drop_rate >= 0 && drop_rate < 1, "[vit] dropout {} is outside [0, 1)", drop_rate);
  CAI_CHECK(drop_path_rate >= 0 && drop_path_rate < 1, "[vit] drop_path {} is outside [0, 1)",
            drop_path_rate);
  CAI_CHECK(act == "gelu" || act == "gelu_tanh", "[vit] act '{}' must be gelu or gelu_tanh", act);
}

void ViTConfig::validate_tensor_parallel(int tp, bool sequence_parallel) const {
  CAI_CHECK(tp >= 1, "[vit] tensor-parallel size {} must be at least 1", tp);
  CAI_CHECK(num_heads % tp == 0,
            "[vit] num_heads {} is not divisible by the tensor-parallel size {}", num_heads, tp);
  CAI_CHECK(embed_dim % tp == 0,
            "[vit] hidden size {} is not divisible by the tensor-parallel size {}", embed_dim, tp);
  CAI_CHECK(mlp_hidden() % tp == 0,
            "[vit] MLP hidden size {} (hidden {} × mlp_ratio {}) is not divisible by the "
            "tensor-parallel size {}",
            mlp_hidden(), embed_dim, mlp_ratio, tp);
  CAI_CHECK(!sequence_parallel || num_patches() + 1 >= tp,
            "[vit] sequence parallelism over {} ranks needs at least {} tokens, the model has {}",
            tp, tp, num_patches() + 1);
}

void ViTConfig::validate_tensor_parallel(const std::string& mode, int tp, int depth,
                                         bool sequence_parallel) const {
  const TensorParallel::Grid g = TensorParallel::grid(mode, tp, depth);
  if (mode == "1d") return validate_tensor_parallel(tp, sequence_parallel);
  const int q = g.q;
  const int64_t in_cut = g.in_cut;
  CAI_CHECK(num_heads % q == 0, "[vit] num_heads {} is not divisible by {}'s q = {}", num_heads,
            mode, q);
  CAI_CHECK(embed_dim % in_cut == 0,
            "[vit] hidden size {} is not divisible by {} ({} with q = {} cuts a linear's input "
            "features into {} parts)",
            embed_dim, in_cut, mode, q, in_cut);
  CAI_CHECK(mlp_hidden() % in_cut == 0,
            "[vit] MLP hidden size {} is not divisible by {} ({} with q = {} cuts a linear's "
            "input features into {} parts)",
            mlp_hidden(), in_cut, mode, q, in_cut);
}

double ViTConfig::forward_flops() const {
  const double n = static_cast<double>(num_patches() + 1), d = static_cast<double>(embed_dim);
  const double hid = static_cast<double>(mlp_hidden());
  const double patch = 2.0 * static_cast<double>(num_patches()) * d *
                       static_cast<double>(in_chans * patch_size * patch_size);
  const double block = 2.0 * n * (4 * d * d + 2 * d * hid) + 4.0 * n * n * d;
  return patch + static_cast<double>(depth) * block + 2.0 * d * static_cast<double>(num_classes);
}

int64_t ViTConfig::num_parameters() const {
  const int64_t d = embed_dim, h = mlp_hidden(), n = num_patches() + 1;
  const int64_t embed = d * in_chans * patch_size * patch_size + d + d + n * d;
  const int64_t block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d);
  return embed + depth * block + 2 * d + (d * num_classes + num_classes);
}

std::vector<std::string> ViTConfig::names() {
  return {"vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224",
          "vit_large_patch16_224", "vit_huge_patch14_224"};
}

ViTConfig ViTConfig::named(const std::string& name) {
  ViTConfig c;
  if (name == "vit_tiny_patch16_224") {
    c.embed_dim = 192, c.depth = 12, c.num_heads = 3;
  } else if (name == "vit_small_patch16_224") {
    c.embed_dim = 384, c.depth = 12, c.num_heads = 6;
  } else if (name == "vit_base_patch16_224") {
    c.embed_dim = 768, c.depth = 12, c.num_heads = 12;
  } else if (name == "vit_large_patch16_224") {
    c.embed_dim = 1024, c.depth = 24, c.num_heads = 16;
  } else if (name == "vit_huge_patch14_224" || name == "vit_huge_patch16_224") {
    c.embed_dim = 1280, c.depth = 32, c.num_heads = 16;
    c.patch_size = name == "vit_huge_patch14_224" ? 14 : 16;
  } else {
    fail("[vit] unknown model '{}': expected one of {}", name, fmt::join(names(), ", "));
  }
  return c;
}

}  // namespace cai::nn
