// step_inputs_bytes, pack_step_inputs, pack_ring_tables, launch_ranges (see step_upload.h).
#include "plan/step_upload.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "sampling/token_mask.h"

namespace megadecode {

size_t step_inputs_bytes(const Plan& plan) {
  const BufferLayout& b = plan.params.buffers;
  return b.attn_items.offset + b.attn_items.bytes;
}

void pack_step_inputs(const Plan& plan, const BatchState& batch, std::span<const int32_t> tokens,
                      std::span<const SamplingParams> sampling, std::span<uint8_t> out) {
  const PlanShape& s = plan.params.shape;
  const BufferLayout& b = plan.params.buffers;
  const size_t n = static_cast<size_t>(s.batch), need = step_inputs_bytes(plan);
  MD_CHECK(batch.seqs.size() == n && tokens.size() == n && sampling.size() == n && out.size() >= need);
  MD_CHECK(plan.attn_items.size() * sizeof(AttnItem) <= b.attn_items.bytes);
  std::memset(out.data(), 0, need);
  auto* tok = reinterpret_cast<int32_t*>(out.data() + b.token_ids.offset);
  auto* len = reinterpret_cast<int32_t*>(out.data() + b.seq_len.offset);
  auto* bt = reinterpret_cast<int32_t*>(out.data() + b.block_tables.offset);
  auto* sp = reinterpret_cast<SamplingParams*>(out.data() + b.sampling.offset);
  const size_t row = static_cast<size_t>(s.max_blocks_per_seq);
  for (size_t i = 0; i < n; ++i) {
    tok[i] = tokens[i];
    len[i] = batch.seqs[i].n_ctx;
    const std::span<const int32_t> table = batch.seqs[i].block_table;
    std::copy_n(table.begin(), std::min(table.size(), row), bt + i * row);
    sp[i] = sampling[i];
  }
  std::memcpy(out.data() + b.attn_items.offset, plan.attn_items.data(), plan.attn_items.size() * sizeof(AttnItem));
}

void pack_ring_tables(const Plan& plan, const BatchState& batch, std::span<uint8_t> out) {
  const PlanShape& s = plan.params.shape;
  const BufferSpan& rings = plan.params.buffers.ring_tables;
  MD_CHECK(batch.seqs.size() == static_cast<size_t>(s.batch) && out.size() >= rings.bytes);
  auto* rt = reinterpret_cast<int32_t*>(out.data());
  std::fill(rt, rt + rings.bytes / 4, -1);
  for (size_t i = 0; i < batch.seqs.size() && s.ring_len > 0; ++i) {
    const std::span<const int32_t> ring = batch.seqs[i].ring_table;
    std::copy_n(ring.begin(), std::min<size_t>(ring.size(), s.ring_len), rt + i * s.ring_len);
  }
}

size_t pack_token_masks(const Plan& plan, std::span<const std::span<const uint32_t>> masks, std::span<uint8_t> out) {
  const PlanShape& s = plan.params.shape;
  const size_t n = static_cast<size_t>(s.batch), words = token_mask_words(s.vocab);
  MD_CHECK(masks.size() == n);
  size_t n_masked = 0;
  for (std::span<const uint32_t> m : masks) {
    MD_CHECK(m.empty() || m.size() == words, "a token mask of ", m.size(), " words, the vocabulary needs ", words);
    n_masked += m.empty() ? 0 : 1;
  }
  if (n_masked == 0) return 0;
  const size_t bytes = (n + n_masked * words) * 4;
  MD_CHECK(s.sample && bytes <= plan.params.buffers.token_masks.bytes && out.size() >= bytes);
  auto* slots = reinterpret_cast<int32_t*>(out.data());
  auto* w = reinterpret_cast<uint32_t*>(out.data()) + n;
  int32_t slot = 0;
  for (size_t i = 0; i < n; ++i) {
    slots[i] = masks[i].empty() ? -1 : slot;
    if (!masks[i].empty()) std::copy(masks[i].begin(), masks[i].end(), w + static_cast<size_t>(slot++) * words);
  }
  return bytes;
}

std::vector<int32_t> launch_ranges(const Plan& plan) {
  const int n_sms = plan.n_sms();
  const size_t n_waves = plan.waves.size();
  std::vector<int32_t> ranges((n_waves + 1) * 2 * n_sms, 0);
  for (int sm = 0; sm < n_sms; ++sm) {
    ranges[sm] = plan.list_begin[sm];
    ranges[n_sms + sm] = plan.list_begin[sm + 1];
    int t = plan.list_begin[sm];
    for (size_t w = 0; w < n_waves; ++w) {
      int32_t* r = ranges.data() + (w + 1) * 2 * n_sms;
      r[sm] = t;
      while (t < plan.list_begin[sm + 1] && plan.task_wave[t] == static_cast<int>(w)) ++t;
      r[n_sms + sm] = t;
    }
    MD_CHECK(t == plan.list_begin[sm + 1], "plan lists are not sorted by wave");
  }
  return ranges;
}

}  // namespace megadecode
