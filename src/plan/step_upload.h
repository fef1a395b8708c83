// What a backend uploads for one megakernel step besides the task lists: the host inputs packed as
// the arena's first buffers lay them out (token_ids, seq_len, block_tables, sampling, attn_items;
// one copy from a pinned staging buffer), the ring tables, and the launch ranges (where each SM's tasks, and each
// wave's, begin and end). Shared by cuda-mk and the null backend of `bench engine`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "sampling/params.h"

namespace megadecode {

// Bytes of the packed inputs: the arena from its start to the end of attn_items.
size_t step_inputs_bytes(const Plan& plan);

// Packs the step's inputs into out[0, step_inputs_bytes(plan)), zeros elsewhere (padding, unused
// block-table entries). tokens[i] >= 0 is row i's input token; -1 - r stands for the token the
// previous step sampled for its row r (a chained step: the device reads it from that step's
// out_tokens before this step reads token_ids).
void pack_step_inputs(const Plan& plan, const BatchState& batch, std::span<const int32_t> tokens,
                      std::span<const SamplingParams> sampling, std::span<uint8_t> out);

// Packs the ring tables of a model with sliding-window layers into out[0, ring_tables.bytes):
// [batch][ring_len] ring blocks, -1 past the ones a sequence holds yet (as cpu-mk fills them). The
// arena keeps them after the step's buffers, so they are uploaded on their own.
void pack_ring_tables(const Plan& plan, const BatchState& batch, std::span<uint8_t> out);

// Packs the token masks of the constrained rows (structured output; masks[i] is row i's
// DecodeSeq::allowed, empty: any token) into out as the token_masks buffer lays them out: [batch]
// int32 slots (-1 for a free row), then the constrained rows' masks, [n_masked][token_mask_words(V)]
// words, slot k at word batch + k * words. Returns the bytes to upload (they start the buffer), 0
// when no row is constrained (then nothing is written and the step's SAMPLE reads nothing of it).
size_t pack_token_masks(const Plan& plan, std::span<const std::span<const uint32_t>> masks, std::span<uint8_t> out);

// [n_waves + 1][2][n_sms]: launch 0 runs whole lists (cuda-mk: ranges[0][0][sm] = list begin,
// ranges[0][1][sm] = list end); launch 1 + w runs wave w (cuda-ops). O(tasks): recompute only when
// the lists changed (StepPlanner's PlanUpdate).
std::vector<int32_t> launch_ranges(const Plan& plan);

}  // namespace megadecode
