// `megadecode bench prefill` host side: flag parsing and checks, and the flop count the report
// divides by (checked against a direct sum over tokens and layers).
#include <gtest/gtest.h>

#include <algorithm>

#include <string>
#include <vector>

#include "bench/prefill_options.h"
#include "core/check.h"
#include "model/presets.h"

namespace megadecode {
namespace {

PrefillBenchOptions parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return parse_prefill_bench_args(static_cast<int>(argv.size()), argv.data());
}

TEST(PrefillBenchOptions, DefaultsAndFlags) {
  const PrefillBenchOptions d = parse({});
  EXPECT_EQ(d.lengths, (std::vector<int>{1024, 8192, 16384}));
  EXPECT_EQ(d.backend.prefill_chunk, BackendOptions{}.prefill_chunk);  // the one set of defaults
  EXPECT_EQ(d.backend.kv_block_size, BackendOptions{}.kv_block_size);
  EXPECT_EQ(d.backend.backend, "cuda-mk");
  EXPECT_EQ(d.config.n_layers, 48);
  EXPECT_FALSE(d.one_token);
  const PrefillBenchOptions o =
      parse({"--preset", "small", "--lengths", "50000", "--prefill-chunk", "512", "--block-size", "32", "--one-token",
             "--json", "x.json"});
  EXPECT_EQ(o.lengths, (std::vector<int>{50000}));
  EXPECT_EQ(o.backend.prefill_chunk, 512);
  EXPECT_EQ(o.backend.kv_block_size, 32);
  EXPECT_TRUE(o.one_token);
  EXPECT_EQ(o.json_path, "x.json");
  EXPECT_GE(o.config.max_position_embeddings, 50001);  // raised for the long prompt
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--prefill-chunk", "0"}, {"--prefill-chunk", "70000"}, {"--lengths", "0"},
        {"--reps", "0"}, {"--preset", "nope"}, {"--block-size", "0"}, {"--block-size", "1025"}, {"--bogus", "1"},
        {"--chunk", "512"}})
    EXPECT_THROW(parse(bad), Error) << bad[0] << " " << bad[1];
}

// A direct sum over positions and layers, on qwen3's small preset and on North's (dense first
// layer, sliding layers of window 24, positions past it).
TEST(PrefillBenchOptions, FlopsMatchADirectSum) {
  for (const char* preset : {"small", "north-tiny"}) {
    const ModelConfig c = preset_config(preset);
    for (auto [start, n] : {std::pair<int64_t, int64_t>{0, 1}, {0, 17}, {100, 33}, {5, 60}}) {
      double direct = 0, attention = 0;
      for (int64_t p = start; p < start + n; ++p)
        for (int l = 0; l < c.n_layers; ++l) {
          direct += 2.0 * c.hidden_size * (c.q_size() + 2.0 * c.kv_size());  // QKV
          direct += 2.0 * c.q_size() * c.hidden_size;                         // O
          if (c.is_moe_layer(l)) {
            direct += 2.0 * c.hidden_size * c.n_experts;  // router
            direct += 2.0 * c.n_experts_per_tok * 3.0 * c.hidden_size * c.moe_intermediate_size;
          } else {
            direct += 2.0 * 3.0 * c.hidden_size * c.intermediate_size;  // dense gate/up/down
          }
          const int w = c.layers[l].sliding_window;
          const double keys = w > 0 ? std::min<double>(p + 1, w) : static_cast<double>(p + 1);
          attention += 2.0 * 2.0 * c.n_heads * c.head_dim * keys;  // QK^T and PV
        }
      direct += attention + 2.0 * c.hidden_size * c.vocab_size;  // LM head, last token
      EXPECT_NEAR(prefill_flops(c, start, n), direct, 1e-9 * direct) << preset << " " << start << " " << n;
      EXPECT_NEAR(prefill_attention_flops(c, start, n), attention, 1e-9 * attention) << preset << " " << start << " " << n;
    }
  }
}

}  // namespace
}  // namespace megadecode
