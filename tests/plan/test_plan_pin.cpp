// qwen3_moe plans are pinned bit for bit: a fingerprint (FNV-1a over every task, list, wave,
// attention item, counter, dynamic arrival, and the shape, counter and buffer fields a qwen3_moe
// plan has always had) of fixed (config, batch, policy, SMs) cases, recorded before the
// cohere2_moe ops were added to the planner. A change to how qwen3_moe is planned fails here.
// Share tasks are hashed in the form they had then, (share, n_shares, 0): today's equal share
// (s, s + 1, S) (plan/moe_split.h) is the same share; a weighted one changes the fingerprint.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "model/presets.h"
#include "plan/planner.h"
#include "plan/policy.h"

namespace megadecode {
namespace {

struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <class T>
  void pod(const T& v) { bytes(&v, sizeof v); }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod(v.size());
    if (!v.empty()) bytes(v.data(), v.size() * sizeof(T));
  }
};

uint64_t fingerprint(const Plan& p) {
  Fnv f;
  std::vector<Task> tasks = p.tasks;
  for (Task& t : tasks)
    if (op_is_share(static_cast<Op>(t.op)) && t.arg[1] == t.arg[0] + 1) {
      t.arg[1] = t.arg[2];
      t.arg[2] = 0;
    }
  f.vec(tasks);
  f.vec(p.list_begin);
  f.vec(p.task_wave);
  for (const WaveInfo& w : p.waves) {
    f.pod(static_cast<int>(w.op));
    f.pod(w.layer);
    f.pod(w.n_tasks);
  }
  f.vec(p.attn_items);
  for (const CounterInfo& c : p.counters) {
    f.pod(static_cast<int>(c.kind));
    f.pod(c.layer);
    f.pod(c.index);
    f.pod(c.total);
  }
  for (const DynamicArrival& d : p.dynamic_arrivals) {
    f.pod(d.counter);
    f.pod(d.max_amount);
    f.vec(d.tasks);
  }
  // The shape's fields up to `pad` (26 int32), the counter layout, the buffers qwen3_moe has.
  f.bytes(&p.params.shape, 26 * sizeof(int32_t));
  f.pod(p.params.counters);
  const BufferLayout& b = p.params.buffers;
  for (const BufferSpan* s : {&b.token_ids, &b.seq_len, &b.block_tables, &b.sampling, &b.attn_items, &b.x, &b.qkv,
                              &b.attn_part_o, &b.attn_part_ml, &b.attn_out, &b.h, &b.router_logits, &b.act, &b.logits,
                              &b.out_tokens})
    f.pod(*s);
  f.pod(b.lm_best.offset);  // the arena's end before the LM head's LogitBest buffer, appended since
  return f.h;
}

struct Case {
  const char* preset;
  std::vector<int> ctx;
  const char* policy;
  int n_sms;
  uint64_t want;
};

TEST(PlanPin, Qwen3MoePlansAreBitwiseUnchanged) {
  const std::vector<Case> cases = {
      {"tiny", {1}, "default", 1, 0x4b56b3430125a291ull},
      {"tiny", {5, 37, 16, 1}, "default", 7, 0x2e333f771c15ec79ull},
      {"tiny", {300, 2, 129}, "grid-sync", 5, 0x1b923bba2ec7e69cull},
      {"tiny", {1000, 17}, "long-splits", 12, 0xc7a81185c61b2fefull},
      {"qwen3-30b-a3b", {8192}, "default", 132, 0x7a0bf89fabe92645ull},
      {"qwen3-30b-a3b", {4096, 100, 32768, 7, 600, 1, 2048, 9000}, "default", 132, 0x7338b4b879c7e9a4ull},
      {"qwen3-30b-a3b", {8192, 8192}, "grid-sync", 132, 0x4e7a39231e449e3dull},
  };
  bool record = false;
  for (const Case& c : cases) {
    const ModelConfig config = preset_config(c.preset);
    BatchState batch;
    batch.kv_block_size = 16;
    std::vector<std::vector<int32_t>> tables;
    int next = 0;
    for (int n : c.ctx) {
      std::vector<int32_t> t((n + 15) / 16);
      for (int32_t& b : t) b = next++ * 7 % 100003;  // distinct, shuffled
      tables.push_back(std::move(t));
    }
    for (size_t i = 0; i < c.ctx.size(); ++i) batch.seqs.push_back({c.ctx[i], tables[i]});
    const Plan plan = make_plan(config, batch, policy_by_name(c.policy), PlanOptions{.n_sms = c.n_sms});
    const uint64_t got = fingerprint(plan);
    if (c.want == 0) {
      record = true;
      std::printf("%s %s sms %d: 0x%016llxull\n", c.preset, c.policy, c.n_sms, static_cast<unsigned long long>(got));
    } else {
      EXPECT_EQ(got, c.want) << c.preset << " " << c.policy << " sms " << c.n_sms;
    }
  }
  EXPECT_FALSE(record) << "fingerprints not recorded";
}

}  // namespace
}  // namespace megadecode
