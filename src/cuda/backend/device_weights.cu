// DeviceWeights: arena layout, the GPU fill of synthetic tensors, fusing/interleaving rows with 2-D
// copies into a row-major staging matrix, then packing (cuda/common/kernels.h pack_weight).
#include "cuda/backend/device_weights.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "core/check.h"
#include "core/log.h"
#include "cuda/common/cuda_check.h"
#include "cuda/common/kernels.h"
#include "cuda/common/weight_pack.cuh"
#include "plan/planner.h"
#include "model/synthetic.h"
#include "model/synthetic_init.h"
#include "ref/math.h"

namespace megadecode::cuda {
namespace {

__global__ void fill_synthetic_kernel(uint16_t* dst, int64_t n, uint64_t seed, SyntheticInit init) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = synthetic_bf16(seed, init, static_cast<uint64_t>(i));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Mirrors model/synthetic.cpp (kind from the name); build() cross-checks it against
// synthetic_init_for on the first layer's tensors, so a drift is an error, not silent.
SyntheticInit init_of(const std::string& name, int64_t fan_in, const ModelConfig& c) {
  SyntheticKind kind = SyntheticKind::kInProj;
  if (name == "model.embed_tokens.weight") kind = SyntheticKind::kEmbedding;
  else if (name == "lm_head.weight") kind = SyntheticKind::kLmHead;
  else if (ends_with(name, "norm.weight")) kind = SyntheticKind::kNorm;
  else if (ends_with(name, ".o_proj.weight")) kind = SyntheticKind::kOutProj;
  else if (ends_with(name, ".mlp.gate.weight")) kind = SyntheticKind::kRouter;
  else if (ends_with(name, ".down_proj.weight"))
    kind = name.find(".mlp.experts.") != std::string::npos ? SyntheticKind::kExpertDown : SyntheticKind::kDenseDown;
  SyntheticDims dims;
  dims.fan_in = static_cast<int>(fan_in);
  dims.n_layers = c.n_layers;
  dims.n_experts_per_tok = c.n_experts_per_tok;
  dims.unnormalised_weights = c.router == RouterKind::kSigmoidTopK && !c.norm_topk_prob;
  return synthetic_init(synthetic_tensor_id(name), kind, dims);
}

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

std::string lname(int l, const std::string& rest) { return "model.layers." + std::to_string(l) + "." + rest; }

}  // namespace

void check_supported(const ModelConfig& c) {
  if (c.block == BlockKind::kParallel) {
    // cohere2_moe: the megakernel runs the decode plan's parallel blocks (sliding ring and NoPE
    // attention, dense layers, sigmoid routing, logit_scale), and so do the batched step and the
    // prefill kernels; what the plan does not implement is refused by name there, and shared
    // experts and LayerNorm, which the plan has but no kernel yet, here.
    MD_REQUIRE(c.model_type == "cohere2_moe", "the CUDA backends run parallel blocks as cohere2_moe has them; ",
               "model_type ", c.model_type, " is not supported there: use backend cpu-ref");
    check_model_plannable(c);
    MD_REQUIRE(c.shared_intermediate_size == 0, "the CUDA backends do not implement shared experts yet (",
               c.model_type, " with shared_intermediate_size ", c.shared_intermediate_size,
               "): use backend cpu-mk or cpu-ref");
    MD_REQUIRE(c.norm == NormKind::kRms, "the CUDA backends implement RMSNorm only; ", c.model_type,
               " with LayerNorm (no rms_norm_eps in config.json) is not supported there: use backend cpu-mk or cpu-ref");
  } else {
    MD_REQUIRE(c.model_type == "qwen3_moe" && c.router == RouterKind::kSoftmaxTopK && c.norm == NormKind::kRms &&
                   c.shared_intermediate_size == 0 && c.logit_scale == 1.0f,
               "the CUDA backends run qwen3_moe and cohere2_moe models; model_type ", c.model_type,
               " is not supported there: use backend cpu-ref");
    MD_REQUIRE(c.qk_norm && c.rope_style == RopeStyle::kNeox, "the CUDA backends need q/k norms and NeoX RoPE");
    for (int l = 0; l < c.n_layers; ++l)
      MD_REQUIRE(c.is_moe_layer(l) && c.layers[l].sliding_window == 0 && c.layers[l].use_rope,
                 "the CUDA backends run full-attention MoE layers only (layer ", l, ")");
  }
  MD_REQUIRE(c.hidden_size % 16 == 0 && c.hidden_size <= 4096, "hidden_size ", c.hidden_size,
             " must be a multiple of 16 and <= 4096");
  MD_REQUIRE(c.head_dim % 32 == 0 && c.head_dim <= 128 && 256 % c.head_dim == 0, "head_dim ", c.head_dim,
             " must be 32, 64 or 128");
  MD_REQUIRE(c.group_size() <= 8, "at most 8 query heads per KV head, got ", c.group_size());
  MD_REQUIRE(c.n_experts <= 256 && c.n_experts_per_tok <= 32, "at most 256 experts and top-32");
  MD_REQUIRE(c.moe_intermediate_size % 16 == 0, "moe_intermediate_size ", c.moe_intermediate_size,
             " must be a multiple of 16");
}

DeviceWeights::DeviceWeights(const ModelConfig& config) : config_(config) { check_supported(config); }

DeviceWeights::~DeviceWeights() {
  CUDA_CHECK_NOTHROW(cudaFree(arena_));
  CUDA_CHECK_NOTHROW(cudaFree(layers_dev_));
  CUDA_CHECK_NOTHROW(cudaFree(rope_));
}

std::unique_ptr<DeviceWeights> DeviceWeights::synthetic(const ModelConfig& config, uint64_t seed,
                                                        const WeightProgress& progress) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights(config));
  // Cross-check the name -> init mirror against the model library on layer 0 and the globals.
  for (const TensorSpec& s : expected_tensors(config)) {
    if (s.name.find("model.layers.") == 0 && s.name.find("model.layers.0.") != 0) continue;
    if (s.name.find(".experts.") != std::string::npos && s.name.find(".experts.0.") == std::string::npos) continue;
    const SyntheticInit a = synthetic_init_for(s.name, config);
    const SyntheticInit b = init_of(s.name, s.shape.size() == 2 ? s.shape[1] : 1, config);
    MD_CHECK(a.id == b.id && a.scale == b.scale && a.offset == b.offset, "synthetic init mirror differs for ", s.name);
  }
  const std::string lm = config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  w->build(
      [&](const std::string& name, int64_t rows, int64_t cols, uint16_t* dst) {
        const SyntheticInit init = init_of(name, cols == 1 ? 1 : cols, config);
        const int64_t n = rows * cols;
        const int grid = static_cast<int>(std::min<int64_t>((n + 255) / 256, 132 * 32));
        fill_synthetic_kernel<<<grid, 256>>>(dst, n, seed, init);
        CUDA_CHECK_LAST();
      },
      lm, progress);
  return w;
}

