// The emulator's step: lays out the arena from the plan's BufferLayout, writes the host inputs,
// poisons the rest, zeroes the counters (as the GPU's memset before launch), runs the workers
// (threads or sequential), then checks every counter against its planned total.
#include "emu/emulator.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "core/check.h"
#include "emu/emulator_sync.h"

namespace megadecode::emu {
namespace {

void dispatch(const StepView& v, Sync& sync, const Task& task) {
  switch (static_cast<Op>(task.op)) {
#define MD_TILE_CASE(e, name, form) \
  case Op::k##e:                     \
    tile_##name(v, sync, task);      \
    return;
    MD_OPS(MD_TILE_CASE)
#undef MD_TILE_CASE
  }
  throw Error(cat("cpu-mk: bad opcode ", static_cast<int>(task.op)));
}

// Runs tasks [begin, end) of the worker's list: waits, op, arrivals, with delay points around. A
// task with kLastWaitAtWrite meets its last wait inside the op, before its write (tile_expert_down).
void run_tasks(const StepView& v, const Plan& plan, Worker& w, int begin, int end) {
  for (int i = begin; i < end; ++i) {
    const Task& t = plan.tasks[i];
    w.begin_task(i);
    w.pause();
    const int n_first = (t.flags & kLastWaitAtWrite) ? t.n_waits - 1 : t.n_waits;
    for (int j = 0; j < n_first; ++j) w.wait(t.wait[j].counter, t.wait[j].target);
    dispatch(v, w, t);
    w.pause();
    for (int j = 0; j < t.n_arrives; ++j) w.arrive(t.arrive[j].counter, t.arrive[j].amount);
  }
}

// A worker body: never lets an exception escape its thread.
template <typename Fn>
void guarded(StepShared& shared, Worker& w, const Fn& fn) {
  try {
    fn();
  } catch (const StepAborted&) {
  } catch (const std::exception& e) {
    shared.fail(cat(e.what(), " [at ", w.where(), "]"));
  }
}

template <typename T>
T* at(std::vector<double>& arena, const BufferSpan& span) {
  return reinterpret_cast<T*>(reinterpret_cast<std::byte*>(arena.data()) + span.offset);
}

void poison(std::vector<double>& arena, const BufferLayout& b) {
  auto nan_fill = [&](const BufferSpan& s) {
    float* p = at<float>(arena, s);
    std::fill(p, p + s.bytes / 4, std::numeric_limits<float>::quiet_NaN());
  };
  auto neg_fill = [&](const BufferSpan& s) {
    int32_t* p = at<int32_t>(arena, s);
    std::fill(p, p + s.bytes / 4, -1);
  };
#define MD_POISON(name, type, shape)                                  \
  if constexpr (std::is_same_v<type, float>) nan_fill(b.name);        \
  else if constexpr (std::is_same_v<type, int32_t>) neg_fill(b.name);
  MD_BUFFERS(MD_POISON)
#undef MD_POISON
}

// Sequential runs re-poison what a layer must write afresh before the layer writes it (all of the
// previous layer has run by then, in wave order): the activations before its QKV wave, the
// residual x before its down shares (after the QKV and O-proj tiles read it). A row some tile
// leaves out then reads as NaN in any layer, not as the previous layer's value.
void poison_for_wave(std::vector<double>& arena, const BufferLayout& b, const WaveInfo& wave) {
  auto nan_fill = [&](const BufferSpan& s) {
    float* p = at<float>(arena, s);
    std::fill(p, p + s.bytes / 4, std::numeric_limits<float>::quiet_NaN());
  };
  if (wave.op == Op::kQkv && wave.layer > 0)
    for (const BufferSpan* s :
         {&b.qkv, &b.attn_part_o, &b.attn_part_ml, &b.attn_out, &b.h, &b.router_logits, &b.act, &b.o_out,
          &b.shared_act})
      nan_fill(*s);
  // Sequential blocks rewrite x in the down shares; parallel ones in place there too (x + o + F), so
  // x stays.
  if (wave.op == Op::kExpertDown && b.o_out.bytes == 0) nan_fill(b.x);
}

}  // namespace

Emulator::Emulator(const ModelConfig& config, const ModelWeights& weights, ref::KvStore& kv)
    : config_(config), weights_(weights), kv_(kv), norms_(widen_norms(config, weights)) {}

void Emulator::run(const Plan& plan, const StepInput& input, const EmulatorOptions& options, StepOutput& output) {
  const PlanShape& s = plan.params.shape;
  const BufferLayout& b = plan.params.buffers;
  MD_REQUIRE(input.batch != nullptr && static_cast<int>(input.batch->seqs.size()) == s.batch &&
                 static_cast<int>(input.tokens.size()) == s.batch,
             "cpu-mk: the step's inputs do not match the plan's batch of ", s.batch);
  MD_REQUIRE(input.sampling.empty() || static_cast<int>(input.sampling.size()) == s.batch,
             "cpu-mk: sampling parameters for ", input.sampling.size(), " sequences, batch ", s.batch);
  MD_REQUIRE(s.hidden == config_.hidden_size && s.n_layers == config_.n_layers && s.vocab == config_.vocab_size,
             "cpu-mk: the plan was made for another model shape");
  MD_REQUIRE(s.kv_block_size == kv_.block_size(), "cpu-mk: plan for KV blocks of ", s.kv_block_size,
             " tokens, the store has ", kv_.block_size());

  arena_.assign((b.total_bytes + 7) / 8, 0.0);
  if (options.poison) poison(arena_, b);
  std::memcpy(at<int32_t>(arena_, b.token_ids), input.tokens.data(), input.tokens.size() * 4);
  int32_t* seq_len = at<int32_t>(arena_, b.seq_len);
  int32_t* tables = at<int32_t>(arena_, b.block_tables);
  std::fill(tables, tables + b.block_tables.bytes / 4, -1);
  for (int i = 0; i < s.batch; ++i) {
    const SeqState& q = input.batch->seqs[i];
    seq_len[i] = q.n_ctx;
    const size_t n = std::min<size_t>(q.block_table.size(), s.max_blocks_per_seq);
    std::copy(q.block_table.begin(), q.block_table.begin() + n, tables + static_cast<size_t>(i) * s.max_blocks_per_seq);
  }
  int32_t* rings = at<int32_t>(arena_, b.ring_tables);
  std::fill(rings, rings + b.ring_tables.bytes / 4, -1);
  for (int i = 0; i < s.batch && s.ring_len > 0; ++i) {
    const SeqState& q = input.batch->seqs[i];
    const size_t n = std::min<size_t>(q.ring_table.size(), s.ring_len);
    std::copy(q.ring_table.begin(), q.ring_table.begin() + n, rings + static_cast<size_t>(i) * s.ring_len);
  }
  SamplingParams* sp = at<SamplingParams>(arena_, b.sampling);
  for (int i = 0; i < s.batch; ++i) sp[i] = input.sampling.empty() ? SamplingParams{} : input.sampling[i];
  std::memcpy(at<AttnItem>(arena_, b.attn_items), plan.attn_items.data(), plan.attn_items.size() * sizeof(AttnItem));

  StepView v;
  v.config = &config_;
  v.weights = &weights_;
  v.norms = &norms_;
  v.kv = &kv_;
  v.params = &plan.params;
  v.sampler = &input.sampler;
  output.route_experts.clear();
  output.route_weights.clear();
  if (input.record_routing) {
    output.route_experts.assign(static_cast<size_t>(s.batch) * s.n_layers * s.top_k, -1);
    output.route_weights.assign(output.route_experts.size(), 0.0f);
    v.route_experts = output.route_experts.data();
    v.route_weights = output.route_weights.data();
  }
#define MD_VIEW_BIND(name, type, shape) v.name = at<type>(arena_, b.name);
  MD_BUFFERS(MD_VIEW_BIND)
#undef MD_VIEW_BIND

  StepShared shared;
  shared.plan = &plan;
  shared.options = &options;
  shared.counters = std::make_unique<PaddedCounter[]>(plan.params.counters.n_counters);  // zeroed
  const int n_sms = plan.n_sms();
  if (options.sequential) {
    Worker w(shared, 0);
    guarded(shared, w, [&] {
      // Wave by wave; inside a wave SM 0's tasks first. Lists are sorted by wave.
      std::vector<int> next(plan.list_begin.begin(), plan.list_begin.end() - 1);
      for (int wave = 0; wave < static_cast<int>(plan.waves.size()); ++wave) {
        if (options.poison) poison_for_wave(arena_, b, plan.waves[wave]);
        for (int sm = 0; sm < n_sms; ++sm) {
          int end = next[sm];
          while (end < plan.list_begin[sm + 1] && plan.task_wave[end] == wave) ++end;
          run_tasks(v, plan, w, next[sm], end);
          next[sm] = end;
        }
      }
    });
  } else {
    std::vector<std::thread> threads;
    std::vector<std::unique_ptr<Worker>> workers;
    for (int sm = 0; sm < n_sms; ++sm) workers.push_back(std::make_unique<Worker>(shared, sm));
    for (int sm = 0; sm < n_sms; ++sm)
      threads.emplace_back([&, sm] {
        guarded(shared, *workers[sm], [&] { run_tasks(v, plan, *workers[sm], plan.list_begin[sm], plan.list_begin[sm + 1]); });
      });
    for (std::thread& t : threads) t.join();
  }
  if (const std::string error = shared.error(); !error.empty()) throw Error(error);

  for (int32_t c = 0; c < plan.params.counters.n_counters; ++c) {
    const int32_t value = shared.counters[c].value.load(std::memory_order_relaxed);
    const CounterInfo& info = plan.counters[c];
    MD_REQUIRE(value == info.total, "cpu-mk: after the step ", counter_name(plan, c), " is ", value,
               ", the plan expects ", info.total);
  }

  output.logits.clear();
  output.tokens.clear();
  if (s.lm_head) {
    const float* l = at<float>(arena_, b.logits);
    output.logits.assign(l, l + static_cast<size_t>(s.batch) * s.vocab);
  }
  if (s.sample) {
    const int32_t* t = at<int32_t>(arena_, b.out_tokens);
    output.tokens.assign(t, t + s.batch);
  }
}

}  // namespace megadecode::emu
