#include "ref/math.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/check.h"

namespace megadecode::ref {
namespace {

// The one dot-product order (see math.h); `load(i)` yields a[i] as fp32. Written as kDotLanes
// independent accumulators so the compiler can vectorise it without reassociating anything.
template <typename Load>
inline float dot_lanes(const Load& load, const float* b, int64_t n) {
  float acc[kDotLanes] = {};
  int64_t i = 0;
  for (; i + kDotLanes <= n; i += kDotLanes) {
    for (int l = 0; l < kDotLanes; ++l) acc[l] += load(i + l) * b[i + l];
  }
  for (int l = 0; i + l < n; ++l) acc[l] += load(i + l) * b[i + l];
  static_assert(kDotLanes == 8, "the combine tree below is written for 8 lanes");
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

struct LoadF32 {
  const std::byte* p;
  float operator()(int64_t i) const {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
};
struct LoadBF16 {
  const std::byte* p;
  float operator()(int64_t i) const {
    uint16_t u;
    std::memcpy(&u, p + 2 * i, 2);
    return bits_float(static_cast<uint32_t>(u) << 16);
  }
};
struct LoadF16 {
  const std::byte* p;
  float operator()(int64_t i) const {
    uint16_t u;
    std::memcpy(&u, p + 2 * i, 2);
    return fp16_bits_to_float(u);
  }
};

// Calls fn(loader) with the loader for row `row` of w (dtype dispatch happens once per row).
template <typename Fn>
inline auto with_row(const TensorView& w, int64_t row, int64_t cols, const Fn& fn) {
  const std::byte* p = w.data + static_cast<size_t>(row * cols) * dtype_bytes(w.dtype);
  switch (w.dtype) {
    case Dtype::kBF16: return fn(LoadBF16{p});
    case Dtype::kF16: return fn(LoadF16{p});
    case Dtype::kF32: break;
  }
  return fn(LoadF32{p});
}

int64_t cols_of(const TensorView& w) { return w.shape.size() == 2 ? w.shape[1] : w.n_elements(); }

}  // namespace

float dot(const float* a, const float* b, int64_t n) {
  return dot_lanes([a](int64_t i) { return a[i]; }, b, n);
}

void load_row(const TensorView& w, int64_t row, float* out) {
  const int64_t cols = cols_of(w);
  MD_CHECK(w.shape.size() <= 2 && row >= 0 && row * cols < w.n_elements(), "row ", row, " of ", w.name);
  with_row(w, row, cols, [&](const auto& load) {
    for (int64_t i = 0; i < cols; ++i) out[i] = load(i);
    return 0;
  });
}

std::vector<float> load_vector(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.n_elements()));
  for (int64_t i = 0; i < v.n_elements(); ++i) out[i] = v.at(i);
  return out;
}

void matvec(const TensorView& w, const float* x, float* y, ThreadPool* pool) {
  MD_CHECK(w.shape.size() == 2, "matvec needs a 2-D weight, got ", w.name);
  const int64_t rows = w.shape[0], cols = w.shape[1];
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      y[r] = with_row(w, r, cols, [&](const auto& load) { return dot_lanes(load, x, cols); });
    }
  };
  // ~64K multiply-adds per range keeps the hand-off cost small against the work.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols));
  if (pool != nullptr) {
    pool->parallel_for(rows, grain, run);
  } else {
    run(0, rows);
  }
}

void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  const float mean_sq = dot(x, x, n) / static_cast<float>(n);
  const float inv_rms = 1.0f / std::sqrt(mean_sq + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * inv_rms) * weight[i];
}

void layer_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float inv_std = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = ((x[i] - mean) * inv_std) * weight[i];
}

std::vector<float> rope_inv_freq(int head_dim, double theta) {
  MD_REQUIRE(head_dim > 0 && head_dim % 2 == 0, "head_dim ", head_dim, " must be even for RoPE");
  MD_REQUIRE(theta > 0.0 && std::isfinite(theta), "rope_theta must be positive, got ", theta);
  const float base = static_cast<float>(theta);
  std::vector<float> inv_freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(base, exponent);
  }
  return inv_freq;
}