std::unique_ptr<DeviceWeights> DeviceWeights::upload(const ModelConfig& config, const ModelWeights& weights,
                                                     const WeightProgress& progress) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights(config));
  std::map<std::string, const TensorView*> by_name;
  auto add = [&](const TensorView& v) { by_name[v.name] = &v; };
  add(weights.embed);
  add(weights.final_norm);
  add(weights.lm_head);
  for (const LayerWeights& l : weights.layers) {
    for (const TensorView* v : {&l.input_norm, &l.post_attn_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj,
                                &l.q_norm, &l.k_norm, &l.router, &l.mlp_gate, &l.mlp_up, &l.mlp_down})
      if (!v->name.empty()) add(*v);  // (a model without a tensor leaves its view unnamed)
    for (const ExpertWeights& e : l.experts) {
      add(e.gate);
      add(e.up);
      add(e.down);
    }
  }
  w->build(
      [&](const std::string& name, int64_t rows, int64_t cols, uint16_t* dst) {
        auto it = by_name.find(name);
        MD_REQUIRE(it != by_name.end(), "checkpoint has no tensor ", name);
        const TensorView& v = *it->second;
        MD_REQUIRE(v.dtype == Dtype::kBF16, "tensor ", name, " in ", v.file, " is ", dtype_name(v.dtype),
                   "; the CUDA backends load bf16 checkpoints");
        MD_REQUIRE(v.n_elements() == rows * cols, "tensor ", name, " in ", v.file, " has ", v.n_elements(),
                   " elements, expected ", rows * cols);
        CUDA_CHECK(cudaMemcpy(dst, v.data, v.n_bytes(), cudaMemcpyHostToDevice));
      },
      weights.lm_head.name, progress);
  return w;
}

