#include "cuda/backend/path_calibration.h"

#include <algorithm>
#include <cstdio>

#include "core/check.h"
#include "core/rng.h"

namespace megadecode::cuda {
namespace {

double median(std::vector<float> v) {
  MD_CHECK(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::string PathCalibration::summary() const {
  std::string s = cat("measured at start-up, context ", context, ": batched from batch ", policy.batched_from_batch,
                      " (ms megakernel/batched:");
  for (size_t i = 0; i < megakernel_ms.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " b%zu %.2f/%.2f", i + 1, megakernel_ms[i], batched_ms[i]);
    s += buf;
  }
  return s + ")";
}

PathCalibration calibrate_decode_path(CudaBackend& be, uint64_t seed) {
  MD_REQUIRE(be.name() == "cuda", "path calibration: backend ", be.name(), " has one decode path");
  const ModelConfig& c = be.config();
  const int bs = be.kv_block_size(), ring_len = be.ring_length();
  const int max_b = std::min({8, be.max_decode_batch(), be.path_policy().megakernel_max_batch});
  // The context: 8192, halved until max_b sequences fit both pools and the model's positions.
  int context = std::min(8192, c.max_position_embeddings);
  auto fits = [&](int ctx) {
    const int64_t per_seq = (ctx + bs - 1) / bs;
    const int64_t rings = ring_len > 0 ? std::min<int64_t>(ring_len, per_seq) : 0;
    return per_seq * max_b <= be.n_kv_blocks() && rings * max_b <= be.n_ring_blocks();
  };
  while (context > bs && !fits(context)) context /= 2;
  MD_REQUIRE(fits(context), "path calibration: ", max_b, " sequences of ", context, " tokens do not fit the KV pools");
  const int64_t per_seq = (context + bs - 1) / bs;
  const int64_t ring_per_seq = ring_len > 0 ? std::min<int64_t>(ring_len, per_seq) : 0;

  PathCalibration out;
  out.context = context;
  const DecodePathPolicy before = be.path_policy();
  SplitMix64 rng(seed);
  try {
  for (int B = 1; B <= max_b; ++B) {
    std::vector<std::vector<int32_t>> tables(B), rings(B);
    std::vector<int32_t> tokens(B);
    std::vector<DecodeSeq> seqs(B);
    for (int i = 0; i < B; ++i) {
      for (int64_t j = 0; j < per_seq; ++j) tables[i].push_back(static_cast<int32_t>(i * per_seq + j));
      for (int64_t j = 0; j < ring_per_seq; ++j) rings[i].push_back(static_cast<int32_t>(i * ring_per_seq + j));
      tokens[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
      seqs[i].chunk.seq_id = i;
      seqs[i].chunk.tokens = std::span<const int32_t>(&tokens[i], 1);
      seqs[i].chunk.start_pos = context - 1;
      seqs[i].chunk.block_table = tables[i];
      seqs[i].chunk.ring_table = rings[i];
      seqs[i].sampling.temperature = 0.0f;
    }
    for (const bool batched : {false, true}) {
      DecodePathPolicy force = before;
      force.batched_from_batch = batched ? 1 : max_b + 1;
      be.set_path_policy(force);
      DecodeResult r;
      be.decode(seqs, false, r);
      MD_CHECK(be.last_path() == (batched ? DecodePath::kBatched : DecodePath::kMegakernel));
      (batched ? out.batched_ms : out.megakernel_ms).push_back(median(be.probe().time_last_step(1, 5)));
    }
  }
  } catch (...) {
    be.set_path_policy(before);
    throw;
  }
  out.policy = before;
  out.policy.batched_from_batch = DecodePathPolicy::crossover_from(out.megakernel_ms, out.batched_ms);
  be.set_path_policy(out.policy);
  return out;
}

}  // namespace megadecode::cuda