void apply_rope(float* x, int head_dim, int pos, std::span<const float> inv_freq, RopeStyle style) {
  const int half = head_dim / 2;
  MD_CHECK(static_cast<int>(inv_freq.size()) == half);
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(angle), s = std::sin(angle);
    const int ia = style == RopeStyle::kNeox ? i : 2 * i;
    const int ib = style == RopeStyle::kNeox ? i + half : 2 * i + 1;
    const float a = x[ia], b = x[ib];
    x[ia] = a * c + (-b) * s;
    x[ib] = b * c + a * s;
  }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void softmax(float* x, int64_t n) {
  float max_v = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_v = std::max(max_v, x[i]);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

void attention_head(const float* q, std::span<const float* const> keys, std::span<const float* const> values,
                    int head_dim, float scale, float* out) {
  const size_t n = keys.size();
  MD_CHECK(n > 0 && values.size() == n);
  std::vector<float> p(n);
  for (size_t j = 0; j < n; ++j) p[j] = dot(q, keys[j], head_dim) * scale;
  softmax(p.data(), static_cast<int64_t>(n));
  std::fill(out, out + head_dim, 0.0f);
  for (size_t j = 0; j < n; ++j) {
    for (int d = 0; d < head_dim; ++d) out[d] += p[j] * values[j][d];
  }
}

std::vector<int> top_k(const float* scores, int n, int k) {
  MD_CHECK(k >= 0 && k <= n);
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  // Larger first, ties to the lower index; NaN ranks below every number so the order stays strict.
  auto before = [&](int a, int b) {
    const float sa = scores[a], sb = scores[b];
    const bool nan_a = std::isnan(sa), nan_b = std::isnan(sb);
    if (nan_a != nan_b) return nan_b;
    if (!nan_a && sa != sb) return sa > sb;
    return a < b;
  };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), before);
  idx.resize(k);
  return idx;
}

std::vector<float> route_scores(const float* router_logits, const ModelConfig& config) {
  const int n = config.n_experts;
  std::vector<float> scores(router_logits, router_logits + n);
  if (config.router == RouterKind::kSoftmaxTopK) softmax(scores.data(), n);
  return scores;
}

std::vector<float> route_probabilities(const float* router_logits, const ModelConfig& config) {
  std::vector<float> p = route_scores(router_logits, config);
  if (config.router == RouterKind::kSigmoidTopK)
    for (float& x : p) x = 1.0f / (1.0f + std::exp(-x));
  return p;
}

namespace {

// (expert, weight) for the given experts in their order, weighed as route() weighs its choice.
std::vector<std::pair<int, float>> weigh(const std::vector<float>& scores, const ModelConfig& config,
                                         std::span<const int> experts) {
  std::vector<std::pair<int, float>> out;
  for (int e : experts) {
    const float w = config.router == RouterKind::kSoftmaxTopK ? scores[e] : 1.0f / (1.0f + std::exp(-scores[e]));
    out.emplace_back(e, w);
  }
  if (config.norm_topk_prob) {
    float sum = 0.0f;
    for (const auto& ew : out) sum += ew.second;
    for (auto& ew : out) ew.second /= sum;
  }
  return out;
}

}  // namespace

std::vector<std::pair<int, float>> route(const float* router_logits, const ModelConfig& config) {
  const std::vector<float> scores = route_scores(router_logits, config);
  const std::vector<int> chosen = top_k(scores.data(), config.n_experts, config.n_experts_per_tok);
  return weigh(scores, config, chosen);
}

std::vector<std::pair<int, float>> route_forced(const float* router_logits, const ModelConfig& config,
                                                std::span<const int32_t> experts) {
  MD_REQUIRE(static_cast<int>(experts.size()) == config.n_experts_per_tok, "forced routing: ", experts.size(),
             " experts, the model routes to ", config.n_experts_per_tok);
  std::vector<int> chosen;
  for (int32_t e : experts) {
    MD_REQUIRE(e >= 0 && e < config.n_experts, "forced routing: expert ", e, " outside [0, ", config.n_experts, ")");
    chosen.push_back(e);
  }
  return weigh(route_scores(router_logits, config), config, chosen);
}

}  // namespace megadecode::ref