void DeviceWeights::build(const Source& source, const std::string& lm_head_name, const WeightProgress& progress) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size, D = c.head_dim, G = c.n_kv_heads, gs = c.group_size(), E = c.n_experts,
                I = c.moe_intermediate_size, V = c.vocab_size, nq = c.n_heads * D;
  const int64_t qkv_rows = G * (gs + 2) * D;
  const int64_t Id = c.intermediate_size;  // dense FFN layers' width (0 without them)
  // What a layer has: parallel blocks have no post-attention norm, models without q/k norms none,
  // dense layers no router and no experts but one MLP (packed like an expert).
  const bool post_norm = c.block == BlockKind::kSequential, qk_norm = c.qk_norm;
  auto dense = [&](int l) { return !c.is_moe_layer(l); };

  // Arena layout (bytes, 256-aligned), in build order.
  size_t off = 0;
  auto take = [&](int64_t elems) {
    const size_t at = off;
    off += align256(static_cast<size_t>(elems) * 2);
    return at;
  };
  struct LayerOff {
    size_t qkv, o, router, up, down, in_norm, post_norm, q_norm, k_norm, dense_up, dense_down;
  };
  std::vector<LayerOff> lo(c.n_layers);
  const int64_t up_elems = packed_elements(2 * I, H), down_elems = packed_elements(H, I);
  for (int l = 0; l < c.n_layers; ++l) {
    lo[l] = LayerOff{};
    lo[l].qkv = take(packed_elements(qkv_rows, H));
    lo[l].o = take(packed_elements(H, nq));
    if (dense(l)) {
      lo[l].dense_up = take(packed_elements(2 * Id, H));
      lo[l].dense_down = take(packed_elements(H, Id));
    } else {
      lo[l].router = take(packed_elements(E, H));
      lo[l].up = take(up_elems * E);
      lo[l].down = take(down_elems * E);
    }
    lo[l].in_norm = take(H);
    if (post_norm) lo[l].post_norm = take(H);
    if (qk_norm) {
      lo[l].q_norm = take(D);
      lo[l].k_norm = take(D);
    }
  }
  const size_t embed_off = take(V * H), final_norm_off = take(H), lm_off = take(packed_elements(V, H));
  bytes_ = off;
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  MD_REQUIRE(bytes_ + (size_t(1) << 30) < free_b, "model weights need ", bytes_ >> 20, " MiB on the GPU, ",
             free_b >> 20, " MiB free");
  CUDA_CHECK(cudaMalloc(&arena_, bytes_));
  auto at = [&](size_t o) { return reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(arena_) + o); };

  // Row-major staging: the source tensor, and the fused/interleaved matrix.
  const int64_t stage_elems = std::max({V * H, qkv_rows * H, 2 * I * H, H * nq, 2 * Id * H});
  uint16_t *src = nullptr, *fused = nullptr;
  CUDA_CHECK(cudaMalloc(&src, stage_elems * 2));
  CUDA_CHECK(cudaMalloc(&fused, std::max({qkv_rows, 2 * I, 2 * Id}) * H * 2));
  size_t done = 0;
  auto report = [&](int64_t elems) {
    done += static_cast<size_t>(elems) * 2;
    if (progress) progress(done, bytes_);
  };
  auto direct = [&](const std::string& name, int64_t rows, int64_t cols, size_t dst) {
    source(name, rows, cols, at(dst));
    report(rows * cols);
  };
  auto packed = [&](const std::string& name, int64_t rows, int64_t cols, uint16_t* dst) {
    source(name, rows, cols, src);
    pack_weight(src, dst, static_cast<int>(rows), static_cast<int>(cols), nullptr);
    report(rows * cols);
  };

  layers_.resize(c.n_layers);
  // The sliding layers' K/V live in the backend's ring pool, the others' in its full pool, each in
  // layer order (engine/kv_pools.h).
  int n_ring_layers = 0, n_full_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    // Fused QKV, group-major: group g = [q heads g*gs..g*gs+gs-1 | k head g | v head g].
    const int64_t grp = (gs + 2) * D * H * 2;  // bytes per group of the fused matrix
    source(lname(l, "self_attn.q_proj.weight"), nq, H, src);
    CUDA_CHECK(cudaMemcpy2D(fused, grp, src, gs * D * H * 2, gs * D * H * 2, G, cudaMemcpyDeviceToDevice));
    source(lname(l, "self_attn.k_proj.weight"), G * D, H, src);
    CUDA_CHECK(cudaMemcpy2D(reinterpret_cast<uint8_t*>(fused) + gs * D * H * 2, grp, src, D * H * 2, D * H * 2, G,
                            cudaMemcpyDeviceToDevice));
    source(lname(l, "self_attn.v_proj.weight"), G * D, H, src);
    CUDA_CHECK(cudaMemcpy2D(reinterpret_cast<uint8_t*>(fused) + (gs + 1) * D * H * 2, grp, src, D * H * 2,
                            D * H * 2, G, cudaMemcpyDeviceToDevice));
    pack_weight(fused, at(lo[l].qkv), static_cast<int>(qkv_rows), static_cast<int>(H), nullptr);
    report(qkv_rows * H);
    packed(lname(l, "self_attn.o_proj.weight"), H, nq, at(lo[l].o));
    // Row block j of a fused up matrix (an expert's, or a dense layer's MLP): gate rows 8j..8j+7,
    // then up rows 8j..8j+7.
    auto fused_up = [&](const std::string& prefix, int64_t inter, uint16_t* dst) {
      const size_t unit = 8 * H * 2;
      source(lname(l, prefix + "gate_proj.weight"), inter, H, src);
      CUDA_CHECK(cudaMemcpy2D(fused, 2 * unit, src, unit, unit, inter / 8, cudaMemcpyDeviceToDevice));
      source(lname(l, prefix + "up_proj.weight"), inter, H, src);
      CUDA_CHECK(cudaMemcpy2D(reinterpret_cast<uint8_t*>(fused) + unit, 2 * unit, src, unit, unit, inter / 8,
                              cudaMemcpyDeviceToDevice));
      pack_weight(fused, dst, static_cast<int>(2 * inter), static_cast<int>(H), nullptr);
      report(2 * inter * H);
    };
    if (dense(l)) {
      fused_up("mlp.", Id, at(lo[l].dense_up));
      packed(lname(l, "mlp.down_proj.weight"), H, Id, at(lo[l].dense_down));
    } else {
      packed(lname(l, "mlp.gate.weight"), E, H, at(lo[l].router));
      for (int64_t e = 0; e < E; ++e) {
        const std::string ex = "mlp.experts." + std::to_string(e) + ".";
        fused_up(ex, I, at(lo[l].up) + e * up_elems);
        packed(lname(l, ex + "down_proj.weight"), H, I, at(lo[l].down) + e * down_elems);
      }
    }
    direct(lname(l, "input_layernorm.weight"), H, 1, lo[l].in_norm);
    if (post_norm) direct(lname(l, "post_attention_layernorm.weight"), H, 1, lo[l].post_norm);
    if (qk_norm) {
      direct(lname(l, "self_attn.q_norm.weight"), D, 1, lo[l].q_norm);
      direct(lname(l, "self_attn.k_norm.weight"), D, 1, lo[l].k_norm);
    }
    MkLayerWeights& w = layers_[l];
    w = MkLayerWeights{};
    auto at_or_null = [&](bool has, size_t o) { return has ? at(o) : nullptr; };  // what the layer lacks is nullptr
    w.qkv = at(lo[l].qkv);
    w.o_proj = at(lo[l].o);
    w.router = at_or_null(!dense(l), lo[l].router);
    w.experts_up = at_or_null(!dense(l), lo[l].up);
    w.experts_down = at_or_null(!dense(l), lo[l].down);
    w.dense_up = at_or_null(dense(l), lo[l].dense_up);
    w.dense_down = at_or_null(dense(l), lo[l].dense_down);
    w.input_norm = at(lo[l].in_norm);
    w.post_norm = at_or_null(post_norm, lo[l].post_norm);
    w.q_norm = at_or_null(qk_norm, lo[l].q_norm);
    w.k_norm = at_or_null(qk_norm, lo[l].k_norm);
    w.expert_up_elems = up_elems;
    w.expert_down_elems = down_elems;
    w.kv_ring_index = c.is_sliding_layer(l) ? n_ring_layers++ : -1;
    w.kv_full_index = c.is_sliding_layer(l) ? -1 : n_full_layers++;
  }
  direct("model.embed_tokens.weight", V, H, embed_off);
  direct("model.norm.weight", H, 1, final_norm_off);
  packed(lm_head_name, V, H, at(lm_off));
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(fused));

  // RoPE at every position the model takes, exactly as the reference rotates (ref/math.cpp
  // apply_rope: fp32 angle float(pos) * inv_freq[i], then cos and sin): the decode and prefill
  // kernels read it, so they compute no trigonometry and agree with the reference bit for bit.
  const std::vector<float> inv_freq = ref::rope_inv_freq(static_cast<int>(D), c.rope_theta);
  const int64_t n_pos = c.max_position_embeddings;
  MD_REQUIRE(n_pos >= 1 && n_pos <= (int64_t{1} << 22), "the CUDA backends need max_position_embeddings in [1, 4194304], got ",
             n_pos);
  std::vector<float2> rope(static_cast<size_t>(n_pos) * (D / 2));
  for (int64_t pos = 0; pos < n_pos; ++pos)
    for (int64_t i = 0; i < D / 2; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      rope[pos * (D / 2) + i] = make_float2(std::cos(angle), std::sin(angle));
    }
  CUDA_CHECK(cudaMalloc(&rope_, rope.size() * sizeof(float2)));
  CUDA_CHECK(cudaMemcpy(rope_, rope.data(), rope.size() * sizeof(float2), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMalloc(&layers_dev_, layers_.size() * sizeof(MkLayerWeights)));
  CUDA_CHECK(cudaMemcpy(layers_dev_, layers_.data(), layers_.size() * sizeof(MkLayerWeights), cudaMemcpyHostToDevice));

  view_.embed = at(embed_off);
  view_.final_norm = at(final_norm_off);
  view_.lm_head = at(lm_off);
  view_.rope = rope_;
  view_.rope_positions = static_cast<int32_t>(n_pos);
  view_.layers = layers_dev_;
  view_.rms_eps = c.rms_norm_eps;
  view_.attn_scale = 1.0f / std::sqrt(static_cast<float>(D));
  view_.norm_topk = c.norm_topk_prob ? 1 : 0;
  view_.router_sigmoid = c.router == RouterKind::kSigmoidTopK ? 1 : 0;
  view_.rope_interleaved = c.rope_style == RopeStyle::kInterleaved ? 1 : 0;
}

}  // namespace megadecode::cuda
